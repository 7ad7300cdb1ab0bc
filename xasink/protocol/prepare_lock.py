"""The prepare lock: whether a task of an ended run may still PREPARE, told by session locks on the target's server.

When Spark fails a job, tasks still running are cancelled, but one may PREPARE before its worker is killed and
die before its own late check (:func:`xasink.protocol.partition_writer.settle_prepared`) rolls the branch back.
The abort ends the run in the decision log and sweeps; to know when that sweep is whole, each task takes its
run's prepare lock in its branch's own session, then reads its run's claim, then PREPAREs.  The lock goes
with that session, so it is held until the server has finished the PREPARE (also one whose client was killed
meanwhile).  After ending the run, the abort waits until no session holds the lock: a task that held it has
prepared or failed by then, and the next sweep sees its branch; a task that takes it later reads the run ended
and prepares nothing.  The wait is bounded (the abort's settle window); past it the abort sweeps over the rest
of the window, as it did before the lock existed.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable

from xasink.dialects.base import Dialect
from xasink.protocol.recovery import RecoveryReport
from xasink.protocol.xid import Xid

POLL_S = 0.05

log = logging.getLogger("xasink.protocol.coordinator")  # a step of the abort: logged under its name


def prepare_lock_name(log_id: str, sink_id: str, batch_id: int, run: str) -> str:
    """The lock's name: at most 64 characters with a slot's suffix (MySQL's ``GET_LOCK`` limit), hashed."""
    key = f"{log_id}\x00{sink_id}\x00{batch_id}\x00{run}".encode()
    return "xasink-prep:" + hashlib.blake2b(key, digest_size=16).hexdigest()


def task_locks(dialect: Dialect, xid: Xid) -> list[str]:
    """The session locks a task of ``xid``'s run may take, the first to be tried first: the run's own lock, or
    where a server's session locks cannot be shared (``Dialect.prepare_lock_slots``) any free slot of it,
    starting at the partition's (so one stuck task does not hold up a retry or another partition)."""
    name = prepare_lock_name(xid.log_id, xid.sink_id, xid.batch_id, xid.run)
    slots = dialect.prepare_lock_slots
    first = xid.partition % slots
    return [f"{name}:{(first + i) % slots}" for i in range(slots)] if slots > 1 else [name]


def lock_names(dialect: Dialect, name: str) -> list[str]:
    """Every session lock of the run's prepare lock ``name``."""
    slots = dialect.prepare_lock_slots
    return [f"{name}:{slot}" for slot in range(slots)] if slots > 1 else [name]


def wait_for_prepares(dialect: Dialect, names: list[str], deadline: float, meanwhile: Callable[[], None]) -> bool:
    """Whether, before ``deadline`` (``time.monotonic()``), no session held any of these runs' prepare locks;
    ``meanwhile`` runs about once a second while some session does."""
    wanted = [n for name in names for n in lock_names(dialect, name)]
    with dialect.connect(autocommit=True) as conn:
        held = dialect.held_session_locks(conn, wanted)
        if held:
            log.info("waiting up to %.1f s for %d task(s) still preparing", deadline - time.monotonic(), len(held))
        next_call = time.monotonic() + 1.0
        while held:
            now = time.monotonic()
            if now >= deadline:
                return False
            if now >= next_call:
                meanwhile()
                next_call = now + 1.0
            time.sleep(POLL_S)
            held = dialect.held_session_locks(conn, wanted)
    return True


def settle(
    sweep: Callable[[], RecoveryReport], dialect: Dialect, names: list[str] | None, settle_s: float
) -> RecoveryReport:
    """The abort's sweeps after it ended its runs: one, then one more once no task of the runs ``names`` is
    preparing, and one a second while some is, for at most ``settle_s`` (then once more).  ``names`` None (a run
    with no claim to end): a sweep every second over ``settle_s``, for tasks that may prepare until Spark kills
    their worker."""
    report = sweep()
    deadline = time.monotonic() + settle_s
    if names is not None:
        if not wait_for_prepares(dialect, names, deadline, lambda: report.add(sweep())):
            log.info("a task is still preparing after %.1f s; sweeping once more and leaving it", settle_s)
        report.add(sweep())
        return report
    while time.monotonic() < deadline:
        time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
        report.add(sweep())
    return report
