"""Streaming identity whichever thread writes: a foreachBatch function that hands the micro-batch to a pool.

Spark tells a micro-batch's id and its query's id (the local properties ``streaming.sql.batchId`` and
``sql.streaming.queryId``) only to the query's own thread.  A ``ThreadPoolExecutor`` inside
``foreachBatch`` (to write several tables of a micro-batch at once) does not carry them, and xasink took
such a write for a batch job: ``format("xasink")`` with a sinkId and no batchId wrote every micro-batch
as batch 0 (all but the first skipped as its replays), and ``foreach_batch`` / ``foreach_batch_multi``
recorded no query, so a new checkpoint's batch 0 under the same sink id passed for the old query's replay
and was never written.  xasink now learns the query from the micro-batch DataFrame's own session.

PostgreSQL only: which query a write belongs to is found on the Spark side, and the decision log compares
the recorded identity as a string on every database (tests/test_batch_identity.py checks that comparison,
the refusal of a write whose query cannot be known included, on PostgreSQL and MariaDB).
"""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from pyspark import inheritable_thread_target
from pyspark.sql import DataFrame, SparkSession

import xasink
from tests.harness import (
    ROWS,
    Stream,
    checkpoint_query_id,
    decisions,
    expected,
    failure_text,
    frame,
    needs_data_source,
    recorded_target,
)
from tests.targets import Target, prepared_gids

pytestmark = pytest.mark.spark

# a user's pool: made once, its threads outlive the micro-batches (and the queries) they write
POOL = ThreadPoolExecutor(4, thread_name_prefix="user-pool")


def other_input(stream: Stream, root: Path, lo: int) -> None:
    """Point ``stream`` at a new checkpoint and a new input of one file (ids lo..lo+9): another query."""
    stream.checkpoint = root / f"checkpoint-{lo}"
    stream.input = root / f"input-{lo}"
    stream.input.mkdir()
    (stream.input / "part-0000.json").write_text("".join(json.dumps({"id": i}) + "\n" for i in range(lo, lo + 10)))


@pytest.mark.core  # on 4.0, which sets no stateStore.partitions in a query's session, it failed (1 refused of 2)
def test_format_without_batch_id_from_a_pool_thread_is_refused(stream: Stream) -> None:
    """The reproduction: ``format("xasink")`` with a sinkId and no batchId, saved from a pool thread.  Before,
    every ``save()`` returned normally, the query ended cleanly and the table held the first micro-batch
    alone (the others skipped as replays of batch 0).  Refused now, as in the query's own thread: from a
    thread that calls ``xasink.register`` before its write (which ties each running query to its own
    session), and from one whose ``register`` ran before the query started (a pool's initializer), where
    the tasks know the micro-batch's session but not its query.  One micro-batch is enough: before, both
    writes of it succeeded."""
    needs_data_source()
    stream.add_files(1)
    url, table, sink, spark = stream.url, stream.table, stream.sink_id, stream.spark
    early = ThreadPoolExecutor(1, initializer=xasink.register, initargs=(spark,))
    early.submit(lambda: None).result()  # its thread and its register() exist before the query starts
    refusals: list[str] = []

    def save(df: DataFrame, register: bool) -> None:
        if register:
            xasink.register(spark)
        try:
            df.write.format("xasink").option("url", url).option("dbtable", table).option("sinkId", sink).mode(
                "append"
            ).save()
        except Exception as exc:  # noqa: BLE001 - kept for the assertions below
            refusals.append(str(exc))

    def users_own(df: DataFrame, epoch_id: int) -> None:
        early.submit(save, df, False).result()
        POOL.submit(save, df, True).result()

    try:
        stream.foreach_batch(users_own, partitions=1).awaitTermination()  # one task: each refusal fails fast
    finally:
        early.shutdown()
    assert len(refusals) == 2, refusals
    for text in refusals:
        assert "OptionError" in text and "runs inside a streaming micro-batch" in text, text
        assert "xasink.foreach_batch" in text and "Nothing was written" in text
    assert stream.ids() == [] and stream.prepared() == [] and stream.decisions() == {}


def test_pool_threads_write_each_micro_batch_as_their_own_querys(stream: Stream, pg: Target, tmp_path: Path) -> None:
    """``foreach_batch``, ``format("xasink")`` with ``batchId=epoch_id`` and ``foreach_batch_multi``, each
    called from a pool thread, three tables at once.  Query A's batch 0 records A's id; A's replay of it
    writes nothing; query B (a new checkpoint, the same sink ids) is refused by every writer, nothing of it
    written.  Before, the pool threads recorded no query and B's batch 0 was skipped as A's replay: its
    rows never landed and ``foreach_batch`` told ``WriteResult(skipped=True)``."""
    url, spark = stream.url, stream.spark
    tag = stream.sink_id
    tables = {name: pg.new_table() for name in ("each", "fmt", "multi")}  # made by the first write
    sinks = {name: f"{tag}-{name}" for name in tables}
    each = xasink.foreach_batch(url=url, table=tables["each"], sink_id=sinks["each"])

    def into_multi(df: DataFrame, epoch_id: int, tx: Any) -> None:
        tx.write(df, url, tables["multi"])

    multi = xasink.foreach_batch_multi(into_multi, sink_id=sinks["multi"], journal_url=url)

    def fmt(df: DataFrame, epoch_id: int) -> None:
        xasink.register(spark)  # the data source in this thread's session (classic Spark)
        options = {"url": url, "dbtable": tables["fmt"], "sinkId": sinks["fmt"], "batchId": str(epoch_id)}
        df.write.format("xasink").options(**options).mode("append").save()

    results: dict[str, list[Any]] = {name: [] for name in tables}

    def users_own(df: DataFrame, epoch_id: int) -> None:
        futures = {name: POOL.submit(fn, df, epoch_id) for name, fn in [("each", each), ("fmt", fmt), ("multi", multi)]}
        failed = None
        for name, f in futures.items():
            try:
                results[name].append(f.result())
            except Exception as exc:  # noqa: BLE001 - every writer is checked below
                results[name].append(exc)
                failed = failed or exc
        if failed is not None:
            raise failed

    try:
        stream.add_files(1)
        stream.foreach_batch(users_own).awaitTermination()
        query_a = checkpoint_query_id(stream.checkpoint)
        for name in tables:
            assert [r[0] for r in pg.rows(tables[name])] == list(range(ROWS)), name
            assert recorded_target(url, sinks[name], 0).get("query") == query_a, name
        first = results["each"][0]
        assert not first.skipped and first.rows == ROWS

        stream.forget_spark_commit(0)  # a crash after our commit, before Spark's: Spark runs batch 0 again
        stream.foreach_batch(users_own).awaitTermination()
        assert results["each"][1].skipped
        assert results["multi"][1].skipped
        for name in tables:
            assert [r[0] for r in pg.rows(tables[name])] == list(range(ROWS)), name  # the replay wrote nothing

        other_input(stream, tmp_path, 1000)  # query B: another checkpoint, the same sink ids
        text = failure_text(stream.foreach_batch(users_own))
        assert "BatchIdentityError" in text, text
        for name in tables:
            refused = results[name][2]
            assert isinstance(refused, Exception) and "BatchIdentityError" in f"{type(refused)} {refused}", name
            assert f"streaming query {query_a}" in str(refused), (name, str(refused))
            assert [r[0] for r in pg.rows(tables[name])] == list(range(ROWS)), name
            assert sorted(decisions(url, sinks[name])) == [0], name
            assert prepared_gids(url, prefix=f"xasink:{sinks[name]}:") == [], name
    finally:
        for q in spark.streams.active:
            q.stop()


def test_a_batch_job_beside_a_running_stream_stays_a_batch_job(stream: Stream, pg: Target) -> None:
    """A notebook: a query runs (waiting for input) while a batch job of the same session writes with a
    sinkId and no batchId, from the main thread and from a pool thread.  Reruns of it are skipped as
    replays of its batch 0, never refused as a micro-batch, and the batch names no query."""
    spark = stream.spark
    query = stream.frame(1).writeStream.foreachBatch(lambda df, epoch_id: None)
    running = query.option("checkpointLocation", str(stream.checkpoint)).trigger(processingTime="1 second").start()
    try:
        xasink.register(spark)  # ties the running query to its session: the batch job's is another
        table, sink = pg.new_table(), f"{stream.sink_id}-job"
        assert not xasink.write(frame(spark, range(10), 2), pg.url, table, sink_id=sink).skipped

        def rerun() -> None:
            xasink.register(spark)
            frame(spark, range(10), 2).write.format("xasink").option("url", pg.url).option("dbtable", table).option(
                "sinkId", sink
            ).mode("append").save()

        POOL.submit(rerun).result()
        assert xasink.write(frame(spark, range(10), 2), pg.url, table, sink_id=sink).skipped
        assert running.isActive
    finally:
        running.stop()
    assert pg.rows(table) == expected(range(10))
    assert "query" not in recorded_target(pg.url, sink, 0)
    assert sorted(decisions(pg.url, sink)) == [0]


def fmt_write(spark: SparkSession, df: DataFrame, url: str, table: str, sink: str, batch: int) -> None:
    """``format("xasink")`` of a micro-batch with ``batchId``, from a thread of the user's own."""
    xasink.register(spark)
    options = {"url": url, "dbtable": table, "sinkId": sink, "batchId": str(batch)}
    df.write.format("xasink").options(**options).mode("append").save()


def test_a_pool_thread_left_with_another_querys_properties_writes_for_its_micro_batchs_query(
    stream: Stream, pg: Target, tmp_path: Path
) -> None:
    """Two queries at once, one pool thread.  In query A's micro-batch the thread runs a function wrapped by
    PySpark's ``inheritable_thread_target``, which leaves A's local properties on it; then it writes query
    B's micro-batch, unwrapped.  B's batch records B (the query marked on B's session wins over the
    thread's stale properties), A's records A."""
    spark, url = stream.spark, stream.url
    one = ThreadPoolExecutor(1)
    tables, sinks = [pg.new_table(), pg.new_table()], [f"{stream.sink_id}-a", f"{stream.sink_id}-b"]
    (tmp_path / "b").mkdir()
    a, b = stream, Stream(spark, tmp_path / "b", url)
    a.add_files(1)
    b.add_files(1)
    a_wrote, b_wrote = threading.Event(), threading.Event()

    def into_a(df: DataFrame, epoch_id: int) -> None:
        try:
            wrapped = inheritable_thread_target(spark)(lambda: fmt_write(spark, df, url, tables[0], sinks[0], epoch_id))
            one.submit(wrapped).result()
        finally:
            a_wrote.set()
        assert b_wrote.wait(180), "B's micro-batch never wrote"  # A's micro-batch still runs while B writes

    def into_b(df: DataFrame, epoch_id: int) -> None:
        try:
            assert a_wrote.wait(180)
            one.submit(fmt_write, spark, df, url, tables[1], sinks[1], epoch_id).result()
        finally:
            b_wrote.set()

    try:
        query_a, query_b = a.foreach_batch(into_a), b.foreach_batch(into_b)
        query_a.awaitTermination()
        query_b.awaitTermination()
    finally:
        one.shutdown()
    assert recorded_target(url, sinks[0], 0).get("query") == checkpoint_query_id(a.checkpoint)
    assert recorded_target(url, sinks[1], 0).get("query") == checkpoint_query_id(b.checkpoint)
    assert [r[0] for r in pg.rows(tables[1])] == list(range(ROWS))


def test_a_query_started_from_a_querys_session_is_not_taken_for_it(stream: Stream, pg: Target, tmp_path: Path) -> None:
    """Query C is started from query A's own session, which xasink marked with A's id: C's session (Spark's
    clone of it) inherits the mark.  A write in C's thread, before any xasink call could mark C, records
    C: the mark names the session it was made for."""
    spark, url = stream.spark, stream.url
    stream.add_files(1)
    sessions: list[SparkSession] = []

    def keep_session(df: DataFrame, epoch_id: int) -> None:
        xasink.register(spark)  # marks A's session
        sessions.append(df.sparkSession)

    stream.foreach_batch(keep_session).awaitTermination()
    (tmp_path / "c").mkdir()
    c = Stream(spark, tmp_path / "c", url)
    c.add_files(1)
    table, sink = pg.new_table(), f"{stream.sink_id}-c"

    def into_c(df: DataFrame, epoch_id: int) -> None:
        options = {"url": url, "dbtable": table, "sinkId": sink, "batchId": str(epoch_id)}
        df.write.format("xasink").options(**options).mode("append").save()

    source = sessions[0].readStream.schema("id LONG").json(str(c.input))
    writer = source.writeStream.foreachBatch(into_c).option("checkpointLocation", str(c.checkpoint))
    writer.trigger(availableNow=True).start().awaitTermination()
    assert recorded_target(url, sink, 0).get("query") == checkpoint_query_id(c.checkpoint)
