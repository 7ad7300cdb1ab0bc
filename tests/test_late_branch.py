"""Late PREPAREs and sibling attempts of one partition (issue 15 items 7 and 8), without Spark.

Tasks are played by ``write_partition`` straight on the database, the driver by the coordinator.  A task
attempt's input is a generator: when the branch pulls its second chunk of rows (its batch claimed, its
branch open, nothing prepared yet) it can run what happens meanwhile elsewhere: a sibling attempt, the driver's
decision, an abort.  Each test runs on PostgreSQL and MariaDB and checks the exact rows, the decision and
that nothing is left prepared.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
import pytest

import xasink.protocol.partition_writer
import xasink.support.faults as faults
from tests.cluster import wait_for
from tests.doc_cases import raises
from tests.harness import TargetSink, expected, held_at, logged, record_batch
from tests.targets import Target
from xasink.errors import LateBranchError
from xasink.protocol.coordinator import Coordinator
from xasink.protocol.xid import Xid
from xasink.results import BranchOutcome

P0 = range(0, 10)  # partition 0
P1 = range(10, 20)  # partition 1


class Sink(TargetSink):
    """One sink of one run: its tasks' attempts and its driver."""

    def __init__(self, db: Target, *, primary_key: bool, **extra: Any) -> None:
        super().__init__(db, primary_key=primary_key, prefix="lb", **extra)

    def attempt(
        self, partition: int, attempt: int, ids: range, tag: str = "n", meanwhile: Callable[[], None] | None = None
    ) -> BranchOutcome:
        """One task attempt; ``meanwhile`` runs once its branch is open and loading (after its first row)."""

        def rows() -> Iterator[pa.RecordBatch]:
            for chunk in (ids[:1], ids[1:]):
                if chunk.start != ids.start and meanwhile is not None:
                    meanwhile()
                yield record_batch(chunk, tag=tag)

        return self.task(1, partition, rows(), attempt=attempt)

    def commit(self, outcomes: list[BranchOutcome | None]) -> Any:
        coordinator = Coordinator(self.options)
        try:
            return coordinator.commit(1, outcomes)
        finally:
            coordinator.close()

    def abort(self) -> None:
        coordinator = Coordinator(self.options)
        try:
            coordinator.abort(1, [], run=self.run)
        finally:
            coordinator.close()

    def decided(self) -> list[str]:
        found = self.db.decision(self.sink_id, 1)
        return sorted(found.xids) if found is not None else []


def gid(outcome: BranchOutcome | None) -> str:
    assert outcome is not None and outcome.gid is not None
    return outcome.gid


# --------------------------------------------------------------------------- item 7: late PREPARE


@pytest.mark.doc_case("error/LateBranchError")
def test_attempt_prepared_after_its_batch_was_decided_rolls_itself_back(db: Target) -> None:
    """A zombie attempt of partition 0 loads while another attempt of it is reported and the batch is decided,
    committed and swept; it prepares after all that: it must roll itself back and fail, not stay prepared."""
    sink = Sink(db, primary_key=False)
    reported: list[BranchOutcome | None] = []

    def driver_decides() -> None:
        reported.extend([sink.attempt(0, 1, P0), sink.attempt(1, 2, P1)])
        sink.commit(reported)

    with raises(LateBranchError, match="decided without it"):
        sink.attempt(0, 9, P0, tag="z", meanwhile=driver_decides)

    assert sink.rows() == expected(range(20))  # the zombie's copy of partition 0 never shows
    assert sink.decided() == sorted(gid(o) for o in reported)
    assert sink.prepared() == []


def test_attempt_prepared_after_its_run_aborted_rolls_itself_back(db: Target) -> None:
    """The driver aborts the batch (and sweeps) while an attempt still loads: it prepares afterwards and
    must roll itself back; the batch stays undecided and invisible."""
    sink = Sink(db, primary_key=False)
    with pytest.raises(LateBranchError, match="can never be decided"):
        sink.attempt(0, 1, P0, meanwhile=sink.abort)
    assert sink.rows() == []
    assert sink.decided() == []
    assert sink.prepared() == []


def test_an_abort_sweeps_an_attempt_that_prepares_while_the_run_ends_and_dies_before_its_check(
    db: Target, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """An attempt has taken its run's prepare lock and read its claim (not ended) when the driver aborts; it
    then prepares and dies before its late check (a worker Spark kills), so it never rolls itself back.  The
    abort waits while the lock is held, and its sweep after that rolls the branch back.  The abort's window is
    60 s here, so a lock not held through the PREPARE would show: the abort would return before it."""
    sink = Sink(db, primary_key=False)
    failure: list[BaseException] = []
    aborted: list[object] = []

    def run_attempt() -> None:
        try:
            sink.attempt(0, 1, P0)
        except BaseException as exc:  # noqa: BLE001 - checked below
            failure.append(exc)

    def abort() -> None:
        coordinator = Coordinator(sink.options)
        try:
            aborted.append(coordinator.abort(1, [None, None], settle_s=60.0, run=sink.run, undecided=True))
        finally:
            coordinator.close()

    caplog.set_level(logging.INFO, logger="xasink.protocol.coordinator")
    with held_at(monkeypatch, "task.prepare_locked") as hold:
        monkeypatch.setenv(faults.ENV, f"{os.environ[faults.ENV]},task.before_settle:raise")
        attempt = threading.Thread(target=run_attempt)
        attempt.start()
        hold.wait()
        with logged("xasink.protocol.coordinator", "still preparing", logging.INFO) as waiting:
            aborting = threading.Thread(target=abort)
            aborting.start()
            assert waiting.wait(60), "the abort did not wait for the attempt holding the prepare lock"
        assert aborting.is_alive() and sink.prepared() == []
        hold.release()
        attempt.join(60)
        aborting.join(60)
    assert not attempt.is_alive() and not aborting.is_alive() and aborted
    assert len(failure) == 1 and isinstance(failure[0], faults.InjectedFault), failure  # prepared, then died
    assert sink.prepared() == []
    assert sink.rows() == []
    assert sink.decided() == []


# --------------------------------------------------------------------------- item 8: sibling attempts


@pytest.mark.parametrize("mode", ["append", "upsert"])
@pytest.mark.parametrize("reported", ["original", "copy"])
def test_later_attempt_adopts_a_prepared_sibling_instead_of_rolling_it_back(
    db: Target, mode: str, reported: str
) -> None:
    """Partition 0's first attempt prepared (a speculative original, or a task that failed past PREPARE);
    a later attempt of the same run must not roll it back: whichever of the two Spark reports commits."""
    extra = {"upsertKeyColumns": "id"} if mode == "upsert" else {}
    sink = Sink(db, primary_key=True, **extra)
    original = sink.attempt(0, 1, P0)
    second = sink.attempt(1, 2, P1)
    copy = sink.attempt(0, 7, P0, tag="c")
    assert gid(copy) == gid(original) and copy.rows == original.rows == len(P0)
    assert sorted(sink.prepared()) == sorted([gid(original), gid(second)])

    result = sink.commit([original if reported == "original" else copy, second])

    assert (result.rows, result.branches) == (20, 2)
    assert sink.rows() == expected(range(20))
    assert sink.decided() == sorted([gid(original), gid(second)])
    assert sink.prepared() == []


@pytest.mark.parametrize("reported", ["original", "copy"])
def test_two_attempts_both_prepared_the_reported_one_commits_and_the_other_is_swept(db: Target, reported: str) -> None:
    """The copy opens its branch before the original prepares, so both prepare: the driver commits the
    attempt in the commit messages and sweeps the other; each row once."""
    sink = Sink(db, primary_key=False)
    holder: list[BranchOutcome] = []
    copy = sink.attempt(0, 7, P0, tag="c", meanwhile=lambda: holder.append(sink.attempt(0, 1, P0)))
    original = holder[0]
    assert gid(copy) != gid(original)
    assert sorted(sink.prepared()) == sorted([gid(copy), gid(original)])
    second = sink.attempt(1, 2, P1)
    winner = original if reported == "original" else copy

    sink.commit([winner, second])

    tag = "n" if winner is original else "c"
    assert sink.rows() == sorted(expected(P0, tag=tag) + expected(P1))
    assert sink.decided() == sorted([gid(winner), gid(second)])
    assert sink.prepared() == []


def test_upsert_copy_blocked_by_the_prepared_original_does_not_deadlock_and_rolls_back(
    db: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Upsert: the copy opened its branch before the original prepared and then waits on the original's row
    locks.  The driver does not wait for it: it commits the original; the copy then gets its locks, prepares
    late, and rolls itself back.  Each row once, with the original's values."""
    sink = Sink(db, primary_key=True, upsertKeyColumns="id", lockTimeout=60)
    opened, original_prepared = threading.Event(), threading.Event()
    failure: list[BaseException] = []
    real_fault = xasink.protocol.partition_writer.fault

    def hold_the_copy(point: str, **where: Any) -> None:
        """The copy's branch is open (batch claimed, nothing loaded): hold it there until the original prepared."""
        if point == "task.before_load" and threading.current_thread().name == "copy":
            opened.set()
            assert original_prepared.wait(60)
        real_fault(point, **where)

    monkeypatch.setattr(xasink.protocol.partition_writer, "fault", hold_the_copy)

    def run_copy() -> None:
        try:
            sink.attempt(0, 7, P0, tag="c")
        except BaseException as exc:  # noqa: BLE001 - checked below
            failure.append(exc)

    copy = threading.Thread(target=run_copy, name="copy")
    copy.start()
    try:
        assert opened.wait(60)
        original = sink.attempt(0, 1, P0)  # the copy is not prepared: the original writes its own branch
        original_prepared.set()
        second = sink.attempt(1, 2, P1)
        wait_for(lambda: sink.db.lock_waiters(f"%{sink.table}%"), 20, "the copy to wait on the original's locks")

        sink.commit([original, second])
    finally:
        original_prepared.set()
        copy.join(90)
    assert not copy.is_alive()
    assert len(failure) == 1 and isinstance(failure[0], LateBranchError), failure
    assert sink.rows() == expected(range(20))
    assert sink.decided() == sorted([gid(original), gid(second)])
    assert sink.prepared() == []


def test_a_branch_the_decision_lists_is_kept_by_its_late_check(db: Target) -> None:
    """The check after PREPARE keeps a branch its batch's decision lists (a sibling reported it)."""
    sink = Sink(db, primary_key=False)
    outcomes: list[BranchOutcome | None] = [sink.attempt(0, 1, P0)]
    sink.commit(outcomes)
    from xasink.dialects import dialect_for
    from xasink.journal.log import Journal
    from xasink.protocol.partition_writer import settle_prepared

    dialect = dialect_for(sink.options.url, sink.options.branch_settings)
    try:
        xid = Xid.parse(gid(outcomes[0]))
        assert xid is not None
        settle_prepared(dialect, Journal(dialect), xid)  # returns: listed
    finally:
        dialect.dispose()
    assert sink.rows() == expected(P0)
    assert sink.prepared() == []
