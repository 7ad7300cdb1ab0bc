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
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks import cli, report
from benchmarks import env as benv
from benchmarks.contenders import jdbc_writer
from benchmarks.microbatch import phases_of, read_log
from benchmarks.modes_data import (
    NEW_SEQ,
    PARTITIONS,
    REPLACED_DAY,
    TYPES,
    Shape,
    changes_frame,
    create_table,
    day_literal,
    frame,
    in_transaction,
    load_seed,
    merge_sql,
    reset_target,
    xasink_writer,
)
from benchmarks.modes_reader import reader_view
from benchmarks.modes_report import chart, markdown

log = logging.getLogger("benchmarks.modes")

SECTIONS = ("overwrite", "replacewhere", "cdc", "reader")


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
        ow_h, ow_s, ow_e = f"ow_hand_{tag}", f"ow_stage_{tag}", f"ow_xe_{tag}"

        def hand_prepare(run: int) -> None:
            reset_target(db, ow_h, seed)
            create_table(db, ow_s, keyed=False)

        def hand_overwrite(run: int) -> None:  # atomic by hand: a staging table, then one local transaction
            step(
                "JDBC to staging", lambda: jdbc_writer(df, db, ow_s).option("truncate", "true").mode("overwrite").save()
            )
            t, st = db.quote(ow_h), db.quote(ow_s)
            step(
                "DELETE + INSERT transaction",
                lambda: in_transaction(db, [f"DELETE FROM {t}", f"INSERT INTO {t} SELECT * FROM {st}"]),
            )

        def empty_prepare(run: int) -> None:
            create_table(db, ow_e)
            db.analyze(ow_e)
            db.settle()

        out += [
            Case(
                "overwrite",
                "hand-staging",
                "JDBC to staging, then one transaction DELETE + INSERT … SELECT",
                "yes (readers wait for the transaction)",
                hand_prepare,
                hand_overwrite,
                expect(db, ow_h, n, n),
            ),
            Case(
                "overwrite",
                "xasink-append-empty",
                'xasink mode("append") into an empty copy of the table',
                "yes (an append, not an overwrite: the floor an overwrite is measured against)",
                empty_prepare,
                lambda run: xasink_writer(df, db, ow_e, f"b-oe-{tag}", run).mode("append").save(),
                expect(db, ow_e, n, n),
            ),
        ]
        # the in-place apply, by a table the rule keeps from the swap: PostgreSQL, a view (it binds the table by
        # OID); MariaDB, a trigger (a new table would lack it) on UPDATE, which the overwrite never fires
        ow_v = f"ow_xv_{tag}"
        binding = "a view on the table" if db.kind == "postgresql" else "an UPDATE trigger on the table"

        def in_place_prepare(run: int) -> None:
            if db.kind == "postgresql":
                db.execute(f"DROP VIEW IF EXISTS {db.quote(ow_v + '_view')}")
            reset_target(db, ow_v, seed)
            if db.kind == "postgresql":
                db.execute(f"CREATE VIEW {db.quote(ow_v + '_view')} AS SELECT id FROM {db.quote(ow_v)}")
            else:
                name, t = db.quote(ow_v + "_tr"), db.quote(ow_v)
                db.execute(f"CREATE TRIGGER {name} AFTER UPDATE ON {t} FOR EACH ROW SET @xasink_bench = 1")

        out.append(
            Case(
                "overwrite",
                "xasink-in-place",
                f'xasink mode("overwrite"), {binding} (no swap: DELETE + INSERT … SELECT)',
                "yes",
                in_place_prepare,
                lambda run: xasink_writer(df, db, ow_v, f"b-ov-{tag}", run).mode("overwrite").save(),
                expect(db, ow_v, n, n),
            )
        )
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
    if db.kind == "postgresql":
        db.execute(f"DROP VIEW IF EXISTS {db.quote('ow_xv_' + db.kind[:2] + '_view')}")
    for table in (
        "ow_xa",
        "ow_xt",
        "ow_xv",
        "ow_jdbc",
        "ow_hand",
        "ow_stage",
        "ow_xe",
        "rw_xa",
        "rw_jdbc",
        "cdc_xa",
        "cdc_hand",
        "cdc_stage",
    ):
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
    log_path = benv.phase_log()
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
