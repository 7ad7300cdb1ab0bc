"""CPU seconds by process class over one timed run: where a 2-core machine's time goes.

Every contender here is CPU-bound (the database server, Spark's JVM and Python workers share the cores), so
the wall time can never drop below (CPU seconds of the parts a writer cannot avoid) / cores.  Read from
/proc: user + system time of this run's processes, plus the time of children they have reaped (PostgreSQL
backends end with their connection and are reaped by the postmaster; psql and mysql clients by this process).
This run's processes are this driver's descendants (Spark's JVM, its Python workers) and the database servers:
only those it started when it started them all (``SERVER_ROOTS``), else every one on the machine, whose
CPU then includes other jobs' work on a shared server.

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
_DATABASES = ("postgres", "mariadbd", "mysqld")
# the pids of database servers this run started for itself (benchmarks.env); None: a server is shared with
# other jobs, and every database process on the machine counts (their work included)
SERVER_ROOTS: set[int] | None = None


def _descends(pid: int, roots: set[int], parents: dict[int, int]) -> bool:
    seen = 0
    while pid > 1 and seen < 64:
        if pid in roots:
            return True
        pid, seen = parents.get(pid, 0), seen + 1
    return False


def _classify(pid: int, comm: str, parents: dict[int, int]) -> str | None:
    """The class of a process of this run: its database servers, and this driver's Spark JVM and Python
    workers (another job's JVM or Python on the machine is not ours)."""
    me = os.getpid()
    if pid == me:
        return "driver_and_clients"
    if comm.startswith(_DATABASES):
        return "database" if SERVER_ROOTS is None or _descends(pid, SERVER_ROOTS, parents) else None
    if not _descends(pid, {me}, parents):
        return None
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
    procs: dict[int, tuple[str, float, int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:  # gone meanwhile
            continue
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        seconds = sum(int(x) for x in fields[11:15]) / _HZ  # utime stime cutime cstime
        procs[int(entry)] = (comm, seconds, int(fields[1]))
    parents = {pid: p[2] for pid, p in procs.items()}
    out: dict[int, Usage] = {}
    for pid, (comm, seconds, parent) in procs.items():
        kind = _classify(pid, comm, parents)
        if kind is not None:
            out[pid] = Usage(kind, seconds, parent)
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
