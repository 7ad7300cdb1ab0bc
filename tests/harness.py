"""What the test modules share: the rows they write and expect, one sink driven without Spark, and a test
driver run in its own process.  Test modules import from here (and from tests.targets, tests.dbutil), never
from one another.

Rows: a writer of ids ``I`` leaves ``(i, f"{tag}{i}")`` for each ``i`` (tag ``n`` unless a test says other),
in a table of ``(id, name)`` (:data:`NAMES`, what ``Target.keyed_table`` creates) or ``(id, v)``
(:data:`VALUES`).
"""

from __future__ import annotations

import io
import json
import os
import sys
import uuid
from collections.abc import Iterable
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from tests.leaks import SECRET, assert_no_secret  # SECRET: the test servers' superuser password
from tests.modes_driver import OPTIONS_ENV  # a test driver's extra write options, a JSON object
from tests.procs import run_until_exit
from tests.targets import POSTGRESQL, Target
from xasink.branch import write_partition
from xasink.cli import main
from xasink.coordinator import Coordinator
from xasink.options import WriteOptions, parse_options
from xasink.results import BranchOutcome, WriteResult
from xasink.schema import plan_target
from xasink.xid import new_run_nonce

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

NAMES = pa.schema([pa.field("id", pa.int32(), nullable=False), ("name", pa.string())])
VALUES = pa.schema([("id", pa.int64()), ("v", pa.string())])

# tests/crash_driver.py's write (test_crash and the tests that kill or race its driver)
CRASH_DRIVER = Path(__file__).resolve().parent / "crash_driver.py"
N, PARTITIONS, BATCH = 40, 4, 5


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


def fill(db: Target, table: str, rows: list[tuple[int, str]]) -> None:
    """Insert ``rows`` into an ``(id, name)`` table, committed."""
    with db.connect() as conn, conn.cursor() as cur:
        cur.executemany(f"INSERT INTO {db.q(table)} (id, name) VALUES (%s, %s)", rows)


def shadow_rows(db: Target) -> int:
    """Rows in every shadow table of the database (empty between batches)."""
    here = "current_schema()" if db.kind == POSTGRESQL else "DATABASE()"
    query = f"SELECT table_name FROM information_schema.tables WHERE table_schema = {here} AND table_name LIKE %s"
    names = [r[0] for r in db.execute(query, "xasink\\_sh\\_%")]
    return sum(int(db.execute(f"SELECT count(*) FROM {db.q(n)}")[0][0]) for n in names)


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

    def prepare(self, batch_id: int, ids: range, parts: int | None = None, **task: Any) -> list[BranchOutcome | None]:
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


# --------------------------------------------------------------------------- the CLI


def cli(*args: str) -> tuple[int, str, str]:
    """``xasink ARGS`` in this process: exit code, stdout, stderr (neither shows the superuser's password)."""
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(list(args))
    assert_no_secret(out.getvalue(), err.getvalue(), secret=SECRET)
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
