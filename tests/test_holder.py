"""Only the holder decides, a decided batch is finished forward, recovery rolls back orphans first.

Without Spark: two writers of one (sink, batch) run the data source's own steps (its planning ``prepare_write``,
the driver's claim, ``write_partition`` as a task, ``Coordinator.commit`` as the driver's commit) in the
order a test needs, so the older writer is held just before its decision while the newer one takes the
batch over and prepares.  Each test runs on PostgreSQL and MariaDB and checks the exact rows, the
decision log, and (the ``db`` fixture) that nothing is left prepared.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
import pytest
import sqlalchemy as sa
from pyspark.sql.types import IntegerType, StringType, StructField, StructType

from tests.cluster import wait_for
from tests.doc_cases import raises
from tests.harness import with_statement_timeout
from tests.targets import Target
from xasink.dialects import dialect_for
from xasink.dialects.base import Dialect
from xasink.dialects.values import ErrorKind
from xasink.errors import BatchAbortedError, CommitIncompleteError, ConcurrentWriterError
from xasink.ops import cli
from xasink.options import WriteOptions, parse_options
from xasink.protocol.coordinator import Coordinator
from xasink.protocol.liveness import InProcessGuard
from xasink.protocol.multi_target import MultiCoordinator
from xasink.protocol.partition_writer import write_partition
from xasink.protocol.xid import new_run_nonce
from xasink.results import BranchOutcome, WriteResult
from xasink.spark.planning import WritePlan, prepare_write
from xasink.spark.txwrite import TxWrite, record_tx_part
from xasink.support.faults import InjectedFault
from xasink.write_modes.schema import plan_target

STRUCT = StructType([StructField("id", IntegerType(), False), StructField("name", StringType(), True)])
ARROW = pa.schema([pa.field("id", pa.int32(), nullable=False), ("name", pa.string())])
RETRY = ["--retry-for", "3s"]  # recover's retry budget for what blocks it


def named(ids: range | list[int]) -> list[tuple[int, str]]:
    return [(i, f"n{i}") for i in ids]


class Writer:
    """One writer run of a sink's batch, step by step as the data source drives it (no Spark)."""

    def __init__(
        self, db: Target, table: str, sink_id: str, batch_id: int, mode: str, guard: str, **extra: Any
    ) -> None:
        raw: dict[str, Any] = {"url": db.url, "dbtable": table, "sinkId": sink_id, "batchId": batch_id, **extra}
        if db.password is not None:
            raw["password"] = db.password
        self.options: WriteOptions = parse_options(raw).with_mode(mode)
        self.batch_id = batch_id
        self.run = new_run_nonce()
        self.plan: WritePlan = prepare_write(self.options, STRUCT, 2)
        self.coordinator = Coordinator(self.options)
        self.guard = guard  # this process's run guard (one per process and log): both writers live
        self.outcomes: list[BranchOutcome | None] = []
        self.attempts = 0  # task attempt ids, unique per run (an attempt's xid names it)

    def claim(self) -> None:
        """What the data source's writer() does before the tasks start: take the batch over for this run."""
        assert self.coordinator.claim(self.batch_id, self.run, self.guard)
        self.coordinator.recover(upto=self.batch_id, run=self.run)

    def prepare(self, partitions: list[list[tuple[int, str]]]) -> None:
        """The tasks: one branch per non-empty partition (an empty one opens none), first attempts."""
        for p, chunk in enumerate(partitions):
            self.attempts += 1
            batch = pa.RecordBatch.from_pydict({"id": [r[0] for r in chunk], "name": [r[1] for r in chunk]}, ARROW)
            self.outcomes.append(
                write_partition(
                    self.options,
                    self.plan.target,
                    batch_id=self.batch_id,
                    partition=p,
                    task_attempt_id=self.attempts,
                    run=self.run,
                    batches=[batch] if chunk else [],
                    log_id=self.plan.log_id,
                    guard=self.guard,
                    claimed=True,
                )
            )

    def commit(self) -> WriteResult:
        return self.coordinator.commit(self.batch_id, self.outcomes, apply=self.plan.apply)

    def close(self) -> None:
        self.coordinator.close()


@pytest.fixture
def sink(db: Target) -> tuple[Target, str, str]:
    table = db.new_table()
    db.keyed_table(table)
    return db, table, f"h{uuid.uuid4().hex[:10]}"


@pytest.fixture
def writers(sink: tuple[Target, str, str]) -> Iterator[Callable[..., Writer]]:
    """Writers of the sink's table, sharing this process's run guard; closed at the end."""
    db, table, sink_id = sink
    made: list[Writer] = []
    guard: list[InProcessGuard] = []
    probe = Coordinator(parse_options({"url": db.url, "dbtable": table, "password": db.password}))

    def make(batch_id: int, mode: str, **extra: Any) -> Writer:
        if not guard:
            probe.preflight()
            guard.append(InProcessGuard(probe.dialect, probe.journal.log_id()))
        made.append(Writer(db, table, sink_id, batch_id, mode, guard[0].name, **extra))
        return made[-1]

    yield make
    for w in made:
        w.close()
    for g in guard:
        g.close()
    probe.close()


def rows(db: Target, table: str) -> list[tuple[int, str]]:
    return [(int(i), str(n)) for i, n in db.rows(table, "id")]


@pytest.mark.parametrize("mode", ["overwrite", "append"])
def test_a_taken_over_run_with_no_rows_does_not_decide(
    sink: tuple[Target, str, str], writers: Callable[..., Writer], mode: str
) -> None:
    """W1 (all partitions empty) is held before its decision; W2 takes the batch over and prepares 10 rows.
    W1's commit must fail and change nothing (an empty xid list proves nothing about who holds the batch);
    W2's commit then writes its 10 rows."""
    db, table, sink_id = sink
    db.execute(f"INSERT INTO {db.q(table)} (id, name) VALUES (100, 'old')")
    w1, w2 = writers(7, mode), writers(7, mode)
    w1.claim()
    w1.prepare([[], []])  # every partition empty: no branch, no xid
    w2.claim()  # a newer writer of the same sink and batch takes it over ...
    w2.prepare([named(range(0, 5)), named(range(5, 10))])  # ... and prepares
    with pytest.raises(ConcurrentWriterError):
        w1.commit()  # W1 goes on: it lost its claim, so it decides nothing
    assert db.decision(sink_id, 7) is None
    assert len(db.prepared(sink_id)) == 2  # W2's branches untouched
    assert rows(db, table) == [(100, "old")]
    result = w2.commit()
    assert (result.rows, result.skipped) == (10, False)
    expected = named(range(10)) + ([(100, "old")] if mode == "append" else [])
    assert rows(db, table) == sorted(expected)
    decided = db.decision(sink_id, 7)
    assert decided is not None and decided.state == "committed" and len(decided.xids) == 2
    assert db.prepared(sink_id) == []


def test_a_transaction_whose_decision_was_lost_does_not_take_a_newer_empty_decision_for_its_own(
    sink: tuple[Target, str, str],
) -> None:
    """A multi-target transaction's decision COMMIT is lost; meanwhile a newer writer took the transaction over
    and decided it with no write.  Settling by reading the log must not take that empty decision (whose runs
    are a subset of any) for its own: the old run commits nothing, and its branch is rolled back."""
    db, table, sink_id = sink
    raw: dict[str, Any] = {"url": db.url, "dbtable": table, "sinkId": sink_id, "batchId": 3}
    if db.password is not None:
        raw["password"] = db.password
    opts = parse_options(raw)
    old = MultiCoordinator(sink_id, 3, opts)
    try:
        target = old.before_write(opts, 1)
        with target.dialect.connect() as conn:
            plan = plan_target(target.dialect, conn, opts, ARROW)
            conn.commit()
        chunk = named(range(5))
        batch = pa.RecordBatch.from_pydict({"id": [r[0] for r in chunk], "name": [r[1] for r in chunk]}, ARROW)
        outcome = write_partition(
            opts,
            plan,
            batch_id=3,
            partition=0,
            task_attempt_id=1,
            run=old.run,
            batches=[batch],
            log_id=old.log_id,
            guard=old.guard.name,
            journal_url=old.dialect.url,
        )
        record_tx_part(opts, TxWrite(old.dialect.url, 0, old.guard.name), old.run, [outcome])
        assert len(db.prepared(sink_id)) == 1
        newer = MultiCoordinator(sink_id, 3, opts)  # takes the transaction over ...
        try:
            newer.commit(set())  # ... and decides it with no write at all
        finally:
            newer.close()
        decided = db.decision(sink_id, 3)
        assert decided is not None and decided.xids == []
        # the old run's decision COMMIT was lost: it settles by reading the log again
        with pytest.raises((ConcurrentWriterError, BatchAbortedError)):
            old._settle(ConnectionError("the decision's COMMIT got no reply"))
    finally:
        old.close()
    assert rows(db, table) == []
    assert db.prepared(sink_id) == []
    decided = db.decision(sink_id, 3)
    assert decided is not None and decided.xids == []


@pytest.mark.doc_case("recover/unfinished", "recover/done")
def test_recovery_blocked_by_a_statement_timeout_keeps_the_decided_batch_and_says_so(
    sink: tuple[Target, str, str],
    writers: Callable[..., Writer],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """An overwrite batch is decided and committed into the shadow; its driver dies before the apply.  The
    operator's ``xasink recover`` runs with a statement timeout while an application transaction holds a row
    of the table: its apply is cancelled.  That says nothing about the rows: the decision stays, recover exits
    1 naming the batch and what blocked it, and a later recover finishes it forward with the new rows."""
    db, table, sink_id = sink
    db.execute(f"INSERT INTO {db.q(table)} (id, name) VALUES (100, 'old')")
    w = writers(4, "overwrite")
    w.claim()
    w.prepare([named(range(0, 3)), named(range(3, 6))])
    monkeypatch.setenv("XASINK_FAULT", "driver.after_commits:raise")  # the driver dies before the apply
    with pytest.raises(InjectedFault):
        w.commit()
    monkeypatch.delenv("XASINK_FAULT")
    assert db.prepared(sink_id) == []  # committed into the shadow
    with db.connect() as app:  # an application's transaction holds a row of the table
        with app.cursor() as cur:
            cur.execute("BEGIN")  # (the MariaDB helper's connections autocommit)
            cur.execute(f"UPDATE {db.q(table)} SET name = 'app' WHERE id = 100")
        code = cli.main(["recover", "--url", with_statement_timeout(db, 1), "--sink-id", sink_id, *RETRY])
        app.rollback()
    out = capsys.readouterr()
    assert code == 1, out
    assert f"sink {sink_id} batch 4" in out.out + out.err, out
    decided = db.decision(sink_id, 4)
    assert decided is not None and decided.state == "committing"  # still decided: only forward
    assert rows(db, table) == [(100, "old")]
    code = cli.main(["recover", "--url", db.url, "--sink-id", sink_id])  # nothing blocks it any more
    out = capsys.readouterr()
    assert code == 0, out
    assert rows(db, table) == named(range(6))
    decided = db.decision(sink_id, 4)
    assert decided is not None and decided.state == "committed"
    assert db.prepared(sink_id) == []


@pytest.mark.doc_case("recover/apply-error")
def test_recovery_withdraws_a_decided_batch_whose_rows_the_table_refuses_and_exits_2(
    sink: tuple[Target, str, str],
    writers: Callable[..., Writer],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A replaceWhere batch is decided and committed into the shadow; its driver dies before the apply.  Its
    rows lie outside replaceWhere: ``xasink recover`` withdraws the decision (ApplyError, the only reason a
    decided batch is ever withdrawn), the table keeps its old rows, and recover exits 2 naming why."""
    db, table, sink_id = sink
    db.execute(f"INSERT INTO {db.q(table)} (id, name) VALUES (1, 'old')")
    w = writers(8, "overwrite", replaceWhere="id < 3")
    w.claim()
    w.prepare([named(range(0, 3)), named(range(3, 6))])  # 3, 4, 5 are outside replaceWhere
    monkeypatch.setenv("XASINK_FAULT", "driver.after_commits:raise")  # the driver dies before the apply
    with pytest.raises(InjectedFault):
        w.commit()
    monkeypatch.delenv("XASINK_FAULT")
    assert db.decision(sink_id, 8) is not None and db.prepared(sink_id) == []
    code = cli.main(["recover", "--url", db.url, "--sink-id", sink_id, *RETRY])
    out = capsys.readouterr()
    assert code == 2, out
    assert f"sink {sink_id}" in out.err and "replaceWhere" in out.err, out
    assert db.decision(sink_id, 8) is None  # withdrawn: as if aborted, a rerun writes it
    assert rows(db, table) == [(1, "old")]
    assert db.prepared(sink_id) == []


def test_recovery_rolls_back_an_orphan_before_the_apply_that_would_wait_on_it(
    sink: tuple[Target, str, str],
    writers: Callable[..., Writer],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """An overwrite batch is decided without a speculative copy of one partition (an orphan, still prepared
    with rows in the shadow), and its driver dies before any COMMIT.  Recovery rolls the orphan back before
    it applies the batch: on MariaDB the apply's read of the shadow would wait on the orphan's locks."""
    db, table, sink_id = sink
    db.execute(f"INSERT INTO {db.q(table)} (id, name) VALUES (100, 'old')")
    w = writers(5, "overwrite")
    w.claim()
    w.prepare([named(range(0, 3)), named(range(3, 6))])
    decided = list(w.outcomes)
    w.outcomes.clear()
    w.prepare([named(range(0, 3))])  # another attempt of partition 0, prepared too: never listed
    assert len(db.prepared(sink_id)) == 3
    w.outcomes[:] = decided
    monkeypatch.setenv("XASINK_FAULT", "driver.after_decide:raise")  # decided, then the driver dies
    with pytest.raises(InjectedFault):
        w.commit()
    monkeypatch.delenv("XASINK_FAULT")
    code = cli.main(["recover", "--url", db.url, "--sink-id", sink_id, *RETRY])
    out = capsys.readouterr()
    assert code == 0, out
    assert rows(db, table) == named(range(6))
    found = db.decision(sink_id, 5)
    assert found is not None and found.state == "committed" and len(found.xids) == 2
    assert db.prepared(sink_id) == []


def server_error(dialect: Dialect, *statements: str) -> sa.exc.DBAPIError:
    """The error the server answers the last of ``statements`` with, run in one session and transaction."""
    with dialect.connect() as conn:
        try:
            for statement in statements:
                conn.exec_driver_sql(statement)
        except sa.exc.DBAPIError as exc:
            conn.rollback()
            return exc
    raise AssertionError(f"no error from {statements[-1]!r}")


def cancelled_error(dialect: Dialect, db: Target, table: str) -> sa.exc.DBAPIError:
    """The error of a statement waiting on a row lock that an operator cancels (pg_cancel_backend, KILL QUERY)."""
    t = db.q(table)
    found: list[BaseException] = []
    with db.connect() as holder, dialect.connect() as conn:
        me = conn.exec_driver_sql("SELECT pg_backend_pid()" if db.kind == "postgresql" else "SELECT CONNECTION_ID()")
        pid = int(me.scalar_one())

        def wait() -> None:
            try:
                conn.exec_driver_sql(f"UPDATE {t} SET name = 'waiting' WHERE id = 1")
            except sa.exc.DBAPIError as exc:
                found.append(exc)

        with holder.cursor() as cur:
            cur.execute("BEGIN")  # (the MariaDB helper's connections autocommit)
            cur.execute(f"UPDATE {t} SET name = 'held' WHERE id = 1")
            waiter = threading.Thread(target=wait)
            waiter.start()
            wait_for(lambda: db.lock_waiters("%SET name = 'waiting'%"), 60, "the UPDATE to wait for the row")
            cur.execute(f"SELECT pg_cancel_backend({pid})" if db.kind == "postgresql" else f"KILL QUERY {pid}")
            waiter.join(60)
            assert not waiter.is_alive()
        holder.rollback()
        conn.rollback()
    assert found and isinstance(found[0], sa.exc.DBAPIError), found
    return found[0]


def test_the_dialect_tells_wrong_rows_from_not_finished(db: Target) -> None:
    """Only an error about the rows may withdraw a decided batch; a statement timeout, a read-only
    transaction, an operator's cancel or a missing table say nothing about them (real errors of the
    server, classified by the dialect)."""
    table = db.new_table()
    db.keyed_table(table)
    db.execute(f"INSERT INTO {db.q(table)} (id, name) VALUES (1, 'a')")
    dialect = dialect_for(parse_options({"url": db.url, "dbtable": table, "password": db.password}).url)
    t = db.q(table)
    try:
        rows_wrong = [
            server_error(dialect, f"INSERT INTO {t} (id, name) VALUES (1, 'again')"),  # duplicate key
            server_error(dialect, f"INSERT INTO {t} (id, name) VALUES (NULL, 'x')"),  # NOT NULL (the key)
        ]
        if db.kind == "postgresql":
            not_finished = [
                server_error(dialect, "SET statement_timeout = 50", "SELECT pg_sleep(2)"),
                server_error(dialect, "SET TRANSACTION READ ONLY", f"DELETE FROM {t}"),
            ]
        else:
            not_finished = [
                server_error(dialect, "SET SESSION max_statement_time = 0.05", f"SELECT SLEEP(2) FROM {t}"),
                server_error(dialect, "START TRANSACTION READ ONLY", f"DELETE FROM {t}"),
            ]
        assert [dialect.classify(e) for e in rows_wrong] == [ErrorKind.ROWS] * 2, rows_wrong
        not_finished.append(cancelled_error(dialect, db, table))
        assert [dialect.classify(e) for e in not_finished] == [ErrorKind.TRANSIENT] * 3, not_finished
        missing = server_error(dialect, "SELECT * FROM xasink_no_such_table_here")
        assert dialect.classify(missing) == ErrorKind.FATAL  # not about the rows: never withdraws either
    finally:
        dialect.dispose()


@pytest.mark.doc_case("error/CommitIncompleteError")
def test_sparks_abort_after_an_incomplete_apply_keeps_the_decided_batch(
    sink: tuple[Target, str, str], writers: Callable[..., Writer]
) -> None:
    """The driver's apply is cancelled by its statement timeout until commitTimeout passes (an application
    holds a row of the table): CommitIncompleteError.  Spark then calls abort: it must not withdraw the
    decided batch either.  Once the lock is gone, recovery finishes it forward with the new rows."""
    db, table, sink_id = sink
    db.execute(f"INSERT INTO {db.q(table)} (id, name) VALUES (100, 'old')")
    w = writers(6, "overwrite", url=with_statement_timeout(db, 1), commitTimeout=2)
    w.claim()
    w.prepare([named(range(0, 3)), named(range(3, 6))])
    with db.connect() as app:  # an application's transaction holds a row of the table
        with app.cursor() as cur:
            cur.execute("BEGIN")  # (the MariaDB helper's connections autocommit)
            cur.execute(f"UPDATE {db.q(table)} SET name = 'app' WHERE id = 100")
        with raises(CommitIncompleteError, match="batch 6 is decided"):
            w.commit()
        report = w.coordinator.abort(6, w.outcomes, run=w.run)  # what Spark does after a failed commit
        app.rollback()
    assert 6 in report.unfinished
    decided = db.decision(sink_id, 6)
    assert decided is not None and decided.state == "committing"
    assert rows(db, table) == [(100, "old")]
    assert w.coordinator.recover().finished_batches == [6]
    assert rows(db, table) == named(range(6))
    assert db.prepared(sink_id) == []
