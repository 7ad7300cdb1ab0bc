"""Recovery: finish what a sink's decision log says, and roll back what can never commit.

A pass reads the log's pending batches first, then judges the prepared branches under the sink's row lock
(the same lock a decision takes, so a batch is never decided with a branch this pass rolled back: DESIGN
invariant 4) and rolls back those that can never commit, and only then finishes the decided batches from the
log alone (commit, then apply or mark), whatever crashed: an apply never waits on an orphan's locks.  A decided
batch is only finished forward; one that cannot be finished now is reported in ``unfinished``.
:func:`branch_action` is the one rule for a prepared branch, shared with
``xasink recover``'s dry run (:mod:`xasink.ops.survey`), so what is shown is what is done.

The pass runs through a :class:`~xasink.protocol.coordinator.Coordinator`: its connection pool, and the same commit
and roll-back steps (with their retries) as a live commit, so a finish by recovery behaves like one by the
driver.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from xasink.dialects.base import Dialect, PreparedTxn
from xasink.errors import ApplyError, CommitIncompleteError, ConnectError
from xasink.journal.log import BatchRecord, Journal
from xasink.journal.parts import decided_parts, mark_parts_done
from xasink.protocol.apply_step import apply_decided
from xasink.protocol.liveness import runs_alive
from xasink.protocol.xid import Xid
from xasink.write_modes.statements import ApplySpec

if TYPE_CHECKING:  # the coordinator imports this module: only its type is needed here
    from xasink.protocol.coordinator import Coordinator

log = logging.getLogger(__name__)


@dataclass
class RecoveryReport:
    """What a pass did; falsy when it did nothing."""

    committed: list[Xid] = field(default_factory=list)
    rolled_back: list[Xid] = field(default_factory=list)
    finished_batches: list[int] = field(default_factory=list)
    # decided batches this pass could not finish yet, and what blocked each (they stay decided: only forward)
    unfinished: dict[int, str] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.committed or self.rolled_back or self.finished_batches or self.unfinished)


COMMIT = "commit"  # listed in its batch's decision
ROLLBACK_UNDECIDED = "rollback"  # its batch was never decided
ROLLBACK_ORPHAN = "rollback-orphan"  # its batch was decided without it (a losing or stale attempt)
WAIT = "wait"  # undecided but young: a live batch may still decide it


def branch_action(
    xid: Xid, decision: BatchRecord | None, age_s: float | None, min_age_s: float = 0.0, alive: bool | None = None
) -> str:
    """What recovery does with one prepared branch of ours; the single rule both recovery and its dry run use.

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


def list_prepared(dialect: Dialect, journal: Journal, log_conn: Connection) -> list[PreparedTxn]:
    """The branches prepared in the target database, listed while ``log_conn`` holds the log's sink lock."""
    if journal.dialect is dialect:
        return dialect.list_prepared(log_conn)
    with dialect.connect() as conn:
        return dialect.list_prepared(conn)


def recover(c: Coordinator, upto: int | None = None, min_age_s: float = 0.0, run: str | None = None) -> RecoveryReport:
    """Finish decided batches and roll back undecided branches of this sink (batches <= ``upto``).

    Undecided branches younger than ``min_age_s`` are left alone (a live
    batch may still decide them); decided ones are always finished.  With
    ``run``, the caller is a writer of batch ``upto``: branches of that
    batch held by another run (one that took the batch over) are left to it.
    """
    report = RecoveryReport()
    with c.journal.dialect.connect(autocommit=True) as conn:  # reads only
        pending = [r for r in c.journal.pending(conn, c.sink_id) if upto is None or r.batch_id <= upto]
    # first roll back what can never commit (and commit what is decided and still prepared): an apply of a
    # decided batch must never wait on an orphan's locks that this very pass would release afterwards
    to_commit = _roll_back_doomed(c, report, upto, min_age_s, run)
    listed = {x for r in pending for x in r.xids}  # committed with their batch, next
    rest = [x for x in to_commit if x not in listed]
    if rest:
        report.committed += c._commit_branches(rest)
    try:
        _finish_pending(c, report, pending)
    finally:  # a decided branch found prepared here that its batch's finish did not reach is committed still
        done = set(report.committed)
        left = [x for x in to_commit if x in listed and x not in done and x.batch_id not in report.unfinished]
        if left:
            report.committed += c._commit_branches(left)
    return report


def _roll_back_doomed(
    c: Coordinator, report: RecoveryReport, upto: int | None, min_age_s: float, run: str | None
) -> list[Xid]:
    """Judge every prepared branch of the sink under its lock (:func:`branch_action`) and roll back those that
    can never commit; the decided ones found prepared are returned, to commit."""

    def of_sink(conn: Connection) -> list[PreparedTxn]:
        return [
            p
            for p in list_prepared(c.dialect, c.journal, conn)
            if c.journal.owns(p.xid, conn)
            and p.xid is not None
            and p.xid.sink_id == c.sink_id
            and (upto is None or p.xid.batch_id <= upto)
        ]

    # what every batch's plan pays: a look without the lock first (a branch prepared after it is out of
    # this pass's reach either way); the lock, to judge and finish, only when something of the sink is there
    with c.journal.dialect.connect(autocommit=True) as conn:
        if not of_sink(conn):
            return []
    to_commit: list[Xid] = []
    with c.journal.locked(c.sink_id) as conn:
        # it only reads under the lock (its roll-backs run on a connection of their own)
        c.journal.dialect.relaxed_commit(conn)
        mine = of_sink(conn)
        if not mine:  # nothing of this sink is prepared: nothing to date, judge or finish
            return []
        now = c.journal.dialect.server_now(conn)
        decided = c.journal.get_many(conn, c.sink_id, {p.xid.batch_id for p in mine if p.xid})
        holder = c.journal.holder(conn, c.sink_id, upto) if run is not None and upto is not None else None
        undated = {p.xid.batch_id for p in mine if p.xid and p.prepared_at is None} if min_age_s > 0 else set()
        claimed = c.journal.claimed_at(conn, c.sink_id, undated)
        undecided = {p.xid.batch_id for p in mine if p.xid and p.xid.batch_id not in decided}
        alive = runs_alive(c.journal.dialect, conn, c.journal.claim_states(conn, c.sink_id, undecided))
        doomed = []
        for p in mine:
            assert p.xid is not None
            if holder not in (None, run) and p.xid.batch_id == upto and p.xid.run == holder:
                continue  # a newer writer holds this batch now: its branches are its own to decide or abort
            when = p.prepared_at or claimed.get((p.xid.batch_id, p.xid.run))
            # the caller's own run is settling its batch; a run without a claim can have no live driver
            live = False if p.xid.run == run else alive.get((p.xid.batch_id, p.xid.run), False)
            action = branch_action(p.xid, decided.get(p.xid.batch_id), age_seconds(now, when), min_age_s, live)
            if action == COMMIT:
                to_commit.append(p.xid)
            elif action in (ROLLBACK_UNDECIDED, ROLLBACK_ORPHAN):
                doomed.append(p.xid)
        c._rollback(doomed)
        report.rolled_back += doomed
    return to_commit


def _finish_pending(c: Coordinator, report: RecoveryReport, pending: list[BatchRecord]) -> None:
    """Finish each decided batch (commit its listed branches, apply or mark it), oldest first.

    Only forward: a batch that cannot be finished now (a timeout, a lock, a read-only server...) stays
    decided and goes into ``report.unfinished`` with what blocked it; the others are still finished.  A batch
    withdrawn for its rows (:class:`ApplyError`) is never swallowed: the first is raised once the others ran.
    """
    withdrawn: list[ApplyError] = []
    committed = _commit_before_applies(c, report, pending)
    for record in pending:
        try:
            if _finish_parts(c, record, report):
                continue  # a multi-target batch: only this database's parts are finished here
            if c.journal.dialect is not c.dialect:
                continue  # a single table's batch of the log's own database: finished from there
            if record.batch_id not in committed:
                report.committed += c._commit_branches(record.xids)
            with c.journal.dialect.connect() as conn:
                decided, target = c.journal.target_of(conn, c.sink_id, record.batch_id)
                if not decided:  # withdrawn since this pass read it (its apply met wrong rows): nothing to finish
                    log.info("sink %s batch %s was withdrawn meanwhile by another run", c.sink_id, record.batch_id)
                    continue
                spec = ApplySpec.from_target(target)
                if spec is None:
                    c.journal.mark_committed(conn, c.sink_id, record.batch_id, None)
                current = c.journal.get(conn, c.sink_id, record.batch_id)  # decided again since this pass read it?
            if spec is not None and current is not None:
                deadline = time.monotonic() + c.options.commit_timeout
                apply_decided(c, record.batch_id, spec, current.xids, None, deadline)
        except ApplyError as exc:
            withdrawn.append(exc)
            continue
        except (CommitIncompleteError, ConnectError, sa.exc.DBAPIError) as exc:  # not about the rows: reported
            report.unfinished[record.batch_id] = c._describe(exc)
            log.warning(
                "recovery could not finish decided batch %s of sink %s yet (%s); it stays decided",
                record.batch_id,
                c.sink_id,
                report.unfinished[record.batch_id],
            )
            continue
        report.finished_batches.append(record.batch_id)
        log.info("recovery finished decided batch %s of sink %s", record.batch_id, c.sink_id)
    if withdrawn:
        raise withdrawn[0]


def _commit_before_applies(c: Coordinator, report: RecoveryReport, pending: list[BatchRecord]) -> set[int]:
    """Commit the branches of every decided write-mode batch before any apply runs: an apply of one batch must
    never wait on the shadow rows another decided batch still holds prepared (on MariaDB its reads can), and
    committing a decided branch is always right.  The batch ids whose branches were committed here."""
    if c.journal.dialect is not c.dialect or not pending:
        return set()
    done: set[int] = set()
    with c.journal.dialect.connect(autocommit=True) as conn:
        targets = {r.batch_id: c.journal.target_of(conn, c.sink_id, r.batch_id)[1] for r in pending}
    modes = {batch for batch, target in targets.items() if ApplySpec.from_target(target) is not None}
    for record in pending:
        if record.batch_id in modes:
            try:
                report.committed += c._commit_branches(record.xids)
            except (CommitIncompleteError, ConnectError, sa.exc.DBAPIError) as exc:  # its own turn reports it
                log.debug("sink %s batch %s: branches not committed yet (%s)", c.sink_id, record.batch_id, exc)
                continue
            done.add(record.batch_id)
    return done


def _finish_parts(c: Coordinator, record: BatchRecord, report: RecoveryReport) -> bool:
    """Finish this database's parts of a decided multi-target batch; False for a single-target batch.

    Each part's branches are committed through this database only when the part was written here
    (its server identity); the batch is marked committed once every part is, by whichever recovery marks
    the last part: marking and reading every part's mark run under the sink's lock.
    """
    with c.dialect.connect() as conn:
        here = c.dialect.server_identity(conn)
    with c.journal.dialect.connect() as conn:
        parts = decided_parts(conn, c.journal, c.sink_id, record.batch_id, record.xids)
    if not parts:
        return False
    mine = [p for p in parts if p.server == here and not p.committed]
    for part in mine:
        report.committed += c._commit_branches(part.xids)
    with c.journal.locked(c.sink_id) as conn:
        done = mark_parts_done(conn, c.journal, c.sink_id, record.batch_id, record.xids, mine)
    if done:
        with c.journal.dialect.connect() as conn:
            c.journal.mark_committed(conn, c.sink_id, record.batch_id, None)
            report.finished_batches.append(record.batch_id)
            log.info("recovery finished decided multi-target batch %s of sink %s", record.batch_id, c.sink_id)
    return True
