"""The "xasink" PySpark data source: batch and streaming Arrow writers.

``writer()``/``streamWriter()`` run on the driver (in a Python worker the JVM
starts): options are validated and the target planned there, before any task
runs.  Tasks write one branch each and return its xid in the commit message;
``commit()`` hands the messages to the coordinator.  The writer objects keep
no state between calls beyond what was decided in ``writer()``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

from .. import faults
from ..branch import write_partition
from ..coordinator import Coordinator
from ..dialects.base import TargetPlan
from ..errors import OptionError, PreflightError
from ..options import WriteOptions, parse_options
from ..results import BranchOutcome
from ..schema import plan_target
from ..xid import new_run_nonce

log = logging.getLogger("xasink")

STREAM_BATCH_PROPERTY = "streaming.sql.batchId"


def _task_fault_spec() -> str | None:
    ctx = TaskContext.get()
    return ctx.getLocalProperty(faults.LOCAL_PROPERTY) if ctx is not None else None


faults.task_spec_source = _task_fault_spec


@dataclass
class XasinkCommitMessage(WriterCommitMessage):
    outcome: BranchOutcome


def arrow_schema(schema: StructType) -> pa.Schema:
    """The Arrow schema Spark's Arrow writer hands us, or a clear error naming a column it cannot take."""
    fields = []
    for f in schema.fields:
        try:
            fields.append(to_arrow_schema(StructType([f]), timezone="UTC").field(0))
        except Exception:  # noqa: BLE001 - Spark raises assorted errors for types Arrow cannot carry
            raise PreflightError(f"column '{f.name}' has Spark type {f.dataType.simpleString()}, which xasink cannot "
                                 "write; cast it to a supported type first") from None
    return pa.schema(fields)


def _prepare(options: WriteOptions, schema: StructType, branches: int | None) -> TargetPlan:
    """Driver-side: server checks, journal, table plan.  Everything that can be wrong fails here."""
    coordinator = Coordinator(options)
    try:
        coordinator.preflight(branches)
        source = arrow_schema(schema)
        with coordinator.dialect.connect() as conn:
            return plan_target(coordinator.dialect, conn, options, source)
    finally:
        coordinator.close()


def _write_task(
    options: WriteOptions, plan: TargetPlan, run: str, batch_id: int, iterator: Iterator[pa.RecordBatch]
) -> XasinkCommitMessage:
    ctx = TaskContext.get()
    assert ctx is not None, "xasink writers run inside Spark tasks"
    partition = ctx.partitionId()
    if options.num_partitions is not None and partition >= options.num_partitions:
        raise OptionError(
            f"option 'numPartitions': the DataFrame has more than {options.num_partitions} partitions; "
            f"call df.coalesce({options.num_partitions}) before writing, or use xasink.write(), which coalesces"
        )
    outcome = write_partition(
        options,
        plan,
        batch_id=batch_id,
        partition=partition,
        task_attempt_id=ctx.taskAttemptId(),
        attempt_number=ctx.attemptNumber(),
        run=run,
        batches=iterator,
    )
    return XasinkCommitMessage(outcome)


def _outcomes(messages: list[WriterCommitMessage | None]) -> list[BranchOutcome | None]:
    return [m.outcome if isinstance(m, XasinkCommitMessage) else None for m in messages]


class XasinkBatchWriter(DataSourceArrowWriter):
    def __init__(self, options: WriteOptions, plan: TargetPlan) -> None:
        self.options = options
        self.plan = plan
        self.run = new_run_nonce()

    def write(self, iterator: Iterator[pa.RecordBatch]) -> XasinkCommitMessage:
        return _write_task(self.options, self.plan, self.run, self.options.batch_id, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        coordinator = Coordinator(self.options)
        try:
            result = coordinator.commit(self.options.batch_id, _outcomes(messages))
            log.info("%s", result)
        finally:
            coordinator.close()

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        coordinator = Coordinator(self.options)
        try:
            coordinator.abort(self.options.batch_id, _outcomes(messages))
        finally:
            coordinator.close()


class XasinkStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, options: WriteOptions, plan: TargetPlan) -> None:
        self.options = options
        self.plan = plan
        self.run = new_run_nonce()

    def write(self, iterator: Iterator[pa.RecordBatch]) -> XasinkCommitMessage:
        ctx = TaskContext.get()
        raw = ctx.getLocalProperty(STREAM_BATCH_PROPERTY) if ctx is not None else None
        if raw is None:
            raise RuntimeError("xasink stream writer: Spark did not set the micro-batch id for this task")
        return _write_task(self.options, self.plan, self.run, int(raw), iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803 - Spark's name
        coordinator = Coordinator(self.options)
        try:
            result = coordinator.commit(batchId, _outcomes(messages))
            log.info("%s", result)
        finally:
            coordinator.close()

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        coordinator = Coordinator(self.options)
        try:
            coordinator.abort(batchId, _outcomes(messages))
        finally:
            coordinator.close()


class XasinkDataSource(DataSource):
    """``df.write.format("xasink")``: all partitions of a batch commit, or none."""

    @classmethod
    def name(cls) -> str:
        return "xasink"

    def _options(self, streaming: bool) -> WriteOptions:
        opts: dict[str, Any] = dict(self.options)
        return parse_options(opts, streaming=streaming)

    def writer(self, schema: StructType, overwrite: bool) -> XasinkBatchWriter:
        if overwrite:
            raise OptionError(
                "save mode 'overwrite' is not supported: it cannot be made atomic across branches "
                "without blocking them. Use mode('append'), or upsertKeyColumns to merge."
            )
        options = self._options(streaming=False)
        plan = _prepare(options, schema, options.num_partitions)
        coordinator = Coordinator(options)
        try:  # finish or clear what an earlier run of this batch left in doubt, before our tasks start
            coordinator.recover(upto=options.batch_id)
        finally:
            coordinator.close()
        return XasinkBatchWriter(options, plan)

    def streamWriter(self, schema: StructType, overwrite: bool) -> XasinkStreamWriter:  # noqa: N802 - Spark's name
        if overwrite:
            raise OptionError("output mode 'complete' is not supported by xasink; use outputMode('append')")
        options = self._options(streaming=True)
        plan = _prepare(options, schema, options.num_partitions)
        return XasinkStreamWriter(options, plan)
