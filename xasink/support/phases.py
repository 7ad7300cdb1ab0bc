"""Where a batch's time goes: per-phase timings, written only when ``XASINK_PHASE_LOG`` names a file.

A batch runs in several processes (the user's driver, the Python workers Spark starts on the driver for
planning and for the commit, one worker per task), so the phases are appended as JSON lines to one file
that every process inherits from the environment, and the benchmark sums them per batch.  Unset (the
default) a phase costs one dictionary look-up.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

PHASE_LOG_ENV = "XASINK_PHASE_LOG"
IMPORTED_AT = time.time()  # when this process imported xasink: a fresh Python worker's start shows here


def enabled() -> bool:
    return bool(os.environ.get(PHASE_LOG_ENV))


def record(name: str, start: float, end: float, **ids: object) -> None:
    """Append one phase (wall-clock epoch seconds) to the phase log, if there is one."""
    path = os.environ.get(PHASE_LOG_ENV)
    if not path:
        return
    line = json.dumps({"phase": name, "start": start, "end": end, "pid": os.getpid(), **ids}, default=str)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:  # one write of one short line: O_APPEND keeps lines of concurrent processes whole
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def stamp_connect(dialect: object, conn_rec: Any, cargs: object, cparams: object) -> None:
    """SQLAlchemy's ``do_connect`` event: a control connection's set-up begins (see :func:`record_connect`)."""
    conn_rec.info["xasink_connect_start"] = time.time()


def record_connect(dbapi_conn: object, conn_rec: Any) -> None:
    """SQLAlchemy's ``connect`` event: the set-up's time as the phase ``connect.control``."""
    start = conn_rec.info.pop("xasink_connect_start", None)
    if start is not None:
        record("connect.control", start, time.time())


@contextmanager
def phase(name: str, **ids: object) -> Iterator[None]:
    """Time the block as phase ``name`` (ids such as sink, batch and partition tell batches apart)."""
    if not os.environ.get(PHASE_LOG_ENV):
        yield
        return
    start = time.time()
    try:
        yield
    finally:
        record(name, start, time.time(), **ids)


_worker_reported = False


def _process_started() -> float:
    """When this process started (Linux /proc), else when it imported xasink."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/stat") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith("btime "))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, StopIteration, IndexError):
        return IMPORTED_AT


def worker_started(side: str = "task", **ids: object) -> None:
    """Mark the start of a task (or of a driver-side call); a process's first also records its start and imports.

    Spark forks a Python worker per task (reused by later tasks) and starts a fresh one on the driver for
    planning a write and for each streaming commit: ``<side>.worker_start`` is what that cost this batch.
    """
    global _worker_reported
    if not os.environ.get(PHASE_LOG_ENV):
        return
    now = time.time()
    if not _worker_reported:
        _worker_reported = True
        record(f"{side}.worker_start", _process_started(), now, **ids)
    record(f"{side}.start", now, now, **ids)
