"""The batch writer's driver killed at each step of the commit, then the same write run again.

tests/crash_driver.py runs ``xasink.write`` in its own Spark driver; a fault point in the coordinator
(``XASINK_FAULT=<point>:kill``) SIGKILLs the driver's Python, its JVM and the Python worker running the
commit, like a crashed machine.  The test first checks the kill landed where it was meant to (what is
prepared, decided, visible), then reruns the write with the same (sinkId, batchId) in this process's
Spark session: every id must be there exactly once, nothing of the sink left prepared, and a foreign
prepared transaction untouched throughout.  Each test runs on PostgreSQL and on MariaDB (``db``); a Spark
driver is killed at two points on PostgreSQL, the other kills hit the Spark-free driver (``--direct``).

The branches a killed driver leaves prepared hold their row locks: another writer of the same keys
waits until recovery finishes them (test_branches_of_a_killed_driver_block_a_writer_until_recovery).
"""

from __future__ import annotations

import signal
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

import xasink
from tests.cluster import wait_for
from tests.harness import BATCH, PARTITIONS, N, expected, frame, run_crash_driver
from tests.procs import tail
from tests.targets import MARIADB, Target, is_lock_timeout
from xasink.ops import survey as admin
from xasink.protocol.xid import Xid

pytestmark = pytest.mark.crash

SPARK_KILL_POINTS = ("driver.before_decide", "driver.after_first_commit")  # a Spark driver killed on PostgreSQL
PER = N // PARTITIONS


def journal_state(db: Target, sink: str) -> tuple[str, list[Xid]] | None:
    found = db.decision(sink, BATCH)
    if found is None:
        return None
    return found.state, [x for x in (Xid.parse(g) for g in found.xids) if x is not None]


def prepared_of(db: Target, sink: str) -> list[Xid]:
    return [x for x in (Xid.parse(g) for g in db.prepared(sink)) if x is not None]


@pytest.fixture
def crash_setup(db: Target) -> Iterator[tuple[str, str, str]]:
    """Table name, sink id and a foreign prepared transaction that must outlive the crash and the recovery."""
    table = db.new_table()
    scratch = f"{table}_scratch"
    foreign = db.make_foreign_prepared(f"foreign-etl-{uuid.uuid4().hex[:6]}", scratch)
    sink = f"crash-{uuid.uuid4().hex[:8]}"
    yield table, sink, foreign
    db.clear_foreign(foreign)
    assert db.rows(scratch) == []  # it was never committed either


def check_killed_state(db: Target, table: str, sink: str, point: str) -> None:
    """What a kill at ``point`` leaves: proof it landed where it was meant to."""
    decision = journal_state(db, sink)
    prepared = prepared_of(db, sink)
    visible = db.rows(table)
    if point == "driver.before_decide":
        assert decision is None
        assert sorted(x.partition for x in prepared) == list(range(PARTITIONS))
        assert visible == []
        return
    assert decision is not None, f"{point}: the decision was recorded before the kill"
    state, decided = decision
    assert sorted(x.partition for x in decided) == list(range(PARTITIONS))
    assert set(prepared) <= set(decided)  # nothing else of the sink is prepared
    if point == "driver.after_decide":
        assert state == "committing"
        assert sorted(prepared) == sorted(decided) and visible == []
    elif point == "driver.after_first_commit":
        assert state == "committing"
        committed = set(range(PARTITIONS)) - {x.partition for x in prepared}
        assert committed, "at least one branch was committed"
        # exactly the committed branches' partitions are visible, whole
        assert visible == expected(i for p in committed for i in range(p * PER, (p + 1) * PER))
    else:  # after_commits: committed but not marked; after_mark: marked
        assert state == ("committed" if point == "driver.after_mark" else "committing")
        assert prepared == [] and visible == expected(range(N))


@pytest.mark.core
@pytest.mark.parametrize(
    "point",
    [
        "driver.before_decide",  # all branches prepared, no decision
        "driver.after_decide",  # decision durable, no commit
        "driver.after_first_commit",  # some branches committed
        "driver.after_commits",  # all committed, batch not marked
        "driver.after_mark",  # marked committed, before the sweep and Spark's own end of job
    ],
)
@pytest.mark.usefixtures("driver_cds")  # the Spark drivers share a class-data archive (tests/jvm.py)
def test_driver_killed_then_rerun_writes_each_row_once(
    spark: SparkSession, db: Target, crash_setup: tuple[str, str, str], tmp_path: Path, point: str
) -> None:
    table, sink, foreign = crash_setup
    log = tmp_path / "driver.log"
    # the kill of a Spark driver's process group is covered on PostgreSQL, before the decision and in the
    # middle of the commits (test_stream_crash.py kills a Spark driver at every point); the other points, and
    # every point on MariaDB, are killed in a Spark-free driver that leaves the same state, which saves a JVM
    # start per point
    direct = db.kind == MARIADB or point not in SPARK_KILL_POINTS
    returncode = run_crash_driver(db.url, table, sink, point, log, direct=direct)
    assert returncode == -signal.SIGKILL, f"driver exited {returncode}, not killed at {point}:\n{tail(log)}"
    check_killed_state(db, table, sink, point)
    assert foreign in db.listed()

    result = xasink.write(frame(spark, range(N), PARTITIONS), db.url, table, sink_id=sink, batch_id=BATCH)

    # a decided batch is finished by recovery and not written again; an undecided one is written afresh
    assert result.skipped is (point != "driver.before_decide")
    # the batch's figures: this run's when it wrote it, the killed run's (``earlier``) when it was a replay
    figures = result.earlier if result.skipped else result
    assert figures is not None and (figures.rows, figures.branches) == (N, PARTITIONS)
    assert not result.skipped or (result.rows, result.branches) == (0, 0)  # this run wrote nothing
    assert db.rows(table) == expected(range(N))
    assert prepared_of(db, sink) == []
    decision = journal_state(db, sink)
    assert decision is not None and decision[0] == "committed"
    assert foreign in db.listed()


def insert_waiting(db: Target, table: str, row: tuple[int, str], timeout_s: int, done: threading.Event) -> Any:
    """INSERT row in a transaction of its own, waiting at most timeout_s for row locks; keep it open until done.

    Returns the exception the INSERT raised, or None once it went through (then rolled back, so the table
    is unchanged by it).  Runs in a thread: the test watches it wait.
    """
    with db.connect() as conn, conn.cursor() as cur:
        db.set_lock_timeout(cur, timeout_s)
        cur.execute("BEGIN")
        try:
            cur.execute(f"INSERT INTO {db.q(table)} (id, name) VALUES (%s, %s)", row)
        except Exception as exc:  # noqa: BLE001 - handed to the test
            return exc
        finally:
            done.set()
        cur.execute("ROLLBACK")
    return None


def test_branches_of_a_killed_driver_block_a_writer_until_recovery(db: Target, tmp_path: Path) -> None:
    """Prepared branches outlive their driver with their row locks: a writer of the same keys waits.

    The driver (no Spark: crash_driver.py --direct) is killed before it decides; its branches stay
    prepared.  A writer inserting one of their keys gives up after its lock timeout; another one, still
    waiting, goes through at once when ``xasink recover`` rolls the undecided branches back.
    """
    table, sink = db.new_table(), f"crash-{uuid.uuid4().hex[:8]}"
    db.keyed_table(table)
    log = tmp_path / "driver.log"
    returncode = run_crash_driver(db.url, table, sink, "driver.before_decide", log, direct=True)
    assert returncode == -signal.SIGKILL, f"driver exited {returncode}, not killed before deciding:\n{tail(log)}"
    assert sorted(x.partition for x in prepared_of(db, sink)) == list(range(PARTITIONS))
    assert journal_state(db, sink) is None and db.rows(table) == []

    # blocked: the key is held by a prepared branch, and the lock timeout ends the wait with an error
    done = threading.Event()
    t0 = time.monotonic()
    error = insert_waiting(db, table, (PER + 1, "other"), 1, done)
    assert error is not None and is_lock_timeout(db, error), repr(error)
    assert time.monotonic() - t0 >= 0.9, "the writer did not wait for the lock"
    # a key no branch holds is not blocked
    assert insert_waiting(db, table, (N + 1, "other"), 1, threading.Event()) is None

    # a writer waiting on the same key, released by recovery (not by its timeout)
    done = threading.Event()
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(insert_waiting, db, table, (PER + 1, "other"), 120, done)
        wait_for(lambda: db.lock_waiters(f"%{table}%") or done.is_set(), 60, "the writer to wait on the branch's key")
        assert not done.is_set(), f"the second writer was not blocked: {waiting.result()!r}"
        report = admin.recover(db.url, older_than_s=0)
        assert not report.errors, report.errors
        assert done.wait(30), "the writer still waits after recovery rolled the branches back"
        assert waiting.result() is None
    mine = [e for e in report.entries if e.sink_id == sink]
    assert len(mine) == PARTITIONS and {(e.decision, e.outcome) for e in mine} == {("undecided", "done")}, mine
    assert prepared_of(db, sink) == []
    assert db.rows(table) == []  # the branches were rolled back; the waiting writer rolled its own row back
