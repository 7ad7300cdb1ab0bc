"""A multi-target transaction's failure paths, over PostgreSQL and MariaDB together (issue 37, items 4-6), and
the single-table decision's (FOUND.md 8.6).

- A failure before the decision (the log's sink row locked past ``controlLockTimeout``, a target database
  down) rolls back every prepared part on every database and tells the user so with an xasink error; a part
  the abort cannot reach (its database is down) is named with the command that finishes it, and that
  command rolls it back once the database is back.  A failure after the decision's COMMIT was sent is
  settled by reading the log again: a decided transaction is never aborted.
- A replay of a decided transaction is "skipped" only once every part of it is committed; a replay that
  writes a subset of the targets finishes its own databases' parts and raises ``ReplayIncompleteError``
  naming the others.
- ``xasink recover`` exits 1 while a multi-target batch of its log is unfinished, naming the database
  still to recover, and 0 once every database was recovered.

Spark runs the user's side (``xasink.transaction``) where the test is about what the user is told; the
rest drives the transaction without Spark (tests/harness.py's :class:`MultiTx`).  Every test checks the
exact rows of each table and what is left prepared on each server.
"""

from __future__ import annotations

import json
import re
import uuid
from contextlib import ExitStack
from typing import Any

import pytest

import xasink
from tests.harness import (
    MultiTx,
    cli,
    expected,
    frame,
    host_port,
    kill_session_lock_holder,
    log_table_locked,
    save_by,
    sink_row_locked,
    sink_row_locked_once_prepared,
    tasks_fault,
    three_tables,
    through,
)
from tests.leaks import assert_no_secret
from tests.targets import Target
from tests.tcp_proxy import TcpProxy
from xasink.support.faults import ENV as FAULT_ENV

pytestmark = [pytest.mark.mariadb]

DECISION = b"INSERT INTO xasink_batches"  # arms a cut of the COMMIT that follows it on the same connection


@pytest.fixture
def sink() -> str:
    return f"tf{uuid.uuid4().hex[:8]}"


def rows(target: Target, table: str) -> list[tuple[Any, ...]]:
    return target.rows(table) if target.table_exists(table) else []


def decided_not_committed(
    monkeypatch: pytest.MonkeyPatch, sink: str, batch: int, log: Target, writes: list[tuple[Target, str, range]]
) -> None:
    """A transaction whose driver died right after its decision: decided in ``log``, every part still prepared."""
    tx = MultiTx(sink, batch, log)
    try:
        for target, table, ids in writes:
            tx.write(target, table, ids)
        monkeypatch.setenv(FAULT_ENV, f"driver.after_decide:raise:b={batch}")
        with pytest.raises(RuntimeError, match="after_decide"):
            tx.commit()
    finally:
        monkeypatch.delenv(FAULT_ENV)
        tx.close()  # the process that decided is gone: its guard with it
    assert log.execute("SELECT state FROM xasink_batches WHERE sink_id = %s", sink) == [("committing",)]


# --------------------------------------------------------------------------- a single table's decision (FOUND.md 8.6)


@pytest.mark.spark
@pytest.mark.parametrize("way", ["write", "format"])
def test_a_lock_held_on_the_log_at_a_single_table_decision_rolls_back_the_batch(  # type: ignore[no-untyped-def]
    spark, db, way
):
    """The single-table sibling of item 4: another session holds the log's sink row from the moment the
    batch's branches are prepared, past controlLockTimeout.  The decision cannot be made; the run's branches
    are rolled back without that lock, and the user gets BatchAbortedError with the lock timeout as its
    cause, while the lock is still held.  Fails on main: a raw OperationalError, and Spark's abort after it
    waits on the same row and fails, so the branch stays prepared (scenario seed 143)."""
    table, sink = db.new_table(), f"tf{uuid.uuid4().hex[:8]}"
    options = {"sinkId": sink, "controlLockTimeout": "1"}

    def save(batch: int, ids: range) -> None:
        save_by(way, frame(spark, ids, 2), db, table, batch, **options)

    save(0, range(5))  # the sink's row in the log: what the other session holds
    with sink_row_locked_once_prepared(db, sink, 1, branches=2) as held:
        with tasks_fault(spark, "task.after_prepare:sleep=4:b=1"), pytest.raises(xasink.BatchAbortedError) as caught:
            save(1, range(100, 110))
        assert held.is_set()  # the decision met the lock; the roll-back did not need it
        assert db.prepared(sink) == []
        assert db.rows(table) == expected(range(5))
    message = str(caught.value)
    assert "nothing of it is visible and nothing of it is left prepared" in message, message
    assert "lock" in message.lower(), message  # the cause, as the server said it
    assert sorted(db.decisions(sink)) == [0]
    save(1, range(100, 110))  # the lock is gone: the same batch runs again, nothing of the failed attempt counts
    assert db.rows(table) == expected(range(5), range(100, 110))
    assert db.prepared(sink) == []


# --------------------------------------------------------------------------- item 4: failures before the decision


@pytest.mark.spark
def test_a_lock_held_on_the_log_at_a_writes_recovery_is_an_xasink_error(  # type: ignore[no-untyped-def]
    spark, pg, maria, sink
):
    """A write's pre-flight finishes what earlier runs of its sink left prepared there, under the log's sink
    row; another session holds that row past controlLockTimeout.  The user's ``tx.write`` raises
    BatchAbortedError with the cause, nothing of the transaction visible or prepared.  It raised the raw
    LockNotAvailable (long-run seeds 8188 and 8230, multi-interfere)."""
    orders, _, events = three_tables(pg, maria)
    earlier = MultiTx(sink, 1, pg)  # another run of the sink, alive, its branches prepared on MariaDB
    try:
        earlier.write(maria, events, range(500, 504))
        with ExitStack() as lock, pytest.raises(xasink.BatchAbortedError) as caught:
            with xasink.transaction(sink_id=sink, batch_id=2, journal_url=pg.url, controlLockTimeout=1) as tx:
                tx.write(frame(spark, range(10), 2), pg.url, orders)  # claimed; nothing of the sink on pg before
                lock.enter_context(sink_row_locked(pg, sink))
                tx.write(frame(spark, range(100, 104), 2), maria.url, events)  # its recovery meets the lock
        told = str(caught.value)
        assert "LockNotAvailable" in told and "nothing it wrote is visible" in told, told
        assert rows(pg, orders) == [] and pg.prepared(sink) == [] and len(maria.prepared(sink)) == 2
        assert pg.execute("SELECT count(*) FROM xasink_batches WHERE sink_id = %s AND batch_id = 2", sink) == [(0,)]
    finally:
        earlier.mc.abort()
        earlier.close()
    assert maria.prepared(sink) == [] and rows(maria, events) == []


@pytest.mark.spark
def test_a_lock_held_on_the_logs_parts_as_a_write_records_its_part_is_an_xasink_error(  # type: ignore[no-untyped-def]
    spark, pg, maria, sink
):
    """A write's commit records its prepared branches as a part of the transaction in the log; another
    session holds the log's parts table past controlLockTimeout.  The user's ``tx.write`` raises
    BatchAbortedError naming the step and its cause, and nothing of the transaction is visible or prepared.
    Before, the data source's commit raised the raw error (long-run seed 30115: a deadlock there, which is now
    run again), and ``tx.write`` named only the write."""
    orders, _, events = three_tables(pg, maria)
    with xasink.transaction(sink_id=sink, batch_id=1, journal_url=maria.url, controlLockTimeout=1) as tx:
        tx.write(frame(spark, range(3), 2), pg.url, orders)  # the log's parts table, with a part in it
    with ExitStack() as lock, pytest.raises(xasink.BatchAbortedError) as caught:
        with xasink.transaction(sink_id=sink, batch_id=2, journal_url=maria.url, controlLockTimeout=1) as tx:
            tx.write(frame(spark, range(10, 14), 2), pg.url, orders)
            lock.enter_context(log_table_locked(maria, "xasink_parts"))
            tx.write(frame(spark, range(100, 104), 2), maria.url, events)
    told = str(caught.value)
    assert "transaction 2: recording write 1 in the decision log failed" in told, told
    assert "Lock wait timeout" in told and "nothing it wrote is visible" in told, told
    assert rows(pg, orders) == expected(range(3)) and rows(maria, events) == []
    assert pg.prepared(sink) == [] and maria.prepared(sink) == []


@pytest.mark.spark
def test_a_write_failing_while_the_logs_sink_row_is_held_leaves_nothing_prepared(  # type: ignore[no-untyped-def]
    spark, pg, maria, sink
):
    """Another session holds the log's sink row past controlLockTimeout as a transaction's write runs: its
    tasks prepare, cannot check their branches in the log, and fail; the write's abort cannot take the sink
    lock either.  The user is told the write failed and nothing is visible, and its branches are rolled back at once,
    without the sink lock, as a single batch's abort does.  Before, they stayed prepared, holding their row
    locks, until the lock was gone and something recovered them (long run of stop 54, seed 40010: there the
    abort's raw OperationalError also replaced the write's own error)."""
    orders, _, events = three_tables(pg, maria)
    with xasink.transaction(sink_id=sink, batch_id=1, journal_url=pg.url) as tx:
        tx.write(frame(spark, range(3), 2), pg.url, orders)  # the log's sink row
    held: list[str] = ["not looked at"]
    # the error of the task's last attempt: BatchAbortedError (the first, its check) or BranchError (a retry's
    # wait on the first attempt's rows, till the abort after the failed job rolls them back)
    with pytest.raises((xasink.BatchAbortedError, xasink.BranchError)) as caught:
        with xasink.transaction(sink_id=sink, batch_id=2, journal_url=pg.url, controlLockTimeout=1) as tx:
            tx.write(frame(spark, range(10, 13), 2), pg.url, orders)  # the transaction's claim, then the lock
            with sink_row_locked(pg, sink):
                try:
                    # (a retried task waits lockTimeout on its first attempt's prepared rows, then fails too)
                    tx.write(frame(spark, range(100, 104), 2), maria.url, events, lockTimeout=1)
                finally:
                    held = maria.prepared(sink)
    assert held == [], "the failed write's branches stayed prepared while the sink row was held"
    told = str(caught.value)
    assert events in told and "nothing of this batch is visible" in told, told
    assert rows(pg, orders) == expected(range(3)) and rows(maria, events) == []
    assert pg.prepared(sink) == [] and maria.prepared(sink) == []


@pytest.mark.spark
@pytest.mark.parametrize(
    "step, cut",
    [
        ("target", b"SELECT @@hostname"),  # the MariaDB write's first statement there: its server's identity
        ("part", b"ORDER BY xasink_parts.run, xasink_parts.part"),  # the driver reads back the write's part
        ("replay", b"SELECT @@hostname"),  # a replayed write's check of its table
    ],
)
def test_a_connection_lost_in_a_writes_steps_before_the_decision_is_an_xasink_error(  # type: ignore[no-untyped-def]
    spark, pg, maria, sink, step, cut
):
    """Before the decision a write reads its database's identity, and after its Spark job the part its tasks
    recorded in the log; a replayed write checks its table.  A connection lost in any of these raised the raw
    OperationalError through ``tx.write`` (adversary review of stop 44).  Now BatchAbortedError with the
    cause: nothing of the attempt visible or prepared, and the retry writes each row once."""
    orders, _, events = three_tables(pg, maria)
    if step == "replay":
        with xasink.transaction(sink_id=sink, batch_id=1, journal_url=pg.url) as tx:
            tx.write(frame(spark, range(10), 2), pg.url, orders)
            tx.write(frame(spark, range(100, 104), 2), maria.url, events)
    proxied = pg if step == "part" else maria
    with TcpProxy(*host_port(proxied.url)) as proxy:
        proxy.cut_on(cut)
        log_url = through(proxy, pg.url) if step == "part" else pg.url
        maria_url = through(proxy, maria.url) if step != "part" else maria.url
        with pytest.raises(xasink.BatchAbortedError) as caught:
            with xasink.transaction(sink_id=sink, batch_id=1, journal_url=log_url) as tx:
                tx.write(frame(spark, range(10), 2), pg.url, orders)
                tx.write(frame(spark, range(100, 104), 2), maria_url, events)
        assert proxy.cut, "the connection was never cut"
    told = str(caught.value)
    assert "Lost connection" in told or "closed" in told or "terminat" in told, told
    said = {
        "target": r"a write's checks and recovery in its database failed \(.*\); it is rolled back",
        "part": r"reading write \d+'s recorded part failed \(.*\); it is rolled back",
        "replay": r"a replayed write's check of its table failed \(.*\); nothing of this attempt was written",
    }
    assert re.search(f"sink {re.escape(sink)} transaction 1: {said[step]}", told), told
    assert pg.prepared(sink) == [] and maria.prepared(sink) == []
    if step != "replay":
        assert rows(pg, orders) == [] and rows(maria, events) == []
    with xasink.transaction(sink_id=sink, batch_id=1, journal_url=pg.url) as tx:
        tx.write(frame(spark, range(10), 2), pg.url, orders)
        tx.write(frame(spark, range(100, 104), 2), maria.url, events)
    assert tx.result is not None and tx.result.skipped == (step == "replay")
    assert rows(pg, orders) == expected(range(10)) and rows(maria, events) == expected(range(100, 104))
    assert pg.prepared(sink) == [] and maria.prepared(sink) == []


@pytest.mark.spark
@pytest.mark.parametrize("log_kind", ["pg", "maria"])
def test_a_lock_held_on_the_log_at_the_decision_rolls_back_every_write(  # type: ignore[no-untyped-def]
    spark, pg, maria, sink, log_kind
):
    """Another session holds the log's sink row past controlLockTimeout when the block ends: the decision
    cannot be made, and every write's branches, on both databases, are rolled back at once (not left holding
    their row locks until someone runs `xasink recover` on each); the user gets an xasink error, not the
    driver's lock timeout.  Fails on main: a raw sqlalchemy OperationalError, four branches left prepared."""
    orders, _, events = three_tables(pg, maria)
    log = pg if log_kind == "pg" else maria
    with ExitStack() as lock:
        with pytest.raises(xasink.BatchAbortedError) as caught:
            with xasink.transaction(sink_id=sink, batch_id=1, journal_url=log.url, controlLockTimeout=1) as tx:
                tx.write(frame(spark, range(10), 2), pg.url, orders)
                tx.write(frame(spark, range(100, 104), 2), maria.url, events)
                lock.enter_context(sink_row_locked(log, sink))
        # the lock is still held: the roll-back did not need it
        assert pg.prepared(sink) == [] and maria.prepared(sink) == []
        assert rows(pg, orders) == [] and rows(maria, events) == []
    message = str(caught.value).lower()
    assert "nothing it wrote is visible and nothing of it is left prepared" in message, message
    assert caught.value.__cause__ is not None  # the lock timeout, as the server said it
    assert log.execute("SELECT count(*) FROM xasink_batches WHERE sink_id = %s", sink) == [(0,)]
    # the lock is gone: the same batch runs again and commits, nothing of the failed attempt counts
    with xasink.transaction(sink_id=sink, batch_id=1, journal_url=log.url, controlLockTimeout=1) as tx:
        tx.write(frame(spark, range(10), 2), pg.url, orders)
        tx.write(frame(spark, range(100, 104), 2), maria.url, events)
    assert rows(pg, orders) == expected(range(10)) and rows(maria, events) == expected(range(100, 104))
    assert pg.prepared(sink) == [] and maria.prepared(sink) == []


@pytest.mark.spark
def test_a_target_database_down_at_the_decision_is_named_and_recovered_once_back(  # type: ignore[no-untyped-def]
    spark, pg, maria, sink
):
    """The MariaDB target is unreachable when the block ends: nothing can be decided, the PostgreSQL part is
    rolled back at once, and the error names the MariaDB database whose branches the abort could not reach,
    with the command that rolls them back.  Once the database is back, that command does.  Fails on main: a
    raw connection error, every branch left prepared on both databases."""
    orders, _, events = three_tables(pg, maria)
    with TcpProxy(*host_port(maria.url)) as proxy:
        maria_via = through(proxy, maria.url)
        with pytest.raises(xasink.BatchAbortedError) as caught:
            with xasink.transaction(sink_id=sink, batch_id=2, journal_url=pg.url) as tx:
                tx.write(frame(spark, range(10), 2), pg.url, orders)
                tx.write(frame(spark, range(100, 104), 2), maria_via, events)
                proxy.set_down(True)
                proxy.drop_all()
        assert pg.prepared(sink) == [] and len(maria.prepared(sink)) == 2
        assert rows(pg, orders) == [] and rows(maria, events) == []
        message = str(caught.value)
        assert "nothing it wrote is visible" in message.lower(), message
        assert f"127.0.0.1:{proxy.port}" in message and "xasink recover" in message and "--journal-url" in message
        assert_no_secret(caught.value)  # the PostgreSQL log's URL is in the command, its password is not
        proxy.set_down(False)
        code, out, err = cli("recover", "--url", maria_via, "--journal-url", pg.url, "--sink-id", sink)
    assert code == 0, out + err
    assert maria.prepared(sink) == [] and rows(maria, events) == []
    with xasink.transaction(sink_id=sink, batch_id=2, journal_url=pg.url) as tx:
        tx.write(frame(spark, range(10), 2), pg.url, orders)
        tx.write(frame(spark, range(100, 104), 2), maria.url, events)
    assert rows(pg, orders) == expected(range(10)) and rows(maria, events) == expected(range(100, 104))


@pytest.mark.parametrize("cut", ["reply-lost", "reply-lost-log-down", "statement-lost"])
def test_a_decision_whose_commit_was_cut_is_settled_by_the_log(pg, maria, sink, cut):  # type: ignore[no-untyped-def]
    """The connection breaks around the decision's COMMIT (the log on PostgreSQL, through a proxy): when the
    server committed it, the transaction is decided and is committed everywhere, never aborted, even when the
    log does not answer for a while after the cut (it is read again until it does; main gave up at once with
    DecisionUnknownError); when the server did not commit it, every part is rolled back and the caller is told
    nothing is visible."""
    orders, _, events = three_tables(pg, maria)
    reply_lost = cut != "statement-lost"
    with TcpProxy(*host_port(pg.url)) as proxy:
        tx = MultiTx(sink, 3, pg, journal_url=through(proxy, pg.url))
        try:
            tx.write(pg, orders, range(10))
            tx.write(maria, events, range(100, 104))
            down_for = 3.0 if cut == "reply-lost-log-down" else 0.0  # cut_on's default: never down
            proxy.cut_on(b"COMMIT", armed_by=DECISION, after_reply=reply_lost, then_down_for=down_for)
            if reply_lost:
                tx.commit()
            else:
                with pytest.raises(xasink.BatchAbortedError, match="(?i)nothing it wrote is visible and nothing of"):
                    tx.commit()
        finally:
            tx.close()
    if reply_lost:
        assert rows(pg, orders) == expected(range(10)) and rows(maria, events) == expected(range(100, 104))
        assert pg.execute("SELECT state FROM xasink_batches WHERE sink_id = %s", sink) == [("committed",)]
    else:
        assert rows(pg, orders) == [] and rows(maria, events) == []
        assert pg.execute("SELECT count(*) FROM xasink_batches WHERE sink_id = %s", sink) == [(0,)]
    assert pg.prepared(sink) == [] and maria.prepared(sink) == []


def test_the_log_unreachable_after_the_decision_commits_every_database_and_says_decided(pg, maria, sink):  # type: ignore[no-untyped-def]
    """The log's database stops answering right after the decision (its first part's mark is cut, then every
    connection refused): every target database is still committed, and the caller is told CommitIncompleteError
    (decided: recovery finishes it), not a connection error that says nothing happened.  Main raised
    ConnectError (a PreflightError: "nothing visible, nothing prepared") with the PostgreSQL rows visible and
    the MariaDB part still prepared.  Recovery of both databases then marks the transaction committed."""
    orders, _, events = three_tables(pg, maria)
    with TcpProxy(*host_port(pg.url)) as proxy:
        via = through(proxy, pg.url)
        tx = MultiTx(sink, 6, pg, journal_url=via, commitTimeout=1)
        try:
            tx.write(pg, orders, range(10))
            tx.write(maria, events, range(100, 104))
            proxy.cut_on(b"UPDATE xasink_parts", after_reply=False, then_down=True)
            with pytest.raises(xasink.CommitIncompleteError, match="is decided"):
                tx.commit()
        finally:
            tx.close()
        assert rows(pg, orders) == expected(range(10)) and rows(maria, events) == expected(range(100, 104))
        assert pg.prepared(sink) == [] and maria.prepared(sink) == []
        proxy.set_down(False)
    assert pg.execute("SELECT state FROM xasink_batches WHERE sink_id = %s", sink) == [("committing",)]
    assert cli("recover", "--url", maria.url, "--journal-url", pg.url, "--sink-id", sink)[0] == 1  # pg's mark
    assert cli("recover", "--url", pg.url, "--sink-id", sink)[0] == 0
    assert pg.execute("SELECT state FROM xasink_batches WHERE sink_id = %s", sink) == [("committed",)]


# --------------------------------------------------------------------------- item 5: replays of a subset


@pytest.mark.spark
def test_a_replay_of_a_subset_of_the_targets_is_skipped_only_once_every_part_is_committed(  # type: ignore[no-untyped-def]
    spark, pg, maria, sink, monkeypatch
):
    """The transaction over a PostgreSQL and a MariaDB table was decided, and its driver died before any
    commit.  A replay writing only the PostgreSQL table commits that part, but the MariaDB part is still
    prepared: it is told ReplayIncompleteError naming the MariaDB database, not "skipped".  A replay writing
    the MariaDB table then finishes it: every part is committed, and that replay is "skipped".  Fails on
    main: the first replay is told skipped while the log says committing and the MariaDB rows are missing."""
    orders, _, events = three_tables(pg, maria)
    decided_not_committed(monkeypatch, sink, 4, pg, [(pg, orders, range(10)), (maria, events, range(100, 104))])
    with pytest.raises(xasink.ReplayIncompleteError) as caught:
        with xasink.transaction(sink_id=sink, batch_id=4, journal_url=pg.url) as tx:
            tx.write(frame(spark, range(10), 2), pg.url, orders)
    message = str(caught.value)
    maria_server = maria.execute("SELECT concat('mysql://', @@hostname, ':', @@port, '/', DATABASE())")[0][0]
    assert maria_server in message and events in message and "--journal-url" in message, message
    assert rows(pg, orders) == expected(range(10))  # what it could finish, it finished
    assert rows(maria, events) == [] and len(maria.prepared(sink)) == 2
    assert pg.execute("SELECT state FROM xasink_batches WHERE sink_id = %s", sink) == [("committing",)]
    with xasink.transaction(sink_id=sink, batch_id=4, journal_url=pg.url) as tx:
        tx.write(frame(spark, range(100, 104), 2), maria.url, events)
    assert tx.result is not None and tx.result.skipped
    assert rows(pg, orders) == expected(range(10)) and rows(maria, events) == expected(range(100, 104))
    assert pg.execute("SELECT state FROM xasink_batches WHERE sink_id = %s", sink) == [("committed",)]
    assert pg.prepared(sink) == [] and maria.prepared(sink) == []


# --------------------------------------------------------------------------- item 6: xasink recover's exit code


@pytest.mark.parametrize("log_kind", ["pg", "maria"])
def test_recover_exits_1_while_a_multi_target_batch_is_unfinished_naming_the_database(  # type: ignore[no-untyped-def]
    pg, maria, sink, monkeypatch, log_kind
):
    """A decided transaction's driver died before any commit.  `xasink recover` of one of its databases
    commits that database's part and exits 1, naming the other database (with --journal-url where the log
    is elsewhere), until that one was recovered too; then both exit 0.  On PostgreSQL as the log, the log's
    database is recovered first; on MariaDB as the log, the other one.  Refutes main's claim of success:
    `xasink recover` of the log's database exited 0 with the other part still prepared."""
    orders, _, events = three_tables(pg, maria)
    log, other = (pg, maria) if log_kind == "pg" else (maria, pg)
    decided_not_committed(monkeypatch, sink, 5, log, [(pg, orders, range(10)), (maria, events, range(100, 104))])
    first, second = (log, other) if log_kind == "pg" else (other, log)

    def recover(db: Target, *extra: str) -> tuple[int, str, str]:
        argv = ["recover", "--url", db.url, "--sink-id", sink, *extra]
        if db is not log:
            argv += ["--journal-url", log.url]
        return cli(*argv)

    code, out, err = recover(first)
    assert code == 1, out + err
    still = second.execute(
        "SELECT concat('mysql://', @@hostname, ':', @@port, '/', DATABASE())"
        if second is maria
        else "SELECT 'postgresql://' || system_identifier || '/' || current_database() FROM pg_control_system()"
    )[0][0]
    assert f"not finished: sink {sink} batch 5" in err and still in err, out + err
    code, out, err = recover(first, "--json")
    doc = json.loads(out)
    assert code == 1 and doc["exit_code"] == 1 and still in doc["unfinished"][sink]["5"], out
    assert len(second.prepared(sink)) == 2 and first.prepared(sink) == []
    code, out, err = recover(second)
    assert code == 0, out + err
    code, out, err = recover(first)
    assert code == 0, out + err
    assert rows(pg, orders) == expected(range(10)) and rows(maria, events) == expected(range(100, 104))
    assert log.execute("SELECT state FROM xasink_batches WHERE sink_id = %s", sink) == [("committed",)]
    assert pg.prepared(sink) == [] and maria.prepared(sink) == []


# ----------------------------------------------------------------- the end of a committed transaction (FOUND.md 8.8)


@pytest.mark.parametrize("log_kind", ["pg", "maria"])
def test_a_guard_session_lost_at_the_end_of_a_committed_transaction_is_not_an_error(  # type: ignore[no-untyped-def]
    pg, maria, sink, log_kind
):
    """The log's database drops the run guard's session (a restart, a killed session) just before a committed
    transaction ends: closing the guard says nothing to the caller, who was told committed, and the rows are
    all there.  Fails on main: MultiCoordinator.close() raised the lost session's raw OperationalError."""
    orders, _, events = three_tables(pg, maria)
    log = pg if log_kind == "pg" else maria
    tx = MultiTx(sink, 1, log)
    try:
        tx.write(pg, orders, range(10))
        tx.write(maria, events, range(100, 104))
        tx.commit()
        kill_session_lock_holder(log, tx.mc.guard.name)
    finally:
        tx.close()
    assert rows(pg, orders) == expected(range(10)) and rows(maria, events) == expected(range(100, 104))
    assert log.execute("SELECT state FROM xasink_batches WHERE sink_id = %s", sink) == [("committed",)]
    assert pg.prepared(sink) == [] and maria.prepared(sink) == []
