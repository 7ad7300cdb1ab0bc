"""The issues' goals beside what a ``benchmarks.run`` run measured (the report's targets table).

A speed goal against Spark's JDBC writer shows, beside the figure, the CPU seconds of the database server,
Spark's JVM and the Python workers in both writers' runs and the CPU ceiling they imply: the JDBC writer's
time over the server's and the JVM's CPU seconds in xasink's runs divided by the cores, i.e. xasink with no
Python cost at all on cores never idle.  It tells whether a goal is reachable on the machine at hand.
"""

from __future__ import annotations

from typing import Any

SIZE_FOR_TARGETS = 2_000_000
# issue 31: MariaDB append against the tuned JDBC writer in exactly this configuration
MARIADB_APPEND = {"db": "mariadb", "schema": "narrow", "size": 2_000_000, "master": "local[2]", "partitions": 4}
MARIADB_APPEND_COMMAND = (
    "python -m benchmarks.run --db mariadb --schemas narrow --sizes 2000000 --runs 3 --sections throughput "
    "--contenders xasink,jdbc-tuned --master 'local[2]' --mariadb private"
)


def fmt_size(n: int) -> str:
    return f"{n / 1e6:g}M" if n >= 1_000_000 else f"{n / 1e3:g}k"


def _cpu(throughput: list[dict[str, Any]], db: str, schema: str, size: int, contender: str) -> dict[str, Any]:
    for r in throughput:
        if (r["db"], r["schema"], r["size"], r["contender"]) == (db, schema, size, contender) and r.get("cpu_s"):
            return dict(r["cpu_s"])
    return {}


def cpu_cell(throughput: list[dict[str, Any]], db: str, schema: str, size: int, other: str) -> str | None:
    """Median CPU seconds (server / Spark JVM / Python workers) of xasink's runs and of ``other``'s."""
    parts = []
    for name in ("xasink", other):
        c = _cpu(throughput, db, schema, size, name)
        if c:
            parts.append(f"{name}: {c['database']:.2f} / {c['spark_jvm']:.2f} / {c['python_workers']:.2f}")
    return "; ".join(parts) or None


def _memory_growth(memory: list[dict[str, Any]], db: str, writer: str = "xasink") -> dict[str, Any] | None:
    """Peak RSS of the writing worker at the largest partition over that at the smallest."""
    rows = sorted((m for m in memory if m["db"] == db and m["writer"] == writer), key=lambda m: m["rows_per_partition"])
    if len(rows) < 2:
        return None
    lo, hi = rows[0], rows[-1]
    return {
        "db": db,
        "value": round(hi["peak_rss_mb"] / lo["peak_rss_mb"], 3),
        "at": f"{fmt_size(lo['rows_per_partition'])} and {fmt_size(hi['rows_per_partition'])} rows a partition",
        "note": f"{lo['peak_rss_mb']:.0f} MB and {hi['peak_rss_mb']:.0f} MB",
    }


def mariadb_append(rat: list[dict[str, Any]], res: dict[str, Any]) -> dict[str, Any]:
    """Issue 31's row: filled only from a run in its configuration (else it says how to run one)."""
    want = MARIADB_APPEND
    spark = res.get("setup", {}).get("spark", {})
    cell = (want["db"], want["schema"], want["size"])
    row = next((r for r in rat if (r["db"], r["schema"], r["size"]) == cell), None)
    ran = (spark.get("master"), spark.get("partitions"))
    out: dict[str, Any] = {
        "target": "MariaDB append vs tuned JDBC, 2M narrow, local[2], 4 partitions",
        "goal": ">= 1.5x",
        "value": None,
        "met": None,
        "measured_at": "not measured",
        "note": f"measured by: {MARIADB_APPEND_COMMAND}",
    }
    if row is None or row.get("xasink_speedup_vs_jdbc_tuned") is None:
        return out
    if ran != (want["master"], want["partitions"]):
        out["measured_at"] = f"not in this configuration (this run: {ran[0]}, {ran[1]} partitions)"
        return out
    value = row["xasink_speedup_vs_jdbc_tuned"]
    throughput = res.get("throughput", [])
    out |= {
        "measured_at": f"mariadb narrow 2M, {want['master']}, {want['partitions']} partitions, side by side",
        "value": value,
        "met": value >= 1.5,
        "cpu": cpu_cell(throughput, want["db"], want["schema"], want["size"], "jdbc-tuned"),
        "ceiling": row.get("ceiling_vs_jdbc_tuned"),
        "note": None,
    }
    return out


def targets(
    rat: list[dict[str, Any]],
    scale: list[dict[str, Any]],
    memory: list[dict[str, Any]] | None = None,
    res: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """The issue's goals beside what this run measured; a speed goal shows the machine's CPU ceiling with it."""
    res = res or {}
    throughput = res.get("throughput", [])

    def pick(db: str, schema: str = "narrow") -> dict[str, Any] | None:
        rows = [r for r in rat if r["db"] == db and r["schema"] == schema]
        if not rows:
            return None
        return min(rows, key=lambda r: (abs(r["size"] - SIZE_FOR_TARGETS), -r["size"]))

    out = []

    def add(what: str, row: dict[str, Any] | None, key: str, goal: str, ok: Any, vs: str | None = None) -> None:
        value = row.get(key) if row else None
        at = f"{row['db']} {row['schema']} {fmt_size(row['size'])}" if row else "not measured"
        ceiling = row.get(f"ceiling_vs_{vs.replace('-', '_')}") if row and vs else None
        cpu = cpu_cell(throughput, row["db"], row["schema"], row["size"], vs) if row and vs else None
        met = None if value is None else bool(ok(value))
        out.append(
            {"target": what, "measured_at": at, "value": value, "goal": goal, "met": met}
            | {
                "cpu": cpu,
                "ceiling": ceiling,
                "note": None,
            }
        )

    pg, my = pick("postgresql"), pick("mariadb")
    tuned, default = "jdbc-tuned", "jdbc-default"
    add("PG: xasink vs tuned JDBC writer", pg, "xasink_speedup_vs_jdbc_tuned", ">= 2x", lambda v: v >= 2, tuned)
    add(
        "PG: xasink vs default JDBC writer",
        pg,
        "xasink_speedup_vs_jdbc_default",
        ">= 3.5x",
        lambda v: v >= 3.5,
        default,
    )
    add(
        "PG: xasink time / floor (parallel COPY + Arrow hand-off)",
        pg,
        "xasink_time_over_floor",
        "<= 1.15",
        lambda v: v <= 1.15,
    )
    add("PG: price of XA (vs plain COMMIT)", pg, "price_of_xa_pct", "<= 5 %", lambda v: v <= 5)
    add("MariaDB: xasink vs tuned JDBC writer", my, "xasink_speedup_vs_jdbc_tuned", ">= 2x", lambda v: v >= 2, tuned)
    out.append(mariadb_append(rat, res))
    add("PG: xasink upsert vs hand-written upsert", pg, "upsert_speedup_vs_hand", ">= 2x", lambda v: v >= 2)
    add("MariaDB: xasink upsert vs hand-written upsert", my, "upsert_speedup_vs_hand", ">= 2x", lambda v: v >= 2)
    big = [s for s in scale if s["branches"] == 256]
    best = min(big, key=lambda s: s["decide_commit_s"]) if big else None
    out.append(
        {
            "target": "256 branches decided + committed",
            "measured_at": f"commitParallelism {best['commit_parallelism']}" if best else "not measured",
            "value": best["decide_commit_s"] if best else None,
            "goal": "< 1 s",
            "met": None if best is None else best["decide_commit_s"] < 1,
            "note": None,
        }
    )
    for db in sorted({m["db"] for m in memory or []}):
        growth = _memory_growth(memory or [], db)
        if growth:
            out.append(
                {
                    "target": f"{db}: worker peak RSS flat as partitions grow (larger over smaller)",
                    "measured_at": growth["at"],
                    "value": growth["value"],
                    "goal": "<= 1.1",
                    "met": growth["value"] <= 1.1,
                    "note": growth["note"],
                }
            )
    return out
