"""A live run's branches are never fair game; a dead run's are known dead at once (issue 15, item 6).

A driver holds a run guard (a session lock on the log's database) while its runs live.  Here the driver
is ``tests/crash_driver.py --direct`` (no Spark: the process is the driver and holds its guard itself),
stopped with SIGSTOP after its branches are prepared and before it decides: alive, as a driver whose
other partitions are still loading.  A cron'd ``xasink recover`` and a second writer of the same sink
(a parallel backfill with another batch id, whose commit sweeps older batches) must leave its branches
alone, whatever their age; once the driver is SIGKILLed, recovery rolls them back at once, with no age
threshold to wait out.
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
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.harness import CRASH_DRIVER, PARTITIONS, N, expected, run_crash_driver
from tests.leaks import run_cli
from tests.procs import ROOT, state, tail
from tests.targets import Target
from xasink.protocol.judgement import WAIT
from xasink.protocol.xid import Xid

pytestmark = pytest.mark.crash


def _ours(db: Target, sink: str) -> list[Xid]:
    return [x for x in (Xid.parse(g) for g in db.prepared(sink)) if x is not None]


@contextmanager
def stopped_driver(db: Target, table: str, sink: str, batch: int, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A Spark-free driver stopped (alive) after PREPARE, before its decision; SIGKILLed on the way out."""
    env = {**os.environ, "XASINK_FAULT": "driver.before_decide:stop"}
    cmd = [sys.executable, str(CRASH_DRIVER), db.url, table, sink, str(batch), str(N), str(PARTITIONS), "--direct"]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 180  # (a hang, not a timing: a loaded CI is slow)
        while len([x for x in _ours(db, sink) if x.batch_id == batch]) < PARTITIONS:
            assert proc.poll() is None and time.monotonic() < deadline, tail(log)
            time.sleep(0.1)
        while state(proc.pid) != "T":  # wait for the stop itself
            assert proc.poll() is None, tail(log)
            time.sleep(0.05)
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def _recover_json(db: Target, *args: str) -> dict:
    cli = run_cli("recover", "--url", db.url, "--json", *args)
    return json.loads(cli.stdout)


def test_recover_leaves_a_live_run_alone_and_rolls_a_dead_one_back_at_once(db: Target, tmp_path: Path) -> None:
    table, sink = db.new_table(), f"live-{uuid.uuid4().hex[:6]}"
    with stopped_driver(db, table, sink, 3, tmp_path / "driver.log") as driver:
        branches = _ours(db, sink)
        # the cron job, with no age threshold at all: a live run's branches are not stale, just waiting
        report = _recover_json(db, "--older-than", "0s", "--sink-id", sink)
        entries = [e for e in report["entries"] if e["sink_id"] == sink]
        assert {e["gid"] for e in entries} == {x.gid for x in branches}
        assert all(e["action"] == WAIT and e["outcome"] == "waiting" for e in entries), entries
        assert report["exit_code"] == 0
        assert sorted(_ours(db, sink)) == sorted(branches)

        driver.kill()  # the driver dies: its guard's session ends with it
        driver.wait()
        t0 = time.monotonic()
        report = _recover_json(db, "--older-than", "10m", "--sink-id", sink)
        # known dead at once, whatever the --older-than horizon: no lock, no wait
        assert {e["action"] for e in report["entries"] if e["sink_id"] == sink} == {"rollback"}
        assert time.monotonic() - t0 < 30
    assert _ours(db, sink) == []
    assert db.rows(table) == []


def test_parallel_backfills_of_one_sink_do_not_sweep_each_other(db: Target, tmp_path: Path) -> None:
    table, sink = db.new_table(), f"backfill-{uuid.uuid4().hex[:6]}"
    with stopped_driver(db, table, sink, 7, tmp_path / "seven.log") as seven:
        sevens = _ours(db, sink)
        # batch 8 finishes first; its commit sweeps the sink's undecided branches of older batches
        for _ in range(2):  # the second time a replay: skipped, and it sweeps again
            code = run_crash_driver(db.url, table, sink, "none", tmp_path / "eight.log", direct=True, batch=8)
            assert code == 0, tail(tmp_path / "eight.log")
        assert sorted(_ours(db, sink)) == sorted(sevens), "batch 8's sweep took the live batch 7's branches"
        seven.send_signal(signal.SIGCONT)  # batch 7's driver goes on: decides and commits its own branches
        assert seven.wait(timeout=60) == 0, tail(tmp_path / "seven.log")
    assert _ours(db, sink) == []
    assert db.rows(table) == sorted(expected(range(N)) * 2)
    assert set(db.decisions(sink)) == {7, 8}


def test_a_closed_in_process_guard_is_free_at_once_on_a_pooled_dialect(db: Target) -> None:
    """A run guard held on a pooled control connection (a multi-target transaction's) is released when the
    guard closes.  Before, the connection went back to the pool still holding the lock: the ended run looked
    alive, and the next guard of the same name in the process (a second batch run back to back; a CI run:
    "run guard … is held by another session") was refused whenever the pool handed it another connection."""
    from xasink.database_url import parse_url
    from xasink.dialects import dialect_for
    from xasink.protocol.liveness import InProcessGuard

    dialect = dialect_for(parse_url(db.url), None, 4)
    log_id = uuid.uuid4().hex[:10]
    try:
        for _ in range(6):
            guard = InProcessGuard(dialect, log_id)
            guard.close()
            with dialect.connect(autocommit=True) as conn:
                assert dialect.held_session_locks(conn, [guard.name]) == set(), "the closed guard still held"
    finally:
        dialect.dispose()
