"""An overwrite applied by renaming a new table into the target's place (MariaDB/MySQL), step by step.

There DDL commits, so the swap cannot commit with the batch's mark as PostgreSQL's does in the apply transaction.
Under the table's apply lock (GET_LOCK outlives the commits), each step committed:

1. a new table made like the target is loaded from the shadow (a leftover of an earlier try dropped first);
2. ``RENAME TABLE target TO witness, new TO target``: the point of no return.  The old storage's new name says
   which decision swapped it (:func:`xasink.write_modes.swap.witness_name`);
3. the batch is marked committed and its rows cleared from the shadow, in one transaction;
4. the witness is dropped.

Whoever applies a decided batch next (this run's retry, the next run, ``xasink recover``) looks for its witness
first: there, the rename happened, and the batch is only marked, never built again nor withdrawn.  A
withdrawal takes the apply lock and looks for it too (:meth:`RenamedOverwrite.finish_witnessed`).  A killed
run's witness left after its mark is dropped by the sink's next renamed overwrite.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from sqlalchemy.engine import Connection

from xasink.dialects.values import RenameSwap, SwapRefused
from xasink.errors import JournalError
from xasink.journal.log import Journal
from xasink.journal.records import BatchRecord
from xasink.protocol.xid import Xid
from xasink.support.faults import fault
from xasink.write_modes.shadow import decided_rows
from xasink.write_modes.spec import ApplySpec, shadow_name
from xasink.write_modes.statements import clear_batch
from xasink.write_modes.swap import renamed_target, sink_witness_prefix, witness_batch, witness_name, witness_prefix

log = logging.getLogger(__name__)


class RenamedOverwrite:
    """One decision's overwrite by renaming, for the apply step and the withdrawal that must not undo it."""

    def __init__(
        self, journal: Journal, swap: RenameSwap, sink_id: str, spec: ApplySpec, batch_id: int, xids: Sequence[Xid]
    ) -> None:
        self.journal = journal
        self.swap = swap
        self.sink_id = sink_id
        self.spec = spec
        self.batch_id = batch_id
        self.xids = tuple(xids)
        self.witness = witness_name(spec, batch_id, xids)
        self.rows = 0

    def apply(
        self,
        conn: Connection,
        decided: BatchRecord | None,
        same: Callable[[Connection, BatchRecord | None], bool],
        commit_ms: int | None,
        rename: bool = True,
    ) -> bool | None:
        """Inside the apply's transaction, its lock held.  True: applied and marked now; False: nothing left to
        do (applied before, or withdrawn: the log says which); None: the table is overwritten in place instead
        (the log says why; without ``rename``, an earlier try's refusal), ``conn`` still in its transaction."""
        if self.finish_witnessed(conn, decided, same, commit_ms):
            return True
        if not conn.in_transaction():  # a witness was found and the batch was marked already
            return False
        if decided is None or decided.committed or not same(conn, decided):
            return False
        if not rename:
            return None
        why = self._refusal(conn)
        if why is not None:
            log.info("overwrite of %s applied in place (DELETE + INSERT), not by a swap: %s", self._where(), why)
            return None
        found = decided_rows(self.journal.dialect, conn, self.spec, self.xids)
        target = renamed_target(self.spec, self.batch_id, found)
        drop_finished_witnesses(self.journal, self.swap, conn, self.sink_id, self.spec)
        conn.rollback()  # the read ends here: the build's DDL would commit it anyway
        try:
            self.rows = self.swap.build(conn, target)
            fault("driver.swap_built", batch=self.batch_id)
            self.swap.rename(conn, target, self.witness)
        except SwapRefused as exc:
            log.info("overwrite of %s applied in place (DELETE + INSERT), not by a swap: %s", self._where(), exc)
            conn.begin()
            return None
        fault("driver.swap_renamed", batch=self.batch_id)
        if not self._mark(conn, commit_ms):
            raise JournalError(
                f"sink {self.sink_id} batch {self.batch_id}: its overwrite was swapped in, but marking it committed "
                f"changed no row of {self.journal.batches.fullname}: the row was changed by something other than "
                "xasink. The table shows the batch's rows; 'xasink recover' marks it."
            )
        return True

    def finish_witnessed(
        self,
        conn: Connection,
        decided: BatchRecord | None,
        same: Callable[[Connection, BatchRecord | None], bool],
        commit_ms: int | None,
    ) -> bool:
        """If this decision's rename happened (its witness is there): mark the batch if it is not marked yet,
        then drop the witness, ending ``conn``'s transaction; True when this call marked it.  Else nothing."""
        if not self.swap.exists(conn, self.spec.schema, self.witness):
            return False
        if decided is not None and not decided.committed and not same(conn, decided):
            raise JournalError(
                f"sink {self.sink_id} batch {self.batch_id}: the table {self._where()} was swapped for this "
                f"decision (its old storage is {self.witness}), but the log holds another decision of the batch"
            )
        marked = decided is not None and not decided.committed and self._mark(conn, commit_ms)
        if not marked:
            conn.rollback()
            self.swap.drop(conn, self.spec.schema, self.witness)
        log.info("sink %s batch %s: its overwrite was swapped in by an earlier try", self.sink_id, self.batch_id)
        return marked

    def _mark(self, conn: Connection, commit_ms: int | None) -> bool:
        """Mark the batch and clear its rows from the shadow in one transaction, then drop the witness."""
        dialect = self.journal.dialect
        if not conn.in_transaction():
            conn.begin()
        if not self.journal.mark_within(conn, self.sink_id, self.batch_id, commit_ms):
            conn.rollback()
            return False
        dialect.durable_commit(conn)
        clear_batch(dialect, conn, self.spec, self.batch_id, decided_rows(dialect, conn, self.spec, self.xids))
        conn.commit()
        fault("driver.swap_marked", batch=self.batch_id)
        self.swap.drop(conn, self.spec.schema, self.witness)
        return True

    def _refusal(self, conn: Connection) -> str | None:
        longest = len(witness_prefix(self.spec)) + 21 + 8
        if longest > self.swap.max_name:
            return f"the decision log's table prefix is too long for the old storage's name ({longest} characters)"
        return self.swap.refusal(conn, self.spec.schema, self.spec.table)

    def _where(self) -> str:
        return f"{self.spec.schema}.{self.spec.table}" if self.spec.schema else self.spec.table


def drop_finished_witnesses(
    journal: Journal, swap: RenameSwap, conn: Connection, sink_id: str, spec: ApplySpec
) -> None:
    """Drop the witnesses of the sink's marked overwrites that a killed run left: each holds a copy of the table
    as it was.  Run by each renamed overwrite and each planning of an overwrite of the sink; a witness of a
    decided batch not marked yet is kept (its apply marks it, then drops it)."""
    prefix = witness_prefix(spec)
    for name in swap.named_like(conn, spec.schema, prefix):
        _drop_if_finished(journal, swap, conn, sink_id, prefix, spec.schema, name)


def sweep_witnesses(journal: Journal, swap: RenameSwap, conn: Connection, sink_id: str) -> list[str]:
    """:func:`drop_finished_witnesses` of the sink in every schema the writer can see (``xasink recover``: a sink
    that never runs again keeps no copy of an overwritten table); the names dropped."""
    prefix = sink_witness_prefix(shadow_name(journal.prefix, journal.log_id(conn), sink_id))
    return [
        f"{schema}.{name}"
        for schema, name in swap.everywhere(conn, prefix)
        if _drop_if_finished(journal, swap, conn, sink_id, prefix, schema, name)
    ]


def _drop_if_finished(
    journal: Journal, swap: RenameSwap, conn: Connection, sink_id: str, prefix: str, schema: str | None, name: str
) -> bool:
    batch = witness_batch(prefix, name)
    if batch is None:
        return False
    record = journal.get(conn, sink_id, batch)
    conn.rollback()
    if record is not None and not record.committed:
        return False  # (its apply marks it, then drops it)
    log.info("sink %s: dropping %s, left by batch %s's overwrite after its mark", sink_id, name, batch)
    swap.drop(conn, schema, name)
    return True
