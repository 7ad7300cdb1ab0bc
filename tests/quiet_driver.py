"""A clean run of each way to write with xasink, in a fresh local Spark driver, for tests/test_quiet.py.

    python -W default tests/quiet_driver.py URL WORKDIR BATCH_TABLE WRITE_TABLE STREAM_TABLE FOREACH_TABLE

Writes the ids 0..ROWS-1 (``id``, ``name`` = 'n<id>') four times: a batch ``df.write.format("xasink")``
into BATCH_TABLE, ``xasink.write`` into WRITE_TABLE, and two micro-batches (JSON files under WORKDIR, read
with ``trigger(availableNow=True)``) through ``writeStream.format("xasink")`` into STREAM_TABLE and
``foreachBatch(xasink.foreach_batch(...))`` into FOREACH_TABLE.  The test reads this process's stderr,
where the Python workers' warnings land too (as they do in a user's terminal), and fails on any warning.
"""

from __future__ import annotations

import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

ROWS = 40


def main(argv: list[str]) -> int:
    if len(argv) != 6:
        print(__doc__, file=sys.stderr)
        return 2
    url, workdir, batch_table, write_table, stream_table, foreach_table = argv
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

    import xasink
    from tests.jvm import driver_java_options, local_spark

    spark = local_spark(
        "xasink-quiet-driver", java_options=driver_java_options(), conf={"spark.sql.shuffle.partitions": "2"}
    )
    xasink.register(spark)

    df = spark.createDataFrame([(i, f"n{i}") for i in range(ROWS)], "id INT, name STRING").repartition(2)
    df.write.format("xasink").option("url", url).option("dbtable", batch_table).mode("append").save()
    result = xasink.write(df, url, write_table, sink_id=f"quiet-{write_table}", batch_id=1, numPartitions=2)

    source = os.path.join(workdir, "input")
    os.makedirs(source, exist_ok=True)
    half = ROWS // 2
    for n, ids in enumerate((range(half), range(half, ROWS))):  # two files: two micro-batches
        with open(os.path.join(source, f"part-{n}.json"), "w") as f:
            f.writelines(json.dumps({"id": i, "name": f"n{i}"}) + "\n" for i in ids)
    for table, mode in ((stream_table, "source"), (foreach_table, "foreach")):
        stream = spark.readStream.schema("id INT, name STRING").option("maxFilesPerTrigger", 1).json(source)
        writer = stream.writeStream.option("checkpointLocation", os.path.join(workdir, f"chk-{mode}"))
        writer = writer.trigger(availableNow=True)
        if mode == "source":
            writer = writer.format("xasink").option("url", url).option("dbtable", table)
            writer = writer.option("sinkId", f"quiet-{table}").outputMode("append")
        else:
            writer = writer.foreachBatch(xasink.foreach_batch(url=url, table=table, sink_id=f"quiet-{table}"))
        writer.start().awaitTermination()
    spark.stop()
    print(json.dumps({"rows": result.rows, "skipped": result.skipped}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
