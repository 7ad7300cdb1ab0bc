"""The apply step of a decided batch of a write mode (overwrite, replaceWhere, change-data apply).

:mod:`xasink.write_modes.statements` holds the statements; this is what runs them after the decision, for the
driver's commit and for recovery alike: in one local transaction with the batch's mark, retried through transient
errors like the branches' commits, and withdrawn when no retry can help, so the target keeps its rows.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from xasink.dialects.base import Dialect
from xasink.dialects.values import ErrorKind
from xasink.errors import ApplyError, CommitIncompleteError, JournalError, XasinkError
from xasink.journal.log import Journal
from xasink.journal.records import BatchRecord
from xasink.journal.targets import deciding_run
from xasink.protocol.renamed_overwrite import RenamedOverwrite
from xasink.protocol.retry import RetryPolicy
from xasink.protocol.xid import Xid
from xasink.write_modes.shadow import decided_rows
from xasink.write_modes.spec import OVERWRITE, ApplySpec
from xasink.write_modes.statements import apply_lock_name, apply_statements, clear_batch, session_schema

log = logging.getLogger(__name__)


class ApplyStep:
    """Runs a decided batch's apply for one sink: the decision log's database holds the target and its shadow."""

    def __init__(self, journal: Journal, policy: RetryPolicy, sink_id: str) -> None:
        self.journal = journal
        self.policy = policy
        self.sink_id = sink_id

    def apply(
        self, batch_id: int, spec: ApplySpec, xids: Sequence[Xid], commit_ms: int | None, deadline: float
    ) -> None:
        """Replace the target's rows from the shadow and mark the batch committed, in one local transaction.

        ``xids`` is the decision this run finishes: once another run withdrew it (its rows proven wrong), the
        batch may be decided again by a newer writer, whose decision this run neither applies nor withdraws nor
        reports as its own.

        Transient errors are retried like the commits (the branches are committed into the shadow, so the
        batch is only ever finished, by this run or by recovery).  Only a proven property of the rows (a
        constraint of the table they violate, a row outside replaceWhere: the dialect's ``ErrorKind.ROWS``, or
        the apply's own :class:`ApplyError`) withdraws the decision: the target keeps its rows.  Anything else
        (a timeout, a cancellation, a read-only or full server, a missing privilege) leaves the batch decided:
        :class:`CommitIncompleteError`, naming the batch and what blocked it; a later run or recover finishes it.
        """
        dialect = self.journal.dialect
        sent = False  # an apply's COMMIT was sent and no answer came: it may have taken effect
        in_place = False  # a rename of this batch was refused: its tries go in place from then on

        def step() -> bool:
            nonlocal sent, in_place
            with dialect.connect() as conn:
                lock = apply_lock_name(spec, session_schema(conn))
                if dialect.apply_isolation is not None:
                    conn.execution_options(isolation_level=dialect.apply_isolation)
                conn.begin()
                try:
                    # first the sink and target's apply lock: two applies of one sink (a backfill beside the
                    # stream) never interleave, so the result is that of one after the other
                    dialect.lock_apply(conn, lock)
                    decided = self.journal.get(conn, self.sink_id, batch_id)
                    sent = False  # read after any earlier COMMIT: the log now says which way that went
                    renamed = self._renamed(spec, batch_id, xids)
                    if renamed is not None:
                        sent = True  # (from its rename on, the table shows the batch's rows)
                        done = renamed.apply(
                            conn, decided, lambda c, d: self._same(c, d, xids), commit_ms, rename=not in_place
                        )
                        sent = False
                        in_place = done is None  # (its next tries too: the table would only be built again)
                        if done is not None:
                            if done:
                                log.info(
                                    "sink %s batch %s: %s (%d rows, by a swap)",
                                    self.sink_id,
                                    batch_id,
                                    spec.describe(),
                                    renamed.rows,
                                )
                            return done
                    if not self._same(conn, decided, xids) or not self.journal.mark_within(
                        conn, self.sink_id, batch_id, commit_ms
                    ):
                        conn.rollback()
                        return False
                    dialect.durable_commit(conn)
                    rows = apply_statements(dialect, conn, spec, batch_id, decided_rows(dialect, conn, spec, xids))
                    sent = True
                    try:
                        conn.commit()
                    except sa.exc.DBAPIError as exc:  # the server's answer: the COMMIT did not take effect
                        sent = bool(exc.connection_invalidated)  # a lost connection: it may have
                        raise
                    sent = False
                except BaseException:
                    conn.rollback()
                    raise
                finally:
                    _unlock(dialect, conn, lock)
                log.info("sink %s batch %s: %s (%d rows)", self.sink_id, batch_id, spec.describe(), rows)
            return True

        what = f"applying sink {self.sink_id} batch {batch_id} ({spec.describe()})"
        try:
            if not self.policy.forward(what, step, deadline):
                # applied already, or withdrawn: which one, the log says (read again through transient errors)
                ours = self._outcome(batch_id, spec, xids, deadline)
                if not ours:  # withdrawn (and perhaps decided again by a newer writer since)
                    raise ApplyError(
                        f"sink {self.sink_id} batch {batch_id}: another run found it could not {spec.describe()} "
                        "and withdrew the decision; the table keeps its rows"
                    )
                log.info(
                    "sink %s batch %s was applied already (by a recovery run, or by this run's COMMIT whose "
                    "answer was lost)",
                    self.sink_id,
                    batch_id,
                )
        except ApplyError as exc:
            if not self._withdraw(batch_id, spec, xids, str(exc), deadline):
                return  # another run applied it meanwhile: its rows are visible
            raise
        except Exception as exc:
            server = isinstance(exc, sa.exc.DBAPIError)
            if not server and not self.policy.transient(exc) and isinstance(exc, XasinkError):
                raise  # it says what it is; the batch stays decided
            # not the server's answer (a transient error of xasink's own: the apply lock not granted, no
            # connection; or the driver's, as SQLAlchemy's PendingRollbackError) is not about the rows either:
            # the writer is told the batch is decided, never the raw error, and recovery counts it unfinished
            if not server or dialect.classify(exc) != ErrorKind.ROWS:
                # not about the rows: the batch stays decided and is only ever finished forward
                within = f"within commitTimeout ({self.policy.timeout_s} s: " if self.policy.transient(exc) else "("
                table = (
                    "the table may already show its new rows (the step's COMMIT was sent and its answer lost) or "
                    "still its old ones"
                    if sent
                    else "the table still holds its old rows"
                )
                raise CommitIncompleteError(
                    f"sink {self.sink_id} batch {batch_id} is decided and its rows are loaded, but the step that "
                    f"makes them visible ({spec.describe()}) failed {within}{self.policy.describe(exc)}); "
                    f"{table}. The next run of this sink (sinkId '{self.sink_id}') or "
                    "'xasink recover' finishes it once that is fixed; no row is lost or doubled."
                ) from exc
            reason = self.policy.describe(exc)
            if not self._withdraw(batch_id, spec, xids, reason, deadline):
                return  # another run applied it meanwhile: its rows are visible
            raise ApplyError(
                f"sink {self.sink_id} batch {batch_id}: could not {spec.describe()}: {reason}. The table keeps "
                "its old rows and nothing of this batch is visible; fix the data (or the table) and run it again"
            ) from None

    def _outcome(self, batch_id: int, spec: ApplySpec, xids: Sequence[Xid], deadline: float) -> bool:
        """After a step that found nothing left to apply: True if the log holds this run's decision applied,
        False if it was withdrawn.  Unreadable until ``deadline``: :class:`CommitIncompleteError` that says the
        batch was finished either way, never "the table still holds its old rows", which may be false."""

        def read() -> bool:
            with self.journal.dialect.connect() as conn:
                return self._same(conn, self.journal.get(conn, self.sink_id, batch_id), xids)

        what = f"reading sink {self.sink_id} batch {batch_id} from the decision log"
        try:
            return self.policy.forward(what, read, deadline)
        except Exception as exc:
            if isinstance(exc, XasinkError) and not self.policy.transient(exc):
                raise
            raise CommitIncompleteError(
                f"sink {self.sink_id} batch {batch_id} ({spec.describe()}) was finished by another run or by this "
                "run's own COMMIT, whose answer was lost: the table shows either this batch's rows (applied) or "
                "its old rows (the decision withdrawn, nothing of the batch visible), and reading the decision "
                f"log to tell which failed ({self.policy.describe(exc)}). 'xasink status' tells which once "
                "the database answers; nothing is left to finish."
            ) from exc

    def _same(self, conn: Connection, decided: BatchRecord | None, xids: Sequence[Xid]) -> bool:
        """Is the log's decision of the batch the one this run finishes (not withdrawn, not another run's)?

        By its xid list; once a trim emptied that list (a committed batch), by the run recorded with the
        decision (DESIGN invariant 14): an emptied list is not a withdrawal."""
        if decided is None:
            return False
        if set(decided.xids) == set(xids):
            return True
        if decided.xids or not decided.committed or not xids:
            return False
        recorded = self.journal.recorded_target(conn, self.sink_id, decided.batch_id)
        return deciding_run(recorded) in {x.run for x in xids}

    def _withdraw(self, batch_id: int, spec: ApplySpec, xids: Sequence[Xid], reason: str, deadline: float) -> bool:
        """:meth:`withdraw_decision`, retried through transient errors (the log's sink row held past
        controlLockTimeout, a lost connection) until ``deadline``; then the batch is still decided, its rows
        loaded and not visible: :class:`CommitIncompleteError`, never the raw error.  Which way it ends is the
        next run's or recovery's: applied if the table takes its rows then, else withdrawn."""
        what = f"withdrawing the decision of sink {self.sink_id} batch {batch_id}"
        try:
            return self.policy.forward(what, lambda: self.withdraw_decision(batch_id, spec, xids, reason), deadline)
        except XasinkError:
            raise
        except Exception as exc:
            if not self.policy.transient(exc):
                raise
            raise CommitIncompleteError(
                f"sink {self.sink_id} batch {batch_id} is decided and its rows are loaded, but the step that makes "
                f"them visible ({spec.describe()}) failed because of the rows ({reason}), and withdrawing the "
                f"decision failed within commitTimeout ({self.policy.timeout_s} s: {self.policy.describe(exc)}); "
                f"the table still holds its old rows. The next run of this sink (sinkId '{self.sink_id}') or "
                "'xasink recover' finishes it: it applies the batch if the table takes its rows then, else "
                "withdraws it (nothing of it visible); no row is lost or doubled."
            ) from exc

    def _renamed(self, spec: ApplySpec, batch_id: int, xids: Sequence[Xid]) -> RenamedOverwrite | None:
        swap = self.journal.dialect.rename_swap() if spec.kind == OVERWRITE else None
        return None if swap is None else RenamedOverwrite(self.journal, swap, self.sink_id, spec, batch_id, xids)

    def withdraw_decision(self, batch_id: int, spec: ApplySpec, xids: Sequence[Xid], reason: str) -> bool:
        """Withdraw a decision whose apply can never succeed: its rows only ever reached the shadow.

        False when there was nothing to withdraw because another run (a recovery) applied the batch and marked it
        committed between this run's failed apply and the sink lock: its rows are visible, so saying "nothing of
        this batch is visible" would be false (DESIGN invariant 11).  An overwrite that may be renamed in is
        withdrawn under the table's apply lock, once no witness says another run's rename happened: the mark
        comes only after that rename, so the batch's row alone cannot tell."""
        renamed = self._renamed(spec, batch_id, xids)
        if renamed is None:
            return self._withdraw_locked(batch_id, spec, xids, reason)
        dialect = self.journal.dialect
        with dialect.connect() as conn:
            lock = apply_lock_name(spec, session_schema(conn))
            conn.begin()
            try:
                dialect.lock_apply(conn, lock)
                decided = self.journal.get(conn, self.sink_id, batch_id)
                renamed.finish_witnessed(conn, decided, lambda c, d: self._same(c, d, xids), None)
                if not conn.in_transaction():  # the table was swapped by another run: its rows are visible
                    return self._applied_meanwhile(batch_id, reason)
                conn.rollback()
                return self._withdraw_locked(batch_id, spec, xids, reason)
            except BaseException:
                conn.rollback()
                raise
            finally:
                _unlock(dialect, conn, lock)

    def _applied_meanwhile(self, batch_id: int, reason: str) -> bool:
        """False, logged: nothing to withdraw, another run (a recovery) applied the batch after this run failed."""
        log.warning(
            "sink %s batch %s: this run's apply failed (%s), but another run applied it meanwhile",
            self.sink_id,
            batch_id,
            reason,
        )
        return False

    def _withdraw_locked(self, batch_id: int, spec: ApplySpec, xids: Sequence[Xid], reason: str) -> bool:
        with self.journal.locked(self.sink_id) as conn:
            # a locking read: it waits for a recovery's apply that holds the row, and sees its mark
            decided = self.journal.get(conn, self.sink_id, batch_id, lock=True)
            if not self._same(conn, decided, xids):  # withdrawn by another run already; a newer one is not ours
                decided = None
            if (
                decided is not None
                and not decided.committed
                and not self.journal.withdraw(conn, self.sink_id, batch_id)
            ):
                decided = self.journal.get(conn, self.sink_id, batch_id, lock=True)  # what the log says now
                if decided is None:
                    log.info("sink %s batch %s: withdrawn by another run meanwhile", self.sink_id, batch_id)
                elif not decided.committed:
                    raise JournalError(
                        f"sink {self.sink_id} batch {batch_id}: withdrawing its decision changed no row of "
                        f"{self.journal.batches.fullname}, yet it is still decided and not applied: the row was "
                        "changed by something other than xasink. Nothing of the batch is visible yet; "
                        "'xasink recover' finishes it once its rows fit the table."
                    )
            elif decided is not None and not decided.committed:
                found = decided_rows(self.journal.dialect, conn, spec, decided.xids)
                clear_batch(self.journal.dialect, conn, spec, batch_id, found)
                decided = None
            if decided is not None and decided.committed:
                return self._applied_meanwhile(batch_id, reason)
        log.warning(
            "sink %s batch %s: decision withdrawn, nothing of it is visible (%s)", self.sink_id, batch_id, reason
        )
        return True


@contextmanager
def order_lock(dialect: Dialect, spec: ApplySpec) -> Iterator[str | None]:
    """Hold the target's apply lock (on a connection of its own) around a write-mode decision: two sinks of one
    log decide a table's batches one after the other, and each sees the other's pending batch (DESIGN
    invariant 12).  Yields None once granted, else why not (another session held it past controlLockTimeout:
    the decision then refuses if a batch of the table is pending, and asks again otherwise; it is never made
    without the lock, :meth:`xasink.protocol.decision.Decider.decide`)."""
    with dialect.connect() as conn:
        lock = apply_lock_name(spec, session_schema(conn))
        conn.begin()
        refused = None
        try:
            dialect.lock_apply(conn, lock)
        except (sa.exc.SQLAlchemyError, XasinkError) as exc:
            conn.rollback()
            refused = f"the table's apply lock was not granted within controlLockTimeout: {exc.__class__.__name__}"
        if refused is not None:
            yield refused
            return
        try:
            yield None
        finally:  # never raises: the decision made meanwhile (if any) is finished forward whatever this session's fate
            try:
                conn.rollback()
            except sa.exc.SQLAlchemyError as exc:  # the session is gone (and its lock with it)
                log.debug("apply lock %s: its session was lost (%s)", lock, exc)
            _unlock(dialect, conn, lock)


def _unlock(dialect: Dialect, conn: Connection, lock: str) -> None:
    """Release the apply lock after the transaction (a lost connection released it already)."""
    try:
        dialect.unlock_apply(conn, lock)
        conn.commit()
    except Exception as exc:  # noqa: BLE001 - never hides the apply's own error, whatever the driver raised
        log.debug("apply lock %s not released (%s): its session ends with the connection", lock, exc)
        try:
            conn.invalidate()
        except Exception:  # noqa: BLE001 - the session is gone either way
            pass
