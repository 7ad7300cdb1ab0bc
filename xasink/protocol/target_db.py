"""One database a multi-target transaction writes into: its dialect, its recovery by the transaction's log, and
the roll-back of the transaction's own branches there when it aborts.
"""

from __future__ import annotations

import logging
import time

from xasink.dialects import dialect_for
from xasink.journal.log import Journal
from xasink.options import WriteOptions
from xasink.protocol.recovery import sink_recovery
from xasink.support.masking import display_url

log = logging.getLogger("xasink.protocol.multi_target")

ABORT_RETRY_S = 5.0  # how long an abort retries a database that does not answer before naming it to the user


class TargetDb:
    """One database the transaction writes into: its branches there, finished by the decisions in the log."""

    def __init__(self, options: WriteOptions, journal: Journal) -> None:
        self.dialect = dialect_for(options.url, options.branch_settings, options.control_pool_size)
        self.recovery = sink_recovery(options, self.dialect, journal)
        self.retention = options.journal_retention
        with self.dialect.connect() as conn:
            self.server = self.dialect.server_identity(conn)
        self.branches = 0  # planned so far: what max_prepared_transactions must cover

    def roll_back_run(self, log_id: str, batch_id: int, run: str) -> int:
        """Roll back every branch of ``run`` of ``batch_id`` prepared here, retrying a database that does not
        answer for a few seconds; how many there were.

        Only the run's own branches, and without the log's sink lock: the caller is that run and will never
        decide (a decision lists the deciding run's own branches only, under its claim), so no decision can
        race this roll-back; it works while another session holds the lock or the log's database is down.
        """

        def once() -> int:
            with self.dialect.connect(autocommit=True) as conn:
                mine = [
                    p.xid
                    for p in self.dialect.list_prepared(conn)
                    if p.xid is not None
                    and p.xid.log_id == log_id
                    and p.xid.sink_id == self.recovery.sink_id
                    and p.xid.batch_id == batch_id
                    and p.xid.run == run
                ]
            self.recovery.group.rollback(mine)
            return len(mine)

        policy = self.recovery.policy
        where = display_url(self.dialect.url)
        return policy.forward(f"rolling back run {run}'s branches in {where}", once, time.monotonic() + ABORT_RETRY_S)

    def recover_command(self, log_server: str, log_url: str) -> str:
        """The command that finishes this database's branches by the transaction's log (passwords masked)."""
        command = f"xasink recover --url {display_url(self.dialect.url)}"
        return command if self.server == log_server else f"{command} --journal-url {log_url}"

    def close(self) -> None:
        self.dialect.dispose()
