"""Micro-batches: where a small batch's time goes, xasink beside Spark's tuned JDBC writer.

A streaming job writes many small batches.  This runs ``--batches`` appends of R rows (2 partitions) for
each size, interleaving xasink (``format("xasink")``, one batch id per batch) and the tuned JDBC writer
(``format("jdbc")``, batchsize 10000, rewritten batch inserts), alternating which goes first, on servers
configured as users run them (PostgreSQL with fsync and synchronous_commit on; the machine's MariaDB, whose
``innodb_flush_log_at_trx_commit`` is recorded).  Per batch it keeps the wall time, the CPU seconds of the
database, the Spark JVM and the Python workers, and for xasink every phase the library records under
``XASINK_PHASE_LOG`` (xasink/support/phases.py): planning, the tasks' claim/connect/load/PREPARE/late check, and
the commit call's check/decide/COMMIT PREPARED/mark/sweep/trim.  What no phase covers is Spark's own
scheduling and the hand-off of rows.

    python -m benchmarks.microbatch                          # 1k, 10k, 100k rows; 15 batches; both databases
    python -m benchmarks.microbatch --sizes 10000 --batches 5 --db postgresql --name micro-check
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from benchmarks import cli, cpu, data, report
from benchmarks import env as benv
from benchmarks.contenders import jdbc_write

log = logging.getLogger("benchmarks.microbatch")

PARTITIONS = 2
# a streaming job runs warm: during the first few dozen batches the JVM's JIT compiler threads took about a
# quarter of both cores (perf record -a), slowing every contender's database round trips with it
WARMUP = 30
# the stacked phases, in the order they happen; each is a list of phase-log names summed per batch
STACK: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("plan: worker start (0: reused)", ("plan.worker_start",)),
    ("plan: checks + recover", ("plan.preflight", "plan.target", "plan.keeper", "plan.recover")),
    ("task: worker start (0: reused)", ("task.worker_start",)),
    ("task: claim | connect", ("task.claim", "task.open_wait")),
    ("task: load", ("task.load",)),
    ("task: PREPARE", ("task.prepare",)),
    ("task: late check", ("task.settle",)),
    ("commit: worker start (0: reused)", ("commit.worker_start",)),
    ("commit: connect + state", ("commit.other",)),
    ("commit: decide", ("commit.decide",)),
    ("commit: COMMIT PREPARED", ("commit.commit_prepared",)),
    ("commit: mark", ("commit.mark",)),
    ("commit: sweep", ("commit.sweep",)),
    ("commit: trim", ("commit.trim",)),
)
COMMIT_INNER = ("commit.decide", "commit.commit_prepared", "commit.apply", "commit.mark", "commit.sweep", "commit.trim")
TASK_PHASES = ("task.worker_start", "task.claim", "task.open_wait", "task.load", "task.prepare", "task.settle")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = cli.parser("benchmarks.microbatch", __doc__, "micro-<time>")
    p.add_argument("--sizes", default="1000,10000,100000", help="rows per batch (default 1000,10000,100000)")
    p.add_argument("--batches", type=int, default=15, help="measured batches per contender and size (default 15)")
    p.add_argument(
        "--warmup",
        type=int,
        default=WARMUP,
        help=f"unmeasured batches of every contender first (default {WARMUP}: the JVM's JIT settles)",
    )
    args = cli.parse(p, argv)
    args.name = args.name or time.strftime("micro-%Y%m%d-%H%M%S")
    return args


def phases_of(records: list[dict[str, Any]], t0: float, t1: float) -> dict[str, float]:
    """One xasink batch's phases (seconds), from the phase-log lines that ended inside its wall window.

    Tasks run in parallel: the task phases are the slowest partition's (the one that reported last), so
    the stack adds up along the batch's critical path.  A worker start is counted from the window's start
    (a reused worker started long before and costs nothing here).  Driver-side worker starts before the
    first task are the planning worker's; after it, the commit's.
    """
    mine = [r for r in records if t0 <= r["end"] <= t1]
    task_starts = [r["start"] for r in mine if r["phase"] == "task.start"]
    first_task = min(task_starts, default=t1)
    per_task: dict[Any, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    driver: dict[str, float] = defaultdict(float)
    for r in mine:
        seconds = r["end"] - max(r["start"], t0)
        name = r["phase"]
        if name in TASK_PHASES:
            per_task[(r.get("partition"), r["pid"])][name] += seconds
        elif name == "driver.worker_start":
            driver["plan.worker_start" if r["end"] <= first_task else "commit.worker_start"] += seconds
        elif name not in ("task.start", "driver.start"):
            driver[name] += seconds
    slowest = max(per_task.values(), key=lambda p: sum(p.values()), default={})
    inner = sum(driver.get(n, 0.0) for n in COMMIT_INNER)
    if "commit.call" in driver:  # the commit call's time outside its named steps: connections, coordinator state
        driver["commit.other"] = max(0.0, driver["commit.call"] - inner)
    out = dict(driver)
    out.update(slowest)
    return out


def stack(phases: dict[str, float], wall: float) -> dict[str, float]:
    """The stacked figures of one batch (ms): each named phase, and what none covers (Spark and hand-off)."""
    row = {label: 1000 * sum(phases.get(n, 0.0) for n in names) for label, names in STACK}
    row["control connects"] = 1000 * phases.get("connect.control", 0.0)  # inside the phases above: not stacked
    covered = sum(v for k, v in row.items() if k != "control connects")
    row["Spark scheduling, row hand-off, other"] = max(0.0, 1000 * wall - covered)
    return row


def read_log(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    with path.open() as f:
        return [json.loads(line) for line in f if line.strip()]


def run_db(spark: Any, db: benv.Database, sizes: list[int], batches: int, warmup: int, log_path: Path) -> list[dict]:
    out = []
    for size in sizes:
        tables = {"xasink": f"mb_xa_{size}", "jdbc-tuned": f"mb_jdbc_{size}", "arrow-noop": ""}
        for table in tables.values():
            if table:
                data.create_table(db, table, "narrow")
        sink = f"b-mb-{db.kind[:2]}-{size}"
        samples: dict[str, list[dict[str, Any]]] = {name: [] for name in tables}
        for i in range(warmup + batches):
            df = spark.range(i * size, (i + 1) * size, 1, PARTITIONS).selectExpr(
                *[f"{c.expr} as {c.name}" for c in data.NARROW]
            )
            order = list(tables) if i % 2 == 0 else list(reversed(tables))
            for name in order:
                before = cpu.snapshot()
                t0 = time.time()
                if name == "xasink":
                    opts = {"url": db.xasink_url, "dbtable": tables[name], "sinkId": sink, "batchId": str(i)}
                    df.write.format("xasink").options(**opts).mode("append").save()
                elif name == "arrow-noop":  # the floor of any Python data source: rows handed over, nothing written
                    df.write.format("bench_noop").mode("append").save()
                else:
                    jdbc_write(df, db, tuned=True, table=tables[name])
                t1 = time.time()
                used = cpu.used(before, cpu.snapshot())
                if i < warmup:
                    continue
                sample: dict[str, Any] = {"batch": i, "wall_ms": 1000 * (t1 - t0), "cpu_s": used}
                if name == "xasink":
                    raw = phases_of(read_log(log_path), t0, t1)
                    sample["phases_ms"] = stack(raw, t1 - t0)
                    sample["raw_ms"] = {k: round(1000 * v, 1) for k, v in sorted(raw.items())}
                samples[name].append(sample)
        for name, table in tables.items():
            if not table:
                continue
            got, want = db.count(table), size * (warmup + batches)
            if got != want:
                raise SystemExit(f"{db.kind} {name} size {size}: {got} rows in {table}, expected {want}")
        out.append({"db": db.kind, "size": size, "samples": samples, "summary": summarize(samples, size)})
        log.info("%s %s rows: %s", db.kind, size, out[-1]["summary"])
    return out


def summarize(samples: dict[str, list[dict[str, Any]]], size: int) -> dict[str, Any]:
    res: dict[str, Any] = {}
    for name, runs in samples.items():
        walls = [s["wall_ms"] for s in runs]
        cpu_med = {k: statistics.median(s["cpu_s"][k] for s in runs) for k in cpu.CLASSES}
        res[name] = {
            "median_ms": round(statistics.median(walls), 1),
            "p90_ms": round(sorted(walls)[max(0, int(0.9 * len(walls)) - 1)], 1),
            "cpu_s_per_million_rows": {k: round(v * 1e6 / size, 2) for k, v in cpu_med.items()},
        }
        if runs and "phases_ms" in runs[0]:
            res[name]["phases_ms"] = {
                k: round(statistics.median(s["phases_ms"][k] for s in runs), 1) for k in runs[0]["phases_ms"]
            }
    x, j = res.get("xasink", {}).get("median_ms"), res.get("jdbc-tuned", {}).get("median_ms")
    if x and j:
        res["xasink_minus_jdbc_ms"] = round(x - j, 1)
        res["xasink_over_jdbc"] = round(x / j, 2)
    return res


def markdown(res: dict[str, Any]) -> str:
    lines = [f"# Micro-batches: {res['name']}", "", f"Machine: {res['machine']}", ""]
    lines += report.settings_lines(res["settings"])
    lines += [
        "",
        f"{res['batches']} measured batches per size (after {res['warmup']} warm-up), {PARTITIONS} partitions, "
        "contenders interleaved; medians.",
        "",
        "| database | rows/batch | xasink ms | tuned JDBC ms | Arrow no-op ms | xasink − JDBC | xasink / JDBC |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in res["results"]:
        s = r["summary"]
        lines.append(
            f"| {r['db']} | {r['size']:,} | {s['xasink']['median_ms']} | {s['jdbc-tuned']['median_ms']} | "
            f"{s.get('arrow-noop', {}).get('median_ms')} | {s.get('xasink_minus_jdbc_ms')} | "
            f"{s.get('xasink_over_jdbc')} |"
        )
    lines += [
        "",
        "Arrow no-op: a Python data source that only counts the rows Spark hands it (the floor of any Python "
        "writer: Spark's planning and commit calls into Python workers, the Arrow hand-off).",
    ]
    labels = [label for label, _ in STACK] + ["Spark scheduling, row hand-off, other", "control connects"]
    lines += ["", "## xasink: where a batch's time goes (ms, medians per phase)", ""]
    head = [f"{r['db']} {r['size']:,}" for r in res["results"]]
    lines += ["| phase | " + " | ".join(head) + " |", "|---|" + "---:|" * len(head)]
    for label in labels:
        cells = [str(r["summary"]["xasink"].get("phases_ms", {}).get(label, "")) for r in res["results"]]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Task phases are the slowest partition's; `control connects` is inside the other phases (not stacked).",
        "",
        "## CPU seconds per million rows (medians per batch, scaled)",
        "",
        "| database | rows/batch | contender | " + " | ".join(cpu.CLASSES) + " |",
        "|---|---:|---|" + "---:|" * len(cpu.CLASSES),
    ]
    for r in res["results"]:
        for name in ("xasink", "jdbc-tuned", "arrow-noop"):
            c = r["summary"][name]["cpu_s_per_million_rows"]
            lines.append(f"| {r['db']} | {r['size']:,} | {name} | " + " | ".join(str(c[k]) for k in cpu.CLASSES) + " |")
    return "\n".join(lines) + "\n"


def chart(res: dict[str, Any], out: Path, name: str) -> list[str]:
    """One stacked bar per (database, size) for xasink's phases, beside a plain bar for the tuned JDBC writer."""
    plt = report.pyplot()
    labels = [label for label, _ in STACK] + ["Spark scheduling, row hand-off, other"]
    fig, ax = plt.subplots(figsize=(max(6, 2.2 * len(res["results"])), 5))
    cmap = plt.get_cmap("tab20")
    for i, r in enumerate(res["results"]):
        phases = r["summary"]["xasink"].get("phases_ms", {})
        bottom = 0.0
        for k, label in enumerate(labels):
            v = phases.get(label, 0.0)
            ax.bar(2 * i, v, bottom=bottom, color=cmap(k), label=label if i == 0 else None, width=0.8)
            bottom += v
        ax.bar(
            2 * i + 0.9,
            r["summary"]["jdbc-tuned"]["median_ms"],
            color="black",
            width=0.8,
            label="tuned JDBC writer (whole batch)" if i == 0 else None,
        )
    ax.set_xticks([2 * i + 0.45 for i in range(len(res["results"]))])
    ax.set_xticklabels([f"{r['db']}\n{r['size']:,} rows" for r in res["results"]])
    ax.set_ylabel("ms per batch (median)")
    ax.set_title("Micro-batch time: xasink by phase (left) vs tuned JDBC (right)")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return [report.save_fig(fig, out / f"{name}-phases.png")]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cli.logs()
    log_path = benv.phase_log()
    res: dict[str, Any] = {
        "name": args.name,
        "command": args.command,
        "machine": benv.machine(),
        "batches": args.batches,
        "warmup": args.warmup,
        "settings": {},
        "results": [],
    }
    with benv.databases(args.dbs, args.mariadb) as dbs:
        res["settings"] = {db.kind: db.settings for db in dbs}
        spark = benv.spark_session(f"local[{PARTITIONS}]")
        try:
            for db in dbs:
                res["results"] += run_db(spark, db, cli.ints(args.sizes), args.batches, args.warmup, log_path)
        finally:
            spark.stop()
    print(report.write(res, args.out, args.name, markdown, chart).read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
