"""One judgement of prepared branches: ours or not, whose decision log, decided or orphan, live or dead.

A writer's sweep, a recovery pass (:mod:`xasink.protocol.recovery`) and the operator's survey (``xasink
recover``'s plan, ``xasink status``: :mod:`xasink.ops.survey`) read the same facts from the decision log and
apply the same rule (:func:`branch_action`), so what is shown is what is done.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy.engine import Connection

from xasink.dialects.values import PreparedTxn
from xasink.journal.log import Journal
from xasink.journal.records import BatchRecord
from xasink.protocol.liveness import runs_alive
from xasink.protocol.xid import Xid

COMMIT = "commit"  # listed in its batch's decision
ROLLBACK_UNDECIDED = "rollback"  # its batch was never decided
ROLLBACK_ORPHAN = "rollback-orphan"  # its batch was decided without it (a losing or stale attempt)
WAIT = "wait"  # undecided but young, or its run alive: a live batch may still decide it
IGNORE_FOREIGN = "ignore"  # not ours: never touched
IGNORE_UNKNOWN_SINK = "ignore-unknown-sink"  # ours, but its sink is not in this decision log
IGNORE_OTHER_LOG = "ignore-other-log"  # an xasink branch of another decision log (its log id differs)


@dataclass(frozen=True)
class Verdict:
    """A prepared transaction, how old it is, and what becomes of it."""

    txn: PreparedTxn
    age_s: float | None
    state: str  # decided / undecided / orphan / foreign / unknown-sink / other-log
    action: str  # one of the names above


def branch_action(
    xid: Xid, decision: BatchRecord | None, age_s: float | None, min_age_s: float = 0.0, alive: bool | None = None
) -> str:
    """What becomes of one prepared branch of ours.

    An undecided branch is rolled back only when its run is dead (``alive`` False), at once; a live run's
    branches wait whatever their age.  Only a run whose liveness is unknown (it kept no guard) is judged by
    age against ``min_age_s``.
    """
    if decision is not None:
        return COMMIT if xid in decision.xids else ROLLBACK_ORPHAN
    if alive:
        return WAIT
    if alive is None and min_age_s > 0 and age_s is not None and age_s < min_age_s:
        return WAIT
    return ROLLBACK_UNDECIDED


def age_seconds(now: object, then: object) -> float | None:
    """Seconds since ``then``; None when the server does not say when a branch was prepared (MySQL)."""
    if then is None:
        return None
    try:
        return max(0.0, float((now - then).total_seconds()))  # type: ignore[operator]
    except TypeError:
        return None


def of_log(p: PreparedTxn, log_id: str | None, sink_id: str | None = None, upto: int | None = None) -> bool:
    """A branch of this decision log (of one sink, up to one batch, when given)."""
    x = p.xid
    return (
        x is not None
        and x.log_id == log_id
        and (sink_id is None or x.sink_id == sink_id)
        and (upto is None or x.batch_id <= upto)
    )


def _sink(p: PreparedTxn) -> str | None:
    return p.xid.sink_id if p.xid is not None else None


def judge(
    journal: Journal,
    conn: Connection,
    prepared: list[PreparedTxn],
    now: Any,
    log_id: str | None,
    *,
    sinks: set[str] | None = None,
    sink_id: str | None = None,
    upto: int | None = None,
    min_age_s: float = 0.0,
    run: str | None = None,
    holder: str | None = None,
    date_undated: bool = True,
) -> list[Verdict]:
    """Judge each prepared transaction against the decision log read on ``conn``.

    Foreign transactions and another log's branches are judged too (never touched); ours outside ``sink_id``
    / ``upto`` are left out.  ``sinks``: the sinks registered in the log, when a branch of an unknown sink is
    to be left alone.  ``run``: the caller is that writer run of batch ``upto``, settling it (its own branches
    are not alive to it), and ``holder`` the run holding that batch now: a newer writer's branches of it wait.
    ``date_undated`` False: a branch the server does not date (MySQL) is not dated by its claim either (only
    an age threshold needs it).
    """
    of_this_log = [p for p in prepared if of_log(p, log_id, sink_id, upto)]
    ours = [p for p in of_this_log if sinks is None or _sink(p) in sinks]
    decisions: dict[tuple[str, int], BatchRecord] = {}
    claimed: dict[tuple[str, int, str], Any] = {}  # when each run claimed its batch: ages XA RECOVER does not give
    alive: dict[tuple[str, int, str], bool | None] = {}  # whether each run's driver still holds its guard
    by_sink: dict[str, set[int]] = {}
    for p in of_this_log:  # an unregistered sink's branches too: they are left alone, but dated like the rest
        assert p.xid is not None
        by_sink.setdefault(p.xid.sink_id, set()).add(p.xid.batch_id)
    for sink, batches in by_sink.items():
        for b, rec in journal.get_many(conn, sink, batches).items():
            decisions[(sink, b)] = rec
        undated = {p.xid.batch_id for p in of_this_log if p.xid and p.xid.sink_id == sink and p.prepared_at is None}
        if not date_undated:
            undated = set()
        for (b, r), at in journal.claimed_at(conn, sink, undated).items():
            claimed[(sink, b, r)] = at
        undecided = {b for b in batches if (sink, b) not in decisions}
        for (b, r), live in runs_alive(journal.dialect, conn, journal.claim_states(conn, sink, undecided)).items():
            alive[(sink, b, r)] = live
    verdicts = []
    for p in prepared:
        x = p.xid
        when = p.prepared_at or (claimed.get((x.sink_id, x.batch_id, x.run)) if x is not None else None)
        age = age_seconds(now, when)
        if x is None:
            verdicts.append(Verdict(p, age, "foreign", IGNORE_FOREIGN))
        elif (sink_id is not None and x.sink_id != sink_id) or (upto is not None and x.batch_id > upto):
            continue
        elif x.log_id != log_id:  # no log here (None): every xasink branch is another log's
            verdicts.append(Verdict(p, age, "other-log", IGNORE_OTHER_LOG))
        elif p not in ours:
            verdicts.append(Verdict(p, age, "unknown-sink", IGNORE_UNKNOWN_SINK))
        elif holder not in (None, run) and x.batch_id == upto and x.run == holder:
            # a newer writer holds this batch now: its branches are its own to decide or abort
            verdicts.append(Verdict(p, age, "undecided", WAIT))
        else:
            decision = decisions.get((x.sink_id, x.batch_id))
            live = False if x.run == run else alive.get((x.sink_id, x.batch_id, x.run), False)
            action = branch_action(x, decision, age, min_age_s, live)
            state = "undecided" if decision is None else ("decided" if action == COMMIT else "orphan")
            verdicts.append(Verdict(p, age, state, action))
    return verdicts
