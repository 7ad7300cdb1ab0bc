"""Which overwrites swap the table's storage instead of replacing its rows in place, and the fallback.

An overwrite of a whole table that nothing else refers to is applied by the dialect's swap when it can do one
(:meth:`Dialect.swap_table`): the batch is loaded into a new table made like the target, which takes the target's
place, in the apply transaction (the batch's mark commits with it).  Anything that binds the table by identity,
or a writer that may not rename it, makes the dialect refuse (:class:`SwapRefused`, nothing changed): the batch is
then applied in place as before (DELETE + INSERT .. SELECT), and the log says why.
"""

from __future__ import annotations

import logging

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from xasink.dialects.base import Dialect
from xasink.dialects.values import SwapRefused, SwapTarget
from xasink.write_modes.spec import OVERWRITE, ApplySpec

log = logging.getLogger(__name__)


def swap_name(spec: ApplySpec) -> str:
    """The new storage's name while it is built (its shadow's, ``sh_`` made ``sw_``): one per decision log and
    sink, and it exists only inside an apply transaction (renamed to the target's name, or rolled back)."""
    head, _, tail = spec.shadow.rpartition("sh_")
    return f"{head}sw_{tail}"


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
