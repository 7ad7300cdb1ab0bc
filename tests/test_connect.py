"""xasink under Spark Connect: a local Connect server (``remote("local[2]")``), PostgreSQL and MariaDB.

Connect has no ``df.rdd`` and no JVM in the client: every entry point must get by with DataFrame calls.
Each test checks the exact row set, the decision log and that nothing of ours is left prepared.

One Connect session serves the module.  Its server runs on a classic SparkContext in this process, which
PySpark refuses while the classic ``spark`` fixture's session runs: the fixture stops that one first
(the ``spark`` fixture starts it again, tests/jvm.py ``classic_spark``, for the next module that asks).
The server listens on a free port, not Connect's fixed 15002, so two test runs on one machine do not meet.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession

import xasink
from tests.doc_cases import raises
from tests.harness import expected, frame
from tests.jvm import local_spark, stop_classic_spark, stop_connect_spark
from tests.targets import MARIADB, POSTGRESQL, Target, make_target
from xasink.spark.streams import is_connect

try:
    import grpc  # noqa: F401 - the Connect client's transport
except ImportError:  # CI installs the test extra, which has it: missing there is a failure, not a skip
    if os.environ.get("CI") == "true":
        raise
    pytest.skip("Spark Connect needs the 'connect' extra: pip install -e '.[connect]'", allow_module_level=True)
# Each case on one database (both with --soak): what differs here is the way into Spark, the same for both
# dialects, whose database side the classic session's tests cover on both.  A case run first on a cold server
# failed as its foreachBatch worker did not connect back in time (2026-11-28): the session warms that worker up.
pytestmark = [pytest.mark.spark, pytest.mark.one_database]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def connect() -> Iterator[SparkSession]:
    """A Spark Connect session on a local server; the server's Python workers import xasink (PYSPARK_PYTHON)."""
    from pyspark.sql.connect.client.core import DefaultChannelBuilder

    # the server inherits this process's environment: its Python workers import the installed PySpark
    os.environ["XASINK_WORKER_PYTHON"] = sys.executable
    os.environ["PYSPARK_PYTHON"] = str(Path(__file__).resolve().parent / "site_python.sh")
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    stop_classic_spark()
    port = _free_port()
    with pytest.MonkeyPatch.context() as mp:  # the client of remote("local") dials the default port
        mp.setattr(DefaultChannelBuilder, "default_port", staticmethod(lambda: port))
        conf = {
            "spark.connect.grpc.binding.address": "127.0.0.1",
            "spark.connect.grpc.binding.port": str(port),
            "spark.sql.shuffle.partitions": "4",
            # the Python workers of Spark's daemon: on two busy cores their start can pass the default 15 s
            # (a foreachBatch function's worker connects back within Spark's fixed 10 s: start_foreach_batch)
            "spark.python.authenticate.socketTimeout": "120s",
        }
        session = local_spark(None, remote=True, conf=conf, log_level=None)
    assert is_connect(session), type(session)
    xasink.register(session)
    try:
        warm_up_foreach_batch(session)
        yield session
    finally:
        for q in session.streams.active:
            q.stop()
        stop_connect_spark()
        os.environ["PYSPARK_PYTHON"] = sys.executable


def warm_up_foreach_batch(session: SparkSession) -> None:
    """One foreachBatch query that writes nothing: the server's first foreachBatch worker starts (and its imports
    are read from disk) before any test's query, whose worker must connect back within Spark's fixed 10 s."""
    with tempfile.TemporaryDirectory(prefix="xasink-connect-warm-") as root:
        source = Input(Path(root))
        source.add()
        run_foreach_batch(session, source, lambda batch, batch_id: None)


# --------------------------------------------------------------------------- helpers


def new_sink() -> str:
    return f"c{uuid.uuid4().hex[:10]}"


def credentials(db: Target) -> dict[str, Any]:
    return {"password": db.password} if db.password is not None else {}


def assert_committed(db: Target, sink: str, batches: list[int]) -> None:
    decided = db.decisions(sink)
    assert sorted(decided) == batches
    assert all(d.state == "committed" for d in decided.values()), decided
    assert db.prepared(sink) == []


class Input:
    """A directory of JSON files, one per micro-batch (``maxFilesPerTrigger=1``): file k holds ids k*10..k*10+9."""

    def __init__(self, root: Path) -> None:
        self.dir = root / "input"
        self.dir.mkdir()
        self.checkpoint = root / "checkpoint"
        self.files = 0

    def add(self) -> None:
        k = self.files
        tmp = self.dir.parent / f".part-{k}.json"
        tmp.write_text("".join(json.dumps({"id": i, "name": f"n{i}"}) + "\n" for i in range(k * 10, k * 10 + 10)))
        os.utime(tmp, (1_700_000_000 + k, 1_700_000_000 + k))
        tmp.rename(self.dir / f"part-{k}.json")
        self.files += 1

    def stream(self, spark: SparkSession) -> DataFrame:
        return spark.readStream.schema("id INT, name STRING").option("maxFilesPerTrigger", 1).json(str(self.dir))


# --------------------------------------------------------------------------- batch


def test_format_writes_exact_rows_and_a_rerun_writes_nothing(connect: SparkSession, db: Target) -> None:
    table, sink = db.new_table(), new_sink()

    def save(df: DataFrame) -> None:
        w = df.write.format("xasink").option("url", db.url).option("dbtable", table)
        w.options(**credentials(db), sinkId=sink, batchId="3").mode("append").save()

    save(frame(connect, range(30), 3))
    assert db.rows(table) == expected(range(30))
    assert db.decision(sink, 3).branches == 3  # type: ignore[union-attr]
    save(frame(connect, range(100, 130), 2))  # same (sinkId, batchId), other rows: a replay, nothing written
    assert db.rows(table) == expected(range(30))
    assert_committed(db, sink, [3])


def test_errors_of_format_and_a_stream_are_caught_by_their_class(
    connect: SparkSession, db: Target, tmp_path: Path
) -> None:
    """Spark Connect raises its own exception classes; xasink.spark_errors() gives xasink's back, for a batch
    write and a streaming query (a value too long for its column: a BranchError)."""
    table = db.new_table()
    db.create_table(table, "id int, name varchar(3)")
    w = frame(connect, range(1000, 1010), 2).write.format("xasink").option("url", db.url).option("dbtable", table)
    with raises(xasink.BranchError, match="could not be written"), xasink.spark_errors():
        w.options(**credentials(db)).mode("append").save()
    source = Input(tmp_path)
    source.add()
    query = (
        source.stream(connect)
        .selectExpr("id", "concat('n', 1000 + id) as name")
        .writeStream.format("xasink")
        .options(url=db.url, dbtable=table, sinkId=new_sink(), **credentials(db))
        .option("checkpointLocation", str(source.checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    with raises(xasink.BranchError, match="could not be written"), xasink.spark_errors():
        query.awaitTermination()
    assert db.rows(table) == []


def test_write_with_num_partitions(connect: SparkSession, db: Target) -> None:
    table, sink = db.new_table(), new_sink()
    result = xasink.write(
        frame(connect, range(40), 4), db.url, table, sink_id=sink, batch_id=0, numPartitions=2, **credentials(db)
    )
    assert (result.rows, result.branches, result.skipped) == (40, 2, False)
    # more than the DataFrame has: a coalesce never adds partitions
    result = xasink.write(
        frame(connect, range(40, 50), 2), db.url, table, sink_id=sink, batch_id=1, numPartitions=8, **credentials(db)
    )
    assert (result.rows, result.branches, result.skipped) == (10, 2, False)
    again = xasink.write(
        frame(connect, range(40, 50), 2), db.url, table, sink_id=sink, batch_id=1, numPartitions=8, **credentials(db)
    )
    assert again.skipped is True
    assert db.rows(table) == expected(range(50))
    assert_committed(db, sink, [0, 1])


def test_write_with_upsert_keys(connect: SparkSession, db: Target) -> None:
    """Without numPartitions the rows are hash-partitioned by key into spark.sql.shuffle.partitions; with it, into n."""
    table, sink = db.new_table(), new_sink()
    db.keyed_table(table)
    keyed: dict[str, Any] = {"upsertKeyColumns": "id", **credentials(db)}
    first = xasink.write(frame(connect, range(20), 2), db.url, table, sink_id=sink, batch_id=0, **keyed)
    assert (first.rows, first.skipped) == (20, False)
    # ids 10..29 again (10..19 updated, 20..29 new), spread so that equal keys would meet across partitions
    second = xasink.write(
        frame(connect, range(10, 30), 4, "u"), db.url, table, sink_id=sink, batch_id=1, numPartitions=3, **keyed
    )
    assert (second.rows, second.skipped) == (20, False)
    assert second.branches <= 3
    assert db.rows(table) == expected(range(10)) + expected(range(10, 30), tag="u")
    assert_committed(db, sink, [0, 1])


# --------------------------------------------------------------------------- streaming


def run_foreach_batch(connect: SparkSession, source: Input, fn: Any) -> None:
    """Process all of ``source`` (availableNow) through ``foreachBatch(fn)``, until the query ends."""
    writer = (
        source.stream(connect)
        .writeStream.foreachBatch(fn)
        .option("checkpointLocation", str(source.checkpoint))
        .trigger(availableNow=True)
    )
    start_foreach_batch(writer).awaitTermination()


def start_foreach_batch(writer: Any) -> Any:
    """Start a foreachBatch query; again (up to 8 tries over about 4 minutes) if the server's foreachBatch
    worker did not connect back.

    The Connect server starts the function's Python worker when the query starts, and waits 10 s for it to
    connect back: a constant of Spark's (``PythonWorkerFactory.createSimpleWorker``), no setting changes it.
    The worker imports pyspark's Connect client first, which on two cores shared with the rest of the suite
    can take longer (CI, 2026-11-28: twice in a row; a rehearsal on 2026-11-29: five times in 10 s, so the
    waits between tries now grow, to outlast a busy minute).  Nothing has run then: no batch, no branch.
    """
    tries = 8
    for attempt in range(tries):
        try:
            return writer.start()
        except Exception as exc:
            if "failed to connect back" not in str(exc) or attempt == tries - 1:
                raise
            time.sleep(min(2.0 * 2**attempt, 60.0))
    raise AssertionError("unreachable")


def test_foreach_batch_in_a_streaming_query(connect: SparkSession, db: Target, tmp_path: Path) -> None:
    table, sink, source = db.new_table(), new_sink(), Input(tmp_path)
    source.add()
    source.add()
    fn = xasink.foreach_batch(url=db.url, table=table, sink_id=sink, numPartitions=2, **credentials(db))
    run_foreach_batch(connect, source, fn)
    assert db.rows(table) == expected(range(20))
    assert_committed(db, sink, [0, 1])


def test_format_streaming_two_micro_batches(connect: SparkSession, db: Target, tmp_path: Path) -> None:
    table, sink, source = db.new_table(), new_sink(), Input(tmp_path)
    source.add()
    source.add()
    query = (
        source.stream(connect)
        .writeStream.format("xasink")
        .options(url=db.url, dbtable=table, sinkId=sink, **credentials(db))
        .option("checkpointLocation", str(source.checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    assert db.rows(table) == expected(range(20))
    assert_committed(db, sink, [0, 1])
    assert [d.rows for _, d in sorted(db.decisions(sink).items())] == [10, 10]


# --------------------------------------------------------------------------- write modes


def test_overwrite_replace_where_and_change_data(connect: SparkSession, db: Target) -> None:
    table, sink = db.new_table(), new_sink()
    db.create_table(table, "id int PRIMARY KEY, name varchar(20), seq bigint")
    db.execute(f"INSERT INTO {db.q(table)} VALUES (1, 'old', 1), (2, 'old', 1), (50, 'old', 1)")
    opts: dict[str, Any] = {**credentials(db)}
    rows = connect.createDataFrame([(1, "a", 2), (3, "c", 2)], "id int, name string, seq long")
    (
        rows.write.format("xasink")
        .option("url", db.url)
        .option("dbtable", table)
        .options(**opts, sinkId=sink, batchId="0")
        .mode("overwrite")
        .save()
    )
    assert db.rows(table) == [(1, "a", 2), (3, "c", 2)]
    day = connect.createDataFrame([(3, "c3", 3), (4, "d", 3)], "id int, name string, seq long")
    xasink.write(day, db.url, table, sink_id=sink, batch_id=1, mode="overwrite", replaceWhere="id >= 3", **opts)
    assert db.rows(table) == [(1, "a", 2), (3, "c3", 3), (4, "d", 3)]
    changes = connect.createDataFrame(
        [(1, None, 4, True), (4, "d5", 5, False), (3, "stale", 1, False)], "id int, name string, seq long, gone boolean"
    )
    cdc = {"upsertKeyColumns": "id", "deleteFlagColumn": "gone", "sequenceColumn": "seq", **opts}
    xasink.write(changes, db.url, table, sink_id=sink, batch_id=2, **cdc)
    assert db.rows(table) == [(3, "c3", 3), (4, "d5", 5)]
    assert_committed(db, sink, [0, 1, 2])


# --------------------------------------------------------------------------- xasink.transaction()


@pytest.fixture
def both(pg_url: str, mariadb_url: str) -> Iterator[tuple[Target, Target]]:
    """A PostgreSQL and a MariaDB target, for a transaction across the two; their tables dropped afterwards."""
    pg, maria = make_target(POSTGRESQL, pg_url), make_target(MARIADB, mariadb_url)
    try:
        yield pg, maria
    finally:
        pg.cleanup()
        maria.cleanup()


def visible(target: Target, table: str) -> list[tuple[Any, ...]]:
    return target.rows(table) if target.table_exists(table) else []


def test_transaction_two_databases_commit_together(connect: SparkSession, both: tuple[Target, Target]) -> None:
    pg, maria = both
    orders, events, sink = pg.new_table(), maria.new_table(), new_sink()
    with xasink.transaction(sink_id=sink, batch_id=7, journal_url=maria.url) as tx:
        first = tx.write(frame(connect, range(30), 3), pg.url, orders, **credentials(pg))
        tx.write(frame(connect, range(100, 110), 2), maria.url, events)
        # prepared on both, visible on neither
        assert (len(pg.prepared(sink)), len(maria.prepared(sink))) == (3, 2)
        assert visible(pg, orders) == [] and visible(maria, events) == []
    assert (first.rows, first.branches, first.skipped) == (30, 3, False)
    assert pg.rows(orders) == expected(range(30))
    assert maria.rows(events) == expected(range(100, 110))
    assert tx.result is not None and not tx.result.skipped and tx.result.rows == 40
    decided = maria.decision(sink, 7)  # the log is journal_url's; it lists PostgreSQL's branches too
    assert decided is not None and decided.state == "committed" and decided.branches == 5
    assert pg.prepared(sink) == [] and maria.prepared(sink) == []
    # the same transaction again, other rows: a replay writes nothing anywhere
    with xasink.transaction(sink_id=sink, batch_id=7, journal_url=maria.url) as tx:
        tx.write(frame(connect, range(500, 530), 3), pg.url, orders, **credentials(pg))
        tx.write(frame(connect, range(500, 510), 2), maria.url, events)
    assert tx.result is not None and tx.result.skipped
    assert pg.rows(orders) == expected(range(30)) and maria.rows(events) == expected(range(100, 110))
    assert pg.prepared(sink) == [] and maria.prepared(sink) == []


def test_transaction_exception_in_the_block_leaves_nothing(connect: SparkSession, both: tuple[Target, Target]) -> None:
    pg, maria = both
    orders, events, sink = pg.new_table(), maria.new_table(), new_sink()
    pg.keyed_table(orders)
    maria.keyed_table(events)
    with (
        pytest.raises(RuntimeError, match="user code"),
        xasink.transaction(sink_id=sink, batch_id=3, journal_url=maria.url) as tx,
    ):
        tx.write(frame(connect, range(20), 2), pg.url, orders, **credentials(pg))
        tx.write(frame(connect, range(100, 120), 2), maria.url, events, upsertKeyColumns="id")
        assert len(pg.prepared(sink)) == 2 and maria.prepared(sink) != []
        raise RuntimeError("user code failed")
    assert pg.rows(orders) == [] and maria.rows(events) == []
    assert pg.prepared(sink) == [] and maria.prepared(sink) == []
    assert maria.decision(sink, 3) is None


def test_foreach_batch_tells_a_replay_from_another_querys_batch(
    connect: SparkSession, db: Target, tmp_path: Path
) -> None:
    """Connect gives the function no query id: another query's batch 0 under the same sink is refused, not
    skipped; with checkpoint_location the id is read from the checkpoint, and a replay is skipped."""
    table = db.new_table()
    sources = []
    for name in ("a", "b", "a2", "b2"):
        (tmp_path / name).mkdir()
        sources.append(Input(tmp_path / name))
        sources[-1].add()
    a, b, a2, b2 = sources

    def run(source: Input, sink: str, **extra: Any) -> None:
        fn = xasink.foreach_batch(url=db.url, table=table, sink_id=sink, numPartitions=2, **credentials(db), **extra)
        run_foreach_batch(connect, source, fn)

    blind = new_sink()
    run(a, blind)
    assert db.rows(table) == expected(range(10))
    ((recorded,),) = db.execute("SELECT target FROM xasink_batches WHERE sink_id = %s", blind)
    assert json.loads(recorded)["query"] == "unknown", recorded  # matches no query later
    with pytest.raises(Exception, match="BatchIdentityError"):  # noqa: PT011 - query B: a new checkpoint's batch 0
        run(b, blind)
    with pytest.raises(Exception, match="BatchIdentityError"):  # noqa: PT011 - A's batch 0 named no query
        run(b, blind, checkpoint_location=str(b.checkpoint))
    assert db.rows(table) == expected(range(10))
    assert_committed(db, blind, [0])

    sink = new_sink()  # with checkpoint_location: the query id, read from the checkpoint, tells them apart
    run(a2, sink, checkpoint_location=str(a2.checkpoint))
    (a2.checkpoint / "commits" / "0").unlink()  # a crash after our commit, before Spark's: batch 0 again
    (a2.checkpoint / "commits" / ".0.crc").unlink(missing_ok=True)
    run(a2, sink, checkpoint_location=str(a2.checkpoint))  # skipped
    with pytest.raises(Exception, match="BatchIdentityError"):  # noqa: PT011
        run(b2, sink, checkpoint_location=str(b2.checkpoint))
    assert db.rows(table) == sorted(expected(range(10)) * 2)
    assert_committed(db, sink, [0])


def test_format_in_foreach_batch_from_a_pool_thread(connect: SparkSession, pg: Target, tmp_path: Path) -> None:
    """Spark Connect gives the tasks of a write inside foreachBatch neither the micro-batch's id nor its
    query's, in the function's thread or a pool's: they learn from the micro-batch's session that they write
    one.  A sinkId with ``batchId=epoch_id`` is written and recorded with query ``unknown`` (no later write
    passes for its replay); a sinkId without batchId is refused (before: it was written as batch 0, and
    every later micro-batch skipped as its replay).  PostgreSQL only: the refusal is made on the Spark side."""
    source = Input(tmp_path)
    source.add()
    with_id, without_id = pg.new_table(), pg.new_table()
    url, sink = pg.url, new_sink()
    extra = credentials(pg)

    def users_own(df: DataFrame, epoch_id: int) -> None:
        from concurrent.futures import ThreadPoolExecutor

        def save(table: str, sink_id: str, **batch: str) -> None:
            options = {"url": url, "dbtable": table, "sinkId": sink_id, **extra, **batch}
            df.write.format("xasink").options(**options).mode("append").save()

        with ThreadPoolExecutor(1) as pool:
            pool.submit(save, with_id, sink, batchId=str(epoch_id)).result()
            pool.submit(save, without_id, f"{sink}-0").result()

    writer = (
        source.stream(connect)
        .writeStream.foreachBatch(users_own)
        .option("checkpointLocation", str(source.checkpoint))
        .trigger(availableNow=True)
    )
    with pytest.raises(Exception, match="runs inside a streaming micro-batch") as info:  # noqa: PT011
        start_foreach_batch(writer).awaitTermination()
    assert "xasink.foreach_batch" in str(info.value)
    assert pg.rows(with_id) == expected(range(10))
    ((recorded,),) = pg.execute("SELECT target FROM xasink_batches WHERE sink_id = %s", sink)
    assert json.loads(recorded)["query"] == "unknown", recorded
    assert not pg.table_exists(without_id) or pg.rows(without_id) == []
    assert pg.decision(f"{sink}-0", 0) is None
    assert_committed(pg, sink, [0])
