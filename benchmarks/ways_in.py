"""The two ways in side by side: ``xasink.write`` through the data source against the partition function.

On Spark 3.5 xasink's Python entry points run the data source's writer over ``mapInArrow`` + ``collect``
(xasink/spark/partition_job.py, docs/spark-versions.md); on 4.x they go through ``format("xasink")``.  Both
ways run here on the installed Spark (4.x), chosen per write with ``XASINK_SPARK_WAY_IN``, interleaved
(every round runs each once, the order alternating): a bulk write of ``--rows`` narrow rows (4 partitions,
``local[4]``, a fresh keyed table each run), and ``--batches`` micro-batches of ``--batch-rows`` rows
(2 partitions, one batch id each) after ``--warmup`` unmeasured ones.  Servers are durable (fsync and
synchronous_commit on), as users run them.  The report gives medians, the partition function's speed as a
ratio of the data source's, and the load average (the machine may be shared).

    python -m benchmarks.ways_in                                   # 2M rows x 5, 10k-row batches x 30
    python -m benchmarks.ways_in --db postgresql --rows 200000 --runs 2 --batches 5 --name ways-check
"""

from __future__ import annotations

import logging
import os
import statistics
import sys
import time
from typing import Any

from benchmarks import cli, data, report
from benchmarks import env as benv
from xasink.spark.partition_job import WAY_IN_ENV

log = logging.getLogger("benchmarks.ways_in")

WAYS = ("datasource", "partitions")
MICRO_PARTITIONS = 2


def parse_args(argv: list[str] | None = None) -> Any:
    p = cli.parser("benchmarks.ways_in", __doc__, "ways-in-<time>")
    p.add_argument("--rows", type=int, default=2_000_000, help="rows of the bulk write (default 2000000)")
    p.add_argument("--runs", type=int, default=5, help="measured bulk rounds (default 5), after one warm-up")
    p.add_argument("--batch-rows", type=int, default=10_000, help="rows per micro-batch (default 10000)")
    p.add_argument("--batches", type=int, default=30, help="measured micro-batches per way (default 30)")
    p.add_argument("--warmup", type=int, default=20, help="unmeasured micro-batches per way first (default 20)")
    args = cli.parse(p, argv)
    args.name = args.name or time.strftime("ways-in-%Y%m%d-%H%M%S")
    return args


def write(way: str, df: Any, db: benv.Database, table: str, sink: str, batch: int) -> float:
    """One ``xasink.write`` by ``way``; its wall seconds."""
    import xasink

    os.environ[WAY_IN_ENV] = way
    t0 = time.perf_counter()
    result = xasink.write(df, db.xasink_url, table, sink_id=sink, batch_id=batch)
    took = time.perf_counter() - t0
    if result.skipped:
        raise SystemExit(f"{way}: batch {batch} of {sink} was skipped")
    return took


def bulk(spark: Any, db: benv.Database, rows: int, runs: int) -> dict[str, Any]:
    df = data.frame(spark, "narrow", rows).cache()
    df.count()
    times: dict[str, list[float]] = {w: [] for w in WAYS}
    for i in range(runs + 1):  # round 0 warms both ways up
        for way in WAYS if i % 2 == 0 else tuple(reversed(WAYS)):
            table = f"wi_bulk_{way}"
            db.drop(table)
            data.create_table(db, table, "narrow")
            db.settle()
            took = write(way, df, db, table, f"b-wi-{way[:4]}-{time.time_ns() % 10**9}", 1)
            if db.count(table) != rows:
                raise SystemExit(f"{db.kind} {way}: {db.count(table)} rows, expected {rows}")
            if i:
                times[way].append(took)
            log.info("%s bulk %s round %d: %.2f s", db.kind, way, i, took)
    df.unpersist()
    return summary(times, rows)


def micro(spark: Any, db: benv.Database, size: int, batches: int, warmup: int) -> dict[str, Any]:
    times: dict[str, list[float]] = {w: [] for w in WAYS}
    tables = {w: f"wi_micro_{w}" for w in WAYS}
    sinks = {w: f"b-wim-{w[:4]}-{time.time_ns() % 10**9}" for w in WAYS}
    for table in tables.values():
        db.drop(table)
        data.create_table(db, table, "narrow")
    for i in range(warmup + batches):
        df = spark.range(i * size, (i + 1) * size, 1, MICRO_PARTITIONS).selectExpr(
            *[f"{c.expr} as {c.name}" for c in data.NARROW]
        )
        for way in WAYS if i % 2 == 0 else tuple(reversed(WAYS)):
            took = write(way, df, db, tables[way], sinks[way], i)
            if i >= warmup:
                times[way].append(took)
    for way, table in tables.items():
        if db.count(table) != size * (warmup + batches):
            raise SystemExit(f"{db.kind} {way}: {db.count(table)} rows in {table}")
    return summary(times, size)


def summary(times: dict[str, list[float]], rows: int) -> dict[str, Any]:
    out: dict[str, Any] = {"rows": rows, "seconds": times}
    for way, t in times.items():
        out[way] = {"median_s": round(statistics.median(t), 4), "rows_per_s": round(rows / statistics.median(t))}
    # the partition function's speed as a fraction of the data source's (above 1: faster)
    out["speed_ratio"] = round(out["datasource"]["median_s"] / out["partitions"]["median_s"], 3)
    return out


def markdown(res: dict[str, Any]) -> str:
    lines = [f"# Ways in: {res['name']}", "", f"Command: `{res['command']}`", ""]
    lines += [f"Machine: {res['setup']['machine']}", ""]
    lines += report.settings_lines(res["setup"]["databases"])
    lines += [
        "",
        f"Load average at start {res['load_average_at_start']}, at end {res['setup'].get('load_average_at_end')} "
        f"(the machine was shared: timings are compared within a round, never across runs).",
        "",
        "Medians; `partitions / datasource` is the partition function's speed as a fraction of the data "
        "source's (target: at least 0.9).",
        "",
        "| database | write | rows | datasource s | partitions s | partitions / datasource |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for r in res["results"]:
        for kind in ("bulk", "micro"):
            s = r[kind]
            label = "bulk (4 partitions)" if kind == "bulk" else f"micro-batch ({MICRO_PARTITIONS} partitions)"
            lines.append(
                f"| {r['db']} | {label} | {s['rows']:,} | {s['datasource']['median_s']} | "
                f"{s['partitions']['median_s']} | {s['speed_ratio']} |"
            )
    lines += ["", *[f"- {n}" for n in res["notes"]]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cli.logs()
    res = report.start(args, results=[], load_average_at_start=report.load_average())
    with benv.databases(args.dbs, args.mariadb, notes=res["notes"]) as dbs:
        res["setup"]["databases"] = {db.kind: db.settings for db in dbs}
        spark = benv.spark_session("local[4]", res["notes"])
        try:
            for db in dbs:
                row = {"db": db.kind, "bulk": bulk(spark, db, args.rows, args.runs)}
                log.info("%s bulk: %s", db.kind, {w: row["bulk"][w] for w in WAYS})
                row["micro"] = micro(spark, db, args.batch_rows, args.batches, args.warmup)
                log.info("%s micro: %s", db.kind, {w: row["micro"][w] for w in WAYS})
                res["results"].append(row)
                report.finish(res)
                report.write(res, args.out, args.name, markdown)
        finally:
            spark.stop()
    report.finish(res)
    print(report.write(res, args.out, args.name, markdown).read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
