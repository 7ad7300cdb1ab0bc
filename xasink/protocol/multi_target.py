"""Driver side of a multi-target transaction: one decision over the branches of several writes.

Every write of the transaction prepares its branches in its own database and records them as a *part*
in the one decision log (xasink.journal.parts) without deciding.  This object, living in the user's process for
the whole block, holds the run's guard (a session lock on the log's database) so no sweep or recovery
rolls back an early write's prepared branches while later writes run; at the end it decides once, under
the log's sink lock, after checking every part's branches are still prepared in their databases, then
commits each database's branches through its own dialect.  Rolling back an undecided branch of this log
happens under the same lock (DESIGN invariant 4), whichever database the branch is in.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import replace
from functools import partial

from xasink.dialects import dialect_for
from xasink.errors import (
    BatchAbortedError,
    BatchIdentityError,
    CommitIncompleteError,
    ConcurrentWriterError,
    DecisionUnknownError,
    ForgottenBatchError,
    JournalError,
    OptionError,
)
from xasink.journal.log import Journal
from xasink.journal.parts import (
    Part,
    ensure_parts,
    mark_parts_committed,
    multi_target,
    read_parts,
    recorded_targets,
    still_to_recover,
)
from xasink.journal.records import BatchRecord
from xasink.journal.targets import UNKNOWN_QUERY, describe_target, forgotten_message, target_identity
from xasink.options import WriteOptions
from xasink.protocol.liveness import InProcessGuard
from xasink.protocol.multi_abort import TransactionEnd
from xasink.protocol.retry import RetryPolicy, again_if_deadlocked
from xasink.protocol.target_db import TargetDb
from xasink.protocol.xid import Xid, new_run_nonce
from xasink.support.faults import fault

log = logging.getLogger(__name__)
ROLLED_BACK, AGAIN = "it is rolled back: nothing it wrote is visible", "was written. Run it again"


class MultiCoordinator(TransactionEnd):
    """Claims (sink, batch) in the log, tracks the databases written, decides once, commits or aborts."""

    def __init__(
        self,
        sink_id: str,
        batch_id: int,
        log_options: WriteOptions,
        stream: bool = False,
        fixed: bool = True,
        query: str | None = None,
        blind: bool = False,
    ) -> None:
        """``stream``: the batch id is a micro-batch id, so one below the sink's last decided batch means a
        new or reset checkpoint (its batches would be skipped as replays): refused.  ``fixed``: the caller
        named the log (journal_url); else it is the first write's database, and a write into any other
        database is refused (:meth:`_refuse_unfixed_log`).  ``query``: the streaming query's id,
        recorded with the decision; a decided micro-batch of another query, or of one whose id is unknown
        (``blind``: Spark Connect, where the function cannot learn it), is refused, not skipped."""
        self.sink_id = sink_id
        self.fixed = fixed
        self.query = query
        self.blind = blind and query is None
        self.stream = stream
        self.batch_id = batch_id
        self.log_options = replace(log_options, sink_id=sink_id, batch_id=batch_id)
        self.dialect = dialect_for(log_options.url, log_options.branch_settings, 4)
        self.journal = Journal(self.dialect, log_options.journal_schema, log_options.journal_prefix)
        self.policy = RetryPolicy(self.dialect, self.log_options)
        self.run = new_run_nonce()
        self.targets: dict[str, TargetDb] = {}  # by URL (with user): one coordinator per database
        self.recorded: str | None = None  # set when (sink, batch) is decided already: a replay
        self.replay = False
        self._lock = threading.Lock()
        self._sent = False  # the decision's COMMIT was sent: a failure from then on is ambiguous
        with self._before_decision("opening it in the decision log", f"nothing of it {AGAIN}"):
            self.journal.ensure()
            ensure_parts(self.journal)
            self.log_id = self.journal.log_id()
            with self.dialect.connect() as conn:
                self.log_server = self.dialect.server_identity(conn)
            self.guard = InProcessGuard(self.dialect, self.log_id, self.run)
            try:
                again_if_deadlocked(self.dialect, f"claiming sink {self.sink_id} batch {batch_id}", self._claim)
            except BaseException:
                self.close()
                raise

    @property
    def journal_url(self) -> str:
        return self.dialect.url.render_as_string(hide_password=False)

    def _claim(self) -> None:
        with self.journal.locked(self.sink_id) as conn:
            decided, recorded = self.journal.target_of(conn, self.sink_id, self.batch_id)
            last = self.journal.last_batch_id(conn, self.sink_id) if self.stream else None
            if last is not None and last > self.batch_id:
                raise OptionError(
                    f"sink_id: sink {self.sink_id} has already decided batch {last}, but Spark is committing batch "
                    f"{self.batch_id}: this query's checkpoint is new or was reset, or another query writes with "
                    "the same sink_id, and its batches would be skipped as replays. Give this query its own "
                    "sink_id (or restore its checkpoint)."
                )
            if decided:
                self.recorded = recorded
                if self.stream:
                    self._check_query(recorded)
                self.replay = True
                return
            horizon = self.journal.horizon(conn, self.sink_id)
            if horizon is not None and self.batch_id <= horizon:
                raise ForgottenBatchError(
                    forgotten_message(self.sink_id, self.batch_id, horizon, self.journal.sinks.fullname)
                )
            if not self.journal.claim(conn, self.sink_id, self.batch_id, self.run, self.guard.name):
                raise ConcurrentWriterError(f"sink {self.sink_id} batch {self.batch_id}: run {self.run} lost its claim")

    def _check_query(self, recorded: str | None) -> None:
        """A decided micro-batch is a replay only of the query that decided it (an old record names none)."""
        try:
            was = json.loads(recorded).get("query") if recorded else None
        except (ValueError, AttributeError):
            was = None
        if not self.blind and (self.query is None or was is None or was == self.query):
            return
        why = (
            f"by streaming query {was}, and is now written by query {self.query}"
            if not self.blind
            else "and this foreachBatch call cannot learn its streaming query's id: a replay cannot be told "
            "from another query's batch; under Spark Connect pass checkpoint_location to foreach_batch_multi"
        )
        raise BatchIdentityError(
            f"sink {self.sink_id} batch {self.batch_id} was committed as {self._described()} {why}. Nothing of "
            "this attempt was written. Give each query its own sink_id (or restore its checkpoint)."
        )

    def target(self, options: WriteOptions) -> TargetDb:
        key = options.url.render_as_string(hide_password=False)
        with self._lock:
            found = self.targets.get(key)
            if found is None:
                schema, prefix = self.log_options.journal_schema, self.log_options.journal_prefix
                found = TargetDb(replace(options, journal_schema=schema, journal_prefix=prefix), self.journal)
                if not self.fixed and found.server != self.log_server:
                    found.close()
                    self._refuse_unfixed_log(found)
                self.targets[key] = found
            return found

    def _refuse_unfixed_log(self, db: TargetDb) -> None:
        """Without journal_url the log is the database written first, which the order of writes (threads, a
        redeploy) may change from one run to the next: two runs of one batch would then claim and decide it
        in two logs, each unaware of the other, and both commit.  A sink's log must be fixed, never chosen by
        the order of writes, so a transaction spanning several databases must name it."""
        raise OptionError(
            f"sink {self.sink_id} batch {self.batch_id}: this write goes to database {db.server}, but the "
            f"transaction's decision log was opened in {self.log_server} by its first write: without "
            "journal_url a transaction over several databases would choose its log by the order of its writes, "
            "and a replay or a concurrent run writing in another order would not be recognized. Pass journal_url "
            "(the database that holds this sink's decision log) to xasink.transaction / foreach_batch_multi, so "
            "the log is fixed and not chosen by the order of writes. Nothing of this write was done; the "
            "transaction is rolled back."
        )

    def check_replay(self, options: WriteOptions) -> None:
        """A write of a replayed transaction: its table must be among those the transaction wrote."""
        with self._before_decision("a replayed write's check of its table", f"nothing of this attempt {AGAIN}"):
            with self.target(options).dialect.connect() as conn:
                mine = json.loads(target_identity(conn, options.table.schema, options.table.name))
        targets = recorded_targets(self.recorded)
        same = targets is not None and any(all(t.get(k) == mine[k] for k in ("db", "schema", "table")) for t in targets)
        if not same:
            raise BatchIdentityError(
                f"sink {self.sink_id} batch {self.batch_id} was committed as {self._described()}, and is now "
                f"being written to table {mine['schema']}.{mine['table']} in database {mine['db']}: not a replay. "
                "Nothing of this attempt was written. Give this transaction its own sink_id (or a batch_id the "
                "sink never used)."
            )

    def _before_decision(self, step: str, outcome: str = ROLLED_BACK) -> AbstractContextManager[None]:
        """A step before the decision raises xasink errors only, each naming the step and what was not written."""
        told = f"sink {self.sink_id} transaction {self.batch_id}: {step} failed"
        return self.policy.never_raw(lambda why: f"{told} ({why}); {outcome}")

    def _described(self) -> str:
        targets = recorded_targets(self.recorded)
        if targets is None:
            return describe_target(self.recorded)
        return "a transaction over " + ", ".join(f"{t.get('schema')}.{t.get('table')}@{t.get('db')}" for t in targets)

    def before_write(self, options: WriteOptions, branches: int) -> TargetDb:
        """Pre-flight of one write before any of its branches opens; clears stale branches of this sink there.
        ``max_prepared_transactions`` must cover every branch the transaction holds in that server at once."""
        self.guard.ensure()  # taken again if the log's database restarted: the recovery below must spare us
        with self._before_decision("a write's checks and recovery in its database"):
            db = self.target(options)  # its server's identity, read here: the first statement in that database
            with self._lock:
                db.branches += branches
                server = db.server.rsplit("/", 1)[0]  # one server's databases share its max_prepared_transactions
                total = sum(d.branches for d in self.targets.values() if d.server.rsplit("/", 1)[0] == server)
            with db.dialect.connect() as conn:
                db.dialect.check_server(conn, total)
            db.recovery.recover(upto=self.batch_id)  # dead runs' branches of this sink there; ours are guarded
        return db

    def part(self, number: int) -> Part | None:
        """Write ``number``'s part as its tasks recorded it, read back before anything is decided."""
        with self._before_decision(f"reading write {number}'s recorded part"):
            with self.dialect.connect() as conn:
                parts = read_parts(conn, self.journal, self.sink_id, self.batch_id, self.run)
        return next((p for p in parts if p.part == number), None)

    # -- the decision ------------------------------------------------------------------------------
    def commit(self, expected_parts: set[int]) -> tuple[list[Part], dict[str, float]]:
        """Decide over every recorded part, then commit each database's branches; only forward after deciding.

        Every failure before the decision rolls back every part (:meth:`abort`) and raises an xasink error that
        says nothing is visible; a failure after the decision's COMMIT was sent is settled by the log.
        """
        t0 = time.perf_counter()
        by_server = {db.server: db for db in self.targets.values()}
        self._sent = False
        try:
            self.guard.ensure()
            ok, parts, why = self._decide(by_server, expected_parts)
        except Exception as exc:  # leaving locked() sends the decision's COMMIT: a failure there is ambiguous
            if not self._sent:  # an xasink error of a batch not decided keeps its class (ConcurrentWriterError)
                error = type(exc) if isinstance(exc, BatchAbortedError) else BatchAbortedError
                self.fail(f"the decision could not be made ({self.policy.describe(exc)})", exc, error)
            ok, parts, why = True, self._settle(exc), ""
        if not ok:
            self.fail(why, None, ConcurrentWriterError)
        log.info("decided sink %s transaction %s over %d writes", self.sink_id, self.batch_id, len(parts))
        fault("driver.after_decide", batch=self.batch_id)
        t_commit = time.perf_counter()
        deadline = self.policy.deadline()
        first = True
        blocked: list[tuple[Part, CommitIncompleteError]] = []
        unmarked: list[CommitIncompleteError] = []
        for part in parts:  # every database that answers is committed, whichever one does not (only forward)
            try:
                by_server[part.server].recovery.group.commit(part.xids, first_commit_fault=first, deadline=deadline)
            except CommitIncompleteError as exc:
                blocked.append((part, exc))
                continue
            first = first and not part.xids
            try:
                self._forward(f"marking write {part.part} committed", partial(self._mark_part, part), deadline)
            except CommitIncompleteError as exc:
                unmarked.append(exc)
        if blocked:
            left = still_to_recover([(p.server, p.target) for p, _ in blocked], self.log_server)
            raise CommitIncompleteError(self._incomplete(left, blocked[0][1])) from blocked[0][1]
        if unmarked:  # every branch is committed (the rows are visible); the log says so once recovery marks it
            raise unmarked[0]
        fault("driver.after_commits", batch=self.batch_id)
        commit_s = time.perf_counter() - t_commit
        self._forward("marking it committed", lambda: self._mark(int(commit_s * 1000)), deadline)
        fault("driver.after_mark", batch=self.batch_id)
        t_sweep = time.perf_counter()
        for db in self.targets.values():
            db.recovery.after_commit(self.batch_id, db.retention)  # sweep and trim: a failure is a warning
        timings = {"decide": t_commit - t0, "commit": commit_s, "sweep": time.perf_counter() - t_sweep}
        return parts, timings

    def _mark_part(self, part: Part) -> None:
        with self.dialect.connect() as conn:
            mark_parts_committed(conn, self.journal, [part])

    def _mark(self, commit_ms: int) -> None:
        with self.dialect.connect() as conn:
            self.journal.mark_committed(conn, self.sink_id, self.batch_id, commit_ms)

    def _forward(self, what: str, step: Callable[[], None], deadline: float) -> None:
        """A step after the decision: retried until commitTimeout; its failure is :class:`CommitIncompleteError`
        (the transaction is decided: recovery finishes it), never an error that says nothing happened."""
        try:
            self.policy.forward(f"sink {self.sink_id} transaction {self.batch_id}: {what}", step, deadline)
        except (CommitIncompleteError, JournalError):
            raise
        except Exception as exc:
            raise CommitIncompleteError(self._incomplete(f"{what} in the decision log failed", exc)) from exc

    def _incomplete(self, what: str, exc: BaseException) -> str:
        return (
            f"sink {self.sink_id} transaction {self.batch_id} is decided, but {what} ({self.policy.describe(exc)}). "
            "The decision is durable: the next run of this sink, or 'xasink recover' on each database (with "
            "--journal-url where the log is elsewhere), finishes it; no row is lost or doubled. Do not rerun it "
            "under another sink_id: its rows would be written twice"
        )

    def _decide(self, by_server: dict[str, TargetDb], expected_parts: set[int]) -> tuple[bool, list[Part], str]:
        """Under the log's sink lock: record the one decision if this run holds the batch, every write recorded
        its part and every part's branches are still prepared in their databases; else say why not."""
        with self.journal.locked(self.sink_id) as conn:
            state = self.journal.decision_state(conn, self.sink_id, self.batch_id, self.run)
            parts = read_parts(conn, self.journal, self.sink_id, self.batch_id, self.run)
            missing_parts = expected_parts - {p.part for p in parts}
            missing: list[Xid] = []
            for server in {p.server for p in parts}:
                db = by_server[server]
                with db.dialect.connect() as tconn:
                    prepared = {p.xid for p in db.dialect.list_prepared(tconn)}
                missing += [x for p in parts if p.server == server for x in p.xids if x not in prepared]
            if state.decision is not None:
                return False, parts, "another writer decided it first"
            if state.mine is not False:  # this run claimed the transaction when it began: it must hold it still
                return False, parts, "a newer writer with the same sink_id took it over"
            if missing_parts:
                return False, parts, f"writes {sorted(missing_parts)} recorded no branches"
            if missing:
                why = f"{len(missing)} prepared branches vanished before the decision (e.g. {missing[0]})"
                return False, parts, why
            fault("driver.before_decide", batch=self.batch_id)
            xids = tuple(sorted(x for p in parts for x in p.xids))
            record = BatchRecord(
                self.sink_id,
                self.batch_id,
                "committing",
                xids,
                sum(p.rows for p in parts),
                len(xids),
                max((p.prepare_ms for p in parts), default=0),
            )
            target = multi_target(parts)
            if self.query is not None or self.blind:
                query = self.query or UNKNOWN_QUERY  # unknown matches no query: never taken for a replay later
                target = json.dumps({**json.loads(target), "query": query}, sort_keys=True)
            self.journal.record_decision(conn, state, record, self.run, target)
            self._sent = True
        return True, parts, ""

    def _settle(self, cause: Exception) -> list[Part]:
        """The decision was sent but not confirmed: read the log again (under the sink lock, so the broken
        session's transaction has ended), retried within commitTimeout, and follow it; never guess."""
        log.warning(
            "sink %s transaction %s: the decision was not confirmed (%s); reading the log again",
            self.sink_id,
            self.batch_id,
            self.policy.describe(cause),
        )

        def reread() -> tuple[BatchRecord | None, list[Part]]:
            with self.journal.locked(self.sink_id) as conn:
                found = self.journal.decided_by(conn, self.sink_id, self.batch_id, self.run)
                return found, read_parts(conn, self.journal, self.sink_id, self.batch_id, self.run)

        what = f"re-reading the decision of sink {self.sink_id} transaction {self.batch_id}"
        try:
            found, parts = self.policy.forward(what, reread, self.policy.deadline())
        except Exception as exc:
            raise DecisionUnknownError(
                f"sink {self.sink_id} transaction {self.batch_id}: the connection broke while the decision was "
                f"committed and the decision log could not be read again ({self.policy.describe(exc)}). Run it "
                "again with the same sink_id and batch_id, or run 'xasink recover' on each database (with "
                "--journal-url where the log is elsewhere): either finishes it if it was decided and rolls it "
                "back if not"
            ) from exc
        # this run's own decision (it still holds its claim: nobody takes a decided batch over; never one whose
        # runs merely include this run's, as an empty decision of a newer writer has no runs at all) lists
        # exactly the branches of its parts.  Found, it is only ever finished forward, never aborted
        if found is not None:
            if set(found.xids) != {x for p in parts for x in p.xids}:
                raise JournalError(
                    f"sink {self.sink_id} transaction {self.batch_id}: the decision log holds this run's decision, "
                    "but its branches are not those of the run's recorded writes: someone changed the log's "
                    f"{self.journal.batches.fullname} or its parts table. The decision stands; 'xasink recover' on "
                    "each database finishes it"
                ) from cause
            return parts
        self.fail(
            "the connection broke while the decision was committed, and the log shows this run's decision was "
            "not recorded (none, or another writer's)",
            cause,
        )

    def close(self) -> None:
        self.guard.close()
        for db in self.targets.values():
            db.close()
        self.dialect.dispose()
