"""The prepare lock (xasink/protocol/prepare_lock.py): an abort's sweep sees every branch of its run, also one
whose PREPARE was still running on the server, without a 4 s window, and never waits on its own run.

First written by the adversary of the claim fence (the first try, which held a share lock on the run's claim row
in the decision log): a PREPARE that outlives its killed client, a task stalled past controlLockTimeout, and a
PREPARE waiting on a sibling partition's prepared branch each left a branch prepared or failed the abort there.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import threading
import uuid
from typing import Any

import psycopg2
import pytest

from tests.cluster import wait_for
from tests.harness import TargetSink, expected, frame, held_at, logged, record_batch, save_by, tasks_fault
from tests.targets import Target, libpq_url
from xasink.errors import LateBranchError
from xasink.protocol.coordinator import ABORT_SETTLE_S, Coordinator
from xasink.protocol.recovery import RecoveryReport

P0 = range(0, 10)
WAITING = "still preparing"  # the abort's log line while a task of its run holds the prepare lock


def child_task(
    options: Any, plan: Any, run: str, ids: list[int], partition: int = 0, fault: str = "", reached: Any = None
) -> None:
    """One task attempt in a process of its own (a Spark Python worker), so the test can SIGKILL it; ``fault``:
    its XASINK_FAULT (a kill there takes only this process); ``reached``: an event set at its first fault point."""
    if reached is not None:

        class Reached(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                reached.set()

        logging.getLogger("xasink.support.faults").addHandler(Reached())
    os.environ.pop("XASINK_FAULT_PGID", None)
    os.environ["XASINK_FAULT"] = fault
    from xasink.protocol.partition_writer import write_partition

    write_partition(
        options, plan, batch_id=1, partition=partition, task_attempt_id=77, run=run, batches=[record_batch(ids)]
    )


def deferred_fk_tables(db: Target) -> tuple[str, str]:
    """A parent (ids 0..99) and a child whose id references it, checked at PREPARE (DEFERRABLE INITIALLY DEFERRED)."""
    parent, child = db.new_table(), db.new_table()
    db.create_table(parent, "id int PRIMARY KEY")
    db.execute(f"INSERT INTO {db.q(parent)} SELECT generate_series(0, 99)")
    db.create_table(
        child,
        f"id int, name text, CONSTRAINT {child}_fk FOREIGN KEY (id) REFERENCES {db.q(parent)} (id) "
        "DEFERRABLE INITIALLY DEFERRED",
    )
    return parent, child


def abort(sink: TargetSink, undecided: bool = True, partitions: int = 1) -> RecoveryReport:
    """The batch writer's abort after a failed job (``undecided``), or a streaming micro-batch's (not)."""
    coordinator = Coordinator(sink.options)
    try:
        return coordinator.abort(1, [None] * partitions, ABORT_SETTLE_S, sink.run, undecided=undecided)
    finally:
        coordinator.close()


def outcome(fn: Any) -> Any:
    try:
        return fn()
    except BaseException as exc:  # noqa: BLE001 - the test checks it
        return exc


def test_a_prepare_that_outlives_its_killed_worker_is_swept_by_the_abort(
    pg: Target, caplog: pytest.LogCaptureFixture
) -> None:
    """A task's PREPARE TRANSACTION waits on the server (a deferred foreign key, its parent row held by another
    session) when its worker is SIGKILLed.  The server goes on with the PREPARE, and the prepare lock stays with
    that session: the abort waits for it, and once the row is free the PREPARE completes and the abort's sweep
    rolls the branch back.  (With the lock on a connection of the task's own, it went with the worker, and the
    abort returned before the PREPARE completed.)"""
    caplog.set_level(logging.INFO, logger="xasink.protocol.coordinator")
    parent, child = deferred_fk_tables(pg)
    sink = TargetSink(pg, table=child, prefix="plk")
    holder = psycopg2.connect(libpq_url(pg.url), password=pg.password)
    holder.cursor().execute(f"SELECT id FROM {pg.q(parent)} WHERE id = 0 FOR UPDATE")
    task = multiprocessing.get_context("spawn").Process(
        target=child_task, args=(sink.options, sink.plan, sink.run, list(P0))
    )
    task.start()
    try:
        wait_for(lambda: pg.lock_waiters("PREPARE TRANSACTION%"), 120, "the task's PREPARE to wait on the parent row")
        task.kill()  # Spark kills the cancelled task's worker (killTimeout)
        task.join(30)
        done: list[Any] = []
        with logged("xasink.protocol.coordinator", WAITING, logging.INFO) as waiting:
            aborting = threading.Thread(target=lambda: done.append(outcome(lambda: abort(sink))))
            aborting.start()
            assert waiting.wait(60), "the abort did not wait for the PREPARE still running"
        holder.rollback()  # the parent row is free: the PREPARE completes
        aborting.join(120)
        assert not aborting.is_alive() and isinstance(done[0], RecoveryReport), done
        assert sink.prepared() == []
        assert sink.rows() == []
    finally:
        holder.close()
        if task.is_alive():
            task.kill()


def test_a_task_held_before_prepare_past_the_window_rolls_itself_back(
    db: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A task stands between its claim check and PREPARE past the abort's window (and past controlLockTimeout):
    the abort waits out its window, sweeps and returns (it never waits on a lock the task holds in the log).
    The task then prepares, reads its run ended in its late check and rolls its branch back."""
    sink = TargetSink(db, prefix="plk", primary_key=False, controlLockTimeout=2)
    with held_at(monkeypatch, "task.prepare_locked") as hold:
        done: list[Any] = []
        task = threading.Thread(target=lambda: done.append(outcome(lambda: sink.write(1, 0, P0))))
        task.start()
        hold.wait()
        report = abort(sink)  # the task still holds the prepare lock: the window runs out
        assert isinstance(report, RecoveryReport)
        hold.release()
        task.join(120)
    assert not task.is_alive()
    assert isinstance(done[0], LateBranchError), done
    assert sink.prepared() == []
    assert sink.rows() == []


@pytest.mark.parametrize("undecided", [False, True], ids=["stream-or-commit-abort", "failed-job-abort"])
def test_an_abort_whose_wait_runs_out_still_sweeps_each_second(
    db: Target, monkeypatch: pytest.MonkeyPatch, undecided: bool
) -> None:
    """Task A holds the run's prepare lock past the abort's window (a PREPARE waiting on a row, a frozen
    executor).  Task B, in a process of its own, holds it too, PREPAREs 1 s into the abort's wait and is killed
    before its late check.  The abort must sweep while it waits, as the fixed window did: B's branch is rolled
    back by the time the abort returns.  (The first prepare lock's abort swept only before its wait.)"""
    sink = TargetSink(db, prefix="plk", primary_key=False, lockTimeout=20)
    sink.write(1, 9, range(900, 905))  # the run's claim, and a branch of it
    with held_at(monkeypatch, "task.prepare_locked:p=0") as hold:
        done: list[Any] = []
        task_a = threading.Thread(target=lambda: done.append(outcome(lambda: sink.write(1, 0, P0, claimed=True))))
        task_a.start()
        hold.wait()
        spawn = multiprocessing.get_context("spawn")
        reached = spawn.Event()
        fault = "task.prepare_locked:sleep=1.0:p=1,task.before_settle:kill:p=1"
        task_b = spawn.Process(
            target=child_task, args=(sink.options, sink.plan, sink.run, list(range(100, 105)), 1, fault, reached)
        )
        task_b.start()
        try:
            assert reached.wait(120), "task B did not take the lock"
            report = abort(sink, undecided=undecided, partitions=2)
            task_b.join(30)
            left = sink.prepared()
        finally:
            if task_b.is_alive():
                task_b.kill()
            hold.release()
            task_a.join(60)
    assert isinstance(report, RecoveryReport)
    assert task_b.exitcode == -9  # killed right after its PREPARE
    assert left == [], "a branch prepared during the abort's wait is left prepared"
    assert isinstance(done[0], LateBranchError), done  # task A prepared after the abort: it rolls itself back
    assert sink.prepared() == []
    assert sink.rows() == []


@pytest.mark.parametrize("other", ["partition-64", "retry"])
def test_a_task_stuck_before_prepare_does_not_hold_up_other_tasks_of_its_run(
    db: Target, monkeypatch: pytest.MonkeyPatch, other: str
) -> None:
    """On MariaDB the prepare lock is 64 exclusive user locks: a task stuck between taking one and its PREPARE
    must not make partition 64 (the same slot) or a retry of its own partition wait out lockTimeout and fail."""
    sink = TargetSink(db, prefix="plk", primary_key=False, lockTimeout=3)
    sink.write(1, 99, range(9900, 9905))  # the run's claim
    with held_at(monkeypatch, "task.prepare_locked:p=0:a=0") as hold:
        done: list[Any] = []
        task = threading.Thread(target=lambda: done.append(outcome(lambda: sink.write(1, 0, P0))))
        task.start()
        hold.wait()
        if other == "partition-64":
            got = outcome(lambda: sink.write(1, 64, range(640, 650), claimed=True))
        else:
            got = outcome(lambda: sink.write(1, 0, P0, attempt_number=1))
        hold.release()
        task.join(60)
    assert not isinstance(got, BaseException), got
    assert sink.prepared(), "the other task's branch is prepared"
    abort(sink)
    assert sink.prepared() == []


@pytest.mark.parametrize("undecided", [False, True], ids=["stream-or-commit-abort", "failed-job-abort"])
def test_an_abort_is_not_held_by_a_prepare_waiting_on_its_own_runs_branch(pg: Target, undecided: bool) -> None:
    """A deferrable unique key: partition 1 prepared key 5; partition 0 also loaded key 5, and its PREPARE's
    deferred check waits on partition 1's prepared branch.  The abort sweeps partition 1 before it waits, so
    partition 0's PREPARE completes and the abort's next sweep rolls it back: the abort succeeds and nothing
    stays prepared.  ``undecided=False`` is a streaming micro-batch's abort (no roll-back before the sink lock)."""
    table = pg.new_table()
    pg.create_table(table, f"id int, name text, CONSTRAINT {table}_u UNIQUE (id) DEFERRABLE INITIALLY DEFERRED")
    sink = TargetSink(pg, table=table, prefix="plk", controlLockTimeout=5, lockTimeout=20)
    sink.write(1, 1, [5])  # partition 1: prepared, holding key 5
    done: list[Any] = []
    task = threading.Thread(target=lambda: done.append(outcome(lambda: sink.write(1, 0, [5, 6]))))
    task.start()
    wait_for(lambda: pg.lock_waiters("PREPARE TRANSACTION%"), 60, "partition 0's PREPARE to wait on partition 1")
    report = outcome(lambda: abort(sink, undecided=undecided, partitions=2))
    task.join(60)
    assert isinstance(report, RecoveryReport), report
    assert not task.is_alive()
    assert sink.prepared() == []
    assert sink.rows() == []


@pytest.mark.spark
def test_a_failed_job_whose_worker_dies_right_after_prepare_leaves_nothing_prepared(  # type: ignore[no-untyped-def]
    spark, db
):
    """Spark: partition 1 fails; partition 0's first attempt pauses between its claim check and PREPARE, then
    its worker is SIGKILLed right after PREPARE (before its late check).  The save fails with nothing visible
    and nothing prepared."""
    table, sink = db.new_table(), f"plk{uuid.uuid4().hex[:8]}"
    save_by("format", frame(spark, range(5), 1), db, table, 0, sinkId=sink)
    spec = ",".join(
        [
            "task.prepare_locked:sleep=1:p=0:a=0:b=1",
            "task.before_settle:kill:p=0:a=0:b=1",
            "task.before_load:sleep=1:p=1:b=1",
            "task.before_load:raise:p=1:b=1",
        ]
    )
    with tasks_fault(spark, spec), pytest.raises(Exception, match="injected fault at task.before_load"):
        save_by("format", frame(spark, range(100, 120), 2), db, table, 1, sinkId=sink)
    assert db.prepared(sink) == []
    assert db.rows(table) == expected(range(5))
