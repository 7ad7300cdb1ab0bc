"""The decision of a single-table batch: record it under the sink lock, or say why not.

The decision (a journal row listing the exact xids) is written under the sink's row lock after checking every
listed branch is still prepared and that the deciding run holds the batch's claim (:meth:`Journal.record_decision`,
the one place a decision is recorded, for a multi-target transaction too); every roll-back of an undecided
branch happens under the same lock.  So a batch is either decided with all its branches intact, or its branches
are rolled back and it can never be decided (DESIGN invariant 4).
"""

from __future__ import annotations

import json
import logging
import time
from contextlib import ExitStack
from dataclasses import dataclass, field

from sqlalchemy.engine import Connection

from xasink.dialects.base import Dialect
from xasink.errors import (
    BatchAbortedError,
    BatchIdentityError,
    ConcurrentWriterError,
    DecisionUnknownError,
    ForgottenBatchError,
    XasinkError,
)
from xasink.journal.log import Journal
from xasink.journal.records import BatchRecord
from xasink.journal.targets import (
    forgotten_message,
    identity_message,
    is_write_mode,
    same_table,
    same_target,
    target_identity,
)
from xasink.options import TableName
from xasink.protocol.apply_step import order_lock
from xasink.protocol.branch_group import BranchGroup
from xasink.protocol.recovery import list_prepared
from xasink.protocol.retry import RetryPolicy, again_if_deadlocked
from xasink.protocol.xid import Xid, new_run_nonce
from xasink.write_modes.spec import ApplySpec

log = logging.getLogger("xasink.protocol.coordinator")  # the coordinator's steps: logged under its name


@dataclass
class Refusal:
    """Why :meth:`Decider.decide` did not decide: a replay to finish, or what to abort the batch with.

    All empty: a task saw a decision the log no longer holds."""

    replay: BatchRecord | None = None  # decided already, for this very target
    error: Exception | None = None  # BatchIdentityError / ForgottenBatchError
    strangers: list[Xid] = field(default_factory=list)  # branches of another decision log
    log_id: str | None = None  # this log's identity (with strangers)
    # older decided write-mode batches of the same table, not applied yet: (sink, batch), in decision order
    blocked: list[tuple[str, int]] = field(default_factory=list)
    blocked_why: str | None = None  # what kept them from being finished first


class DecisionNotMade(Exception):
    """:meth:`Decider.decide` failed before the decision's COMMIT was sent: provably not recorded (a lock
    timeout on the sink row, a lost connection...).  The caller rolls back the run's branches and tells the
    user so, with :attr:`cause`."""

    def __init__(self, cause: Exception) -> None:
        super().__init__(str(cause))
        self.cause = cause


class Decider:
    """Decides one sink's batches in the database its branches are prepared in."""

    def __init__(
        self,
        sink_id: str,
        table: TableName,
        dialect: Dialect,
        journal: Journal,
        group: BranchGroup,
        policy: RetryPolicy,
    ) -> None:
        self.sink_id = sink_id
        self.table = table
        self.dialect = dialect
        self.journal = journal
        self.group = group
        self.policy = policy
        self.leftovers = True  # the last decision saw branches of this sink besides its own: sweep after it

    def target(self, conn: Connection, query: str | None = None, apply: ApplySpec | None = None) -> str:
        """What this sink's batches write (the identity the decision log records with each batch).  A write-mode
        batch's is the table its apply step was planned on: an unqualified table is not looked up again, so a
        same-named table made meanwhile earlier in search_path cannot split the recorded target from the table
        the batch is applied to."""
        schema = self.table.schema or (apply.schema if apply is not None else None)
        return target_identity(conn, schema, self.table.name, query)

    def blockers(self, conn: Connection, mine: str, batch_id: int) -> list[tuple[str, int]]:
        """Decided write-mode batches of this batch's table (of any sink of the log) not applied yet: a newer
        write-mode batch deciding now would take effect before them, or be overwritten by them.  Read under
        the sink lock, which every decision of this sink takes, and under the table's apply lock
        (:func:`xasink.protocol.apply_step.order_lock`), which every write-mode decision of the table takes."""
        return [
            (sink, batch)
            for sink, batch, target in self.journal.pending_targets(conn)
            if (sink, batch) != (self.sink_id, batch_id) and is_write_mode(target) and same_table(target, mine)
        ]

    def decide(
        self,
        record: BatchRecord,
        query: str | None = None,
        apply: ApplySpec | None = None,
        checks: bool = False,
        skipped: bool = False,
        run: str | None = None,
    ) -> Refusal | None:
        """:meth:`decide_locked`; a write-mode batch's commit (``checks``) decides holding its table's apply lock,
        so that a second sink's decisions of the table are ordered with this one's (DESIGN invariant 12).

        Never without it: a session holding it may be deciding a batch of the table whose decision is not
        visible yet (its COMMIT waiting on a slow disk or a synchronous standby), and a decision made beside it
        would take effect in the wrong order.  While the lock is not granted, the batch's own state is read
        first: decided (a replay, or another target's batch) or below the log's horizon, it is answered from the
        log, where nothing can be decided; else a pending batch of the table found meanwhile is a refusal
        (finished first by the caller); else the lock is asked again until commitTimeout, then the decision is
        not made (the run rolls back, nothing of it visible).  Any failure meanwhile is :class:`DecisionNotMade`."""
        if not (checks and apply is not None):
            return self.decide_locked(record, query, apply, checks, skipped, run)
        batch = record.batch_id
        until = self.policy.deadline()
        while True:
            answered, blocked = False, []
            with ExitStack() as held:
                try:  # nothing is recorded yet: a failure here (no connection) is the decision's, before it was sent
                    refused = held.enter_context(order_lock(self.journal.dialect, apply))
                    if refused is not None:  # this batch's own state first: a replay is never told "blocked"
                        with self.journal.dialect.connect(autocommit=True) as conn:
                            decided, _, horizon = self.journal.batch_view(conn, self.sink_id, batch)
                            answered = decided or (horizon is not None and batch <= horizon)
                            if not answered:
                                blocked = self.blockers(conn, self.target(conn, query, apply), batch)
                except Exception as exc:
                    raise DecisionNotMade(exc) from exc
                if refused is None:
                    return self.decide_locked(record, query, apply, checks, skipped, run)
            if answered:  # a replay, another target's batch or a forgotten one: answered from the log, no lock needed
                return self.decide_locked(record, query, apply, checks, skipped, run, unlocked=refused)
            if blocked:
                return Refusal(blocked=blocked, blocked_why=refused)
            if time.monotonic() >= until:
                raise DecisionNotMade(
                    XasinkError(
                        f"{refused}, for commitTimeout ({self.policy.timeout_s} s): another session (a decision or "
                        "an apply of the same table, by another sink or xasink recover) held it all along"
                    )
                )
            log.debug(
                "sink %s batch %s: the table's apply lock not granted (%s), asked again", self.sink_id, batch, refused
            )

    def decide_locked(
        self,
        record: BatchRecord,
        query: str | None = None,
        apply: ApplySpec | None = None,
        checks: bool = False,
        skipped: bool = False,
        run: str | None = None,
        unlocked: str | None = None,
    ) -> Refusal | None:
        """:meth:`decide_once`, again while it is not made because the server rolled its transaction back as a
        deadlock's victim (nothing sent, nothing recorded): a run that claims in its decision (a micro-batch whose
        partitions were all empty) takes the claims table's gap locks there, as the claims do."""
        return again_if_deadlocked(
            self.journal.dialect,
            f"deciding sink {self.sink_id} batch {record.batch_id}",
            lambda: self.decide_once(record, query, apply, checks, skipped, run, unlocked),
            unwrap=lambda exc: exc.cause if isinstance(exc, DecisionNotMade) else None,
        )

    def decide_once(
        self,
        record: BatchRecord,
        query: str | None = None,
        apply: ApplySpec | None = None,
        checks: bool = False,
        skipped: bool = False,
        run: str | None = None,
        unlocked: str | None = None,
    ) -> Refusal | None:
        """Record the decision under the sink lock, after checking every listed branch is still prepared.

        ``unlocked``: why a write-mode batch's commit does not hold its table's apply lock; then only a
        decision already in the log is answered (a replay, or another target's batch), and nothing is decided.

        The decision is recorded (by :meth:`Journal.record_decision`, the one place that does) only if no
        decision exists, ``run`` (default: the run of the listed branches) holds the batch's claim, every
        listed branch is that run's and is still prepared; else the listed branches are rolled back and
        :class:`ConcurrentWriterError` raised.  With ``checks`` (the commit), the same transaction first
        checks what :meth:`Coordinator.check_batch` checks before a write (a decided batch is a replay of the same
        target, or refused for another; an undecided one at or below an old log's horizon is refused), that
        the branches carry this log's identity and that no task (``skipped``) saw a decision, and returns
        what it found instead of deciding: the commit finishes a replay and aborts the rest.

        A failure before the decision's COMMIT was sent is :class:`DecisionNotMade` (nothing recorded, the
        listed branches still prepared).  Once it is sent, a failure (above all a connection broken during its
        COMMIT) leaves its fate unknown to us: :meth:`_settle` reads the log again instead of guessing.
        """
        sent = False
        run = run or next((x.run for x in record.xids), None) or new_run_nonce()
        try:
            with self.journal.locked_sink(self.sink_id) as (conn, horizon):
                state = self.journal.decision_state(conn, self.sink_id, record.batch_id, run)
                mine = self.target(conn, query, apply)
                other = state.decision
                if checks and other is not None:  # decided: a replay of the same target, or another target's
                    if not same_target(state.target, mine):
                        message = identity_message(self.sink_id, record.batch_id, state.target, mine)
                        return Refusal(error=BatchIdentityError(message))
                    return Refusal(replay=other)
                if checks and horizon is not None and record.batch_id <= horizon:
                    return Refusal(
                        error=ForgottenBatchError(
                            forgotten_message(self.sink_id, record.batch_id, horizon, self.journal.sinks.fullname)
                        )
                    )
                if unlocked is not None:  # never decided without the table's apply lock (DESIGN invariant 12)
                    raise XasinkError(f"{unlocked}, and no decision of this batch was found meanwhile")
                strangers = [x for x in record.xids if x.log_id != state.log_id]
                if checks and strangers:
                    return Refusal(strangers=strangers, log_id=state.log_id)
                if checks and skipped:
                    return Refusal()
                if checks and apply is not None:  # decision order is the order of effect (DESIGN invariant 12)
                    blocked = self.blockers(conn, mine, record.batch_id)
                    if blocked:
                        return Refusal(blocked=blocked)
                prepared = {
                    p.xid
                    for p in list_prepared(self.dialect, self.journal, conn)
                    if p.xid is not None and p.xid.log_id == state.log_id
                }
                self.leftovers = any(
                    x.sink_id == self.sink_id and x.batch_id <= record.batch_id and x not in record.xids
                    for x in prepared
                )
                missing = [x for x in record.xids if x not in prepared]
                # checked whatever the list holds: an empty list proves nothing about who holds the batch
                taken_over = not state.holds() or any(x.run != run for x in record.xids)
                if other is None and not missing and not taken_over:
                    # the deciding run is kept with the target through compaction (which drops the claims and
                    # the xid list): the run still recognizes its own decision after a trim (DESIGN invariant 14)
                    ident = {**json.loads(mine), "run": run}
                    if apply is not None:  # recovery finishes the batch from the log alone
                        ident["apply"] = apply.to_dict()
                    target = json.dumps(ident, sort_keys=True)
                    too_long = self.journal.target_too_long(conn, self.sink_id, record.batch_id, target)
                    if too_long is not None:  # never recorded truncated: the commit aborts the batch
                        return Refusal(error=BatchAbortedError(too_long))
                    self.journal.record_decision(conn, state, record, run, target)
                    sent = True
                else:
                    doomed = [x for x in record.xids if x in prepared and (other is None or x not in other.xids)]
                    self.group.rollback(doomed)
        except Exception as exc:  # leaving locked() sends the decision's COMMIT: a failure there is ambiguous
            if not sent:  # the transaction never committed: nothing of it is in the log
                raise DecisionNotMade(exc) from exc
            self._settle(record, exc, run)
            return None
        if sent:  # the batch's one INFO line is its result's (Coordinator.commit)
            log.debug(
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

    def _settle(self, record: BatchRecord, cause: Exception, run: str) -> None:
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
            self.policy.describe(cause),
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
                    self.group.rollback([x for x in record.xids if x in prepared and x not in kept])
                return found, ours

        deadline = self.policy.deadline()
        try:
            found, ours = self.policy.forward(
                f"re-reading the decision of sink {self.sink_id} batch {batch}", reread, deadline
            )
        except Exception as exc:
            if not self.policy.transient(exc):
                raise
            raise DecisionUnknownError(
                f"sink {self.sink_id} batch {batch}: the connection broke while the decision was committed and "
                f"the decision log could not be read again within commitTimeout ({self.policy.timeout_s} s: "
                f"{self.policy.describe(exc)}), so whether the batch is decided is not known. Run it again with the "
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
