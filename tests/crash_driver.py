"""One batch ``xasink.write`` in a fresh local Spark driver, for tests/test_crash.py to kill at a fault point.

    python tests/crash_driver.py URL TABLE SINK_ID BATCH_ID ROWS PARTITIONS

Writes ids 0..ROWS-1 (int ``id``, text ``name`` = 'n<id>') in PARTITIONS contiguous partitions, the same
rows as ``tests.test_crash.frame``.  The fault comes from the environment (``XASINK_FAULT``, set by the
test).  Before the SparkSession exists the script puts its process group in ``XASINK_FAULT_PGID``, so a
fault point reached in the data source's driver-side Python worker takes the whole driver down at once
(this Python, the JVM, the worker), like a crashed machine.  On success it prints the WriteResult as JSON.
"""

from __future__ import annotations

import json
import logging
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


def main(argv: list[str]) -> int:
    if len(argv) != 6:
        print(__doc__, file=sys.stderr)
        return 2
    url, table, sink_id, batch_id, n, partitions = argv[0], argv[1], argv[2], int(argv[3]), int(argv[4]), int(argv[5])

    os.environ["XASINK_FAULT_PGID"] = str(os.getpgid(0))  # before the JVM and its Python workers start
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("xasink").setLevel(logging.INFO)

    from pyspark.sql import SparkSession

    import xasink

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("xasink-crash-driver")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")  # starts faster
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    try:
        df = spark.range(0, n, 1, partitions).selectExpr("cast(id as int) as id", "concat('n', id) as name")
        result = xasink.write(df, url, table, sink_id=sink_id, batch_id=batch_id)
        print(json.dumps({"rows": result.rows, "branches": result.branches, "skipped": result.skipped}), flush=True)
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
