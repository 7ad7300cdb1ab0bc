"""The batch writer's driver killed at each step of the commit, then the same write run again.

tests/crash_driver.py runs ``xasink.write`` in its own Spark driver; a fault point in the coordinator
(``XASINK_FAULT=<point>:kill``) SIGKILLs the driver's Python, its JVM and the Python worker running the
commit, like a crashed machine.  The test first checks the kill landed where it was meant to (what is
prepared, decided, visible), then reruns the write with the same (sinkId, batchId) in this process's
Spark session: every id must be there exactly once, nothing of the sink left prepared, and a foreign
prepared transaction untouched throughout.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg2
import psycopg2.errors
import pytest
from pyspark.sql import DataFrame, SparkSession

import xasink
from tests.dbutil import connect, make_foreign_prepared, prepared_gids, rollback_prepared, rows
from xasink.xid import Xid

pytestmark = pytest.mark.crash

ROOT = Path(__file__).resolve().parent.parent
DRIVER = Path(__file__).resolve().parent / "crash_driver.py"
TAG_ENV = "XASINK_CRASH_TEST_TAG"
N, PARTITIONS, BATCH = 40, 4, 5
PER = N // PARTITIONS


def frame(spark: SparkSession) -> DataFrame:
    """The rows crash_driver.py writes: ids 0..N-1 in PARTITIONS contiguous partitions."""
    return spark.range(0, N, 1, PARTITIONS).selectExpr("cast(id as int) as id", "concat('n', id) as name")


def expected(ids: Any) -> list[tuple[int, str]]:
    return [(i, f"n{i}") for i in sorted(ids)]


def _tagged_pids(tag: str) -> list[int]:
    needle = f"{TAG_ENV}={tag}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except OSError:  # gone already, or not readable
            continue
    return found


def _reap(tag: str, grace_s: float = 60.0) -> list[int]:
    """Wait for every process of the killed driver to exit (workers do once the JVM is gone); kill stragglers.

    Returns the stragglers: processes still alive after the grace period.
    """
    deadline = time.monotonic() + grace_s
    while (left := _tagged_pids(tag)) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return left


def run_driver(url: str, table: str, sink: str, point: str, log: Path) -> int:
    """Run crash_driver.py with the fault; return its exit status once it and all its children are gone."""
    tag = uuid.uuid4().hex
    env = {**os.environ, "XASINK_FAULT": f"{point}:kill", TAG_ENV: tag, "PYSPARK_PYTHON": sys.executable}
    env.pop("XASINK_FAULT_PGID", None)
    cmd = [sys.executable, str(DRIVER), url, table, sink, str(BATCH), str(N), str(PARTITIONS)]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            cmd,
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            returncode = proc.wait(timeout=300)
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # whatever is left of its group
            except ProcessLookupError:
                pass
            proc.wait()
            stragglers = _reap(tag)
    assert not stragglers, f"processes of the killed driver outlived it: {stragglers}"
    return returncode


def tail(log: Path, lines: int = 40) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


def journal_state(url: str, sink: str) -> tuple[str, list[Xid]] | None:
    with connect(url) as conn, conn.cursor() as cur:
        cur.execute("SELECT state, xids FROM xasink_batches WHERE sink_id = %s AND batch_id = %s", (sink, BATCH))
        found = cur.fetchone()
    if found is None:
        return None
    return found[0], [x for x in (Xid.parse(g) for g in json.loads(found[1])) if x is not None]


def prepared_of(url: str, sink: str) -> list[Xid]:
    return [x for x in (Xid.parse(g) for g in prepared_gids(url)) if x is not None and x.sink_id == sink]


@pytest.fixture
def crash_setup(pg_url: str, fresh_table_name: str) -> Iterator[tuple[str, str, str]]:
    """Table name, sink id and a foreign prepared transaction that must outlive the crash and the recovery."""
    foreign = f"foreign-etl-{uuid.uuid4().hex[:6]}"
    scratch = f"{fresh_table_name}_scratch"
    make_foreign_prepared(pg_url, foreign, table=scratch)
    sink = f"crash-{uuid.uuid4().hex[:8]}"
    try:
        yield fresh_table_name, sink, foreign
    finally:
        if foreign in prepared_gids(pg_url):
            rollback_prepared(pg_url, foreign)
        assert rows(pg_url, scratch) == []  # it was never committed either
        drop_tables(pg_url, fresh_table_name, scratch)


def drop_tables(url: str, *tables: str) -> None:
    """Drop, unless a branch a failed test left prepared holds a lock (no_prepared_left reports and clears it)."""
    with connect(url) as conn, conn.cursor() as cur:
        cur.execute("SET lock_timeout = '2s'")
        try:
            cur.execute(f"DROP TABLE IF EXISTS {', '.join(tables)}")
        except psycopg2.errors.LockNotAvailable:
            pass


def check_killed_state(url: str, table: str, sink: str, point: str) -> None:
    """What a kill at ``point`` leaves: proof it landed where it was meant to."""
    decision = journal_state(url, sink)
    prepared = prepared_of(url, sink)
    visible = rows(url, table)
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
def test_driver_killed_then_rerun_writes_each_row_once(
    spark: SparkSession, pg_url: str, crash_setup: tuple[str, str, str], tmp_path: Path, point: str
) -> None:
    table, sink, foreign = crash_setup
    log = tmp_path / "driver.log"
    returncode = run_driver(pg_url, table, sink, point, log)
    assert returncode == -signal.SIGKILL, f"driver exited {returncode}, not killed at {point}:\n{tail(log)}"
    check_killed_state(pg_url, table, sink, point)
    assert foreign in prepared_gids(pg_url)

    result = xasink.write(frame(spark), pg_url, table, sink_id=sink, batch_id=BATCH)

    # a decided batch is finished by recovery and not written again; an undecided one is written afresh
    assert result.skipped is (point != "driver.before_decide")
    assert (result.rows, result.branches) == (N, PARTITIONS)
    assert rows(pg_url, table) == expected(range(N))
    assert prepared_of(pg_url, sink) == []
    decision = journal_state(pg_url, sink)
    assert decision is not None and decision[0] == "committed"
    assert foreign in prepared_gids(pg_url)
