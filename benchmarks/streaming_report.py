"""The streaming benchmark's report: the steps' table, the highest rate each writer kept up, the latency chart."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks import report
from benchmarks.streaming import PARTITIONS, POLL_S


def sustained(results: list[dict], db: str, name: str) -> int | None:
    best = None
    for r in sorted((r for r in results if r["db"] == db and r["contender"] == name), key=lambda r: r["rate"]):
        if r["behind"]:
            break
        best = r["rate"]
    return best


def markdown(res: dict[str, Any]) -> str:
    m = res["machine"]
    lines = [
        f"# Streaming latency: {res['name']}",
        "",
        f"Machine: {m['cpus']} cores ({m['cpu_model']}), {m['memory_gb']} GB; load average at start "
        f"{m['load_average_at_start']}, at end {res.get('load_average_at_end')}.",
        "",
        *report.settings_lines(res["settings"]),
    ]
    lines += [
        "",
        f"Rate source, {PARTITIONS} partitions, Spark local[{PARTITIONS}], processing-time trigger "
        f"{res['trigger_s']} s; per step {res['warmup_s']} s warm-up (after the first batch with rows), then a "
        f"{res['duration_s']} s window; drain limit {res['drain_s']} s.",
        f"Command: `{res['command']}`",
        "",
        "| database | writer | rows/s | batches | batch p50 ms | batch p99 ms | rows/batch p50 | latency p50 ms | "
        "latency p99 ms | kept up |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in res["results"]:
        notes = []
        if r["batches_over_trigger"]:
            notes.append(f"{r['batches_over_trigger']}/{r['batches']} batches > trigger")
        if r.get("latency_growth_ms", 0) > res["trigger_s"] * 1000:
            notes.append(f"latency +{r['latency_growth_ms'] / 1000:.1f} s across the window")
        if r["latency_censored"]:
            notes.append(f"{r['latency_censored']} of {r['latency_samples']} sampled rows not visible in time")
        if r["error"]:
            notes.append(f"error: {r['error'][:80]}")
        kept = ("no" if r["behind"] else "yes") + (f" ({'; '.join(notes)})" if notes else "")
        lines.append(
            f"| {r['db']} | {r['contender']} | {r['rate']:,} | {r['batches']} | {r['batch_ms_p50']} | "
            f"{r['batch_ms_p99']} | {r['rows_per_batch_p50']} | {r['latency_ms_p50']} | {r['latency_ms_p99']} | "
            f"{kept} |"
        )
    lines += [
        "",
        "## Highest rate kept up (of the steps tried)",
        "",
        "| database | writer | rows/s |",
        "|---|---|---:|",
    ]
    for db in res["settings"]:
        for name in res["contenders"]:
            s = sustained(res["results"], db, name)
            lines.append(f"| {db} | {name} | {'below the first step' if s is None else f'{s:,}'} |")
    lines += [
        "",
        "Batch duration: `triggerExecution` of the query's progress events whose trigger started in the window. "
        "Latency: server time of the first poll that saw a sampled row minus the row's generation time (the rate "
        "source's timestamp); it includes the wait for the source (its offsets advance in whole seconds) and the "
        f"trigger, the same for every writer. Poll interval ~{int(POLL_S * 1000)} ms plus the query: the "
        "resolution. A row counts as visible once a reader can see it: xasink's rows at COMMIT PREPARED of their "
        "batch, the JDBC writer's at each partition's commit.",
    ]
    return "\n".join(lines) + "\n"


def chart(res: dict[str, Any], out: Path, name: str) -> list[str]:
    plt = report.pyplot()
    dbs = list(res["settings"])
    fig, axes = plt.subplots(2, len(dbs), figsize=(5.5 * len(dbs), 7), squeeze=False)
    for j, db in enumerate(dbs):
        for contender in res["contenders"]:
            rs = sorted(
                (r for r in res["results"] if r["db"] == db and r["contender"] == contender), key=lambda r: r["rate"]
            )
            if not rs:
                continue
            x = [r["rate"] for r in rs]
            for i, (lo, hi, label) in enumerate(
                (("latency_ms_p50", "latency_ms_p99", "latency ms"), ("batch_ms_p50", "batch_ms_p99", "batch ms"))
            ):
                ax = axes[i][j]
                line = ax.plot(x, [r[lo] for r in rs], marker="o", label=f"{contender} p50")[0]
                ax.plot(x, [r[hi] for r in rs], marker="x", ls="--", color=line.get_color(), label=f"{contender} p99")
                for r in rs:
                    if r["behind"]:
                        ax.annotate("behind", (r["rate"], r[lo] or 0), fontsize=7, color=line.get_color())
                ax.set_xscale("log")
                ax.set_yscale("log")
                ax.set_xlabel("rows/s")
                ax.set_ylabel(label)
                ax.set_title(f"{db}: {label}")
        axes[1][j].axhline(res["trigger_s"] * 1000, color="grey", lw=0.8, ls=":")
        axes[0][j].legend(fontsize=7)
    return [report.save_fig(fig, out / f"{name}-latency.png")]
