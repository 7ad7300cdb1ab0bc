"""Write modes: xasink's atomic overwrite, replaceWhere and change-data apply against what users do without it.

Four sections, each on both databases (durable servers: PostgreSQL with fsync, synchronous_commit and
full_page_writes on; the machine's MariaDB, whose ``innodb_flush_log_at_trx_commit`` is recorded), the
target a keyed table (primary key on ``id``, an index on ``day``) of ``--rows`` rows (default 1M), loaded
afresh from a seed table before every timed run (not timed, then ANALYZE and a CHECKPOINT):

1. **overwrite**: the table replaced by ``--rows`` rows, 95% of the keys the same (5% gone, 5% new), new
   values: ``format("xasink").mode("overwrite")`` vs Spark's JDBC writer ``mode("overwrite")`` with
   ``truncate=true`` (tuned: batchsize 10000, rewritten batch inserts).
2. **replaceWhere**: one "day" (1/10 of the table, contiguous keys) replaced: xasink ``replaceWhere`` vs a
   ``DELETE … WHERE day = …`` by hand then the tuned JDBC writer appending (two steps, not atomic).
3. **cdc**: ``--changes`` changes (default 200k: 70% updates, 20% inserts, 10% deletes, a sequence
   column) applied: xasink ``upsertKeyColumns`` + ``deleteFlagColumn`` + ``sequenceColumn`` vs the usual
   ``foreachBatch`` code: the tuned JDBC writer loads a staging table (``overwrite``, ``truncate=true``),
   then one transaction over psycopg2/pymysql runs ``DELETE … USING`` / ``DELETE … JOIN`` and
   ``INSERT … ON CONFLICT`` / ``ON DUPLICATE KEY UPDATE``, both guarded by the sequence.
4. **reader**: a reader polls ``count(*)`` and the count of new rows every 20 ms during an overwrite that
   fails (xasink: an injected fault at ``task.before_prepare`` on the last partition, after the others
   have prepared; JDBC: the last row of the last partition raises in a UDF once the other three tasks
   have finished) and during one that succeeds, and reports what it saw.

Contenders alternate which goes first; ``--warmup`` rounds are not counted; the report gives medians.

    python -m benchmarks.modes                 # 1M rows, 200k changes, 3 runs, both databases
    python -m benchmarks.modes --quick         # 20k rows, 4k changes, one run: a harness check (< 3 min)
    python -m benchmarks.modes --db postgresql --sections overwrite,reader --runs 5
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks import cli, report
from benchmarks import env as benv
from benchmarks.contenders import jdbc_writer
from benchmarks.failure import Barrier, poisoned_frame
from benchmarks.microbatch import phases_of, read_log

log = logging.getLogger("benchmarks.modes")

PARTITIONS = 4
SECTIONS = ("overwrite", "replacewhere", "cdc", "reader")
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


# --------------------------------------------------------------------------- the timed sections


@dataclass
class Case:
    """One (section, contender): an untimed prepare, the timed run, an untimed check."""

    section: str
    contender: str
    label: str
    atomic: str
    prepare: Callable[[int], None]
    run: Callable[[int], None]
    verify: Callable[[], str | None]
    samples: list[float] = field(default_factory=list)
    parts: list[dict[str, float]] = field(default_factory=list)  # per measured run: where the time went (s)


# the steps of a two-step contender, timed by the contender itself (wall seconds per step of the last run)
STEPS: dict[str, float] = {}


def step(name: str, fn: Callable[[], None]) -> None:
    t0 = time.perf_counter()
    fn()
    STEPS[name] = time.perf_counter() - t0


# xasink's phases (xasink/support/phases.py) summed per run: task phases are the slowest partition's
XASINK_PARTS = (
    ("plan", ("plan.preflight", "plan.target", "plan.keeper", "plan.recover", "plan.shadow")),
    ("load into shadow (slowest task)", ("task.claim", "task.open_wait", "task.load")),
    ("PREPARE", ("task.prepare", "task.settle")),
    ("decide + COMMIT PREPARED", ("commit.check", "commit.decide", "commit.commit_prepared")),
    ("apply: one local transaction", ("commit.apply", "commit.mark")),
    ("sweep + trim", ("commit.sweep", "commit.trim")),
)


def xasink_parts(log_path: Path | None, t0: float, t1: float) -> dict[str, float]:
    if log_path is None:
        return {}
    raw = phases_of(read_log(log_path), t0, t1)
    out = {label: sum(raw.get(n, 0.0) for n in names) for label, names in XASINK_PARTS}
    out["Spark, worker starts, other"] = max(0.0, (t1 - t0) - sum(out.values()))
    return out


def expect(db: benv.Database, table: str, rows: int, new: int) -> Callable[[], str | None]:
    def check() -> str | None:
        got = db.count(table)
        fresh = int(db.scalar(f"SELECT count(*) FROM {db.quote(table)} WHERE seq = {NEW_SEQ}"))
        return None if (got, fresh) == (rows, new) else f"{got} rows ({fresh} new), expected {rows} ({new} new)"

    return check


def cases(spark: Any, db: benv.Database, shape: Shape, sections: list[str], seed: str) -> list[Case]:
    """The contenders of every timed section; each writes its own table."""
    tag = db.kind[:2]
    out: list[Case] = []
    n = shape.rows

    def reset(table: str) -> Callable[[int], None]:
        return lambda run: reset_target(db, table, seed)

    if "overwrite" in sections:
        df = frame(spark, *shape.overwrite_range, n, NEW_SEQ).cache()
        df.count()
        ow_x, ow_j = f"ow_xa_{tag}", f"ow_jdbc_{tag}"
        out += [
            Case(
                "overwrite",
                "xasink",
                'xasink mode("overwrite")',
                "yes",
                reset(ow_x),
                lambda run: xasink_writer(df, db, ow_x, f"b-ow-{tag}", run).mode("overwrite").save(),
                expect(db, ow_x, n, n),
            ),
            Case(
                "overwrite",
                "jdbc",
                'JDBC mode("overwrite"), truncate=true',
                "no: TRUNCATE commits first, then each partition",
                reset(ow_j),
                lambda run: jdbc_writer(df, db, ow_j).option("truncate", "true").mode("overwrite").save(),
                expect(db, ow_j, n, n),
            ),
        ]
        if db.kind == "postgresql":  # truncate=true changes nothing on MariaDB
            ow_t = f"ow_xt_{tag}"
            out.append(
                Case(
                    "overwrite",
                    "xasink-truncate",
                    'xasink mode("overwrite"), truncate=true',
                    "yes (readers wait for the apply transaction; an older REPEATABLE READ snapshot sees it empty)",
                    reset(ow_t),
                    lambda run: (
                        xasink_writer(df, db, ow_t, f"b-ot-{tag}", run)
                        .option("truncate", "true")
                        .mode("overwrite")
                        .save()
                    ),
                    expect(db, ow_t, n, n),
                )
            )
    if "replacewhere" in sections:
        lo, hi = shape.day_range
        day_df = frame(spark, lo, hi, n, NEW_SEQ).cache()
        day_df.count()
        cond = f"day = {day_literal(REPLACED_DAY)}"
        rw_x, rw_j = f"rw_xa_{tag}", f"rw_jdbc_{tag}"

        def rw_xasink(run: int) -> None:
            xasink_writer(day_df, db, rw_x, f"b-rw-{tag}", run).option("replaceWhere", cond).mode("overwrite").save()

        def rw_jdbc(run: int) -> None:
            # autocommit: readers see the day missing until the append's partitions commit
            step("DELETE", lambda: db.execute(f"DELETE FROM {db.quote(rw_j)} WHERE {cond}"))
            step("JDBC append", lambda: jdbc_writer(day_df, db, rw_j).mode("append").save())

        out += [
            Case(
                "replacewhere",
                "xasink",
                "xasink replaceWhere",
                "yes",
                reset(rw_x),
                rw_xasink,
                expect(db, rw_x, n, hi - lo),
            ),
            Case(
                "replacewhere",
                "jdbc",
                "DELETE by hand, then JDBC append",
                "no: the DELETE commits, then each partition",
                reset(rw_j),
                rw_jdbc,
                expect(db, rw_j, n, hi - lo),
            ),
        ]
    if "cdc" in sections:
        ch = changes_frame(spark, shape).cache()
        ch.count()
        updates, inserts, deletes = shape.cdc_counts
        final = n + inserts - deletes
        cdc_x, cdc_j, stage = f"cdc_xa_{tag}", f"cdc_hand_{tag}", f"cdc_stage_{tag}"

        def cdc_xasink(run: int) -> None:
            w = xasink_writer(ch, db, cdc_x, f"b-cdc-{tag}", run)
            w.options(upsertKeyColumns="id", deleteFlagColumn="is_delete", sequenceColumn="seq").mode("append").save()

        def hand_prepare(run: int) -> None:
            reset_target(db, cdc_j, seed)
            db.create_table(stage, [*TYPES, ("is_delete", "BOOLEAN", "BOOLEAN")], key=None)

        def cdc_hand(run: int) -> None:  # the body of a user's foreachBatch(batch_df, batch_id)
            step(
                "JDBC to staging",
                lambda: jdbc_writer(ch, db, stage).option("truncate", "true").mode("overwrite").save(),
            )
            step("MERGE transaction", lambda: in_transaction(db, merge_sql(db, cdc_j, stage)))

        out += [
            Case(
                "cdc",
                "xasink",
                "xasink upsertKeyColumns + deleteFlagColumn + sequenceColumn",
                "yes",
                reset(cdc_x),
                cdc_xasink,
                expect(db, cdc_x, final, updates + inserts),
            ),
            Case(
                "cdc",
                "hand-merge",
                "foreachBatch: JDBC to staging, then one MERGE transaction",
                "the MERGE is one transaction; the staging load is a separate, earlier step",
                hand_prepare,
                cdc_hand,
                expect(db, cdc_j, final, updates + inserts),
            ),
        ]
    return out


def timed_sections(
    spark: Any,
    db: benv.Database,
    shape: Shape,
    sections: list[str],
    runs: int,
    warmup: int,
    bar: Any,
    log_path: Path | None = None,
) -> list[dict[str, Any]]:
    seed = f"seed_{db.kind[:2]}"
    load_seed(spark, db, seed, shape.rows)
    all_cases = cases(spark, db, shape, sections, seed)
    batch = int(time.time()) % 1_000_000  # xasink batch ids: new in every run of the benchmark
    for section in [s for s in SECTIONS if s != "reader" and s in sections]:
        group = [c for c in all_cases if c.section == section]
        for i in range(warmup + runs):
            for case in group[i % len(group) :] + group[: i % len(group)]:  # each goes first in turn
                bar.set_postfix_str(f"{db.kind} {section} {case.contender}")
                case.prepare(i)
                STEPS.clear()
                w0 = time.time()
                t0 = time.perf_counter()
                case.run(batch)
                seconds = time.perf_counter() - t0
                w1 = time.time()
                batch += 1
                wrong = case.verify()
                if wrong:
                    raise SystemExit(f"{db.kind} {section} {case.contender} run {i}: {wrong}")
                if i >= warmup:
                    case.samples.append(seconds)
                    case.parts.append(
                        xasink_parts(log_path, w0, w1) if case.contender.startswith("xasink") else dict(STEPS)
                    )
                log.info(
                    "%s %s %s run %d: %.2f s%s",
                    db.kind,
                    section,
                    case.contender,
                    i,
                    seconds,
                    " (warm-up)" * (i < warmup),
                )
                bar.update(1)
    results = []
    for section in [s for s in SECTIONS if s != "reader" and s in sections]:
        group = [c for c in all_cases if c.section == section]
        base = next(c for c in group if not c.contender.startswith("xasink"))
        base_s = statistics.median(base.samples)
        for c in group:
            med = statistics.median(c.samples)
            results.append(
                {
                    "db": db.kind,
                    "section": section,
                    "rows": shape.rows,
                    "written": written(section, shape),
                    "contender": c.contender,
                    "label": c.label,
                    "atomic": c.atomic,
                    "median_s": round(med, 2),
                    "runs_s": rounded(c.samples),
                    "baseline": base.contender,
                    "speedup": round(base_s / med, 2),  # the non-xasink contender's time / this one's: > 1 faster
                    "parts_s": median_parts(c.parts),  # xasink's phases, the other's steps
                }
            )
    for table in ("ow_xa", "ow_xt", "ow_jdbc", "rw_xa", "rw_jdbc", "cdc_xa", "cdc_hand", "cdc_stage"):
        db.drop(f"{table}_{db.kind[:2]}")
    db.drop(seed)
    return results


def median_parts(runs: list[dict[str, float]]) -> dict[str, float]:
    keys = list(dict.fromkeys(k for r in runs for k in r))
    return {k: round(statistics.median(r.get(k, 0.0) for r in runs), 2) for k in keys}


def written(section: str, shape: Shape) -> int:
    if section == "overwrite":
        return shape.rows
    if section == "replacewhere":
        lo, hi = shape.day_range
        return hi - lo
    return shape.changes


def rounded(xs: list[float]) -> list[float]:
    return [round(x, 3) for x in xs]


# --------------------------------------------------------------------------- 4. what a reader sees


class Reader(benv.Poller):
    """``count(*)`` and the count of new rows (seq = NEW_SEQ) every 20 ms."""

    def __init__(self, db: benv.Database, table: str) -> None:
        super().__init__(db, table, 0.02)
        self.samples: list[tuple[int, int]] = []
        self.statement = (
            f"SELECT count(*), coalesce(sum(CASE WHEN seq = {NEW_SEQ} THEN 1 ELSE 0 END), 0) FROM {db.quote(table)}"
        )

    def poll(self, cur: Any) -> None:
        cur.execute(self.statement)
        total, new = cur.fetchone()
        self.samples.append((int(total), int(new)))

    def __enter__(self) -> Reader:
        self.start()
        time.sleep(0.2)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop(linger=0.3)  # a few samples of the end state


def reader_view(spark: Any, db: benv.Database, shape: Shape, delay: float) -> list[dict[str, Any]]:
    """A failed and a successful overwrite per contender, a reader polling throughout."""
    from xasink.support.faults import LOCAL_PROPERTY

    n = shape.rows
    seed = f"seed_rd_{db.kind[:2]}"
    load_seed(spark, db, seed, n)
    df = frame(spark, *shape.overwrite_range, n, NEW_SEQ).cache()
    df.count()
    sc = spark.sparkContext
    batch = int(time.time()) % 1_000_000 + 500_000
    out = []
    contenders = ["xasink", "xasink-truncate", "jdbc"] if db.kind == "postgresql" else ["xasink", "jdbc"]
    for contender in contenders:
        table = f"rd_{contender.replace('-', '_')}_{db.kind[:2]}"
        sink = f"b-rd-{contender[-2:]}-{db.kind[:2]}"
        for outcome in ("fails", "succeeds"):
            reset_target(db, table, seed)
            error = None
            barrier = os.path.join(tempfile.gettempdir(), f"xasink-modes-barrier-{uuid.uuid4().hex}")
            with Reader(db, table) as reader:
                t0 = time.perf_counter()
                try:
                    if contender.startswith("xasink"):
                        if outcome == "fails":  # the last partition: rows loaded, then raises before PREPARE
                            spec = f"task.before_prepare:sleep={delay}:p={PARTITIONS - 1},"
                            spec += f"task.before_prepare:raise:p={PARTITIONS - 1}"
                            sc.setLocalProperty(LOCAL_PROPERTY, spec)
                        try:
                            w = xasink_writer(df, db, table, sink, batch)
                            w.option("truncate", str(contender == "xasink-truncate").lower()).mode("overwrite").save()
                        finally:
                            sc.setLocalProperty(LOCAL_PROPERTY, None)  # type: ignore[arg-type]
                    elif outcome == "fails":  # the last row of the last partition raises once the others finished
                        bad = poisoned_frame(df, shape.overwrite_range[1] - 1, barrier, delay)
                        with Barrier(spark, barrier, PARTITIONS):
                            jdbc_writer(bad, db, table).option("truncate", "true").mode("overwrite").save()
                    else:
                        jdbc_writer(df, db, table).option("truncate", "true").mode("overwrite").save()
                except Exception as exc:  # noqa: BLE001 - expected when it fails
                    error = str(exc).splitlines()[0][:160]
                seconds = time.perf_counter() - t0
            batch += 1
            out.append(view(db, sink, table, contender, outcome, n, reader, error, seconds))
            log.info("%s reader, %s %s: %s", db.kind, contender, outcome, out[-1]["verdict"])
        db.drop(table)
    df.unpersist()
    db.drop(seed)
    return out


def view(
    db: benv.Database,
    sink: str,
    table: str,
    contender: str,
    outcome: str,
    n: int,
    reader: Reader,
    error: str | None,
    seconds: float,
) -> dict[str, Any]:
    s = reader.samples
    totals = [t for t, _ in s] or [0]
    news = [w for _, w in s] or [0]
    final_total = db.count(table)
    final_new = int(db.scalar(f"SELECT count(*) FROM {db.quote(table)} WHERE seq = {NEW_SEQ}"))
    empty = sum(1 for t, _ in s if t == 0)
    old_only = sum(1 for t, w in s if t == n and w == 0)
    new_only = sum(1 for t, w in s if t == n and w == n)
    partial = len(s) - empty - old_only - new_only  # a mix of old and new, or a part of either
    failed_ok = outcome == "fails" and error is not None
    problems = []
    if outcome == "fails" and error is None:
        problems.append("did not fail")
    if outcome == "succeeds" and error is not None:
        problems.append(f"failed: {error}")
    if empty:
        problems.append(f"empty table in {empty} reads")
    if partial:
        problems.append(f"partial or mixed table in {partial} reads")
    end_want = (n, 0) if outcome == "fails" else (n, n)
    if (final_total, final_new) != end_want:
        problems.append(f"left {final_total} rows ({final_new} new)")
    left = db.left_prepared(problems, sink)
    return {
        "db": db.kind,
        "contender": contender,
        "outcome": outcome,
        "rows": n,
        "samples": len(s),
        "min_count": min(totals),
        "max_count": max(totals),
        "min_new": min(news),
        "max_new": max(news),
        "reads_empty": empty,
        "reads_old_only": old_only,
        "reads_new_only": new_only,
        "reads_partial_or_mixed": partial,
        "final_rows": final_total,
        "final_new_rows": final_new,
        "prepared_left": left,
        "error": error if failed_ok or error else None,
        "reader_error": reader.error,
        "seconds": round(seconds, 2),
        "median_read_ms": round(1000 * statistics.median(reader.read_s), 1) if reader.read_s else None,
        "longest_read_ms": round(1000 * max(reader.read_s), 1) if reader.read_s else None,
        "verdict": "; ".join(problems)
        if problems
        else ("old rows throughout" if outcome == "fails" else "old rows, then all new rows at once"),
    }


# --------------------------------------------------------------------------- report


SECTION_TITLE = {
    "overwrite": "1. Overwrite: the whole table replaced",
    "replacewhere": "2. replaceWhere: one day (1/10 of the table) replaced",
    "cdc": "3. Change-data apply: 70% updates, 20% inserts, 10% deletes, sequence column",
}


def markdown(res: dict[str, Any]) -> str:
    m = res["setup"]["machine"]
    lines = [
        f"# Write modes: {res['name']}",
        "",
        f"Command: `{res['command']}`  ",
        f"Started {res['started']}, {res['elapsed_s']} s. Machine: {m['cpus']} CPUs ({m['cpu_model']}), "
        f"{m['memory_gb']} GB; load average at start {m['load_average_at_start']}, at end "
        f"{res['setup']['load_average_at_end']}. Spark {res['setup']['spark']}, local[{PARTITIONS}], "
        f"{PARTITIONS} partitions.",
        "",
    ]
    lines += report.settings_lines(res["setup"]["databases"])
    lines += ["", *[f"- note: {x}" for x in res["notes"]], ""]
    lines += [
        f"Target: a keyed table (primary key on id, index on day; columns {', '.join(COLUMNS)}) of "
        f"{res['shape']['rows']:,} rows, loaded afresh before each run (not timed). {res['runs']} measured runs "
        f"per contender after {res['warmup']} warm-up, interleaved (each goes first in turn); medians (all runs in the "
        "JSON). Speed-up = the non-xasink contender's time / this contender's (> 1: faster than it).",
        "",
    ]
    for section in ("overwrite", "replacewhere", "cdc"):
        rows = [r for r in res["timed"] if r["section"] == section]
        if not rows:
            continue
        lines += [f"## {SECTION_TITLE[section]}", ""]
        lines += [
            "| database | table rows | rows written | contender | median s | speed-up vs non-xasink | atomic? |",
            "|---|---:|---:|---|---:|---:|---|",
        ]
        for r in rows:
            settings = res["setup"]["databases"].get(r["db"], {})
            durab = (
                f"fsync={settings.get('fsync')}, synchronous_commit={settings.get('synchronous_commit')}"
                if r["db"] == "postgresql"
                else f"innodb_flush_log_at_trx_commit={settings.get('innodb_flush_log_at_trx_commit')}"
            )
            lines.append(
                f"| {r['db']} ({durab}) | {r['rows']:,} | {r['written']:,} | {r['label']} | {r['median_s']} | "
                f"{r['speedup']}x | {r['atomic']} |"
            )
        lines += ["", "Where the time goes (medians, s):", ""]
        for r in rows:
            if r["parts_s"]:
                lines.append(
                    f"- {r['db']}, {r['contender']}: " + ", ".join(f"{k} {v}" for k, v in r["parts_s"].items())
                )
        lines.append("")
    if res["reader"]:
        lines += [
            "## 4. What a reader sees during an overwrite",
            "",
            "A reader polls `count(*)` and the count of new rows every 20 ms (READ COMMITTED) while the table "
            f"({res['reader_rows']:,} rows) is overwritten by {res['reader_rows']:,} rows with 95% of the same keys. "
            "`fails`: xasink with a fault at `task.before_prepare` on the last partition (raised after "
            f"{res['failure_delay']} s, when the others have prepared); JDBC with the last row of the last partition "
            "raising in a UDF once the other three tasks have finished (their rows committed).",
            "",
            "| database | contender | run | reads | min count | max count | min new | max new | reads empty | "
            "reads partial/mixed | median / longest read ms | left after | verdict |",
            "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
        ]
        for r in res["reader"]:
            lines.append(
                f"| {r['db']} | {r['contender']} | {r['outcome']} | {r['samples']} | {r['min_count']:,} | "
                f"{r['max_count']:,} | {r['min_new']:,} | {r['max_new']:,} | {r['reads_empty']} | "
                f"{r['reads_partial_or_mixed']} | {r['median_read_ms']} / {r['longest_read_ms']} | "
                f"{r['final_rows']:,} rows, {r['final_new_rows']:,} new "
                f"| {r['verdict']} |"
            )
        lines.append("")
    if res["errors"]:
        lines += ["## Errors", "", *[f"- {e}" for e in res["errors"]], ""]
    lines += [f"![chart]({c})" for c in res.get("charts", [])]
    return "\n".join(lines) + "\n"


def chart(res: dict[str, Any], out: Path, name: str) -> list[str]:
    rows = res["timed"]
    if not rows:
        return []
    plt = report.pyplot()
    groups = list(dict.fromkeys((r["db"], r["section"]) for r in rows))
    names = list(dict.fromkeys(r["contender"] for r in rows))
    width = 0.8 / len(names)
    fig, ax = plt.subplots(figsize=(max(6, 1.8 * len(groups)), 4.8))
    for k, name in enumerate(names):
        xs, ys = [], []
        for g, (db, section) in enumerate(groups):
            r = next((r for r in rows if (r["db"], r["section"], r["contender"]) == (db, section, name)), None)
            if r is not None:
                xs.append(g - 0.4 + width * (k + 0.5))
                ys.append(r["median_s"])
                ax.text(xs[-1], ys[-1] * 1.02, f"{r['speedup']}x", ha="center", fontsize=7)
        label = name if name.startswith("xasink") else f"{name} (not atomic)"
        ax.bar(xs, ys, width, label=label)
    ax.set_xticks(list(range(len(groups))))
    ax.set_xticklabels([f"{db}\n{section}" for db, section in groups], fontsize=8)
    ax.set_ylabel("seconds (median)")
    ax.set_title(f"Write modes, {res['shape']['rows']:,}-row keyed table (label: speed-up vs the non-xasink writer)")
    ax.legend(fontsize=8)
    return [report.save_fig(fig, out / f"{name}.png")]


def save(args: argparse.Namespace, res: dict[str, Any]) -> Path:
    report.finish(res)
    return report.write(res, args.out, args.name, markdown, chart)


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = cli.parser("benchmarks.modes", __doc__, "modes; quick: modes-quick")
    p.add_argument("--quick", action="store_true", help="20k rows, 4k changes, one run: a harness check")
    p.add_argument("--rows", type=int, help="rows in the table (default 1000000; quick 20000)")
    p.add_argument("--changes", type=int, help="rows in the change batch (default 200000; quick 4000)")
    p.add_argument("--runs", type=int, help="measured runs per contender (default 3; quick 1)")
    p.add_argument("--warmup", type=int, help="unmeasured rounds first (default 1; quick 0)")
    p.add_argument("--reader-rows", type=int, help="table rows in the reader section (default --rows)")
    p.add_argument("--failure-delay", type=float, help="seconds before the failing partition raises (1; quick 0.5)")
    p.add_argument("--sections", default=",".join(SECTIONS), help=",".join(SECTIONS))
    args = cli.parse(p, argv)
    q = args.quick
    args.rows = args.rows or (20_000 if q else 1_000_000)
    args.changes = args.changes or (4_000 if q else 200_000)
    args.runs = args.runs or (1 if q else 3)
    args.warmup = args.warmup if args.warmup is not None else (0 if q else 1)
    args.reader_rows = args.reader_rows or args.rows
    args.failure_delay = args.failure_delay if args.failure_delay is not None else (0.5 if q else 1.0)
    args.name = args.name or ("modes-quick" if q else "modes")
    args.section_list = cli.split(args.sections)
    for bad in set(args.section_list) - set(SECTIONS):
        p.error(f"unknown section {bad!r}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cli.logs()
    shape = Shape(args.rows, args.changes)
    res = report.start(
        args,
        shape={"rows": shape.rows, "changes": shape.changes, "cdc_updates_inserts_deletes": shape.cdc_counts},
        runs=args.runs,
        warmup=args.warmup,
        reader_rows=args.reader_rows,
        failure_delay=args.failure_delay,
        timed=[],
        reader=[],
    )
    log_path = Path(tempfile.mkdtemp(prefix="xasink-phases-")) / "phases.jsonl"
    os.environ["XASINK_PHASE_LOG"] = str(log_path)  # before Spark starts: every worker inherits it
    with benv.databases(args.dbs, args.mariadb, notes=res["notes"]) as every:
        res["setup"]["databases"] = {db.kind: db.settings for db in every}
        res["errors"] += [db.note for db in every if not db.xasink_ok]
        dbs = [d for d in every if d.xasink_ok]
        spark = benv.spark_session(f"local[{PARTITIONS}]", res["notes"])
        import pyspark

        res["setup"]["spark"] = pyspark.__version__
        timed = [s for s in args.section_list if s != "reader"]
        per_db = len(timed) * 2 * (args.runs + args.warmup) + 6 * ("reader" in args.section_list)
        total = len(dbs) * per_db + ("overwrite" in timed) * (args.runs + args.warmup)  # + xasink truncate=true
        try:
            with cli.progress(total, "modes") as bar:
                for db in dbs:
                    try:
                        if timed:
                            res["timed"] += timed_sections(
                                spark, db, shape, timed, args.runs, args.warmup, bar, log_path
                            )
                        if "reader" in args.section_list:
                            got = reader_view(spark, db, Shape(args.reader_rows, args.changes), args.failure_delay)
                            res["reader"] += got
                            bar.update(len(got))
                    except Exception as exc:  # noqa: BLE001 - recorded; the other database still runs
                        res["errors"].append(f"{db.kind}: {str(exc).splitlines()[0][:300]}")
                        log.exception("%s", db.kind)
                    save(args, res)  # partial results survive an interrupted run
        finally:
            spark.stop()
    print(save(args, res).read_text())
    return 1 if res["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
