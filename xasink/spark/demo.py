"""``xasink demo``: a failed write leaves nothing behind, the retry lands every row once.

Starts its own PostgreSQL (local binaries) with prepared transactions
enabled and a local Spark session; nothing outside a temporary directory is
touched.
"""

from __future__ import annotations

import logging
import os
import sys
import time

from ..embedded import EmbeddedPostgres, EmbeddedPostgresError
from ..errors import XasinkError

TABLE = "demo_orders"
SINK = "demo-orders"


def _say(text: str) -> None:
    print(text, flush=True)


def _count(url: str) -> tuple[int, int, int]:
    """Rows and distinct order ids in the demo table, and prepared transactions left on the server."""
    import sqlalchemy as sa

    from ..dialects import dialect_for
    from ..options import parse_url

    dialect = dialect_for(parse_url(url))
    orders = sa.table(TABLE, sa.column("order_id"))
    try:
        with dialect.connect() as conn:
            query = sa.select(sa.func.count(), sa.func.count(sa.distinct(orders.c.order_id))).select_from(orders)
            total, distinct = conn.execute(query).one()
            prepared = len(dialect.list_prepared(conn))
    finally:
        dialect.dispose()
    return int(total), int(distinct), prepared


def run_demo(rows: int = 100_000, partitions: int = 4) -> int:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    logging.getLogger("py4j").setLevel(logging.WARNING)
    try:
        server = EmbeddedPostgres(max_prepared_transactions=64)
    except EmbeddedPostgresError as exc:
        _say(f"error: {exc}")
        return 2
    _say("xasink demo: exactly-once writes from Spark into PostgreSQL by two-phase commit\n")
    with server:
        url = server.url
        _say(f"1. started a throwaway PostgreSQL on port {server.port} with max_prepared_transactions=64")
        from pyspark.sql import SparkSession

        import xasink

        spark = (
            SparkSession.builder.master(f"local[{partitions}]")
            .appName("xasink-demo")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.session.timeZone", "UTC")
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("OFF")  # the planned failure would print a page of stack traces
        try:
            xasink.register(spark)
            df = (
                spark.range(rows)
                .selectExpr(
                    "id AS order_id",
                    "concat('customer-', id % 977) AS customer",
                    "cast(id % 10000 AS decimal(12,2)) / 100 AS amount",
                    "current_timestamp() AS created_at",
                )
                .repartition(partitions)
            )
            _say(f"2. a DataFrame of {rows} orders in {partitions} partitions")
            # partition 2 fails after loading its rows, while the other partitions have written theirs
            spark.sparkContext.setLocalProperty("xasink.fault", "task.before_prepare:raise:p=2")
            _say("3. first try: partition 2 fails after the other partitions have loaded their rows ...")
            t0 = time.perf_counter()
            try:
                xasink.write(df, url, TABLE, sink_id=SINK, batch_id=1)
                _say("   unexpected: the write succeeded")
                return 1
            except Exception as exc:  # noqa: BLE001 - the planned failure, wrapped by Spark
                kind = type(exc).__name__ if isinstance(exc, XasinkError) else "injected failure in partition 2"
                _say(f"   the write failed as planned ({kind}) after {time.perf_counter() - t0:.1f}s")
            total, _, prepared = _count(url)
            _say(f"   rows visible in {TABLE}: {total}; prepared transactions left: {prepared}")
            ok = total == 0 and prepared == 0
            spark.sparkContext.setLocalProperty("xasink.fault", None)  # type: ignore[arg-type]
            _say("4. retry the same batch (sinkId demo-orders, batchId 1) ...")
            result = xasink.write(df, url, TABLE, sink_id=SINK, batch_id=1)
            _say(f"   {result}")
            _say("5. run it once more: a committed batch is never written twice ...")
            again = xasink.write(df, url, TABLE, sink_id=SINK, batch_id=1)
            _say(f"   {again}")
            total, distinct, prepared = _count(url)
            ok = ok and total == rows and distinct == rows and prepared == 0 and again.skipped
            _say(
                f"\nverified: {total} rows, {distinct} distinct order ids (expected {rows}), "
                f"{prepared} prepared transactions left"
            )
            _say("OK: all or nothing, exactly once" if ok else "FAILED: the check above does not hold")
            return 0 if ok else 1
        finally:
            spark.stop()
