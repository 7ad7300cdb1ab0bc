"""One writer of a scenario, without Spark: what a Spark job's driver and tasks do, in one process.

:func:`writer_main` runs in a process of its own (forked by the runner's fork server, which imported xasink
once, so a writer starts in milliseconds): it plans the write as the data source's ``writer()`` does (server
checks, the table's plan, the shadow table of an apply mode, the run guard, the batch's check, the driver's
claim, recovery of earlier runs), writes each partition with ``write_partition`` as a task does (a failed task
is retried once as attempt 1, as Spark retries it; a second failure aborts the batch as the data source's
``abort()`` does after a failed job, ``undecided``, and raises the task's error), then commits with
``Coordinator.commit`` (or aborts); a commit that raises is followed by ``Coordinator.abort``, as Spark calls a
batch write's ``abort()`` when its ``commit()`` fails. The fault comes from ``XASINK_FAULT``, so a fault point
``kill`` takes this process down at that protocol point, ``sleep=`` pauses it there.

It appends JSON lines to its result file: ``{"event": "run", "run": ...}`` (its run nonce, the end of its
branches' xids), ``{"event": "claiming", "t": ...}`` as it begins its claim, ``{"event": "claimed", "t": ...}``
once the claim took the batch over, ``{"event": "committing", "t": ...}`` as it begins the commit, ``{"event":
"fault", "point": ..., "t": ...}`` as it reaches a fault point its spec names (the runner starts anchored
interference and recover runs from these), and last its outcome (``written`` / ``skipped`` / ``error`` with the
exception's classes, message and the phase it failed in, and for ``spec["look"]`` the ids each named table held
right after: read with the plain driver, tests/targets.py). ``t`` is ``time.monotonic()``, which all processes
of the machine share.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from dataclasses import replace
from typing import Any

import pyarrow as pa
from pyspark.sql.types import IntegerType, StringType, StructField, StructType
from sqlalchemy.engine import make_url

from tests.targets import MARIADB, mariadb_rows, rows
from xasink.ops.cli import main as cli_main
from xasink.options import parse_options
from xasink.protocol.coordinator import Coordinator
from xasink.protocol.liveness import InProcessGuard
from xasink.protocol.multi_target import MultiCoordinator
from xasink.protocol.partition_writer import write_partition
from xasink.protocol.xid import new_run_nonce
from xasink.results import BranchOutcome, WriteResult
from xasink.spark.planning import planning_failed
from xasink.spark.transaction import LOG_TABLE_PLACEHOLDER
from xasink.spark.txwrite import TxWrite, abort_tx_write, prepare_tx_write, record_tx_part
from xasink.support.faults import fault
from xasink.write_modes.schema import plan_target
from xasink.write_modes.spec import spec_for
from xasink.write_modes.statements import check_predicate, ensure_shadow, shadow_plan

FLAG = "is_delete"  # the change-data delete flag's column (not written to the table)


def arrow_schema(change_data: bool) -> pa.Schema:
    fields = [pa.field("id", pa.int32(), nullable=False), pa.field("name", pa.string())]
    if change_data:
        fields += [pa.field("seq", pa.int64()), pa.field(FLAG, pa.bool_())]
    return pa.schema(fields)


def record_batch(rows: list[list[Any]], schema: pa.Schema) -> pa.RecordBatch:
    columns = list(zip(*rows, strict=True)) if rows else [()] * len(schema)
    arrays = [pa.array(list(c), type=f.type) for c, f in zip(columns, schema, strict=True)]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _warm_up() -> None:
    """What a writer would otherwise load on first use (pyarrow's kernels, the SQLAlchemy drivers), done once in
    the fork server that imports this module: each forked writer starts with it loaded."""
    import pyarrow.compute as pc
    import sqlalchemy.dialects.mysql.pymysql  # noqa: F401
    import sqlalchemy.dialects.postgresql.psycopg2  # noqa: F401

    batch = record_batch([[1, "a", 2, False]], arrow_schema(True))
    pc.cast(batch.column(0), pa.int64())


_warm_up()


class _Phase:
    name = "plan"


def write(spec: dict[str, Any], emit: Any, phase: _Phase) -> WriteResult:
    """The write of one batch, as the data source's batch writer runs it (xasink/spark/batch_writer.py)."""
    opts = parse_options(spec["options"]).with_mode(spec["save_mode"])
    source = arrow_schema(opts.change_data)
    table_source = pa.schema([f for f in source if f.name != FLAG])
    partitions: list[list[list[Any]]] = spec["partitions"]
    query: str | None = spec.get("query")  # the streaming query's id (foreach_batch records it with the batch)
    coordinator = Coordinator(opts)
    guard: InProcessGuard | None = None
    say = logging.getLogger(__name__).info
    say("writer started: batch %s, %d partitions, fault %s", opts.batch_id, len(partitions), spec.get("fault"))
    try:
        coordinator.preflight(len(partitions))
        with coordinator.dialect.connect() as conn:
            target = plan_target(coordinator.dialect, conn, opts, table_source)
        log_id = coordinator.journal.log_id()
        guard = InProcessGuard(coordinator.dialect, log_id)  # this process is the run's driver
        apply = None
        if opts.applies_at_commit:
            with coordinator.dialect.connect() as conn:
                apply = spec_for(opts, target, log_id)
                check_predicate(conn, apply)
                ensure_shadow(coordinator.dialect, conn, apply)
            target = shadow_plan(target, apply, FLAG if opts.delete_flag_column else None)
        run = new_run_nonce()
        emit(event="run", run=run)
        batch_id = opts.batch_id
        say("planned: run %s", run)
        phase.name = "claim"  # from here every error is an xasink one, as the data source's writer() wraps them
        with coordinator.policy.never_raw(planning_failed(opts)):
            coordinator.check_batch(batch_id, query)
            emit(event="claiming", t=time.monotonic())
            claimed = coordinator.claim(batch_id, run, guard.name)
            if claimed:
                emit(event="claimed", t=time.monotonic())
            say("claimed: %s", claimed)
            coordinator.recover(upto=batch_id, run=run)
        say("recovered earlier runs")
        phase.name = "tasks"
        outcomes: list[BranchOutcome | None] = []
        for p, rows in enumerate(partitions):
            batches = [record_batch(rows, source)] if rows else []
            for attempt in (0, 1):
                try:
                    outcome = write_partition(
                        opts,
                        target,
                        batch_id=batch_id,
                        partition=p,
                        task_attempt_id=p + 100 * attempt,
                        attempt_number=attempt,
                        run=run,
                        batches=batches,
                        log_id=log_id,
                        guard=guard.name,
                        query=query,
                        claimed=claimed,
                    )
                    break
                except Exception:
                    if attempt == 1:  # Spark gives up on the task: the job aborts, and the writer's abort() runs
                        # as XasinkBatchWriter.abort's after a failed job: the run never decides, so its branches
                        # go without the sink lock first; a failed abort is logged and the job's error raised
                        try:
                            coordinator.abort(batch_id, [*outcomes, None], run=run, undecided=True)
                        except Exception:  # noqa: BLE001 - Spark logs a failed abort and raises the job's error
                            logging.getLogger(__name__).warning("abort after the failed job failed too", exc_info=True)
                        raise
                    logging.getLogger(__name__).warning("task %d failed, retrying it", p, exc_info=True)
            outcomes.append(outcome)
        phase.name = "commit"
        emit(event="committing", t=time.monotonic())
        try:
            return coordinator.commit(batch_id, outcomes, query=query, apply=apply, run=run)
        except Exception:  # Spark calls the writer's abort() when its commit() fails, then raises commit's error
            try:
                coordinator.abort(batch_id, outcomes, run=run)
            except Exception:  # noqa: BLE001 - Spark logs a failed abort and raises the commit's error
                logging.getLogger(__name__).warning("abort after the failed commit failed too", exc_info=True)
            raise
    finally:
        if guard is not None:
            try:  # the data source's run guard lives in a keeper process of its own: its end is not the write's
                guard.close()
            except Exception:  # noqa: BLE001 - a session lost in a restart: the lock went with it
                logging.getLogger(__name__).warning("the run guard's session was lost", exc_info=True)
        coordinator.close()


def _output_to(log_path: str) -> None:
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)


def recover_main(argv: list[str], log_path: str, fault_spec: str | None = None) -> None:
    """The body of an ``xasink recover`` process: the console script's entry point, output to ``log_path``;
    ``fault_spec``: its ``XASINK_FAULT`` (a pause inside its apply)."""
    _output_to(log_path)
    os.environ.pop("XASINK_FAULT", None)
    if fault_spec:
        os.environ["XASINK_FAULT"] = fault_spec
    rc = cli_main(argv)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)


def writer_main(spec: dict[str, Any], result_path: str, log_path: str) -> None:
    """The body of a writer process: output to ``log_path``, events and outcome to ``result_path``."""
    _output_to(log_path)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", force=True)
    os.environ.pop("XASINK_FAULT", None)
    if spec.get("fault"):
        os.environ["XASINK_FAULT"] = spec["fault"]

    def emit(**fields: Any) -> None:
        with open(result_path, "a") as out:
            out.write(json.dumps(fields) + "\n")

    logging.getLogger("xasink.support.faults").addHandler(FaultEvents(emit))
    phase = _Phase()
    emit(event="started", t=time.monotonic())
    try:
        result = (multi_write if spec.get("multi") else write)(spec, emit, phase)
        told: dict[str, Any] = {"outcome": "skipped" if result.skipped else "written", "rows": result.rows}
    except Exception as exc:
        logging.getLogger(__name__).warning("writer failed", exc_info=True)
        classes = [c.__name__ for c in type(exc).__mro__]
        told = {"outcome": "error", "error": " ".join(classes), "message": str(exc), "phase": phase.name}
    told["t"] = time.monotonic()
    if spec.get("look") and told["outcome"] != "error":
        told["seen"] = look(spec["look"])
    emit(**told)
    sys.stdout.flush()
    sys.stderr.flush()
    # done: the outcome is told.  Leave at once, as a Spark worker may: waiting for the threads xasink keeps
    # for the process (commit lanes, the spare connection) to wind down costs seconds per writer
    os._exit(0)


class FaultEvents(logging.Handler):
    """Writes an event for each fault point the process reaches (xasink.support.faults logs it before acting)."""

    def __init__(self, emit: Any) -> None:
        super().__init__(logging.WARNING)
        self.emit_event = emit

    def emit(self, record: logging.LogRecord) -> None:
        if record.args and isinstance(record.args, tuple):
            self.emit_event(event="fault", point=str(record.args[0]), t=time.monotonic())


def look(tables: dict[str, dict[str, str]]) -> dict[str, list[int]] | str:
    """The ids each table holds now, by name (``{name: {"kind", "url", "table"}}``), read with the plain driver;
    the error's text if a read fails (a server down: the look proves nothing then)."""
    seen = {}
    try:
        for name, t in tables.items():
            found = mariadb_rows(t["url"], t["table"]) if t["kind"] == MARIADB else rows(t["url"], t["table"])
            seen[name] = sorted(int(r[0]) for r in found)
    except Exception as exc:  # noqa: BLE001 - reported, never judged
        return f"{type(exc).__name__}: {exc}"
    return seen


# --------------------------------------------------------------------------- a multi-target writer


def multi_write(spec: dict[str, Any], emit: Any, phase: _Phase) -> Any:
    """One batch into a table on each of two databases in one transaction, as ``xasink.transaction`` /
    ``foreach_batch_multi`` drive it (xasink/spark/transaction.py) with each ``tx.write``'s Spark job replaced
    by what its driver and tasks do (xasink/spark/txwrite.py, ``write_partition``); the writes in
    ``spec["order"]``.  Returns the transaction's :class:`MultiCoordinator` verdict as a WriteResult."""
    say = logging.getLogger(__name__).info
    creds = spec["credentials"]  # {db: {"password": ...}} or empty
    query: str | None = spec.get("query")
    journal_url: str | None = spec.get("journal_url")

    def parsed(db: str) -> Any:
        return parse_options(
            {**spec["common"], **creds.get(db, {}), "url": spec["urls"][db], "dbtable": spec["tables"][db]}
        ).with_mode("append")

    first = parsed(spec["order"][0])
    log_opts = (
        parse_options(
            {**spec["common"], "url": journal_url, "dbtable": LOG_TABLE_PLACEHOLDER, **spec["log_credentials"]}
        )
        if journal_url
        else first
    )
    log_opts = replace_ids(log_opts, spec["sink"], spec["batch"])
    emit(event="claiming", t=time.monotonic())
    mc = MultiCoordinator(
        spec["sink"], spec["batch"], log_opts, stream=query is not None, fixed=journal_url is not None, query=query
    )
    emit(event="run", run=mc.run)
    say("multi writer: run %s, replay %s, order %s, fault %s", mc.run, mc.replay, spec["order"], spec.get("fault"))
    if not mc.replay:
        emit(event="claimed", t=time.monotonic())
    schema = StructType([StructField("id", IntegerType(), False), StructField("name", StringType())])
    written: set[int] = set()
    try:
        try:
            phase.name = "tasks"
            for part, db in enumerate(spec["order"]):
                opts = replace_ids(parsed(db), spec["sink"], spec["batch"])
                if mc.replay:
                    mc.check_replay(opts)
                    mc.target(opts)
                    continue
                partitions: list[list[list[Any]]] = spec["partitions"][db]
                mc.before_write(opts, len(partitions))
                tx = TxWrite(make_url(mc.journal_url), part, mc.guard.name)
                plan = prepare_tx_write(opts, schema, tx)
                outcomes: list[BranchOutcome | None] = []
                for p, rows in enumerate(partitions):
                    batches = [record_batch(rows, arrow_schema(False))] if rows else []
                    for attempt in (0, 1):
                        try:
                            outcome = write_partition(
                                opts,
                                plan.target,
                                batch_id=spec["batch"],
                                partition=p,
                                task_attempt_id=1000 * part + p + 100 * attempt,
                                attempt_number=attempt,
                                run=mc.run,
                                batches=batches,
                                log_id=plan.log_id,
                                guard=plan.guard,
                                query=query,
                                journal_url=tx.journal_url,
                            )
                            break
                        except Exception:
                            if attempt == 1:
                                abort_tx_write(opts, tx, mc.run, [*outcomes, None])
                                raise
                            logging.getLogger(__name__).warning("task %d failed, retrying it", p, exc_info=True)
                    outcomes.append(outcome)
                record_tx_part(opts, tx, mc.run, outcomes)
                if mc.part(part) is None:
                    raise RuntimeError(f"write {part} recorded no part")
                fault("tx.after_write", partition=part, batch=spec["batch"])
                written.add(part)
        except BaseException:
            if not mc.replay:
                mc.abort()
            raise
        if mc.replay:
            mc.finish_replay()
            return WriteResult(spec["sink"], spec["batch"], 0, 0, True, {})
        phase.name = "commit"
        emit(event="committing", t=time.monotonic())
        parts, timings = mc.commit(written)
        return WriteResult(spec["sink"], spec["batch"], sum(p.rows for p in parts), 0, False, timings)
    finally:
        mc.close()


def replace_ids(opts: Any, sink: str, batch: int) -> Any:
    return replace(opts, sink_id=sink, batch_id=batch)


def multi_writer_main(spec: dict[str, Any], result_path: str, log_path: str) -> None:
    """The body of a multi-target writer process (see :func:`writer_main`)."""
    writer_main({**spec, "multi": True}, result_path, log_path)
