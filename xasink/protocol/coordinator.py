"""Driver side: decide, commit, sweep and abort a sink's batches.

Recovery's pass (:mod:`xasink.protocol.recovery`) and a write mode's apply step (:mod:`xasink.protocol.apply_step`)
run through a coordinator too, for its pool and its retried commit and roll-back steps; they live in modules of
their own.

The decision (a journal row listing the exact xids) is written under the
sink's row lock after checking every listed branch is still prepared; every
roll-back of an undecided branch happens under the same lock.  So a batch is
either decided with all its branches intact, or its branches are rolled back
and it can never be decided (DESIGN invariant 4).
"""

from __future__ import annotations

import json
import logging
import random
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from sqlalchemy.engine import Connection

from xasink.dialects import dialect_for, shared_dialect
from xasink.dialects.base import Dialect, ErrorKind
from xasink.errors import (
    BatchAbortedError,
    BatchIdentityError,
    CommitIncompleteError,
    ConcurrentWriterError,
    ConnectError,
    DecisionUnknownError,
    ForgottenBatchError,
    ReplayIncompleteError,
)
from xasink.journal.log import BatchRecord, Journal
from xasink.journal.targets import forgotten_message, identity_message, same_target, taken_over_message, target_identity
from xasink.options import WriteOptions
from xasink.protocol import branch_group as group_ops
from xasink.protocol import recovery
from xasink.protocol.apply_step import apply_decided
from xasink.protocol.recovery import (  # noqa: F401 - re-exported: callers name them from here
    COMMIT,
    ROLLBACK_ORPHAN,
    ROLLBACK_UNDECIDED,
    WAIT,
    RecoveryReport,
    age_seconds,
    branch_action,
    list_prepared,
)
from xasink.protocol.xid import Xid, new_run_nonce
from xasink.results import BranchOutcome, WriteResult
from xasink.support.faults import fault
from xasink.support.masking import redact, url_secrets
from xasink.support.phases import phase
from xasink.write_modes.statements import ApplySpec

log = logging.getLogger(__name__)

T = TypeVar("T")
# (shared dialect, journal schema, prefix) -> the sinks registered in that log by this process
_SHARED_SINKS: dict[tuple[int, str | None, str], set[str]] = {}
BACKOFF_FIRST_S = 0.1  # the first retry's delay after the decision; doubled per retry ...
BACKOFF_CAP_S = 5.0  # ... up to this: an outage of minutes is noticed within seconds of its end
TRIM_EVERY = 16  # compact the decision log after about one committed batch in this many


@dataclass(frozen=True)
class _Refusal:
    """Why :meth:`Coordinator._decide` did not decide: a replay to finish, or what to abort the batch with.

    All empty: a task saw a decision the log no longer holds."""

    replay: BatchRecord | None = None  # decided already, for this very target
    error: Exception | None = None  # BatchIdentityError / ForgottenBatchError
    strangers: list[Xid] = field(default_factory=list)  # branches of another decision log
    log_id: str | None = None  # this log's identity (with strangers)


class Coordinator:
    """One sink's coordinator; cheap to create, holds no state between calls but a connection pool."""

    def __init__(
        self,
        options: WriteOptions,
        dialect: Dialect | None = None,
        journal: Journal | None = None,
        shared: bool = False,
    ) -> None:
        """``journal`` is the decision log when it lives in another database than the branches (a
        multi-target transaction's log); by default the log is in the target database.  ``shared``: use
        this process's long-lived dialect for the URL (Spark's reused Python workers), whose pooled
        connections outlive the coordinator; else a dialect of its own, disposed by :meth:`close`."""
        self.options = options
        self.sink_id = options.sink_id
        # check_server reads the branch settings; the pool serves the commit's parallel COMMITs and its journal steps
        pool = options.commit_parallelism + 2
        self._owns_dialect = dialect is None and not shared
        self._leftovers = True  # the last decision saw branches of this sink besides its own: sweep after it
        if dialect is None:
            make = shared_dialect if shared else dialect_for
            dialect = make(options.url, options.branch_settings, pool)
        self.dialect = dialect
        if journal is None:
            known = None
            if shared:  # sinks registered by earlier coordinators of this process's dialect
                known = _SHARED_SINKS.setdefault((id(dialect), options.journal_schema, options.journal_prefix), set())
            journal = Journal(self.dialect, options.journal_schema, options.journal_prefix, known)
        self.journal = journal

    def close(self) -> None:
        if self._owns_dialect:
            self.dialect.dispose()

    # -- set-up -------------------------------------------------------------------
    def preflight(self, branches: int | None = None) -> None:
        """Check the server can hold the branches, and create the journal tables on first use."""
        with self.dialect.connect(autocommit=True) as conn:  # reads only: no BEGIN and ROLLBACK round trips
            self.dialect.check_server(conn, branches)
        self.journal.ensure()

    # -- commit ---------------------------------------------------------------------
    def target(self, conn: Connection, query: str | None = None) -> str:
        """What this sink's batches write (the identity the decision log records with each batch)."""
        return target_identity(conn, self.options.table.schema, self.options.table.name, query)

    def check_batch(self, batch_id: int, query: str | None = None) -> bool:
        """Before a batch writes: True when it is a replay of a committed batch (same target), False when it
        is new.  Raises :class:`BatchIdentityError` when the log holds it for another target, and
        :class:`ForgottenBatchError` when the log can no longer tell (an old log's trim)."""
        with self.dialect.connect(autocommit=True) as conn:  # reads only
            decided, recorded, horizon = self.journal.batch_view(conn, self.sink_id, batch_id)
            mine = self.target(conn, query)
        if decided:
            if not same_target(recorded, mine):
                raise BatchIdentityError(identity_message(self.sink_id, batch_id, recorded, mine))
            return True
        if horizon is not None and batch_id <= horizon:
            raise ForgottenBatchError(forgotten_message(self.sink_id, batch_id, horizon, self.journal.sinks.fullname))
        return False

    def claim(self, batch_id: int, run: str, guard: str | None = None) -> bool:
        """Before a batch's tasks start: make ``run`` the holder of (sink, batch), as its first task would.

        Under the sink lock, in one durable transaction: False when the batch is decided already (a replay:
        the tasks find that out and write nothing); else every other run of the batch is superseded (their
        branches are dead to :meth:`recover` from then on) and True.  Raises :class:`ConcurrentWriterError`
        when ``run`` itself was taken over.  The tasks' first attempts can then skip their own claim.
        """
        with self.journal.locked(self.sink_id) as conn:
            decided, _, superseded = self.journal.claim_view(conn, self.sink_id, batch_id, run)
            if decided:
                return False
            if superseded is None:
                self.journal.take_over(conn, self.sink_id, batch_id, run, guard)
            elif superseded:
                raise ConcurrentWriterError(taken_over_message(self.sink_id, batch_id, run))
        return True

    def commit(
        self,
        batch_id: int,
        outcomes: Sequence[BranchOutcome | None],
        query: str | None = None,
        apply: ApplySpec | None = None,
        run: str | None = None,
    ) -> WriteResult:
        """Decide and commit a batch whose tasks all reported; finish it instead if it was decided before.

        ``run`` is the writer run deciding (else the run its tasks report): it decides only while it holds
        the batch's claim, whatever its branches (none at all, when every partition was empty).
        ``query`` is the streaming query's id (else the tasks' reports name it): recorded with the target.
        ``apply``: the branches loaded a shadow table (overwrite, replaceWhere, change-data apply); once they
        are committed, one local transaction replaces the target's rows from it and marks the batch.
        """
        t0 = time.perf_counter()
        if any(o is None for o in outcomes):
            self.abort(batch_id, outcomes)
            raise BatchAbortedError(f"sink {self.sink_id} batch {batch_id}: a task did not report; batch rolled back")
        done = [o for o in outcomes if o is not None]
        query = query or next((o.query for o in done if o.query), None)
        prepare_s = max((o.seconds for o in done), default=0.0)
        ids = {"sink": self.sink_id, "batch": batch_id}
        xids = [o.xid for o in done if o.xid is not None]
        run = run or next((o.run for o in done if o.run), None) or next((x.run for x in xids), None)
        rows = sum(o.rows for o in done if o.gid)
        skipped = any(o.skipped for o in done)
        if not skipped:  # (a replay's tasks all skip: the point is reached by batches about to be decided)
            fault("driver.before_decide", batch=batch_id)
        t_decide = time.perf_counter()
        record = BatchRecord(
            self.sink_id, batch_id, "committing", tuple(sorted(xids)), rows, len(xids), int(prepare_s * 1000)
        )
        # one transaction under the sink lock checks the batch (a replay, another target's batch, a batch the
        # log forgot, branches of another log, tasks that saw a decision) and records the decision
        with phase("commit.decide", **ids):
            verdict = self._decide(record, query, apply, checks=True, skipped=skipped, run=run)
        if verdict is not None:
            return self._refused(verdict, record, outcomes, t0)
        # after the decision, only forward: commit and mark through transient errors until commitTimeout
        fault("driver.after_decide", batch=batch_id)
        t_commit = time.perf_counter()
        deadline = time.monotonic() + self.options.commit_timeout
        with phase("commit.commit_prepared", **ids):
            self._commit_branches(record.xids, first_commit_fault=True, deadline=deadline)
        fault("driver.after_commits", batch=batch_id)
        commit_ms = int((time.perf_counter() - t_commit) * 1000)
        if apply is not None:
            with phase("commit.apply", **ids):
                apply_decided(self, batch_id, apply, record.xids, commit_ms, deadline)
        else:
            with phase("commit.mark", **ids):
                self._mark(batch_id, commit_ms, deadline)
        fault("driver.after_mark", batch=batch_id)
        t_sweep = time.perf_counter()
        self._after_commit(batch_id, sweep=self._leftovers)
        t_end = time.perf_counter()
        result = WriteResult(
            self.sink_id,
            batch_id,
            rows,
            len(xids),
            False,
            {
                "prepare": prepare_s,
                "decide": t_commit - t_decide,
                "commit": t_sweep - t_commit,
                "sweep": t_end - t_sweep,
                "total": t_end - t0,
            },
        )
        log.info("%s", result)
        return result

    def _refused(
        self, verdict: _Refusal, record: BatchRecord, outcomes: Sequence[BranchOutcome | None], t0: float
    ) -> WriteResult:
        """What the decision's checks found instead of deciding: a replay is finished, the rest aborted."""
        batch_id = record.batch_id
        if verdict.replay is not None:
            return self._replayed(verdict.replay, t0)
        if verdict.error is not None:  # another target's batch, or one the log forgot: nothing may commit
            self.abort(batch_id, outcomes)
            raise verdict.error
        if verdict.strangers:  # the log was dropped and made anew while the batch ran: its branches name the old one
            self._rollback(verdict.strangers)
            self.abort(batch_id, outcomes)
            raise BatchAbortedError(
                f"sink {self.sink_id} batch {batch_id}: branches carry decision log id "
                f"{verdict.strangers[0].log_id}, but the log {self.journal.batches.fullname} is now "
                f"{verdict.log_id} (recreated while the batch ran); batch rolled back, run it again"
            )
        # a task saw a decision that is gone now: journal trimmed or tampered
        self.abort(batch_id, outcomes)
        raise BatchAbortedError(
            f"sink {self.sink_id} batch {batch_id}: tasks saw a decision the journal no "
            "longer holds; batch rolled back, run it again"
        )

    def _replayed(self, existing: BatchRecord, t0: float) -> WriteResult:
        """Finish another run's decision of this batch and say what became of it.

        "skipped" only once the log shows the batch committed: a decision withdrawn meanwhile (its rows were
        refused by the table) means nothing of the batch is visible, and one not finished yet is reported so.
        """
        log.info(
            "sink %s batch %s was already decided: finishing it, writing nothing new", self.sink_id, existing.batch_id
        )
        batch = existing.batch_id
        fault("driver.before_replay_finish", batch=batch)
        try:
            report = self.recover(upto=batch)
        except ReplayIncompleteError:
            raise
        except CommitIncompleteError as exc:  # finishing another decided batch of the pass failed first
            raise ReplayIncompleteError(self._replay_incomplete(batch, self._describe(exc))) from exc
        if batch in report.unfinished:  # "skipped" would say its rows are there: they are not yet
            raise ReplayIncompleteError(self._replay_incomplete(batch, report.unfinished[batch]))
        with self.journal.dialect.connect(autocommit=True) as conn:
            now = self.journal.get(conn, self.sink_id, batch)
        if now is None:  # withdrawn: the deciding run's rows broke a constraint of the table (ApplyError)
            raise BatchAbortedError(
                f"sink {self.sink_id} batch {batch} was decided by another run, whose decision was then "
                "withdrawn (its rows were refused by the table); nothing of the batch is visible and nothing of "
                "this run was written: run it again"
            )
        if not now.committed:  # withdrawn and decided anew by a newer run, not finished yet
            raise ReplayIncompleteError(self._replay_incomplete(batch, "decided again by a newer run meanwhile"))
        return WriteResult(self.sink_id, batch, now.rows, now.branches, True, {"total": time.perf_counter() - t0})

    def _replay_incomplete(self, batch_id: int, why: str) -> str:
        return (
            f"sink {self.sink_id} batch {batch_id} was decided by another run (this run's rows are not part of "
            f"it), and finishing that decision failed ({why}); it stays decided: the next run of this sink or "
            "'xasink recover' finishes it; no row is lost or doubled"
        )

    def _decide(
        self,
        record: BatchRecord,
        query: str | None = None,
        apply: ApplySpec | None = None,
        checks: bool = False,
        skipped: bool = False,
        run: str | None = None,
    ) -> _Refusal | None:
        """Record the decision under the sink lock, after checking every listed branch is still prepared.

        The decision is recorded (by :meth:`Journal.record_decision`, the one place that does) only if no
        decision exists, ``run`` (default: the run of the listed branches) holds the batch's claim, every
        listed branch is that run's and is still prepared; else the listed branches are rolled back and
        :class:`ConcurrentWriterError` raised.  With ``checks`` (the commit), the same transaction first
        checks what :meth:`check_batch` checks before a write (a decided batch is a replay of the same
        target, or refused for another; an undecided one at or below an old log's horizon is refused), that
        the branches carry this log's identity and that no task (``skipped``) saw a decision, and returns
        what it found instead of deciding: the commit finishes a replay and aborts the rest.

        Once the decision is sent, a failure (above all a connection broken during its COMMIT) leaves its
        fate unknown to us: :meth:`_settle_decision` reads the log again instead of guessing.
        """
        sent = False
        run = run or next((x.run for x in record.xids), None) or new_run_nonce()
        try:
            with self.journal.locked_sink(self.sink_id) as (conn, horizon):
                state = self.journal.decision_state(conn, self.sink_id, record.batch_id, run)
                mine = self.target(conn, query)
                other = state.decision
                if checks and other is not None:  # decided: a replay of the same target, or another target's
                    if not same_target(state.target, mine):
                        message = identity_message(self.sink_id, record.batch_id, state.target, mine)
                        return _Refusal(error=BatchIdentityError(message))
                    return _Refusal(replay=other)
                if checks and horizon is not None and record.batch_id <= horizon:
                    return _Refusal(
                        error=ForgottenBatchError(
                            forgotten_message(self.sink_id, record.batch_id, horizon, self.journal.sinks.fullname)
                        )
                    )
                strangers = [x for x in record.xids if x.log_id != state.log_id]
                if checks and strangers:
                    return _Refusal(strangers=strangers, log_id=state.log_id)
                if checks and skipped:
                    return _Refusal()
                prepared = {
                    p.xid
                    for p in list_prepared(self.dialect, self.journal, conn)
                    if p.xid is not None and p.xid.log_id == state.log_id
                }
                self._leftovers = any(
                    x.sink_id == self.sink_id and x.batch_id <= record.batch_id and x not in record.xids
                    for x in prepared
                )
                missing = [x for x in record.xids if x not in prepared]
                # checked whatever the list holds: an empty list proves nothing about who holds the batch
                taken_over = not state.holds() or any(x.run != run for x in record.xids)
                if other is None and not missing and not taken_over:
                    target = mine
                    if apply is not None:  # recovery finishes the batch from the log alone
                        target = json.dumps({**json.loads(target), "apply": apply.to_dict()}, sort_keys=True)
                    too_long = self.journal.target_too_long(conn, self.sink_id, record.batch_id, target)
                    if too_long is not None:  # never recorded truncated: the commit aborts the batch
                        return _Refusal(error=BatchAbortedError(too_long))
                    self.journal.record_decision(conn, state, record, run, target)
                    sent = True
                else:
                    doomed = [x for x in record.xids if x in prepared and (other is None or x not in other.xids)]
                    self._rollback(doomed)
        except Exception as exc:  # leaving locked() sends the decision's COMMIT: a failure there is ambiguous
            if not sent:
                raise
            self._settle_decision(record, exc, run)
            return None
        if sent:
            log.info(
                "decided sink %s batch %s: %d branches, %d rows",
                self.sink_id,
                record.batch_id,
                record.branches,
                record.rows,
            )
            return None
        if other is None and taken_over:
            raise ConcurrentWriterError(
                f"sink {self.sink_id} batch {record.batch_id} was taken over by a newer writer with the same "
                "sinkId before this one decided; this attempt's branches were rolled back and it wrote nothing. "
                "Run one writer per sinkId at a time."
            )
        if other is not None:
            raise ConcurrentWriterError(
                f"sink {self.sink_id} batch {record.batch_id} was decided by another writer "
                "first; this attempt's branches were rolled back and it wrote nothing"
            )
        raise ConcurrentWriterError(
            f"sink {self.sink_id} batch {record.batch_id}: {len(missing)} prepared branches vanished before the "
            f"decision (rolled back by a recovery run or another writer of the same sinkId, e.g. {missing[0]}); "
            "nothing of this batch is visible, run it again"
        )

    def _settle_decision(self, record: BatchRecord, cause: Exception, run: str) -> None:
        """The decision was sent but not confirmed: read the log again and follow it, never guess.

        The re-read takes the sink lock, which the broken session held: by the time it is granted that
        session's transaction has ended one way or the other, so the log's answer is final.  Decided by this
        run (:meth:`Journal.decided_by`) with our exact list: go on committing.  Not decided: roll back the
        batch's branches under the same lock (so it can never be decided later) and raise
        :class:`BatchAbortedError`.
        """
        batch = record.batch_id
        log.warning(
            "sink %s batch %s: the decision was sent but not confirmed (%s); reading the decision log again",
            self.sink_id,
            batch,
            self._describe(cause),
        )

        def reread() -> tuple[BatchRecord | None, bool]:
            """(the batch's decision, whether it is this run's with our exact list), our losers rolled back."""
            with self.journal.locked(self.sink_id) as conn:
                found = self.journal.get(conn, self.sink_id, batch)
                mine = self.journal.decided_by(conn, self.sink_id, batch, run) if found is not None else None
                ours = mine is not None and set(mine.xids) == set(record.xids)
                if not ours:
                    prepared = {p.xid for p in list_prepared(self.dialect, self.journal, conn) if p.xid is not None}
                    kept = set(found.xids) if found is not None else set()
                    self._rollback([x for x in record.xids if x in prepared and x not in kept])
                return found, ours

        deadline = time.monotonic() + self.options.commit_timeout
        try:
            found, ours = self._forward(
                f"re-reading the decision of sink {self.sink_id} batch {batch}", reread, deadline
            )
        except Exception as exc:
            if not self._transient(exc):
                raise
            raise DecisionUnknownError(
                f"sink {self.sink_id} batch {batch}: the connection broke while the decision was committed and "
                f"the decision log could not be read again within commitTimeout ({self.options.commit_timeout} s: "
                f"{self._describe(exc)}), so whether the batch is decided is not known. Run it again with the "
                f"same sinkId ('{self.sink_id}') and batchId, or run 'xasink recover': either finishes it if it "
                "was decided and rolls it back if not; no row is lost or doubled. Do not rerun it under another "
                "sink id: its rows could be written twice."
            ) from exc
        if found is None:
            raise BatchAbortedError(
                f"sink {self.sink_id} batch {batch}: the connection broke while the decision was committed, and "
                "the decision log shows it was not recorded: the batch's branches were rolled back and nothing "
                "of it is visible; run it again"
            ) from cause
        if not ours:
            raise ConcurrentWriterError(
                f"sink {self.sink_id} batch {batch}: the connection broke while the decision was committed, and "
                "the decision log shows another writer's decision for it; this attempt's branches were rolled "
                "back and it wrote nothing"
            ) from cause
        log.warning("sink %s batch %s: the decision log holds the decision; committing it", self.sink_id, batch)

    def _transient(self, exc: BaseException) -> bool:
        """Worth retrying: the server unreachable or restarting, a connection cut, a lock or deadlock timeout."""
        return isinstance(exc, ConnectError) or self.dialect.classify(exc) == ErrorKind.TRANSIENT

    def _describe(self, exc: BaseException) -> str:
        """An exception in one short line for a log or message, without the password."""
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return redact(f"{type(exc).__name__}: {text}"[:300], url_secrets(self.options.url))

    def _forward(self, what: str, step: Callable[[], T], deadline: float, retries: int | None = None) -> T:
        """Run a step of a decided batch, retrying transient errors with capped exponential backoff and
        jitter until it succeeds, ``deadline`` (time.monotonic) passes, or ``retries`` retries were made."""
        attempt = 0
        while True:
            try:
                return step()
            except Exception as exc:
                left = deadline - time.monotonic()
                if not self._transient(exc) or left <= 0 or (retries is not None and attempt >= retries):
                    raise
                delay = min(left, min(BACKOFF_CAP_S, BACKOFF_FIRST_S * 2**attempt) * random.uniform(0.5, 1.0))
                attempt += 1
                log.warning("%s failed (%s), retry %d in %.1f s", what, self._describe(exc), attempt, delay)
                time.sleep(delay)

    def _mark(self, batch_id: int, commit_ms: int, deadline: float) -> None:
        """Mark the batch committed (retried like the commits); its rows are all visible by now."""

        def mark() -> bool:
            with self.journal.dialect.connect() as conn:
                # lost in a server crash, the mark is made again: recovery finishes the decided batch, whose
                # committed branches answer "unknown" (counted as committed), and marks it
                self.journal.dialect.relaxed_commit(conn)
                return self.journal.mark_committed(conn, self.sink_id, batch_id, commit_ms)

        try:
            if not self._forward(f"marking sink {self.sink_id} batch {batch_id} committed", mark, deadline):
                log.info(
                    "sink %s batch %s was already marked committed (by a recovery run, or by a try whose reply "
                    "was lost)",
                    self.sink_id,
                    batch_id,
                )
        except Exception as exc:
            if not self._transient(exc):
                raise
            raise CommitIncompleteError(
                f"sink {self.sink_id} batch {batch_id} is decided and all its branches are committed (its rows "
                f"are visible), but marking it committed in the decision log failed within commitTimeout "
                f"({self.options.commit_timeout} s: {self._describe(exc)}). The next run of this sink (sinkId "
                f"'{self.sink_id}') or 'xasink recover' marks it; no row is lost or doubled. Do not rerun this "
                "batch under another sink id: its rows would be written twice."
            ) from exc

    def _after_commit(self, batch_id: int, sweep: bool = True) -> None:
        """Sweep and trim after a committed batch: housekeeping, so a failure is a warning, never an error.

        ``sweep`` False: the decision saw no branch of this sink up to this batch but the decided ones, so
        there is nothing to sweep (an attempt that prepares after the decision rolls itself back:
        :func:`xasink.protocol.partition_writer.settle_prepared`).
        The trim runs for about one batch in ``TRIM_EVERY`` (each
        every time when the retention is smaller): it reads every uncompacted batch of the sink.
        """
        try:
            with phase("commit.sweep", sink=self.sink_id, batch=batch_id):
                if sweep:
                    self.recover(upto=batch_id)
        except Exception as exc:  # noqa: BLE001 - the batch is committed; the next write or recover sweeps
            log.warning(
                "sink %s batch %s is committed, but the sweep after it failed (%s): branches it would have "
                "rolled back or finished are left to the next write of this sink or 'xasink recover'",
                self.sink_id,
                batch_id,
                self._describe(exc),
            )
        try:
            with phase("commit.trim", sink=self.sink_id, batch=batch_id):
                self._trim(batch_id)
        except Exception as exc:  # noqa: BLE001 - the batch is committed; the next write trims
            log.warning(
                "sink %s batch %s is committed, but trimming the decision log failed (%s); the next write trims it",
                self.sink_id,
                batch_id,
                self._describe(exc),
            )

    def _rollback(self, xids: Sequence[Xid]) -> None:
        group_ops.rollback_branches(self, xids)

    def _commit_branches(
        self, xids: Sequence[Xid], first_commit_fault: bool = False, deadline: float | None = None
    ) -> list[Xid]:
        """COMMIT every decided branch (:func:`xasink.protocol.branch_group.commit_branches`)."""
        return group_ops.commit_branches(self, xids, first_commit_fault, deadline)

    # -- abort, sweep, recovery (xasink.protocol.recovery) -----------------------------------------------------------
    def abort(
        self,
        batch_id: int,
        outcomes: Sequence[BranchOutcome | None] = (),
        settle_s: float = 0.0,
        run: str | None = None,
        guard: str | None = None,
    ) -> RecoveryReport:
        """Roll back what a failed batch prepared (and anything else of it that can never commit).

        When Spark aborts a job, tasks still running are cancelled but may PREPARE in the moments
        before their worker is killed (``spark.python.task.killTimeout``, 2 s by default).  With
        ``settle_s`` the sweep is repeated over that window so such late branches are rolled back too.
        ``run`` (else the run of the outcomes' xids) names the aborting writer: when a newer writer has
        taken the batch over, its branches are left to it.  ``guard`` is the aborting driver's run guard:
        when no outcome names the run (a stopped streaming query's tasks report nothing), the runs of this
        batch that hold that guard are this driver's, and end with the abort too.
        """
        log.info("aborting sink %s batch %s", self.sink_id, batch_id)  # the writer is told by its error
        if run is None:
            named = (o.run or (o.xid.run if o.xid else None) for o in outcomes if o is not None)
            run = next((r for r in named if r), None)
        with self.journal.locked(self.sink_id) as conn:
            ending = {run} if run is not None else set()
            if run is None and guard is not None:
                claims = self.journal.claim_states(conn, self.sink_id, {batch_id})
                ending = {r for (_, r), c in claims.items() if c.guard == guard and not c.superseded}
            for r in sorted(ending):  # the run can never decide now: its late branches must not wait for it
                self.journal.end_run(conn, self.sink_id, batch_id, r)
        report = self.recover(upto=batch_id, run=run)
        deadline = time.monotonic() + settle_s
        while time.monotonic() < deadline:
            time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
            late = self.recover(upto=batch_id, run=run)
            report.rolled_back += late.rolled_back
            report.committed += late.committed
        return report

    def recover(self, upto: int | None = None, min_age_s: float = 0.0, run: str | None = None) -> RecoveryReport:
        """Finish decided batches and roll back undecided branches of this sink (batches <= ``upto``).

        Undecided branches younger than ``min_age_s`` are left alone (a live
        batch may still decide them); decided ones are always finished.  With
        ``run``, the caller is a writer of batch ``upto``: branches of that
        batch held by another run (one that took the batch over) are left to it.
        (:func:`xasink.protocol.recovery.recover`.)
        """
        return recovery.recover(self, upto, min_age_s, run)

    def _trim(self, batch_id: int) -> None:
        keep = self.options.journal_retention
        if keep >= TRIM_EVERY and zlib.crc32(f"{self.sink_id}:{batch_id}".encode()) % TRIM_EVERY:
            return  # not this batch's turn (ids in any pattern: a hash, not the id itself, picks the turn)
        with self.journal.dialect.connect() as conn:
            self.journal.trim(conn, self.sink_id, self.options.journal_retention)
