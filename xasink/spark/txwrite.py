"""The data source's side of a write inside ``xasink.transaction()``: prepare, record the part, never decide.

Spark runs the write's ``commit()`` in a Python worker on the driver, not in the user's process: it
records the write's prepared branches as one part of the transaction in the decision log (which may be
in another database, of another dialect), and the transaction decides over all parts when its block ends.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql.types import StructType
from sqlalchemy.engine import URL, make_url

from xasink.dialects import dialect_for
from xasink.errors import BatchAbortedError, OptionError
from xasink.journal.log import Journal
from xasink.journal.parts import Part, record_part
from xasink.journal.targets import target_identity
from xasink.options import WriteOptions
from xasink.protocol.coordinator import ABORT_SETTLE_S, Coordinator
from xasink.protocol.multi_target import ROLLED_BACK
from xasink.protocol.retry import RetryPolicy, again_if_deadlocked
from xasink.results import BranchOutcome
from xasink.spark.planning import WritePlan, arrow_schema

log = logging.getLogger("xasink")

# internal options of a write inside xasink.transaction(): the decision log's URL (the key holds "url", so
# Spark redacts it like the target's), the write's part number, and the transaction's run guard
TX_URL_OPTION = "xasink.tx.journalUrl"
TX_PART_OPTION = "xasink.tx.part"
TX_GUARD_OPTION = "xasink.tx.guard"


@dataclass(frozen=True)
class TxWrite:
    """What a write inside a transaction knows of it: the log, its part number, the run's guard."""

    journal_url: URL
    part: int
    guard: str


def tx_write(raw: Mapping[str, Any]) -> TxWrite | None:
    """The transaction a write belongs to (from the internal options), or None for a plain write."""
    url = raw.get(TX_URL_OPTION)
    if url is None:
        return None
    try:
        return TxWrite(make_url(str(url)), int(str(raw.get(TX_PART_OPTION))), str(raw.get(TX_GUARD_OPTION)))
    except (ValueError, TypeError):
        raise OptionError("options 'xasink.tx.*' are internal to xasink.transaction()") from None


def _journal(options: WriteOptions, tx: TxWrite) -> Journal:
    """The transaction's log, its control connections waiting for locks up to the write's controlLockTimeout."""
    return Journal(dialect_for(tx.journal_url, options.branch_settings), options.journal_schema, options.journal_prefix)


def prepare_tx_write(options: WriteOptions, schema: StructType, tx: TxWrite) -> WritePlan:
    """Driver side: the target table's plan and the log's identity (the transaction pre-flighted the server)."""
    from xasink.write_modes.schema import plan_target

    journal = _journal(options, tx)
    dialect = dialect_for(options.url, options.branch_settings)
    try:
        with dialect.connect() as conn:
            target = plan_target(dialect, conn, options, arrow_schema(schema))
        return WritePlan(target, journal.log_id(), tx.guard)
    finally:
        dialect.dispose()
        journal.dialect.dispose()


def record_tx_part(options: WriteOptions, tx: TxWrite, run: str, outcomes: Sequence[BranchOutcome | None]) -> None:
    """Every task reported: record the write's branches as one part of the transaction, undecided."""
    if any(o is None for o in outcomes):
        abort_tx_write(options, tx, run, outcomes)
        raise BatchAbortedError(
            f"sink {options.sink_id} transaction {options.batch_id}: a task of write {tx.part} did not report; "
            "the transaction is rolled back"
        )
    done = [o for o in outcomes if o is not None]
    xids = tuple(x for x in (o.xid for o in done) if x is not None)
    dialect = dialect_for(options.url)
    journal = _journal(options, tx)
    what = f"sink {options.sink_id} transaction {options.batch_id}: recording write {tx.part} in the decision log"
    try:  # Spark's abort then rolls back this write's branches, and the transaction's block every other write's
        with RetryPolicy(journal.dialect, options).never_raw(lambda why: f"{what} failed ({why}); {ROLLED_BACK}"):
            with dialect.connect() as conn:
                server = dialect.server_identity(conn)
                target = target_identity(conn, options.table.schema, options.table.name)
            part = Part(
                options.sink_id,
                options.batch_id,
                run,
                tx.part,
                server,
                target,
                xids,
                sum(o.rows for o in done if o.gid),
                int(max((o.seconds for o in done), default=0.0) * 1000),
                False,
            )

            def record() -> None:
                with journal.dialect.connect() as conn, conn.begin():
                    record_part(conn, journal, part)

            again_if_deadlocked(journal.dialect, what, record)
        log.info(
            "sink %s transaction %s: write %d prepared %d branches",
            options.sink_id,
            options.batch_id,
            tx.part,
            len(xids),
        )
    finally:
        dialect.dispose()
        journal.dialect.dispose()


def abort_tx_write(
    options: WriteOptions, tx: TxWrite, run: str, outcomes: Sequence[BranchOutcome | None], undecided: bool = True
) -> None:
    """A write failed: end the transaction's run (late branches roll themselves back) and roll back this
    write's branches; the transaction rolls back every other write's when its block ends.  ``undecided`` (a
    failed job, a task without a message: the write recorded no part, so the transaction can never decide):
    the run's branches are rolled back without the log's sink lock first, as a single batch's abort does.

    Never raises: the write's own error is what its caller reports (Spark keeps a failed job's cause over its
    abort's), and an abort that fails (the log's sink row held past controlLockTimeout) leaves the branches
    to the transaction's end, which rolls them back again, or to ``xasink recover``."""
    journal = _journal(options, tx)
    coordinator = Coordinator(options, journal=journal)
    try:  # the abort's settle: cancelled tasks may PREPARE until their worker is killed
        coordinator.abort(options.batch_id, outcomes, settle_s=ABORT_SETTLE_S, run=run, undecided=undecided)
    except Exception as exc:  # noqa: BLE001 - logged; the caller raises the write's error
        log.warning(
            "sink %s transaction %s: rolling back write %d failed (%s); the transaction's end rolls its branches "
            "back again, else 'xasink recover' does: none of its rows is visible",
            options.sink_id,
            options.batch_id,
            tx.part,
            RetryPolicy(journal.dialect, options).describe(exc),
        )
    finally:
        coordinator.close()
        journal.dialect.dispose()
