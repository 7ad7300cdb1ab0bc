"""Which overwrites swap the table's storage instead of replacing its rows in place, and the fallback.

An overwrite of a whole table that nothing else refers to is applied by the dialect's swap when it can do one
(:meth:`Dialect.swap_table`): the batch is loaded into a new table made like the target, which takes the target's
place, in the apply transaction (the batch's mark commits with it).  Anything that binds the table by identity,
or a writer that may not rename it, makes the dialect refuse (:class:`SwapRefused`, nothing changed): the batch is
then applied in place as before (DELETE + INSERT .. SELECT), and the log says why.
"""

from __future__ import annotations

import hashlib
import logging
import zlib
from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from xasink.dialects.base import Dialect
from xasink.dialects.values import SwapRefused, SwapTarget
from xasink.protocol.xid import Xid
from xasink.write_modes.shadow import DecidedRows, of_branches
from xasink.write_modes.spec import OVERWRITE, ApplySpec

log = logging.getLogger(__name__)


def swap_name(spec: ApplySpec) -> str:
    """The new storage's name while it is built: ``sw_`` and a hash of the shadow's name (one per decision log and
    sink) and the target's, so one sink's overwrites of two tables at once never build into one table."""
    head, _, _ = spec.shadow.rpartition("sh_")
    return f"{head}sw_{zlib.crc32(f'{spec.shadow}:{spec.schema}.{spec.table}'.encode()):08x}"


def swap_overwrite(
    dialect: Dialect, conn: Connection, spec: ApplySpec, shadow: sa.TableClause, mine: sa.ColumnElement[bool]
) -> int | None:
    """Overwrite the target by a swap inside the caller's transaction; the rows written, or None when the dialect
    refused (the savepoint rolled back: the caller applies in place)."""
    if spec.kind != OVERWRITE or not dialect.swaps_tables:
        return None
    rows = sa.select(*(shadow.c[c] for c in spec.columns)).where(mine)
    target = SwapTarget(spec.schema, spec.table, swap_name(spec), spec.columns, rows)
    try:
        with conn.begin_nested():
            return dialect.swap_table(conn, target)
    except SwapRefused as exc:
        where = f"{spec.schema}.{spec.table}" if spec.schema else spec.table
        log.info("overwrite of %s applied in place (DELETE + INSERT), not by a swap: %s", where, exc)
        return None


def witness_prefix(spec: ApplySpec) -> str:
    """The start of the names the old storage of this sink's renamed overwrites takes (``sh_`` made ``so_``)."""
    return sink_witness_prefix(spec.shadow)


def sink_witness_prefix(shadow: str) -> str:
    """:func:`witness_prefix` of the sink whose shadow is named ``shadow`` (:func:`spec.shadow_name`)."""
    head, _, tail = shadow.rpartition("sh_")
    return f"{head}so_{tail}_"


def witness_name(spec: ApplySpec, batch_id: int, xids: Sequence[Xid]) -> str:
    """The old storage's name after a renamed overwrite of this decision: the sink, the batch, and a hash of the
    decision's branches (a decision withdrawn and made again by another run names another table).  Its
    existence proves the rename happened, until the mark has committed."""
    digest = hashlib.blake2b("|".join(sorted(x.gtrid + x.bqual for x in xids)).encode(), digest_size=4)
    return f"{witness_prefix(spec)}{batch_id}_{digest.hexdigest()}"


def witness_batch(prefix: str, name: str) -> int | None:
    """The batch a witness of the sink whose witnesses start with ``prefix`` names (None: not such a name)."""
    batch, _, digest = name[len(prefix) :].partition("_")
    return int(batch) if name.startswith(prefix) and batch.isdigit() and digest else None


def renamed_target(spec: ApplySpec, batch_id: int, decided: DecidedRows) -> SwapTarget:
    """The new table to build for a renamed overwrite, and the SELECT of the decided rows from the shadow."""
    shadow = sa.table(spec.shadow, *(sa.column(c) for c in [*spec.columns, *decided.tag_columns()]), schema=spec.schema)
    rows = sa.select(*(shadow.c[c] for c in spec.columns)).where(of_branches(shadow, batch_id, decided.branches))
    return SwapTarget(spec.schema, spec.table, swap_name(spec), spec.columns, rows)
