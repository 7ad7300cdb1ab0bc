"""What the decision log remembers: every committed (sinkId, batchId) forever, and what each batch wrote.

Without Spark: branches are prepared by ``write_partition`` (as tasks do) and decided by the Coordinator.
Each test runs on PostgreSQL and MariaDB and checks the exact rows (each once), and that nothing is left
prepared (the autouse leak check).
"""

from __future__ import annotations

import random
import uuid
from typing import Any

import pytest
import sqlalchemy as sa

from tests.doc_cases import raises
from tests.harness import TargetSink, expected
from tests.targets import Target
from xasink.dialects import dialect_for
from xasink.errors import BatchIdentityError, ForgottenBatchError
from xasink.journal.layout import journal_metadata
from xasink.journal.log import Journal
from xasink.journal.targets import UNKNOWN_QUERY
from xasink.options import parse_url
from xasink.protocol.coordinator import Coordinator


class Sink(TargetSink):
    """One sink id writing into one table (keyless: a batch written twice shows as duplicate rows)."""

    def __init__(self, db: Target, **kwargs: Any) -> None:
        super().__init__(db, primary_key=False, prefix="bi", **kwargs)


# --------------------------------------------------------------------------- item 1: retention never forgets


def test_rerun_of_batch_1_after_batch_5000_writes_nothing(db: Target) -> None:
    """The reproduction: 1, then 5000, then 1 again, with the default retention: 200 rows, not 300."""
    s = Sink(db)
    assert not s.batch(1, range(0, 100)).skipped
    assert not s.batch(5000, range(100, 200)).skipped
    assert s.batch(1, range(0, 100)).skipped
    assert s.rows() == expected(range(0, 200))
    assert db.prepared(s.sink_id) == []


def test_compacted_batches_are_still_replays_and_backfills_still_write(db: Target) -> None:
    """journalRetention=2 keeps two full xid lists; the older batches keep their row, so their reruns skip."""
    s = Sink(db, journalRetention="2")
    for n, b in enumerate([40, 10, 30, 20]):
        assert not s.batch(b, range(n * 10, n * 10 + 10)).skipped
    log = db.decisions(s.sink_id)
    assert sorted(log) == [10, 20, 30, 40]  # every committed batch is remembered
    assert all(d.state == "committed" for d in log.values())
    full = [b for b, d in sorted(log.items()) if d.xids]
    # the newest two keep their lists, by decision time, not by id (MariaDB's DATETIME has whole seconds:
    # decisions within one second are ordered by id there)
    assert full == [20, 30] if db.kind == "postgresql" else len(full) == 2
    for n, b in enumerate([40, 10, 30, 20]):
        assert s.batch(b, range(n * 10, n * 10 + 10)).skipped
    assert not s.batch(5, range(100, 110)).skipped  # a backfill below every id: written
    assert not s.batch(10**12, range(110, 120)).skipped
    assert s.rows() == expected(range(0, 40), range(100, 120))
    assert db.prepared(s.sink_id) == []


def test_many_ids_in_random_order_each_written_once(db: Target) -> None:
    s = Sink(db, journalRetention="3")
    rnd = random.Random(15)
    ids = rnd.sample(range(1, 10**6), 25)
    for n, b in enumerate(ids):
        assert not s.batch(b, range(n * 4, n * 4 + 4)).skipped
    reruns = list(enumerate(ids))
    rnd.shuffle(reruns)
    for n, b in reruns:
        assert s.batch(b, range(n * 4, n * 4 + 4)).skipped
    assert s.rows() == expected(range(0, 100))
    assert sorted(db.decisions(s.sink_id)) == sorted(ids)
    assert db.prepared(s.sink_id) == []


OLD_COLUMNS = {"sinks": ["horizon"], "batches": ["compacted", "target"]}


def make_old_log(db: Target, prefix: str) -> None:
    """A decision log as xasink made it before this version: no horizon, compacted or target columns."""
    md = sa.MetaData()
    for table in journal_metadata(prefix=prefix):
        db.tables.append(table.name)
        dropped = OLD_COLUMNS.get(table.name[len(prefix) :], [])
        sa.Table(table.name, md, *(c._copy() for c in table.columns if c.name not in dropped), mysql_engine="InnoDB")
    dialect = dialect_for(parse_url(db.url, password=db.password))
    try:
        with dialect.connect() as conn:
            md.create_all(conn)
            conn.commit()
    finally:
        dialect.dispose()


@pytest.mark.doc_case("error/ForgottenBatchError")
def test_old_log_is_upgraded_and_refuses_what_its_trim_may_have_forgotten(db: Target) -> None:
    """A log whose old trim deleted batches 1..2 of sink S (kept 3, 4): after the upgrade, 3 and 4 are replays,
    2 (forgotten) is refused, 5 (new) is written; the upgrade adds the missing columns."""
    prefix = f"xo{uuid.uuid4().hex[:6]}_"
    make_old_log(db, prefix)
    table = db.new_table()
    db.keyed_table(table, primary_key=False)
    sink_id = f"bo{uuid.uuid4().hex[:10]}"
    db.execute(f"INSERT INTO {db.q(prefix + 'sinks')} VALUES (%s, CURRENT_TIMESTAMP)", sink_id)
    for b in (3, 4):
        db.execute(
            f"INSERT INTO {db.q(prefix + 'batches')} VALUES (%s, %s, 'committed', '[]', 10, 1, 1, 1, "
            "CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)",
            sink_id,
            b,
        )
    # a reader (xasink status, recover) reads an old log as it is, before any writer upgraded it
    dialect = dialect_for(parse_url(db.url, password=db.password))
    try:
        with dialect.connect() as conn:
            found = Journal(dialect, prefix=prefix).get(conn, sink_id, 3)
            assert found is not None and found.committed
    finally:
        dialect.dispose()
    s = Sink(db, sink_id=sink_id, table=table, journalTablePrefix=prefix)  # preflight upgrades the log
    assert s.batch(3, range(0, 10)).skipped
    assert s.batch(4, range(0, 10)).skipped
    with raises(ForgottenBatchError, match=rf"sink {sink_id} batch 2: the decision log cannot tell"):
        s.batch(2, range(20, 30))
    coordinator = Coordinator(s.options)
    try:
        with pytest.raises(ForgottenBatchError, match=f"horizon of {prefix}sinks"):
            coordinator.check_batch(1)  # what the Spark writer asks before any task runs
    finally:
        coordinator.close()
    assert not s.batch(5, range(50, 60)).skipped
    assert s.rows() == expected(range(50, 60))
    assert set(db.decisions(sink_id, prefix)) == {3, 4, 5}
    assert db.prepared(sink_id) == []
    # a second writer of the upgraded log changes nothing; an unrelated new sink has no horizon
    other = Sink(db, journalTablePrefix=prefix)
    assert not other.batch(1, range(70, 75)).skipped
    assert other.rows() == expected(range(70, 75))


# --------------------------------------------------------------------------- item 2: what a batch wrote


@pytest.mark.doc_case("error/BatchIdentityError")
def test_same_batch_to_another_table_is_refused(db: Target) -> None:
    a = Sink(db)
    b = Sink(db, sink_id=a.sink_id)
    assert not a.batch(7, range(0, 50)).skipped
    with raises(BatchIdentityError) as err:
        b.batch(7, range(100, 150))
    text = str(err.value)
    assert f"sink {a.sink_id} batch 7 was committed to table" in text
    assert f".{a.table} in database" in text and f".{b.table} in database" in text
    assert b.rows() == []
    assert a.rows() == expected(range(0, 50))
    assert db.prepared(a.sink_id) == []
    assert a.batch(7, range(0, 50)).skipped  # the same target again: a replay
    assert a.rows() == expected(range(0, 50))


def test_another_table_is_refused_by_the_coordinator_before_deciding(db: Target) -> None:
    """Branches prepared for table B before A's decision of the same batch: the commit refuses and rolls them back."""
    a = Sink(db)
    b = Sink(db, sink_id=a.sink_id)
    b_outcomes = b.prepare(9, range(100, 150))
    assert not a.batch(9, range(0, 50)).skipped
    coordinator = Coordinator(b.options)
    try:
        with pytest.raises(BatchIdentityError, match="batch 9 was committed to table"):
            coordinator.commit(9, b_outcomes)
        assert db.prepared(a.sink_id) == []
        with pytest.raises(BatchIdentityError):
            coordinator.check_batch(9)  # what the Spark writer asks before any task runs
    finally:
        coordinator.close()
    assert b.rows() == []
    assert a.rows() == expected(range(0, 50))


def test_same_batch_of_another_streaming_query_is_refused(db: Target) -> None:
    s = Sink(db)
    assert not s.batch(3, range(0, 20), query="q-one").skipped
    assert s.batch(3, range(0, 20), query="q-one").skipped  # the same query's replay
    with pytest.raises(BatchIdentityError, match="streaming query q-one"):
        s.batch(3, range(20, 40), query="q-two")
    assert s.rows() == expected(range(0, 20))
    assert db.prepared(s.sink_id) == []


def test_a_micro_batch_whose_query_is_unknown_never_passes_for_a_replay(db: Target) -> None:
    """A task that knows it writes a micro-batch but not its query's id (a thread of the user's own, under
    Spark Connect or before any xasink call tied the query to its session) records ``unknown``.  Such a
    write of a decided batch is refused, whatever the record names (another query, none, or unknown too):
    it cannot tell the same query's replay from another query's batch.  Before, an unknown write of batch 3
    (recorded for q-one) was refused but one of batch 4 (recorded unknown) was skipped as its replay."""
    s = Sink(db)
    assert not s.batch(3, range(0, 20), query="q-one").skipped
    assert not s.batch(4, range(20, 40), query=UNKNOWN_QUERY).skipped  # new: written, recorded unknown
    assert not s.batch(5, range(40, 60)).skipped  # a batch job's: no query
    for batch, ids in [(3, range(0, 20)), (4, range(20, 40)), (5, range(40, 60))]:
        with pytest.raises(BatchIdentityError) as err:
            s.batch(batch, ids, query=UNKNOWN_QUERY)
        text = str(err.value)
        assert f"sink {s.sink_id} batch {batch} was committed to table" in text
        assert "whose query xasink cannot learn here" in text and "xasink.register(spark)" in text
    assert s.batch(4, range(20, 40)).skipped  # a batch job's rerun of it: the table alone decides, as before
    assert s.batch(3, range(0, 20), query="q-one").skipped  # q-one's own replay
    assert s.rows() == expected(range(0, 60))
    assert db.prepared(s.sink_id) == []
