"""Recovery: finish what a sink's decision log says, and roll back what can never commit.

A pass reads the log's pending batches first, then judges the prepared branches under the sink's row lock
(the same lock a decision takes, so a batch is never decided with a branch this pass rolled back: DESIGN
invariant 4) and rolls back those that can never commit, and only then finishes the decided batches from the
log alone (commit, then apply or mark), whatever crashed: an apply never waits on an orphan's locks.  A decided
batch is only finished forward; one that cannot be finished now is reported in ``unfinished``.  The judgement
(:func:`xasink.protocol.judgement.judge`) is the one ``xasink recover``'s plan and ``xasink status`` show.

A pass finishes with the same group operations, apply step and retry policy as a live commit, so a finish by
recovery behaves like one by the driver.
"""

from __future__ import annotations

import logging
import zlib
from dataclasses import dataclass, field

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from xasink.dialects.base import Dialect
from xasink.dialects.values import PreparedTxn
from xasink.errors import ApplyError, CommitIncompleteError, ConnectError
from xasink.journal.log import Journal
from xasink.journal.parts import decided_parts, mark_parts_done, still_to_recover
from xasink.journal.records import BatchRecord
from xasink.options import WriteOptions
from xasink.protocol.apply_step import ApplyStep
from xasink.protocol.branch_group import BranchGroup
from xasink.protocol.judgement import COMMIT, ROLLBACK_ORPHAN, ROLLBACK_UNDECIDED, judge, of_log
from xasink.protocol.liveness import runs_alive
from xasink.protocol.retry import RetryPolicy
from xasink.protocol.xid import Xid
from xasink.support.phases import phase
from xasink.write_modes.spec import ApplySpec

log = logging.getLogger(__name__)

TRIM_EVERY = 16  # compact the decision log after about one committed batch in this many


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

    def add(self, late: RecoveryReport) -> None:
        """A later sweep's branches, counted into this report (an abort's sweeps after its first)."""
        self.committed += late.committed
        self.rolled_back += late.rolled_back


def list_prepared(dialect: Dialect, journal: Journal, log_conn: Connection) -> list[PreparedTxn]:
    """The branches prepared in the target database, listed while ``log_conn`` holds the log's sink lock."""
    if journal.dialect is dialect:
        return dialect.list_prepared(log_conn)
    with dialect.connect() as conn:
        return dialect.list_prepared(conn)


def sink_recovery(options: WriteOptions, dialect: Dialect, journal: Journal) -> Recovery:
    """A sink's recovery in ``dialect``'s database, with the retry policy, group operations and apply step of
    its options: what a coordinator and each database of a multi-target transaction finish batches with."""
    policy = RetryPolicy(dialect, options)
    group = BranchGroup(dialect, policy, options.commit_parallelism)
    return Recovery(options.sink_id, dialect, journal, policy, group, ApplyStep(journal, policy, options.sink_id))


class Recovery:
    """Recovery of one sink's branches in one database, by its decision log (there or elsewhere)."""

    def __init__(
        self,
        sink_id: str,
        dialect: Dialect,
        journal: Journal,
        policy: RetryPolicy,
        group: BranchGroup,
        apply_step: ApplyStep,
    ) -> None:
        self.sink_id = sink_id
        self.dialect = dialect
        self.journal = journal
        self.policy = policy
        self.group = group
        self.apply_step = apply_step

    def recover(self, upto: int | None = None, min_age_s: float = 0.0, run: str | None = None) -> RecoveryReport:
        """Finish decided batches and roll back undecided branches of this sink (batches <= ``upto``).

        Undecided branches younger than ``min_age_s`` are left alone (a live
        batch may still decide them); decided ones are always finished.  With
        ``run``, the caller is a writer of batch ``upto``: branches of that
        batch held by another run (one that took the batch over) are left to it.
        """
        report = RecoveryReport()
        with self.journal.dialect.connect(autocommit=True) as conn:  # reads only
            pending = [r for r in self.journal.pending(conn, self.sink_id) if upto is None or r.batch_id <= upto]
        # first roll back what can never commit (and commit what is decided and still prepared): an apply of a
        # decided batch must never wait on an orphan's locks that this very pass would release afterwards
        to_commit = self._roll_back_doomed(report, upto, min_age_s, run)
        listed = {x for r in pending for x in r.xids}  # committed with their batch, next
        rest = [x for x in to_commit if x not in listed]
        if rest:
            report.committed += self.group.commit(rest)
        try:
            self._finish_pending(report, pending)
        finally:  # a decided branch found prepared here that its batch's finish did not reach is committed still
            done = set(report.committed)
            left = [x for x in to_commit if x in listed and x not in done and x.batch_id not in report.unfinished]
            if left:
                report.committed += self.group.commit(left)
        return report

    def finish(self, batch_ids: list[int]) -> RecoveryReport:
        """Finish these decided batches of the sink forward (commit their branches, apply and mark them), in
        the order they were decided: what a newer write-mode batch does before its own decision."""
        report = RecoveryReport()
        with self.journal.dialect.connect(autocommit=True) as conn:
            pending = [r for r in self.journal.pending(conn, self.sink_id) if r.batch_id in batch_ids]
        self._finish_pending(report, pending)
        return report

    def _roll_back_doomed(
        self, report: RecoveryReport, upto: int | None, min_age_s: float, run: str | None
    ) -> list[Xid]:
        """Judge every prepared branch of the sink under its lock (:func:`xasink.protocol.judgement.judge`) and
        roll back those that can never commit; the decided ones found prepared are returned, to commit."""

        def of_sink(conn: Connection) -> list[PreparedTxn]:
            listed = [
                p
                for p in list_prepared(self.dialect, self.journal, conn)
                if p.xid is not None and p.xid.sink_id == self.sink_id
            ]
            if not listed:  # the log's identity is read only when a branch of the sink may need it
                return []
            log_id = self.journal.log_id(conn)
            return [p for p in listed if of_log(p, log_id, self.sink_id, upto)]

        # what every batch's plan pays: a look without the lock first (a branch prepared after it is out of
        # this pass's reach either way); the lock, to judge and finish, only when something of the sink is there
        with self.journal.dialect.connect(autocommit=True) as conn:
            if not of_sink(conn):
                return []
        with self.journal.locked(self.sink_id) as conn:
            # it only reads under the lock (its roll-backs run on a connection of their own)
            self.journal.dialect.relaxed_commit(conn)
            mine = of_sink(conn)
            if not mine:  # nothing of this sink is prepared: nothing to date, judge or finish
                return []
            holder = self.journal.holder(conn, self.sink_id, upto) if run is not None and upto is not None else None
            verdicts = judge(
                self.journal,
                conn,
                mine,
                self.journal.dialect.server_now(conn),
                self.journal.log_id(conn),
                sink_id=self.sink_id,
                upto=upto,
                min_age_s=min_age_s,
                run=run,
                holder=holder,
                date_undated=min_age_s > 0,
            )
            to_commit = [v.txn.xid for v in verdicts if v.action == COMMIT and v.txn.xid is not None]
            doomed = [
                v.txn.xid
                for v in verdicts
                if v.action in (ROLLBACK_UNDECIDED, ROLLBACK_ORPHAN) and v.txn.xid is not None
            ]
            self.group.rollback(doomed)
            report.rolled_back += doomed
        return to_commit

    def _finish_pending(self, report: RecoveryReport, pending: list[BatchRecord]) -> None:
        """Finish each decided batch (commit its listed branches, apply or mark it), oldest first.

        Only forward: a batch that cannot be finished now (a timeout, a lock, a read-only server...) stays
        decided and goes into ``report.unfinished`` with what blocked it; the others are still finished.  A batch
        withdrawn for its rows (:class:`ApplyError`) is never swallowed: the first is raised once the others ran.
        """
        withdrawn: list[ApplyError] = []
        committed = self._commit_before_applies(report, pending)
        for record in pending:
            try:
                if self._finish_parts(record, report):
                    continue  # a multi-target batch: only this database's parts are finished here
                if self.journal.dialect is not self.dialect:
                    continue  # a single table's batch of the log's own database: finished from there
                if record.batch_id not in committed:
                    report.committed += self.group.commit(record.xids)
                with self.journal.dialect.connect() as conn:
                    decided, target = self.journal.target_of(conn, self.sink_id, record.batch_id)
                    if not decided:  # withdrawn since this pass read it (its apply met wrong rows): nothing to finish
                        log.info(
                            "sink %s batch %s was withdrawn meanwhile by another run", self.sink_id, record.batch_id
                        )
                        continue
                    spec = ApplySpec.from_target(target)
                    if spec is None:
                        self.journal.mark_committed(conn, self.sink_id, record.batch_id, None)
                    current = self.journal.get(
                        conn, self.sink_id, record.batch_id
                    )  # decided again since this pass read it?
                if spec is not None and current is not None:
                    deadline = self.policy.deadline()
                    self.apply_step.apply(record.batch_id, spec, current.xids, None, deadline)
            except ApplyError as exc:
                withdrawn.append(exc)
                continue
            except (CommitIncompleteError, ConnectError, sa.exc.DBAPIError) as exc:  # not about the rows: reported
                report.unfinished[record.batch_id] = self.policy.describe(exc)
                log.warning(
                    "recovery could not finish decided batch %s of sink %s yet (%s); it stays decided",
                    record.batch_id,
                    self.sink_id,
                    report.unfinished[record.batch_id],
                )
                continue
            report.finished_batches.append(record.batch_id)
            log.info("recovery finished decided batch %s of sink %s", record.batch_id, self.sink_id)
        if withdrawn:
            raise withdrawn[0]

    def _commit_before_applies(self, report: RecoveryReport, pending: list[BatchRecord]) -> set[int]:
        """Commit the branches of every decided write-mode batch before any apply runs: an apply of one batch must
        never wait on the shadow rows another decided batch still holds prepared (on MariaDB its reads can), and
        committing a decided branch is always right.  The batch ids whose branches were committed here."""
        if self.journal.dialect is not self.dialect or not pending:
            return set()
        done: set[int] = set()
        with self.journal.dialect.connect(autocommit=True) as conn:
            targets = {r.batch_id: self.journal.target_of(conn, self.sink_id, r.batch_id)[1] for r in pending}
        modes = {batch for batch, target in targets.items() if ApplySpec.from_target(target) is not None}
        for record in pending:
            if record.batch_id in modes:
                try:
                    report.committed += self.group.commit(record.xids)
                except (CommitIncompleteError, ConnectError, sa.exc.DBAPIError) as exc:  # its own turn reports it
                    log.debug("sink %s batch %s: branches not committed yet (%s)", self.sink_id, record.batch_id, exc)
                    continue
                done.add(record.batch_id)
        return done

    def _finish_parts(self, record: BatchRecord, report: RecoveryReport) -> bool:
        """Finish this database's parts of a decided multi-target batch; False for a single-target batch.

        Each part's branches are committed through this database only when the part was written here
        (its server identity); the batch is marked committed once every part is, by whichever recovery marks
        the last part: marking and reading every part's mark run under the sink's lock.  While parts in
        other databases are not committed, the batch is reported unfinished with the databases still to
        recover, unless the run that decided it is alive: it is committing them.
        """
        with self.dialect.connect() as conn:
            here = self.dialect.server_identity(conn)
        with self.journal.dialect.connect() as conn:
            parts = decided_parts(conn, self.journal, self.sink_id, record.batch_id, record.xids)
        if not parts:
            return False
        mine = [p for p in parts if p.server == here and not p.committed]
        for part in mine:
            report.committed += self.group.commit(part.xids)
        with self.journal.locked(self.sink_id) as conn:
            left = mark_parts_done(conn, self.journal, self.sink_id, record.batch_id, record.xids, mine)
        if not left:
            with self.journal.dialect.connect() as conn:
                self.journal.mark_committed(conn, self.sink_id, record.batch_id, None)
                report.finished_batches.append(record.batch_id)
                log.info("recovery finished decided multi-target batch %s of sink %s", record.batch_id, self.sink_id)
            return True
        with self.journal.dialect.connect(autocommit=True) as conn:
            runs = {x.run for x in record.xids}
            claims = self.journal.claim_states(conn, self.sink_id, {record.batch_id})
            alive = runs_alive(self.journal.dialect, conn, {k: c for k, c in claims.items() if k[1] in runs})
            log_server = self.journal.dialect.server_identity(conn)
        if any(alive.values()):
            log.info("sink %s batch %s: its live run is committing its other parts", self.sink_id, record.batch_id)
        else:
            report.unfinished[record.batch_id] = still_to_recover(left, log_server)
        return True

    def after_commit(self, batch_id: int, retention: int, sweep: bool = True) -> None:
        """Sweep and trim after a committed batch: housekeeping, so a failure is a warning, never an error.

        ``sweep`` False: the decision saw no branch of this sink up to this batch but the decided ones, so
        there is nothing to sweep (an attempt that prepares after the decision rolls itself back:
        :func:`xasink.protocol.partition_writer.settle_prepared`).  The trim runs for about one batch in
        ``TRIM_EVERY`` (every time when the retention is smaller): it reads every uncompacted batch of the sink.
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
                self.policy.describe(exc),
            )
        try:
            with phase("commit.trim", sink=self.sink_id, batch=batch_id):
                self._trim(batch_id, retention)
        except Exception as exc:  # noqa: BLE001 - the batch is committed; the next write trims
            log.warning(
                "sink %s batch %s is committed, but trimming the decision log failed (%s); the next write trims it",
                self.sink_id,
                batch_id,
                self.policy.describe(exc),
            )

    def _trim(self, batch_id: int, keep: int) -> None:
        if keep >= TRIM_EVERY and zlib.crc32(f"{self.sink_id}:{batch_id}".encode()) % TRIM_EVERY:
            return  # not this batch's turn (ids in any pattern: a hash, not the id itself, picks the turn)
        with self.journal.dialect.connect() as conn:
            self.journal.trim(conn, self.sink_id, keep)
