"""The set-up every benchmark shares: the servers, the Spark session, small database helpers, a polling reader.

PostgreSQL is a private :class:`xasink.support.embedded.EmbeddedPostgres` with room for 300 prepared
transactions; MariaDB is the machine's server at 127.0.0.1:3306 (root, empty password) with a scratch database,
or with ``--mariadb private`` a server of the run's own (:mod:`benchmarks.private_mariadb`).
The set-up is recorded in the results, so a figure is never read without it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import platform
import shutil
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg2
import psycopg2.extensions
import pymysql

from benchmarks import cpu
from benchmarks.private_mariadb import parse_private, server_pids
from xasink.support.embedded import EmbeddedPostgres
from xasink.support.embedded_mariadb import EmbeddedMariaDB

log = logging.getLogger("benchmarks")

ROOT = Path(__file__).resolve().parent.parent
PG_JAR = Path("/usr/share/java/postgresql.jar")
MARIADB_JAR = Path("/usr/share/java/mariadb-java-client.jar")
MARIADB_DB_PREFIX = "xasink_benchrun_"  # a fresh scratch database per run, dropped at the end
BENCH_SINK_PREFIXES = ("b-", "scale-")  # every sinkId the benchmark uses starts so
PG_SETTINGS = (
    "server_version",
    "fsync",
    "synchronous_commit",
    "full_page_writes",
    "shared_buffers",
    "max_wal_size",
    "max_prepared_transactions",
    "max_connections",
)
MARIADB_SETTINGS = ("version", "innodb_flush_log_at_trx_commit", "innodb_buffer_pool_size", "innodb_log_file_size")
MARIADB_SETTINGS += ("innodb_doublewrite", "sync_binlog", "log_bin", "local_infile", "max_allowed_packet")


@dataclass
class Database:
    """One target database: how each contender reaches it."""

    kind: str  # "postgresql" | "mariadb"
    xasink_url: str  # what xasink (and SQLAlchemy) gets
    jdbc_url: str
    jdbc_driver: str
    jdbc_props: dict[str, str]
    host: str
    port: int
    user: str
    password: str
    database: str
    xasink_ok: bool = True  # the dialect is importable
    note: str = ""
    settings: dict[str, Any] = field(default_factory=dict)

    # -- admin connections (benchmark bookkeeping, never timed) ---------------------------------------------
    @contextlib.contextmanager
    def connect(self) -> Iterator[Any]:
        if self.kind == "postgresql":
            conn = psycopg2.connect(
                host=self.host, port=self.port, user=self.user, dbname=self.database, options="-c TimeZone=UTC"
            )
            conn.autocommit = True
        else:
            conn = pymysql.connect(
                host=self.host,
                port=self.port,
                user=self.user,
                password=self.password,
                database=self.database,
                autocommit=True,
                local_infile=True,
            )
        try:
            yield conn
        finally:
            conn.close()

    def quote(self, name: str) -> str:
        """A quoted identifier (benchmark tables only; the product quotes through SQLAlchemy)."""
        if self.kind == "postgresql":
            return '"' + name.replace('"', '""') + '"'
        return "`" + name.replace("`", "``") + "`"

    def execute(self, *statements: str) -> None:
        with self.connect() as conn, conn.cursor() as cur:
            for statement in statements:
                cur.execute(statement)

    def scalar(self, statement: str) -> Any:
        with self.connect() as conn, conn.cursor() as cur:
            cur.execute(statement)
            row = cur.fetchone()
            return row[0] if row else None

    def count(self, table: str) -> int:
        return int(self.scalar(f"SELECT count(*) FROM {self.quote(table)}"))

    def drop(self, table: str) -> None:
        self.execute(f"DROP TABLE IF EXISTS {self.quote(table)}")

    def create_table(self, table: str, columns: Sequence[tuple[str, str, str]], key: str | None = "id") -> None:
        """Drop and create ``table`` from (name, PostgreSQL type, MariaDB type) columns, ``key`` its primary key."""
        typed = [f"{self.quote(n)} {pg if self.kind == 'postgresql' else my}" for n, pg, my in columns]
        cols = [f"{c} NOT NULL" if n == key else c for c, (n, _, _) in zip(typed, columns, strict=True)]
        if key:
            cols.append(f"PRIMARY KEY ({self.quote(key)})")
        suffix = " ENGINE=InnoDB" if self.kind == "mariadb" else ""
        self.drop(table)
        self.execute(f"CREATE TABLE {self.quote(table)} ({', '.join(cols)}){suffix}")

    def analyze(self, table: str) -> None:
        """Fresh planner statistics after a bulk load (not timed)."""
        self.execute(f"{'VACUUM ANALYZE' if self.kind == 'postgresql' else 'ANALYZE TABLE'} {self.quote(table)}")

    def settle(self) -> None:
        """Between runs (not timed): flush dirty pages so a checkpoint does not land inside the next run."""
        if self.kind == "postgresql":
            self.execute("CHECKPOINT")

    def prepared(self, sink: str | None = None) -> int:
        """Prepared branches of ``sink``, or of every benchmark sink: XA RECOVER lists the whole MariaDB server,
        other jobs' branches too, so only our sink ids count."""
        if not self.xasink_ok:
            return 0
        from xasink.dialects import dialect_for
        from xasink.options import parse_url

        dialect = dialect_for(parse_url(self.xasink_url))
        try:
            with dialect.connect() as conn:
                found = dialect.list_prepared(conn)
        finally:
            dialect.dispose()
        ours = (sink,) if sink is not None else BENCH_SINK_PREFIXES
        return sum(1 for p in found if p.xid is not None and p.xid.sink_id.startswith(ours))

    def left_prepared(self, problems: list[str], sink: str | None = None) -> int:
        """:meth:`prepared` after a scenario; a branch left behind is one of its ``problems``."""
        left = self.prepared(sink)
        if left:
            problems.append(f"{left} prepared transactions left")
        return left


DURABLE = {"fsync": "on", "synchronous_commit": "on", "full_page_writes": "on"}  # PostgreSQL's defaults


def start_postgres(max_prepared: int = 300, durable: bool = False) -> tuple[EmbeddedPostgres, Database]:
    """A private cluster; ``durable`` keeps PostgreSQL's own defaults (fsync, synchronous_commit on) as users run it."""
    extra = {"max_connections": "400", **(DURABLE if durable else {})}
    server = EmbeddedPostgres(max_prepared_transactions=max_prepared, extra_settings=extra)
    server.start()
    db = Database(
        kind="postgresql",
        xasink_url=server.url,
        jdbc_url=f"jdbc:postgresql://127.0.0.1:{server.port}/postgres",
        jdbc_driver="org.postgresql.Driver",
        jdbc_props={"user": "postgres"},
        host="127.0.0.1",
        port=server.port,
        user="postgres",
        password="",
        database="postgres",
    )
    db.settings = {name: db.scalar(f"SHOW {name}") for name in PG_SETTINGS}
    db.settings["embedded"] = "xasink.support.embedded.EmbeddedPostgres (private cluster, " + (
        "durable: PostgreSQL defaults)" if durable else "fsync/synchronous_commit off)"
    )
    return server, db


def mariadb(host: str = "127.0.0.1", port: int = 3306) -> Database | None:
    """The machine's MariaDB with a fresh scratch database, or None (with a log line) when it is not reachable."""
    name = MARIADB_DB_PREFIX + uuid.uuid4().hex[:8]
    try:
        conn = pymysql.connect(host=host, port=port, user="root", password="", autocommit=True)
    except pymysql.MySQLError as exc:
        log.warning("MariaDB at %s:%s not reachable (%s): MariaDB contenders skipped", host, port, exc)
        return None
    with conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
        settings: dict[str, Any] = {}
        for var in MARIADB_SETTINGS:
            cur.execute("SHOW VARIABLES LIKE %s", (var,))
            row = cur.fetchone()
            settings[var] = row[1] if row else None
    conn.close()
    db = Database(
        kind="mariadb",
        xasink_url=f"mysql://root@{host}:{port}/{name}",
        # jdbc:mysql: so that Spark picks its MySQL dialect (backtick quoting); Connector/J 2.x accepts it
        jdbc_url=f"jdbc:mysql://{host}:{port}/{name}",
        jdbc_driver="org.mariadb.jdbc.Driver",
        jdbc_props={"user": "root", "password": ""},
        host=host,
        port=port,
        user="root",
        password="",
        database=name,
        settings=settings,
    )
    try:
        import xasink.dialects.mysql  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - not written yet, or broken: say so and measure the others
        db.xasink_ok = False
        db.note = f"xasink MariaDB contenders skipped: xasink.dialects.mysql cannot be imported ({exc})"
        log.warning("%s", db.note)
    return db


@contextlib.contextmanager
def databases(
    kinds: Sequence[str], mariadb_at: str = "127.0.0.1:3306", durable: bool = True, notes: list[str] | None = None
) -> Iterator[list[Database]]:
    """The databases asked for: a private PostgreSQL and the machine's MariaDB (a scratch database).

    An unreachable MariaDB, or an xasink dialect that cannot be imported, is a line in ``notes``.  On exit the
    scratch database is dropped and PostgreSQL stopped.
    """
    notes = [] if notes is None else notes
    dbs: list[Database] = []
    server, private = None, None
    try:
        if "postgresql" in kinds:
            server, pg = start_postgres(durable=durable)
            dbs.append(pg)
        if "mariadb" in kinds:
            overrides = parse_private(mariadb_at)
            if overrides is not None:  # a server of its own: its CPU is this run's alone
                private = EmbeddedMariaDB(overrides)
                mariadb_at = private.start()
            host, _, port = mariadb_at.partition(":")
            maria = mariadb(host, int(port or 3306))
            if maria is None:
                notes.append(f"MariaDB at {mariadb_at} not reachable: skipped")
            else:
                dbs.append(maria)
                maria.settings["server"] = "private to this run" if private else f"shared, at {mariadb_at}"
                if maria.note:
                    notes.append(maria.note)
        shared = "mariadb" in kinds and private is None
        cpu.SERVER_ROOTS = None if shared else server_pids(server.data_dir if server else None, private)
        if shared and dbs:
            notes.append("MariaDB is the machine's shared server: its CPU here includes other clients' work")
        for db in dbs:
            log.info("%s: %s", db.kind, ", ".join(f"{k}={v}" for k, v in db.settings.items()))
        yield dbs
    finally:
        for db in dbs:
            drop_scratch(db)
        if server is not None:
            server.stop()
        if private is not None:
            private.stop()


def drop_scratch(db: Database) -> None:
    if db.kind == "mariadb" and db.database.startswith(MARIADB_DB_PREFIX):
        conn = pymysql.connect(host=db.host, port=db.port, user=db.user, password=db.password, autocommit=True)
        with conn.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS `{db.database}`")
        conn.close()


def phase_log() -> Path:
    """A fresh file for xasink's phase log (``XASINK_PHASE_LOG``); call it before Spark starts, so that every
    worker inherits it."""
    path = Path(tempfile.mkdtemp(prefix="xasink-phases-")) / "phases.jsonl"
    os.environ["XASINK_PHASE_LOG"] = str(path)
    return path


JARS = {"postgresql": (PG_JAR, "libpostgresql-jdbc-java"), "mariadb": (MARIADB_JAR, "libmariadb-java")}


def jar_missing(kind: str) -> str | None:
    """Why Spark's JDBC writer cannot reach a ``kind`` database here, or None."""
    jar, package = JARS[kind]
    return None if jar.exists() else f"{jar} missing (apt-get install {package})"


def spark_session(
    master: str, notes: list[str] | None = None, arrow_batch: int = 10_000, driver_memory: str = "6g"
) -> Any:
    """A local Spark session; workers import ``benchmarks`` (our data sources) and xasink from this checkout.

    A missing JDBC jar is a line in ``notes``: the JDBC contenders for that database are skipped.
    """
    jar_paths = []
    for kind, (jar, _) in JARS.items():
        missing = jar_missing(kind)
        if missing is None:
            jar_paths.append(str(jar))
        else:
            log.warning("%s: Spark JDBC contenders for it skipped", missing)
            if notes is not None:
                notes.append(f"{missing}: Spark JDBC contenders for it skipped")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ["TZ"] = "UTC"  # Row-based writers get naive datetimes in the worker's local zone
    paths = [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master(master)
        .appName("xasink-benchmarks")
        .config("spark.driver.memory", driver_memory)
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.execution.arrow.maxRecordsPerBatch", str(arrow_batch))
        .config("spark.executorEnv.TZ", "UTC")
        .config("spark.ui.showConsoleProgress", "false")
    )
    if jar_paths:
        builder = builder.config("spark.jars", ",".join(jar_paths))
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    import xasink

    xasink.register(spark)
    from benchmarks.sources import register_sources

    register_sources(spark)
    return spark


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), None)
    except OSError:
        return None


def machine() -> dict[str, Any]:
    return {
        "cpu_model": _cpu_model(),
        "cpus": os.cpu_count(),
        "memory_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(),
        "platform": platform.platform(),
        "psql": shutil.which("psql"),
        "mysql": shutil.which("mysql") or shutil.which("mariadb"),
    }


class Poller(threading.Thread):
    """What a concurrent reader sees: :meth:`poll` runs every ``interval`` s on its own autocommit connection in
    READ COMMITTED until :meth:`stop`.  A failure of the reader is kept in ``error``, never raised."""

    def __init__(self, db: Database, table: str, interval: float) -> None:
        super().__init__(name=f"bench-reader-{table}", daemon=True)
        self.db, self.table, self.interval = db, table, interval
        self.read_s: list[float] = []  # how long each read took (a blocked reader waits here)
        self.halt = threading.Event()
        self.error: str | None = None

    def poll(self, cur: Any) -> None:
        raise NotImplementedError

    def run(self) -> None:
        try:
            with self.db.connect() as conn, conn.cursor() as cur:
                if self.db.kind == "mariadb":
                    cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
                while not self.halt.is_set():
                    t0 = time.perf_counter()
                    self.poll(cur)
                    self.read_s.append(time.perf_counter() - t0)
                    self.halt.wait(self.interval)
        except Exception as exc:  # noqa: BLE001 - reported with the results, not fatal for the benchmark
            self.error = (str(exc).splitlines() or [type(exc).__name__])[0][:300]

    def stop(self, linger: float = 0.0) -> None:
        """Stop after ``linger`` more seconds of reading (a few samples of the end state)."""
        time.sleep(linger)
        self.halt.set()
        self.join(30)
