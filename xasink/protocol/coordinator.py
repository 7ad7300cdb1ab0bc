"""Driver side: claim, decide, commit, sweep and abort a sink's batches.

A facade over the protocol's parts, as Flink's XA sink is over its own: the decision
(:mod:`xasink.protocol.decision`), the group operations on branches (:mod:`xasink.protocol.branch_group`), the
apply step of a write mode (:mod:`xasink.protocol.apply_step`) and recovery (:mod:`xasink.protocol.recovery`),
which share one retry policy (:mod:`xasink.protocol.retry`).  None of them knows the coordinator.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import replace
from functools import partial

from xasink.dialects import dialect_for, shared_dialect
from xasink.dialects.base import Dialect
from xasink.errors import (
    BatchAbortedError,
    BatchBlockedError,
    BatchIdentityError,
    CommitIncompleteError,
    ConcurrentWriterError,
    ForgottenBatchError,
    ReplayIncompleteError,
)
from xasink.journal.log import Journal
from xasink.journal.records import BatchRecord
from xasink.journal.targets import (
    blocked_message,
    forgotten_message,
    identity_message,
    same_target,
    taken_over_message,
)
from xasink.options import WriteOptions
from xasink.protocol.decision import Decider, DecisionNotMade, Refusal
from xasink.protocol.prepare_lock import prepare_lock_name, settle
from xasink.protocol.recovery import Recovery, RecoveryReport, sink_recovery
from xasink.protocol.retry import again_if_deadlocked
from xasink.protocol.undecided import decide_past_blockers, roll_back_run, roll_back_undecided
from xasink.results import BranchOutcome, WriteResult, total_since
from xasink.support.faults import fault
from xasink.support.phases import phase
from xasink.write_modes.spec import ApplySpec

log = logging.getLogger(__name__)

# an abort's sweeps repeat this long: Spark kills a cancelled task's Python worker after
# spark.python.task.killTimeout (2 s), and until then the task may still PREPARE
ABORT_SETTLE_S = 4.0
# (shared dialect, journal schema, prefix) -> the sinks registered in that log by this process
_SHARED_SINKS: dict[tuple[int, str | None, str], set[str]] = {}


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
        # check_server reads the branch settings
        pool = options.control_pool_size
        self._owns_dialect = dialect is None and not shared
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
        self.recovery = sink_recovery(options, dialect, journal)
        self.policy = self.recovery.policy
        self.group = self.recovery.group
        self.decider = Decider(self.sink_id, options.table, dialect, journal, self.group, self.policy)

    def close(self) -> None:
        if self._owns_dialect:
            self.dialect.dispose()

    # -- set-up -------------------------------------------------------------------
    def preflight(self, branches: int | None = None) -> None:
        """Check the server can hold the branches, and create the journal tables on first use."""
        with self.dialect.connect(autocommit=True) as conn:  # reads only: no BEGIN and ROLLBACK round trips
            self.dialect.check_server(conn, branches)
        self.journal.ensure()

    def slots_hold(self, branches: int) -> bool:
        """Whether the server's free prepared-transaction slots hold ``branches`` now (always where unlimited)."""
        with self.dialect.connect(autocommit=True) as conn:  # reads only
            slots = self.dialect.free_prepared_slots(conn)
        return slots is None or branches <= slots[0]

    # -- commit ---------------------------------------------------------------------
    def check_batch(self, batch_id: int, query: str | None = None) -> bool:
        """Before a batch writes: True when it is a replay of a committed batch (same target), False when it
        is new.  Raises :class:`BatchIdentityError` when the log holds it for another target, and
        :class:`ForgottenBatchError` when the log can no longer tell (an old log's trim)."""
        with self.dialect.connect(autocommit=True) as conn:  # reads only
            decided, recorded, horizon = self.journal.batch_view(conn, self.sink_id, batch_id)
            mine = self.decider.target(conn, query)
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
        when ``run`` itself was taken over.  The tasks' first attempts can then skip their own claim.  Run again
        when the server rolled it back as a deadlock's victim (nothing of it took effect).
        """

        def claim() -> bool:
            with self.journal.locked(self.sink_id) as conn:
                decided, _, superseded = self.journal.claim_view(conn, self.sink_id, batch_id, run)
                if decided:
                    return False
                if superseded is None:
                    self.journal.take_over(conn, self.sink_id, batch_id, run, guard)
                elif superseded:
                    raise ConcurrentWriterError(taken_over_message(self.sink_id, batch_id, run))
            return True

        return again_if_deadlocked(self.dialect, f"claiming sink {self.sink_id} batch {batch_id}", claim)

    def commit(
        self,
        batch_id: int,
        outcomes: Sequence[BranchOutcome | None],
        query: str | None = None,
        apply: ApplySpec | None = None,
        run: str | None = None,
        started: float | None = None,
    ) -> WriteResult:
        """Decide and commit a batch whose tasks all reported; finish it instead if it was decided before.

        ``run`` is the writer run deciding (else the run its tasks report): it decides only while it holds
        the batch's claim, whatever its branches (none at all, when every partition was empty).
        ``query`` is the streaming query's id (else the tasks' reports name it): recorded with the target.
        ``apply``: the branches loaded a shadow table (overwrite, replaceWhere, change-data apply); once they
        are committed, one local transaction replaces the target's rows from it and marks the batch.
        ``started``: when the write began (``time.time()``, as its driver planned it): the figures' total runs
        from there; None (a streaming micro-batch, whose start the sink is not told): no total.

        The result's figures, in seconds, one consistent set (docs/operations.md, Monitoring): ``prepare`` the
        slowest task's load and PREPARE and ``commit`` the branches' COMMIT, both as the log records them (in
        whole milliseconds, as ``xasink status`` and a rerun's ``earlier`` show them), then ``decide``,
        ``mark`` (or ``apply``) and ``sweep``, the driver's other steps, and ``total``.
        """
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
            try:
                decide = partial(self.decider.decide, record, query, apply, checks=True, skipped=skipped, run=run)
                verdict = decide_past_blockers(decide, self._recovery_of, self.policy)
            except DecisionNotMade as exc:
                roll_back_undecided(
                    self.sink_id, record, run, exc.cause, self.group, self.policy, lambda b, r: self.abort(b, run=r)
                )
        if verdict is not None:
            return self._refused(verdict, record, outcomes, started)
        # after the decision, only forward: commit and mark through transient errors until commitTimeout
        fault("driver.after_decide", batch=batch_id)
        t_commit = time.perf_counter()
        deadline = self.policy.deadline()
        with phase("commit.commit_prepared", **ids):
            self.group.commit(record.xids, first_commit_fault=True, deadline=deadline)
        t_committed = time.perf_counter()
        fault("driver.after_commits", batch=batch_id)
        commit_ms = int((t_committed - t_commit) * 1000)
        if apply is not None:
            with phase("commit.apply", **ids):
                self.recovery.apply_step.apply(batch_id, apply, record.xids, commit_ms, deadline)
        else:
            with phase("commit.mark", **ids):
                self._mark(batch_id, commit_ms, deadline)
        fault("driver.after_mark", batch=batch_id)
        t_sweep = time.perf_counter()
        self.recovery.after_commit(batch_id, self.options.journal_retention, sweep=self.decider.leftovers)
        t_end = time.perf_counter()
        result = WriteResult(
            self.sink_id,
            batch_id,
            rows,
            len(xids),
            False,
            {
                "prepare": record.prepare_ms / 1000,
                "decide": t_commit - t_decide,
                "commit": commit_ms / 1000,
                "apply" if apply is not None else "mark": t_sweep - t_committed,
                "sweep": t_end - t_sweep,
                **total_since(started),
            },
        )
        log.info("%s", result)
        return result

    def _refused(
        self, verdict: Refusal, record: BatchRecord, outcomes: Sequence[BranchOutcome | None], started: float | None
    ) -> WriteResult:
        """What the decision's checks found instead of deciding: a replay is finished, the rest aborted."""
        batch_id = record.batch_id
        if verdict.replay is not None:
            return self._replayed(verdict.replay, started)
        if verdict.blocked:  # older decided batches of the table could not be finished first
            left = roll_back_run(
                self.sink_id, record, None, self.group, self.policy, lambda b, _: self.abort(b, outcomes)
            )
            why = verdict.blocked_why or "it could not be finished first"
            text = blocked_message(self.sink_id, batch_id, verdict.blocked, why)
            raise BatchBlockedError(text if left is None else f"{text} (rolling back this run failed: {left})")
        if verdict.error is not None:  # another target's batch, or one the log forgot: nothing may commit
            self.abort(batch_id, outcomes)
            raise verdict.error
        if verdict.strangers:  # the log was dropped and made anew while the batch ran: its branches name the old one
            self.group.rollback(verdict.strangers)
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

    def _recovery_of(self, sink: str) -> Recovery:
        if sink == self.sink_id:
            return self.recovery
        return sink_recovery(replace(self.options, sink_id=sink), self.dialect, self.journal)

    def _replayed(self, existing: BatchRecord, started: float | None) -> WriteResult:
        """Finish another run's decision of this batch and say what became of it.

        "skipped" only once the log shows the batch committed: a decision withdrawn meanwhile (its rows were
        refused by the table) means nothing of the batch is visible, and one not finished yet is reported so.
        """
        log.debug(
            "sink %s batch %s was already decided: finishing it, writing nothing new", self.sink_id, existing.batch_id
        )
        batch = existing.batch_id
        fault("driver.before_replay_finish", batch=batch)
        try:
            report = self.recover(upto=batch)
        except ReplayIncompleteError:
            raise
        except CommitIncompleteError as exc:  # finishing another decided batch of the pass failed first
            raise ReplayIncompleteError(self._replay_incomplete(batch, self.policy.describe(exc))) from exc
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
        result = WriteResult(self.sink_id, batch, 0, 0, True, total_since(started), earlier=now.earlier())
        log.info("%s", result)  # the batch's one INFO line, as for a batch written
        return result

    def _replay_incomplete(self, batch_id: int, why: str) -> str:
        return (
            f"sink {self.sink_id} batch {batch_id} was decided by another run (this run's rows are not part of "
            f"it), and finishing that decision failed ({why}); it stays decided: the next run of this sink or "
            "'xasink recover' finishes it; no row is lost or doubled"
        )

    def _mark(self, batch_id: int, commit_ms: int, deadline: float) -> None:
        """Mark the batch committed (retried like the commits); its rows are all visible by now."""

        def mark() -> bool:
            with self.journal.dialect.connect() as conn:
                # lost in a server crash, the mark is made again: recovery finishes the decided batch, whose
                # committed branches answer "unknown" (counted as committed), and marks it
                self.journal.dialect.relaxed_commit(conn)
                return self.journal.mark_committed(conn, self.sink_id, batch_id, commit_ms)

        try:
            if not self.policy.forward(f"marking sink {self.sink_id} batch {batch_id} committed", mark, deadline):
                log.info(
                    "sink %s batch %s was already marked committed (by a recovery run, or by a try whose reply "
                    "was lost)",
                    self.sink_id,
                    batch_id,
                )
        except Exception as exc:
            if not self.policy.transient(exc):
                raise
            raise CommitIncompleteError(
                f"sink {self.sink_id} batch {batch_id} is decided and all its branches are committed (its rows "
                f"are visible), but marking it committed in the decision log failed within commitTimeout "
                f"({self.options.commit_timeout} s: {self.policy.describe(exc)}). The next run of this sink (sinkId "
                f"'{self.sink_id}') or 'xasink recover' marks it; no row is lost or doubled. Do not rerun this "
                "batch under another sink id: its rows would be written twice."
            ) from exc

    # -- abort, sweep, recovery (xasink.protocol.recovery) -----------------------------------------------------------
    def abort(
        self,
        batch_id: int,
        outcomes: Sequence[BranchOutcome | None] = (),
        settle_s: float = 0.0,
        run: str | None = None,
        guard: str | None = None,
        undecided: bool = False,
    ) -> RecoveryReport:
        """Roll back what a failed batch prepared (and anything else of it that can never commit).

        When Spark aborts a job, tasks still running are cancelled but may PREPARE in the moments
        before their worker is killed (``spark.python.task.killTimeout``, 2 s by default).  Once the run is
        ended, the abort waits (at most ``settle_s``) until no task of it holds its prepare lock
        (:mod:`xasink.protocol.prepare_lock`) and sweeps once more.  A run with no claim to end (a log made
        anew, its claims trimmed, a streaming abort that names no run), or a PREPARE still running at the
        window's end, is swept again and again over ``settle_s``.
        ``run`` (else the run of the outcomes' xids) names the aborting writer: when a newer writer has
        taken the batch over, its branches are left to it.  ``guard`` is the aborting driver's run guard:
        when no outcome names the run (a stopped streaming query's tasks report nothing), the runs of this
        batch that hold that guard are this driver's, and end with the abort too.

        ``undecided``: ``run`` never decided and never will (its job failed, its commit never ran): its branches
        are rolled back without the sink lock first, and over the settle window if the locked steps fail.
        """
        log.info("aborting sink %s batch %s", self.sink_id, batch_id)  # the writer is told by its error
        if run is None:
            named = (o.run or (o.xid.run if o.xid else None) for o in outcomes if o is not None)
            run = next((r for r in named if r), None)
        if undecided and run is not None:
            self.group.roll_back_run_over(self.journal.log_id(), batch_id, run)
            try:
                return self.abort(batch_id, outcomes, settle_s, run, guard)
            except Exception:  # the tasks still running may PREPARE meanwhile
                self.group.roll_back_run_over(self.journal.log_id(), batch_id, run, settle_s)
                raise
        with self.journal.locked(self.sink_id) as conn:
            ending = {run} if run is not None else set()
            if run is None and guard is not None:
                claims = self.journal.claim_states(conn, self.sink_id, {batch_id})
                ending = {r for (_, r), c in claims.items() if c.guard == guard and not c.superseded}
            ended_all = bool(ending)
            for r in sorted(ending):  # the run can never decide now: its late branches must not wait for it
                ended_all = self.journal.end_run(conn, self.sink_id, batch_id, r) and ended_all
        names = [prepare_lock_name(self.journal.log_id(), self.sink_id, batch_id, r) for r in sorted(ending)]
        sweep = lambda: self.recover(upto=batch_id, run=run)  # noqa: E731
        return settle(sweep, self.dialect, names if ended_all else None, settle_s)

    def recover(self, upto: int | None = None, min_age_s: float = 0.0, run: str | None = None) -> RecoveryReport:
        """Finish decided batches and roll back undecided branches of this sink (batches <= ``upto``).

        Undecided branches younger than ``min_age_s`` are left alone (a live
        batch may still decide them); decided ones are always finished.  With
        ``run``, the caller is a writer of batch ``upto``: branches of that
        batch held by another run (one that took the batch over) are left to it.
        """
        return self.recovery.recover(upto, min_age_s, run)
