"""Adversarial checks of issue 27's rules (only the holder decides, forward only after the decision, errors
classified once by the dialect) against the real servers: each test is a way found to lose, double or
mis-report a batch; ``xfail(strict=True)`` while the bug is open."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import pyarrow as pa
import pytest

from tests.cluster import wait_for
from tests.doc_cases import raises
from tests.harness import held_at
from tests.scenarios.driver import _Phase, arrow_schema, record_batch, write
from tests.targets import MARIADB, POSTGRESQL, Target, case
from xasink.errors import ApplyError, CommitIncompleteError, ReplayIncompleteError
from xasink.options import WriteOptions, parse_options
from xasink.protocol.coordinator import Coordinator
from xasink.protocol.liveness import InProcessGuard
from xasink.protocol.partition_writer import write_partition
from xasink.protocol.xid import new_run_nonce
from xasink.write_modes.schema import plan_target
from xasink.write_modes.spec import spec_for
from xasink.write_modes.statements import apply_lock_name, session_schema, shadow_plan


def change_data_options(db: Target, table: str, sink: str, batch: int) -> dict[str, Any]:
    options: dict[str, Any] = {
        "url": db.url,
        "dbtable": table,
        "sinkId": sink,
        "batchId": batch,
        "upsertKeyColumns": "id",
        "deleteFlagColumn": "is_delete",
        "sequenceColumn": "seq",
        "commitTimeout": 20,
        "lockTimeout": 20,
    }
    if db.password is not None:
        options["password"] = db.password
    return options


def in_thread(spec: dict[str, Any]) -> tuple[threading.Thread, dict[str, Any]]:
    """A scenario writer (tests/scenarios/driver.py) run in a thread; its result or exception in the dict."""
    result: dict[str, Any] = {}

    def run() -> None:
        try:
            result["ok"] = write(spec, lambda **_: None, _Phase())
        except Exception as exc:  # noqa: BLE001 - the outcome is what is checked
            result["error"] = exc

    t = threading.Thread(target=run)
    t.start()
    return t, result


def test_apply_error_after_a_recovery_applied_the_batch_is_not_reported_as_nothing_visible(
    db: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The driver's apply of a decided change-data batch fails on a constraint (ROWS); before its withdrawal
    gets the sink lock, the constraint is gone and 'xasink recover' applies the batch (its rows are
    visible, the batch marked committed).  The withdrawal then deletes nothing: the driver must not tell the
    user 'the table keeps its old rows and nothing of this batch is visible' (invariant 11)."""
    table = db.new_table()
    db.create_table(
        table, "id int PRIMARY KEY, name varchar(40), seq bigint, CONSTRAINT adv_no_bad CHECK (name <> 'bad')"
    )
    sink = f"adv-{uuid.uuid4().hex[:8]}"
    options = change_data_options(db, table, sink, 1)
    with held_at(monkeypatch, "driver.after_commits") as hold, db.connect() as lock, lock.cursor() as cur:
        t, result = in_thread({"options": options, "save_mode": "append", "partitions": [[[1, "bad", 5, False]]]})
        hold.wait(what=lambda: result)  # decided, its branches committed into the shadow, before the apply
        cur.execute("BEGIN")
        cur.execute(f"SELECT sink_id FROM {db.q('xasink_sinks')} WHERE sink_id = %s FOR UPDATE", (sink,))
        hold.release()  # the apply fails on the check, the withdrawal waits for the sink lock held here
        wait_for(lambda: db.lock_waiters("%xasink_sinks%"), 120, "the withdrawal to wait for the sink row")
        assert t.is_alive() and not result, result
        db.execute(f"ALTER TABLE {db.q(table)} DROP CONSTRAINT adv_no_bad")
        monkeypatch.delenv("XASINK_FAULT")
        recovery = Coordinator(parse_options(options))
        try:
            report = recovery.recover()
        finally:
            recovery.close()
        assert 1 in report.finished_batches
        cur.execute("COMMIT")
    t.join(60)
    assert db.rows(table) == [(1, "bad", 5)]  # the batch is visible
    decision = db.decision(sink, 1)
    assert decision is not None
    assert "error" not in result, repr(result.get("error"))


def prepare_orphan(opts: WriteOptions) -> None:
    """A branch of the sink's batch 5 prepared into the change-data shadow and never decided: an orphan."""
    c = Coordinator(opts)
    try:
        with c.dialect.connect() as conn:
            plan = plan_target(
                c.dialect, conn, opts, pa.schema([f for f in arrow_schema(True) if f.name != "is_delete"])
            )
            apply = spec_for(opts, plan, c.journal.log_id())
        write_partition(
            opts,
            shadow_plan(plan, apply, "is_delete"),
            batch_id=5,
            partition=0,
            task_attempt_id=0,
            run=new_run_nonce(),
            batches=[record_batch([[7, "x", 1, False]], arrow_schema(True))],
            log_id=c.journal.log_id(),
        )
    finally:
        c.close()


@contextmanager
def serializable_default(db: Target) -> Iterator[None]:
    """The test database with SERIALIZABLE as every new session's default (``ALTER DATABASE ... SET
    default_transaction_isolation``, as some sites set it); a snapshot is then the first statement's."""
    if db.kind != POSTGRESQL:  # InnoDB (REPEATABLE READ by default) makes a read view at the first plain read
        yield
        return
    name = db.execute("SELECT current_database()")[0][0]
    db.execute(f"ALTER DATABASE {db.q(name)} SET default_transaction_isolation = 'serializable'")
    try:
        yield
    finally:
        db.execute(f"ALTER DATABASE {db.q(name)} RESET default_transaction_isolation")


def test_recovery_waiting_on_the_sink_lock_sees_a_decision_made_meanwhile(
    db: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Run A decides batch 1 while a recovery waits for the sink lock; A dies right after its decision.
    Under SERIALIZABLE (or REPEATABLE READ) sessions the recovery's snapshot is taken when its lock
    statement starts, before A's decision committed: it must still see the decision once it holds the lock,
    and commit A's branch, never roll it back as undecided (invariants 2 and 4)."""
    with serializable_default(db):
        decided_while_recovery_waits(db, monkeypatch)


def decided_while_recovery_waits(db: Target, monkeypatch: pytest.MonkeyPatch) -> None:
    table = db.new_table()
    db.keyed_table(table)
    sink = f"adv-{uuid.uuid4().hex[:8]}"
    options: dict[str, Any] = {"url": db.url, "dbtable": table, "sinkId": sink, "batchId": 1}
    if db.password is not None:
        options["password"] = db.password
    opts = parse_options(options)
    a = Coordinator(opts)
    a.preflight(1)
    schema = arrow_schema(False)
    with a.dialect.connect() as conn:
        plan = plan_target(a.dialect, conn, opts, schema)
    log_id = a.journal.log_id()
    keeper = Coordinator(opts)  # the guard's own pool: disposed, its session (and lock) ends
    guard = InProcessGuard(keeper.dialect, log_id)
    run = new_run_nonce()
    assert a.claim(1, run, guard.name)
    outcome = write_partition(
        opts,
        plan,
        batch_id=1,
        partition=0,
        task_attempt_id=0,
        run=run,
        batches=[record_batch([[1, "a"], [2, "b"]], schema)],
        log_id=log_id,
        guard=guard.name,
        claimed=True,
    )
    # a session that holds the same decision key uncommitted: A's decision, under the sink lock, waits on it
    with db.connect() as blocker, blocker.cursor() as cur:
        cur.execute("BEGIN")
        columns = ", ".join(db.q(c) for c in ("sink_id", "batch_id", "state", "xids", "rows", "branches"))
        cur.execute(
            f"INSERT INTO {db.q('xasink_batches')} ({columns}, prepare_ms, decided_at, compacted) "
            "VALUES (%s, 1, 'committing', '[]', 0, 0, 0, now(), false)",
            (sink,),
        )
        result: dict[str, Any] = {}

        def commit() -> None:
            try:
                result["ok"] = a.commit(1, [outcome], run=run)
            except Exception as exc:  # noqa: BLE001 - the outcome is what is checked
                result["error"] = exc

        with held_at(monkeypatch, "driver.after_decide") as hold:  # A "dies" right after deciding
            ta = threading.Thread(target=commit)
            ta.start()
            # A holds the sink lock, its decision waits on the blocker's row
            wait_for(lambda: db.lock_waiters("%xasink_batches%"), 120, "A's decision to wait on the blocker's row")
            r = Coordinator(parse_options(options))
            report: dict[str, Any] = {}
            tr = threading.Thread(target=lambda: report.setdefault("r", r.recover()))
            tr.start()
            wait_for(lambda: db.lock_waiters("%xasink_sinks%"), 120, "the recovery to wait for the sink lock")
            guard.close()  # A's driver is gone (its run guard with it)
            keeper.close()
            cur.execute("ROLLBACK")  # A's decision goes through and A stands still; the recovery gets the lock
            hold.wait(what=lambda: result)
            tr.join(120)
            assert not tr.is_alive()
        ta.join(120)
        assert not ta.is_alive()
    r.close()
    a.close()
    decision = db.decision(sink, 1)
    assert decision is not None  # A decided
    assert "error" not in result, repr(result.get("error"))
    assert db.rows(table) == [(1, "a"), (2, "b")], report


@pytest.mark.doc_case("error/ReplayIncompleteError")
@pytest.mark.parametrize("db", [case(MARIADB)], indirect=True)
def test_apply_lock_held_past_the_commit_timeout_says_the_batch_is_decided(
    db: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another session takes the table's apply lock once the batch is decided, and holds it past commitTimeout:
    the batch is decided, so the writer must be told so (CommitIncompleteError: recovery finishes it), and a
    recovery meanwhile reports the batch unfinished instead of failing the whole pass with it.  (Held from
    before the decision, the lock keeps the batch from being decided at all: test_adversary_order.py.)"""
    table = db.new_table()
    db.create_table(table, "id int PRIMARY KEY, name varchar(40), seq bigint")
    sink = f"adv-{uuid.uuid4().hex[:8]}"
    options = {**change_data_options(db, table, sink, 1), "commitTimeout": 3, "controlLockTimeout": 1}
    opts = parse_options(options)
    c = Coordinator(opts)
    try:
        c.preflight(1)
        source = pa.schema([f for f in arrow_schema(True) if f.name != "is_delete"])
        with c.dialect.connect() as conn:
            plan = plan_target(c.dialect, conn, opts, source)
            lock = apply_lock_name(spec_for(opts, plan, c.journal.log_id()), session_schema(conn))
    finally:
        c.close()
    monkeypatch.setenv("XASINK_FAULT", "driver.after_decide:sleep=3:b=1")  # time to take the lock after it
    with db.connect() as holder, holder.cursor() as cur, ThreadPoolExecutor(1) as pool:
        job = pool.submit(
            write,
            {"options": options, "save_mode": "append", "partitions": [[[1, "a", 5, False]]]},
            lambda **_: None,
            _Phase(),
        )
        deadline = time.monotonic() + 180  # (a hang, not a timing: a loaded CI is slow)
        while db.decision(sink, 1) is None:
            assert time.monotonic() < deadline and not job.done(), "the batch was never decided"
            time.sleep(0.02)
        cur.execute("SELECT GET_LOCK(%s, 30)", (lock,))  # the decision's own hold of it ends with the decision
        assert cur.fetchone()[0] == 1
        with pytest.raises(CommitIncompleteError) as first:
            job.result(timeout=120)
        monkeypatch.delenv("XASINK_FAULT")
        assert not isinstance(first.value, ReplayIncompleteError)  # its own decision
        # a rerun of the batch finds it decided by the first run and cannot finish it either: told so, and that
        # its own rows are not part of the batch (a "skipped" not finished yet; scenario seed 1008 on MariaDB)
        with raises(ReplayIncompleteError, match="decided by another run"):
            write(
                {"options": options, "save_mode": "append", "partitions": [[[2, "b", 6, False]]]},
                lambda **_: None,
                _Phase(),
            )
        r = Coordinator(opts)
        try:
            report = r.recover()
        finally:
            r.close()
        assert 1 in report.unfinished
        cur.execute("SELECT RELEASE_LOCK(%s)", (lock,))
    r = Coordinator(opts)
    try:
        assert 1 in r.recover().finished_batches
    finally:
        r.close()
    assert db.rows(table) == [(1, "a", 5)]


def test_recovery_of_a_batch_withdrawn_meanwhile_is_not_a_journal_error(
    db: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The driver's apply fails on a constraint (ROWS) and its withdrawal waits for the sink lock; a recovery
    reads the batch as pending, then waits for the same lock (an orphan of the sink is prepared).  The
    withdrawal goes first: the recovery must find the batch withdrawn (nothing to finish), not report the
    log as changed behind xasink's back and fail its pass."""
    table = db.new_table()
    db.create_table(
        table, "id int PRIMARY KEY, name varchar(40), seq bigint, CONSTRAINT adv_no_bad CHECK (name <> 'bad')"
    )
    sink = f"adv-{uuid.uuid4().hex[:8]}"
    options = change_data_options(db, table, sink, 1)
    opts = parse_options(options)
    report: dict[str, Any] = {}
    r = Coordinator(opts)

    def recover() -> None:
        try:
            report["ok"] = r.recover()
        except Exception as exc:  # noqa: BLE001 - the outcome is what is checked
            report["error"] = exc

    with held_at(monkeypatch, "driver.after_commits") as hold, db.connect() as lock, lock.cursor() as cur:
        t, result = in_thread({"options": options, "save_mode": "append", "partitions": [[[1, "bad", 5, False]]]})
        hold.wait(what=lambda: result)  # decided, its branches committed, before the apply
        prepare_orphan(opts)  # (the writer's planning recovery would have rolled it back)
        cur.execute("BEGIN")
        cur.execute(f"SELECT sink_id FROM {db.q('xasink_sinks')} WHERE sink_id = %s FOR UPDATE", (sink,))
        hold.release()  # the apply fails on the check; the withdrawal waits for the sink lock
        wait_for(lambda: db.lock_waiters("%xasink_sinks%"), 120, "the withdrawal to wait for the sink row")
        monkeypatch.delenv("XASINK_FAULT")
        tr = threading.Thread(target=recover)
        tr.start()
        # the recovery read batch 1 as pending and waits for the sink lock too
        wait_for(lambda: len(db.lock_waiters("%xasink_sinks%")) >= 2, 120, "the recovery to wait for the sink row")
        cur.execute("COMMIT")
    t.join(120)
    tr.join(120)
    assert not t.is_alive() and not tr.is_alive()
    r.close()
    assert isinstance(result.get("error"), ApplyError), result
    assert db.decision(sink, 1) is None  # withdrawn
    assert db.rows(table) == []
    assert "error" not in report, repr(report.get("error"))
