"""One command for every measurement: ``python -m benchmarks.run [--sizes ...] [--db ...] [--quick]``.

Sections (``--sections``): throughput (every contender on the same cached DataFrame, 4 partitions, a warm-up
round then ``--runs`` measured rounds, interleaved), failure (what a concurrent reader sees when one partition
fails), coordinator (decide + commit N branches), and memory (worker peak RSS at two partition sizes).
Results go to benchmarks/results/<name>.*
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time
import traceback
from datetime import datetime
from pathlib import Path
from typing import Any

from benchmarks import cli, cpu, data, env, report, run_report
from benchmarks import contenders as cmod

log = logging.getLogger("benchmarks")

SECTIONS = ("throughput", "failure", "coordinator", "memory")
DEFAULT_SIZES = "100000,1000000,2000000"  # 2M: the size the targets are stated for
QUICK_SIZES = "20000,100000"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = cli.parser("benchmarks.run", __doc__, "quick or full, plus a time stamp")
    p.add_argument(
        "--sizes", help=f"rows per DataFrame, comma-separated (default {DEFAULT_SIZES}; quick {QUICK_SIZES})"
    )
    p.add_argument("--schemas", default="narrow,wide", help="narrow,wide")
    p.add_argument("--wide-max", type=int, default=1_000_000, help="largest size run with the wide schema (1000000)")
    p.add_argument("--runs", type=int, help="measured runs per contender (default 3; quick 1)")
    p.add_argument("--warmup", type=int, default=1, help="warm-up rounds before measuring (default 1)")
    p.add_argument("--quick", action="store_true", help="small sizes, one run: to check the harness, not to quote")
    p.add_argument("--sections", default=",".join(SECTIONS), help=",".join(SECTIONS))
    p.add_argument("--contenders", default=",".join(cmod.BY_NAME), help="subset of " + ",".join(cmod.BY_NAME))
    p.add_argument("--master", default="local[4]", help="Spark master (default local[4]: one core per partition)")
    p.add_argument("--arrow-batch", type=int, default=10_000, help="spark.sql.execution.arrow.maxRecordsPerBatch")
    p.add_argument("--failure-size", type=int, help="rows in the failure scenario (default 200000; quick 20000)")
    p.add_argument(
        "--failure-delay", type=float, default=0.5, help="seconds the failing partition waits after the others finished"
    )
    p.add_argument("--branches", help="coordinator scale branch counts (default 8,64,256; quick 8,64)")
    p.add_argument("--commit-parallelism", default="4,16", help="commitParallelism values for the coordinator scale")
    p.add_argument("--memory-sizes", help="rows per partition for the memory probe (default 250000,1000000)")
    p.add_argument(
        "--no-durable",
        dest="durable",
        action="store_false",
        help="run PostgreSQL with fsync/synchronous_commit off (faster, not what users run; never for headlines)",
    )
    p.add_argument("-v", "--verbose", action="store_true")
    args = cli.parse(p, argv)
    q = args.quick
    args.sizes = cli.ints(args.sizes or (QUICK_SIZES if q else DEFAULT_SIZES))
    args.runs = args.runs or (1 if q else 3)
    args.failure_size = args.failure_size or (20_000 if q else 200_000)
    args.branches = cli.ints(args.branches or ("8,64" if q else "8,64,256"))
    args.commit_parallelism = cli.ints(args.commit_parallelism)
    args.memory_sizes = cli.ints(args.memory_sizes or ("20000,80000" if q else "250000,1000000"))
    args.schema_list = cli.split(args.schemas)
    args.section_list = cli.split(args.sections)
    args.contender_list = cli.split(args.contenders)
    stamp = datetime.now().strftime("%Y%m%d-%H%M")
    args.name = args.name or f"{'quick' if q else 'full'}-{stamp}"
    for bad in set(args.section_list) - set(SECTIONS):
        p.error(f"unknown section {bad!r}")
    for bad in set(args.contender_list) - set(cmod.BY_NAME):
        p.error(f"unknown contender {bad!r}")
    for bad in set(args.schema_list) - set(data.SCHEMAS):
        p.error(f"unknown schema {bad!r}")
    return args


def available(contender: cmod.Contender, db: env.Database) -> str | None:
    """None when the contender can run against db, else why not."""
    if contender.needs == "xasink" and not db.xasink_ok:
        return db.note or "xasink dialect unavailable"
    if contender.needs == "jdbc":
        return env.jar_missing(db.kind)
    if contender.needs == "csv":
        client = "psql" if db.kind == "postgresql" else "mysql"
        if shutil.which(client) is None:
            return f"{client} client not installed"
    return None


def throughput(args: argparse.Namespace, spark: Any, dbs: list[env.Database], work: Path, res: dict[str, Any]) -> None:
    results: list[dict[str, Any]] = res["throughput"]
    chosen = [cmod.BY_NAME[n] for n in args.contender_list]
    rounds = args.warmup + args.runs
    cells = [(s, n) for s in args.schema_list for n in args.sizes if not (s == "wide" and n > args.wide_max)]
    with cli.progress(len(cells) * len(dbs) * len(chosen) * rounds, "throughput runs") as bar:
        _throughput(args, spark, dbs, work, res, results, chosen, bar)


def _throughput(
    args: argparse.Namespace,
    spark: Any,
    dbs: list[env.Database],
    work: Path,
    res: dict[str, Any],
    results: list[dict[str, Any]],
    chosen: list[cmod.Contender],
    bar: Any,
) -> None:
    for schema in args.schema_list:
        for size in args.sizes:
            if schema == "wide" and size > args.wide_max:
                res["notes"].append(f"wide schema not run at {size} rows (--wide-max {args.wide_max})")
                continue
            df = data.frame(spark, schema, size).cache()
            t0 = time.perf_counter()
            df.count()
            log.info("cached %s %s rows in %.1fs", schema, size, time.perf_counter() - t0)
            csv_files: list[Path] = []
            try:
                for db in dbs:
                    ready = []
                    for c in chosen:
                        why = available(c, db)
                        if why:
                            bar.update(args.warmup + args.runs)
                            results.append(
                                {
                                    "db": db.kind,
                                    "schema": schema,
                                    "size": size,
                                    "contender": c.name,
                                    "label": c.label,
                                    "note": why,
                                }
                            )
                            continue
                        ready.append(c)
                    if any(c.needs == "csv" for c in ready) and not csv_files:
                        csv_files = data.write_csv(df, schema, work / f"csv-{schema}-{size}")
                    seed = f"seed_{schema}_{size}"
                    if any(c.kind == "upsert" for c in ready):
                        cmod.make_seed(spark, db, df, schema, seed)
                    times: dict[str, list[float]] = {c.name: [] for c in ready}
                    cpu_used: dict[str, list[dict[str, float]]] = {c.name: [] for c in ready}
                    errors: dict[str, str] = {}
                    for rnd in range(args.warmup + args.runs):
                        measuring = rnd >= args.warmup
                        for c in ready:
                            bar.set_postfix_str(f"{db.kind} {schema} {size} {c.name}", refresh=False)
                            bar.update(1)
                            if c.name in errors:
                                continue
                            table = f"t_{c.name.replace('-', '_')}"
                            ctx = cmod.Ctx(
                                spark,
                                db,
                                df,
                                schema,
                                size,
                                run=rnd + int(time.time()) % 100_000 * 100,
                                table=table,
                                seed_table=seed,
                                csv_files=csv_files,
                            )
                            try:
                                c.prepare(ctx)
                                cmod.warm_python_workers(ctx)
                                before = cpu.snapshot()
                                seconds = cmod.timed(functools.partial(c.run, ctx))
                                spent = cpu.used(before, cpu.snapshot())
                                wrong = c.verify(ctx)
                                if wrong:
                                    raise RuntimeError(f"wrong result: {wrong}")
                            except Exception as exc:  # noqa: BLE001 - one contender failing must not end the run
                                errors[c.name] = cmod.summary(exc)
                                log.error("%s %s %s %s: %s", db.kind, schema, size, c.name, errors[c.name])
                                log.debug("%s", traceback.format_exc())
                                continue
                            log.info(
                                "%s %s %-7s %-14s %s %.2fs (%.0f rows/s)",
                                db.kind,
                                schema,
                                size,
                                c.name,
                                "run" if measuring else "warm-up",
                                seconds,
                                size / seconds,
                            )
                            if measuring:
                                times[c.name].append(seconds)
                                cpu_used[c.name].append(spent)
                    for c in ready:
                        t = times[c.name]
                        entry: dict[str, Any] = {
                            "db": db.kind,
                            "schema": schema,
                            "size": size,
                            "contender": c.name,
                            "label": c.label,
                            "runs_s": [round(x, 3) for x in t],
                        }
                        if t:
                            med = statistics.median(t)
                            entry |= {"median_s": round(med, 3), "rows_per_s": round(size / med)}
                            entry["cpu_s"] = cpu.summarize(cpu_used[c.name], med)
                        if c.name in errors:
                            entry["error"] = errors[c.name]
                            res["errors"].append(f"{db.kind} {schema} {size} {c.name}: {errors[c.name]}")
                        results.append(entry)
                        db.drop(f"t_{c.name.replace('-', '_')}")
                    db.drop(seed)
                    left = db.prepared()
                    if left:
                        res["errors"].append(f"{db.kind}: {left} prepared transactions left after {schema} {size}")
            finally:
                df.unpersist()
                shutil.rmtree(work / f"csv-{schema}-{size}", ignore_errors=True)
            save(args, res)  # partial results survive an interrupted run


def save(args: argparse.Namespace, res: dict[str, Any]) -> None:
    run_report.derive(res)
    report.finish(res)
    log.info("results: %s", report.write(res, args.out, args.name, run_report.markdown, run_report.charts))


def per_db(res: dict[str, Any], key: str, what: str, dbs: list[env.Database], fn: Any) -> None:
    """``fn(db)``'s records under ``res[key]`` for every database; a failure is an error line, the next runs."""
    for db in dbs:
        try:
            res[key] += fn(db)
        except Exception as exc:  # noqa: BLE001 - one database failing must not end the run
            res["errors"].append(f"{what} on {db.kind}: {exc}")
            log.exception("%s on %s", what, db.kind)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cli.logs(args.verbose)
    res = report.start(args, throughput=[], failure=[], coordinator=[], memory=[])
    res["setup"] |= {"runs": args.runs, "warmup": args.warmup}
    work = Path(tempfile.mkdtemp(prefix="xasink-bench-"))
    os.chmod(work, 0o755)
    try:
        with env.databases(args.dbs, args.mariadb, args.durable, res["notes"]) as dbs:
            res["setup"]["databases"] = {db.kind: db.settings for db in dbs}
            needs_spark = any(s in args.section_list for s in ("throughput", "failure", "memory"))
            spark = env.spark_session(args.master, res["notes"], args.arrow_batch) if needs_spark else None
            import pyspark

            res["setup"]["spark"] = {
                "version": pyspark.__version__,
                "master": args.master,
                "partitions": data.PARTITIONS,
                "arrow_batch": args.arrow_batch,
            }
            try:
                run_sections(args, spark, dbs, work, res)
            finally:
                if spark is not None:
                    spark.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(Path(args.out) / f"{args.name}.md")
    return 0


def run_sections(
    args: argparse.Namespace, spark: Any, dbs: list[env.Database], work: Path, res: dict[str, Any]
) -> None:
    if "throughput" in args.section_list:
        throughput(args, spark, dbs, work, res)
    if "failure" in args.section_list:
        from benchmarks.failure import SCENARIO_CONTENDERS, run_scenario

        def scenario(db: env.Database) -> list[dict[str, Any]]:
            names = [n for n in SCENARIO_CONTENDERS if available(cmod.BY_NAME[n], db) is None]
            return run_scenario(spark, db, args.failure_size, names, args.failure_delay)

        per_db(res, "failure", "failure scenario", dbs, scenario)
        save(args, res)
    pg = next((d for d in dbs if d.kind == "postgresql"), None)
    if "coordinator" in args.section_list and pg is not None:
        from benchmarks.scale import run_scale

        res["coordinator"] = run_scale(pg, args.branches, args.runs, args.commit_parallelism)
        save(args, res)
    if "memory" in args.section_list:
        from benchmarks.memory import run_memory

        per_db(res, "memory", "memory probe", dbs, lambda db: run_memory(spark, db, args.memory_sizes))
    save(args, res)


if __name__ == "__main__":
    sys.exit(main())
