"""What the test modules share: the rows they write and expect, one sink driven without Spark, and a test
driver run in its own process.  Test modules import from here (and from tests.targets), never
from one another.

Rows: a writer of ids ``I`` leaves ``(i, f"{tag}{i}")`` for each ``i`` (tag ``n`` unless a test says other),
in a table of ``(id, name)`` (:data:`NAMES`, what ``Target.keyed_table`` creates) or ``(id, v)``
(:data:`VALUES`).
"""

from __future__ import annotations

import io
import json
import logging
import os
import re
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import quote, urlsplit

import pyarrow as pa
import pytest

import xasink
from tests import doc_cases, targets
from tests.leaks import SECRET as SUPERUSER_SECRET  # the test servers' superuser: a url of theirs holds it
from tests.leaks import assert_no_secret
from tests.modes_driver import OPTIONS_ENV  # a test driver's extra write options, a JSON object
from tests.procs import run_until_exit
from tests.targets import POSTGRESQL, Target
from tests.tcp_proxy import TcpProxy
from xasink.dialects.postgres.sql import advisory_key
from xasink.journal.records import BatchRecord
from xasink.ops.cli import main
from xasink.options import WriteOptions, parse_options
from xasink.protocol.coordinator import Coordinator
from xasink.protocol.partition_writer import write_partition
from xasink.protocol.xid import FORMAT_ID, Xid, new_run_nonce
from xasink.results import BranchOutcome, WriteResult
from xasink.support.embedded import EmbeddedPostgres, free_port
from xasink.support.embedded_mariadb import EmbeddedMariaDB, EmbeddedMariaDBError
from xasink.support.faults import LOCAL_PROPERTY
from xasink.write_modes.schema import plan_target
from xasink.write_modes.spec import ApplySpec
from xasink.write_modes.statements import apply_lock_name

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import DataStreamWriter, StreamingQuery

NAMES = pa.schema([pa.field("id", pa.int32(), nullable=False), ("name", pa.string())])
VALUES = pa.schema([("id", pa.int64()), ("v", pa.string())])

# tests/crash_driver.py's write (test_crash and the tests that kill or race its driver)
CRASH_DRIVER = Path(__file__).resolve().parent / "crash_driver.py"
N, PARTITIONS, BATCH = 40, 4, 5

# the recover and status tests' own users (Backend.secret_url) and their password
SECRET = "S3cretPw"
ADMIN_USER = "xasink_rc_admin"
PLAIN_USER = "xasink_rc_plain"  # may log in, nothing more


# the one skip reason of a test of format("xasink") on Spark 3.5, allowed under CI=true (tests/conftest.py)
NO_DATA_SOURCE = "needs format('xasink'): Spark 3.5 has no Python data source API"


def needs_data_source() -> None:
    """Skip a test of ``format("xasink")`` on a Spark without it (3.5's version suite, docs/spark-versions.md)."""
    from xasink.spark.versions import HAS_DATA_SOURCE

    if not HAS_DATA_SOURCE:
        pytest.skip(NO_DATA_SOURCE)


# --------------------------------------------------------------------------- rows


def expected(*ids: Iterable[int], tag: str = "n") -> list[tuple[int, str]]:
    """The rows a writer of ``ids`` (every id of every argument) leaves, ordered by id."""
    return sorted((i, f"{tag}{i}") for part in ids for i in part)


def record_batch(ids: Iterable[int], schema: pa.Schema = NAMES, tag: str = "n") -> pa.RecordBatch:
    """Arrow rows for ``ids``: ``(i, f"{tag}{i}")`` in the two columns of ``schema``."""
    ids = list(ids)
    key, value = schema.names
    return pa.RecordBatch.from_pydict({key: ids, value: [f"{tag}{i}" for i in ids]}, schema=schema)


def frame(spark: SparkSession, ids: range, partitions: int, tag: str = "n") -> DataFrame:
    """``expected(ids, tag=tag)`` as a DataFrame: contiguous id ranges per partition, the last ids last."""
    return spark.range(ids.start, ids.stop, 1, partitions).selectExpr(
        "cast(id as int) as id", f"concat('{tag}', id) as name"
    )


def save_by(way: str, df: DataFrame, db: Target, table: str, batch: int, **options: Any) -> WriteResult | None:
    """Append ``df`` as (sinkId, ``batch``) the user's way: ``xasink.write`` (its result) or ``format("xasink")``
    under ``xasink.spark_errors()`` (None); the database's password is passed when it has one."""
    if way == "write":
        return xasink.write(df, db.url, table, batchId=batch, password=db.password, **options)
    login = {"password": db.password} if db.password is not None else {}
    with xasink.spark_errors():
        df.write.format("xasink").option("url", db.url).option("dbtable", table).options(
            batchId=str(batch), **login, **options
        ).mode("append").save()
    return None


@contextmanager
def spark_jobs(spark: SparkSession) -> Iterator[list[int]]:
    """The ids of the Spark jobs this thread starts inside the block (its own job group)."""
    sc = spark.sparkContext
    group = f"xasink-test-{uuid.uuid4().hex[:8]}"
    sc.setJobGroup(group, "counted by the test")
    found: list[int] = []
    try:
        yield found
    finally:
        found += sc.statusTracker().getJobIdsForGroup(group)
        sc.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]


def failed_tasks(spark: SparkSession, jobs: list[int]) -> int:
    """How many task attempts of ``jobs`` (ids from :func:`spark_jobs`) failed: a lock wait past lockTimeout,
    a deadlock's victim, a retried branch all show here, whatever the machine's speed."""
    tracker = spark.sparkContext.statusTracker()
    stages = [s for j in jobs if (job := tracker.getJobInfo(j)) is not None for s in job.stageIds]
    return sum(int(stage.numFailedTasks) for s in stages if (stage := tracker.getStageInfo(s)) is not None)


def fill(db: Target, table: str, rows: list[tuple[int, str]]) -> None:
    """Insert ``rows`` into an ``(id, name)`` table, committed."""
    with db.connect() as conn, conn.cursor() as cur:
        cur.executemany(f"INSERT INTO {db.q(table)} (id, name) VALUES (%s, %s)", rows)


def shadow_tables(db: Target) -> set[str]:
    """The write modes' shadow tables in the database's schema (one per sink and target)."""
    here = "current_schema()" if db.kind == POSTGRESQL else "DATABASE()"
    query = f"SELECT table_name FROM information_schema.tables WHERE table_schema = {here} AND table_name LIKE %s"
    return {str(r[0]) for r in db.execute(query, "xasink\\_sh\\_%")}


def shadow_rows(db: Target) -> int:
    """Rows in every shadow table of the database (empty between batches)."""
    return sum(int(db.execute(f"SELECT count(*) FROM {db.q(n)}")[0][0]) for n in shadow_tables(db))


def storage_of(db: Target, table: str) -> int:
    """The table's storage, which an overwrite's swap changes: PostgreSQL's OID, InnoDB's table id."""
    if db.kind == POSTGRESQL:
        return int(db.execute("SELECT %s::regclass::oid", db.q(table))[0][0])
    found = "SELECT TABLE_ID FROM information_schema.INNODB_SYS_TABLES WHERE NAME = CONCAT(DATABASE(), '/', %s)"
    return int(db.execute(found, table)[0][0])


def swap_tables(db: Target) -> list[str]:
    """The tables a swap builds under other names (``xasink_sw_``), and the old storage a MariaDB swap keeps as
    its witness until the batch is marked (``xasink_so_``): none outlives a finished overwrite."""
    if db.kind == POSTGRESQL:
        return [r[0] for r in db.execute("SELECT relname FROM pg_class WHERE relname LIKE %s", "xasink\\_sw\\_%")]
    found = "SELECT TABLE_NAME FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME LIKE %s"
    return sorted(r[0] for p in ("sw", "so") for r in db.execute(found, f"xasink\\_{p}\\_%"))


def assert_settled(db: Target, sink: str) -> None:
    """However a sink's batch ended (written, refused, rolled back, recovered), nothing of the sink stays
    prepared and every shadow table is empty."""
    assert db.prepared(sink) == [], f"sink {sink}: branches left prepared"
    assert shadow_rows(db) == 0, "rows left in a shadow table"


def three_tables(pg: Target, maria: Target) -> tuple[str, str, str]:
    """A multi-target transaction's tables: orders and lines on PostgreSQL, events on MariaDB, all keyed."""
    orders, lines, events = pg.new_table(), pg.new_table(), maria.new_table()
    for t, name in ((pg, orders), (pg, lines), (maria, events)):
        t.keyed_table(name)
    return orders, lines, events


@contextmanager
def private_mariadb(
    database: str, overrides: dict[str, str] | None = None, server: EmbeddedMariaDB | None = None
) -> Iterator[tuple[EmbeddedMariaDB, str]]:
    """A MariaDB server of the test's own (to crash and restart, or set up unlike the shared one; ``server``: one
    not yet started, else a plain one with ``overrides``) and the URL of a fresh ``database`` on it; stopped and
    removed on exit.  Skipped without MariaDB (a failure under CI)."""
    server = server if server is not None else EmbeddedMariaDB(overrides)
    try:
        server.start()
    except EmbeddedMariaDBError as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"no private MariaDB: {exc}", pytrace=False)
        pytest.skip(f"no private MariaDB: {exc}")
    try:
        with targets.mariadb_connect(server.url, database=False) as conn, conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE `{database}` CHARACTER SET utf8mb4")
        yield server, server.url + database
    finally:
        server.stop()


def own_mariadb(name: str) -> Iterator[str]:
    """For a module's ``mariadb_url`` fixture: a database on a private server, whose only sessions are the
    module's.  A renamed overwrite counts every read view of the server (xasink/dialects/mysql/swap.py): other
    test files' REPEATABLE READ readers on the shared server would make it apply in place, at random."""
    with private_mariadb(f"xasink_{name}_{uuid.uuid4().hex[:8]}") as (_, url):
        yield url


# --------------------------------------------------------------------------- a URL through tests/tcp_proxy.py

_HOST_PORT = re.compile(r"(//(?:[^@/]*@)?)([^:/@?]+):(\d+)")


def host_port(url: str) -> tuple[str, int]:
    m = _HOST_PORT.search(url)
    assert m, "no host:port in the URL"  # not the URL itself: it holds the password
    return m.group(2), int(m.group(3))


def through(proxy: TcpProxy, url: str) -> str:
    """The same URL, pointed at the proxy."""
    return _HOST_PORT.sub(lambda m: f"{m.group(1)}127.0.0.1:{proxy.port}", url, count=1)


# --------------------------------------------------------------------------- a sink driven without Spark


class Sink:
    """One sink id writing one table without Spark: tasks' branches by ``write_partition``, the driver's part
    by a Coordinator.  ``branches``: what the preflight checks the server can hold (None: no check).
    Modules add what only their tests do (a proxied coordinator, a half-done decision) in a subclass."""

    def __init__(
        self,
        url: str,
        table: str,
        *,
        sink_id: str | None = None,
        prefix: str = "s",
        password: str | None = None,
        schema: pa.Schema = NAMES,
        tag: str = "n",
        parts: int = 2,
        branches: int | None = None,
        **extra: Any,
    ) -> None:
        self.url, self.table, self.password = url, table, password
        self.schema, self.tag, self.parts = schema, tag, parts
        self.sink_id = sink_id or f"{prefix}{uuid.uuid4().hex[:10]}"
        self.options: WriteOptions = self.options_for(url, **extra)
        self.run = new_run_nonce()
        self._attempt = 0
        coordinator = Coordinator(self.options)
        try:
            coordinator.preflight(branches)
            with coordinator.dialect.connect() as conn:
                self.plan = plan_target(coordinator.dialect, conn, self.options, schema)
                conn.commit()
        finally:
            coordinator.close()

    def options_for(self, url: str, **extra: Any) -> WriteOptions:
        """This sink's write options, with ``url`` (e.g. through a proxy) and ``extra`` options."""
        raw: dict[str, Any] = {"url": url, "dbtable": self.table, "sinkId": self.sink_id, **extra}
        if self.password is not None:
            raw["password"] = self.password
        return parse_options(raw)

    def next_attempt(self) -> int:
        self._attempt += 1
        return self._attempt

    def task(
        self,
        batch_id: int,
        partition: int,
        batches: Iterable[pa.RecordBatch],
        *,
        attempt: int | None = None,
        run: str | None = None,
        **task: Any,
    ) -> BranchOutcome:
        """One task attempt of this sink's run writing ``batches`` (``write_partition``, as a Spark task calls it)."""
        return write_partition(
            self.options,
            self.plan,
            batch_id=batch_id,
            partition=partition,
            task_attempt_id=self.next_attempt() if attempt is None else attempt,
            run=run or self.run,
            batches=batches,
            **task,
        )

    def write(
        self, batch_id: int, partition: int, ids: Iterable[int], *, chunk: int | None = None, **task: Any
    ) -> BranchOutcome:
        """One task attempt writing the rows of ``ids``: one Arrow batch, or batches of ``chunk`` rows."""
        ids = list(ids)
        batches: Iterable[pa.RecordBatch]
        if chunk is None:
            batches = [record_batch(ids, self.schema, self.tag)]
        else:
            batches = (record_batch(ids[i : i + chunk], self.schema, self.tag) for i in range(0, len(ids), chunk))
        return self.task(batch_id, partition, batches, **task)

    def prepare(self, batch_id: int, ids: range, parts: int | None = None, **task: Any) -> list[BranchOutcome]:
        """The batch's branches as its tasks prepare them: ``ids`` dealt round-robin over ``parts`` partitions."""
        n = parts or self.parts
        return [self.write(batch_id, p, list(ids)[p::n], **task) for p in range(n)]

    def batch(self, batch_id: int, ids: range, **task: Any) -> WriteResult:
        """One whole batch, as a Spark job runs it: tasks, then the driver's commit."""
        coordinator = Coordinator(self.options)
        try:
            return coordinator.commit(batch_id, self.prepare(batch_id, ids, **task))
        finally:
            coordinator.close()


class TargetSink(Sink):
    """A :class:`Sink` of a ``tests.targets`` database: a fresh ``(id, name)`` table unless ``table`` names one."""

    def __init__(
        self, db: Target, *, table: str | None = None, primary_key: bool = True, branches: int = 4, **kwargs: Any
    ) -> None:
        self.db = db
        if table is None:
            table = db.new_table()
            db.keyed_table(table, primary_key=primary_key)
        super().__init__(db.url, table, password=db.password, branches=branches, **kwargs)

    def rows(self) -> list[tuple[int, str]]:
        return sorted((int(i), str(n)) for i, n in self.db.rows(self.table, "id"))

    def prepared(self) -> list[str]:
        return self.db.prepared(self.sink_id)


# --------------------------------------------------------------------------- a multi-target transaction without Spark


class MultiTx:
    """One multi-target transaction driven without Spark, as ``xasink.transaction`` drives it
    (xasink/spark/transaction.py): each :meth:`write` is what one ``tx.write``'s Spark job does (pre-flight,
    the table's plan, its tasks' branches by ``write_partition``, its part recorded in the log), and
    :meth:`commit` is the block's end.  ``options`` (e.g. ``controlLockTimeout``) apply to every write and
    to the log's connection, as the transaction's do."""

    def __init__(self, sink_id: str, batch_id: int, journal: Target, journal_url: str | None = None, **options: Any):
        from xasink.protocol.multi_target import MultiCoordinator
        from xasink.spark.transaction import LOG_TABLE_PLACEHOLDER

        self.sink_id, self.batch_id, self.options = sink_id, batch_id, options
        raw = {**options, "url": journal_url or journal.url, "dbtable": LOG_TABLE_PLACEHOLDER}
        if journal.password is not None:
            raw["password"] = journal.password
        log_options = replace(parse_options(raw), sink_id=sink_id, batch_id=batch_id)
        self.mc = MultiCoordinator(sink_id, batch_id, log_options)
        self.written: set[int] = set()
        self._next = 0

    def write(self, db: Target, table: str, ids: range, parts: int = 2, url: str | None = None) -> None:
        """Prepare ``ids`` for ``table`` in ``parts`` branches (``url``: ``db``'s, e.g. through a proxy)."""
        from pyspark.sql.types import IntegerType, StringType, StructField, StructType
        from sqlalchemy.engine import make_url

        from xasink.spark.txwrite import TxWrite, prepare_tx_write, record_tx_part

        raw = {**self.options, "url": url or db.url, "dbtable": table}
        if db.password is not None:
            raw["password"] = db.password
        options = replace(parse_options(raw), sink_id=self.sink_id, batch_id=self.batch_id)
        part, self._next = self._next, self._next + 1
        if self.mc.replay:
            self.mc.check_replay(options)
            self.mc.target(options)
            return
        self.mc.before_write(options, parts)
        tx = TxWrite(make_url(self.mc.journal_url), part, self.mc.guard.name)
        schema = StructType([StructField("id", IntegerType(), False), StructField("name", StringType())])
        plan = prepare_tx_write(options, schema, tx)
        outcomes: list[BranchOutcome | None] = [
            write_partition(
                options,
                plan.target,
                batch_id=self.batch_id,
                partition=p,
                task_attempt_id=1000 * part + p,
                run=self.mc.run,
                batches=[record_batch(list(ids)[p::parts])],
                log_id=plan.log_id,
                guard=plan.guard,
                journal_url=tx.journal_url,
            )
            for p in range(parts)
        ]
        record_tx_part(options, tx, self.mc.run, outcomes)
        self.written.add(part)

    def commit(self) -> None:
        """The block's end: decide over every write and commit (or finish a replay)."""
        if self.mc.replay:
            self.mc.finish_replay()
        else:
            self.mc.commit(self.written)

    def close(self) -> None:
        """The process that entered the block lets go of it: its guard is released (a crash, after a fault)."""
        self.mc.close()


def kill_session_lock_holder(db: Target, name: str, timeout_s: float = 10.0) -> None:
    """Kill the session holding the session lock ``name`` (a run guard: ``InProcessGuard.name``), as a
    restart of its database would, and wait until the server no longer lists it."""
    if db.kind == POSTGRESQL:
        key = advisory_key(name) & 0xFFFFFFFFFFFFFFFF
        holder = "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1 AND granted"
        found = db.execute(f"{holder} AND classid::bigint = %s AND objid::bigint = %s", key >> 32, key & 0xFFFFFFFF)
        assert len(found) == 1, found
        db.execute("SELECT pg_terminate_backend(%s)", found[0][0])
        alive = "SELECT count(*) FROM pg_stat_activity WHERE pid = %s"
    else:
        found = db.execute("SELECT IS_USED_LOCK(%s)", name)
        assert found and found[0][0] is not None, found
        db.execute(f"KILL {int(found[0][0])}")
        alive = "SELECT count(*) FROM information_schema.PROCESSLIST WHERE ID = %s"
    deadline = time.monotonic() + timeout_s
    while db.execute(alive, found[0][0]) != [(0,)]:
        assert time.monotonic() < deadline, f"session {found[0][0]} still there"
        time.sleep(0.02)


# --------------------------------------------------------------------------- a streaming query's input and sink


ROWS = 60  # per input file, i.e. per micro-batch


class Stream:
    """One streaming query's input, checkpoint, table and sink id."""

    def __init__(self, spark: SparkSession, root: Path, url: str) -> None:
        self.spark = spark
        self.url = url
        self.input = root / "input"
        self.checkpoint = root / "checkpoint"
        self.input.mkdir()
        self.table = f"st_{uuid.uuid4().hex[:8]}"
        self.sink_id = f"st-{uuid.uuid4().hex[:8]}"
        self.files = 0

    def add_files(self, n: int) -> None:
        """Append ``n`` input files; file k holds ids k*ROWS .. (k+1)*ROWS-1 and becomes batch k."""
        for _ in range(n):
            k = self.files
            tmp = self.input.parent / f".part-{k:04d}.json"
            tmp.write_text("".join(json.dumps({"id": i}) + "\n" for i in range(k * ROWS, (k + 1) * ROWS)))
            os.utime(tmp, (1_700_000_000 + k, 1_700_000_000 + k))
            tmp.rename(self.input / f"part-{k:04d}.json")
            self.files += 1

    def frame(self, partitions: int = 3, transform: Callable[[DataFrame], DataFrame] | None = None) -> DataFrame:
        df = self.spark.readStream.schema("id LONG").option("maxFilesPerTrigger", 1).json(str(self.input))
        df = df.repartition(partitions)
        return transform(df) if transform else df

    def writer(self, df: DataFrame, **options: str) -> DataStreamWriter:
        opts = {"url": self.url, "dbtable": self.table, "sinkId": self.sink_id, **options}
        return df.writeStream.format("xasink").options(**opts).option("checkpointLocation", str(self.checkpoint))

    def run(self, partitions: int = 3, **options: str) -> None:
        """Process all input (availableNow) through ``format("xasink")``."""
        self.writer(self.frame(partitions), **options).trigger(availableNow=True).start().awaitTermination()

    def foreach_batch(self, fn: Callable[..., Any], partitions: int = 3) -> StreamingQuery:
        """The query that processes all input (availableNow) through ``foreachBatch(fn)``, started."""
        writer = self.frame(partitions).writeStream.foreachBatch(fn)
        return writer.option("checkpointLocation", str(self.checkpoint)).trigger(availableNow=True).start()

    def ids(self) -> list[int]:
        return [r[0] for r in targets.rows(self.url, self.table)] if table_exists(self.url, self.table) else []

    def decisions(self) -> dict[int, dict[str, Any]]:
        return decisions(self.url, self.sink_id)

    def prepared(self) -> list[str]:
        return targets.prepared_gids(self.url, prefix=f"xasink:{self.sink_id}:")

    def forget_spark_commit(self, batch: int) -> None:
        """What a kill after our commit and before Spark's commit log leaves: Spark replays ``batch``."""
        commits = self.checkpoint / "commits"
        (commits / str(batch)).unlink()
        (commits / f".{batch}.crc").unlink(missing_ok=True)  # Hadoop's checksum file would block the rewrite

    def assert_exactly_once(self) -> None:
        assert self.ids() == list(range(self.files * ROWS))
        assert self.prepared() == []
        decided = self.decisions()
        assert sorted(decided) == list(range(self.files))
        assert all(d["state"] == "committed" for d in decided.values()), decided
        assert sum(d["rows"] for d in decided.values()) == self.files * ROWS


def failure_text(query: StreamingQuery) -> str:
    """The text of the error that ended ``query`` (Spark wraps ours; its text carries our message)."""
    with pytest.raises(Exception) as info:  # noqa: PT011 - Spark's wrapper class varies
        query.awaitTermination()
    return str(info.value)


def recorded_target(url: str, sink_id: str, batch_id: int) -> dict[str, Any]:
    """What the decision log recorded as the batch's target (its JSON, read with the plain driver)."""
    with targets.connect(url) as conn, conn.cursor() as cur:
        cur.execute("SELECT target FROM xasink_batches WHERE sink_id = %s AND batch_id = %s", (sink_id, batch_id))
        found = cur.fetchone()
    assert found is not None, f"sink {sink_id} batch {batch_id} is not in the log"
    return dict(json.loads(found[0]))


def checkpoint_query_id(checkpoint: Path) -> str:
    """The streaming query's id, as Spark keeps it in its checkpoint's ``metadata`` file."""
    return str(json.loads((checkpoint / "metadata").read_text().splitlines()[0])["id"])


def table_exists(url: str, table: str) -> bool:
    with targets.connect(url) as conn, conn.cursor() as cur:
        cur.execute("SELECT to_regclass(%s) IS NOT NULL", (table,))
        return bool(cur.fetchone()[0])


def decisions(url: str, sink_id: str) -> dict[int, dict[str, Any]]:
    if not table_exists(url, "xasink_batches"):
        return {}
    with targets.connect(url) as conn, conn.cursor() as cur:
        cur.execute(
            "SELECT batch_id, state, xids, rows, branches, prepare_ms, commit_ms FROM xasink_batches "
            "WHERE sink_id = %s",
            (sink_id,),
        )
        names = ("batch_id", "state", "xids", "rows", "branches", "prepare_ms", "commit_ms")
        out = {}
        for row in cur.fetchall():
            rec = dict(zip(names, row, strict=True))
            rec["xids"] = json.loads(rec["xids"])
            out[int(rec["batch_id"])] = rec
        return out


@contextmanager
def tasks_fault(spark: SparkSession, spec: str) -> Iterator[None]:
    """Arm a fault point (xasink.support.faults) in the tasks of the jobs this thread starts meanwhile."""
    ctx = spark.sparkContext
    ctx.setLocalProperty(LOCAL_PROPERTY, spec)
    try:
        yield
    finally:
        ctx.setLocalProperty(LOCAL_PROPERTY, None)  # type: ignore[arg-type]


@contextmanager
def no_branch_opened(stream: Stream, batch: int) -> Iterator[None]:
    """Fail the query if a task of ``batch`` gets past the decision-log check to open a branch."""
    with tasks_fault(stream.spark, f"task.before_load:raise:b={batch}"):
        yield


# --------------------------------------------------------------------------- the decision log's sink row, held


@contextmanager
def logged(logger: str, text: str, level: int = logging.WARNING) -> Iterator[threading.Event]:
    """An event set once a record of ``logger`` (or a logger below it) holding ``text`` is logged in this
    process, on any thread: a state a run reports only in its log, waited for instead of for a time."""
    seen = threading.Event()

    class Seen(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if text in record.getMessage():
                seen.set()

    log, handler = logging.getLogger(logger), Seen(level)
    log.addHandler(handler)
    try:
        yield seen
    finally:
        log.removeHandler(handler)


@contextmanager
def fault_reached(point: str) -> Iterator[threading.Event]:
    """An event set once this process reaches the fault point ``point`` (its warning logged, on any thread):
    a test that must act while a run stalls there waits for it, not for what the run did before."""
    with logged("xasink.support.faults", f"fault point {point} reached") as reached:
        yield reached


@dataclass
class Hold:
    """Runs of this process held at a fault point (:func:`held_at`) until the test releases them."""

    point: str
    reached: threading.Event
    released: threading.Event

    def wait(self, timeout_s: float = 120.0, what: Callable[[], object] | None = None) -> None:
        """Until a run stands at the point (``what``: the run's outcome so far, for the failure message)."""
        if not self.reached.wait(timeout_s):
            so_far = f": {what()!r}" if what else ""
            raise AssertionError(f"no run reached {self.point} in {timeout_s:.0f} s{so_far}")

    def release(self) -> None:
        self.released.set()


@contextmanager
def held_at(monkeypatch: pytest.MonkeyPatch, spec: str) -> Iterator[Hold]:
    """This process's runs stop at the fault point of ``spec`` (``point[:b=BATCH]``, in ``XASINK_FAULT``) until
    the test calls :meth:`Hold.release` (at the latest when the block ends): a test acts while a run stands
    there, on a fast machine or a slow one, instead of racing a fixed sleep.  Only runs in this process."""
    import xasink.support.faults as faults

    released = threading.Event()
    monkeypatch.setattr(faults, "time", SimpleNamespace(sleep=released.wait))
    monkeypatch.setenv(faults.ENV, f"{spec}:sleep=600")
    point = spec.split(":")[0]
    with fault_reached(point) as reached:
        try:
            yield Hold(point, reached, released)
        finally:
            released.set()


@contextmanager
def log_table_locked(log: Target, table: str = "xasink_batches") -> Iterator[None]:
    """Another session holds a table lock on the decision log's ``table`` that blocks its reads (PostgreSQL
    ``ACCESS EXCLUSIVE``, MariaDB ``LOCK TABLES .. WRITE``): a read of it waits past controlLockTimeout."""
    with log.connect() as conn, conn.cursor() as cur:
        if log.kind == POSTGRESQL:
            conn.autocommit = False
            cur.execute(f"LOCK TABLE {log.q(table)} IN ACCESS EXCLUSIVE MODE")
        else:
            cur.execute(f"LOCK TABLES {log.q(table)} WRITE")
        try:
            yield
        finally:
            if log.kind == POSTGRESQL:
                conn.rollback()
            else:
                cur.execute("UNLOCK TABLES")


@contextmanager
def sink_row_locked(log: Target, sink: str) -> Iterator[None]:
    """Another session holds the log's row of ``sink`` (what every decision and roll-back serializes on)."""
    with log.connect() as conn, conn.cursor() as cur:
        if log.kind == POSTGRESQL:
            conn.autocommit = False
        else:
            conn.begin()
        cur.execute(f"SELECT sink_id FROM {log.q('xasink_sinks')} WHERE sink_id = %s FOR UPDATE", (sink,))
        assert [tuple(r) for r in cur.fetchall()] == [(sink,)]
        try:
            yield
        finally:
            conn.rollback()


@contextmanager
def sink_row_locked_once_prepared(
    log: Target, sink: str, batch: int, branches: int, after_s: float = 1.0, timeout_s: float = 60.0
) -> Iterator[threading.Event]:
    """From ``after_s`` after ``branches`` branches of (``sink``, ``batch``) are prepared until the block ends,
    another session holds the log's sink row (a thread's; the event is set once it holds it).

    Each task settles its branch under that same lock right after its PREPARE (``settle_prepared``): the
    delay lets them through, so the lock meets the decision.  The tasks must linger after settling
    (``task.after_prepare:sleep=..``, longer than ``after_s``) for the lock to be there before the decision.
    """
    with sink_row_locked_when(
        log, sink, lambda: len(log.prepared(sink, batch)) >= branches, after_s, timeout_s
    ) as held:
        yield held


@contextmanager
def sink_row_locked_once_claimed(
    log: Target, sink: str, batch: int, after_s: float = 1.0, timeout_s: float = 60.0
) -> Iterator[threading.Event]:
    """From ``after_s`` after a run claims (``sink``, ``batch``) in the log (the driver's claim, before the tasks
    start) until the block ends, another session holds the log's sink row: the tasks meet it when they
    settle their prepared branches (they must linger before PREPARE: ``task.before_prepare:sleep=..``)."""

    def claimed() -> bool:
        table = log.q("xasink_claims")
        return bool(log.execute(f"SELECT 1 FROM {table} WHERE sink_id = %s AND batch_id = %s", sink, batch))

    with sink_row_locked_when(log, sink, claimed, after_s, timeout_s) as held:
        yield held


@contextmanager
def sink_row_locked_when(
    log: Target, sink: str, ready: Callable[[], bool], after_s: float = 0.0, timeout_s: float = 60.0
) -> Iterator[threading.Event]:
    """From ``after_s`` after ``ready()`` (polled) until the block ends, another session holds the log's sink
    row (a thread's; the event is set once it holds it)."""
    held, release = threading.Event(), threading.Event()
    failed: list[BaseException] = []

    def hold() -> None:
        try:
            deadline = time.monotonic() + timeout_s
            while not ready() and not release.is_set():
                if time.monotonic() > deadline:
                    raise AssertionError(f"sink {sink}: what the lock waits for did not happen in {timeout_s} s")
                time.sleep(0.05)
            release.wait(after_s)
            with sink_row_locked(log, sink):
                held.set()
                release.wait(timeout_s)
        except BaseException as exc:  # noqa: BLE001 - raised in the test's thread below
            failed.append(exc)

    holder = threading.Thread(target=hold, name=f"hold-sink-row-{sink}", daemon=True)
    holder.start()
    try:
        yield held
    finally:
        release.set()
        holder.join(timeout_s)
    if failed:
        raise failed[0]


# --------------------------------------------------------------------------- the recover CLI's view of a database


class Backend:
    """A database under test: its URL and what a test checks with the plain driver (no xasink code)."""

    name = ""

    def __init__(self, url: str) -> None:
        self.url = url

    def prepared(self) -> set[str]:
        """Every prepared transaction, named as xasink lists it."""
        raise NotImplementedError

    def rows(self, table: str) -> list[tuple[Any, ...]]:
        raise NotImplementedError

    def create_table(self, table: str) -> None:
        raise NotImplementedError

    def make_foreign(self, gid: str, scratch: str, format_id: int = FORMAT_ID) -> str:
        """Prepare a transaction named ``gid`` (MariaDB: gtrid/bqual split at '/', ``format_id``); its listed name."""
        raise NotImplementedError

    def finish_foreign(self, name: str) -> None:
        raise NotImplementedError

    def secret_url(self, user: str = ADMIN_USER) -> str:
        """The same database as ``user`` with password :data:`SECRET`: all rights for ADMIN_USER; others may log
        in but not read the decision log."""
        raise NotImplementedError

    def drop_secret_user(self, user: str = ADMIN_USER) -> None:
        raise NotImplementedError

    def unreachable_url(self) -> str:
        raise NotImplementedError

    @contextmanager
    def other_database(self) -> Iterator[str]:
        """The URL of an empty database beside this one, on the same server (dropped afterwards): "the wrong
        database" an operator's ``--url`` may name."""
        raise NotImplementedError
        yield ""

    @contextmanager
    def server_that_cannot_write(self) -> Iterator[str]:
        """The URL of a private server of this kind on which xasink cannot write (PostgreSQL with
        ``max_prepared_transactions = 0``, MariaDB with ``read_only = ON``), holding a decision log."""
        raise NotImplementedError
        yield ""


def with_statement_timeout(db: Target, seconds: float) -> str:
    """The test database's URL, for sessions whose statements the server cancels after ``seconds``."""
    if db.kind != POSTGRESQL:  # MariaDB: its SQLAlchemy URL (a JDBC one carries no driver settings)
        admin = db.admin_url  # type: ignore[attr-defined]
        sep = "&" if "?" in admin else "?"
        return admin + sep + "init_command=" + quote(f"SET SESSION max_statement_time = {seconds}")
    sep = "&" if "?" in db.url else "?"
    return db.url + sep + "options=" + quote(f"-c statement_timeout={max(1, round(seconds * 1000))}")


def make_log(url: str) -> None:
    """Create xasink's decision log in ``url``'s database, as a writer's first use does (no server check)."""
    from xasink.database_url import parse_url
    from xasink.dialects import dialect_for
    from xasink.journal.log import Journal

    dialect = dialect_for(parse_url(url))
    try:
        Journal(dialect).ensure()
    finally:
        dialect.dispose()


class Postgres(Backend):
    name = "postgresql"

    def prepared(self) -> set[str]:
        return set(targets.prepared_gids(self.url))

    def rows(self, table: str) -> list[tuple[Any, ...]]:
        return targets.rows(self.url, table)

    def create_table(self, table: str) -> None:
        with targets.connect(self.url) as conn, conn.cursor() as cur:
            cur.execute(f'CREATE TABLE "{table}" (id bigint, v text)')

    def make_foreign(self, gid: str, scratch: str, format_id: int = FORMAT_ID) -> str:
        targets.make_foreign_prepared(self.url, gid, scratch)
        return gid

    def finish_foreign(self, name: str) -> None:
        targets.rollback_prepared(self.url, name)

    def secret_url(self, user: str = ADMIN_USER) -> str:
        # the test server checks this role's password (scram), see tests/conftest.py
        with targets.connect(self.url) as conn, conn.cursor() as cur:
            cur.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (user,))
            if cur.fetchone() is None:
                rights = "SUPERUSER" if user == ADMIN_USER else ""
                cur.execute(f"CREATE ROLE {user} LOGIN {rights} PASSWORD '{SECRET}'")
        parts = urlsplit(targets.libpq_url(self.url))
        return f"postgresql://{user}:{SECRET}@{parts.hostname}:{parts.port}{parts.path}"

    def drop_secret_user(self, user: str = ADMIN_USER) -> None:
        pass  # a role of the private test server; it goes with the server

    def unreachable_url(self) -> str:
        return f"postgresql://{ADMIN_USER}:{SECRET}@127.0.0.1:{free_port()}/postgres"

    @contextmanager
    def other_database(self) -> Iterator[str]:
        name = f"xasink_other_{uuid.uuid4().hex[:8]}"
        with targets.connect(self.url) as conn, conn.cursor() as cur:
            cur.execute(f'CREATE DATABASE "{name}"')
        try:
            yield re.sub(r"/[^/?]*(\?|$)", lambda m: f"/{name}{m.group(1)}", self.url.rstrip("/"), count=1)
        finally:
            with targets.connect(self.url) as conn, conn.cursor() as cur:
                cur.execute(f'DROP DATABASE "{name}" WITH (FORCE)')

    @contextmanager
    def server_that_cannot_write(self) -> Iterator[str]:
        with EmbeddedPostgres(max_prepared_transactions=0, password=SUPERUSER_SECRET) as server:
            make_log(server.url)
            yield server.url


class MariaDB(Backend):
    name = "mariadb"

    def prepared(self) -> set[str]:
        return {self._name(*x) for x in targets.mariadb_recover(self.url)}

    @staticmethod
    def _name(format_id: int, gtrid: bytes, bqual: bytes) -> str:
        from xasink.dialects.mysql import foreign_gid

        xid = Xid.from_xa(format_id, gtrid, bqual)
        return xid.gid if xid is not None else foreign_gid(format_id, gtrid, bqual)

    def rows(self, table: str) -> list[tuple[Any, ...]]:
        return targets.mariadb_rows(self.url, table)

    def create_table(self, table: str) -> None:
        with targets.mariadb_connect(self.url) as conn, conn.cursor() as cur:
            cur.execute(f"CREATE TABLE `{table}` (id bigint, v text) ENGINE=InnoDB")

    def make_foreign(self, gid: str, scratch: str, format_id: int = FORMAT_ID) -> str:
        gtrid, _, bqual = gid.partition("/")
        xa = targets.mariadb_make_foreign_prepared(self.url, gtrid.encode(), bqual.encode(), format_id, scratch)
        return self._name(*xa)

    def finish_foreign(self, name: str) -> None:
        from xasink.dialects.mysql import parse_foreign_gid

        xid = Xid.parse(name)
        xa = (FORMAT_ID, xid.gtrid.encode(), xid.bqual.encode()) if xid is not None else parse_foreign_gid(name)
        assert xa is not None, name
        targets.mariadb_rollback_xa(self.url, *xa)

    def server_sql(self, *statements: str) -> None:
        with targets.mariadb_connect(self.url, database=False) as conn, conn.cursor() as cur:
            for stmt in statements:
                cur.execute(stmt)

    def secret_url(self, user: str = ADMIN_USER) -> str:
        p = targets.mariadb_params(self.url)
        # another user may connect and sees the log (a right on one of its tables) but may not read it
        grant = "ALL PRIVILEGES ON *.*" if user == ADMIN_USER else f"INSERT ON `{p['database']}`.`xasink_batches`"
        self.server_sql(
            f"CREATE USER IF NOT EXISTS '{user}'@'{p['host']}' IDENTIFIED BY '{SECRET}'",
            f"GRANT {grant} TO '{user}'@'{p['host']}'",
        )
        return f"mysql://{user}:{SECRET}@{p['host']}:{p['port']}/{p['database']}"

    def drop_secret_user(self, user: str = ADMIN_USER) -> None:
        p = targets.mariadb_params(self.url)
        self.server_sql(f"DROP USER IF EXISTS '{user}'@'{p['host']}'")

    def unreachable_url(self) -> str:
        return f"mysql://{ADMIN_USER}:{SECRET}@127.0.0.1:{free_port()}/db"

    @contextmanager
    def other_database(self) -> Iterator[str]:
        name = f"{targets.mariadb_params(self.url)['database']}_other"
        self.server_sql(f"CREATE DATABASE `{name}`")
        try:
            yield self.url.rsplit("/", 1)[0] + "/" + name
        finally:
            self.server_sql(f"DROP DATABASE IF EXISTS `{name}`")

    @contextmanager
    def server_that_cannot_write(self) -> Iterator[str]:
        # root may write on a read-only server (the database, the log): its writers may not
        with private_mariadb("shop", {"read-only": "ON", "innodb-buffer-pool-size": "32M"}) as (_, url):
            make_log(url)
            yield url


@dataclass
class Db:
    """One test's view of a backend: its sinks and foreign transactions, cleaned up and leak-checked after."""

    backend: Backend
    sinks: list[BackendSink] = field(default_factory=list)
    foreign: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return self.backend.url

    def sink(self) -> BackendSink:
        table = f"t_{uuid.uuid4().hex[:8]}"
        self.backend.create_table(table)
        s = BackendSink(self.backend, table)
        self.sinks.append(s)
        return s

    def make_foreign(self, gid: str, format_id: int = FORMAT_ID) -> str:
        name = self.backend.make_foreign(gid, "rc_scratch", format_id)
        self.foreign.append(name)
        return name

    def snapshot(self) -> set[str]:
        """What this test left prepared: branches of its sinks and its foreign transactions (the server is shared)."""
        return self.mine() | (self.backend.prepared() & set(self.foreign))

    def mine(self) -> set[str]:
        """Prepared branches of this test's sinks (in this test's decision log)."""
        ids = {s.sink_id for s in self.sinks}
        logs = {s.coordinator.journal.log_id() for s in self.sinks}
        return {
            g
            for g in self.backend.prepared()
            if (x := Xid.parse(g)) is not None and x.sink_id in ids and x.log_id in logs
        }

    def cleanup(self) -> list[str]:
        """Roll back what the test left; returns the branches of its sinks that were left (a leak)."""
        left = self.backend.prepared()
        for name in self.foreign:
            if name in left:
                self.backend.finish_foreign(name)
        leaked = sorted(self.mine())
        for gid in leaked:
            self.backend.finish_foreign(gid)
        for s in self.sinks:
            s.coordinator.close()
        return leaked


@pytest.fixture(name="db", params=["postgresql", pytest.param("mariadb", marks=pytest.mark.mariadb)])
def cli_db(request: pytest.FixtureRequest) -> Iterator[Db]:
    """A :class:`Db` on PostgreSQL, then on MariaDB (test_recover_cli, test_status_health: the ``db`` fixture)."""
    backend: Backend
    if request.param == "postgresql":
        backend = Postgres(request.getfixturevalue("pg_url"))
    else:
        backend = MariaDB(request.getfixturevalue("mariadb_url"))
    d = Db(backend)
    try:
        yield d
    finally:
        leaked = d.cleanup()
    assert not leaked, f"branches of this test's sinks left prepared (rolled back now): {leaked}"


class BackendSink(Sink):
    """A :class:`Sink` of a recover test's backend: ``(id, v)`` rows; its coordinator stays open (Db closes it)."""

    def __init__(self, backend: Backend, table: str) -> None:
        super().__init__(backend.url, table, prefix="rc", schema=VALUES, tag="v")
        self.backend = backend
        self.coordinator = Coordinator(self.options)
        self.coordinator.preflight()

    def decide(self, batch_id: int, outcomes: list[BranchOutcome]) -> BatchRecord:
        """What commit() does up to the decision: the driver is killed right after it."""
        xids = tuple(sorted(o.xid for o in outcomes if o.xid is not None))
        record = BatchRecord(self.sink_id, batch_id, "committing", xids, sum(o.rows for o in outcomes), len(xids))
        self.coordinator.decider.decide(record)
        return record

    def rows(self) -> list[tuple[Any, ...]]:
        return self.backend.rows(self.table)


# --------------------------------------------------------------------------- the CLI


def cli(*args: str) -> tuple[int, str, str]:
    """``xasink ARGS`` in this process: exit code, stdout, stderr (neither shows the superuser's password)."""
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(list(args))
    assert_no_secret(out.getvalue(), err.getvalue(), secret=SUPERUSER_SECRET)
    doc_cases.record_cli(args, code, out.getvalue())
    return code, out.getvalue(), err.getvalue()


# --------------------------------------------------------------------------- a test driver in its own process


def run_driver(
    driver: Path,
    args: list[str],
    fault: str,
    log: Path,
    timeout_s: float = 300,
    options: dict[str, Any] | None = None,
) -> int:
    """Run a test driver (``tests/*_driver.py ARGS``) with the fault point ``fault`` (``XASINK_FAULT``; none of
    this process's) and ``options`` as its extra write options; its exit status once it and its children
    are gone."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("XASINK_FAULT")}
    env.update({"XASINK_FAULT": fault, OPTIONS_ENV: json.dumps(options or {})})
    env.update({"PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable})
    return run_until_exit([sys.executable, str(driver), *args], env, log, timeout_s)


def run_crash_driver(
    url: str,
    table: str,
    sink: str,
    point: str,
    log: Path,
    direct: bool = False,
    options: dict[str, str] | None = None,
    batch: int = BATCH,
) -> int:
    """tests/crash_driver.py writing ids 0..N-1 as batch ``batch``, killed at ``point``; its exit status.

    ``direct``: the driver without Spark (crash_driver.py --direct), with ``options`` as extra write options.
    """
    args = [url, table, sink, str(batch), str(N), str(PARTITIONS), *(["--direct"] if direct else [])]
    return run_driver(CRASH_DRIVER, args, f"{point}:kill", log, options=options)


# --------------------------------------------------------------------------- a reader beside a write


def seen_while(db: Target, table: str, write: Callable[[], Any]) -> dict[tuple[int, int], int]:
    """(count, sum of ids) as a reader polling ``table`` saw them while ``write()`` ran, with times seen: a
    reader's view of a write that must be all or nothing (the old rows, then exactly the new ones)."""
    seen: dict[tuple[int, int], int] = {}
    stop = threading.Event()

    def read() -> None:
        with db.connect() as conn, conn.cursor() as cur:
            while not stop.is_set():
                cur.execute(f"SELECT count(*), coalesce(sum(id), 0) FROM {db.q(table)}")
                n, total = cur.fetchone()
                seen[(int(n), int(total))] = seen.get((int(n), int(total)), 0) + 1
                time.sleep(0.005)

    with ThreadPoolExecutor(1) as pool:
        reader = pool.submit(read)
        try:
            time.sleep(0.2)
            write()
            time.sleep(0.2)
        finally:
            stop.set()
        reader.result()  # a failed reader fails the test
    return seen


def order_lock_of(db: Target, table: str) -> str:
    """The name of the apply lock a write-mode decision of ``table`` (unqualified) holds."""
    schema = db.execute("SELECT current_schema()" if db.kind == POSTGRESQL else "SELECT DATABASE()")[0][0]
    return apply_lock_name(cast(ApplySpec, SimpleNamespace(schema=None, table=table)), schema)


@contextmanager
def apply_lock_held(db: Target, table: str) -> Iterator[None]:
    """The table's apply lock held by a session of the test (as by another sink's long decision)."""
    name = order_lock_of(db, table)
    with db.connect() as conn, conn.cursor() as cur:
        if db.kind == POSTGRESQL:
            cur.execute("SELECT pg_advisory_lock(%s)", (advisory_key(name),))
        else:
            cur.execute("SELECT GET_LOCK(%s, 0)", (name,))
            assert cur.fetchone()[0] == 1
        yield
