"""One database a multi-target transaction writes into: its dialect, its recovery by the transaction's log, and
the roll-back of the transaction's own branches there when it aborts.
"""

from __future__ import annotations

import logging

from xasink.dialects import dialect_for
from xasink.journal.log import Journal
from xasink.options import WriteOptions
from xasink.protocol.recovery import sink_recovery
from xasink.support.masking import display_url

log = logging.getLogger("xasink.protocol.multi_target")


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
        """Roll back every branch of ``run`` of ``batch_id`` prepared here, without the log's sink lock
        (:meth:`BranchGroup.roll_back_run`); how many there were."""
        return self.recovery.group.roll_back_run(log_id, batch_id, run)

    def recover_command(self, log_server: str, log_url: str) -> str:
        """The command that finishes this database's branches by the transaction's log (passwords masked)."""
        command = f"xasink recover --url {display_url(self.dialect.url)}"
        return command if self.server == log_server else f"{command} --journal-url {log_url}"

    def close(self) -> None:
        self.dialect.dispose()
