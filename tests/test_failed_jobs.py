"""A single-table write whose Spark job or commit step fails, on PostgreSQL and MariaDB: the user is told
what the decision log says, with an xasink error, and nothing of an undecided batch stays prepared.

- A task cannot settle its prepared branch because another session holds the log's sink row past
  ``controlLockTimeout``: the job fails, and the driver's abort (which knows its run never decided) rolls
  the run's branches back without that lock.
- The Python worker running the commit is killed after the first branch's COMMIT: the batch is decided, and
  the write reads the log instead of passing on Spark's "Python worker exited unexpectedly".
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

import xasink
from tests.doc_cases import record_error
from tests.harness import (
    BATCH,
    CRASH_DRIVER,
    PARTITIONS,
    N,
    expected,
    frame,
    run_driver,
    save_by,
    sink_row_locked_once_claimed,
    tasks_fault,
)
from tests.procs import tail
from tests.targets import Target
from xasink.errors import BatchCommittedError

# each case on one database in CI (both with --soak): what these failures test is Spark's side (the job's
# abort, the commit worker's death), the same for both dialects; the database side (the log's sink row held
# past controlLockTimeout, the commits of a decided batch cut short) is the same dialect code that
# tests/test_transaction_failures.py and tests/test_after_decision.py run on both databases
pytestmark = [pytest.mark.spark, pytest.mark.one_database]


@pytest.mark.parametrize("way", ["write", "format"])
def test_a_lock_held_on_the_log_when_the_tasks_settle_rolls_back_the_batch(  # type: ignore[no-untyped-def]
    spark, db, way
):
    """Another session holds the log's sink row from after the driver's claim until after the call returns.
    Every task prepares, then cannot settle its branch (the lock times out), and its retries cannot claim:
    the job fails.  The user gets BatchAbortedError naming the lock timeout, nothing is visible and nothing
    is prepared while the lock is still held; the same batch then commits.  Fails on main: a raw lock
    timeout through format("xasink"), and through both ways the branches stay prepared (Spark's abort waits
    on the same row and fails)."""
    table, sink = db.new_table(), f"fj{uuid.uuid4().hex[:8]}"
    options = {"sinkId": sink, "controlLockTimeout": "1"}
    save_by(way, frame(spark, range(5), 2), db, table, 0, **options)  # the sink's row in the log
    with sink_row_locked_once_claimed(db, sink, 1) as held:
        with tasks_fault(spark, "task.before_prepare:sleep=3:b=1"), pytest.raises(xasink.BatchAbortedError) as caught:
            save_by(way, frame(spark, range(100, 110), 2), db, table, 1, **options)
        assert held.is_set()  # the tasks met the lock; the roll-back did not need it
        assert db.prepared(sink) == []
        assert db.rows(table) == expected(range(5))
    message = str(caught.value)
    assert f"sink {sink} batch 1" in message and "lock" in message.lower(), message  # the cause, as the server said
    assert "nothing of the batch is visible" in message, message
    assert sorted(db.decisions(sink)) == [0]
    result = save_by(way, frame(spark, range(100, 110), 2), db, table, 1, **options)  # the lock is gone
    assert result is None or (result.rows, result.skipped) == (10, False)
    assert db.rows(table) == expected(range(5), range(100, 110))
    assert db.prepared(sink) == []


def told_after_a_commit_worker_died(db: Target, table: str, sink: str, way: str, log: Path) -> dict[str, Any]:
    """tests/crash_driver.py --worker: batch BATCH of ids 0..N-1, the commit's Python worker killed after the
    first branch's COMMIT; what the user was told (the driver's TOLD line)."""
    how = ["--worker", "--format"] if way == "format" else ["--worker"]
    args = [db.url, table, sink, str(BATCH), str(N), str(PARTITIONS), *how]
    assert run_driver(CRASH_DRIVER, args, "driver.after_first_commit:kill", log) == 0, tail(log)
    lines = [line for line in log.read_text().splitlines() if line.startswith("TOLD ")]
    assert lines, tail(log)
    said: dict[str, Any] = json.loads(lines[-1][len("TOLD ") :])
    return said


@pytest.mark.parametrize(
    "way", ["write", pytest.param("format", marks=pytest.mark.doc_case("error/BatchCommittedError"))]
)
def test_a_commit_worker_killed_after_the_first_commit_is_told_what_the_log_says(  # type: ignore[no-untyped-def]
    db, tmp_path, way
):
    """XASINK_FAULT=driver.after_first_commit:kill in a user's script: the Python worker running the data source's
    commit dies after one branch committed; Spark's abort then finishes the decided batch.  xasink.write
    returns the written result (every row once, nothing prepared); format("xasink") under spark_errors()
    raises an xasink error that says the batch is committed.  Fails on main: a raw Py4JJavaError ("Python
    worker exited unexpectedly") both ways."""
    table, sink = db.new_table(), f"fw{uuid.uuid4().hex[:8]}"
    said = told_after_a_commit_worker_died(db, table, sink, way, tmp_path / "driver.log")
    if way == "write":
        assert said == {"result": {"rows": N, "branches": PARTITIONS, "skipped": False}}, said
    else:
        assert (said.get("error"), said.get("xasink")) == ("BatchCommittedError", True), said
        record_error(BatchCommittedError)  # told in the driver's process: witnessed here by its class's name
        assert f"sink {sink} batch {BATCH} is committed: every row of it is visible" in said["message"], said
    assert db.rows(table) == expected(range(N))
    assert db.prepared(sink) == []
    assert db.decision(sink, BATCH).state == "committed"
