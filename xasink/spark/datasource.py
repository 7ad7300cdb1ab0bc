"""The "xasink" PySpark data source: batch and streaming Arrow writers.

``writer()``/``streamWriter()`` run on the driver (in a Python worker the JVM
starts): options are validated and the target planned there, before any task
runs.  Tasks write one branch each and return its xid in the commit message;
``commit()`` hands the messages to the coordinator.  The writer objects keep
no state between calls beyond what was decided in ``writer()``.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from types import FrameType
from typing import TYPE_CHECKING, Any

from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from xasink.dialects.base import TargetPlan
from xasink.errors import OptionError, PreflightError
from xasink.options import WriteOptions, parse_options
from xasink.protocol.coordinator import ABORT_SETTLE_S, Coordinator
from xasink.protocol.liveness import ensure_keeper, guard_name, spark_driver_process
from xasink.protocol.xid import new_run_nonce
from xasink.results import BranchOutcome
from xasink.spark.txwrite import TX_URL_OPTION, TxWrite, abort_tx_write, prepare_tx_write, record_tx_part, tx_write
from xasink.support import faults, notices
from xasink.support.phases import phase, worker_started
from xasink.write_modes.spec import ApplySpec, spec_for
from xasink.write_modes.statements import check_predicate, ensure_shadow, shadow_plan

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger("xasink")

STREAM_BATCH_PROPERTY = "streaming.sql.batchId"
# the Python worker in which Spark calls streamWriter() again to commit or abort a micro-batch; Spark tells
# the data source nothing else about why it is called, and this call needs no plan for an append
STREAM_COMMIT_MODULE = "pyspark.sql.worker.python_streaming_sink_runner"
# the streaming query's id, kept in its checkpoint across restarts: recorded with each batch it writes
STREAM_QUERY_PROPERTY = "sql.streaming.queryId"
# Spark kills a cancelled task's Python worker after spark.python.task.killTimeout (2 s): sweep past that
# internal option: xasink.write() names the run, so it can tell its own decision from a concurrent writer's
RUN_OPTION = "xasink.run"
# internal option: foreach_batch names the streaming query when its tasks cannot (Spark Connect)
QUERY_OPTION = "xasink.query"


def _task_fault_spec() -> str | None:
    ctx = TaskContext.get()
    return ctx.getLocalProperty(faults.LOCAL_PROPERTY) if ctx is not None else None


faults.task_spec_source = _task_fault_spec


SESSION_TIME_ZONE = "spark.sql.session.timeZone"


@dataclass
class XasinkCommitMessage(WriterCommitMessage):
    outcome: BranchOutcome


def arrow_schema(schema: StructType) -> pa.Schema:
    """The Arrow schema Spark's Arrow writer hands us, or a clear error naming a column it cannot take."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema

    fields = []
    for f in schema.fields:
        try:
            fields.append(to_arrow_schema(StructType([f]), timezone="UTC").field(0))
        except Exception:  # noqa: BLE001 - Spark raises assorted errors for types Arrow cannot carry
            raise PreflightError(
                f"column '{f.name}' has Spark type {f.dataType.simpleString()}, which xasink cannot "
                "write; cast it to a supported type first"
            ) from None
    return pa.schema(fields)


@dataclass(frozen=True)
class WritePlan:
    """What the driver decided before any task runs, shipped to every task."""

    target: TargetPlan
    log_id: str  # the decision log's identity: every branch's xid carries it
    guard: str | None = None  # the session lock this driver holds while its runs live (xasink.protocol.liveness)
    apply: ApplySpec | None = None  # overwrite / replaceWhere / change-data: tasks load the shadow table
    claimed: bool = False  # the driver took the batch over for this run: first task attempts skip their claim


def _prepare(options: WriteOptions, schema: StructType, branches: int | None) -> WritePlan:
    """Driver-side: server checks, journal, table plan.  Everything that can be wrong fails here."""
    from xasink.write_modes.schema import plan_target

    worker_started("driver", sink=options.sink_id)
    coordinator = Coordinator(options, shared=True)
    try:
        with phase("plan.preflight", sink=options.sink_id):
            coordinator.preflight(branches)
        source = arrow_schema(schema)
        flag = None
        if options.delete_flag_column is not None:
            flag, source = _split_flag(options.delete_flag_column, source)
        with phase("plan.target", sink=options.sink_id), coordinator.dialect.connect() as conn:
            target = plan_target(coordinator.dialect, conn, options, source)
        with phase("plan.keeper", sink=options.sink_id):
            log_id = coordinator.journal.log_id()
            driver = spark_driver_process()
            guard = ensure_keeper(coordinator.dialect, log_id, driver) if driver is not None else None
        apply = None
        if options.applies_at_commit:
            with phase("plan.shadow", sink=options.sink_id), coordinator.dialect.connect() as conn:
                apply = spec_for(options, target, log_id)
                check_predicate(conn, apply)
                ensure_shadow(coordinator.dialect, conn, apply)
            target = shadow_plan(target, apply, flag)
        return WritePlan(target, log_id, guard, apply)
    finally:
        coordinator.close()


def _split_flag(name: str, source: pa.Schema) -> tuple[str, pa.Schema]:
    """The delete flag's DataFrame column (matched without case) and the columns the table takes."""
    import pyarrow as pa

    found = [f for f in source if f.name.lower() == name.lower()]
    if len(found) != 1:
        raise PreflightError(f"option 'deleteFlagColumn': '{name}' is not a column of the DataFrame")
    if not pa.types.is_boolean(found[0].type):
        raise PreflightError(
            f"option 'deleteFlagColumn': column '{found[0].name}' is {found[0].type}, not boolean; derive it, "
            "e.g. col('op') == 'd'"
        )
    return found[0].name, pa.schema([f for f in source if f.name != found[0].name])


def session_time_zone(ctx: TaskContext) -> str | None:
    """The session time zone of the write, as Spark hands its SQL settings to tasks (a local property).

    A session that never set it runs in the JVM's default zone, which a Python worker cannot see: None then
    (xasink.write_modes.schema.conform takes the zone Spark labels TimestampType columns with, else UTC)."""
    return ctx.getLocalProperty(SESSION_TIME_ZONE) or None


def _write_task(
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
    with notices.captured() as warned:
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
        query=ctx.getLocalProperty(STREAM_QUERY_PROPERTY) or query,
        journal_url=tx.journal_url if tx is not None else None,
        claimed=plan.claimed,
    )


def _outcomes(messages: list[WriterCommitMessage | None]) -> list[BranchOutcome | None]:
    return [m.outcome if isinstance(m, XasinkCommitMessage) else None for m in messages]


@contextmanager
def _told(path: str | None) -> Iterator[None]:
    """Run a driver-side step so that its warnings reach the user: into the notices file of ``xasink.write``
    (the user's process reports them), else to this worker's stderr, which Spark copies to the driver's."""
    if path is None:
        _worker_logging(logging.WARNING)
    quiet = _worker_handler if path is not None else None  # set up by an earlier write in this reused worker
    level = quiet.level if quiet is not None else logging.NOTSET
    if quiet is not None:
        quiet.setLevel(logging.CRITICAL + 1)  # the user's process reports them: not twice
    with notices.captured() as warned:
        try:
            yield
        finally:
            notices.save(path, warned)
            if quiet is not None:
                quiet.setLevel(level)


def _tell_tasks(outcomes: list[BranchOutcome | None]) -> None:
    """Log what the tasks warned about, here on the driver side (inside :func:`_told`)."""
    for outcome in outcomes:
        for text in outcome.warnings if outcome is not None else ():
            log.warning("%s", text)


def check_not_micro_batch(options: WriteOptions) -> None:
    """A batch write with a sinkId but no batchId, run inside a streaming micro-batch (the user's own
    foreachBatch): refused.  Its batch id would be 0 for every micro-batch, and every micro-batch after the
    first would be skipped as a replay of batch 0.  Only a task learns that it runs in a micro-batch."""
    ctx = TaskContext.get()
    if ctx is not None and ctx.getLocalProperty(STREAM_BATCH_PROPERTY) is not None:
        raise OptionError(
            f"sink {options.sink_id}: format('xasink') with a sinkId and no batchId runs inside streaming "
            f"micro-batch {ctx.getLocalProperty(STREAM_BATCH_PROPERTY)} (a foreachBatch function): every "
            "micro-batch would be batch 0 and all but the first skipped as its replay. Use "
            "writeStream.foreachBatch(xasink.foreach_batch(url=..., table=..., sink_id=...)), or pass "
            "batchId=epoch_id. Nothing was written."
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
    ) -> None:
        """``sink_without_batch``: the caller named a sinkId and no batchId (:func:`check_not_micro_batch`);
        ``query``: the streaming query foreach_batch names, for tasks that cannot see it (Spark Connect)."""
        self.options = options
        self.plan = plan
        self.run = run or new_run_nonce()
        self.tx = tx
        self.notices = notices_path  # xasink.write's file for warnings (xasink.support.notices); None: to stderr
        self.sink_without_batch = sink_without_batch
        self.query = query

    def write(self, iterator: Iterator[pa.RecordBatch]) -> XasinkCommitMessage:
        if self.sink_without_batch:
            check_not_micro_batch(self.options)
        return _write_task(self.options, self.plan, self.run, self.options.batch_id, iterator, self.tx, self.query)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        if self.tx is not None:  # inside xasink.transaction(): record the part, the transaction decides
            record_tx_part(self.options, self.tx, self.run, _outcomes(messages))
            return
        with _told(self.notices):
            _tell_tasks(_outcomes(messages))
            worker_started("driver", sink=self.options.sink_id, batch=self.options.batch_id)
            coordinator = Coordinator(self.options, shared=True)
            try:  # the coordinator logs the batch's figures
                with phase("commit.call", sink=self.options.sink_id, batch=self.options.batch_id):
                    outcomes = _outcomes(messages)
                    coordinator.commit(
                        self.options.batch_id, outcomes, query=self.query, apply=self.plan.apply, run=self.run
                    )
            finally:
                coordinator.close()

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        if self.tx is not None:
            abort_tx_write(self.options, self.tx, self.run, _outcomes(messages))
            return
        with _told(self.notices):
            _tell_tasks(_outcomes(messages))
            coordinator = Coordinator(self.options, shared=True)
            try:
                coordinator.abort(self.options.batch_id, _outcomes(messages), settle_s=ABORT_SETTLE_S, run=self.run)
            finally:
                coordinator.close()


_worker_handler: logging.Handler | None = None


def _worker_logging(level: int) -> None:
    """Send xasink's records to stderr (Spark's driver/executor log) in a Spark Python worker nobody configured.

    Spark's workers set up no logging, so without this the per-batch INFO line and the warnings of fault
    points and commit retries would vanish.  A handler configured by the user (or Spark's worker logging)
    is respected: then only the logger's level is lowered.
    """
    global _worker_handler
    xlog = logging.getLogger("xasink")
    if xlog.level == logging.NOTSET or xlog.level > level:
        xlog.setLevel(level)
    if _worker_handler is None:
        if logging.getLogger().handlers or any(not isinstance(h, logging.NullHandler) for h in xlog.handlers):
            return
        _worker_handler = logging.StreamHandler(sys.stderr)
        _worker_handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        xlog.addHandler(_worker_handler)
    _worker_handler.setLevel(level)


def _recover_settled(options: WriteOptions) -> None:
    """Finish decided batches and roll back what can never commit, up to the sink's last decided batch.

    Spark calls ``streamWriter()`` before each micro-batch's tasks and again before its commit, and the
    first call after a restart comes before the replay of a batch the crashed run may have decided.
    Batches after the last decided one may have live branches (this very batch): they are left to the
    tasks (``clear_blockers``) and to the commit's sweep.  In a stream a batch is planned only after the
    previous one committed, so every undecided branch of a batch below the last decided one is stale.
    """
    coordinator = Coordinator(options, shared=True)
    try:
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


def _called_by(frame: FrameType | None, module: str) -> bool:
    """Whether ``frame`` runs code of ``module``, whether Spark ran it with ``python -m`` or imported it."""
    if frame is None:
        return False
    spec = frame.f_globals.get("__spec__")
    return frame.f_globals.get("__name__") == module or getattr(spec, "name", None) == module


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


class XasinkStreamWriter(DataSourceStreamArrowWriter):
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
        if self._plan is None:
            self._plan = _prepare(self.options, self.schema, self.options.num_partitions)
            with phase("plan.recover", sink=self.options.sink_id):
                _recover_settled(self.options)  # at restart: finish what the crashed run decided, before its replay
        return self._plan

    def __getstate__(self) -> dict[str, Any]:
        """Planned before it goes to the tasks: every task of the batch gets the same plan."""
        _ = self.plan  # already made by streamWriter(): a no-op unless Spark pickles from a commit worker
        return self.__dict__.copy()

    def write(self, iterator: Iterator[pa.RecordBatch]) -> XasinkCommitMessage:
        ctx = TaskContext.get()
        raw = ctx.getLocalProperty(STREAM_BATCH_PROPERTY) if ctx is not None else None
        if raw is None:
            raise RuntimeError("xasink stream writer: Spark did not set the micro-batch id for this task")
        return _write_task(self.options, self.plan, self.run, int(raw), iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803 - Spark's name
        """Decide and commit (the coordinator logs the batch's figures at INFO and keeps them in the journal)."""
        _worker_logging(logging.INFO)
        _tell_tasks(_outcomes(messages))  # the tasks' warnings travel with their messages
        worker_started("driver", sink=self.options.sink_id, batch=batchId)
        # only a write mode's apply step needs the plan here (its shadow table); an append commits by its xids
        apply = self.plan.apply if self.options.applies_at_commit else None
        coordinator = Coordinator(self.options, shared=True)
        try:
            with phase("commit.call", sink=self.options.sink_id, batch=batchId):
                try:
                    check_batch_order(coordinator, batchId)
                except OptionError:
                    coordinator.abort(batchId, _outcomes(messages))
                    raise
                coordinator.commit(batchId, _outcomes(messages), apply=apply)
        finally:
            coordinator.close()

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        """A task failed or the query stopped: roll back the batch's branches (a decided batch is finished).

        Without planning: the abort comes in a fresh worker, often during the outage that caused it, and a
        plan (server checks, the table, recovery) that fails there would roll nothing back.  Only the run
        guard's name is needed, for a stop whose tasks returned no message; it is derived, not ensured."""
        _worker_logging(logging.INFO)
        coordinator = Coordinator(self.options, shared=True)
        try:
            coordinator.abort(batchId, _outcomes(messages), settle_s=ABORT_SETTLE_S, guard=self._guard(coordinator))
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


class XasinkDataSource(DataSource):
    """``df.write.format("xasink")``: all partitions of a batch commit, or none."""

    @classmethod
    def name(cls) -> str:
        return "xasink"

    def _options(self, streaming: bool) -> WriteOptions:
        opts: dict[str, Any] = {k: v for k, v in self.options.items() if not k.lower().startswith("xasink.")}
        return parse_options(opts, streaming=streaming)

    def _run(self) -> str | None:
        run = self.options.get(RUN_OPTION)
        if run is not None and not re.fullmatch(r"[0-9a-f]{8}", str(run)):
            raise OptionError(f"option '{RUN_OPTION}' is internal to xasink.write()")
        return str(run) if run is not None else None

    def writer(self, schema: StructType, overwrite: bool) -> XasinkBatchWriter:
        options = self._options(streaming=False).with_mode("overwrite" if overwrite else "append")
        tx = tx_write(self.options)
        if tx is not None and options.applies_at_commit:
            raise OptionError(
                "overwrite, replaceWhere and change-data writes (deleteFlagColumn, sequenceColumn) are not "
                "supported inside xasink.transaction() yet; write them with xasink.write() or format('xasink')"
            )
        if tx is not None:  # inside xasink.transaction(): it claimed the batch and swept; plan and write only
            run = self._run()
            if run is None:
                raise OptionError(f"option '{TX_URL_OPTION}' is internal to xasink.transaction()")
            return XasinkBatchWriter(options, prepare_tx_write(options, schema, tx), run, tx)
        path = self.options.get(notices.NOTICES_OPTION)
        given = {k.lower() for k in self.options}
        query = self.options.get(QUERY_OPTION)
        with _told(path):
            plan = _prepare(options, schema, options.num_partitions)
            run = self._run() or new_run_nonce()
            coordinator = Coordinator(options, shared=True)
            try:
                with phase("plan.recover", sink=options.sink_id, batch=options.batch_id):
                    # another target's (or query's) batch, or one the log forgot: refuse now
                    coordinator.check_batch(options.batch_id, query)
                    # take the batch over here, once, instead of in every task; then finish what earlier runs
                    # decided and roll back their branches of this batch (superseded now, so dead to recovery)
                    claimed = coordinator.claim(options.batch_id, run, plan.guard)
                    coordinator.recover(upto=options.batch_id, run=run)
            finally:
                coordinator.close()
        return XasinkBatchWriter(
            options,
            replace(plan, claimed=claimed),
            run,
            notices_path=path,
            sink_without_batch="sinkid" in given and "batchid" not in given,
            query=str(query) if query is not None else None,
        )

    def streamWriter(self, schema: StructType, overwrite: bool) -> XasinkStreamWriter:  # noqa: N802 - Spark's name
        _worker_logging(logging.INFO)
        # outputMode("complete"): every micro-batch is the whole result, replacing the table's rows
        options = self._options(streaming=True).with_mode("overwrite" if overwrite else "append")
        writer = XasinkStreamWriter(options, schema)
        if not _called_by(sys._getframe(1), STREAM_COMMIT_MODULE):
            _ = writer.plan  # plan now: a wrong option or a missing table fails here, before any task
        return writer
