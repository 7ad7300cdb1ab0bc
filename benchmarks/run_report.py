"""``benchmarks.run``'s report: the derived ratios and targets, the markdown tables and the charts.

``python -m benchmarks.report results/NAME.json`` writes them again from a run's measurements.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks import targets
from benchmarks.report import pyplot, save_fig, settings_lines
from benchmarks.targets import fmt_size


def _record(
    results: list[dict[str, Any]], db: str, schema: str, size: int, contender: str, key: str
) -> dict[str, Any] | None:
    """The contender's measured result at (db, schema, size) that has ``key``."""
    for r in results:
        if (r["db"], r["schema"], r["size"], r["contender"]) == (db, schema, size, contender) and r.get(key):
            return r
    return None


def _median(results: list[dict[str, Any]], db: str, schema: str, size: int, contender: str) -> float | None:
    r = _record(results, db, schema, size, contender, "median_s")
    return float(r["median_s"]) if r else None


def ratios(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (db, schema, size): speed-ups (x, higher is better for xasink) and the price of XA."""
    out = []
    keys = sorted({(r["db"], r["schema"], r["size"]) for r in results})
    for db, schema, size in keys:

        def m(name: str, db: str = db, schema: str = schema, size: int = size) -> float | None:
            return _median(results, db, schema, size, name)

        xa, row = m("xasink"), {"db": db, "schema": schema, "size": size}

        def div(a: float | None, b: float | None) -> float | None:
            return round(a / b, 3) if a and b else None

        row["xasink_speedup_vs_jdbc_tuned"] = div(m("jdbc-tuned"), xa)
        row["xasink_speedup_vs_jdbc_default"] = div(m("jdbc-default"), xa)
        # the floor as the issue defines it: parallel bulk load from files plus the Arrow hand-off to Python
        copy, handoff = m("floor-copy"), m("arrow-noop")
        floor = copy + handoff if copy and handoff else None
        row["floor_s"] = round(floor, 3) if floor else None
        row["xasink_time_over_floor"] = div(xa, floor)
        row["xasink_time_over_copy"] = div(xa, copy)
        # the best "vs tuned JDBC" any Arrow-fed writer can reach here: the tuned writer's time over the floor
        row["floor_speedup_vs_jdbc_tuned"] = div(m("jdbc-tuned"), floor)
        price = div(xa, m("plain-commit"))
        row["price_of_xa_pct"] = round((price - 1) * 100, 1) if price else None
        row["upsert_speedup_vs_hand"] = div(m("upsert-hand"), m("xasink-upsert"))
        row["arrow_handoff_share_of_xasink"] = div(m("arrow-noop"), xa)
        # the CPU ceiling: xasink's wall time if its own Python cost were zero and the cores never idled
        unavoidable = _unavoidable_cpu_s(results, db, schema, size)
        row["ceiling_vs_jdbc_tuned"] = div(m("jdbc-tuned"), unavoidable)
        row["ceiling_vs_jdbc_default"] = div(m("jdbc-default"), unavoidable)
        out.append(row)
    return out


def _unavoidable_cpu_s(results: list[dict[str, Any]], db: str, schema: str, size: int) -> float | None:
    """The database's and Spark's JVM CPU seconds in xasink's runs over the cores: no writer fed by Spark's
    Arrow hand-off into this database can finish faster on this machine."""
    r = _record(results, db, schema, size, "xasink", "cpu_s")
    if r is None:
        return None
    c = r["cpu_s"]
    return float(c["database"] + c["spark_jvm"]) / c["cores"]


def cpu_records(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per measured contender: median CPU seconds by process class and the wall time they bound."""
    return [
        {k: r[k] for k in ("db", "schema", "size", "label", "median_s")} | r["cpu_s"] for r in results if r.get("cpu_s")
    ]


def derive(res: dict[str, Any]) -> dict[str, Any]:
    """The tables computed from the measurements: ratios, CPU seconds, targets."""
    res["ratios"] = ratios([r for r in res.get("throughput", []) if r.get("median_s")])
    res["cpu"] = cpu_records(res.get("throughput", []))
    res["targets"] = targets.targets(res["ratios"], res.get("coordinator", []), res.get("memory", []), res)
    return res


def _table(headers: list[str], rows: list[list[Any]]) -> str:
    def cell(v: Any) -> str:
        if v is None:
            return "–"
        if isinstance(v, float):
            return f"{v:,.3g}" if abs(v) < 100 else f"{v:,.0f}"
        if isinstance(v, int) and not isinstance(v, bool):
            return f"{v:,}"
        return str(v).replace("|", "\\|")

    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


Column = tuple[str, Callable[[dict[str, Any]], Any]]


def _key(name: str) -> Callable[[dict[str, Any]], Any]:
    return lambda r: r[name]


def _cols(*spec: tuple[str, str | Callable[[dict[str, Any]], Any]]) -> list[Column]:
    """Columns of a record table: a header and a record key (or a function of the record)."""
    return [(header, _key(get) if isinstance(get, str) else get) for header, get in spec]


def _records(records: list[dict[str, Any]], columns: list[Column]) -> str:
    return _table([h for h, _ in columns], [[get(r) for _, get in columns] for r in records])


TARGET_COLUMNS = _cols(
    ("target", "target"),
    ("measured at", "measured_at"),
    ("value", "value"),
    ("goal", "goal"),
    ("met", lambda t: {True: "yes", False: "**no**", None: "–"}[t["met"]]),
    ("CPU s: server / Spark JVM / Python workers", lambda t: t.get("cpu")),
    ("CPU ceiling", lambda t: f"{t['ceiling']:.2f}x" if t.get("ceiling") else None),
    ("note", lambda t: t.get("note")),
)

# (result key, section title, intro line, columns): the record tables after the throughput tables
SECTIONS: list[tuple[str, str, str, list[Column]]] = [
    (
        "ratios",
        "Ratios",
        "Speed-ups are the other contender's time over xasink's (higher is better for "
        "xasink); the floor ratio and the price of XA are xasink's time over theirs. The floor is the "
        "parallel bulk load from files plus the Arrow hand-off (the no-op writer); 'floor vs JDBC tuned' "
        "is the most any writer fed by Spark's Arrow hand-off could gain over the tuned JDBC writer here. "
        "'CPU ceiling vs JDBC tuned' is the tuned writer's time over the database's and Spark's JVM CPU "
        "seconds in xasink's runs divided by the cores: what xasink would reach with no Python cost at all "
        "(likewise against the default writer).",
        _cols(
            ("db", "db"),
            ("schema", "schema"),
            ("size", lambda r: fmt_size(r["size"])),
            ("vs JDBC tuned", "xasink_speedup_vs_jdbc_tuned"),
            ("vs JDBC default", "xasink_speedup_vs_jdbc_default"),
            ("floor s (COPY + hand-off)", "floor_s"),
            ("time/floor", "xasink_time_over_floor"),
            ("time/COPY alone", "xasink_time_over_copy"),
            ("floor vs JDBC tuned", "floor_speedup_vs_jdbc_tuned"),
            ("price of XA %", "price_of_xa_pct"),
            ("CPU ceiling vs JDBC tuned", "ceiling_vs_jdbc_tuned"),
            ("CPU ceiling vs JDBC default", lambda r: r.get("ceiling_vs_jdbc_default")),
            ("upsert vs hand", "upsert_speedup_vs_hand"),
            ("Arrow hand-off share", "arrow_handoff_share_of_xasink"),
        ),
    ),
    (
        "cpu",
        "Where the time goes: CPU seconds per write",
        "Median CPU seconds of each process class during a contender's timed runs (user + system, "
        "reaped children included), from /proc. 'CPU-bound s' is their total over the cores: a run can be no "
        "faster; 'utilization' is the share of both cores the run kept busy.",
        _cols(
            ("db", "db"),
            ("schema", "schema"),
            ("size", lambda r: fmt_size(r["size"])),
            ("contender", "label"),
            ("wall s", "median_s"),
            ("database", "database"),
            ("Spark JVM", "spark_jvm"),
            ("Python workers", "python_workers"),
            ("driver + clients", "driver_and_clients"),
            ("CPU-bound s", "cpu_bound_s"),
            ("utilization", "utilization"),
        ),
    ),
    (
        "failure",
        "Failure scenario: one partition fails after the others have written",
        "A reader polls count(*) every ~50 ms (read committed) during the failed run and the user's rerun.",
        _cols(
            ("db", "db"),
            ("contender", "label"),
            ("max visible during failed run", "max_visible_during_failed_run"),
            ("visible after failure", "visible_after_failure"),
            ("partial counts in rerun", lambda f: ", ".join(map(str, f["intermediate_counts_during_retry"])) or "none"),
            ("final rows", "final_rows"),
            ("distinct ids", "final_distinct_ids"),
            ("duplicates", "duplicates"),
            ("verdict", "verdict"),
        ),
    ),
    (
        "coordinator",
        "Coordinator scale: decide + commit N prepared branches",
        "",
        _cols(
            ("branches", "branches"),
            ("commitParallelism", "commit_parallelism"),
            ("decide+commit (median s)", "decide_commit_s"),
            ("decide s", "decide_s"),
            ("COMMIT PREPARED s", "commit_s"),
            ("sweep s", "sweep_s"),
            ("runs", lambda c: ", ".join(f"{t:.3f}" for t in c["all_runs_s"])),
        ),
    ),
    (
        "memory",
        "Python worker memory as partitions grow",
        "Peak RSS of the writing Python worker during its task (VmHWM, reset at task start).",
        _cols(
            ("db", "db"),
            ("writer", "writer"),
            ("rows per partition", "rows_per_partition"),
            ("peak RSS MB", "peak_rss_mb"),
            ("RSS at task start MB", "rss_at_task_start_mb"),
            ("peak - start MB", "peak_over_start_mb"),
        ),
    ),
]


def markdown(res: dict[str, Any]) -> str:
    out = [f"# xasink benchmarks: {res['name']}", ""]
    out += [f"Command: `{res['command']}`  ", f"Started {res['started']}, took {res.get('elapsed_s', 0):,.0f} s.", ""]
    out += ["## Set-up", ""]
    m = res["setup"]["machine"]
    out.append(
        f"- Machine: {m.get('cpu_model') or 'CPU model unknown'}, {m['cpus']} CPUs, {m['memory_gb']} GB, "
        f"{m.get('platform')}, Python {m.get('python')}; load average at start {m['load_average_at_start']}, "
        f"at end {res['setup'].get('load_average_at_end')}. Timings on a busy machine are noisy."
    )
    sp = res["setup"]["spark"]
    out.append(
        f"- Spark {sp['version']} `{sp['master']}`, {sp['partitions']} partitions of a cached DataFrame, "
        f"Arrow batches of {sp['arrow_batch']} rows; {res['setup']['runs']} measured runs per contender "
        f"after {res['setup']['warmup']} warm-up run(s); medians reported."
    )
    out += settings_lines(res["setup"]["databases"])
    for note in res.get("notes", []):
        out.append(f"- Note: {note}")
    out.append("")
    if res.get("targets"):
        out += ["## Targets (shown, not asserted)", ""]
        out += [_records(res["targets"], TARGET_COLUMNS), ""]
    thr = res.get("throughput", [])
    for db, schema in sorted({(r["db"], r["schema"]) for r in thr}):
        rows = [r for r in thr if r["db"] == db and r["schema"] == schema]
        sizes = sorted({r["size"] for r in rows})
        names = list(dict.fromkeys(r["contender"] for r in rows))
        out += [f"## Throughput: {db}, {schema} schema", "", "Median seconds (rows/s).", ""]
        table_rows = []
        for name in names:
            line: list[Any] = [next(r["label"] for r in rows if r["contender"] == name)]
            for size in sizes:
                r = next((x for x in rows if x["contender"] == name and x["size"] == size), None)
                if r is None:
                    line.append(None)
                elif r.get("median_s"):
                    line.append(f"{r['median_s']:.2f} s ({r['rows_per_s']:,.0f}/s)")
                else:
                    line.append(f"skipped: {r.get('note') or r.get('error')}"[:120])
            table_rows.append(line)
        out.append(_table(["contender"] + [fmt_size(s) for s in sizes], table_rows))
        out.append("")
    for key, title, intro, columns in SECTIONS:
        if res.get(key):
            out += [f"## {title}", ""] + ([intro, ""] if intro else [])
            out += [_records(res[key], columns), ""]
    if res.get("charts"):
        out += ["## Charts", ""] + [f"![{Path(c).stem}]({Path(c).name})" for c in res["charts"]] + [""]
    if res.get("errors"):
        out += ["## Errors", ""] + [f"- {e}" for e in res["errors"]] + [""]
    return "\n".join(out)


def charts(res: dict[str, Any], outdir: Path, name: str) -> list[str]:
    plt = pyplot()
    paths = []
    thr = [r for r in res.get("throughput", []) if r.get("rows_per_s")]
    groups = sorted({(r["db"], r["schema"]) for r in thr})
    if groups:
        fig, axes = plt.subplots(len(groups), 1, figsize=(11, 3.6 * len(groups)), squeeze=False)
        for ax, (db, schema) in zip(axes[:, 0], groups, strict=True):
            rows = [r for r in thr if r["db"] == db and r["schema"] == schema]
            sizes = sorted({r["size"] for r in rows})
            names = list(dict.fromkeys(r["contender"] for r in rows))
            width = 0.8 / max(1, len(names))
            for i, cname in enumerate(names):
                ys = [
                    next((r["rows_per_s"] / 1e3 for r in rows if r["contender"] == cname and r["size"] == s), 0)
                    for s in sizes
                ]
                ax.bar([x + i * width for x in range(len(sizes))], ys, width, label=cname)
            ax.set_xticks([x + width * (len(names) - 1) / 2 for x in range(len(sizes))])
            ax.set_xticklabels([f"{fmt_size(s)} rows" for s in sizes])
            ax.set_ylabel("thousand rows/s")
            ax.set_title(f"Throughput, {db}, {schema} schema (median)")
            ax.legend(fontsize=7, ncol=4)
        paths.append(save_fig(fig, outdir / f"{name}-throughput.png"))
    rat = [r for r in res.get("ratios", []) if r.get("price_of_xa_pct") is not None]
    if rat:
        fig, ax = plt.subplots(figsize=(9, 3.5))
        labels = [f"{r['db'][:2]} {r['schema']} {fmt_size(r['size'])}" for r in rat]
        vals = [r["price_of_xa_pct"] for r in rat]
        ax.bar(labels, vals, color=["tab:red" if v > 5 else "tab:green" for v in vals])
        ax.axhline(5, color="gray", ls="--", lw=1, label="target 5 %")
        ax.set_ylabel("xasink time over plain COMMIT, %")
        ax.set_title("Price of XA: the same data path with PREPARE + decision log vs plain COMMIT")
        ax.tick_params(axis="x", labelrotation=30, labelsize=8)
        ax.legend()
        paths.append(save_fig(fig, outdir / f"{name}-xa-overhead.png"))
    coord = res.get("coordinator", [])
    if coord:
        fig, ax = plt.subplots(figsize=(6, 3.5))
        for par in sorted({c["commit_parallelism"] for c in coord}):
            pts = sorted((c["branches"], c["decide_commit_s"]) for c in coord if c["commit_parallelism"] == par)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"commitParallelism {par}")
        ax.axhline(1.0, color="gray", ls="--", lw=1, label="1 s")
        ax.set_xlabel("prepared branches in the batch")
        ax.set_ylabel("decide + commit, s")
        ax.set_title("Coordinator scale")
        ax.legend()
        paths.append(save_fig(fig, outdir / f"{name}-coordinator.png"))
    return paths
