"""Overwrite-mode writes for tests/test_write_modes*.py: in-process without Spark, or a driver to kill.

    python tests/modes_driver.py direct URL TABLE SINK_ID BATCH_ID FIRST COUNT PARTITIONS
    python tests/modes_driver.py batch JSON
    python tests/modes_driver.py batches JSON
    python tests/modes_driver.py stream URL TABLE SINK_ID INPUT_DIR CHECKPOINT_DIR

``direct``: one ``mode("overwrite")`` batch of ids FIRST..FIRST+COUNT-1 (int ``id``, text ``name`` =
'n<id>') in PARTITIONS contiguous branches, without Spark, in this one process: each partition loaded into
the shadow table by ``write_partition`` as a task does, then ``Coordinator.commit(apply=...)`` as the
Spark driver does (the plan comes from the data source's own driver-side ``prepare_write``).  Extra write
options come as a JSON object in ``XASINK_TEST_WRITE_OPTIONS``.  A driver killed at a fault point
(``XASINK_FAULT``) this way leaves what a killed Spark driver leaves, without a JVM start.

``batch``: :func:`batch_direct` with its arguments as one JSON object (``url``, ``table``, ``sink_id``,
``batch_id``, ``columns``, ``partitions``, ``mode``, ``options``): a second driver process (a process holds
one run guard per decision log).

``batches``: as ``batch``, one batch after another in this process, the JSON's ``batches`` (a list of
``[batch_id, partitions]``) instead of ``batch_id`` and ``partitions``: one line per batch, its result or its
error's class and message (a writer of many batches beside other writers).

``stream``: a complete-mode streaming aggregation (``count`` of each ``k`` of the JSON files in
INPUT_DIR, one file per micro-batch) into TABLE with ``format("xasink")``, ``availableNow``.  Before the
SparkSession exists the script puts its process group in ``XASINK_FAULT_PGID``, so a fault point in any
Python worker takes the whole driver down (this Python, the JVM, the workers).
"""

from __future__ import annotations

import json
import logging
import os
import sys
from typing import Any

OPTIONS_ENV = "XASINK_TEST_WRITE_OPTIONS"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


def overwrite_direct(
    url: str,
    table: str,
    sink_id: str,
    batch_id: int,
    partitions: list[list[tuple[int, str]]],
    **options: Any,
) -> Any:
    """One overwrite batch of (id, name) rows, one branch per list, without Spark; returns the WriteResult."""
    columns = {"id": "int", "name": "string"}
    return batch_direct(url, table, sink_id, batch_id, columns, partitions, "overwrite", **options)


def _direct_plan(
    url: str,
    table: str,
    sink_id: str,
    batch_id: int,
    columns: dict[str, str],
    mode: str,
    partitions: int,
    options: dict[str, Any],
) -> Any:
    """The write's options, the data source's own driver-side plan, and the Arrow schema of its rows."""
    import pyarrow as pa
    from pyspark.sql import types as st

    from xasink.options import parse_options
    from xasink.spark.planning import prepare_write

    raw = {"url": url, "dbtable": table, "sinkId": sink_id, "batchId": batch_id, **options}
    opts = parse_options(raw).with_mode(mode)
    types = {
        "int": (st.IntegerType(), pa.int32()),
        "long": (st.LongType(), pa.int64()),
        "string": (st.StringType(), pa.string()),
        "boolean": (st.BooleanType(), pa.bool_()),
        "timestamp_ntz": (st.TimestampNTZType(), pa.timestamp("us")),
    }
    struct = st.StructType([st.StructField(n, types[t][0], n != "id") for n, t in columns.items()])
    arrow = pa.schema([pa.field(n, types[t][1], nullable=n != "id") for n, t in columns.items()])
    return opts, prepare_write(opts, struct, partitions), arrow


def write_branches(opts: Any, target: Any, batch_id: int, batches: list[Any], guard: str, **extra: Any) -> list[Any]:
    """Each Arrow batch written as one partition's branch, as Spark's tasks write them (attempt = partition,
    one run); their outcomes, for ``Coordinator.commit``.  Also tests/crash_driver.py's ``--direct``."""
    from xasink.protocol.partition_writer import write_partition
    from xasink.protocol.xid import new_run_nonce

    run = new_run_nonce()
    return [
        write_partition(
            opts, target, batch_id=batch_id, partition=p, task_attempt_id=p, run=run, batches=[b], guard=guard, **extra
        )
        for p, b in enumerate(batches)
    ]


def batch_direct(
    url: str,
    table: str,
    sink_id: str,
    batch_id: int,
    columns: dict[str, str],
    partitions: list[list[tuple[Any, ...]]],
    mode: str = "overwrite",
    **options: Any,
) -> Any:
    """One batch (a write mode with a shadow: overwrite, change-data or ``visibility="batch"`` with
    ``mode="append"`` and its options; or a plain append), of rows with ``columns`` (name: Spark type), one
    branch per list, without Spark."""
    import pyarrow as pa

    from xasink.protocol.coordinator import Coordinator
    from xasink.protocol.liveness import InProcessGuard

    opts, plan, arrow = _direct_plan(url, table, sink_id, batch_id, columns, mode, len(partitions), options)
    coordinator = Coordinator(opts)
    guard = InProcessGuard(coordinator.dialect, plan.log_id)
    try:
        batches = [
            pa.RecordBatch.from_pydict({n: [r[i] for r in rows] for i, n in enumerate(columns)}, schema=arrow)
            for rows in partitions
        ]
        outcomes = write_branches(opts, plan.target, batch_id, batches, guard.name, log_id=plan.log_id)
        return coordinator.commit(batch_id, outcomes, apply=plan.apply)
    finally:
        guard.close()
        coordinator.close()


def prepare_stray_branch(
    url: str,
    table: str,
    sink_id: str,
    batch_id: int,
    rows: list[tuple[Any, ...]],
    columns: dict[str, str] | None = None,
    mode: str = "overwrite",
    **options: Any,
) -> str:
    """A branch of another run of an overwrite batch (or of ``mode`` with ``columns``, as batch_direct), loaded
    into the shadow and PREPAREd but never decided (a task of a run that lost the batch, still finishing); its
    gid.  Opened as a task opens its branch, without the task's checks, so it can prepare beside a decided batch."""
    import pyarrow as pa

    from xasink.dialects import dialect_for
    from xasink.protocol.xid import Xid, attempt_token, new_run_nonce
    from xasink.write_modes.conform import conform

    columns = columns or {"id": "int", "name": "string"}
    opts, plan, arrow = _direct_plan(url, table, sink_id, batch_id, columns, mode, 1, options)
    assert plan.apply is not None, "a stray branch of a batch that loads the shadow table"
    xid = Xid(plan.log_id, sink_id, batch_id, 0, attempt_token(999, new_run_nonce()))
    batch = pa.RecordBatch.from_pydict({n: [r[i] for r in rows] for i, n in enumerate(columns)}, schema=arrow)
    dialect = dialect_for(opts.url, opts.branch_settings)
    try:
        session = dialect.open_branch(xid, plan.target)
        session.load(iter([conform(batch, plan.target, 0, batch_id, xid.bqual)]))
        session.prepare()
    finally:
        dialect.dispose()
    return xid.gid


def split(first: int, count: int, partitions: int) -> list[list[tuple[int, str]]]:
    """Ids first..first+count-1 as (id, 'n<id>') in contiguous partitions."""
    ids = list(range(first, first + count))
    per = -(-count // partitions) if count else 0
    return [[(i, f"n{i}") for i in ids[p * per : (p + 1) * per]] for p in range(partitions)]


def stream(url: str, table: str, sink_id: str, input_dir: str, checkpoint: str) -> int:
    os.environ["XASINK_FAULT_PGID"] = str(os.getpgid(0))  # before the JVM and its Python workers start
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

    import xasink
    from tests.jvm import driver_java_options, local_spark

    spark = local_spark(
        "xasink-modes-driver", java_options=driver_java_options(), conf={"spark.sql.shuffle.partitions": "2"}
    )
    xasink.register(spark)
    query = complete_query(spark, url, table, sink_id, input_dir, checkpoint)
    query.awaitTermination()
    spark.stop()
    return 0


def complete_query(spark: Any, url: str, table: str, sink_id: str, input_dir: str, checkpoint: str) -> Any:
    """The complete-mode aggregation: one row (k, n) per key seen so far, the whole result each batch."""
    counts = (
        spark.readStream.schema("k string")
        .option("maxFilesPerTrigger", 1)
        .json(input_dir)
        .groupBy("k")
        .count()
        .withColumnRenamed("count", "n")
    )
    return (
        counts.writeStream.outputMode("complete")
        .format("xasink")
        .option("url", url)
        .option("dbtable", table)
        .option("sinkId", sink_id)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("xasink").setLevel(logging.INFO)
    if argv[:1] == ["direct"] and len(argv) == 8:
        url, table, sink_id = argv[1:4]
        batch_id, first, count, partitions = map(int, argv[4:8])
        extra = json.loads(os.environ.get(OPTIONS_ENV, "{}"))
        result = overwrite_direct(url, table, sink_id, batch_id, split(first, count, partitions), **extra)
        print(json.dumps({"rows": result.rows, "branches": result.branches, "skipped": result.skipped}), flush=True)
        return 0
    if argv[:1] == ["batch"] and len(argv) == 2:
        spec = json.loads(argv[1])
        parts = [[tuple(r) for r in p] for p in spec.pop("partitions")]
        result = batch_direct(
            spec.pop("url"),
            spec.pop("table"),
            spec.pop("sink_id"),
            spec.pop("batch_id"),
            spec.pop("columns"),
            parts,
            spec.pop("mode"),
            **spec.pop("options"),
        )
        print(json.dumps({"rows": result.rows, "branches": result.branches, "skipped": result.skipped}), flush=True)
        return 0
    if argv[:1] == ["batches"] and len(argv) == 2:
        spec = json.loads(argv[1])
        for batch_id, partitions in spec.pop("batches"):
            args = (spec["url"], spec["table"], spec["sink_id"], batch_id, spec["columns"])
            try:
                parts = [[tuple(r) for r in p] for p in partitions]
                result = batch_direct(*args, parts, spec["mode"], **spec["options"])
                line: dict[str, Any] = {"batch": batch_id, "rows": result.rows, "skipped": result.skipped}
            except Exception as exc:  # noqa: BLE001 - reported to the test, which asserts on it
                line = {"batch": batch_id, "error": type(exc).__name__, "message": str(exc)}
            print(json.dumps(line), flush=True)
        return 0
    if argv[:1] == ["stream"] and len(argv) == 6:
        return stream(*argv[1:6])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
