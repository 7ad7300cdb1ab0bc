"""``xasink demo``: a failed write leaves nothing behind, the retry lands every row once.

Starts its own PostgreSQL (local binaries) with prepared transactions
enabled and a local Spark session; nothing outside temporary directories is
touched. The demo's session is quiet: Spark logs errors only (a log4j2
configuration of its own) into a log file, shown when something goes wrong,
so the JVM's start-up warnings never reach the terminal.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from importlib import resources
from pathlib import Path
from typing import Any

from xasink.errors import XasinkError
from xasink.support.embedded import EmbeddedPostgres, EmbeddedPostgresError

TABLE = "demo_orders"
SINK = "demo-orders"
# Two task slots, whatever the partitions: two Python workers start instead of one per partition, and partition
# 2 starts only once an earlier partition has prepared its branch.  Measured (4 partitions, 100,000 rows, a
# loaded 2-core machine): 36 CPU-s with these two settings against 62 with local[4] and the JVM's defaults.
SLOTS = 2
# a JVM that lives a minute: C1 compiles only (no C2 compiler threads), one GC thread
JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def _say(text: str) -> None:
    print(text, flush=True)


def _count(url: str) -> tuple[int, int, int]:
    """Rows and distinct order ids in the demo table, and prepared transactions left on the server."""
    import sqlalchemy as sa

    from xasink.database_url import parse_url
    from xasink.dialects import dialect_for

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


@contextmanager
def _stderr_to(path: Path) -> Iterator[None]:
    """Point file descriptor 2 at ``path`` while the JVM starts: the JVM (and the Python workers it spawns)
    keep that stderr for life. This is how its start-up warnings ("Using incubator modules", printed by the
    JVM itself, before any logging) stay off the terminal; this process's stderr is restored at once."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(path, "ab") as log:
            os.dup2(log.fileno(), 2)
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


def _quiet_session(partitions: int, spark_log: Path, stack: ExitStack) -> Any:
    """The demo's own local Spark session: log4j2 at ERROR into ``spark_log``, no progress bars, no UI."""
    from pyspark.sql import SparkSession

    log4j = stack.enter_context(resources.as_file(resources.files(__package__) / "log4j2-demo.properties"))
    with _stderr_to(spark_log):
        spark = (
            SparkSession.builder.master(f"local[{min(partitions, SLOTS)}]")
            .appName("xasink-demo")
            .config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile=file:{log4j} {JVM_OPTIONS}")
            .config("spark.driver.host", "127.0.0.1")  # a local demo listens on loopback only
            .config("spark.driver.bindAddress", "127.0.0.1")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.session.timeZone", "UTC")
            .getOrCreate()
        )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def run_demo(rows: int = 100_000, partitions: int = 4) -> int:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    # the demo's own JVM (this process's environment, never a user's session): no host name lookup, so no
    # "hostname resolves to a loopback address" warning and no wait where that lookup is slow
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    try:
        # durable, as users run their servers: a demo of exactly once with fsync off would (rightly) warn
        server = EmbeddedPostgres(
            max_prepared_transactions=64,
            extra_settings={"fsync": "on", "synchronous_commit": "on", "full_page_writes": "on"},
        )
    except EmbeddedPostgresError as exc:
        _say(f"error: {exc}")
        return 2
    log_dir = Path(tempfile.mkdtemp(prefix="xasink-demo-"))
    spark_log = log_dir / "spark.log"
    ok = False
    try:
        ok = _run(server, rows, partitions, spark_log)
    finally:
        if ok:
            shutil.rmtree(log_dir, ignore_errors=True)
        else:
            _say(f"Spark's log (errors only): {spark_log}")
    return 0 if ok else 1


def _run(server: EmbeddedPostgres, rows: int, partitions: int, spark_log: Path) -> bool:
    _say("xasink demo: exactly-once writes from Spark into PostgreSQL by two-phase commit\n")
    with server, ExitStack() as stack:
        url = server.url
        _say(f"1. started a throwaway PostgreSQL on port {server.port} with max_prepared_transactions=64")
        import xasink

        spark = _quiet_session(partitions, spark_log, stack)
        try:  # xasink.write needs no register(): it runs on Spark 3.5 too (docs/spark-versions.md)
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
            spark.sparkContext.setLogLevel("OFF")  # the planned failure would print a page of stack traces
            _say("3. first try: partition 2 fails after the other partitions have loaded their rows ...")
            t0 = time.perf_counter()
            try:
                xasink.write(df, url, TABLE, sink_id=SINK, batch_id=1)
                _say("   unexpected: the write succeeded")
                return False
            except Exception as exc:  # noqa: BLE001 - the planned failure, wrapped by Spark
                kind = type(exc).__name__ if isinstance(exc, XasinkError) else "injected failure in partition 2"
                _say(f"   the write failed as planned ({kind}) after {time.perf_counter() - t0:.1f}s")
            spark.sparkContext.setLogLevel("ERROR")
            spark.sparkContext.setLocalProperty("xasink.fault", None)  # type: ignore[arg-type]
            failed_rows, _, failed_prepared = _count(url)
            _say(f"   rows visible in {TABLE}: {failed_rows}; prepared transactions left: {failed_prepared}")
            _say("4. retry the same batch (sinkId demo-orders, batchId 1) ...")
            result = xasink.write(df, url, TABLE, sink_id=SINK, batch_id=1)
            _say(f"   {result}")
            retry_rows, retry_distinct, _ = _count(url)
            _say("5. run it once more: a committed batch is never written twice ...")
            again = xasink.write(df, url, TABLE, sink_id=SINK, batch_id=1)
            _say(f"   {again}")
            total, distinct, prepared = _count(url)
            rerun_wrote = total - retry_rows
            ok = (
                failed_rows == 0
                and failed_prepared == 0
                and retry_rows == retry_distinct == rows
                and rerun_wrote == 0
                and again.skipped
                and total == distinct == rows
                and prepared == 0
            )
            _say("\nproved, counted in the database:")
            _say(f"   rows visible after the failed write: {failed_rows} (expected 0)")
            _say(
                f"   rows after the retry: {retry_rows}, {retry_distinct} distinct order ids "
                f"(expected {rows}, each once)"
            )
            _say(f"   rows the rerun of the committed batch wrote: {rerun_wrote} (expected 0)")
            _say(f"   prepared transactions left: {prepared} (expected 0)")
            _say("OK: all or nothing, exactly once" if ok else "FAILED: the check above does not hold")
            return ok
        finally:
            spark.stop()
