"""Executor side: one XA branch per partition attempt.

A task checks the decision log (a replayed batch writes nothing), clears
branches that can never commit and would hold locks against it, then loads
its rows inside a fresh branch, PREPAREs it, disconnects, and reports the
xid.  Nothing is ever retried inside a branch: Spark may retry the task,
and the new attempt is a new branch.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import pyarrow as pa
import sqlalchemy as sa

from xasink.dialects import shared_dialect
from xasink.dialects.base import BranchSession, Dialect
from xasink.dialects.values import ErrorKind, TargetPlan, check_required
from xasink.errors import (
    BatchAbortedError,
    BatchIdentityError,
    ConcurrentWriterError,
    ForgottenBatchError,
    LateBranchError,
    XasinkError,
)
from xasink.journal.log import Journal
from xasink.journal.targets import forgotten_message, identity_message, same_target, taken_over_message, target_identity
from xasink.options import WriteOptions
from xasink.protocol.liveness import runs_alive
from xasink.protocol.prepare_lock import task_locks
from xasink.protocol.retry import again_if_deadlocked
from xasink.protocol.xid import Xid, attempt_token
from xasink.results import BranchOutcome
from xasink.support.faults import fault
from xasink.support.masking import redact, url_secrets
from xasink.support.phases import phase, worker_started
from xasink.write_modes.conform import conform

log = logging.getLogger(__name__)


def _non_empty(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    return (b for b in batches if b.num_rows)


@dataclass(frozen=True)
class Clearance:
    """What a task attempt found under the sink lock before writing."""

    decided: bool = False  # the batch is decided already: a replay writes nothing
    sibling: Xid | None = None  # this partition is already prepared by another attempt of this run: report that


def clear_blockers(
    dialect: Dialect,
    journal: Journal,
    me: Xid,
    guard: str | None = None,
    target: tuple[str | None, str, str | None] | None = None,
) -> Clearance:
    """Under the sink lock: is the batch already decided; else claim it and clear what can never commit.

    ``target`` (schema, table, streaming query id) is what this batch writes: a batch the log holds for
    another target is refused (:class:`BatchIdentityError`), as is one the log can no longer tell about
    (:class:`ForgottenBatchError`), before anything is written.

    The first task of a run takes the batch over from earlier runs (a crashed
    driver, a concurrent writer of the same sinkId); a task of a run that was
    taken over fails.  Then branches of this batch from other runs are rolled
    back: left prepared they would hold row locks this attempt may need.

    A branch of another attempt of this very run is never rolled back here: it may be a live sibling
    (a speculative copy, or the original a speculative copy races) that Spark reports.  If one has already
    prepared this partition, this attempt adopts it (reports its xid and writes nothing): it holds exactly
    this partition's rows, whichever attempt Spark reports, and a retry after a failure past PREPARE does
    not wait on its locks.
    """
    with journal.locked_sink(me.sink_id) as (conn, horizon):
        decided, recorded, superseded = journal.claim_view(conn, me.sink_id, me.batch_id, me.run)
        if decided:
            if target is not None:
                mine = target_identity(conn, *target)
                if not same_target(recorded, mine):
                    raise BatchIdentityError(identity_message(me.sink_id, me.batch_id, recorded, mine))
            return Clearance(decided=True)
        if horizon is not None and me.batch_id <= horizon:
            raise ForgottenBatchError(forgotten_message(me.sink_id, me.batch_id, horizon, journal.sinks.fullname))
        if superseded:
            raise ConcurrentWriterError(taken_over_message(me.sink_id, me.batch_id, me.run))
        if superseded is None:  # the run's first task: it takes the batch over (a durable write)
            journal.take_over(conn, me.sink_id, me.batch_id, me.run, guard)
        else:  # the run's claim is there already: this transaction only reads under the lock
            journal.dialect.relaxed_commit(conn)
        ours = [
            p.xid
            for p in dialect.list_prepared(conn)
            if p.xid is not None
            and p.xid.log_id == me.log_id
            and p.xid.sink_id == me.sink_id
            and p.xid.batch_id == me.batch_id
        ]
        stale = [x for x in ours if x.run != me.run]
        siblings = sorted((x for x in ours if x.run == me.run and x.partition == me.partition), key=_attempt_order)
        if stale:
            with dialect.connect(autocommit=True) as xa:
                dialect.before_finishing(stale)
                for xid in stale:
                    log.info("rolling back stale branch %s before writing %s", xid, me)
                    try:
                        dialect.rollback_prepared(xa, xid)
                    except Exception as exc:  # noqa: BLE001 - gone already is fine
                        log.info("stale branch %s: %s", xid, exc)
    return Clearance(sibling=siblings[0] if siblings else None)


def _attempt_order(xid: Xid) -> tuple[int, str]:
    return (xid.task_attempt_id, xid.attempt)


def settle_prepared(dialect: Dialect, journal: Journal, me: Xid) -> None:
    """After PREPARE, under the sink lock the decision takes: roll the branch back if it can never commit.

    A slow, speculative or zombie attempt may prepare after the driver decided the batch without it, or
    after its run aborted (or lost the batch to a newer writer, or its driver died).  The commit's sweep
    and the abort's settle window run before such a branch is prepared, so nothing else would roll it back
    until the next sweep, and it would hold its locks until then.  Under the lock, either the decision is
    already in the log (then it lists this branch or never will) or it comes later and sees this branch
    prepared (then the commit's sweep, which follows the decision, rolls it back if it is not listed).
    Raises :class:`LateBranchError` after rolling back; a branch the decision lists is kept.
    """
    reason = None
    with journal.locked(me.sink_id) as conn:
        journal.dialect.relaxed_commit(conn)  # it only reads (a roll-back runs on a connection of its own)
        # no identity row: the log was made anew, and holds neither a decision nor a claim of this batch
        decision, claim = journal.settle_view(conn, me.sink_id, me.batch_id, me.run) or (None, None)
        if decision is not None:
            if me in decision.xids:
                return
            reason = "was decided without it (another attempt of this partition was reported)"
        else:
            mine = {(me.batch_id, me.run): claim} if claim is not None else {}
            if mine and runs_alive(journal.dialect, conn, mine).get((me.batch_id, me.run)) is False:
                reason = (
                    "can never be decided by this run (it aborted, lost the batch to a newer writer, "
                    "or its driver is gone)"
                )
        if reason is None:
            return
        with dialect.connect(autocommit=True) as xa:
            try:
                dialect.rollback_prepared(xa, me)
            except sa.exc.DBAPIError as exc:
                if dialect.classify(exc) != ErrorKind.UNKNOWN_XID:
                    raise
                log.info("late branch %s was rolled back already (by a sweep)", me)
    log.warning("branch %s prepared late: sink %s batch %s %s; rolled it back", me, me.sink_id, me.batch_id, reason)
    raise LateBranchError(
        f"partition {me.partition} of sink {me.sink_id} batch {me.batch_id} prepared after the batch {reason}; "
        "this attempt's branch was rolled back and none of its rows will be visible"
    )


def prepare_under_lock(
    options: WriteOptions,
    dialect: Dialect,
    session: BranchSession,
    journal: Journal,
    xid: Xid,
    ids: dict[str, object],
    attempt: int,
) -> None:
    """PREPARE under the run's prepare lock, once the run's claim says it has not ended (xasink.protocol.prepare_lock):
    an abort then knows when its sweep has seen every branch the run will prepare, without a fixed window."""
    preparing = False
    try:
        session.hold_prepare_lock(task_locks(dialect, xid))
        if journal.run_superseded(xid.sink_id, xid.batch_id, xid.run):
            raise LateBranchError(
                f"partition {xid.partition} of sink {xid.sink_id} batch {xid.batch_id} reached PREPARE after its "
                "run ended: the batch can never be decided by this run (it aborted, or a newer writer took the "
                "batch over); this attempt's branch was rolled back unprepared and none of its rows will be visible"
            )
        fault("task.prepare_locked", partition=xid.partition, attempt=attempt, batch=xid.batch_id)
        preparing = True
        with phase("task.prepare", **ids):
            session.prepare()
    except BaseException as exc:
        if preparing:  # the PREPARE's own error, as without the check
            raise
        session.rollback()
        if isinstance(exc, XasinkError) or not isinstance(exc, Exception):
            raise
        raise log_step_failed(options, xid, "checking the batch's claim before PREPARE", exc) from exc


def log_step_failed(options: WriteOptions, xid: Xid, step: str, exc: Exception) -> BatchAbortedError:
    """A task's step in the decision log failed (above all: another session held the sink row past
    controlLockTimeout): the batch cannot be decided.  The task must not roll its branch back itself (a
    speculative sibling may adopt and report it); the driver's abort after the failed job does, without the
    sink lock (:meth:`xasink.protocol.coordinator.Coordinator.abort`, ``undecided``)."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    why = redact(f"{type(exc).__name__}: {text}"[:300], url_secrets(options.url))
    return BatchAbortedError(
        f"sink {xid.sink_id} batch {xid.batch_id} partition {xid.partition}: {step} in the decision log failed "
        f"({why}), so the batch cannot be decided: the driver's abort rolls back this run's branches, and nothing "
        f"of the batch is visible. Run it again with the same sinkId ('{xid.sink_id}') and batchId"
    )


_JOURNALS: dict[tuple[int, str | None, str], Journal] = {}


def _shared_journal(dialect: Dialect, options: WriteOptions) -> Journal:
    """The decision log of a shared dialect, kept with it (it remembers the sinks it has registered)."""
    key = (id(dialect), options.journal_schema, options.journal_prefix)
    journal = _JOURNALS.get(key)
    if journal is None:
        journal = _JOURNALS[key] = Journal(dialect, options.journal_schema, options.journal_prefix)
    return journal


def _discard(opening: Future[BranchSession]) -> None:
    """Roll back and close a branch opened in vain (or never opened: its error is moot then)."""
    try:
        opening.result().rollback()
    except Exception as exc:  # noqa: BLE001 - nothing was written in it
        log.debug("discarded branch: %s", exc)


def _conformed(batches: Iterable[pa.RecordBatch], plan: TargetPlan, xid: Xid) -> Iterator[pa.RecordBatch]:
    for b in batches:
        out = conform(b, plan, xid.partition, xid.batch_id, xid.bqual)
        if plan.required:
            check_required(out, plan, xid.partition)
        yield out


def _timed_open(dialect: Dialect, xid: Xid, plan: TargetPlan, ids: dict[str, object]) -> BranchSession:
    with phase("task.open", **ids):
        return dialect.open_branch(xid, plan)


def _claim_and_open(
    options: WriteOptions,
    dialect: Dialect,
    journal: Journal,
    xid: Xid,
    plan: TargetPlan,
    ids: dict[str, object],
    guard: str | None,
    query: str | None,
    attempt_number: int,
) -> BranchSession | Clearance:
    """Claim the batch for this task's run, connecting the branch meanwhile; the open branch, or the
    clearance that says this attempt writes nothing (a replay, or a sibling's prepared branch to adopt)."""
    # connecting the branch (ADBC reads the server's type catalogue) overlaps the decision-log check;
    # the branch touches no row until clear_blockers has returned
    with ThreadPoolExecutor(1, thread_name_prefix="xasink-open") as pool:
        opening = pool.submit(_timed_open, dialect, xid, plan, ids)
        try:
            with phase("task.claim", **ids):
                target = (options.table.schema, options.table.name, query)
                clearance = again_if_deadlocked(
                    dialect, f"claiming {xid}", lambda: clear_blockers(dialect, journal, xid, guard, target)
                )
        except BaseException as exc:
            _discard(opening)
            if isinstance(exc, XasinkError) or not isinstance(exc, Exception):
                raise
            raise log_step_failed(options, xid, "claiming the batch", exc) from exc
        if clearance.decided:
            _discard(opening)
            log.info(
                "sink %s batch %s is already decided: partition %s writes nothing",
                xid.sink_id,
                xid.batch_id,
                xid.partition,
            )
            return clearance
        if clearance.sibling is not None:
            _discard(opening)
            log.info(
                "partition %s is already prepared by %s: attempt %s adopts it", xid.partition, clearance.sibling, xid
            )
            # this attempt holds a prepared branch now, as if it had prepared it: the same fault point
            fault("task.after_prepare", partition=xid.partition, attempt=attempt_number, batch=xid.batch_id)
            return clearance
        with phase("task.open_wait", **ids):
            return opening.result()


def write_partition(
    options: WriteOptions,
    plan: TargetPlan,
    *,
    batch_id: int,
    partition: int,
    task_attempt_id: int,
    run: str,
    batches: Iterable[pa.RecordBatch],
    attempt_number: int = 0,
    log_id: str | None = None,
    guard: str | None = None,
    query: str | None = None,
    journal_url: sa.engine.URL | None = None,
    claimed: bool = False,
    check_slot: bool = False,
) -> BranchOutcome:
    """Write one partition as one prepared branch and report it.

    ``log_id`` is the decision log's identity as the driver read it when it planned the write (else it is
    read here, once per worker process); the branch's xid carries it, so only that log ever finishes it.
    ``journal_url`` names the decision log of a multi-target transaction (xasink.transaction), which
    claimed the batch and cleared stale branches before this write began: the task only prepares, and
    checks under that log's lock that it did not prepare too late.
    ``guard`` names the session lock the run's driver holds (xasink.protocol.liveness): sweeps leave the run's
    branches alone while it is held.  ``query`` is the streaming query's id, recorded with the batch.
    ``claimed``: the driver took the batch over for ``run`` and rolled back other runs' branches of it
    before the tasks started (:meth:`Coordinator.claim`), so a first attempt goes straight to its rows; a
    retry still claims, to find a sibling attempt's prepared branch before it would wait on its locks.
    ``check_slot``: the driver could not count the write's branches, so the open branch makes sure the server
    can prepare it (:meth:`BranchSession.reserve_slot`) before it loads a row.
    """
    start = time.perf_counter()
    ids = {"sink": options.sink_id, "batch": batch_id, "partition": partition}
    worker_started("task", **ids)
    rest = _non_empty(batches)
    first = next(rest, None)
    if first is None:
        return BranchOutcome(partition, None, query=query, run=run)
    dialect = shared_dialect(options.url, options.branch_settings)  # kept for the worker's next task
    dialect.enable_spare()  # the next task's branch connection is made while this one finishes
    tx = journal_url is not None
    log_dialect = shared_dialect(journal_url, options.branch_settings) if journal_url is not None else dialect
    journal = _shared_journal(log_dialect, options)
    xid = Xid(log_id or journal.log_id(), options.sink_id, batch_id, partition, attempt_token(task_attempt_id, run))
    if tx or (claimed and attempt_number == 0):  # claimed before the tasks started: nothing to check first
        with phase("task.open_wait", **ids):
            session = _timed_open(dialect, xid, plan, ids)
    else:
        claimed_here = _claim_and_open(options, dialect, journal, xid, plan, ids, guard, query, attempt_number)
        if isinstance(claimed_here, Clearance):  # a replay, or a sibling's branch adopted: drain, write nothing
            rows = first.num_rows + sum(b.num_rows for b in rest)  # so Spark sees the partition consumed
            if claimed_here.decided:
                return BranchOutcome(partition, None, skipped=True, query=query, run=run)
            assert claimed_here.sibling is not None
            return BranchOutcome(
                partition, claimed_here.sibling.gid, rows, seconds=time.perf_counter() - start, query=query, run=run
            )
        session = claimed_here
    try:
        if check_slot:
            session.reserve_slot()
        fault("task.before_load", partition=partition, attempt=attempt_number, batch=batch_id)
        with phase("task.load", **ids):
            rows = session.load(_conformed(itertools.chain([first], rest), plan, xid))
        fault("task.before_prepare", partition=partition, attempt=attempt_number, batch=batch_id)
    except BaseException:
        session.rollback()
        raise
    prepare_under_lock(options, dialect, session, journal, xid, ids, attempt_number)
    fault("task.before_settle", partition=partition, attempt=attempt_number, batch=batch_id)
    with phase("task.settle", **ids):
        try:
            settle_prepared(dialect, journal, xid)  # prepared too late for its batch: rolled back, LateBranchError
        except XasinkError:
            raise
        except Exception as exc:  # the branch stays prepared: the driver's abort rolls it back
            raise log_step_failed(options, xid, "checking the prepared branch", exc) from exc
    seconds = time.perf_counter() - start
    log.info("prepared branch %s: %d rows in %.3fs", xid, rows, seconds)
    fault("task.after_prepare", partition=partition, attempt=attempt_number, batch=batch_id)
    return BranchOutcome(partition, xid.gid, rows, seconds=seconds, query=query, run=run)
