"""The batch writer of ``format("xasink")``: tasks prepare branches, ``commit()`` decides all or none."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from pyspark import TaskContext

from xasink.errors import BatchCommittedError, OptionError
from xasink.options import WriteOptions
from xasink.protocol.coordinator import ABORT_SETTLE_S, Coordinator
from xasink.protocol.xid import new_run_nonce
from xasink.spark.planning import WritePlan
from xasink.spark.streams import STREAM_BATCH_PROPERTY, in_micro_batch
from xasink.spark.txwrite import TxWrite, abort_tx_write, record_tx_part
from xasink.spark.versions import DataSourceArrowWriter, WriterCommitMessage
from xasink.spark.worker_log import tell_tasks, told, worker_logging
from xasink.spark.write_task import XasinkCommitMessage, outcomes_of, write_task
from xasink.support import notices
from xasink.support.phases import phase, worker_started

if TYPE_CHECKING:
    import pyarrow as pa


def check_not_micro_batch(options: WriteOptions) -> None:
    """A batch write with a sinkId but no batchId, run inside a streaming micro-batch (the user's own
    foreachBatch, in the query's thread or any other): refused.  Its batch id would be 0 for every
    micro-batch, and every micro-batch after the first would be skipped as a replay of batch 0.  Only a
    task learns that it runs in a micro-batch (xasink.spark.streams.in_micro_batch)."""
    ctx = TaskContext.get()
    if ctx is not None and in_micro_batch(ctx):
        batch = ctx.getLocalProperty(STREAM_BATCH_PROPERTY)
        which = f"batch {batch} of a foreachBatch function" if batch is not None else "a foreachBatch function's"
        raise OptionError(
            f"sink {options.sink_id}: format('xasink') with a sinkId and no batchId runs inside a streaming "
            f"micro-batch ({which}): every micro-batch would be batch 0 and all but the first skipped as its "
            "replay. Use writeStream.foreachBatch(xasink.foreach_batch(url=..., table=..., sink_id=...)), or "
            "pass batchId=epoch_id. Nothing was written."
        )


class XasinkBatchWriter(DataSourceArrowWriter):
    def __init__(
        self,
        options: WriteOptions,
        plan: WritePlan,
        run: str | None = None,
        tx: TxWrite | None = None,
        notices_path: str | None = None,
        sink_without_batch: bool = False,
        query: str | None = None,
        started: float | None = None,
    ) -> None:
        """``sink_without_batch``: the caller named a sinkId and no batchId (:func:`check_not_micro_batch`);
        ``query``: the streaming query foreach_batch names, for tasks that cannot see it (Spark Connect);
        ``started``: when the driver began planning the write (``time.time()``), where the batch's total runs from."""
        self.options = options
        self.plan = plan
        self.run = run or new_run_nonce()
        self.tx = tx
        self.notices = notices_path  # xasink.write's file for warnings (xasink.support.notices); None: to stderr
        self.sink_without_batch = sink_without_batch
        self.query = query
        self.started = started if started is not None else time.time()

    def write(self, iterator: Iterator[pa.RecordBatch]) -> XasinkCommitMessage:
        if self.sink_without_batch:
            check_not_micro_batch(self.options)
        return write_task(self.options, self.plan, self.run, self.options.batch_id, iterator, self.tx, self.query)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        if self.tx is not None:  # inside xasink.transaction(): record the part, the transaction decides
            record_tx_part(self.options, self.tx, self.run, outcomes_of(messages))
            return
        with told(self.notices):
            if self.notices is None:  # format("xasink"): the batch's INFO line goes to the driver's stderr
                worker_logging(logging.INFO)
            tell_tasks(outcomes_of(messages))
            worker_started("driver", sink=self.options.sink_id, batch=self.options.batch_id)
            coordinator = Coordinator(self.options, shared=True)
            try:  # the coordinator logs the batch's figures
                with phase("commit.call", sink=self.options.sink_id, batch=self.options.batch_id):
                    outcomes = outcomes_of(messages)
                    result = coordinator.commit(
                        self.options.batch_id,
                        outcomes,
                        query=self.query,
                        apply=self.plan.apply,
                        run=self.run,
                        started=self.started,
                    )
                notices.save_figures(self.notices, result.timings)  # xasink.write reports them as its own
            finally:
                coordinator.close()

    def abort(self, messages: list[WriterCommitMessage | None], job_failed: bool | None = None) -> None:
        """Spark's abort after a failed job or commit.  ``job_failed`` (else: a task left no message, which
        Spark's abort after a failed commit never has): the commit never ran, so no decision lists this run's
        branches, and they are rolled back even while another session holds the log's sink row."""
        if job_failed is None:
            job_failed = any(m is None for m in messages)
        if self.tx is not None:
            abort_tx_write(self.options, self.tx, self.run, outcomes_of(messages), undecided=job_failed)
            return
        with told(self.notices):
            tell_tasks(outcomes_of(messages))
            coordinator = Coordinator(self.options, shared=True)
            try:
                coordinator.abort(
                    self.options.batch_id, outcomes_of(messages), ABORT_SETTLE_S, self.run, undecided=job_failed
                )
                if not job_failed:
                    check_log_after_failed_commit(coordinator, self.options.batch_id)
            finally:
                coordinator.close()


def check_log_after_failed_commit(coordinator: Coordinator, batch_id: int) -> None:
    """After a failed commit step and its abort: raise :class:`BatchCommittedError` if the log holds the batch
    committed.

    Spark fails the save with the commit step's own error, which says nothing true when that step died
    after the decision ("Python worker exited unexpectedly"): the abort then finished the decided batch.
    Its error reaches the user's text beside the commit's (Spark adds it as suppressed), where
    ``xasink.from_spark`` finds it.  Otherwise the commit's error stands (an xasink error of its own, or
    the crash: ``xasink.write`` reads the log after it)."""
    sink = coordinator.sink_id
    with coordinator.journal.dialect.connect(autocommit=True) as conn:  # reads only
        record = coordinator.journal.get(conn, sink, batch_id)
    if record is not None and record.committed:
        raise BatchCommittedError(
            f"sink {sink} batch {batch_id} is committed: every row of it is visible (the decision log holds it "
            "committed), though Spark failed the write: its commit step failed after the decision, and the abort "
            f"finished the batch. Nothing to do: a rerun with the same sinkId ('{sink}') and batchId is skipped; "
            "never rerun it under another sink id"
        )
