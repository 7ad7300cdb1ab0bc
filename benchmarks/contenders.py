"""Every way of writing the cached DataFrame that the throughput section compares.

A contender has an untimed ``prepare`` (fresh table, seeded for upserts), the timed ``run`` (one Spark
action, or the parallel COPY for the floor) and an untimed ``verify`` (the rows really arrived).
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks import data, handwritten
from benchmarks.env import Database

SEED_VALUE = -1  # upserts start from a table holding the even ids with this in the second column


@dataclass
class Ctx:
    """What one measured run needs."""

    spark: Any
    db: Database
    df: Any  # the cached DataFrame
    schema: str
    size: int
    run: int  # run number, unique per (contender, db, schema, size): used as xasink batchId
    table: str
    seed_table: str
    csv_files: list[Path] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Contender:
    name: str
    label: str
    kind: str  # "append" | "upsert" | "floor"
    run: Callable[[Ctx], None]
    prepare: Callable[[Ctx], None]
    verify: Callable[[Ctx], str | None]  # None when fine, else what is wrong
    needs: str = ""  # "xasink" | "jdbc" | "csv" | ""


# --------------------------------------------------------------------------- preparation and checks


def fresh(ctx: Ctx) -> None:
    data.create_table(ctx.db, ctx.table, ctx.schema)
    ctx.db.settle()


def seeded(ctx: Ctx) -> None:
    """The target holds the even ids with other values: the upsert updates half the rows and inserts half."""
    data.create_table(ctx.db, ctx.table, ctx.schema)
    ctx.db.execute(f"INSERT INTO {ctx.db.quote(ctx.table)} SELECT * FROM {ctx.db.quote(ctx.seed_table)}")
    ctx.db.analyze(ctx.table)
    ctx.db.settle()


def nothing(ctx: Ctx) -> None:
    pass


def warm_python_workers(ctx: Ctx) -> None:
    """Start one Python worker per partition before a timed run (not timed).

    Spark kills Python workers idle for a minute; after a slow JVM-only contender (the default JDBC writer
    at 2M rows) the next Python writer would otherwise pay for starting and importing four workers.
    """
    ctx.spark.range(0, data.PARTITIONS, 1, data.PARTITIONS).write.format("bench_noop").mode("append").save()


def check_rows(ctx: Ctx) -> str | None:
    got = ctx.db.count(ctx.table)
    return None if got == ctx.size else f"expected {ctx.size} rows, found {got}"


def check_upsert(ctx: Ctx) -> str | None:
    wrong = check_rows(ctx)
    if wrong:
        return wrong
    second = data.SCHEMAS[ctx.schema][1].name
    stale = ctx.db.scalar(f"SELECT count(*) FROM {ctx.db.quote(ctx.table)} WHERE {ctx.db.quote(second)} = {SEED_VALUE}")
    return None if int(stale) == 0 else f"{stale} seeded rows were not updated"


def no_check(ctx: Ctx) -> str | None:
    return None


def make_seed(spark: Any, db: Database, df: Any, schema: str, seed_table: str) -> None:
    """Write the seed table once per (db, schema, size), with a plain bulk path (not timed)."""
    data.create_table(db, seed_table, schema)
    second = data.SCHEMAS[schema][1].name  # an int column in both schemas
    seed = df.filter("id % 2 = 0").selectExpr(
        *[f"cast({SEED_VALUE} as int) as {c.name}" if c.name == second else c.name for c in data.SCHEMAS[schema]]
    )
    if db.xasink_ok:
        writer = seed.write.format("bench_plain").option("url", db.xasink_url).option("dbtable", seed_table)
        writer.option("createTable", "false").mode("append").save()
    else:
        jdbc_write(seed, db, tuned=True, table=seed_table)


# --------------------------------------------------------------------------- the timed actions


def xasink_options(ctx: Ctx, contender: str) -> dict[str, str]:
    return {
        "url": ctx.db.xasink_url,
        "dbtable": ctx.table,
        "sinkId": f"b-{contender}-{ctx.db.kind[:2]}-{ctx.schema[0]}{ctx.size}",  # at most 32 characters
        "batchId": str(ctx.run),
        "createTable": "false",
    }


def run_xasink(ctx: Ctx) -> None:
    ctx.df.write.format("xasink").options(**xasink_options(ctx, "xa")).mode("append").save()


def run_xasink_upsert(ctx: Ctx) -> None:
    opts = {**xasink_options(ctx, "up"), "upsertKeyColumns": "id"}
    ctx.df.write.format("xasink").options(**opts).mode("append").save()


def run_plain(ctx: Ctx) -> None:
    ctx.df.write.format("bench_plain").options(**xasink_options(ctx, "plain")).mode("append").save()


def run_noop(ctx: Ctx) -> None:
    ctx.df.write.format("bench_noop").mode("append").save()


def jdbc_writer(df: Any, db: Database, table: str, tuned: bool = True) -> Any:
    """Spark's JDBC writer for ``table``; tuned: batchsize 10000 and the driver's batched-insert rewrite."""
    url = db.jdbc_url
    writer = df.write.format("jdbc").option("driver", db.jdbc_driver).option("dbtable", table)
    for key, value in db.jdbc_props.items():
        writer = writer.option(key, value)
    if tuned:
        url += "?reWriteBatchedInserts=true" if db.kind == "postgresql" else "?rewriteBatchedStatements=true"
        writer = writer.option("batchsize", "10000")
    return writer.option("url", url)


def jdbc_write(df: Any, db: Database, tuned: bool, table: str) -> None:
    jdbc_writer(df, db, table, tuned).mode("append").save()


def run_jdbc_default(ctx: Ctx) -> None:
    jdbc_write(ctx.df, ctx.db, tuned=False, table=ctx.table)


def run_jdbc_tuned(ctx: Ctx) -> None:
    jdbc_write(ctx.df, ctx.db, tuned=True, table=ctx.table)


def run_hand_upsert(ctx: Ctx) -> None:
    cols = data.column_names(ctx.schema)
    db = ctx.db
    if db.kind == "postgresql":
        statement = handwritten.pg_upsert_sql(ctx.table, cols, ["id"])
        conninfo = {
            "host": db.host,
            "port": db.port,
            "user": db.user,
            "dbname": db.database,
            "options": "-c TimeZone=UTC",
        }
        fn = functools.partial(handwritten.pg_partition, conninfo=conninfo, statement=statement)
    else:
        statement = handwritten.mysql_upsert_sql(ctx.table, cols, ["id"])
        conninfo = {"host": db.host, "port": db.port, "user": db.user, "password": db.password, "database": db.database}
        fn = functools.partial(handwritten.mysql_partition, conninfo=conninfo, statement=statement)
    ctx.df.foreachPartition(fn)


def _load_command(db: Database, table: str, path: Path) -> tuple[list[str], dict[str, str]]:
    env = {**os.environ, "PGTZ": "UTC"}
    if db.kind == "postgresql":
        copy = f"\\copy {db.quote(table)} FROM '{path}' WITH (FORMAT csv, NULL '\\N')"
        cmd = [
            "psql",
            "-X",
            "-q",
            "-v",
            "ON_ERROR_STOP=1",
            "-h",
            db.host,
            "-p",
            str(db.port),
            "-U",
            db.user,
            "-d",
            db.database,
            "-c",
            copy,
        ]
        return cmd, env
    load = (
        f"LOAD DATA LOCAL INFILE '{path}' INTO TABLE {db.quote(table)} CHARACTER SET utf8mb4 "
        "FIELDS TERMINATED BY ',' OPTIONALLY ENCLOSED BY '\"' LINES TERMINATED BY '\\n'"
    )
    cmd = ["mysql", "--local-infile=1", "-h", db.host, "-P", str(db.port), "-u", db.user, db.database, "-e", load]
    return cmd, env


def run_floor(ctx: Ctx) -> None:
    """4 client processes, one per CSV file, each loading its file in one transaction, all at once."""
    cmds = [_load_command(ctx.db, ctx.table, p) for p in ctx.csv_files]

    def one(cmd_env: tuple[list[str], dict[str, str]]) -> None:
        proc = subprocess.run(cmd_env[0], env=cmd_env[1], capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"bulk load failed: {proc.stderr.strip()[:500]}")

    with ThreadPoolExecutor(len(cmds)) as pool:
        list(pool.map(one, cmds))


CONTENDERS = (
    Contender("xasink", "xasink append (XA)", "append", run_xasink, fresh, check_rows, "xasink"),
    Contender("plain-commit", "same path, plain COMMIT", "append", run_plain, fresh, check_rows, "xasink"),
    Contender("jdbc-default", "Spark JDBC, defaults", "append", run_jdbc_default, fresh, check_rows, "jdbc"),
    Contender("jdbc-tuned", "Spark JDBC, tuned", "append", run_jdbc_tuned, fresh, check_rows, "jdbc"),
    Contender("floor-copy", "floor: 4 parallel bulk loads of CSV", "floor", run_floor, fresh, check_rows, "csv"),
    Contender("arrow-noop", "Arrow hand-off only (no-op writer)", "floor", run_noop, nothing, no_check, ""),
    Contender(
        "upsert-hand", "hand-written upsert (foreachPartition)", "upsert", run_hand_upsert, seeded, check_upsert, ""
    ),
    Contender("xasink-upsert", "xasink upsert (XA)", "upsert", run_xasink_upsert, seeded, check_upsert, "xasink"),
)
BY_NAME = {c.name: c for c in CONTENDERS}


def summary(exc: BaseException) -> str:
    """The line of a (Spark-wrapped) error that says what went wrong."""
    text = str(exc)
    found = re.findall(r"((?:xasink\.errors|[a-z_.]*Error|[A-Za-z]*Exception)[\w.]*: .+)", text)
    line = found[-1] if found else (text.strip().splitlines() or [type(exc).__name__])[0]
    return f"{type(exc).__name__}: {line.strip()[:300]}"


def timed(fn: Callable[[], None]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0
