"""The write modes' table and writers: a keyed table of ten "days" loaded from a seed, the change batch, and
the MERGE a user's ``foreachBatch`` runs by hand (``benchmarks.modes`` times them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from benchmarks import env as benv
from benchmarks.contenders import jdbc_writer

PARTITIONS = 4
DAYS = 10  # the table spans ten "days" of contiguous ids
REPLACED_DAY = 3  # the day replaceWhere replaces: 2026-01-04
BASE_SEQ, NEW_SEQ = 1, 2  # seq of the loaded rows, of the written ones (the reader tells old from new by it)
COLUMNS = ("id", "day", "grp", "amount", "label", "seq")
TYPES = (  # name, PostgreSQL type, MariaDB type
    ("id", "bigint", "BIGINT"),
    ("day", "date", "DATE"),
    ("grp", "integer", "INT"),
    ("amount", "double precision", "DOUBLE"),
    ("label", "text", "VARCHAR(32)"),
    ("seq", "bigint", "BIGINT"),
)


# --------------------------------------------------------------------------- data


def exprs(rows: int, seq: int) -> list[str]:
    """Spark SQL over ``id`` for the table's columns; ``seq`` marks (and changes) the version of the values."""
    return [
        "id",
        f"date_add(date'2026-01-01', cast(id * {DAYS} div {rows} as int)) as day",
        "cast(id % 1000 as int) as grp",
        f"cast(id as double) * 0.5 + {seq} as amount",
        f"concat('v{seq}-', cast(id % 100000 as string)) as label",
        f"cast({seq} as bigint) as seq",
    ]


def day_literal(day: int) -> str:
    return f"DATE '2026-01-{day + 1:02d}'"  # the same text in PostgreSQL and MariaDB


@dataclass(frozen=True)
class Shape:
    """The sizes of one run of the benchmark."""

    rows: int  # rows in the table
    changes: int  # rows in the change batch

    @property
    def overwrite_range(self) -> tuple[int, int]:
        shift = self.rows // 20  # 5% of the keys leave, 5% are new
        return shift, self.rows + shift

    @property
    def day_range(self) -> tuple[int, int]:
        lo = -(-REPLACED_DAY * self.rows // DAYS)  # the first id whose day is REPLACED_DAY
        hi = -(-(REPLACED_DAY + 1) * self.rows // DAYS)
        return lo, hi

    @property
    def cdc_counts(self) -> tuple[int, int, int]:
        updates, inserts = self.changes * 7 // 10, self.changes * 2 // 10
        return updates, inserts, self.changes - updates - inserts


def frame(spark: Any, lo: int, hi: int, rows: int, seq: int) -> Any:
    return spark.range(lo, hi, 1, PARTITIONS).selectExpr(*exprs(rows, seq))


def changes_frame(spark: Any, shape: Shape) -> Any:
    """70% updates of existing keys (every 5th id), 20% inserts of new keys, 10% deletes (other existing keys)."""
    updates, inserts, _ = shape.cdc_counts
    n = shape.rows
    key = (
        f"case when i < {updates} then i * 5 "
        f"when i < {updates + inserts} then {n} + (i - {updates}) "
        f"else (i - {updates + inserts}) * 5 + 1 end"
    )
    base = spark.range(0, shape.changes, 1, PARTITIONS).selectExpr("id as i", f"{key} as id")
    return base.selectExpr(*exprs(n, NEW_SEQ), f"i >= {updates + inserts} as is_delete")


def create_table(db: benv.Database, table: str, keyed: bool = True) -> None:
    db.create_table(table, TYPES, key="id" if keyed else None)
    if keyed:
        db.execute(f"CREATE INDEX {db.quote(table + '_day')} ON {db.quote(table)} ({db.quote('day')})")


def load_seed(spark: Any, db: benv.Database, seed: str, rows: int) -> None:
    """The seed table (not timed): ``rows`` rows of version BASE_SEQ, written once per database."""
    create_table(db, seed, keyed=False)
    df = frame(spark, 0, rows, rows, BASE_SEQ)
    if db.xasink_ok:
        opts = {"url": db.xasink_url, "dbtable": seed, "createTable": "false"}
        df.write.format("bench_plain").options(**opts).mode("append").save()
    else:
        jdbc_writer(df, db, seed).mode("append").save()
    got = db.count(seed)
    if got != rows:
        raise SystemExit(f"{db.kind}: seed table holds {got} rows, expected {rows}")


def reset_target(db: benv.Database, table: str, seed: str) -> None:
    """A fresh keyed target holding the seed's rows (not timed)."""
    create_table(db, table)
    db.execute(f"INSERT INTO {db.quote(table)} SELECT * FROM {db.quote(seed)}")
    db.analyze(table)
    db.settle()


# --------------------------------------------------------------------------- the writers


def xasink_writer(df: Any, db: benv.Database, table: str, sink: str, batch: int) -> Any:
    opts = {"url": db.xasink_url, "dbtable": table, "sinkId": sink, "batchId": str(batch), "createTable": "false"}
    return df.write.format("xasink").options(**opts)


def merge_sql(db: benv.Database, table: str, stage: str) -> list[str]:
    """What a user's foreachBatch runs after loading the staging table: deletes, then an upsert, seq-guarded."""
    t, s = db.quote(table), db.quote(stage)
    cols = ", ".join(db.quote(c) for c in COLUMNS)
    rest = [c for c in COLUMNS if c != "id"]
    if db.kind == "postgresql":
        sets = ", ".join(f"{db.quote(c)} = EXCLUDED.{db.quote(c)}" for c in rest)
        return [
            f"DELETE FROM {t} USING {s} WHERE {t}.id = {s}.id AND {s}.is_delete AND {t}.seq < {s}.seq",
            f"INSERT INTO {t} ({cols}) SELECT {cols} FROM {s} WHERE NOT {s}.is_delete "
            f"ON CONFLICT (id) DO UPDATE SET {sets} WHERE {t}.seq < EXCLUDED.seq",
        ]
    # seq last: every other assignment still compares against the stored seq
    sets = ", ".join(
        f"{t}.{db.quote(c)} = IF({t}.seq < VALUES(seq), VALUES({db.quote(c)}), {t}.{db.quote(c)})"
        for c in [*rest[:-1], "seq"]
    )
    return [
        f"DELETE {t} FROM {t} JOIN {s} ON {t}.id = {s}.id WHERE {s}.is_delete AND {t}.seq < {s}.seq",
        f"INSERT INTO {t} ({cols}) SELECT {cols} FROM {s} WHERE NOT {s}.is_delete ON DUPLICATE KEY UPDATE {sets}",
    ]


def in_transaction(db: benv.Database, statements: list[str]) -> None:
    with db.connect() as conn:
        if db.kind == "postgresql":
            conn.autocommit = False
        else:
            conn.autocommit(False)
        with conn.cursor() as cur:
            for statement in statements:
                cur.execute(statement)
        conn.commit()
