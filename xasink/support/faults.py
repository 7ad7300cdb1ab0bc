"""Named fault points, for testing only.

Set ``XASINK_FAULT`` (or, for Spark tasks, the local property
``xasink.fault``) to a comma-separated list of specs::

    point[:action][:p=PARTITION][:a=ATTEMPT][:b=BATCH]

``action`` is ``kill`` (default: SIGKILL this process), ``raise`` (raise
:class:`InjectedFault`), ``stop`` (SIGSTOP this process, holding the point
while a test kills what it chooses, e.g. the executor JVM after a branch
prepared) or ``sleep=SECONDS`` (stall there: a straggler Spark speculates on).
Spark runs the data source's driver-side code in a Python worker
of its own process group, so to crash the whole driver a test sets
``XASINK_FAULT_PGID`` to the driver's process group (its Python and the JVM):
the fault point kills that group, then itself.  Unset, a fault point
costs one dictionary lookup.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

ENV = "XASINK_FAULT"
LOCAL_PROPERTY = "xasink.fault"

POINTS = (
    "task.before_load",  # branch started, before any row is loaded
    "task.before_prepare",  # rows loaded, before PREPARE
    "task.after_prepare",  # branch prepared (or a sibling's adopted), before the task returns its message
    "driver.before_decide",  # all branches prepared, before the decision is recorded
    "driver.after_decide",  # decision durable, before any COMMIT
    "driver.after_first_commit",  # one branch committed, others maybe not
    "driver.after_commits",  # every branch committed, before the batch is marked committed
    "driver.swap_loaded",  # an overwrite's swap (PostgreSQL) loaded the new storage, before it takes the table's place
    "driver.apply_statements",  # a write mode's apply changed the target, before it clears the shadow and commits
    "driver.before_replay_finish",  # the batch was decided by another run: before finishing that decision
    "driver.after_mark",  # batch marked committed, before the sweep and before Spark's own commit log
    "tx.after_write",  # a transaction's write prepared and recorded its part (p=write number), others not yet
)

# where Spark tasks can read a per-job spec; set by the Spark adapter
task_spec_source: Callable[[], str | None] | None = None


class InjectedFault(RuntimeError):
    """Raised at a fault point whose action is ``raise``."""


def _matches(spec: str, point: str, partition: int | None, attempt: int | None, batch: int | None) -> str | None:
    parts = spec.strip().split(":")
    if parts[0] != point:
        return None
    action = "kill"
    for part in parts[1:]:
        key, _, value = part.partition("=")
        if not value:
            action = key
        elif key == "p" and partition is not None and int(value) != partition:
            return None
        elif key == "a" and attempt is not None and int(value) != attempt:
            return None
        elif key == "b" and batch is not None and int(value) != batch:
            return None
        elif key == "sleep":
            action = f"sleep={float(value)}"
    return action


def armed(point: str) -> bool:
    """Whether this process's fault spec names ``point`` (driver-side points; tasks read theirs per job)."""
    spec = os.environ.get(ENV) or ""
    return any(item.strip().split(":")[0] == point for item in spec.split(","))


def fault(point: str, *, partition: int | None = None, attempt: int | None = None, batch: int | None = None) -> None:
    """Kill or raise here if a test asked for it."""
    spec = os.environ.get(ENV)
    if not spec and task_spec_source is not None and point.startswith("task."):
        spec = task_spec_source()
    if not spec:
        return
    for item in spec.split(","):
        action = _matches(item, point, partition, attempt, batch)
        if action is None:
            continue
        log.warning("fault point %s reached: %s", point, action)
        if action == "raise":
            raise InjectedFault(f"injected fault at {point}")
        if action.startswith("sleep="):
            time.sleep(float(action.split("=", 1)[1]))
            continue
        if action == "stop":
            os.kill(os.getpid(), signal.SIGSTOP)
            continue
        group = os.environ.get("XASINK_FAULT_PGID")
        if group:
            try:
                os.killpg(int(group), signal.SIGKILL)
            except ProcessLookupError:
                pass
        os.kill(os.getpid(), signal.SIGKILL)
