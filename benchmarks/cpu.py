"""CPU seconds by process class over one timed run: where a 2-core machine's time goes.

Every contender here is CPU-bound (the database server, Spark's JVM and Python workers share the cores), so
the wall time can never drop below (CPU seconds of the parts a writer cannot avoid) / cores.  Read from
/proc: user + system time of every process, plus the time of children it has reaped (PostgreSQL backends
end with their connection and are reaped by the postmaster; psql and mysql clients by this process).

A process that is already running at the first snapshot and ends before the second reaches its parent's
reaped-children time with its whole life, not only the part inside the window: that part before the window
is taken off again (Spark's Python workers and the previous contender's connections end this way).
"""

from __future__ import annotations

import os
import statistics
from typing import Any, NamedTuple

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


class Usage(NamedTuple):
    kind: str
    seconds: float  # own and reaped children's CPU seconds so far
    parent: int


def snapshot() -> dict[int, Usage]:
    """Per process of a known class: its class, CPU seconds so far and parent."""
    out: dict[int, Usage] = {}
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
        seconds = sum(int(x) for x in fields[11:15]) / _HZ  # utime stime cutime cstime
        out[int(entry)] = Usage(kind, seconds, int(fields[1]))
    return out


def used(before: dict[int, Usage], after: dict[int, Usage]) -> dict[str, float]:
    """CPU seconds per class between two snapshots.

    A process that started and ended in between is counted through its parent's reaped-children time; one
    that ended in between after starting before is counted there too, less what it had used before.
    """
    total = dict.fromkeys(CLASSES, 0.0)
    for pid, now in after.items():
        then = before.get(pid)
        total[now.kind] += now.seconds - (then.seconds if then and then.kind == now.kind else 0.0)
    for pid, then in before.items():
        reaper = after.get(then.parent)
        if pid not in after and reaper is not None:
            total[reaper.kind] -= then.seconds
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
