"""Which writer runs are alive: a session lock held for a driver tells sweeps and recovery to keep off.

A run's branches may only be rolled back as undecided once the run is dead: a live driver may still decide
them.  Ages cannot tell (a long batch outlives any threshold; two backfills of one sink run side by side),
so every Spark driver holds a **guard**: a session lock named after the decision log and the driver
(``xasink:<log>:<driver>``), taken on the log's database by a small keeper process
(``python -m xasink.protocol.guard_process``) that lives exactly as long as the driver's JVM.
A run records its guard in its claim before any branch opens.  The lock vanishes with its connection, so when the
driver dies the server knows at once, with no clock: sweeps and ``xasink recover`` roll back branches of runs
whose guard is free and leave the others alone, whatever their age.

A database restart drops every session lock while prepared branches survive; for a short grace period
after the server started, a free guard counts as alive so the keepers can take their locks again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import select
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy.engine import Connection

from xasink.dialects.base import Dialect
from xasink.errors import PreflightError
from xasink.journal.records import ClaimState

log = logging.getLogger(__name__)

RESTART_GRACE_S = 30.0  # after a server (re)start, keepers take their guards again within seconds
# how far the server's start may lie from what runs_alive computes: MariaDB gives its uptime and clock in whole
# seconds and stamps claims in whole seconds, so a claim in the second of a restart may read as the same second
# or one later; judging such a claim as made before the restart errs to "alive" (only during the grace)
CLOCK_SLACK = timedelta(seconds=2)
KEEPER_START_TIMEOUT_S = 60.0
GUARD_PING_S = 2.0  # how often an in-process guard checks its session is still there


def guard_name(log_id: str, driver: str) -> str:
    return f"xasink:{log_id}:{driver}"


def _stat(pid: int) -> tuple[int, int, str] | None:
    """(parent pid, start time in clock ticks, command name) of a process, from /proc."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            raw = f.read()
    except OSError:
        return None
    name = raw[raw.index("(") + 1 : raw.rindex(")")]
    fields = raw[raw.rindex(")") + 2 :].split()
    return int(fields[1]), int(fields[19]), name


@dataclass(frozen=True)
class DriverProcess:
    """The process whose life a guard follows (the Spark driver's JVM), named so a reused pid is not mistaken."""

    pid: int
    start: int

    @property
    def token(self) -> str:
        seed = f"{socket.gethostname()}:{self.pid}:{self.start}".encode()
        return hashlib.blake2b(seed, digest_size=6).hexdigest()

    def alive(self) -> bool:
        st = _stat(self.pid)
        return st is not None and st[1] == self.start


def spark_driver_process(max_depth: int = 8) -> DriverProcess | None:
    """The Spark driver's JVM: the one this Python runs under (a Spark worker, or a script spark-submit
    started), else the one this Python started itself (PySpark's gateway: the partition-function writes
    of Spark 3.5 plan and commit in the user's process); None outside Spark."""
    pid = os.getppid()
    for _ in range(max_depth):
        st = _stat(pid)
        if st is None or pid <= 1:
            break
        if st[2] == "java":
            return DriverProcess(pid, st[1])
        pid = st[0]
    return _gateway_child()


# PySpark starts its driver JVM as ``spark-submit ... pyspark-shell`` (pyspark.java_gateway.launch_gateway)
_GATEWAY_ARG = b"pyspark-shell"


def _gateway_child() -> DriverProcess | None:
    """The driver JVM PySpark launched from this process: a ``java`` child whose last argument is
    ``pyspark-shell`` (a standalone cluster's Master or Worker that a test started is not)."""
    me = os.getpid()
    try:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return None
    for pid in pids:
        st = _stat(pid)
        if st is None or st[0] != me or st[2] != "java":
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
        except OSError:
            continue
        if _GATEWAY_ARG in args:
            return DriverProcess(pid, st[1])
    return None


def ensure_keeper(dialect: Dialect, log_id: str, driver: DriverProcess) -> str:
    """The guard of this driver for this log, started on first use; returns its name."""
    name = guard_name(log_id, driver.token)
    with dialect.connect(autocommit=True) as conn:  # every batch's check: one read, no BEGIN and ROLLBACK
        if dialect.held_session_locks(conn, [name]):
            return name
    config = {
        "url": dialect.url.render_as_string(hide_password=False),  # through a pipe, never the command line
        "name": name,
        "pid": driver.pid,
        "start": driver.start,
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "xasink.protocol.guard_process"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        close_fds=True,
        text=True,
    )
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(json.dumps(config) + "\n")
    proc.stdin.close()
    ready, _, _ = select.select([proc.stdout], [], [], KEEPER_START_TIMEOUT_S)
    answer = proc.stdout.readline().strip() if ready else ""
    proc.stdout.close()
    proc.wait(timeout=10)  # the keeper forked: this is its short-lived parent
    if answer not in ("ready", "held"):
        raise PreflightError(
            f"could not start the xasink run guard on {dialect.where()} ({answer or 'no answer'}): the driver "
            "holds a session lock there while it writes, so sweeps and recovery know its runs are alive"
        )
    log.info("run guard %s held for driver process %s", name, driver.pid)
    return name


class InProcessGuard:
    """A guard held by this very process: Spark-free writers (tests, tools) and multi-target transactions.

    A database restart (or a killed session) drops the lock while the run goes on; after the restart grace a
    free guard means a dead run, whose branches any sweep rolls back.  So the lock is taken again: by a
    watcher thread that pings its session every ``watch_s``, and by :meth:`ensure`, which a writer calls
    before each step that relies on its branches being left alone.
    """

    def __init__(self, dialect: Dialect, log_id: str, suffix: str | None = None, watch_s: float = GUARD_PING_S) -> None:
        me = _stat(os.getpid())
        token = DriverProcess(os.getpid(), me[1] if me else 0).token
        self.name = guard_name(log_id, token if suffix is None else f"{token}.{suffix}")
        self._dialect = dialect
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._conn: Connection | None = dialect.connect(autocommit=True)
        try:
            held = dialect.try_session_lock(self._conn, self.name)
        except BaseException:
            self.close()  # a session that failed the lock is never left open
            raise
        if not held:
            self.close()
            raise PreflightError(f"run guard {self.name} is held by another session")
        self._watch_s = watch_s
        self._watcher = threading.Thread(target=self._watch, name=f"xasink-guard-{self.name}", daemon=True)
        self._watcher.start()

    def ensure(self, timeout_s: float = RESTART_GRACE_S) -> None:
        """Hold the lock now: ping its session; after a lost one, connect and take the lock again.

        Raises :class:`PreflightError` when the lock cannot be held again within ``timeout_s``.
        """
        with self._lock:
            if self._closed.is_set():
                return
            if self._conn is not None:
                try:
                    self._dialect.ping(self._conn)
                    return
                except Exception:  # noqa: BLE001 - a lost session: taken again below
                    self._drop()
            deadline = time.monotonic() + timeout_s
            while not self._closed.is_set():  # a close() meanwhile ends the wait: nothing left to guard
                conn: Connection | None = None
                try:
                    conn = self._dialect.connect(autocommit=True)
                    if self._dialect.try_session_lock(conn, self.name):
                        self._conn = conn
                        log.warning("run guard %s was lost (a database restart?) and is held again", self.name)
                        return
                    why = "held by another session"  # the old session's lock is still being released
                    conn.close()
                except Exception as exc:  # noqa: BLE001 - the server is still coming back
                    why = type(exc).__name__
                    if conn is not None:  # its lock query failed: perhaps granted, so never back to a pool
                        try:
                            conn.invalidate()
                        except Exception:  # noqa: BLE001 - a session that died with its server
                            pass
                if time.monotonic() > deadline:
                    raise PreflightError(
                        f"run guard {self.name} was lost and could not be taken again within {timeout_s:.0f}s "
                        f"({why}) on {self._dialect.where()}: this run's branches are no longer protected"
                    )
                self._closed.wait(0.5)

    def _drop(self) -> None:
        if self._conn is not None:
            try:
                self._conn.invalidate()
            except Exception:  # noqa: BLE001,S110 - the session is gone either way
                pass
            self._conn = None

    def _watch(self) -> None:
        while not self._closed.wait(self._watch_s):
            try:
                self.ensure()
            except Exception as exc:  # noqa: BLE001 - said here; the next ensure() by the writer raises
                log.warning("run guard %s: %s", self.name, exc)

    def close(self) -> None:
        """Release the guard; never raises.  A session the server already lost (a restart, a killed session)
        released the lock with it: as in :meth:`_drop`, it is discarded and said at DEBUG, since the run this
        guard protected has ended either way and its outcome (told by the caller) does not depend on it."""
        self._closed.set()
        with self._lock:
            if self._conn is None:
                return
            try:  # released now: a pooled session keeps it when closed, an ending one holds it a moment longer
                self._dialect.release_session_lock(self._conn, self.name)
                self._conn.close()
                self._conn = None
            except Exception as exc:  # noqa: BLE001 - a lost session: its lock went with it
                log.debug("run guard %s: its session was already lost (%s)", self.name, type(exc).__name__)
                self._drop()


def runs_alive(
    dialect: Dialect, conn: Connection, claims: dict[tuple[int, str], ClaimState]
) -> dict[tuple[int, str], bool | None]:
    """For each (batch, run) claim: True alive, False dead, None unknown (the run kept no guard).

    A superseded run can never decide: dead.  A run whose guard some session holds: alive.  A run that
    claimed its batch before the server last started, within a short grace after that start, counts as
    alive too: its keeper is taking its guard again.  "Before" is judged with :data:`CLOCK_SLACK` to spare
    (never a strict comparison of whole seconds): a claim in the very second of a restart is alive.
    """
    guards = {c.guard for c in claims.values() if c.guard and not c.superseded}
    held = dialect.held_session_locks(conn, guards) if guards else set()
    restarted_at = None
    if guards - held:
        uptime = dialect.server_uptime_s(conn)
        if uptime < RESTART_GRACE_S:
            restarted_at = dialect.server_now(conn) - timedelta(seconds=uptime)
    out: dict[tuple[int, str], bool | None] = {}
    for key, c in claims.items():
        if c.superseded:
            out[key] = False
        elif c.guard is None:
            out[key] = None
        else:
            out[key] = c.guard in held or (restarted_at is not None and c.claimed_at <= restarted_at + CLOCK_SLACK)
    return out
