"""CPU seconds by process class over one timed run: where a 2-core machine's time goes.

Every contender here is CPU-bound (the database server, Spark's JVM and Python workers share the cores), so
the wall time can never drop below (CPU seconds of the parts a writer cannot avoid) / cores.  Read from
/proc: user + system time of every process, plus the time of children it has reaped (PostgreSQL backends
end with their connection and are reaped by the postmaster; psql and mysql clients by this process).
"""

from __future__ import annotations

import os
import statistics
from typing import Any

CLASSES = ("database", "spark_jvm", "python_workers", "driver_and_clients")
_HZ = os.sysconf("SC_CLK_TCK")


def _classify(pid: int, comm: str) -> str | None:
    if pid == os.getpid():
        return "driver_and_clients"
    if comm.startswith(("postgres", "mariadbd", "mysqld")):
        return "database"
    if comm == "java":
        return "spark_jvm"
    if comm.startswith("python"):
        return "python_workers"
    return None


def snapshot() -> dict[int, tuple[str, float]]:
    """Per process: its class and its CPU seconds so far (own and reaped children's)."""
    out: dict[int, tuple[str, float]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:  # gone meanwhile
            continue
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        kind = _classify(int(entry), comm)
        if kind is None:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        out[int(entry)] = (kind, sum(int(x) for x in fields[11:15]) / _HZ)  # utime stime cutime cstime
    return out


def used(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]) -> dict[str, float]:
    """CPU seconds per class between two snapshots (a process that started and ended in between is counted
    through its parent's reaped-children time)."""
    total = dict.fromkeys(CLASSES, 0.0)
    for pid, (kind, seconds) in after.items():
        total[kind] += seconds - before.get(pid, (kind, 0.0))[1]
    return {k: round(max(0.0, v), 2) for k, v in total.items()}


def summarize(samples: list[dict[str, float]], wall_s: float | None) -> dict[str, Any]:
    """Median CPU seconds per class over a contender's runs, with the bound they put on its wall time."""
    if not samples:
        return {}
    out: dict[str, Any] = {}
    for kind in CLASSES:
        out[kind] = round(statistics.median(s[kind] for s in samples), 2)
    out["total"] = round(sum(out[k] for k in CLASSES), 2)
    cores = os.cpu_count() or 1
    out["cores"] = cores
    out["cpu_bound_s"] = round(out["total"] / cores, 2)
    out["utilization"] = round(out["total"] / (cores * wall_s), 2) if wall_s else None
    return out
