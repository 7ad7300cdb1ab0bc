"""Adversarial checks of issue 37's decision order (DESIGN invariant 12) against the real servers: each test is a
way found to make an older write-mode batch take effect over a newer one, or to mis-report a decision-order path;
``xfail(strict=True)`` while open."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.cluster import wait_for
from tests.harness import (
    apply_lock_held,
    assert_settled,
    expected,
    fault_reached,
    fill,
    held_at,
    host_port,
    kill_session_lock_holder,
    logged,
    order_lock_of,
    shadow_rows,
    sink_row_locked,
    through,
)
from tests.modes_driver import OPTIONS_ENV, overwrite_direct, split
from tests.procs import state
from tests.targets import POSTGRESQL, Target, case
from tests.tcp_proxy import TcpProxy
from xasink.errors import BatchAbortedError, CommitIncompleteError
from xasink.ops import survey as admin


def sink() -> str:
    return f"adv-{uuid.uuid4().hex[:10]}"


def with_search_path(url: str, *schemas: str) -> str:
    """The URL with libpq's ``options=-csearch_path=...`` (kept by xasink for PostgreSQL)."""
    path = "%2C".join(schemas)
    return f"{url}{'&' if '?' in url else '?'}options=-csearch_path%3D{path}"


@pytest.mark.parametrize("db", [case(POSTGRESQL)], indirect=True)
def test_an_older_overwrite_is_not_applied_over_a_newer_one_written_as_schema_dot_table(db: Target) -> None:
    """Sink A writes ``t`` through a session whose search_path starts with an empty schema (PostgreSQL's
    default ``"$user", public`` when a schema named after the login exists): its identity records that schema,
    while the table lives in ``public``.  A's overwrite is decided, its apply blocked (CommitIncompleteError).
    Sink B then overwrites ``public.t`` of the same log: it must finish A's batch first or be refused
    (BatchBlockedError); instead it does not see A's batch as the same table, decides and is told written,
    and the next ``xasink recover`` applies A's older rows over B's."""
    table = db.new_table()
    db.keyed_table(table)
    first = f"adv_{uuid.uuid4().hex[:8]}"
    db.execute(f"CREATE SCHEMA {first}")
    try:
        fill(db, table, expected(range(10), tag="o"))
        a, b = sink(), sink()
        opts: dict[str, Any] = {"controlLockTimeout": 1, "commitTimeout": 2}
        a_url = with_search_path(db.url, first, "public")
        a_opts = {**opts, "journalSchema": "public"}  # one decision log for both sinks
        with db.connect() as holder, holder.cursor() as cur:
            cur.execute("BEGIN")
            cur.execute(f"INSERT INTO {db.q(table)} (id, name) VALUES (5000, 'other')")
            with pytest.raises(CommitIncompleteError):
                overwrite_direct(a_url, table, a, 5, split(100, 10, 2), **a_opts)
            cur.execute("ROLLBACK")
        result = overwrite_direct(db.url, f"public.{table}", b, 6, split(200, 10, 2), **opts)
        assert result.rows == 10 and not result.skipped
        report = admin.recover(a_url, older_than_s=0, journal_schema="public")  # A's cron
        assert not report.errors, report.errors
        # decision order: A's batch 5, then B's batch 6: the newest decided rows are the table's
        assert db.rows(table) == expected(range(200, 210))
        assert db.prepared(a) == [] and db.prepared(b) == [] and shadow_rows(db) == 0
    finally:
        db.execute(f"DROP SCHEMA {first} CASCADE")


def driver(env: dict[str, str], url: str, table: str, sink_id: str, batch: int, first: int) -> subprocess.Popen[str]:
    """tests/modes_driver.py overwriting ``table`` with 10 rows from ``first`` in 2 branches, in a process."""
    args = [sys.executable, str(Path(__file__).resolve().parent / "modes_driver.py"), "direct", url, table]
    args += [sink_id, str(batch), str(first), "10", "2"]
    return subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@contextmanager
def commits_held(db: Target) -> Iterator[None]:
    """Every COMMIT of the PostgreSQL cluster waits (a synchronous standby that never comes) until the block
    ends: a decision inserted meanwhile stays invisible to others, as on a slow disk or a slow standby."""
    db.execute("ALTER SYSTEM SET synchronous_standby_names = 'adv_nobody'")
    db.execute("SELECT pg_reload_conf()")
    try:
        yield
    finally:
        db.execute("ALTER SYSTEM RESET synchronous_standby_names")
        db.execute("SELECT pg_reload_conf()")


def wait_prepared(db: Target, *sinks: str, timeout_s: float = 90.0) -> None:
    """Until each sink has two branches prepared."""
    deadline = time.monotonic() + timeout_s
    while any(len(db.prepared(s)) < 2 for s in sinks):
        assert time.monotonic() < deadline, "the drivers never prepared their branches"
        time.sleep(0.05)


def decide_in_turn(db: Target, first: subprocess.Popen[str], second: subprocess.Popen[str], hold_s: float) -> None:
    """Two drivers stopped before their decisions (``driver.before_decide:stop``) decide in this order while
    the cluster's COMMITs are held: ``first`` goes on until its decision's COMMIT waits, then ``second`` goes
    on and meets it (the table's apply lock) for ``hold_s`` seconds.  (Sleeps at the fault points set this
    order before: under a loaded CI the second driver prepared seconds earlier and decided first.)"""
    deadline = time.monotonic() + 120
    while any(state(job.pid) != "T" for job in (first, second)):
        assert all(job.poll() is None for job in (first, second)), "a driver ended before its decision"
        assert time.monotonic() < deadline, "the drivers never reached their decisions"
        time.sleep(0.05)
    with commits_held(db):
        first.send_signal(signal.SIGCONT)
        while not db.execute("SELECT 1 FROM pg_stat_activity WHERE wait_event = 'SyncRep'"):
            assert first.poll() is None and time.monotonic() < deadline, "the first decision's COMMIT never waited"
            time.sleep(0.05)
        second.send_signal(signal.SIGCONT)
        time.sleep(hold_s)


@pytest.mark.parametrize("db", [case(POSTGRESQL)], indirect=True)
@pytest.mark.parametrize(
    ("qualified", "lock_wait"), [(False, 30), (True, 30), (False, 2)], ids=["t", "schema.t", "t-lock-wait-2s"]
)
def test_two_sinks_of_one_table_decide_in_turn(db: Target, qualified: bool, lock_wait: int) -> None:
    """Sink A overwrites ``t``, sink B ``t`` or ``<schema>.t`` (the same table) in the same log, both reaching
    their decisions together (here: the cluster's COMMITs held for a few seconds, as by a slow synchronous
    standby).  Their decisions hold one table apply lock, so B's waits for A's and sees A's pending batch: B
    finishes it first, and B's newer rows are the table's.  The lock was named after the spelling (``|t`` and
    ``<schema>|t``): both decided without seeing the other, and A, decided first, applied last (failed on main
    with ``<schema>.t``: A's older rows replaced B's, both told written).  With ``controlLockTimeout=2``
    (adversary3) B's wait for the lock ran out while A's decision, holding it, was not visible yet: B decided
    without the lock, and A's older rows replaced B's; B now asks for the lock again until commitTimeout."""
    table = db.new_table()
    db.keyed_table(table)
    fill(db, table, expected(range(10), tag="o"))
    schema = db.execute("SELECT current_schema()")[0][0]
    a, b = sink(), sink()
    opts: dict[str, Any] = {"controlLockTimeout": lock_wait, "commitTimeout": 30}
    overwrite_direct(db.url, table, a, 0, split(0, 1, 1), **opts)  # the log exists before the drivers start
    env = {k: v for k, v in os.environ.items() if not k.startswith("XASINK_FAULT")}
    env[OPTIONS_ENV] = json.dumps(opts)
    env["XASINK_FAULT"] = "driver.before_decide:stop,driver.after_commits:sleep=3:b=1"
    job_a = driver(env, db.url, table, a, 1, 100)  # each its own process: one run guard per log and process
    job_b = driver(env, db.url, f"{schema}.{table}" if qualified else table, b, 2, 200)
    decide_in_turn(db, job_a, job_b, 6)  # A's decision sent, its COMMIT waiting; B waits for the lock (2 s: runs
    # out, asks again)
    for job in (job_a, job_b):
        out, err = job.communicate(timeout=120)
        assert job.returncode == 0 and json.loads(out.splitlines()[-1])["rows"] == 10, err[-3000:]
    da, dbb = db.decision(a, 1), db.decision(b, 2)
    assert da is not None and dbb is not None
    # A was decided first: B's rows are the table's
    assert db.rows(table) == expected(range(200, 210))
    assert db.prepared(a) == [] and db.prepared(b) == [] and shadow_rows(db) == 0


@pytest.mark.parametrize("db", [case(POSTGRESQL)], indirect=True)
def test_two_sinks_killed_after_their_decisions_leave_the_newer_rows(db: Target) -> None:
    """adversary3: as the lock-wait case above, both drivers killed right after their decisions.  B, whose
    lock wait ran out while A's decision was not visible, decided beside A, and ``xasink recover`` (sink by
    sink, B's id first) applied A's older batch last.  Now B decides after A's decision, finishing A's batch
    first: one batch is pending at a time, and recover leaves B's rows."""
    table = db.new_table()
    db.keyed_table(table)
    fill(db, table, expected(range(10), tag="o"))
    a, b = f"adv-z{uuid.uuid4().hex[:8]}", f"adv-a{uuid.uuid4().hex[:8]}"  # B's id sorts before A's
    opts: dict[str, Any] = {"controlLockTimeout": 2, "commitTimeout": 30}
    overwrite_direct(db.url, table, a, 0, split(0, 1, 1), **opts)
    env = {k: v for k, v in os.environ.items() if not k.startswith("XASINK_FAULT")}
    env[OPTIONS_ENV] = json.dumps(opts)
    env["XASINK_FAULT"] = "driver.before_decide:stop,driver.after_decide:kill"
    job_a = driver(env, db.url, table, a, 1, 100)
    job_b = driver(env, db.url, table, b, 2, 200)
    decide_in_turn(db, job_a, job_b, 6)
    for job in (job_a, job_b):
        job.communicate(timeout=120)
        assert job.returncode == -9
    states = db.execute(
        "SELECT sink_id, state FROM xasink_batches WHERE sink_id IN (%s, %s) AND batch_id > 0 ORDER BY decided_at",
        a,
        b,
    )
    assert [tuple(r) for r in states] == [(a, "committed"), (b, "committing")]  # B finished A's batch first
    report = admin.recover(db.url, older_than_s=0)
    assert not report.errors, report.errors
    assert db.rows(table) == expected(range(200, 210))
    assert db.prepared(a) == [] and db.prepared(b) == [] and shadow_rows(db) == 0


def test_an_overwrite_whose_table_apply_lock_stays_held_is_not_decided(db: Target) -> None:
    """Another session holds the table's apply lock for longer than commitTimeout, with no batch of the table
    pending: the overwrite is never decided without the lock (it was, after controlLockTimeout).  It fails
    before its decision, says so, and leaves the table, the log and the prepared list as they were."""
    table = db.new_table()
    db.keyed_table(table)
    fill(db, table, expected(range(10), tag="o"))
    s = sink()
    with apply_lock_held(db, table), pytest.raises(BatchAbortedError, match="apply lock was not granted") as err:
        overwrite_direct(db.url, table, s, 1, split(100, 10, 2), controlLockTimeout=1, commitTimeout=4)
    assert "nothing of it is visible" in str(err.value) and "rolled back" in str(err.value)
    assert db.rows(table) == expected(range(10), tag="o")
    assert db.decision(s, 1) is None and db.prepared(s) == []


@pytest.mark.parametrize("point", ["driver.after_decide", "driver.after_commits"])
def test_another_sinks_overwrite_finishes_a_killed_drivers_decided_batch_first(db: Target, point: str) -> None:
    """Sink A's driver is killed (SIGKILL) between its decision and its apply; sink B's overwrite of the same
    table then finishes A's batch forward first (its branches committed, applied, marked), then takes effect
    itself: the table holds B's rows, both batches committed, nothing left prepared."""
    table = db.new_table()
    db.keyed_table(table)
    fill(db, table, expected(range(10), tag="o"))
    a, b = sink(), sink()
    env = {k: v for k, v in os.environ.items() if not k.startswith("XASINK_FAULT")}
    env["XASINK_FAULT"] = f"{point}:kill:b=5"
    job = driver(env, db.url, table, a, 5, 100)
    job.communicate(timeout=120)
    assert job.returncode == -9 and db.decision(a, 5) is not None
    assert db.decision(a, 5).state == "committing"  # type: ignore[union-attr]
    result = overwrite_direct(db.url, table, b, 0, split(200, 10, 2))
    assert result.rows == 10 and not result.skipped
    assert db.rows(table) == expected(range(200, 210))
    assert {d.state for d in (db.decision(a, 5), db.decision(b, 0)) if d is not None} == {"committed"}
    assert db.prepared(a) == [] and db.prepared(b) == [] and shadow_rows(db) == 0


def test_a_decision_whose_order_lock_session_is_lost_goes_on_forward(
    db: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The session holding the table's apply lock around an overwrite's decision is killed (as a proxy or a
    DBA would) while the decision waits for the sink's row; the decision then goes through on its own
    connection.  The run must finish its decided batch forward and say so; it raised the lost session's raw
    OperationalError from the lock's release instead, its batch decided, its branches left prepared."""
    table = db.new_table()
    db.keyed_table(table)
    fill(db, table, expected(range(10), tag="o"))
    s = sink()
    opts: dict[str, Any] = {"controlLockTimeout": 20, "commitTimeout": 20}
    overwrite_direct(db.url, table, s, 0, split(0, 2, 1), **opts)  # the sink's row exists
    monkeypatch.setenv("XASINK_FAULT", "driver.before_decide:sleep=5:b=1")
    with fault_reached("driver.before_decide") as stalled, ThreadPoolExecutor(1) as pool:
        job = pool.submit(overwrite_direct, db.url, table, s, 1, split(100, 10, 2), **opts)
        # the tasks settled their branches under the sink row: holding it before then fails a task instead
        assert stalled.wait(90), "the run never reached its decision"
        with sink_row_locked(db, s):
            deadline = time.monotonic() + 30
            while True:  # the decision holds the apply lock and waits for the sink's row
                try:
                    kill_session_lock_holder(db, order_lock_of(db, table))
                    break
                except AssertionError:
                    assert time.monotonic() < deadline and not job.done(), "the decision never took its lock"
                    time.sleep(0.05)
        result = job.result(timeout=60)
    assert result.rows == 10 and not result.skipped
    assert db.rows(table) == expected(range(100, 110))
    assert db.decision(s, 1).state == "committed"  # type: ignore[union-attr]
    assert_settled(db, s)


def test_a_write_mode_decision_that_cannot_reach_the_database_rolls_back(
    db: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The database is unreachable when an overwrite decides (its connections dropped, new ones refused, for a
    few seconds).  Like an append's (failpaths, FOUND.md 8.6), the decision fails before it is sent: the run
    rolls back its branches once it can and raises BatchAbortedError saying nothing is visible.  It raised a
    bare ConnectError from the table's apply lock instead, and left its branches prepared."""
    table = db.new_table()
    db.keyed_table(table)
    fill(db, table, expected(range(10), tag="o"))
    s = sink()
    with (
        TcpProxy(*host_port(db.url)) as proxy,
        held_at(monkeypatch, "driver.before_decide") as hold,
        ThreadPoolExecutor(1) as pool,
    ):
        url = through(proxy, db.url)
        job = pool.submit(overwrite_direct, url, table, s, 1, split(100, 10, 2), controlLockTimeout=2, commitTimeout=3)
        hold.wait(180, what=lambda: job.done() and job.exception())  # the branches settled, the decision next
        proxy.set_down(True)
        proxy.drop_all()
        with logged("xasink", "branches in") as rolling_back:  # "rolling back run R's branches in DB failed"
            hold.release()
            assert rolling_back.wait(180), "the run never tried to roll back its branches"
        proxy.set_down(False)  # the decision failed: the database comes back while the run rolls back
        with pytest.raises(BatchAbortedError, match="nothing of it is visible"):
            job.result(timeout=60)
    assert db.decision(s, 1) is None and db.rows(table) == expected(range(10), tag="o")
    assert_settled(db, s)


def test_a_blocked_batch_whose_abort_meets_a_held_sink_row_is_told_blocked(
    db: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sink A's overwrite is decided, its apply blocked by an open insert (CommitIncompleteError).  Sink B's
    overwrite of the table tries to finish it first (its commitTimeout long), and meanwhile another session
    holds B's row of the log past controlLockTimeout.  B must be told BatchBlockedError (or BatchAbortedError),
    nothing of it visible; its abort, which takes that row, raised the raw LockNotAvailable / lock wait
    timeout instead (scenario seed 174, 'interfere', 1 run in 3)."""
    table = db.new_table()
    db.keyed_table(table)
    fill(db, table, expected(range(10), tag="o"))
    a, b = sink(), sink()
    opts: dict[str, Any] = {"controlLockTimeout": 1, "commitTimeout": 4}
    overwrite_direct(db.url, table, b, 0, split(0, 10, 1), **opts)  # B's row exists
    with db.connect() as holder, holder.cursor() as cur:
        cur.execute("BEGIN")
        cur.execute(f"INSERT INTO {db.q(table)} (id, name) VALUES (5000, 'other')")
        with pytest.raises(CommitIncompleteError):
            overwrite_direct(db.url, table, a, 5, split(100, 10, 2), **opts)
        with ThreadPoolExecutor(1) as pool:
            job = pool.submit(overwrite_direct, db.url, table, b, 1, split(200, 10, 2), **opts)
            wait_prepared(db, b)
            # B tries to finish A's batch (its apply waits for the open insert)
            wait_for(lambda: db.lock_waiters(f"%{table}%"), 120, "B's apply of A's batch to wait for the open insert")
            with sink_row_locked(db, b):
                with pytest.raises(BatchAbortedError):
                    job.result(timeout=60)
        cur.execute("ROLLBACK")
    assert db.decision(b, 1) is None and db.rows(table) == expected(range(0, 10))
    # A's batch is finished, not left decided in the log (a later test's 'xasink recover' met it, table dropped)
    report = admin.recover(db.url, older_than_s=0)
    assert not report.errors, report.errors
    assert db.rows(table) == expected(range(100, 110)) and db.prepared(a) == [] and shadow_rows(db) == 0


def test_a_replay_of_a_committed_batch_is_skipped_while_the_apply_lock_is_held_and_another_batch_pends(
    db: Target,
) -> None:
    """Sink A's overwrite batch 1 is committed; sink B's newer batch of the table is decided, its apply not done
    yet; another session holds the table's apply lock (a long apply, xasink recover).  A's rerun of batch 1 is a
    replay: told skipped, from the log.  It was told BatchBlockedError ("not decided, nothing of it is visible")
    while all of it was: the refused lock's path looked for blockers before this batch's own decision
    (adversary4).  B's batch then takes effect after A's, as decided."""
    table = db.new_table()
    db.keyed_table(table)
    fill(db, table, expected(range(10), tag="o"))
    a, b = sink(), sink()
    opts: dict[str, Any] = {"controlLockTimeout": 1, "commitTimeout": 4}
    assert overwrite_direct(db.url, table, a, 1, split(100, 10, 2), **opts).rows == 10
    with db.connect() as holder, holder.cursor() as cur:  # an open insert keeps B's apply from finishing
        cur.execute("BEGIN")
        cur.execute(f"INSERT INTO {db.q(table)} (id, name) VALUES (5000, 'other')")
        with pytest.raises(CommitIncompleteError):
            overwrite_direct(db.url, table, b, 5, split(200, 10, 2), **opts)
        cur.execute("ROLLBACK")
    assert db.decision(b, 5).state == "committing"  # type: ignore[union-attr]
    with apply_lock_held(db, table):
        replay = overwrite_direct(db.url, table, a, 1, split(100, 10, 2), **opts)
    assert replay.skipped and db.rows(table) == expected(range(100, 110))
    report = admin.recover(db.url, older_than_s=0)
    assert not report.errors, report.errors
    assert db.rows(table) == expected(range(200, 210)) and db.decision(b, 5).state == "committed"  # type: ignore[union-attr]
    assert db.prepared(a) == [] and db.prepared(b) == [] and shadow_rows(db) == 0


def test_an_apply_failing_for_its_rows_while_the_log_row_is_held_is_told_decided(
    db: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An overwrite's apply fails for its rows (a column made required after its decision) while another session
    holds the log's sink row past commitTimeout, so its decision cannot be withdrawn.  The user was told the raw
    lock timeout (scenario seed 5092 of the long run).  Now CommitIncompleteError: decided, the table keeps its
    old rows, and recovery ends it (here it withdraws it: its rows still break the table)."""
    table, s = db.new_table(), sink()
    db.keyed_table(table)
    t, old = db.q(table), expected(range(10), tag="o")
    fill(db, table, old)
    monkeypatch.setenv("XASINK_FAULT", "driver.after_commits:sleep=3")  # time to break the table meanwhile
    opts: dict[str, Any] = {"controlLockTimeout": 1, "commitTimeout": 4}
    with ThreadPoolExecutor(1) as pool:
        job = pool.submit(overwrite_direct, db.url, table, s, 1, split(100, 10, 2), **opts)
        deadline = time.monotonic() + 180  # (a hang, not a timing: a loaded CI is slow)
        while db.decision(s, 1) is None:
            assert time.monotonic() < deadline and not job.done(), "the batch was never decided"
            time.sleep(0.02)
        db.execute(f"ALTER TABLE {t} ADD COLUMN req int NOT NULL DEFAULT 0")
        db.execute(f"ALTER TABLE {t} ALTER COLUMN req DROP DEFAULT")
        with sink_row_locked(db, s), pytest.raises(CommitIncompleteError) as err:
            job.result(timeout=90)
    message = str(err.value)
    assert "withdrawing the decision failed" in message and "still holds its old rows" in message, message
    assert db.execute(f"SELECT id, name FROM {t} ORDER BY id") == old
    assert db.decision(s, 1).state == "committing"  # type: ignore[union-attr]
    admin.recover(db.url, older_than_s=0)
    assert db.decision(s, 1) is None and db.execute(f"SELECT id, name FROM {t} ORDER BY id") == old
    assert_settled(db, s)
