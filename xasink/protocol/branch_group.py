"""Operations on a group of branches: COMMIT every decided branch in lanes, roll back many.

Kept apart from the coordinator's decisions, as Flink keeps its XA group operations apart from its facade:
the coordinator and recovery decide what to finish, a :class:`BranchGroup` finishes it, with the dialect's
connections and the sink's :class:`~xasink.protocol.retry.RetryPolicy`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor, wait

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from xasink.dialects.base import Dialect
from xasink.dialects.values import ErrorKind
from xasink.errors import CommitIncompleteError, ConnectError
from xasink.protocol.retry import RetryPolicy
from xasink.protocol.xid import Xid
from xasink.support.faults import armed, fault

log = logging.getLogger("xasink.protocol.coordinator")  # the coordinator's steps: logged under its name

ABORT_RETRY_S = 5.0  # how long a run's own roll-back retries a database that does not answer before it says so

_COMMIT_THREADS: ThreadPoolExecutor | None = None
_COMMIT_THREADS_LOCK = threading.Lock()


def _commit_threads() -> ThreadPoolExecutor:
    """The process's commit threads: made on first use, kept (idle) for the next batch's commit.

    A lane never waits for another lane or another commit, so coordinators committing at once in one process
    (threads) only queue for a thread; none can starve another into a deadlock.
    """
    global _COMMIT_THREADS
    with _COMMIT_THREADS_LOCK:
        if _COMMIT_THREADS is None:
            _COMMIT_THREADS = ThreadPoolExecutor(32, thread_name_prefix="xasink-commit")
        return _COMMIT_THREADS


class BranchGroup:
    """COMMIT or roll back many prepared branches of one sink in one database."""

    def __init__(self, dialect: Dialect, policy: RetryPolicy, parallelism: int) -> None:
        self.dialect = dialect
        self.policy = policy
        self.parallelism = parallelism

    def rollback(self, xids: Sequence[Xid]) -> None:
        """ROLLBACK each branch on one connection; one the server no longer knows is gone already."""
        if not xids:
            return
        with self.dialect.connect(autocommit=True) as xa:
            self.dialect.before_finishing(xids)
            for xid in xids:
                try:
                    self.dialect.rollback_prepared(xa, xid)
                    log.info("rolled back branch %s", xid)
                except sa.exc.DBAPIError as exc:
                    if self.dialect.classify(exc) != ErrorKind.UNKNOWN_XID:
                        raise
                    xa.rollback()

    def roll_back_run(self, log_id: str, batch_id: int, run: str, within_s: float = ABORT_RETRY_S) -> int:
        """Roll back every branch of ``run`` of this sink's ``batch_id`` prepared here, retrying a database that
        does not answer for ``within_s``; how many there were.

        Without the log's sink lock: only for a run that did not decide and never will (a decision lists the
        deciding run's own branches only, under its claim, so no decision can race this roll-back).  So it
        works while another session holds the lock, or the log's database does not answer.
        """

        def once() -> int:
            with self.dialect.connect(autocommit=True) as conn:
                mine = [
                    p.xid
                    for p in self.dialect.list_prepared(conn)
                    if p.xid is not None
                    and p.xid.log_id == log_id
                    and p.xid.sink_id == self.policy.sink_id
                    and p.xid.batch_id == batch_id
                    and p.xid.run == run
                ]
            self.rollback(mine)
            return len(mine)

        what = f"rolling back run {run}'s branches in {self.dialect.where()}"
        return self.policy.forward(what, once, time.monotonic() + within_s)

    def roll_back_run_over(self, log_id: str, batch_id: int, run: str, over_s: float = 0.0) -> None:
        """:meth:`roll_back_run` now and each second for ``over_s`` (a run that never decides, while its tasks
        may still PREPARE); a failure is logged: the next run of the sink or 'xasink recover' does it."""
        deadline = time.monotonic() + over_s
        while True:
            try:
                self.roll_back_run(log_id, batch_id, run)
            except Exception as exc:  # noqa: BLE001 - logged; the branches wait for the next sweep
                why = self.policy.describe(exc)
                log.warning("sink %s batch %s: rolling back run %s failed: %s", self.policy.sink_id, batch_id, run, why)
            if time.monotonic() >= deadline:
                return
            time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))

    def commit(self, xids: Sequence[Xid], first_commit_fault: bool = False, deadline: float | None = None) -> list[Xid]:
        """COMMIT every decided branch (:func:`commit_branches`)."""
        return commit_branches(self.dialect, self.policy, self.parallelism, xids, first_commit_fault, deadline)


def commit_branches(
    dialect: Dialect,
    policy: RetryPolicy,
    parallelism: int,
    xids: Sequence[Xid],
    first_commit_fault: bool = False,
    deadline: float | None = None,
) -> list[Xid]:
    """COMMIT every decided branch in ``parallelism`` lanes; transient errors are retried with backoff until
    ``deadline`` (time.monotonic; default commitTimeout from now), or ``commitRetries`` times if set."""
    if not xids:
        return []
    t0 = time.monotonic()
    if deadline is None:
        deadline = policy.deadline()
    local = threading.local()
    conns: list[Connection] = []
    lock = threading.Lock()
    committed: list[Xid] = []

    def connection() -> Connection:
        conn = getattr(local, "conn", None)
        if conn is None:
            conn = local.conn = dialect.connect(autocommit=True)
            with lock:
                conns.append(conn)
        return conn

    def commit_once(xid: Xid) -> None:
        try:
            dialect.commit_prepared(connection(), xid)
        except Exception as exc:
            if not isinstance(exc, ConnectError) and dialect.classify(exc) == ErrorKind.UNKNOWN_XID:
                log.info("branch %s unknown to the server: committed by an earlier attempt", xid)
                return
            if policy.transient(exc):  # the next try starts on a fresh connection
                old = getattr(local, "conn", None)
                local.conn = None
                if old is not None:
                    try:
                        old.invalidate()
                    except Exception:  # noqa: BLE001,S110
                        pass
            raise

    def commit_one(xid: Xid) -> None:
        policy.forward(f"commit of {xid}", lambda: commit_once(xid), deadline, policy.retries)
        with lock:
            committed.append(xid)
            first = len(committed) == 1
        if first and first_commit_fault:
            fault("driver.after_first_commit", batch=xid.batch_id)

    def lane(chunk: Sequence[Xid]) -> list[BaseException]:
        failed: list[BaseException] = []
        for xid in chunk:
            try:
                commit_one(xid)
            except Exception as exc:  # noqa: BLE001 - reported below, with the other lanes' failures
                failed.append(exc)
        return failed

    # commitParallelism lanes: the first runs here, the others on threads kept for the process (a new
    # thread per lane and batch costs a scheduler round on a busy executor, on every batch's commit)
    errors: list[BaseException] = []
    pending = list(xids)
    try:
        dialect.before_finishing(xids)  # MariaDB: every owner's exit seen at once, not per verb
        if first_commit_fault and armed("driver.after_first_commit"):  # a test's kill lands between commits
            errors += lane(pending[:1])
            pending = pending[1:]
        workers = max(1, min(parallelism, len(pending)))
        lanes = [pending[i::workers] for i in range(workers)]
        futures = [_commit_threads().submit(lane, chunk) for chunk in lanes[1:]]
        try:
            errors += lane(lanes[0])
        finally:
            wait(futures)  # no lane may outlive its connections
        for f in futures:
            errors += f.result()
    finally:
        for conn in conns:
            _close_after_round(conn)
    if errors:
        batches = sorted({x.batch_id for x in xids})
        which = f"batch {batches[0]} is" if len(batches) == 1 else f"batches {', '.join(map(str, batches))} are"
        raise CommitIncompleteError(
            f"sink {policy.sink_id} {which} decided: {len(errors)} of {len(xids)} decided branches could not be "
            f"committed yet after {time.monotonic() - t0:.0f} s of retries (commitTimeout "
            f"{policy.timeout_s} s; {policy.describe(errors[0])}). The decision is durable: the "
            f"next run of this sink (sinkId '{policy.sink_id}') or 'xasink recover' commits the rest; no row is "
            "lost or doubled. Do not rerun it under another sink id: its rows would be written twice."
        ) from errors[0]
    return committed


def _close_after_round(conn: Connection) -> None:
    """Close a commit round's connection.  Its close rolls back the transaction the driver opened around the
    autocommit statements; if the server went away after the last COMMIT answered (a restart), that fails,
    but what the round committed stands: the failure is logged, never the round's error."""
    try:
        conn.close()
    except Exception as exc:  # noqa: BLE001 - the connection is gone; the commits it answered are durable
        log.info("a commit round's connection was lost before it closed: %s", type(exc).__name__)
        try:
            conn.invalidate()
        except Exception:  # noqa: BLE001,S110 - nothing left to release
            pass
