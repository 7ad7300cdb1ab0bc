"""The change-data apply (``upsertKeyColumns`` + ``deleteFlagColumn`` / ``sequenceColumn``) of a decided batch.

Runs inside the apply's local transaction (:func:`xasink.write_modes.statements.apply_statements`).  The newest
change of each key is computed once, from the decided branches' rows of the shadow, into a temporary table keyed
by the upsert keys (the dialect's :meth:`~xasink.dialects.base.Dialect.create_changes_table`: gone with the
transaction, or dropped at the end); the deletes, the upserts and the tombstones then join that small table by
key.  Ranking the shadow in every statement cost a sort per statement, and cleaning tombstones against the
ranked shadow a scan of the tombstones per batch.

What it does, in order:

1. the newest change per key by the sequence (without one, a key changing twice is an :class:`ApplyError`),
   and whether a tombstone newer than it buries it (a change older than a delete is ignored);
2. the deletes that are not older than the stored row; the keys they leave absent become tombstones (with the
   delete's sequence, when newer than the key's tombstone);
3. the upserts not older than the stored row: only rows whose key matches are updated, any other unique
   conflict fails the apply (the dialect's ``merge_from_select``);
4. a key of the batch alive in the table loses its tombstone.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from xasink.dialects.base import Dialect
from xasink.dialects.values import Merge
from xasink.errors import ApplyError, PreflightError
from xasink.write_modes.spec import ApplySpec

CHANGES_TABLE = "xasink_changes_"  # the temporary table of the newest change per key
LIVE_COLUMN = "xasink_live_"  # ... whether no tombstone newer than the change buries it


def apply_changes(
    dialect: Dialect,
    conn: Connection,
    spec: ApplySpec,
    target: sa.TableClause,
    shadow: sa.TableClause,
    mine: sa.ColumnElement[bool],
) -> int:
    """Apply the changes of the shadow's rows ``mine`` to ``target``; rows written (updated or inserted)."""
    keys = list(spec.keys)
    if spec.sequence is None:
        by_key = [shadow.c[k] for k in keys]
        twice = conn.execute(
            sa.select(*by_key).where(mine).group_by(*by_key).having(sa.func.count() > 1).limit(1)
        ).first()
        if twice is not None:
            raise ApplyError(
                f"key ({', '.join(map(str, twice))}) changes more than once in this batch and nothing orders "
                "the changes: set 'sequenceColumn' (e.g. the source's LSN or change time), or deduplicate"
            )
    tomb = None
    if spec.tombstones is not None and spec.sequence is not None:
        tomb = sa.table(spec.tombstones, *(sa.column(c) for c in (*keys, spec.sequence)), schema=spec.schema)
    names = [*spec.columns, *([spec.flag] if spec.flag else [])]
    rows = sa.select(*(shadow.c[c] for c in names), *([sa.true().label(LIVE_COLUMN)] if tomb is not None else []))
    chg = dialect.create_changes_table(conn, CHANGES_TABLE, spec.schema, rows.where(mine), keys, spec.sequence)
    if tomb is not None and spec.sequence is not None:  # a change older than a delete is ignored
        buried = sa.and_(*(tomb.c[k] == chg.c[k] for k in keys), tomb.c[spec.sequence] > chg.c[spec.sequence])
        conn.execute(sa.update(chg).values({chg.c[LIVE_COLUMN]: False}).where(buried))
    same_key = sa.and_(*(target.c[k] == chg.c[k] for k in keys))
    live: sa.ColumnElement[bool] = chg.c[LIVE_COLUMN].is_(True) if tomb is not None else sa.true()
    newer: sa.ColumnElement[bool] = sa.true()
    if spec.sequence is not None:  # a change older than the stored row is ignored: a replay never moves it back
        stored = target.c[spec.sequence]
        newer = sa.or_(stored.is_(None), stored <= chg.c[spec.sequence])
    if spec.flag is not None:
        deletes = sa.and_(live, chg.c[spec.flag].is_(True))
        conn.execute(dialect.delete_joined(target, chg, sa.and_(same_key, deletes, newer)))
        if tomb is not None and spec.sequence is not None:  # remember the deletes that took effect
            cols = [*keys, spec.sequence]
            gone = sa.select(*(chg.c[c] for c in cols)).where(deletes, ~sa.exists().where(same_key))
            conn.execute(dialect.upsert_from_select(Merge(tomb, cols, gone, keys, spec.sequence)))
    upserts = sa.select(*(chg.c[c] for c in spec.columns)).where(live)
    if spec.flag is not None:
        upserts = upserts.where(sa.func.coalesce(chg.c[spec.flag], False).is_(False))
    # only rows whose key matches are updated; any other unique conflict fails the apply
    written = dialect.merge_from_select(conn, Merge(target, list(spec.columns), upserts, keys, spec.sequence))
    if tomb is not None:  # a key of this batch alive in the table loses its tombstone: found by the batch's keys
        alive = sa.exists().where(*(target.c[k] == tomb.c[k] for k in keys))
        conn.execute(sa.delete(tomb).where(*(tomb.c[k] == chg.c[k] for k in keys), alive))
    dialect.drop_changes_table(conn, chg)
    return written


def check_changes_table(dialect: Dialect, conn: Connection, spec: ApplySpec, shadow: sa.FromClause) -> None:
    """Make (and drop) the apply's temporary table once, before any branch opens: a role that may not create
    temporary tables fails here, with what to grant, and not after the decision."""
    rows = sa.select(*(shadow.c[c] for c in spec.columns)).where(sa.false())
    try:
        with conn.begin():
            chg = dialect.create_changes_table(conn, CHANGES_TABLE, spec.schema, rows, list(spec.keys), spec.sequence)
            dialect.drop_changes_table(conn, chg)
    except sa.exc.DBAPIError as exc:
        conn.rollback()
        text = str(getattr(exc, "orig", exc)).strip().splitlines()
        raise PreflightError(
            f"a change-data write to {spec.table} computes the newest change per key in a temporary table, but "
            f"creating one failed: {text[0] if text else type(exc).__name__}. If the role may not create "
            "temporary tables, grant it (PostgreSQL: GRANT TEMPORARY ON DATABASE ..; MariaDB/MySQL: GRANT CREATE "
            "TEMPORARY TABLES ON db.*)"
        ) from None
