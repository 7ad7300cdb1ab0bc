"""xasink.transaction(): one atomic batch across tables in PostgreSQL and MariaDB together.

Every test writes into both databases (the session's private PostgreSQL and a MariaDB database) and
checks, with the plain drivers, that each table holds exactly all of its rows or exactly none, and that
no branch of the test's sink is left prepared on either server.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession

import xasink
from tests.harness import ROWS, Stream, expected, frame, no_branch_opened, three_tables
from tests.targets import Target
from xasink.ops import survey as admin
from xasink.protocol import liveness

pytestmark = [pytest.mark.spark, pytest.mark.mariadb]


@pytest.fixture
def sink() -> Iterator[str]:
    yield f"tx{uuid.uuid4().hex[:8]}"


def failing(spark: SparkSession, lo: int, hi: int) -> DataFrame:
    """A frame whose second partition's task fails (a division by zero in ANSI mode): its job fails."""
    return spark.range(lo, hi, 1, 2).selectExpr(
        "cast(id as int) as id", f"concat('n', cast(1 / (case when id >= {hi - 1} then 0 else 1 end) as int)) as name"
    )


def rows(target: Target, table: str) -> list[tuple[Any, ...]]:
    return target.rows(table) if target.table_exists(table) else []


def assert_clean(sink: str, *targets: Target) -> None:
    for t in targets:
        assert t.prepared(sink) == [], (t, t.prepared(sink))


def into_both(
    sink: str, pg: Target, orders: str, maria: Target, events: str, calls: list[int] | None = None
) -> Callable[[DataFrame, int], Any]:
    """``foreach_batch_multi`` of a function writing each micro-batch into ``orders`` on PostgreSQL and ``events``
    on MariaDB, the log on PostgreSQL; ``calls`` collects the batch ids Spark called it with."""

    def both(df: DataFrame, epoch_id: int, tx: Any) -> None:
        if calls is not None:
            calls.append(epoch_id)
        tx.write(df, pg.url, orders)
        tx.write(df, maria.url, events)

    return xasink.foreach_batch_multi(both, sink_id=sink, journal_url=pg.url)


@pytest.mark.core
def test_three_tables_two_databases_commit_together(spark, pg, maria, sink):  # type: ignore[no-untyped-def]
    orders, lines, events = three_tables(pg, maria)
    with xasink.transaction(sink_id=sink, batch_id=7, journal_url=pg.url) as tx:
        r1 = tx.write(frame(spark, range(10), 2), pg.url, orders)
        tx.write(frame(spark, range(100, 120), 2), pg.url, lines, upsertKeyColumns="id")
        tx.write(frame(spark, range(200, 205), 2), maria.url, events)
        assert rows(pg, orders) == [] and rows(maria, events) == []  # prepared, not visible yet
    assert r1.rows == 10
    assert rows(pg, orders) == expected(range(10))
    assert rows(pg, lines) == expected(range(100, 120))
    assert rows(maria, events) == expected(range(200, 205))
    assert tx.result is not None and not tx.result.skipped
    assert [(t.table, t.rows) for t in tx.result.targets] == [(orders, 10), (lines, 20), (events, 5)]
    assert tx.result.rows == 35
    # the decision log is in journal_url's database: one decided row, committed
    (state,) = pg.execute("SELECT state FROM xasink_batches WHERE sink_id = %s AND batch_id = 7", sink)
    assert state == ("committed",)
    assert_clean(sink, pg, maria)

    # the same transaction again: a replay writes nothing anywhere
    with xasink.transaction(sink_id=sink, batch_id=7, journal_url=pg.url) as tx2:
        r = tx2.write(frame(spark, range(10), 2), pg.url, orders)
        tx2.write(frame(spark, range(100, 120), 2), pg.url, lines, upsertKeyColumns="id")
        tx2.write(frame(spark, range(200, 205), 2), maria.url, events)
    assert r.skipped and tx2.result is not None and tx2.result.skipped
    assert rows(pg, orders) == expected(range(10)) and rows(maria, events) == expected(range(200, 205))
    assert_clean(sink, pg, maria)


def test_a_failure_in_the_last_write_rolls_back_every_write(spark, pg, maria, sink):  # type: ignore[no-untyped-def]
    orders, lines, events = three_tables(pg, maria)
    spark.conf.set("spark.sql.ansi.enabled", "true")
    with pytest.raises(xasink.XasinkError), xasink.transaction(sink_id=sink, batch_id=1, journal_url=pg.url) as tx:
        tx.write(frame(spark, range(10), 2), pg.url, orders)
        tx.write(frame(spark, range(100, 120), 2), maria.url, events)
        tx.write(failing(spark, 200, 210), pg.url, lines)
    assert rows(pg, orders) == [] and rows(pg, lines) == [] and rows(maria, events) == []
    assert pg.execute("SELECT count(*) FROM xasink_batches WHERE sink_id = %s", sink) == [(0,)]
    assert_clean(sink, pg, maria)
    # the same batch id runs again and commits: nothing of the failed attempt counts
    with xasink.transaction(sink_id=sink, batch_id=1, journal_url=pg.url) as tx:
        tx.write(frame(spark, range(10), 2), pg.url, orders)
        tx.write(frame(spark, range(100, 120), 2), maria.url, events)
    assert rows(pg, orders) == expected(range(10)) and rows(maria, events) == expected(range(100, 120))
    assert_clean(sink, pg, maria)


def test_an_exception_in_the_block_after_two_writes_rolls_back_both(spark, pg, maria, sink):  # type: ignore[no-untyped-def]
    orders, _, events = three_tables(pg, maria)
    with (
        pytest.raises(RuntimeError, match="user code"),
        xasink.transaction(sink_id=sink, batch_id=3, journal_url=maria.url) as tx,
    ):
        tx.write(frame(spark, range(10), 2), pg.url, orders)
        tx.write(frame(spark, range(100, 120), 2), maria.url, events)
        raise RuntimeError("user code failed")
    assert rows(pg, orders) == [] and rows(maria, events) == []
    assert_clean(sink, pg, maria)


def test_the_same_table_twice_lands_both_writes(spark, pg, maria, sink):  # type: ignore[no-untyped-def]
    orders, _, events = three_tables(pg, maria)
    with xasink.transaction(sink_id=sink, batch_id=4, journal_url=maria.url) as tx:
        tx.write(frame(spark, range(10), 2), maria.url, events)
        tx.write(frame(spark, range(10, 15), 2), maria.url, events)
        tx.write(frame(spark, range(3), 2), pg.url, orders)
    assert rows(maria, events) == expected(range(15))
    assert rows(pg, orders) == expected(range(3))
    # the log is MariaDB's: the decision lists the PostgreSQL branches too
    (n,) = maria.execute("SELECT branches FROM xasink_batches WHERE sink_id = %s AND batch_id = 4", sink)
    assert n == (6,)
    assert_clean(sink, pg, maria)


def test_writes_from_several_threads_are_decided_together(spark, pg, maria, sink):  # type: ignore[no-untyped-def]
    orders, lines, events = three_tables(pg, maria)
    errors: list[BaseException] = []
    with xasink.transaction(sink_id=sink, batch_id=5, journal_url=pg.url) as tx:

        def run(df: DataFrame, url: str, table: str) -> None:
            try:
                xasink.register(spark)
                tx.write(df, url, table)
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [
            threading.Thread(target=run, args=(frame(spark, range(10), 2), pg.url, orders)),
            threading.Thread(target=run, args=(frame(spark, range(10, 20), 2), pg.url, lines)),
            threading.Thread(target=run, args=(frame(spark, range(20, 30), 2), maria.url, events)),
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert errors == []
    assert rows(pg, orders) == expected(range(10)) and rows(pg, lines) == expected(range(10, 20))
    assert rows(maria, events) == expected(range(20, 30))
    assert_clean(sink, pg, maria)


@pytest.mark.core
def test_foreach_batch_multi_replayed_micro_batch_writes_nothing(spark, pg, maria, sink):  # type: ignore[no-untyped-def]
    orders, _, events = three_tables(pg, maria)
    fn = into_both(sink, pg, orders, maria, events)
    first = fn(frame(spark, range(4), 2), 0)
    assert first is not None and not first.skipped and first.rows == 8
    again = fn(frame(spark, range(4), 2), 0)  # Spark replays batch 0 after a crash before its commit file
    assert again is not None and again.skipped
    fn(frame(spark, range(4, 6), 2), 1)
    assert rows(pg, orders) == expected(range(6)) and rows(maria, events) == expected(range(6))
    assert_clean(sink, pg, maria)


def test_recovery_during_the_block_leaves_the_live_transaction_alone(spark, pg, maria, sink):  # type: ignore[no-untyped-def]
    orders, _, events = three_tables(pg, maria)
    with xasink.transaction(sink_id=sink, batch_id=8, journal_url=pg.url) as tx:
        tx.write(frame(spark, range(10), 2), pg.url, orders)
        tx.write(frame(spark, range(4), 2), maria.url, events)
        before = (sorted(pg.prepared(sink)), sorted(maria.prepared(sink)))
        assert len(before[0]) == 2 and len(before[1]) == 2
        # a cron recover of each database, from the log's side and against the log: the guard is held
        admin.recover(pg.url, older_than_s=0)
        admin.recover(maria.url, journal_url=pg.url, older_than_s=0)
        assert (sorted(pg.prepared(sink)), sorted(maria.prepared(sink))) == before
    assert rows(pg, orders) == expected(range(10)) and rows(maria, events) == expected(range(4))
    # a single-table write of the same (sink, batch) is not a replay of the transaction: refused
    with pytest.raises(xasink.BatchIdentityError):
        xasink.write(frame(spark, range(10), 2), pg.url, orders, sink_id=sink, batch_id=8)
    assert rows(pg, orders) == expected(range(10))
    assert_clean(sink, pg, maria)


def test_a_database_restarted_between_prepare_and_commit(spark, pg_server, pg, maria, sink):  # type: ignore[no-untyped-def]
    if pg_server is None:
        pytest.skip("restarts the database: needs the embedded server, not XASINK_TEST_PG_URL")
    orders, lines, events = three_tables(pg, maria)
    with xasink.transaction(sink_id=sink, batch_id=9, journal_url=maria.url) as tx:
        tx.write(frame(spark, range(10), 2), pg.url, orders)
        tx.write(frame(spark, range(100, 104), 2), maria.url, events)
        tx.write(frame(spark, range(100, 120), 2), pg.url, lines)
        before = sorted(pg.prepared(sink))
        pg_server.restart()  # prepared branches survive; every connection to it is gone
        assert sorted(pg.prepared(sink)) == before
    assert rows(pg, orders) == expected(range(10)) and rows(pg, lines) == expected(range(100, 120))
    assert rows(maria, events) == expected(range(100, 104))
    assert_clean(sink, pg, maria)


def test_the_run_guard_is_taken_again_after_the_log_database_restarts(  # type: ignore[no-untyped-def]
    spark, pg_server, pg, maria, sink, monkeypatch
):
    """A restart of the log's database drops the transaction's guard; once the grace period is over (here at
    once) a free guard means a dead run, so the next write's pre-flight recovery would roll back the earlier
    writes' branches unless the transaction took its guard again."""
    if pg_server is None:
        pytest.skip("restarts the database: needs the embedded server, not XASINK_TEST_PG_URL")
    monkeypatch.setattr(liveness, "RESTART_GRACE_S", 0.0)
    orders, lines, events = three_tables(pg, maria)
    with xasink.transaction(sink_id=sink, batch_id=12, journal_url=pg.url) as tx:
        tx.write(frame(spark, range(10), 2), pg.url, orders)
        tx.write(frame(spark, range(100, 104), 2), maria.url, events)
        before = sorted(pg.prepared(sink))
        pg_server.restart()  # the guard's session is gone; prepared branches survive
        assert sorted(pg.prepared(sink)) == before
        tx.write(frame(spark, range(100, 120), 2), pg.url, lines)  # its pre-flight recovers the sink in PostgreSQL
        assert set(before) <= set(pg.prepared(sink))
    assert rows(pg, orders) == expected(range(10)) and rows(pg, lines) == expected(range(100, 120))
    assert rows(maria, events) == expected(range(100, 104))
    assert_clean(sink, pg, maria)


def test_foreach_batch_multi_in_a_stream_replayed_by_spark_writes_nothing_anywhere(  # type: ignore[no-untyped-def]
    spark, pg, maria, sink, tmp_path
):
    stream = Stream(spark, tmp_path, pg.url)
    orders, events = pg.new_table(), maria.new_table()  # created by the first write, dropped after the test
    calls: list[int] = []
    fn = into_both(sink, pg, orders, maria, events, calls)

    def run() -> None:
        stream.foreach_batch(fn, partitions=2).awaitTermination()

    stream.add_files(2)
    run()
    stream.forget_spark_commit(1)  # a crash after our commit, before Spark's: Spark replays batch 1
    with no_branch_opened(stream, 1):
        run()
    assert calls == [0, 1, 1]
    want = [(i,) for i in range(2 * ROWS)]
    assert sorted(pg.rows(orders)) == want and sorted(maria.rows(events)) == want
    assert_clean(sink, pg, maria)


def test_foreach_batch_multi_refuses_a_reset_checkpoint(spark, pg, maria, sink):  # type: ignore[no-untyped-def]
    orders, _, events = three_tables(pg, maria)
    fn = into_both(sink, pg, orders, maria, events)
    fn(frame(spark, range(4), 2), 0)
    fn(frame(spark, range(4, 8), 2), 1)
    with pytest.raises(xasink.OptionError, match="has already decided batch 1, but Spark is committing batch 0"):
        fn(frame(spark, range(100, 104), 2), 0)  # a new checkpoint starts again at 0: not a replay of the old batch 0
    assert rows(pg, orders) == expected(range(8)) and rows(maria, events) == expected(range(8))
    assert_clean(sink, pg, maria)


@pytest.mark.core
def test_cli_status_lists_the_targets_and_recover_takes_journal_url(  # type: ignore[no-untyped-def]
    spark, pg, maria, sink, capsys
):
    from xasink.ops import cli

    orders, _, events = three_tables(pg, maria)
    with xasink.transaction(sink_id=sink, batch_id=12, journal_url=pg.url) as tx:
        tx.write(frame(spark, range(3), 2), pg.url, orders)
        tx.write(frame(spark, range(2), 2), maria.url, events)
    capsys.readouterr()
    assert cli.main(["status", "--url", pg.url, "--sink-id", sink]) == 0
    out = capsys.readouterr().out
    assert f".{orders}@postgresql://" in out and f".{events}@mysql://" in out
    code = cli.main(["recover", "--url", maria.url, "--journal-url", pg.url, "--sink-id", sink, "--older-than", "0s"])
    assert code == 0
    # a journal URL's password is never printed, even when its database cannot be reached
    code = cli.main(["status", "--url", maria.url, "--journal-url", "postgresql://etl:s3cret-pw@127.0.0.1:1/x"])
    captured = capsys.readouterr()
    assert code == 3 and "s3cret-pw" not in captured.out + captured.err
    assert_clean(sink, pg, maria)


def test_a_write_refused_for_its_options_and_caught_still_fails_the_block(spark, pg, maria, sink):  # type: ignore[no-untyped-def]
    orders, lines, _ = three_tables(pg, maria)
    with (
        pytest.raises(xasink.BatchAbortedError),
        xasink.transaction(sink_id=sink, batch_id=2, journal_url=pg.url) as tx,
    ):
        tx.write(frame(spark, range(10), 2), pg.url, orders)
        with pytest.raises(xasink.OptionError):
            tx.write(frame(spark, range(10, 20), 2), pg.url, lines, batchId=3)  # the user's function swallows it
    assert rows(pg, orders) == [] and rows(pg, lines) == []
    assert_clean(sink, pg, maria)


def test_a_write_failed_before_the_log_was_reached_and_caught_still_fails_the_block(spark, pg, maria, sink):  # type: ignore[no-untyped-def]
    orders, _, events = three_tables(pg, maria)

    def swallowing(df: DataFrame, epoch_id: int, tx: Any) -> None:
        try:  # the log's database is unreachable: the write fails before the transaction's coordinator exists
            tx.write(df, pg.url, orders)
        except Exception:  # noqa: BLE001 - the user's function swallows it
            pass

    fn = xasink.foreach_batch_multi(swallowing, sink_id=sink, journal_url="postgresql://etl:pw@127.0.0.1:1/x")
    with pytest.raises(xasink.BatchAbortedError):  # else Spark would commit the micro-batch with no row written
        fn(frame(spark, range(4), 2), 0)
    assert rows(pg, orders) == [] and rows(maria, events) == []
    assert_clean(sink, pg, maria)


def test_without_journal_url_a_transaction_over_two_databases_is_refused_at_its_second_database(  # type: ignore[no-untyped-def]
    spark, pg, maria, sink
):
    """FOUND.md 5: without journal_url the log would be the first write's database, chosen by the order of
    writes, and two runs in the other order would each decide the batch in their own log (written twice).
    The write reaching a second database is refused before it does anything; the first write is rolled back."""
    orders, events = pg.new_table(), maria.new_table()
    pg.keyed_table(orders, primary_key=False)
    maria.keyed_table(events, primary_key=False)
    for first, second, batch in (((pg, orders), (maria, events), 0), ((maria, events), (pg, orders), 1)):
        with pytest.raises(xasink.OptionError, match="Pass journal_url"):
            with xasink.transaction(sink_id=sink, batch_id=batch) as tx:
                tx.write(frame(spark, range(4), 2), first[0].url, first[1])
                tx.write(frame(spark, range(4), 2), second[0].url, second[1])
        assert rows(pg, orders) == [] and rows(maria, events) == []
        assert_clean(sink, pg, maria)
        for t in (pg, maria):
            if t.table_exists("xasink_batches"):
                assert t.execute("SELECT count(*) FROM xasink_batches WHERE sink_id = %s", sink) == [(0,)]
    # several tables of one database need no journal_url: the log is that database
    lines = pg.new_table()
    pg.keyed_table(lines, primary_key=False)
    with xasink.transaction(sink_id=sink, batch_id=2) as tx:
        tx.write(frame(spark, range(4), 2), pg.url, orders)
        tx.write(frame(spark, range(10, 12), 2), pg.url, lines)
    assert rows(pg, orders) == expected(range(4)) and rows(pg, lines) == expected(range(10, 12))
    assert_clean(sink, pg, maria)
