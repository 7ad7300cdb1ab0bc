"""The protocol without Spark: branches written by write_partition, decided and committed by the Coordinator.

Every test runs against the embedded PostgreSQL and checks what matters:
the exact row set, no duplicates, the decision log, and nothing of ours
left in pg_prepared_xacts.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterable, Iterator, Sequence
from typing import Any
from urllib.parse import quote

import pytest

from tests import harness
from tests.cluster import wait_for
from tests.doc_cases import raises
from tests.harness import VALUES, expected, record_batch
from tests.leaks import SECRET, assert_no_secret
from tests.targets import (
    POSTGRESQL,
    commit_prepared,
    connect,
    make_foreign_prepared,
    make_target,
    prepared_gids,
    rollback_prepared,
    rows,
    with_login,
)
from xasink.errors import BatchAbortedError, BranchError, ConcurrentWriterError, LateBranchError, PreflightError
from xasink.journal.records import BatchRecord
from xasink.options import WriteOptions, parse_options
from xasink.protocol.coordinator import Coordinator
from xasink.protocol.partition_writer import write_partition
from xasink.protocol.xid import Xid, new_run_nonce
from xasink.results import BranchOutcome
from xasink.support.embedded import EmbeddedPostgres
from xasink.write_modes.schema import plan_target

# --------------------------------------------------------------------------- helpers


def make_options(url: str, table: str, sink: str | None = None, **extra: Any) -> WriteOptions:
    raw: dict[str, Any] = {"url": url, "dbtable": table, "sinkId": sink or f"s{uuid.uuid4().hex[:10]}", **extra}
    return parse_options(raw)


def create_table(url: str, table: str, primary_key: bool = False) -> None:
    with connect(url) as conn, conn.cursor() as cur:
        cur.execute(f"CREATE TABLE {table} (id bigint {'PRIMARY KEY' if primary_key else ''}, v text)")


class Sink(harness.Sink):
    """One sink's test harness: options, plan, a coordinator, and a writer of partitions (7 rows an Arrow batch)."""

    def __init__(self, url: str, table: str, **extra: Any) -> None:
        super().__init__(url, table, schema=VALUES, tag="v", **extra)
        self.coordinator = Coordinator(self.options)

    def write(
        self, batch_id: int, partition: int, ids: Iterable[int], *, chunk: int | None = 7, **task: Any
    ) -> BranchOutcome:
        """``claimed``: a first attempt of a batch write whose driver claimed the batch (no claim of its own)."""
        return super().write(batch_id, partition, ids, chunk=chunk, **task)

    def write_batch(self, batch_id: int, parts: list[range]) -> list[BranchOutcome]:
        return [self.write(batch_id, p, ids) for p, ids in enumerate(parts)]

    def mine(self) -> list[str]:
        """Prepared branches of this sink, by parsing (near-miss foreign gids share the prefix)."""
        parsed = [(g, Xid.parse(g)) for g in prepared_gids(self.url)]
        return [g for g, x in parsed if x is not None and x.sink_id == self.options.sink_id]

    def rows(self) -> list[tuple[Any, ...]]:
        return rows(self.url, self.table)

    def journal(self) -> dict[int, tuple[str, list[str]]]:
        with connect(self.url) as conn, conn.cursor() as cur:
            cur.execute(
                "SELECT batch_id, state, xids FROM xasink_batches WHERE sink_id = %s ORDER BY batch_id",
                (self.options.sink_id,),
            )
            return {b: (state, json.loads(xids)) for b, state, xids in cur.fetchall()}

    def close(self) -> None:
        self.coordinator.close()


@pytest.fixture
def sink(pg_url: str, fresh_table_name: str) -> Iterator[Sink]:
    create_table(pg_url, fresh_table_name)
    s = Sink(pg_url, fresh_table_name)
    try:
        yield s
    finally:
        s.close()


def gids(outcomes: Sequence[BranchOutcome | None]) -> list[str]:
    return sorted(o.gid for o in outcomes if o is not None and o.gid)


def with_query(url: str, **params: str) -> str:
    from urllib.parse import quote, urlencode

    return url + ("&" if "?" in url else "?") + urlencode(params, quote_via=quote)


# --------------------------------------------------------------------------- commit


def test_commit_makes_exactly_the_rows_visible(sink: Sink) -> None:
    parts = [range(0, 10), range(10, 25), range(25, 26)]
    outcomes = sink.write_batch(0, parts)
    outcomes.append(sink.write(0, 3, []))  # an empty partition opens no branch
    assert outcomes[3] == BranchOutcome(3, None, run=sink.run)
    assert [o.rows for o in outcomes if o] == [10, 15, 1, 0]
    assert sorted(sink.mine()) == gids(outcomes)
    assert all(Xid.parse(g) is not None for g in gids(outcomes))
    assert sink.rows() == []  # prepared, not visible

    result = sink.coordinator.commit(0, outcomes)

    assert (result.rows, result.branches, result.skipped, result.batch_id) == (26, 3, False, 0)
    assert sink.rows() == expected(range(26), tag="v")
    assert sink.mine() == []
    assert sink.journal() == {0: ("committed", gids(outcomes))}


def test_batch_of_empty_partitions_is_decided_empty(sink: Sink) -> None:
    outcomes: list[BranchOutcome | None] = [sink.write(0, 0, []), sink.write(0, 1, [])]
    result = sink.coordinator.commit(0, outcomes)
    assert (result.rows, result.branches, result.skipped) == (0, 0, False)
    assert sink.journal() == {0: ("committed", [])}
    assert sink.write(0, 0, range(3)).skipped  # decided: a replay writes nothing
    assert sink.rows() == []


def test_losing_attempt_is_rolled_back_by_the_sweep(sink: Sink) -> None:
    loser = sink.write(0, 0, range(0, 10), attempt=90)  # a speculative copy that lost
    winner = sink.write(0, 0, range(0, 10), attempt=5)
    second = sink.write(0, 1, range(10, 20), attempt=6)
    assert loser.gid in sink.mine() and winner.gid in sink.mine()

    sink.coordinator.commit(0, [winner, second])

    assert sink.rows() == expected(range(20), tag="v")  # the loser's copy of partition 0 never shows
    assert sink.mine() == []
    assert sink.journal()[0][1] == gids([winner, second])


def test_undecided_branches_of_earlier_batches_are_swept(sink: Sink) -> None:
    stale = sink.write(3, 0, range(100, 110))  # batch 3 never decided (a crashed run)
    later = sink.write(9, 0, range(200, 210))  # batch 9 is beyond this commit: left alone
    outcomes = sink.write_batch(4, [range(0, 5)])
    sink.coordinator.commit(4, outcomes)
    assert sink.rows() == expected(range(5), tag="v")
    assert stale.gid not in sink.mine()
    assert sink.mine() == [later.gid]
    sink.coordinator.abort(9, [later])
    assert sink.mine() == []


def test_commit_twice_and_replayed_partitions_write_nothing(sink: Sink) -> None:
    outcomes = sink.write_batch(5, [range(0, 10), range(10, 20)])
    first = sink.coordinator.commit(5, outcomes)
    again = sink.coordinator.commit(5, outcomes)
    assert not first.skipped and again.skipped
    assert (again.rows, again.branches) == (0, 0)  # this run wrote nothing ...
    assert again.earlier is not None and (again.earlier.rows, again.earlier.branches) == (20, 2)  # ... the first did
    assert again.earlier.run == outcomes[0].run and again.earlier.committed_at is not None

    replay_run = new_run_nonce()  # e.g. a streaming batch re-run after a driver crash
    replayed = [sink.write(5, p, ids, run=replay_run) for p, ids in enumerate([range(0, 10), range(10, 20)])]
    assert all(o.skipped and o.gid is None for o in replayed)
    result = Coordinator(sink.options).commit(5, replayed)
    assert result.skipped
    assert sink.rows() == expected(range(20), tag="v")
    assert sink.mine() == []
    assert list(sink.journal()) == [5]


@pytest.mark.doc_case("error/ConcurrentWriterError")
def test_replay_racing_the_first_decision_is_rolled_back(sink: Sink) -> None:
    first = sink.write_batch(2, [range(0, 10)])
    # a second run of the same batch whose tasks passed the decision check, prepared after the first run's
    # tasks (so it clears the first run's branch) ...
    second_run = new_run_nonce()
    second = [sink.write(2, 0, range(0, 10), run=second_run)]
    assert sink.mine() == gids(second)
    # ... so the first run cannot decide: its branch vanished
    with raises(ConcurrentWriterError):
        sink.coordinator.commit(2, first)
    assert sink.rows() == []
    assert sink.journal() == {}
    sink.coordinator.commit(2, second)
    assert sink.rows() == expected(range(10), tag="v")
    assert sink.mine() == []


def test_a_driver_claim_takes_the_batch_over_before_any_task(sink: Sink) -> None:
    """The batch writer's driver claims (Coordinator.claim + recover) so first attempts skip their claim:
    the older run's branches are rolled back at once, its later tasks are refused, a claimed first attempt
    of a run taken over meanwhile rolls its own branch back, and a decided batch is not claimed again."""
    old_run, new_run, third_run = new_run_nonce(), new_run_nonce(), new_run_nonce()
    old = [sink.write(8, 0, range(0, 10), run=old_run)]  # a run that claimed in its task, as streaming does
    assert sink.coordinator.claim(8, new_run) is True
    sink.coordinator.recover(upto=8, run=new_run)  # the writer's plan: the superseded run's branch goes now
    assert sink.mine() == []
    with pytest.raises(ConcurrentWriterError, match="taken over by a newer writer"):
        sink.write(8, 1, range(10, 20), run=old_run)
    new = [sink.write(8, p, range(100 + 10 * p, 110 + 10 * p), run=new_run, claimed=True) for p in (0, 1)]
    assert sorted(sink.mine()) == sorted(gids(new))
    # a third writer claims now: the second's next claimed first attempt finds out after its PREPARE
    assert sink.coordinator.claim(8, third_run) is True
    with pytest.raises(LateBranchError, match="can never be decided"):
        sink.write(8, 2, range(200, 210), run=new_run, claimed=True)
    with pytest.raises(ConcurrentWriterError):
        sink.coordinator.claim(8, new_run)  # a run taken over cannot claim back
    sink.coordinator.recover(upto=8, run=third_run)
    assert sink.mine() == []
    third = [sink.write(8, 0, range(300, 305), run=third_run, claimed=True)]
    assert sink.coordinator.commit(8, third).rows == 5
    assert sink.coordinator.claim(8, new_run_nonce()) is False  # decided: a replay, nothing claimed
    assert sink.rows() == expected(range(300, 305), tag="v") and sink.mine() == []
    assert old[0].xid is not None and sink.journal()[8][1] == gids(third)


def test_writer_taken_over_by_a_newer_run_loses_and_cannot_come_back(sink: Sink) -> None:
    """Two writers of one (sink, batch): the newer run's first task takes the batch over; exactly one wins."""
    old_run, new_run = new_run_nonce(), new_run_nonce()
    old = [sink.write(7, 0, range(0, 10), run=old_run)]
    new = [sink.write(7, 0, range(100, 110), run=new_run)]  # takes over: the old run's branch is rolled back
    assert sink.mine() == gids(new)
    with pytest.raises(ConcurrentWriterError, match="taken over by a newer writer"):
        sink.write(7, 1, range(10, 20), run=old_run)  # the old run's later task: refused, opens no branch
    assert sink.mine() == gids(new)
    with pytest.raises(ConcurrentWriterError, match="wrote nothing"):
        sink.coordinator.commit(7, old)
    # the old writer's abort (with its settle sweep) leaves the new holder's branches alone
    sink.coordinator.abort(7, old, run=old_run)
    sink.coordinator.abort(7, [None], run=old_run)
    assert sink.mine() == gids(new)
    new.append(sink.write(7, 1, range(110, 120), run=new_run))
    result = sink.coordinator.commit(7, new)
    assert (result.rows, result.skipped) == (20, False)
    assert sink.rows() == expected(range(100, 120), tag="v")
    assert sink.mine() == []
    assert sink.coordinator.commit(7, old).skipped  # once decided, the old writer's commit is a replay
    assert sink.rows() == expected(range(100, 120), tag="v")


def test_decided_batch_is_a_replay_for_a_later_writer(sink: Sink) -> None:
    """A writer arriving after another decided the batch writes nothing and reports a replay."""
    first = sink.write_batch(3, [range(0, 10)])
    sink.coordinator.commit(3, first)
    late = [sink.write(3, 0, range(500, 510), run=new_run_nonce())]
    assert late[0].skipped
    assert Coordinator(sink.options).commit(3, late).skipped
    assert sink.rows() == expected(range(10), tag="v")


# --------------------------------------------------------------------------- abort


def test_abort_rolls_everything_back(sink: Sink) -> None:
    outcomes = sink.write_batch(1, [range(0, 10), range(10, 20), range(20, 30)])
    report = sink.coordinator.abort(1, outcomes)
    assert sorted(x.gid for x in report.rolled_back) == gids(outcomes)
    assert sink.rows() == []
    assert sink.mine() == []
    assert sink.journal() == {}
    # an aborted batch was never decided: it can be written again (by a new run: the aborted one has ended)
    sink.run = new_run_nonce()
    outcomes = sink.write_batch(1, [range(0, 3)])
    sink.coordinator.commit(1, outcomes)
    assert sink.rows() == expected(range(3), tag="v")


@pytest.mark.doc_case("error/BatchAbortedError")
def test_missing_task_report_aborts(sink: Sink) -> None:
    outcomes = sink.write_batch(1, [range(0, 10), range(10, 20)])
    with raises(BatchAbortedError):
        sink.coordinator.commit(1, [outcomes[0], None])
    assert sink.rows() == []
    assert sink.mine() == []
    assert sink.journal() == {}


# --------------------------------------------------------------------------- recovery


def decide(sink: Sink, batch_id: int, outcomes: Sequence[BranchOutcome | None]) -> BatchRecord:
    """What commit() does up to the decision: the driver 'crashes' right after it."""
    xids = tuple(sorted(o.xid for o in outcomes if o is not None and o.xid is not None))
    record = BatchRecord(
        sink.options.sink_id, batch_id, "committing", xids, sum(o.rows for o in outcomes if o), len(xids)
    )
    sink.coordinator.decider.decide(record)
    return record


def test_recover_finishes_a_decided_batch(sink: Sink) -> None:
    outcomes = sink.write_batch(7, [range(0, 10), range(10, 20), range(20, 30)])
    decide(sink, 7, outcomes)
    assert sink.journal() == {7: ("committing", gids(outcomes))}
    assert sink.rows() == []
    commit_prepared(sink.url, gids(outcomes)[0])  # the crashed driver got one COMMIT through

    report = Coordinator(sink.options).recover()

    assert report.finished_batches == [7]
    assert sorted(x.gid for x in report.committed) == gids(outcomes)
    assert report.rolled_back == []
    assert sink.rows() == expected(range(30), tag="v")
    assert sink.mine() == []
    assert sink.journal()[7][0] == "committed"
    assert Coordinator(sink.options).commit(7, outcomes).skipped  # the restarted driver replays it: nothing new
    assert sink.rows() == expected(range(30), tag="v")


def test_recover_rolls_back_undecided_branches(sink: Sink) -> None:
    outcomes = sink.write_batch(2, [range(0, 10), range(10, 20)])
    young = Coordinator(sink.options).recover(min_age_s=3600)
    assert not young
    assert sorted(sink.mine()) == gids(outcomes)  # a live batch may still decide them

    report = Coordinator(sink.options).recover()

    assert sorted(x.gid for x in report.rolled_back) == gids(outcomes)
    assert report.committed == [] and report.finished_batches == []
    assert sink.rows() == []
    assert sink.mine() == []
    assert sink.journal() == {}


def test_recovery_wins_the_race_then_commit_fails(sink: Sink) -> None:
    """Invariant 4: a recovery that rolled back a live batch's branches makes its decision impossible."""
    outcomes = sink.write_batch(3, [range(0, 10), range(10, 20)])
    report = Coordinator(sink.options).recover()
    assert len(report.rolled_back) == 2
    with pytest.raises(ConcurrentWriterError, match="vanished"):
        sink.coordinator.commit(3, outcomes)
    assert sink.rows() == []
    assert sink.mine() == []
    assert sink.journal() == {}


def test_one_vanished_branch_dooms_the_batch(sink: Sink) -> None:
    outcomes = sink.write_batch(3, [range(0, 10), range(10, 20), range(20, 30)])
    rollback_prepared(sink.url, gids(outcomes)[1])
    with pytest.raises(ConcurrentWriterError):
        sink.coordinator.commit(3, outcomes)
    assert sink.rows() == []
    assert sink.mine() == []  # the surviving branches were rolled back too
    assert sink.journal() == {}


def test_decision_wins_the_race_then_recovery_commits(sink: Sink) -> None:
    outcomes = sink.write_batch(3, [range(0, 10), range(10, 20)])
    record = decide(sink, 3, outcomes)
    report = Coordinator(sink.options).recover()
    assert sorted(x.gid for x in report.committed) == gids(outcomes)
    assert report.rolled_back == []
    # the live driver goes on committing: the branches are gone, which means committed
    assert sorted(sink.coordinator.group.commit(record.xids)) == list(record.xids)
    assert sink.rows() == expected(range(20), tag="v")
    assert sink.mine() == []


def _wait_for_lock_wait(url: str, thread: threading.Thread) -> None:
    """Until some backend of this database waits on a heavyweight lock (the recovery's SELECT ... FOR UPDATE)."""

    def waiting() -> bool:
        assert thread.is_alive(), "recovery finished without waiting for the sink lock"
        return bool(make_target(POSTGRESQL, url).lock_waiters("%FOR UPDATE%"))

    wait_for(waiting, 60, "the recovery to wait for the sink lock")


def test_recovery_waits_for_a_decision_in_progress(sink: Sink) -> None:
    """Invariant 4 with real concurrency: recovery blocks on the sink lock while the decision is being made."""
    outcomes = sink.write_batch(4, [range(0, 10), range(10, 20)])
    xids = tuple(sorted(o.xid for o in outcomes if o and o.xid))
    record = BatchRecord(sink.options.sink_id, 4, "committing", xids, 20, 2)
    result: dict[str, Any] = {}

    def recover() -> None:
        try:
            result["report"] = Coordinator(sink.options).recover()
        except BaseException as exc:  # noqa: BLE001 - reported below
            result["error"] = exc

    journal = sink.coordinator.journal
    thread = threading.Thread(target=recover)
    with journal.locked(sink.options.sink_id) as conn:
        thread.start()
        _wait_for_lock_wait(sink.url, thread)
        assert sorted(sink.mine()) == gids(outcomes)  # recovery has not touched them
        journal.insert_decision(conn, record)
    thread.join(120)
    assert not thread.is_alive()
    assert "error" not in result, result.get("error")
    assert sorted(x.gid for x in result["report"].committed) == gids(outcomes)
    assert result["report"].rolled_back == []
    assert sink.rows() == expected(range(20), tag="v")
    assert sink.mine() == []


# --------------------------------------------------------------------------- foreign transactions


def test_foreign_prepared_transactions_are_never_touched(sink: Sink) -> None:
    s = sink.options.sink_id
    foreign = [
        "foreign-1",
        "xasink:bad",
        "xasink:s:1/0:1-zzzzzzzz",
        f"xasink:{s}:1/0:1-zzzzzzzz",  # near misses of this very sink and batch
        f"xasink:{s}:01/0:1-0a1b2c3d",
        f"xasink:{s}:1/00:1-0a1b2c3d",
        f"xasink:{s}:1/0:1-0a1b2c3d/",
        f"XASINK:{s}:1/0:1-0a1b2c3d",
        f"xasink:{s}:9223372036854775808/0:1-0a1b2c3d",
        f"xasink:{s}x:1/0:1-0a1b2c3d",  # a valid branch of another sink
        f"xasink:{s[:-1]}:1/0:1-0a1b2c3d",
    ]
    scratch = f"scratch_{uuid.uuid4().hex[:8]}"
    try:
        for gid in foreign:
            make_foreign_prepared(sink.url, gid, scratch)
        outcomes = sink.write_batch(1, [range(0, 10), range(10, 20)])
        sink.coordinator.commit(1, outcomes)  # commit + sweep of batch <= 1
        sink.write_batch(2, [range(20, 30)])
        Coordinator(sink.options).recover()  # recovery of everything of this sink
        sink.coordinator.abort(3)
        assert sink.rows() == expected(range(20), tag="v")
        assert sink.mine() == []
        assert sorted(set(foreign) & set(prepared_gids(sink.url))) == sorted(foreign)
        assert rows(sink.url, scratch) == []  # still pending, neither committed nor rolled back
    finally:
        for gid in foreign:
            if gid in prepared_gids(sink.url):
                rollback_prepared(sink.url, gid)
    assert not set(foreign) & set(prepared_gids(sink.url))


# --------------------------------------------------------------------------- retried tasks


def test_retried_partition_is_not_blocked_by_its_earlier_attempt(pg_url: str, fresh_table_name: str) -> None:
    url = with_query(pg_url, options="-c lock_timeout=20000")  # a regression fails instead of hanging
    create_table(url, fresh_table_name, primary_key=True)
    s = Sink(url, fresh_table_name)
    try:
        first = s.write(0, 0, range(0, 10), attempt=10)  # prepared, then the task "failed" to report
        other = s.write(0, 1, range(10, 20), attempt=11)
        retry = s.write(0, 0, range(0, 10), attempt=12)  # same keys: would wait on the first attempt's locks
        assert retry.gid == first.gid and retry.rows == 10  # adopted: the retry wrote nothing, waited for nothing
        assert sorted(s.mine()) == gids([other, first])
        s.coordinator.commit(0, [retry, other])
        assert s.rows() == expected(range(20), tag="v")

        # a new run of a batch (a restarted query) clears the crashed run's branches of that batch too
        crashed = s.write(1, 0, range(20, 30), attempt=1, run=new_run_nonce())
        rerun = s.write(1, 0, range(20, 30), attempt=1, run=new_run_nonce())
        assert s.mine() == gids([rerun]) and crashed.gid != rerun.gid
        s.coordinator.commit(1, [rerun])
        assert s.rows() == expected(range(30), tag="v")
        assert s.mine() == []
    finally:
        s.close()


@pytest.mark.doc_case("error/BranchError")
def test_duplicate_key_fails_the_branch_cleanly(pg_url: str, fresh_table_name: str) -> None:
    create_table(pg_url, fresh_table_name, primary_key=True)
    s = Sink(pg_url, fresh_table_name)
    try:
        ok = s.write(0, 0, range(0, 10))
        with raises(BranchError, match="duplicate key") as info:
            s.write(0, 1, [20, 21, 21])
        assert s.options.url.render_as_string(hide_password=False) not in str(info.value)
        assert s.mine() == [ok.gid]  # the failed branch left nothing prepared
        s.coordinator.abort(0, [ok, None])
        assert s.rows() == []
        assert s.mine() == []
    finally:
        s.close()


# --------------------------------------------------------------------------- journal


def test_journal_keeps_journal_retention_batches(pg_url: str, fresh_table_name: str) -> None:
    create_table(pg_url, fresh_table_name)
    s = Sink(pg_url, fresh_table_name, journalRetention="2")
    try:
        for b in range(5):
            s.coordinator.commit(b, s.write_batch(b, [range(b * 10, b * 10 + 10)]))
        # every committed batch keeps its row; only the newest two keep their xid lists
        assert sorted(s.journal()) == [0, 1, 2, 3, 4]
        assert all(state == "committed" for state, _ in s.journal().values())
        assert [b for b, (_, xids) in s.journal().items() if xids] == [3, 4]
        for b in (4, 0):  # kept or compacted: still deduplicated
            assert s.coordinator.commit(b, s.write_batch(b, [range(b * 10, b * 10 + 10)])).skipped
        assert s.rows() == expected(range(50), tag="v")
        assert s.mine() == []
    finally:
        s.close()


# --------------------------------------------------------------------------- server checks


def test_check_server_counts_free_slots(pg_url: str, sink: Sink) -> None:
    dialect = sink.coordinator.dialect
    with dialect.connect() as conn:
        limit = int(conn.exec_driver_sql("SHOW max_prepared_transactions").scalar_one())
        dialect.check_server(conn, limit)  # nothing of ours is prepared: all slots free
        dialect.check_server(conn, None)
    outcomes = sink.write_batch(0, [range(0, 3), range(3, 6)])
    try:
        in_use = len(prepared_gids(pg_url))
        with dialect.connect() as conn:
            dialect.check_server(conn, limit - in_use)
            with pytest.raises(PreflightError) as info:
                dialect.check_server(conn, limit - in_use + 1)
        msg = str(info.value)
        assert f"{limit - in_use} free prepared-transaction slots" in msg
        assert f"max_prepared_transactions = {limit}" in msg and "numPartitions" in msg
        with pytest.raises(PreflightError, match="free prepared-transaction slots"):
            sink.coordinator.preflight(branches=limit + 1)
    finally:
        sink.coordinator.abort(0, outcomes)


@pytest.mark.doc_case("error/PreflightError")
def test_prepared_transactions_disabled_is_explained(fresh_table_name: str) -> None:
    # synchronous_commit on: the restart below is a crash (pg_ctl -m immediate), which must not lose the decision
    # log this part creates; the log being recreated under a new identity would disown the later branches
    server = EmbeddedPostgres(max_prepared_transactions=0, password=SECRET, extra_settings={"synchronous_commit": "on"})
    server.start()
    try:
        create_table(server.url, fresh_table_name)
        # the real password, in the URL's query (the server checks it): it must reach the server, never a message
        in_query = with_login(server.url, "postgres") + f"?password={quote(SECRET, safe='')}"
        opts = make_options(in_query, fresh_table_name)
        with raises(PreflightError) as info:
            Coordinator(opts).preflight()
        msg = str(info.value)
        assert "max_prepared_transactions = 0" in msg and "restart" in msg
        assert_no_secret(info.value)
        # a writer that skipped the preflight gets a clear branch error, and nothing is left behind
        coordinator = Coordinator(opts)
        coordinator.journal.ensure()
        with coordinator.dialect.connect() as conn:
            plan = plan_target(coordinator.dialect, conn, opts, VALUES)
        coordinator.close()
        with pytest.raises(BranchError) as branch_info:
            write_partition(
                opts,
                plan,
                batch_id=0,
                partition=0,
                task_attempt_id=1,
                run=new_run_nonce(),
                batches=[record_batch(range(3), VALUES, "v")],
            )
        assert "max_prepared_transactions" in str(branch_info.value)
        assert_no_secret(branch_info.value)
        assert rows(server.url, fresh_table_name) == []

        # the same server with one slot: the preflight counts it, and a second branch is told why it failed
        server.max_prepared_transactions = 1
        server.restart()
        s = Sink(server.url, fresh_table_name)
        try:
            s.coordinator.preflight(branches=1)
            with pytest.raises(PreflightError, match="1 free prepared-transaction slots"):
                s.coordinator.preflight(branches=2)
            first = s.write(0, 0, range(0, 3))
            with pytest.raises(BranchError, match="no free prepared-transaction slot.*coalesce"):
                s.write(0, 1, range(3, 6))
            assert s.mine() == [first.gid]
            s.coordinator.abort(0, [first, None])
            assert s.mine() == [] and s.rows() == []
        finally:
            s.close()
    finally:
        server.stop()


def test_connect_error_is_clear_and_hides_the_password(fresh_table_name: str) -> None:
    from xasink.support.embedded import free_port

    opts = make_options(f"postgresql://u:hunter2@127.0.0.1:{free_port()}/db", fresh_table_name)
    with pytest.raises(PreflightError) as info:
        Coordinator(opts).preflight()
    assert "cannot connect" in str(info.value)
    assert "hunter2" not in str(info.value)
