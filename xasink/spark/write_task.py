"""The task side of both writers: one partition's branch, and the message that carries its outcome to the driver."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from pyspark import TaskContext

from xasink.errors import OptionError
from xasink.options import WriteOptions
from xasink.results import BranchOutcome
from xasink.spark import progress
from xasink.spark.planning import WritePlan
from xasink.spark.streams import task_query
from xasink.spark.txwrite import TxWrite
from xasink.spark.versions import WriterCommitMessage
from xasink.support import faults, notices
from xasink.support.zones import iso_zone

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession


def _task_fault_spec() -> str | None:
    ctx = TaskContext.get()
    return ctx.getLocalProperty(faults.LOCAL_PROPERTY) if ctx is not None else None


faults.task_spec_source = _task_fault_spec


SESSION_TIME_ZONE = "spark.sql.session.timeZone"
CASE_SENSITIVE = "spark.sql.caseSensitive"  # a task's local property, as Spark passes its SQL settings


@dataclass
class XasinkCommitMessage(WriterCommitMessage):
    outcome: BranchOutcome


def session_time_zone(ctx: TaskContext) -> str | None:
    """The session time zone of the write, as Spark hands its SQL settings to tasks (a local property).

    xasink's entry points set it where the session never did (:func:`pin_time_zone`); None where it is unset
    all the same (xasink.write_modes.conform then takes the zone of the batch's TimestampType columns, or UTC).
    A fixed offset comes as ISO 8601 writes it (:func:`iso_zone`: ``GMT+08:00`` is ``+08:00``)."""
    zone = ctx.getLocalProperty(SESSION_TIME_ZONE)
    return iso_zone(zone) if zone else None


def pin_time_zone(spark: SparkSession) -> None:
    """On the driver, before a write: tasks get the SQL settings a session made, not their defaults, and an unset
    zone is the JVM's, which a task's Python worker cannot see.  Set to its value (Spark works the same), it
    reaches them as :func:`session_time_zone` reads it (docs/types.md)."""
    if spark.conf.get(SESSION_TIME_ZONE, None) is None and (zone := spark.conf.get(SESSION_TIME_ZONE)):
        spark.conf.set(SESSION_TIME_ZONE, zone)  # (given a default, get returns it, not Spark's own)


def write_task(
    options: WriteOptions,
    plan: WritePlan,
    run: str,
    batch_id: int,
    iterator: Iterator[pa.RecordBatch],
    tx: TxWrite | None = None,
    query: str | None = None,
) -> XasinkCommitMessage:
    ctx = TaskContext.get()
    assert ctx is not None, "xasink writers run inside Spark tasks"
    partition = ctx.partitionId()
    if options.num_partitions is not None and partition >= options.num_partitions:
        raise OptionError(
            f"option 'numPartitions': the DataFrame has more than {options.num_partitions} partitions; "
            f"call df.coalesce({options.num_partitions}) before writing, or use xasink.write(), which coalesces"
        )
    if plan.replay:  # committed before: nothing to write, and nothing to read (Spark may skip computing the rows)
        query = task_query(ctx, query)
        return XasinkCommitMessage(BranchOutcome(partition, None, skipped=True, query=query, run=run))
    with notices.captured() as warned:
        every = progress.interval(ctx.getLocalProperty(progress.PROGRESS_PROPERTY))
        where = f"sink {options.sink_id} batch {batch_id} partition {partition}"
        iterator = progress.with_progress(iterator, where, every)
        # where the driver could not count the branches, each task checks for a free slot before it loads
        outcome = _write_partition(options, plan, run, batch_id, iterator, tx, ctx, query)
    if warned:  # the task's log is nobody's to read: the driver reports them (xasink.support.notices)
        outcome = replace(outcome, warnings=tuple(f"partition {partition}: {w}" for w in warned))
    return XasinkCommitMessage(outcome)


def _write_partition(
    options: WriteOptions,
    plan: WritePlan,
    run: str,
    batch_id: int,
    iterator: Iterator[pa.RecordBatch],
    tx: TxWrite | None,
    ctx: TaskContext,
    query: str | None,
) -> BranchOutcome:
    from xasink.protocol.partition_writer import (
        write_partition,  # the rows' path: not imported by the planning and commit workers
    )
    from xasink.write_modes.schema import check_name_case

    check_name_case(plan.target, (ctx.getLocalProperty(CASE_SENSITIVE) or "").lower() == "true")
    partition = ctx.partitionId()
    return write_partition(
        options,
        replace(plan.target, time_zone=session_time_zone(ctx)),
        batch_id=batch_id,
        partition=partition,
        task_attempt_id=ctx.taskAttemptId(),
        attempt_number=ctx.attemptNumber(),
        run=run,
        batches=iterator,
        log_id=plan.log_id,
        guard=plan.guard,
        query=task_query(ctx, query),  # whichever thread started the job
        journal_url=tx.journal_url if tx is not None else None,
        claimed=plan.claimed,
        check_slot=not plan.slots_checked,
    )


def outcomes_of(messages: list[WriterCommitMessage | None]) -> list[BranchOutcome | None]:
    return [m.outcome if isinstance(m, XasinkCommitMessage) else None for m in messages]
