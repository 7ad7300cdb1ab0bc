"""How a multi-target transaction ends without committing its own decision: rolled back before it decided, or
found decided by another run (a replay).

Before the decision every failure rolls back every prepared part, in every database, and the user is told
nothing is visible (:meth:`TransactionEnd.fail`); a database the roll-back cannot reach is named, with the
command that finishes it once it answers.  A replay is "skipped" only once the log shows every part of the
decided batch committed (:meth:`TransactionEnd.finish_replay`).
"""

from __future__ import annotations

import logging
from typing import NoReturn

from xasink.dialects.base import Dialect
from xasink.errors import BatchAbortedError, ReplayIncompleteError
from xasink.journal.log import Journal
from xasink.journal.parts import decided_parts, still_to_recover
from xasink.protocol.liveness import RESTART_GRACE_S
from xasink.protocol.retry import RetryPolicy
from xasink.protocol.target_db import TargetDb
from xasink.support.masking import display_url

log = logging.getLogger("xasink.protocol.multi_target")


class TransactionEnd:
    """The abort and the replay's finish of :class:`~xasink.protocol.multi_target.MultiCoordinator`."""

    sink_id: str
    batch_id: int
    run: str
    log_id: str
    log_server: str  # the log's database, by its server's identity
    dialect: Dialect  # the log's
    journal: Journal
    policy: RetryPolicy  # the log's
    targets: dict[str, TargetDb]

    def fail(
        self, why: str, cause: BaseException | None, error: type[BatchAbortedError] = BatchAbortedError
    ) -> NoReturn:
        """Before the decision: roll back every part (:meth:`abort`) and raise ``error`` saying so."""
        raise error(self.aborted(why, self.abort())) from cause

    def aborted(self, why: str, left: list[str]) -> str:
        """What the user is told of a transaction rolled back before its decision (``left``: :meth:`abort`'s)."""
        head = f"sink {self.sink_id} transaction {self.batch_id}: this run did not decide it ({why}). Nothing it wrote"
        if not left:
            return (
                f"{head} is visible and nothing of it is left prepared: every write's branches were rolled back. "
                "Run it again with the same sink_id and batch_id"
            )
        return (
            f"{head} is visible. Its branches in the other databases were rolled back, but the roll-back could not "
            f"reach {'; '.join(left)}. This run's branches there stay prepared, holding their row locks, until that "
            "command (or the next run of this sink writing there) rolls them back: this run has ended, so they are "
            "rolled back as soon as the database answers (after a restart of the decision log's database, once "
            f"{RESTART_GRACE_S:.0f} s of its uptime have passed: the run guards' grace to be taken again)"
        )

    def abort(self) -> list[str]:
        """Roll back the run's branches in every database and end the run; never raises.

        Returns the databases the roll-back could not reach, each with the command that finishes it there (empty:
        nothing of the run is left prepared).  The run's own branches go first, without the log's sink lock
        (:meth:`TargetDb.roll_back_run`: only this run could decide them, and it never will), so neither a lock
        another session holds on the log nor a log that does not answer keeps them prepared.  Then, under the
        lock, the run is ended (a late task's branch rolls itself back) and each database is swept (rolling back
        one a late task prepared meanwhile); a failure there is a warning.
        """
        log.info("aborting sink %s transaction %s", self.sink_id, self.batch_id)  # the caller is told by its error
        left: list[str] = []
        reached = []
        log_url = display_url(self.dialect.url)
        for db in self.targets.values():
            try:
                db.roll_back_run(self.log_id, self.batch_id, self.run)
                reached.append(db)
            except Exception as exc:  # noqa: BLE001 - told to the user, with the command that finishes it
                left.append(
                    f"{display_url(db.dialect.url)} ({db.recovery.policy.describe(exc)}): run "
                    f"'{db.recover_command(self.log_server, log_url)}' once it answers"
                )
        try:
            with self.journal.locked(self.sink_id) as conn:
                if self.journal.get(conn, self.sink_id, self.batch_id) is None:  # decided by another: ours are orphans
                    self.journal.end_run(conn, self.sink_id, self.batch_id, self.run)
            for db in reached:
                db.recovery.recover(upto=self.batch_id)
        except Exception as exc:  # noqa: BLE001 - the run's branches are rolled back; it ends with this process
            log.warning(
                "sink %s transaction %s: its branches were rolled back, but ending the run in the decision log "
                "failed (%s); a branch a late task prepares is rolled back by the next run of this sink or "
                "'xasink recover' once this process ended",
                self.sink_id,
                self.batch_id,
                self.policy.describe(exc),
            )
        return left

    def finish_replay(self) -> None:
        """A replay of a decided transaction: finish what a crashed run left in the databases written now.

        Told "skipped" only once the log shows the batch committed, i.e. every part of it: a part in a database
        this replay does not write, or one that could not be finished yet, is :class:`ReplayIncompleteError`
        naming the databases still to recover (the rows are not all there yet; recovery finishes them).
        """
        problems: list[str] = []
        for db in self.targets.values():
            try:
                db.recovery.recover(upto=self.batch_id)
            except Exception as exc:  # noqa: BLE001 - the log says below what is not finished; this says why
                problems.append(f"{db.server}: {db.recovery.policy.describe(exc)}")
        try:
            with self.dialect.connect(autocommit=True) as conn:
                now = self.journal.get(conn, self.sink_id, self.batch_id)
                parts = decided_parts(conn, self.journal, self.sink_id, self.batch_id, now.xids) if now else []
        except Exception as exc:
            problems.append(f"the decision log: {self.policy.describe(exc)}")
            raise ReplayIncompleteError(self._replay_incomplete("it could not be checked", problems)) from exc
        if now is None:
            raise BatchAbortedError(
                f"sink {self.sink_id} transaction {self.batch_id} was decided by another run, and its decision is no "
                f"longer in the decision log {self.journal.batches.fullname} (removed by someone else); nothing of "
                "this run was written"
            )
        if now.committed:
            return
        left = [(p.server, p.target) for p in parts if not p.committed]
        why = still_to_recover(left, self.log_server) if left else "its writes are committed, the log's mark is not"
        raise ReplayIncompleteError(self._replay_incomplete(why, problems))

    def _replay_incomplete(self, why: str, problems: list[str]) -> str:
        met = f" (finishing it here met: {'; '.join(problems)})" if problems else ""
        return (
            f"sink {self.sink_id} transaction {self.batch_id} was decided by another run (this run's rows are not "
            f"part of it) and is not finished: {why}{met}. It stays decided: the next run of this sink writing "
            "those databases, or 'xasink recover' on each, finishes it; no row is lost or doubled"
        )
