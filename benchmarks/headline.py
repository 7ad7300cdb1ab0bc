"""The headline figures in one run: bulk throughput, micro-batches and streaming, all on durable servers.

Runs three harnesses one after another, each in its own process (each starts its own Spark session and its own
durable PostgreSQL; a Spark JVM cannot change its master or its workers' environment once started):

1. ``benchmarks.run``: 2M narrow rows, xasink against the tuned JDBC writer, wall time and CPU per process class;
2. ``benchmarks.microbatch``: 1k and 10k rows a batch (2 partitions), medians, xasink's phases;
3. ``benchmarks.streaming``: a rate source at steady rows/s into xasink's stream writer, ``xasink.foreach_batch``
   and the JDBC writer in ``foreachBatch``: batch time, visibility latency p50/p99, the highest rate kept up.

Then ``results/<name>.md`` sets every target of the micro-batch issue beside what this run measured, with each
server's durability settings, the machine and its load.  Speed is never asserted: a missed target is reported.

    python -m benchmarks.headline                   # about 25 minutes on 2 cores
    python -m benchmarks.headline --quick           # harness check: small sizes, one rate, short windows
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks import cli, report
from benchmarks import env as benv

log = logging.getLogger("benchmarks.headline")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = cli.parser("benchmarks.headline", __doc__, "headline")
    p.add_argument("--bulk-rows", type=int, default=2_000_000, help="rows of the bulk write (default 2000000)")
    p.add_argument("--bulk-runs", type=int, default=3, help="measured bulk runs per contender (default 3)")
    p.add_argument("--micro-sizes", default="1000,10000", help="rows per micro-batch (default 1000,10000)")
    p.add_argument("--micro-batches", type=int, default=15, help="measured micro-batches per size (default 15)")
    p.add_argument("--micro-warmup", type=int, default=30, help="unmeasured micro-batches first (default 30)")
    p.add_argument("--rates", default="1000,5000,20000", help="streaming rows/s steps (default 1000,5000,20000)")
    p.add_argument("--duration", type=float, default=20.0, help="measured seconds per streaming step (default 20)")
    p.add_argument("--quick", action="store_true", help="harness check: 200k rows, 1k rows a batch, one rate")
    p.add_argument("--parts", default="bulk,micro,stream", help="which harnesses to run (default all three)")
    args = cli.parse(p, argv)
    args.name = args.name or "headline"
    if args.quick:
        args.bulk_rows, args.bulk_runs, args.micro_sizes, args.micro_batches = 200_000, 1, "1000", 3
        args.micro_warmup = 2
        args.rates, args.duration = "2000", 8.0
    return args


def commands(args: argparse.Namespace) -> dict[str, list[str]]:
    """Each harness's command line (also printed in the report, so every figure can be reproduced alone)."""
    out = ["--out", args.out] if Path(args.out).resolve() != cli.RESULTS else []
    out += ["--mariadb", args.mariadb] if args.mariadb != cli.MARIADB else []
    return {
        "bulk": [
            "benchmarks.run", "--db", args.db, "--schemas", "narrow", "--sizes", str(args.bulk_rows),
            "--runs", str(args.bulk_runs), "--sections", "throughput", "--contenders", "xasink,jdbc-tuned",
            "--name", f"{args.name}-bulk", *out,
        ],
        "micro": [
            "benchmarks.microbatch", "--db", args.db, "--sizes", args.micro_sizes,
            "--batches", str(args.micro_batches), "--warmup", str(args.micro_warmup), "--name", f"{args.name}-micro",
            *out,
        ],
        "stream": [
            "benchmarks.streaming", "--db", args.db, "--rates", args.rates, "--duration", str(args.duration),
            "--name", f"{args.name}-stream", *out,
        ],
    }  # fmt: skip


def run_part(part: str, argv: list[str]) -> float:
    log.info("%s: python -m %s", part, " ".join(argv))
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-m", *argv], check=True, cwd=Path(__file__).parent.parent)
    return time.monotonic() - t0


def _load(out: Path, name: str) -> dict[str, Any] | None:
    path = out / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def _verdict(met: bool | None) -> str:
    return "–" if met is None else ("yes" if met else "**no**")


def bulk_rows(bulk: dict[str, Any]) -> list[list[str]]:
    """Targets: 2M narrow rows >= 2.0x (PostgreSQL) / 1.6x (MariaDB) the tuned writer; server CPU <= 0.6x."""
    rows = []
    goals = {"postgresql": 2.0, "mariadb": 1.6}
    by = {(t["db"], t["contender"]): t for t in bulk["throughput"]}
    for db, goal in goals.items():
        x, j = by.get((db, "xasink")), by.get((db, "jdbc-tuned"))
        if not x or not j:
            continue
        size = f"{x['size']:,} rows"
        speed = j["median_s"] / x["median_s"]
        rows.append([f"{db}: bulk write vs tuned JDBC", size, f"{x['median_s']} s vs {j['median_s']} s",
                     f"{speed:.2f}x", f">= {goal}x", _verdict(speed >= goal)])  # fmt: skip
        cpu = x["cpu_s"]["database"] / j["cpu_s"]["database"]
        rows.append([f"{db}: server CPU per row, xasink / tuned JDBC", size,
                     f"{x['cpu_s']['database']} s vs {j['cpu_s']['database']} s", f"{cpu:.2f}x", "<= 0.6x",
                     _verdict(cpu <= 0.6)])  # fmt: skip
    return rows


def micro_rows(micro: dict[str, Any]) -> list[list[str]]:
    """Targets: at 10k rows xasink's median batch <= the tuned writer's; at 1k, within 20 ms of it."""
    rows = []
    for r in micro["results"]:
        s = r["summary"]
        x, j = s["xasink"]["median_ms"], s["jdbc-tuned"]["median_ms"]
        if r["size"] >= 10_000:
            goal, met = "<= JDBC", x <= j
        else:
            goal, met = "<= JDBC + 20 ms", x <= j + 20
        rows.append([f"{r['db']}: micro-batch median", f"{r['size']:,} rows, 2 partitions",
                     f"{x} ms vs {j} ms", f"{x - j:+.0f} ms ({x / j:.2f}x)", goal, _verdict(met)])  # fmt: skip
    return rows


def stream_rows(stream: dict[str, Any]) -> list[list[str]]:
    """Targets: the stream writer sustains >= the JDBC foreachBatch writer's rate, p99 latency no worse."""
    from benchmarks.streaming_report import sustained

    rows = []
    results = stream["results"]
    for db in stream["settings"]:
        xs, jd = sustained(results, db, "xasink-stream"), sustained(results, db, "jdbc-foreach")
        if xs is None and jd is None:
            continue
        kept = (xs or 0) >= (jd or 0)
        rows.append([f"{db}: streaming, highest rate kept up", "rate steps " + stream_steps(stream),
                     f"{xs or 0:,} vs {jd or 0:,} rows/s", "", ">= JDBC", _verdict(kept)])  # fmt: skip
        for rate in sorted({r["rate"] for r in results if r["db"] == db and r["rate"] <= min(xs or 0, jd or 0)}):
            pick = {r["contender"]: r for r in results if r["db"] == db and r["rate"] == rate}
            x, j = pick["xasink-stream"]["latency_ms_p99"], pick["jdbc-foreach"]["latency_ms_p99"]
            if x is None or j is None:
                continue
            rows.append([f"{db}: streaming p99 visibility latency", f"{rate:,} rows/s", f"{x} ms vs {j} ms",
                         f"{x / j:.2f}x", "<= JDBC", _verdict(x <= j)])  # fmt: skip
    return rows


def stream_steps(stream: dict[str, Any]) -> str:
    return ", ".join(f"{r:,}" for r in sorted({r["rate"] for r in stream["results"]}))


def markdown(args: argparse.Namespace, parts: dict[str, dict[str, Any] | None], took: dict[str, float]) -> str:
    machine = benv.machine()
    cmd = args.command
    lines = [
        f"# Headline figures: {args.name}",
        "",
        f"Command: `{cmd.strip()}`; finished {time.strftime('%Y-%m-%dT%H:%M:%S%z')}; "
        + ", ".join(f"{p} {s / 60:.1f} min" for p, s in took.items())
        + ".",
        "",
        f"Machine: {machine['cpus']} cores ({machine['cpu_model']}), {machine['memory_gb']} GB, "
        f"{machine['platform']}, Python {machine['python']}; "
        f"load average at the end {machine['load_average_at_start']}.",
        "",
        "Servers, as users run them (each harness records the settings it found):",
        "",
    ]
    settings: dict[str, dict[str, Any]] = {}
    for res in parts.values():
        if res:
            settings.update(res.get("settings") or res.get("setup", {}).get("databases", {}))
    lines += report.settings_lines(settings)
    lines += [
        "",
        "## Targets (benchmarked, never asserted in tests)",
        "",
        "| target | measured at | xasink vs JDBC | ratio | goal | met |",
        "|---|---|---|---|---|---|",
    ]
    table: list[list[str]] = []
    if parts.get("micro"):
        table += micro_rows(parts["micro"])  # type: ignore[arg-type]
    if parts.get("stream"):
        table += stream_rows(parts["stream"])  # type: ignore[arg-type]
    if parts.get("bulk"):
        table += bulk_rows(parts["bulk"])  # type: ignore[arg-type]
    lines += ["| " + " | ".join(row) + " |" for row in table]
    lines += [
        "",
        "Each harness's own report holds every figure behind these (phases, CPU per million rows, charts):",
        "",
    ]
    for part, argv in commands(args).items():
        if parts.get(part):
            lines.append(f"- {part}: [`{args.name}-{part}.md`]({args.name}-{part}.md), `python -m {' '.join(argv)}`")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cli.logs()
    wanted = cli.split(args.parts)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    took: dict[str, float] = {}
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # the harnesses' Spark workers run this interpreter
    for part, cmd in commands(args).items():
        if part in wanted:
            took[part] = run_part(part, cmd)
    parts = {part: _load(out, f"{args.name}-{part}") for part in commands(args)}
    text = markdown(args, parts, took)
    (out / f"{args.name}.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
