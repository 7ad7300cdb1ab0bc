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
from dataclasses import replace

from xasink.dialects import dialect_for
from xasink.errors import (
    BatchAbortedError,
    BatchIdentityError,
    CommitIncompleteError,
    ConcurrentWriterError,
    DecisionUnknownError,
    ForgottenBatchError,
    OptionError,
    ReplayIncompleteError,
)
from xasink.journal.log import Journal
from xasink.journal.parts import (
    Part,
    ensure_parts,
    mark_parts_committed,
    multi_target,
    read_parts,
    recorded_targets,
)
from xasink.journal.records import BatchRecord
from xasink.journal.targets import UNKNOWN_QUERY, describe_target, forgotten_message, target_identity
from xasink.options import WriteOptions
from xasink.protocol.liveness import InProcessGuard
from xasink.protocol.recovery import sink_recovery
from xasink.protocol.xid import Xid, new_run_nonce
from xasink.support.faults import fault

log = logging.getLogger(__name__)


class TargetDb:
    """One database the transaction writes into: its branches there, finished by the decisions in the log."""

    def __init__(self, options: WriteOptions, journal: Journal) -> None:
        self.dialect = dialect_for(options.url, options.branch_settings, options.control_pool_size)
        self.recovery = sink_recovery(options, self.dialect, journal)
        self.retention = options.journal_retention
        with self.dialect.connect() as conn:
            self.server = self.dialect.server_identity(conn)
        self.branches = 0  # planned so far: what max_prepared_transactions must cover

    def close(self) -> None:
        self.dialect.dispose()


class MultiCoordinator:
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
        self.run = new_run_nonce()
        self.targets: dict[str, TargetDb] = {}  # by URL (with user): one coordinator per database
        self.recorded: str | None = None  # set when (sink, batch) is decided already: a replay
        self.replay = False
        self._lock = threading.Lock()
        self._sent = False  # the decision's COMMIT was sent: a failure from then on is ambiguous
        self.journal.ensure()
        ensure_parts(self.journal)
        self.log_id = self.journal.log_id()
        with self.dialect.connect() as conn:
            self.log_server = self.dialect.server_identity(conn)
        self.guard = InProcessGuard(self.dialect, self.log_id, self.run)
        try:
            self._claim()
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
                opts = replace(
                    options,
                    journal_schema=self.log_options.journal_schema,
                    journal_prefix=self.log_options.journal_prefix,
                )
                found = TargetDb(opts, self.journal)
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

    def _described(self) -> str:
        targets = recorded_targets(self.recorded)
        if targets is None:
            return describe_target(self.recorded)
        return "a transaction over " + ", ".join(f"{t.get('schema')}.{t.get('table')}@{t.get('db')}" for t in targets)

    def before_write(self, options: WriteOptions, branches: int) -> TargetDb:
        """Pre-flight of one write before any of its branches opens; clears stale branches of this sink there.

        ``max_prepared_transactions`` must cover every branch the transaction holds in that server at once.
        """
        self.guard.ensure()  # taken again if the log's database restarted: the recovery below must spare us
        db = self.target(options)
        with self._lock:
            db.branches += branches
            server = db.server.rsplit("/", 1)[0]  # one server's databases share its max_prepared_transactions
            total = sum(d.branches for d in self.targets.values() if d.server.rsplit("/", 1)[0] == server)
        with db.dialect.connect() as conn:
            db.dialect.check_server(conn, total)
        db.recovery.recover(upto=self.batch_id)  # dead runs' branches of this sink there; ours are guarded
        return db

    def part(self, number: int) -> Part | None:
        with self.dialect.connect() as conn:
            found = [
                p for p in read_parts(conn, self.journal, self.sink_id, self.batch_id, self.run) if p.part == number
            ]
        return found[0] if found else None

    # -- the decision ------------------------------------------------------------------------------
    def commit(self, expected_parts: set[int]) -> tuple[list[Part], dict[str, float]]:
        """Decide over every recorded part, then commit each database's branches; only forward after deciding."""
        t0 = time.perf_counter()
        self.guard.ensure()
        by_server = {db.server: db for db in self.targets.values()}
        self._sent = False
        try:
            ok, parts, why = self._decide(by_server, expected_parts)
        except Exception as exc:  # leaving locked() sends the decision's COMMIT: a failure there is ambiguous
            if not self._sent:
                raise
            ok, parts, why = True, self._settle(exc), ""
        if not ok:
            self.abort()
            raise ConcurrentWriterError(
                f"sink {self.sink_id} transaction {self.batch_id}: {why}; every branch of this transaction was "
                "rolled back and nothing of it is visible"
            )
        log.info("decided sink %s transaction %s over %d writes", self.sink_id, self.batch_id, len(parts))
        fault("driver.after_decide", batch=self.batch_id)
        t_commit = time.perf_counter()
        first = True
        for part in parts:
            db = by_server[part.server]
            db.recovery.group.commit(part.xids, first_commit_fault=first)
            first = first and not part.xids
            with self.dialect.connect() as conn:
                mark_parts_committed(conn, self.journal, [part])
        fault("driver.after_commits", batch=self.batch_id)
        commit_s = time.perf_counter() - t_commit
        with self.dialect.connect() as conn:
            self.journal.mark_committed(conn, self.sink_id, self.batch_id, int(commit_s * 1000))
        fault("driver.after_mark", batch=self.batch_id)
        t_sweep = time.perf_counter()
        for db in self.targets.values():
            db.recovery.after_commit(self.batch_id, db.retention)  # sweep and trim: a failure is a warning
        timings = {"decide": t_commit - t0, "commit": commit_s, "sweep": time.perf_counter() - t_sweep}
        return parts, timings

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
                return (
                    False,
                    parts,
                    f"{len(missing)} prepared branches vanished before the decision (e.g. {missing[0]})",
                )
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
        session's transaction has ended) and follow it; never guess."""
        log.warning(
            "sink %s transaction %s: the decision was not confirmed (%s); reading the log again",
            self.sink_id,
            self.batch_id,
            type(cause).__name__,
        )
        try:
            with self.journal.locked(self.sink_id) as conn:
                found = self.journal.decided_by(conn, self.sink_id, self.batch_id, self.run)
                parts = read_parts(conn, self.journal, self.sink_id, self.batch_id, self.run)
        except Exception as exc:
            raise DecisionUnknownError(
                f"sink {self.sink_id} transaction {self.batch_id}: the connection broke while the decision was "
                "committed and the decision log could not be read again. Run it again with the same sink_id and "
                "batch_id, or run 'xasink recover' on each database (with --journal-url where the log is "
                "elsewhere): either finishes it if it was decided and rolls it back if not"
            ) from exc
        # this run's own decision (it still holds its claim), with exactly the branches of its parts: never
        # one whose runs merely include this run's (an empty decision of a newer writer has no runs at all)
        if found is not None and set(found.xids) == {x for p in parts for x in p.xids}:
            return parts
        self.abort()
        raise BatchAbortedError(
            f"sink {self.sink_id} transaction {self.batch_id}: the connection broke while the decision was "
            "committed, and the log shows this run's decision was not recorded (none, or another writer's); "
            "every branch of this run was rolled back"
        ) from cause

    def abort(self) -> None:
        """End the run (its late branches roll themselves back) and roll back its branches in every database."""
        log.info("aborting sink %s transaction %s", self.sink_id, self.batch_id)  # the caller is told by its error
        with self.journal.locked(self.sink_id) as conn:
            if self.journal.get(conn, self.sink_id, self.batch_id) is None:  # decided by another: ours are orphans
                self.journal.end_run(conn, self.sink_id, self.batch_id, self.run)
        for db in self.targets.values():
            db.recovery.recover(upto=self.batch_id)

    def finish_replay(self) -> None:
        """A replay of a decided transaction: finish what a crashed run left in the databases written now.

        Told "skipped" only if that worked: a part that could not be finished yet is
        :class:`ReplayIncompleteError` (the rows are not all there yet; recovery finishes them).
        """
        unfinished: list[str] = []
        for db in self.targets.values():
            try:
                report = db.recovery.recover(upto=self.batch_id)
            except CommitIncompleteError as exc:  # another decided batch of the pass could not be finished
                unfinished.append(f"{db.server}: {type(exc).__name__}: {exc}")
                continue
            if self.batch_id in report.unfinished:
                unfinished.append(f"{db.server}: {report.unfinished[self.batch_id]}")
        if unfinished:
            raise ReplayIncompleteError(
                f"sink {self.sink_id} transaction {self.batch_id} was decided by another run (this run's rows are "
                f"not part of it), and finishing it failed ({'; '.join(unfinished)}); it stays decided: the next "
                "run of this sink or 'xasink recover' finishes it; no row is lost or doubled"
            )

    def close(self) -> None:
        self.guard.close()
        for db in self.targets.values():
            db.close()
        self.dialect.dispose()
