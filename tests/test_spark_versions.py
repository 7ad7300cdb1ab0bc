"""One protocol, two ways in (docs/spark-versions.md): what differs between Spark 3.5, 4.0 and 4.1+.

On Spark 3.5 ``xasink.write``, ``foreach_batch`` and ``xasink.transaction`` run the data source's writer
objects over ``mapInArrow`` + ``collect`` (xasink/spark/partition_job.py); on 4.x they go through
``format("xasink")``, and ``XASINK_SPARK_WAY_IN=partitions`` takes the partition function there too, so
the main suite (4.3) covers both ways in.  These tests run in every version suite (``-m core``,
.ci/run): the same rows and values by either way in, empty partitions, the run guard of a driver whose
commit runs in the user's own process, and the register() error of 3.5.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession

import xasink
from tests.harness import CRASH_DRIVER, PARTITIONS, ROWS, N, Stream, failure_text, recorded_target
from tests.leaks import run_cli
from tests.procs import ROOT, state, tail
from tests.targets import Target
from xasink.errors import XasinkError
from xasink.protocol.judgement import WAIT
from xasink.protocol.xid import Xid
from xasink.spark.partition_job import WAY_IN_ENV
from xasink.spark.versions import HAS_DATA_SOURCE

pytestmark = pytest.mark.core

BEFORE_EPOCH = dt.datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=dt.timezone.utc)
WAYS_IN = ["datasource", "partitions"] if HAS_DATA_SOURCE else ["partitions"]


@pytest.fixture(params=WAYS_IN)
def way_in(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each way in this Spark has, chosen for the writes of this process."""
    monkeypatch.setenv(WAY_IN_ENV, request.param)
    return str(request.param)


def test_register_says_which_writers_this_spark_has(spark: SparkSession) -> None:
    """Spark 3.5: ``register`` (the step ``format("xasink")`` needs) fails naming what works; 4.x: it works."""
    if HAS_DATA_SOURCE:
        xasink.register(spark)
        return
    with pytest.raises(XasinkError) as info:
        xasink.register(spark)
    text = str(info.value)
    assert "xasink.write" in text and "foreach_batch" in text and "3.5" in text, text


def typed_frame(spark: SparkSession) -> DataFrame:
    """Six partitions, three of them empty, of values whose conversion differs by path if any does."""
    return spark.createDataFrame(
        [
            (1, "a", dt.datetime(2024, 3, 31, 1, 30, tzinfo=dt.timezone.utc), dt.date(2024, 2, 29), Decimal("12.34")),
            (2, None, None, None, None),
            (
                3,
                "ü€",
                dt.datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=dt.timezone.utc),
                dt.date(1, 1, 1),
                Decimal("-0.01"),
            ),
        ],
        "id int, s string, ts timestamp, d date, amount decimal(10,2)",
    ).repartition(6, "id")  # three rows in six partitions: three or more of them empty


def test_both_ways_in_write_the_same_rows_and_values(spark: SparkSession, db: Target, way_in: str) -> None:
    """The rows, the stored values, one branch per non-empty partition and none for an empty one; a rerun
    of the committed batch writes nothing, whichever way in."""
    table, sink = db.new_table(), f"way-{uuid.uuid4().hex[:8]}"
    df = typed_frame(spark)
    assert df.rdd.getNumPartitions() == 6
    result = xasink.write(df, db.url, table, sink_id=sink, batch_id=1)
    assert (result.rows, result.skipped) == (3, False)
    decided = db.decision(sink, 1)
    assert decided is not None and decided.state == "committed"
    assert result.branches == len(decided.xids) <= 3
    got = db.rows(table, "id")
    assert [r[0] for r in got] == [1, 2, 3]
    assert got[1][1:] == (None, None, None, None)
    first, third = got[0], got[2]
    assert first[1] == "a" and third[1] == "ü€"
    assert _utc(first[2]) == dt.datetime(2024, 3, 31, 1, 30, tzinfo=dt.timezone.utc)
    assert _utc(third[2]) == BEFORE_EPOCH
    assert (first[3], third[3]) == (dt.date(2024, 2, 29), dt.date(1, 1, 1))
    assert (first[4], third[4]) == (Decimal("12.34"), Decimal("-0.01"))

    again = xasink.write(df.where("id = 1"), db.url, table, sink_id=sink, batch_id=1)
    assert again.skipped and again.earlier is not None and again.earlier.rows == 3  # the earlier run's rows
    assert [r[0] for r in db.rows(table, "id")] == [1, 2, 3]
    assert db.prepared(sink) == []


def _utc(value: dt.datetime) -> dt.datetime:
    """A timestamp as the database returns it (PostgreSQL: aware; MariaDB DATETIME: naive, the session's UTC)."""
    return value.astimezone(dt.timezone.utc) if value.tzinfo else value.replace(tzinfo=dt.timezone.utc)


def test_a_sink_without_batch_id_in_a_micro_batch_from_a_pool_thread_is_refused(stream: Stream) -> None:
    """``xasink.write`` with a sink id and no batch id, called from a pool thread inside ``foreachBatch``:
    every micro-batch would be batch 0.  The tasks learn they write a micro-batch from the mark xasink puts
    on the query's own session (Spark 3.5 and 4.0 set nothing of their own there that 4.1+ sets)."""
    stream.add_files(1)
    pool = ThreadPoolExecutor(1)

    def users_own(df: DataFrame, epoch_id: int) -> None:
        pool.submit(xasink.write, df, stream.url, stream.table, sink_id=stream.sink_id).result()

    try:
        text = failure_text(stream.foreach_batch(users_own))
    finally:
        pool.shutdown()
    assert "OptionError" in text and "no batchId" in text, text[:2000]
    assert stream.ids() == [] and stream.decisions() == {} and stream.prepared() == []


def test_foreach_batch_records_the_query_and_refuses_another_querys_batch(stream: Stream, tmp_path: Path) -> None:
    """foreach_batch called from a pool thread records the streaming query's id (found from the micro-batch
    DataFrame's session through Spark internals, which this checks on each Spark); a replay is skipped, a
    new checkpoint's batch 0 under the same sink id is refused, nothing of it written."""
    write = xasink.foreach_batch(url=stream.url, table=stream.table, sink_id=stream.sink_id)
    pool = ThreadPoolExecutor(1)
    told: list[object] = []

    def users_own(df: DataFrame, epoch_id: int) -> None:
        told.append(pool.submit(write, df, epoch_id).result())

    try:
        stream.add_files(1)
        stream.foreach_batch(users_own).awaitTermination()
        query = json.loads((stream.checkpoint / "metadata").read_text().splitlines()[0])["id"]
        assert stream.ids() == list(range(ROWS))
        assert _recorded_query(stream, 0) == query
        stream.forget_spark_commit(0)  # a crash after our commit, before Spark's: batch 0 runs again
        stream.foreach_batch(users_own).awaitTermination()
        assert getattr(told[-1], "skipped", None) is True
        rows = stream.ids()
        stream.checkpoint = tmp_path / "another-checkpoint"  # another query, the same sink id
        text = failure_text(stream.foreach_batch(users_own))
        assert "BatchIdentityError" in text and query in text, text[:2000]
        assert stream.ids() == rows and sorted(stream.decisions()) == [0] and stream.prepared() == []
    finally:
        pool.shutdown()


def _recorded_query(stream: Stream, batch: int) -> str | None:
    return recorded_target(stream.url, stream.sink_id, batch).get("query")


# --------------------------------------------------------------------------- the run guard of the user's process


@pytest.fixture
def stopped_spark_driver(db: Target, tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], str, str, Path]]:
    """tests/crash_driver.py writing through the partition function in a Spark driver of its own, stopped
    (alive) after every branch prepared, before its decision: the coordinator's step runs in the driver's own
    Python there, whose JVM's keeper holds the run guard.  SIGKILLed on the way out."""
    table, sink, log = db.new_table(), f"live-{uuid.uuid4().hex[:6]}", tmp_path / "driver.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("XASINK_FAULT")}
    env.update({"XASINK_FAULT": "driver.before_decide:stop", WAY_IN_ENV: "partitions"})
    env.update({"PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable})
    cmd = [sys.executable, str(CRASH_DRIVER), db.url, table, sink, "3", str(N), str(PARTITIONS)]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            cmd,
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 240
        while len(db.prepared(sink)) < PARTITIONS or state(proc.pid) != "T":
            assert proc.poll() is None and time.monotonic() < deadline, tail(log)
            time.sleep(0.2)
        yield proc, table, sink, log
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_recover_leaves_a_live_partition_function_run_alone(
    db: Target, stopped_spark_driver: tuple[subprocess.Popen[bytes], str, str, Path]
) -> None:
    """A cron'd ``xasink recover`` beside a live driver whose decision runs in the user's process: its
    branches wait, whatever their age (the guard's keeper follows the JVM PySpark started); once the driver
    is killed, they are rolled back at once."""
    proc, table, sink, log = stopped_spark_driver
    branches = sorted(db.prepared(sink))
    report = _recover(db, sink, "0s")
    entries = [e for e in report["entries"] if e["sink_id"] == sink]
    assert {e["gid"] for e in entries} == {x.gid for x in map(Xid.parse, branches) if x}, (entries, tail(log))
    assert all(e["action"] == WAIT for e in entries), entries
    assert sorted(db.prepared(sink)) == branches

    os.killpg(proc.pid, signal.SIGKILL)  # the driver's Python and its JVM: the keeper exits with the JVM
    proc.wait()
    deadline = time.monotonic() + 180  # (a hang, not a timing: a loaded CI is slow)
    while True:  # the keeper notices its JVM is gone within a second, and its session ends with it
        report = json.loads(
            run_cli("recover", "--url", db.url, "--json", "--older-than", "10m", "--sink-id", sink).stdout
        )
        if db.prepared(sink) == [] or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert db.prepared(sink) == [], report
    assert db.rows(table) == []


def _recover(db: Target, sink: str, older_than: str) -> dict[str, Any]:
    """``xasink recover --json`` of one sink, as a cron job runs it."""
    return dict(
        json.loads(run_cli("recover", "--url", db.url, "--json", "--older-than", older_than, "--sink-id", sink).stdout)
    )
