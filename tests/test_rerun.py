"""A rerun of a committed batch costs a log read, not a Spark job, and says what was committed earlier.

``xasink.write`` and ``xasink.foreach_batch`` know on the driver that the batch is committed: they return before
any Spark job (counted by Spark's own status tracker, in a job group of the test's), with ``skipped`` and
``earlier`` (what the earlier run committed, when, by which run); this run's ``rows`` and ``branches`` are 0.  A
committed (sink, batch) aimed at another table is still refused, before a job too.  ``format("xasink")`` must run
Spark's job, but its tasks write nothing and return at once.  On PostgreSQL and MariaDB.
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest
from pyspark.sql import SparkSession

import xasink
from tests.doc_cases import raises
from tests.harness import expected, frame, spark_jobs
from tests.targets import Target
from xasink.protocol.xid import Xid
from xasink.support.faults import LOCAL_PROPERTY

pytestmark = [pytest.mark.spark]


def login(db: Target) -> dict[str, Any]:
    return {"password": db.password} if db.password is not None else {}


def test_a_rerun_of_a_committed_batch_starts_no_job_and_reports_the_earlier_commit(
    spark: SparkSession, db: Target
) -> None:
    table, other, sink = db.new_table(), db.new_table(), f"r{uuid.uuid4().hex[:8]}"
    with spark_jobs(spark) as jobs:
        first = xasink.write(frame(spark, range(40), 2), db.url, table, sink_id=sink, batch_id=7, **login(db))
    assert jobs, "the first write ran a Spark job (the counter works)"
    assert (first.rows, first.branches, first.skipped, first.earlier) == (40, 2, False, None)
    decision = db.decision(sink, 7)
    assert decision is not None
    runs = {x.run for x in (Xid.parse(g) for g in decision.xids) if x is not None}

    with spark_jobs(spark) as jobs:
        again = xasink.write(frame(spark, range(1000, 1040), 3), db.url, table, sink_id=sink, batch_id=7, **login(db))
    assert jobs == []
    assert (again.sink_id, again.batch_id, again.skipped) == (sink, 7, True)
    assert (again.rows, again.branches) == (0, 0)  # this run wrote nothing
    assert set(again.timings) == {"total"}  # this run's: a log read
    earlier = again.earlier
    assert earlier is not None and (earlier.rows, earlier.branches) == (40, 2)
    assert {earlier.run} == runs
    assert earlier.committed_at is not None and earlier.decided_at is not None
    assert earlier.decided_at <= earlier.committed_at
    for at in (earlier.decided_at, earlier.committed_at):  # alike on both databases: aware UTC, whole seconds
        assert at.utcoffset() == timedelta(0) and at.microsecond == 0, at
    assert set(earlier.timings) == {"prepare", "commit"}
    text = str(again)
    assert "skipped, nothing written" in text and "committed earlier" in text and f"by run {earlier.run}" in text
    assert "40 rows in 2 branches" in text

    # the same batch aimed at another table: refused, and before any job too
    with spark_jobs(spark) as jobs, raises(xasink.BatchIdentityError):
        xasink.write(frame(spark, range(40), 2), db.url, other, sink_id=sink, batch_id=7, **login(db))
    assert jobs == []
    assert db.rows(table) == expected(range(40)) and not db.table_exists(other)

    # foreach_batch: a replayed micro-batch is the same log read (Spark calls the function with its id)
    write_batch = xasink.foreach_batch(db.url, table, f"{sink}fb", **login(db))
    assert write_batch(frame(spark, range(100, 110), 2), 0).rows == 10
    with spark_jobs(spark) as jobs:
        replay = write_batch(frame(spark, range(100, 110), 2), 0)
    assert jobs == [] and replay.skipped and replay.earlier is not None and replay.earlier.rows == 10
    assert db.rows(table) == expected(range(40), range(100, 110))
    assert db.prepared(sink) == [] and db.prepared(f"{sink}fb") == []


def test_a_rerun_through_the_format_api_writes_nothing_and_opens_no_branch(spark: SparkSession, db: Target) -> None:
    """Spark runs the job of a DataFrameWriter whatever the source says (and computes the rows its plan reads:
    the JVM feeds them to the tasks), but the tasks of a committed batch return at once: no branch, no row
    loaded, no read of the decision log per task (a fault point before any load would fail the job)."""
    table, sink = db.new_table(), f"r{uuid.uuid4().hex[:8]}"
    df = frame(spark, range(40), 4)
    writer = df.write.format("xasink").option("url", db.url).option("dbtable", table).options(**login(db))
    writer.option("sinkId", sink).option("batchId", 3).mode("append").save()
    assert db.rows(table) == expected(range(40))
    ctx = spark.sparkContext
    ctx.setLocalProperty(LOCAL_PROPERTY, "task.before_load:raise")
    try:
        writer.option("sinkId", sink).option("batchId", 3).mode("append").save()
    finally:
        ctx.setLocalProperty(LOCAL_PROPERTY, None)  # type: ignore[arg-type]
    assert db.rows(table) == expected(range(40)) and db.prepared(sink) == []
    decision = db.decision(sink, 3)
    assert decision is not None and decision.state == "committed" and len(decision.xids) == 4
