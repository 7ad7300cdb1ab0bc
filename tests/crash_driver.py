"""One batch ``xasink.write`` in a fresh local Spark driver, for tests/test_crash.py to kill at a fault point.

    python tests/crash_driver.py URL TABLE SINK_ID BATCH_ID ROWS PARTITIONS [--direct | --worker [--format]]

Writes ids 0..ROWS-1 (int ``id``, text ``name`` = 'n<id>') in PARTITIONS contiguous partitions, the same
rows as ``tests.harness.frame(spark, range(N), PARTITIONS)``.  The fault comes from the environment
(``XASINK_FAULT``, set by the test).  Before the SparkSession exists the script puts its process group in
``XASINK_FAULT_PGID``, so a fault point reached in the data source's driver-side Python worker takes the
whole driver down at once (this Python, the JVM, the worker), like a crashed machine.  On success it
prints the WriteResult as JSON.

``--direct``: the same batch without Spark, in this one process: each partition written by
``write_partition`` as a task would, then ``Coordinator.commit`` as the driver does.  A driver killed this
way leaves exactly what a killed Spark driver leaves, without a JVM to start (seconds, not tens of them).

``--worker``: only the process reaching the fault point dies (no ``XASINK_FAULT_PGID``): the Python worker
that runs the data source's commit, while the user's script lives on.  The script prints what the user
was told as ``TOLD <json>``: the result, or the error's class and message (``--format``: the write is
``df.write.format("xasink")`` under ``xasink.spark_errors()``).
"""

from __future__ import annotations

import json
import logging
import os
import sys
from typing import Any

OPTIONS_ENV = "XASINK_TEST_WRITE_OPTIONS"  # --direct: a JSON object of extra write options
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


def direct(url: str, table: str, sink_id: str, batch_id: int, n: int, partitions: int) -> int:
    """The write without Spark: the executor side partition by partition, then the driver side."""
    import pyarrow as pa

    from tests.modes_driver import write_branches
    from xasink.options import parse_options
    from xasink.protocol.coordinator import Coordinator
    from xasink.protocol.liveness import InProcessGuard
    from xasink.write_modes.schema import plan_target

    schema = pa.schema([pa.field("id", pa.int32(), nullable=False), ("name", pa.string())])
    extra = json.loads(os.environ.get(OPTIONS_ENV, "{}"))  # more write options, e.g. journalTablePrefix
    opts = parse_options({"url": url, "dbtable": table, "sinkId": sink_id, "batchId": batch_id, **extra})
    coordinator = Coordinator(opts)
    try:
        coordinator.preflight(partitions)
        with coordinator.dialect.connect() as conn:
            plan = plan_target(coordinator.dialect, conn, opts, schema)
            conn.commit()
        per = n // partitions
        # this process is the driver: it holds the run guard itself, as a Spark driver's keeper does
        guard = InProcessGuard(coordinator.dialect, coordinator.journal.log_id())
        batches = []
        for p in range(partitions):
            ids = list(range(p * per, n if p == partitions - 1 else (p + 1) * per))
            batches.append(pa.RecordBatch.from_pydict({"id": ids, "name": [f"n{i}" for i in ids]}, schema=schema))
        result = coordinator.commit(batch_id, write_branches(opts, plan, batch_id, batches, guard.name))
        guard.close()
    finally:
        coordinator.close()
    print(json.dumps({"rows": result.rows, "branches": result.branches, "skipped": result.skipped}), flush=True)
    return 0


def told(spark: Any, url: str, table: str, sink_id: str, batch_id: int, n: int, partitions: int, way: str) -> int:
    """--worker: the write, and what the user is told of it."""
    import xasink

    xasink.register(spark)
    df = spark.range(0, n, 1, partitions).selectExpr("cast(id as int) as id", "concat('n', id) as name")
    said: dict[str, Any] = {"result": None}
    try:
        if way == "format":
            with xasink.spark_errors():
                writer = df.write.format("xasink").option("url", url).option("dbtable", table)
                writer.option("sinkId", sink_id).option("batchId", batch_id).mode("append").save()
        else:
            result = xasink.write(df, url, table, sink_id=sink_id, batch_id=batch_id)
            said["result"] = {"rows": result.rows, "branches": result.branches, "skipped": result.skipped}
    except Exception as exc:  # noqa: BLE001 - what the user is told is the output
        said = {"error": type(exc).__name__, "message": str(exc)[:3000], "xasink": isinstance(exc, xasink.XasinkError)}
    print("TOLD " + json.dumps(said), flush=True)
    return 0


def main(argv: list[str]) -> int:
    spark_free = "--direct" in argv
    worker = "--worker" in argv
    way = "format" if "--format" in argv else "write"
    argv = [a for a in argv if a not in ("--direct", "--worker", "--format")]
    if len(argv) != 6:
        print(__doc__, file=sys.stderr)
        return 2
    url, table, sink_id, batch_id, n, partitions = argv[0], argv[1], argv[2], int(argv[3]), int(argv[4]), int(argv[5])
    if spark_free:
        logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        return direct(url, table, sink_id, batch_id, n, partitions)

    from tests.jvm import driver_java_options, local_spark, start_killable_driver

    start_killable_driver()
    if worker:  # only the process at the fault point dies
        del os.environ["XASINK_FAULT_PGID"]

    import xasink

    spark = local_spark("xasink-crash-driver", java_options=driver_java_options())
    try:
        if worker:
            return told(spark, url, table, sink_id, batch_id, n, partitions, way)
        df = spark.range(0, n, 1, partitions).selectExpr("cast(id as int) as id", "concat('n', id) as name")
        result = xasink.write(df, url, table, sink_id=sink_id, batch_id=batch_id)
        print(json.dumps({"rows": result.rows, "branches": result.branches, "skipped": result.skipped}), flush=True)
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
