"""What ``xasink status`` alerts on: thresholds, the checks they give, and Nagios-style states and exit codes.

Like check_postgres and every Nagios plugin: 0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN (the state could not be
read: no connection, no decision log, no such sink, a figure the user set a threshold for is not readable).
A server on which xasink cannot write at all (``max_prepared_transactions = 0``, a read-only server) is
CRITICAL whatever the thresholds: a check must never be green where every write fails.  Ages and ratios
alert at or above their threshold; counts alert above it, so ``--crit-blocked 0`` means "any blocked session".
Ages are the server's clock (UTC), never the client's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Protocol

OK, WARNING, CRITICAL, UNKNOWN = "OK", "WARNING", "CRITICAL", "UNKNOWN"
EXIT_CODES = {OK: 0, WARNING: 1, CRITICAL: 2, UNKNOWN: 3}


@dataclass(frozen=True)
class Thresholds:
    """Alert thresholds; None: that figure is reported, never alerted on."""

    warn_prepared_age: float | None = None  # seconds: oldest prepared branch of this decision log
    crit_prepared_age: float | None = None
    warn_blocked: int | None = None  # sessions blocked by a prepared transaction: alert above this many
    crit_blocked: int | None = None
    warn_batch_age: float | None = None  # seconds since a sink's last committed batch
    crit_batch_age: float | None = None
    warn_prepared_ratio: float | None = None  # prepared transactions / max_prepared_transactions (PostgreSQL)
    crit_prepared_ratio: float | None = None

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if value is not None and not value >= 0:  # also NaN
                raise ValueError(f"{name.replace('_', '-')} must be 0 or more, not {value!r}")


@dataclass(frozen=True)
class Check:
    """One figure against its thresholds."""

    name: str  # prepared_age, blocked, batch_age, prepared_ratio, stale, errors, server
    state: str
    value: float | None
    warn: float | None = None
    crit: float | None = None
    sink: str | None = None
    message: str = ""


class SinkFigures(Protocol):
    """What the checks read of one sink (:class:`xasink.ops.status.SinkStatus` has it); a protocol, so that
    this module stays below the status report it judges."""

    @property
    def sink_id(self) -> str: ...
    @property
    def stale(self) -> int: ...
    @property
    def last_committed_age_s(self) -> float | None: ...


class Figures(Protocol):
    """What the checks read of a report (:class:`xasink.ops.status.StatusReport` has it)."""

    @property
    def thresholds(self) -> Thresholds: ...
    @property
    def errors(self) -> Sequence[str]: ...
    @property
    def write_blockers(self) -> Sequence[str]: ...
    @property
    def older_than_s(self) -> float: ...
    @property
    def oldest_prepared_age_s(self) -> float | None: ...
    @property
    def prepared_age_unknown(self) -> int: ...
    @property
    def blocked_sessions(self) -> Sequence[Any] | None: ...
    @property
    def prepared_ratio(self) -> float | None: ...
    @property
    def sinks(self) -> Sequence[SinkFigures]: ...


def _level(value: float | None, warn: float | None, crit: float | None, above: bool, unknown_is_old: bool) -> str:
    """The state of ``value``; ``above``: counts alert above the threshold, ages and ratios at or above it."""
    for threshold, state in ((crit, CRITICAL), (warn, WARNING)):
        if threshold is None:
            continue
        if value is None:
            if unknown_is_old:
                return state
            continue
        if value > threshold or (not above and value == threshold):
            return state
    return OK


def evaluate(report: Figures) -> list[Check]:
    """Every check of ``report`` against its thresholds, the failed reads and the ``--older-than`` rule."""
    t = report.thresholds
    checks = [Check("errors", UNKNOWN, len(report.errors), message=e) for e in report.errors]
    checks += [Check("server", CRITICAL, None, message=why) for why in report.write_blockers]
    if t.warn_prepared_age is not None or t.crit_prepared_age is not None:
        unknown = report.prepared_age_unknown > 0  # a branch whose age MySQL cannot give counts as old
        value = None if unknown else report.oldest_prepared_age_s
        state = _level(value, t.warn_prepared_age, t.crit_prepared_age, False, unknown)
        what = "of unknown age" if unknown else ("none" if value is None else f"{value:.0f}s")
        checks.append(
            Check("prepared_age", state, value, t.warn_prepared_age, t.crit_prepared_age, message=f"oldest {what}")
        )
    if t.warn_blocked is not None or t.crit_blocked is not None:
        if report.blocked_sessions is None:
            checks.append(
                Check("blocked", UNKNOWN, None, t.warn_blocked, t.crit_blocked, message="lock waits unreadable")
            )
        else:
            n = len(report.blocked_sessions)
            state = _level(n, t.warn_blocked, t.crit_blocked, True, False)
            checks.append(Check("blocked", state, n, t.warn_blocked, t.crit_blocked, message=f"{n} blocked"))
    if t.warn_prepared_ratio is not None or t.crit_prepared_ratio is not None:
        ratio = report.prepared_ratio
        state = _level(ratio, t.warn_prepared_ratio, t.crit_prepared_ratio, False, False)
        what = "no limit on this server" if ratio is None else f"{ratio:.2f} of max_prepared_transactions"
        checks.append(Check("prepared_ratio", state, ratio, t.warn_prepared_ratio, t.crit_prepared_ratio, message=what))
    if t.warn_batch_age is not None or t.crit_batch_age is not None:
        for s in report.sinks:
            if s.last_committed_age_s is None:
                continue  # nothing committed yet (or trimmed): no age to alert on
            state = _level(s.last_committed_age_s, t.warn_batch_age, t.crit_batch_age, False, False)
            checks.append(
                Check(
                    "batch_age",
                    state,
                    s.last_committed_age_s,
                    t.warn_batch_age,
                    t.crit_batch_age,
                    sink=s.sink_id,
                    message=f"last commit {s.last_committed_age_s:.0f}s ago",
                )
            )
    stale = sum(s.stale for s in report.sinks)
    if stale:  # what status has always said with exit code 1: in doubt or prepared for --older-than or longer
        checks.append(Check("stale", WARNING, stale, report.older_than_s, message=f"{stale} stale"))
    return checks


def state_of(checks: list[Check]) -> str:
    states = {c.state for c in checks}
    for state in (UNKNOWN, CRITICAL, WARNING):
        if state in states:
            return state
    return OK


def summary(checks: list[Check]) -> str:
    """One line, as a Nagios plugin prints it: the state and the checks that are not OK."""
    state = state_of(checks)
    bad = [c for c in checks if c.state != OK]
    detail = "; ".join(f"{c.name}{f' {c.sink}' if c.sink else ''}: {c.message} ({c.state})" for c in bad)
    return f"XASINK {state}" + (f" - {detail}" if detail else "")


def to_dicts(checks: list[Check]) -> list[dict[str, Any]]:
    return [asdict(c) for c in checks]
