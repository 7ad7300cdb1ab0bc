"""After the decision, only forward: outages, cut connections and lost replies once a batch is decided.

Without Spark: branches are prepared by ``write_partition`` straight on the database (as tasks do); the
coordinator talks through ``tests/tcp_proxy.py``, which cuts or refuses its connections at the exact
moment a test names (the decision's ``COMMIT``, the mark's ``COMMIT``).  Each test runs on PostgreSQL and
on MariaDB and checks the exact rows (each once), the decision log, and that nothing is left prepared.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator, Sequence
from typing import Any, cast

import pytest
import sqlalchemy as sa

import xasink.protocol.apply_step
import xasink.protocol.recovery
import xasink.protocol.renamed_overwrite
from tests.doc_cases import raises
from tests.harness import (
    TargetSink,
    assert_settled,
    expected,
    fill,
    host_port,
    shadow_tables,
    through,
)
from tests.modes_driver import overwrite_direct, split
from tests.targets import MARIADB, POSTGRESQL, Target, case
from tests.tcp_proxy import TcpProxy
from xasink.dialects import dialect_for
from xasink.dialects.base import Dialect
from xasink.errors import BatchAbortedError, CommitIncompleteError, DecisionUnknownError, JournalError
from xasink.ops import survey as admin
from xasink.options import WriteOptions
from xasink.protocol.apply_step import ApplyStep
from xasink.protocol.coordinator import Coordinator
from xasink.protocol.xid import Xid
from xasink.results import BranchOutcome

OUTAGE_S = 15.0  # three times the whole retry budget of the old commit (commitRetries=5: under 5 s)
DECISION = b"INSERT INTO xasink_batches"  # arms a cut of the COMMIT that follows on the same connection
# the mark itself: a bare b"UPDATE xasink_batches" also matched the privilege probe (SET sink_id=NULL WHERE false)
# or a trim's compaction, and a COMMIT on that connection was cut before the mark (a CI failure under load)
MARK = b"UPDATE xasink_batches SET state='committed'"
BRANCH_COMMIT = {POSTGRESQL: b"COMMIT PREPARED", MARIADB: b"XA COMMIT"}  # a prepared branch's commit, by kind


# --------------------------------------------------------------------------- helpers


@pytest.fixture
def proxy(db: Target) -> Iterator[TcpProxy]:
    with TcpProxy(*host_port(db.url)) as p:
        yield p


class Sink(TargetSink):
    """One sink: branches written directly, coordinators talking through the proxy."""

    def __init__(self, db: Target, proxy: TcpProxy, parts: int = 3) -> None:
        super().__init__(db, prefix="ad", parts=parts)
        self.proxy = proxy

    def coordinator(self, dialect: Dialect | None = None, **extra: Any) -> Coordinator:
        return Coordinator(self.options_for(through(self.proxy, self.db.url), **extra), dialect)

    def commit(self, batch_id: int, outcomes: Sequence[BranchOutcome | None], **extra: Any) -> Any:
        coordinator = self.coordinator(**extra)
        try:
            return coordinator.commit(batch_id, outcomes)
        finally:
            coordinator.close()

    def recover(self) -> None:
        coordinator = self.coordinator()
        try:
            coordinator.recover()
        finally:
            coordinator.close()

    def state(self, batch_id: int) -> str | None:
        found = self.db.decision(self.sink_id, batch_id)
        return found.state if found is not None else None


@pytest.fixture
def sink(db: Target, proxy: TcpProxy) -> Sink:
    return Sink(db, proxy)


def overwritten_once(db: Target, proxy: TcpProxy, prefix: str) -> tuple[str, str, str, str]:
    """A keyed table of ten old rows, overwritten once through ``proxy`` by a new sink, so its log row and shadow
    exist: the table, the sink, the proxied URL and the shadow's name."""
    table = db.new_table()
    db.keyed_table(table)
    fill(db, table, expected(range(10), tag="o"))
    s = f"{prefix}-{uuid.uuid4().hex[:10]}"
    url = through(proxy, db.url)
    before = shadow_tables(db)
    overwrite_direct(url, table, s, 0, split(0, 2, 1), commitTimeout=60)
    (shadow,) = shadow_tables(db) - before
    return table, s, url, shadow


def clearing(db: Target, shadow: str) -> bytes:
    """How the apply's statement that clears ``shadow`` starts, in its transaction: a proxy's pattern."""
    if db.kind == POSTGRESQL:
        return f"LOCK TABLE {db.execute('SELECT current_schema()')[0][0]}.{shadow}".encode()
    return b"FORCE INDEX"  # MariaDB: DELETE ... FORCE INDEX (...)


def no_secret(db: Target, *texts: str) -> None:
    if db.password:
        for text in texts:
            assert db.password not in text


# --------------------------------------------------------------------------- outages after the decision


def test_database_unreachable_right_after_the_decision_commit_waits_then_succeeds(
    sink: Sink, caplog: pytest.LogCaptureFixture
) -> None:
    """The decision is confirmed, then the database is unreachable for OUTAGE_S: the coordinator keeps
    committing (default commitTimeout: minutes) and finishes once it is back; every row once."""
    caplog.set_level(logging.INFO, logger="xasink")
    outcomes = sink.prepare(1, range(30))
    sink.proxy.cut_on(b"COMMIT", armed_by=DECISION, relay_reply=True, then_down_for=OUTAGE_S)
    coordinator = sink.coordinator()  # default commitTimeout
    t0 = time.monotonic()
    try:
        result = coordinator.commit(1, outcomes)
    finally:
        coordinator.close()
    waited = time.monotonic() - t0
    assert sink.proxy.cut == 1 and sink.proxy.refused > 0
    assert waited >= OUTAGE_S - 1, f"committed after {waited:.1f} s: the outage did not hold the commit"
    assert (result.rows, result.branches, result.skipped) == (30, 3, False)
    assert sink.rows() == expected(range(30))
    assert sink.state(1) == "committed" and sink.prepared() == []
    assert "retry" in caplog.text
    no_secret(sink.db, caplog.text)
    assert coordinator.options.commit_timeout >= 120  # the default is minutes, not seconds


def test_commit_timeout_exceeded_raises_commit_incomplete_then_recovery_finishes(sink: Sink) -> None:
    """The outage outlasts commitTimeout: CommitIncompleteError says the batch is decided, who finishes it
    and not to rerun it under another sink id; recovery then commits it, every row once."""
    outcomes = sink.prepare(2, range(100, 130))
    # the decision commits untouched; the first branch's commit never reaches the server, and the server is
    # away from then on (a cut relayed after the decision's reply raced the reply under load: its loss made
    # the batch's decision unknown instead).  One commit lane: with several, another lane's COMMIT could pass
    # the proxy before the cut (a CI rehearsal under load found 2 branches prepared, not 3)
    sink.proxy.cut_on(BRANCH_COMMIT[sink.db.kind], after_reply=False, then_down_for=600)
    t0 = time.monotonic()
    with pytest.raises(CommitIncompleteError) as info:
        sink.commit(2, outcomes, commitTimeout=2, commitParallelism=1)
    waited = time.monotonic() - t0
    message = str(info.value)
    assert 2 <= waited < 15, f"gave up after {waited:.1f} s with commitTimeout=2"
    for phrase in (
        f"sink {sink.sink_id} batch 2 is decided",
        "3 of 3 decided branches could not be committed",
        f"next run of this sink (sinkId '{sink.sink_id}')",
        "'xasink recover'",
        "no row is lost or doubled",
        "Do not rerun it under another sink id",
    ):
        assert phrase in message, message
    no_secret(sink.db, message)
    assert sink.state(2) == "committing" and len(sink.prepared()) == 3 and sink.rows() == []

    sink.proxy.reset()  # the database is back: recovery finishes the decided batch
    sink.recover()
    assert sink.rows() == expected(range(100, 130))
    assert sink.state(2) == "committed" and sink.prepared() == []


def test_a_connection_lost_after_the_last_branch_commit_answered_is_no_error(db: Target, proxy: TcpProxy) -> None:
    """The server goes away right after the commit round's last COMMIT answered (a restart), before the round
    closes that connection, whose close rolls back its transaction: every branch is committed, and the run
    must say so.  It was told the raw lost connection of that close (long-run seed 8040, MariaDB: a server
    restart at driver.after_decide; 'Lost connection to MySQL server during query')."""
    sink = Sink(db, proxy, parts=1)  # one branch: its commit is the round connection's last statement
    outcomes = sink.prepare(1, range(10))
    proxy.cut_on(BRANCH_COMMIT[db.kind], relay_reply=True)
    result = sink.commit(1, outcomes)
    assert proxy.cut == 1
    assert (result.rows, result.branches, result.skipped) == (10, 1, False)
    assert sink.rows() == expected(range(10))
    assert sink.state(1) == "committed" and sink.prepared() == []


# --------------------------------------------------------------------------- the decision's own COMMIT


@pytest.mark.parametrize("executed", [True, False], ids=["commit-executed-reply-lost", "commit-never-arrived"])
def test_connection_cut_during_the_decisions_commit_is_settled_by_reading_the_log(
    sink: Sink, executed: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """The link breaks on the decision's COMMIT (after the server ran it, or before it got it), and the next
    two connections are refused: the coordinator reconnects, reads the log again under the sink lock, and
    follows it: committed in full, or rolled back cleanly and reported as not decided."""
    caplog.set_level(logging.INFO, logger="xasink")
    outcomes = sink.prepare(3, range(200, 230))
    sink.proxy.cut_on(b"COMMIT", armed_by=DECISION, after_reply=executed, then_refuse=2)
    if executed:
        result = sink.commit(3, outcomes)
        assert result.rows == 30 and not result.skipped
        assert "the decision log holds the decision" in caplog.text
        assert sink.rows() == expected(range(200, 230)) and sink.state(3) == "committed"
    else:
        with pytest.raises(BatchAbortedError) as info:
            sink.commit(3, outcomes)
        assert "was not recorded" in str(info.value) and "nothing of it is visible" in str(info.value)
        assert sink.rows() == [] and sink.state(3) is None
    assert sink.proxy.cut == 1 and sink.proxy.refused == 2
    assert "reading the decision log again" in caplog.text
    assert sink.prepared() == []
    if not executed:  # not decided means free to run again: the rerun writes it once
        assert sink.commit(3, sink.prepare(3, range(200, 230))).rows == 30
        assert sink.rows() == expected(range(200, 230)) and sink.prepared() == []


@pytest.mark.doc_case("error/DecisionUnknownError")
def test_decision_that_cannot_be_read_again_in_time_is_left_to_recovery(sink: Sink) -> None:
    """The decision's COMMIT ran but its reply was lost, and the database stays away past commitTimeout:
    DecisionUnknownError (a CommitIncompleteError) says it is not known and what settles it; recovery does."""
    outcomes = sink.prepare(8, range(600, 630))
    sink.proxy.cut_on(b"COMMIT", armed_by=DECISION, after_reply=True, then_down_for=600)
    with raises(DecisionUnknownError) as info:
        sink.commit(8, outcomes, commitTimeout=1)
    message = str(info.value)
    assert isinstance(info.value, CommitIncompleteError)
    same = f"same sinkId ('{sink.sink_id}') and batchId"
    for phrase in ("is not known", same, "'xasink recover'", "another sink id"):
        assert phrase in message, message
    no_secret(sink.db, message)
    assert sink.state(8) == "committing" and sink.rows() == []

    sink.proxy.reset()
    sink.recover()
    assert sink.rows() == expected(range(600, 630)) and sink.state(8) == "committed" and sink.prepared() == []


# --------------------------------------------------------------------------- after the commit


def test_sweep_and_trim_failing_after_the_commit_are_warnings(
    sink: Sink, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The database goes away right after the batch is marked committed: the sweep and the trim fail, the
    write still succeeds (warnings only), and what the sweep left is finished by the next recovery."""
    monkeypatch.setattr(xasink.protocol.recovery, "TRIM_EVERY", 1)  # this batch's turn to trim
    stale = sink.prepare(4, range(900, 906), parts=1)  # an undecided batch the sweep of batch 5 rolls back
    outcomes = sink.prepare(5, range(300, 330))
    sink.proxy.cut_on(b"COMMIT", armed_by=MARK, relay_reply=True, then_down_for=600)
    result = sink.commit(5, outcomes)
    assert result.rows == 30 and sink.proxy.cut == 1
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("the sweep after it failed" in w for w in warnings), warnings
    assert any("trimming the decision log failed" in w for w in warnings), warnings
    no_secret(sink.db, caplog.text)
    assert sink.rows() == expected(range(300, 330)) and sink.state(5) == "committed"
    assert sink.prepared() == [stale[0].gid]  # the sweep really did not run

    sink.proxy.reset()
    sink.recover()
    assert sink.prepared() == [] and sink.rows() == expected(range(300, 330))


# --------------------------------------------------------------------------- marking the batch committed


def test_mark_whose_reply_is_lost_is_retried_and_found_done(sink: Sink, caplog: pytest.LogCaptureFixture) -> None:
    """The mark's COMMIT runs but its reply is lost: the retry changes no row, reads it back as committed."""
    caplog.set_level(logging.INFO, logger="xasink")
    outcomes = sink.prepare(6, range(400, 430))
    sink.proxy.cut_on(b"COMMIT", armed_by=MARK, after_reply=True)
    assert sink.commit(6, outcomes).rows == 30
    assert sink.proxy.cut == 1 and "already marked committed" in caplog.text
    assert sink.rows() == expected(range(400, 430)) and sink.state(6) == "committed" and sink.prepared() == []


class AfterCommits:
    """The real dialect; after the last branch's COMMIT, runs ``then`` (what a concurrent actor does then)."""

    def __init__(self, options: WriteOptions, branches: int, then: Any) -> None:
        self.inner: Dialect = dialect_for(options.url, options.branch_settings, 4)
        self.left, self.then = branches, then

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def commit_prepared(self, conn: Any, xid: Xid) -> None:
        self.inner.commit_prepared(conn, xid)
        self.left -= 1
        if self.left == 0:
            self.then()


@pytest.mark.parametrize("actor", ["recovery", pytest.param("hand", marks=pytest.mark.doc_case("error/JournalError"))])
def test_mark_that_changes_no_row_is_detected(sink: Sink, actor: str, caplog: pytest.LogCaptureFixture) -> None:
    """Between the last COMMIT and the mark, a concurrent recovery finishes the batch (fine: it was marked),
    or someone deletes its decision row (an error that says so: a rerun would write it again)."""
    caplog.set_level(logging.INFO, logger="xasink")
    outcomes = sink.prepare(7, range(500, 530))
    if actor == "recovery":
        then = sink.recover
    else:

        def then() -> None:
            sink.db.execute(
                f"DELETE FROM {sink.db.q('xasink_batches')} WHERE sink_id = %s AND batch_id = 7", sink.sink_id
            )

    dialect = cast(Dialect, AfterCommits(sink.options, 3, then))  # a Dialect by delegation
    coordinator = sink.coordinator(dialect, commitParallelism=1)
    try:
        if actor == "recovery":
            assert coordinator.commit(7, outcomes).rows == 30
            assert "already marked committed (by a recovery run" in caplog.text
            assert sink.state(7) == "committed"
        else:
            with raises(JournalError) as info:
                coordinator.commit(7, outcomes)
            message = str(info.value)
            assert f"sink {sink.sink_id} batch 7" in message and "changed 0 rows" in message, message
            assert "no row for it" in message and "would write its rows again" in message, message
            assert sink.state(7) is None
    finally:
        coordinator.close()
    assert sink.rows() == expected(range(500, 530)) and sink.prepared() == []


@pytest.mark.parametrize("db", [case(POSTGRESQL)], indirect=True)  # (MariaDB clears by a plain DELETE)
def test_an_apply_whose_connection_is_lost_as_it_clears_the_shadow_goes_on_forward(db: Target, proxy: TcpProxy) -> None:
    """A decided overwrite's apply loses its connection (a restart) at the statement that clears the shadow.
    PostgreSQL's clear took the lost connection for a busy shadow, fell back to a DELETE on it and raised
    SQLAlchemy's raw PendingRollbackError with the batch decided (long-run interference seed 20024: a restart
    there).  The apply is retried on a new connection instead: the new rows, every one once."""
    table, s, url, shadow = overwritten_once(db, proxy, "lost")
    proxy.cut_on(clearing(db, shadow) + b" IN ACCESS EXCLUSIVE MODE NOWAIT", after_reply=False)
    result = overwrite_direct(url, table, s, 1, split(100, 10, 2), commitTimeout=60)
    assert proxy.cut == 1
    assert (result.rows, result.skipped) == (10, False)
    assert db.rows(table) == expected(range(100, 110))
    assert db.decision(s, 1).state == "committed"  # type: ignore[union-attr]
    assert_settled(db, s)


def test_an_apply_failing_by_an_error_of_the_driver_is_told_decided(
    db: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An error that is neither the server's answer nor xasink's (SQLAlchemy's PendingRollbackError, as a lost
    connection left it in seed 20024) after the decision: the batch is decided, so the writer is told
    CommitIncompleteError with the cause, never the raw error; the table keeps its rows until recovery applies
    the batch."""
    table = db.new_table()
    db.keyed_table(table)
    s = f"raw-{uuid.uuid4().hex[:10]}"
    overwrite_direct(db.url, table, s, 0, split(0, 2, 1))
    old = db.rows(table)

    def lost(*args: Any, **kwargs: Any) -> int:
        raise sa.exc.PendingRollbackError("Can't reconnect until invalid transaction is rolled back")

    monkeypatch.setattr(xasink.protocol.apply_step, "apply_statements", lost)
    monkeypatch.setattr(xasink.protocol.renamed_overwrite.RenamedOverwrite, "apply", lost)  # (MariaDB's rename)
    with raises(CommitIncompleteError) as info:
        overwrite_direct(db.url, table, s, 1, split(100, 10, 2), commitTimeout=5)
    message = str(info.value)
    assert f"sink {s} batch 1 is decided" in message and "PendingRollbackError" in message, message
    assert db.decision(s, 1).state == "committing"  # type: ignore[union-attr]
    assert db.rows(table) == old and db.prepared(s) == []
    monkeypatch.undo()
    admin.recover(db.url, older_than_s=0)
    assert db.rows(table) == expected(range(100, 110))
    assert db.decision(s, 1).state == "committed"  # type: ignore[union-attr]
    assert_settled(db, s)


def test_an_apply_whose_commit_answer_is_lost_says_the_rows_may_be_visible(db: Target, proxy: TcpProxy) -> None:
    """The apply's COMMIT takes effect, its answer is lost and the database stays away past commitTimeout.  The
    writer was told CommitIncompleteError saying "the table still holds its old rows" while it showed the new
    ones (stop-47 adversary review).  It is told they may be visible; recovery finds them applied, once."""
    table, s, url, shadow = overwritten_once(db, proxy, "ans")
    proxy.cut_on(b"COMMIT", armed_by=clearing(db, shadow), after_reply=True, then_down_for=600)
    with pytest.raises(CommitIncompleteError) as info:
        overwrite_direct(url, table, s, 1, split(100, 10, 2), commitTimeout=2)
    message = str(info.value)
    assert proxy.cut == 1
    assert "may already show its new rows" in message and "still holds its old rows" not in message, message
    assert db.rows(table) == expected(range(100, 110))  # it did take effect
    proxy.reset()
    admin.recover(db.url, older_than_s=0)
    assert db.rows(table) == expected(range(100, 110))
    assert db.decision(s, 1).state == "committed"  # type: ignore[union-attr]
    assert_settled(db, s)


def test_an_apply_found_done_whose_log_cannot_be_read_again_never_says_old_rows(
    db: Target, proxy: TcpProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The apply's COMMIT takes effect and its answer is lost; the retry finds the batch applied; then the
    database goes away before the log is read again to tell applied from withdrawn.  That read was made once,
    outside the retries, and its error was told "the table still holds its old rows" while it showed the new
    ones (stop-48 adversary review).  It is retried, and then told the batch was finished either way."""
    table, s, url, shadow = overwritten_once(db, proxy, "re")
    proxy.cut_on(b"COMMIT", armed_by=clearing(db, shadow), after_reply=True)  # the retry comes back at once
    found_done = ApplyStep._outcome

    def away_then_read(self: ApplyStep, *args: Any, **kwargs: Any) -> bool:
        proxy.set_down(True)  # the database goes away as the retried step finds the batch applied
        proxy.drop_all()
        return found_done(self, *args, **kwargs)

    monkeypatch.setattr(ApplyStep, "_outcome", away_then_read)
    with pytest.raises(CommitIncompleteError) as info:
        # commitTimeout counts from the branches' commits: on a loaded machine 2 s passed before the cut
        # COMMIT's error came back, so the step was never retried (told, rightly, "may already show")
        overwrite_direct(url, table, s, 1, split(100, 10, 2), commitTimeout=8)
    message = str(info.value)
    assert proxy.cut == 1
    assert "still holds its old rows" not in message, message
    assert "was finished by another run or by this" in message, message
    assert db.rows(table) == expected(range(100, 110))
    assert db.decision(s, 1).state == "committed"  # type: ignore[union-attr]
    proxy.set_down(False)
    assert_settled(db, s)
