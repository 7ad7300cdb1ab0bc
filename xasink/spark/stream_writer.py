"""The streaming writer of ``format("xasink")``: one micro-batch per writer, planned once, committed by its xids."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from pyspark import TaskContext
from pyspark.sql.types import StructType

from xasink.errors import OptionError
from xasink.options import WriteOptions
from xasink.protocol.coordinator import ABORT_SETTLE_S, Coordinator
from xasink.protocol.liveness import guard_name, spark_driver_process
from xasink.protocol.xid import new_run_nonce
from xasink.spark.planning import WritePlan, preflight_failed, prepare_write
from xasink.spark.streams import STREAM_BATCH_PROPERTY
from xasink.spark.versions import StreamWriterBase, WriterCommitMessage, pyspark_version
from xasink.spark.worker_log import tell_tasks, worker_logging
from xasink.spark.write_task import XasinkCommitMessage, outcomes_of, write_task
from xasink.support.phases import phase, worker_started

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger("xasink")


def _recover_settled(options: WriteOptions) -> None:
    """Finish decided batches and roll back what can never commit, up to the sink's last decided batch.

    Spark calls ``streamWriter()`` before each micro-batch's tasks and again before its commit, and the
    first call after a restart comes before the replay of a batch the crashed run may have decided.
    Batches after the last decided one may have live branches (this very batch): they are left to the
    tasks (``clear_blockers``) and to the commit's sweep.  In a stream a batch is planned only after the
    previous one committed, so every undecided branch of a batch below the last decided one is stale.
    """
    coordinator = Coordinator(options, shared=True)

    def failed(cause: str) -> str:
        return (
            f"sink {options.sink_id}: reading the decision log or finishing the batches earlier runs decided, "
            f"before this micro-batch, failed ({cause}); this run prepared nothing of this micro-batch. Restart "
            "the query once that is fixed: its next start finishes them first."
        )

    try:
        with coordinator.policy.never_raw(failed):
            with coordinator.dialect.connect() as conn:
                last = coordinator.journal.last_batch_id(conn, options.sink_id)
            if last is None:
                return
            report = coordinator.recover(upto=last)
        if report:
            log.info(
                "sink %s: recovery up to batch %s finished batches %s, committed %d and rolled back %d branches",
                options.sink_id,
                last,
                report.finished_batches,
                len(report.committed),
                len(report.rolled_back),
            )
    finally:
        coordinator.close()


def check_batch_order(coordinator: Coordinator, batch_id: int) -> None:
    """Refuse a micro-batch id below the sink's last decided batch: only the last batch is ever replayed.

    A lower one means the query's checkpoint is new or was reset, or another query writes with the same
    sinkId: its batches would be silently skipped as replays.
    """
    with coordinator.dialect.connect() as conn:
        if not coordinator.journal.exists(conn):
            return
        last = coordinator.journal.last_batch_id(conn, coordinator.sink_id)
    if last is not None and last > batch_id:
        raise OptionError(
            f"option 'sinkId': sink {coordinator.sink_id} has already decided batch {last}, but Spark is "
            f"committing batch {batch_id}: this query's checkpoint is new or was reset, or another query "
            "writes with the same sinkId, and its batches would be skipped as replays. Give this query its "
            "own sinkId (or restore its checkpoint)."
        )


def _arrow_batches(iterator: Iterator[Any]) -> Iterator[pa.RecordBatch]:
    """The task's input, checked to be Arrow batches: Spark 4.0 feeds its stream writers Rows unless they are
    Arrow writers too (xasink.spark.versions.StreamWriterBase), and a Row must fail the task, not load."""
    import pyarrow as pa

    for item in iterator:
        if not isinstance(item, pa.RecordBatch):
            raise RuntimeError(
                f"xasink stream writer: Spark handed the task a {type(item).__name__}, not Arrow batches; this "
                f"PySpark ({pyspark_version()}) is not supported by writeStream.format('xasink'): use "
                "foreachBatch(xasink.foreach_batch(...))"
            )
        yield item


class XasinkStreamWriter(StreamWriterBase):
    """One micro-batch's writer.

    Spark calls ``streamWriter()`` to plan each micro-batch: that writer, with a fresh run nonce, is
    pickled into the batch's tasks, so branches of a crashed run are told apart from the replay's.  It
    calls ``streamWriter()`` again, in a fresh worker, for the batch's ``commit``/``abort``: nothing is
    carried between calls but the commit messages, which hold the xids.

    The plan (server checks, the table, the run guard, recovery of what a crashed run decided) is made in
    the planning call only: the commit's worker never ships the writer to tasks, and an append commits by
    the xids in its messages, so a micro-batch is planned once, not twice.  A write mode's commit (its
    apply step needs the shadow table) and an abort (the run guard) plan on first use.
    """

    def __init__(self, options: WriteOptions, schema: StructType) -> None:
        self.options = options
        self.schema = schema
        self.run = new_run_nonce()
        self._plan: WritePlan | None = None

    @property
    def plan(self) -> WritePlan:
        if self._plan is None:  # (a commit's or an abort's plan: its database errors stay the server's own)
            self._make_plan(None)
        assert self._plan is not None
        return self._plan

    def plan_before_tasks(self) -> None:
        """The planning call's plan: a database error of its checks says this run wrote nothing."""
        self._make_plan(preflight_failed(self.options, streaming=True))

    def _make_plan(self, told: Callable[[str], str] | None) -> None:
        self._plan = prepare_write(self.options, self.schema, None, self.options.num_partitions, told=told)
        with phase("plan.recover", sink=self.options.sink_id):
            _recover_settled(self.options)  # at restart: finish what the crashed run decided, before its replay

    def __getstate__(self) -> dict[str, Any]:
        """Planned before it goes to the tasks: every task of the batch gets the same plan."""
        _ = self.plan  # already made by streamWriter(): a no-op unless Spark pickles from a commit worker
        return self.__dict__.copy()

    def write(self, iterator: Iterator[pa.RecordBatch]) -> XasinkCommitMessage:
        ctx = TaskContext.get()
        raw = ctx.getLocalProperty(STREAM_BATCH_PROPERTY) if ctx is not None else None
        if raw is None:
            raise RuntimeError("xasink stream writer: Spark did not set the micro-batch id for this task")
        return write_task(self.options, self.plan, self.run, int(raw), _arrow_batches(iterator))

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803 - Spark's name
        """Decide and commit (the coordinator logs the batch's figures at INFO and keeps them in the journal)."""
        worker_logging(logging.INFO)
        tell_tasks(outcomes_of(messages))  # the tasks' warnings travel with their messages
        worker_started("driver", sink=self.options.sink_id, batch=batchId)
        # only a write mode's apply step needs the plan here (its shadow table); an append commits by its xids
        apply = self.plan.apply if self.options.applies_at_commit else None
        coordinator = Coordinator(self.options, shared=True)
        try:
            with phase("commit.call", sink=self.options.sink_id, batch=batchId):
                try:
                    check_batch_order(coordinator, batchId)
                except OptionError:
                    coordinator.abort(batchId, outcomes_of(messages))
                    raise
                coordinator.commit(batchId, outcomes_of(messages), apply=apply)
        finally:
            coordinator.close()

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        """A task failed or the query stopped: roll back the batch's branches (a decided batch is finished).

        Without planning: the abort comes in a fresh worker, often during the outage that caused it, and a
        plan (server checks, the table, recovery) that fails there would roll nothing back.  Only the run
        guard's name is needed, for a stop whose tasks returned no message; it is derived, not ensured."""
        worker_logging(logging.INFO)
        coordinator = Coordinator(self.options, shared=True)
        try:
            coordinator.abort(batchId, outcomes_of(messages), settle_s=ABORT_SETTLE_S, guard=self._guard(coordinator))
        finally:
            coordinator.close()

    def _guard(self, coordinator: Coordinator) -> str | None:
        """This driver's run guard for the sink's log (:func:`xasink.protocol.liveness.ensure_keeper` names it so)."""
        if self._plan is not None:
            return self._plan.guard
        driver = spark_driver_process()
        if driver is None:
            return None
        try:
            return guard_name(coordinator.journal.log_id(), driver.token)
        except Exception:  # noqa: BLE001 - no log, or it cannot be read: the abort says what is wrong
            return None
