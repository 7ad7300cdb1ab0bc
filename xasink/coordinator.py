"""Driver side: decide, commit, sweep, abort, and recover a sink's batches.

The decision (a journal row listing the exact xids) is written under the
sink's row lock after checking every listed branch is still prepared; every
roll-back of an undecided branch happens under the same lock.  So a batch is
either decided with all its branches intact, or its branches are rolled back
and it can never be decided (DESIGN invariant 4).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from .dialects import dialect_for
from .dialects.base import Dialect, ErrorKind
from .errors import BatchAbortedError, CommitIncompleteError, ConcurrentWriterError, ConnectError
from .faults import fault
from .journal import BatchRecord, Journal
from .options import WriteOptions
from .results import BranchOutcome, WriteResult
from .xid import Xid

log = logging.getLogger(__name__)


@dataclass
class RecoveryReport:
    committed: list[Xid] = field(default_factory=list)
    rolled_back: list[Xid] = field(default_factory=list)
    finished_batches: list[int] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.committed or self.rolled_back or self.finished_batches)


class Coordinator:
    """One sink's coordinator; cheap to create, holds no state between calls but a connection pool."""

    def __init__(self, options: WriteOptions, dialect: Dialect | None = None) -> None:
        self.options = options
        self.sink_id = options.sink_id
        # check_server reads the branch settings; the pool serves the commit's parallel COMMITs and its journal steps
        self.dialect = dialect or dialect_for(options.url, options.branch_settings, options.commit_parallelism + 2)
        self.journal = Journal(self.dialect, options.journal_schema, options.journal_prefix)

    def close(self) -> None:
        self.dialect.dispose()

    # -- set-up -------------------------------------------------------------------
    def preflight(self, branches: int | None = None) -> None:
        """Check the server can hold the branches, and create the journal tables on first use."""
        with self.dialect.connect() as conn:
            self.dialect.check_server(conn, branches)
        self.journal.ensure()

    # -- commit ---------------------------------------------------------------------
    def commit(self, batch_id: int, outcomes: Sequence[BranchOutcome | None]) -> WriteResult:
        """Decide and commit a batch whose tasks all reported; finish it instead if it was decided before."""
        t0 = time.perf_counter()
        if any(o is None for o in outcomes):
            self.abort(batch_id, outcomes)
            raise BatchAbortedError(f"sink {self.sink_id} batch {batch_id}: a task did not report; batch rolled back")
        done = [o for o in outcomes if o is not None]
        prepare_s = max((o.seconds for o in done), default=0.0)
        with self.dialect.connect() as conn:
            existing = self.journal.get(conn, self.sink_id, batch_id)
        if existing is not None:
            return self._replayed(existing, t0)
        xids = [o.xid for o in done if o.xid is not None]
        rows = sum(o.rows for o in done if o.gid)
        if any(o.skipped for o in done):  # a task saw a decision that is gone now: journal trimmed or tampered
            self.abort(batch_id, outcomes)
            raise BatchAbortedError(
                f"sink {self.sink_id} batch {batch_id}: tasks saw a decision the journal no "
                "longer holds; batch rolled back, run it again"
            )
        fault("driver.before_decide", batch=batch_id)
        t_decide = time.perf_counter()
        record = BatchRecord(
            self.sink_id, batch_id, "committing", tuple(sorted(xids)), rows, len(xids), int(prepare_s * 1000)
        )
        self._decide(record)
        fault("driver.after_decide", batch=batch_id)
        t_commit = time.perf_counter()
        self._commit_branches(record.xids, first_commit_fault=True)
        fault("driver.after_commits", batch=batch_id)
        commit_ms = int((time.perf_counter() - t_commit) * 1000)
        with self.dialect.connect() as conn:
            self.journal.mark_committed(conn, self.sink_id, batch_id, commit_ms)
        fault("driver.after_mark", batch=batch_id)
        t_sweep = time.perf_counter()
        self.recover(upto=batch_id)
        self._trim()
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

    def _replayed(self, existing: BatchRecord, t0: float) -> WriteResult:
        log.info(
            "sink %s batch %s was already decided: finishing it, writing nothing new", self.sink_id, existing.batch_id
        )
        self.recover(upto=existing.batch_id)
        return WriteResult(
            self.sink_id, existing.batch_id, existing.rows, existing.branches, True, {"total": time.perf_counter() - t0}
        )

    def _decide(self, record: BatchRecord) -> None:
        """Record the decision under the sink lock, after checking every listed branch is still prepared."""
        with self.journal.locked(self.sink_id) as conn:
            other = self.journal.get(conn, self.sink_id, record.batch_id)
            prepared = {p.xid for p in self.dialect.list_prepared(conn) if p.xid is not None}
            missing = [x for x in record.xids if x not in prepared]
            holder = self.journal.holder(conn, self.sink_id, record.batch_id)
            taken_over = holder is not None and any(x.run != holder for x in record.xids)
            if other is None and not missing and not taken_over:
                self.dialect.durable_commit(conn)
                self.journal.insert_decision(conn, record)
                log.info(
                    "decided sink %s batch %s: %d branches, %d rows",
                    self.sink_id,
                    record.batch_id,
                    record.branches,
                    record.rows,
                )
                return
            doomed = [x for x in record.xids if x in prepared and (other is None or x not in other.xids)]
            self._rollback(doomed)
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

    def _rollback(self, xids: Sequence[Xid]) -> None:
        if not xids:
            return
        with self.dialect.connect(autocommit=True) as xa:
            for xid in xids:
                try:
                    self.dialect.rollback_prepared(xa, xid)
                    log.info("rolled back branch %s", xid)
                except sa.exc.DBAPIError as exc:
                    if self.dialect.classify(exc) != ErrorKind.UNKNOWN_XID:
                        raise
                    xa.rollback()

    def _commit_branches(self, xids: Sequence[Xid], first_commit_fault: bool = False) -> list[Xid]:
        """COMMIT every decided branch in a small pool; transient errors are retried with backoff."""
        if not xids:
            return []
        local = threading.local()
        conns: list[Connection] = []
        lock = threading.Lock()
        committed: list[Xid] = []

        def connection() -> Connection:
            conn = getattr(local, "conn", None)
            if conn is None:
                conn = local.conn = self.dialect.connect(autocommit=True)
                with lock:
                    conns.append(conn)
            return conn

        def commit_one(xid: Xid) -> None:
            for attempt in range(self.options.commit_retries + 1):
                try:
                    self.dialect.commit_prepared(connection(), xid)
                    break
                except Exception as exc:
                    kind = ErrorKind.TRANSIENT if isinstance(exc, ConnectError) else self.dialect.classify(exc)
                    if kind == ErrorKind.UNKNOWN_XID:
                        log.info("branch %s unknown to the server: committed by an earlier attempt", xid)
                        break
                    if kind != ErrorKind.TRANSIENT or attempt == self.options.commit_retries:
                        raise
                    log.warning("commit of %s failed (%s), retry %d", xid, exc.__class__.__name__, attempt + 1)
                    old = getattr(local, "conn", None)
                    local.conn = None
                    if old is not None:
                        try:
                            old.invalidate()
                        except Exception:  # noqa: BLE001,S110
                            pass
                    time.sleep(min(5.0, 0.1 * 2**attempt) * (0.5 + random.random()))
            with lock:
                committed.append(xid)
                first = len(committed) == 1
            if first and first_commit_fault:
                fault("driver.after_first_commit", batch=xid.batch_id)

        workers = max(1, min(self.options.commit_parallelism, len(xids)))
        try:
            with ThreadPoolExecutor(workers, thread_name_prefix="xasink-commit") as pool:
                futures = [pool.submit(commit_one, x) for x in xids]
                errors = [f.exception() for f in futures if f.exception() is not None]
        finally:
            for conn in conns:
                conn.close()
        if errors:
            raise CommitIncompleteError(
                f"sink {self.sink_id}: {len(errors)} of {len(xids)} decided branches could not be committed yet "
                f"({errors[0]!s:.300}). The decision is durable: the next write of this sink or 'xasink recover' "
                "commits them; no row is lost or doubled."
            ) from errors[0]
        return committed

    # -- abort, sweep, recovery -----------------------------------------------------------
    def abort(
        self,
        batch_id: int,
        outcomes: Sequence[BranchOutcome | None] = (),
        settle_s: float = 0.0,
        run: str | None = None,
    ) -> RecoveryReport:
        """Roll back what a failed batch prepared (and anything else of it that can never commit).

        When Spark aborts a job, tasks still running are cancelled but may PREPARE in the moments
        before their worker is killed (``spark.python.task.killTimeout``, 2 s by default).  With
        ``settle_s`` the sweep is repeated over that window so such late branches are rolled back too.
        ``run`` (else the run of the outcomes' xids) names the aborting writer: when a newer writer has
        taken the batch over, its branches are left to it.
        """
        log.warning("aborting sink %s batch %s", self.sink_id, batch_id)
        if run is None:
            run = next((o.xid.run for o in outcomes if o is not None and o.xid is not None), None)
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
        """
        report = RecoveryReport()
        with self.dialect.connect() as conn:
            pending = [r for r in self.journal.pending(conn, self.sink_id) if upto is None or r.batch_id <= upto]
        for record in pending:
            report.committed += self._commit_branches(record.xids)
            with self.dialect.connect() as conn:
                self.journal.mark_committed(conn, self.sink_id, record.batch_id, None)
            report.finished_batches.append(record.batch_id)
            log.info("recovery finished decided batch %s of sink %s", record.batch_id, self.sink_id)
        to_commit: list[Xid] = []
        with self.journal.locked(self.sink_id) as conn:
            now = self.dialect.server_now(conn)
            mine = [
                p
                for p in self.dialect.list_prepared(conn)
                if p.xid is not None and p.xid.sink_id == self.sink_id and (upto is None or p.xid.batch_id <= upto)
            ]
            decided = self.journal.get_many(conn, self.sink_id, {p.xid.batch_id for p in mine if p.xid})
            holder = self.journal.holder(conn, self.sink_id, upto) if run is not None and upto is not None else None
            undated = {p.xid.batch_id for p in mine if p.xid and p.prepared_at is None} if min_age_s > 0 else set()
            claimed = self.journal.claimed_at(conn, self.sink_id, undated)
            doomed = []
            for p in mine:
                assert p.xid is not None
                if holder not in (None, run) and p.xid.batch_id == upto and p.xid.run == holder:
                    continue  # a newer writer holds this batch now: its branches are its own to decide or abort
                when = p.prepared_at or claimed.get((p.xid.batch_id, p.xid.run))
                action = branch_action(p.xid, decided.get(p.xid.batch_id), age_seconds(now, when), min_age_s)
                if action == COMMIT:
                    to_commit.append(p.xid)
                elif action in (ROLLBACK_UNDECIDED, ROLLBACK_ORPHAN):
                    doomed.append(p.xid)
            self._rollback(doomed)
            report.rolled_back += doomed
        if to_commit:
            report.committed += self._commit_branches(to_commit)
        return report

    def _trim(self) -> None:
        with self.dialect.connect() as conn:
            self.journal.trim(conn, self.sink_id, self.options.journal_retention)


COMMIT = "commit"  # listed in its batch's decision
ROLLBACK_UNDECIDED = "rollback"  # its batch was never decided
ROLLBACK_ORPHAN = "rollback-orphan"  # its batch was decided without it (a losing or stale attempt)
WAIT = "wait"  # undecided but young: a live batch may still decide it


def branch_action(xid: Xid, decision: BatchRecord | None, age_s: float | None, min_age_s: float = 0.0) -> str:
    """What recovery does with one prepared branch of ours; the single rule both recovery and its dry run use."""
    if decision is not None:
        return COMMIT if xid in decision.xids else ROLLBACK_ORPHAN
    if min_age_s > 0 and age_s is not None and age_s < min_age_s:
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
