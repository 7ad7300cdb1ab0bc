"""A Structured Streaming job the crash tests run as a subprocess and kill.

It reads a replayable file source (JSON files, one per micro-batch), and writes the rows into the
database of ``--url`` (PostgreSQL or MariaDB/MySQL; the plain baseline PostgreSQL only) with one of
three writers:

* ``source``: ``writeStream.format("xasink")`` (the streaming Arrow writer);
* ``foreach``: ``foreachBatch(xasink.foreach_batch(...))``;
* ``plain``: the usual hand-made ``foreachBatch`` without xasink: each partition inserts its rows with
  psycopg2 and commits on its own.  It is the baseline the tests show losing exactly-once.  It passes
  through the same named fault points where they mean the same moment: ``driver.after_first_commit``
  after one partition committed, ``driver.after_mark`` after all committed and before Spark's commit log.

``trigger(availableNow=True)``: the job exits on its own once every file is processed.  Before the
SparkSession exists it puts its process group in ``XASINK_FAULT_PGID``, so a fault point reached in any
Python worker takes the whole job down at once (driver, JVM, workers), like a crashed machine.  Faults
come from the environment (``XASINK_FAULT``), set by the test.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


def _plain_partition(url: str, table: str, batch_id: int) -> Any:
    """The per-partition insert of the baseline: one ordinary transaction per partition."""

    def insert(rows: Iterator[Any]) -> None:
        import psycopg2
        from psycopg2 import sql
        from pyspark import TaskContext

        from tests.targets import libpq_url
        from xasink.support import faults

        ids = [(r["id"],) for r in rows]
        if not ids:
            return
        ctx = TaskContext.get()
        partition = ctx.partitionId() if ctx is not None else 0
        conn = psycopg2.connect(libpq_url(url))
        try:
            with conn.cursor() as cur:
                cur.executemany(sql.SQL("INSERT INTO {} (id) VALUES (%s)").format(sql.Identifier(table)), ids)
            conn.commit()
        finally:
            conn.close()
        faults.fault("driver.after_first_commit", partition=partition, batch=batch_id)

    return insert


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=("source", "foreach", "plain"), default="source")
    parser.add_argument("--input", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--url", required=True)
    parser.add_argument("--table", required=True)
    parser.add_argument("--sink-id", required=True)
    parser.add_argument("--partitions", type=int, default=3)
    args = parser.parse_args(argv)
    if args.mode == "plain" and "postgres" not in args.url.split("://", 1)[0]:
        parser.error("--mode=plain writes with psycopg2: it needs a PostgreSQL --url")

    from tests.jvm import driver_java_options, local_spark, start_killable_driver

    start_killable_driver()

    from pyspark.sql import DataFrame

    import xasink
    from xasink.support import faults

    spark = local_spark(
        "xasink-stream-driver",
        java_options=driver_java_options(),
        conf={"spark.sql.shuffle.partitions": str(args.partitions)},
    )
    if args.mode == "source":  # format("xasink"): Spark 4.0+ (foreach_batch needs no registration)
        xasink.register(spark)

    stream = (
        spark.readStream.schema("id LONG").option("maxFilesPerTrigger", 1).json(args.input).repartition(args.partitions)
    )
    writer = stream.writeStream.option("checkpointLocation", args.checkpoint).trigger(availableNow=True)
    if args.mode == "source":
        writer = (
            writer.format("xasink")
            .option("url", args.url)
            .option("dbtable", args.table)
            .option("sinkId", args.sink_id)
            .outputMode("append")
        )
    elif args.mode == "foreach":
        writer = writer.foreachBatch(xasink.foreach_batch(url=args.url, table=args.table, sink_id=args.sink_id))
    else:
        url, table = args.url, args.table

        def plain_batch(df: DataFrame, batch_id: int) -> None:
            df.foreachPartition(_plain_partition(url, table, batch_id))
            faults.fault("driver.after_mark", batch=batch_id)  # all committed, before Spark's commit log

        writer = writer.foreachBatch(plain_batch)

    query = writer.start()
    query.awaitTermination()
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
