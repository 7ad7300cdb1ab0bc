"""The change-data apply's merge into a MariaDB/MySQL table: rows whose key matches are updated (unless older by
the sequence), the others inserted, and any unique conflict but the key's fails the apply, as PostgreSQL's
``INSERT .. ON CONFLICT (key)`` does.

Two ways, chosen inside the apply's transaction from what the table is at that moment (recovery may apply a
batch long after it was planned):

- ``INSERT .. SELECT .. ON DUPLICATE KEY UPDATE``, one pass over the rows (0.9-1.4 s for 180k rows into a
  1M-row table, where the other way takes 1.7-2.0 s).  It updates the row that conflicts on whichever unique
  index comes first, so it is used only when the key's own index (a plain B-tree over exactly the key's
  columns, no prefix) is the table's only unique index; and only without triggers, which would see an INSERT
  for every row, the updated ones included.
- otherwise an ``UPDATE`` joined by the key, then a plain ``INSERT`` of the keys not in the table: a conflict
  on any other index is a duplicate-key error naming that index.

Rows written are counted the same either way: the rows updated (changed or not) plus the rows inserted; the
rows left alone because the stored row is newer are not.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from xasink.dialects.mysql.sql import quote_ident
from xasink.dialects.rendering import insert_selected
from xasink.dialects.values import Merge

OLDER_COUNTER = "@xasink_older_"  # the session variable the upsert counts the rows it leaves alone in


def upsert_from_select(merge: Merge, count_older: bool = False) -> sa.Insert:
    """``INSERT .. SELECT .. ON DUPLICATE KEY UPDATE``; with a sequence, a row older than the stored one leaves
    it as it is, and ``count_older`` adds each such row to :data:`OLDER_COUNTER`."""
    from sqlalchemy.dialects.mysql import insert

    target, keys, sequence = merge.target, merge.keys, merge.sequence
    stmt = insert(target).from_select(merge.columns, merge.select)
    rest = [c for c in merge.columns if c not in keys]
    if sequence is not None:  # assigned left to right: the sequence last, so every test sees the stored one
        rest = [c for c in rest if c != sequence] + [sequence]
    if not rest:
        rest = keys[:1]  # a key-only table: a no-op update keeps the existing row
    updates: list[tuple[str, Any]] = []
    for c in rest:
        value: Any = _inserted(c)
        if sequence is not None:
            stored = target.c[sequence]
            kept: Any = target.c[c]
            if count_older and c == sequence:  # evaluated once per row left alone; the value stays the stored one
                counted = sa.literal_column(f"({OLDER_COUNTER} := {OLDER_COUNTER} + 1)").is_(None)
                kept = sa.case((counted, sa.null()), else_=target.c[c])
            value = sa.case((sa.or_(stored.is_(None), stored <= _inserted(sequence)), value), else_=kept)
        updates.append((c, value))
    return stmt.on_duplicate_key_update(updates)


def _inserted(column: str) -> sa.ColumnElement[Any]:
    """The row's would-be value, ``VALUES(column)``: SQLAlchemy's own ``inserted`` doubles a '%' in the name
    twice over."""
    return sa.literal_column(f"VALUES({quote_ident(column)})")


def merge_from_select(conn: Connection, merge: Merge) -> int:
    """Merge the selected rows into the target inside the caller's transaction; the rows written."""
    rest = [c for c in merge.columns if c not in merge.keys]
    if rest and key_is_only_unique(conn, merge.target, merge.keys):
        return _merge_by_upsert(conn, merge)
    return _merge_by_update(conn, merge, rest)


def key_is_only_unique(conn: Connection, target: sa.TableClause, keys: list[str]) -> bool:
    """Whether the key's own plain unique index is the table's only unique index and no trigger is on it (read
    in the caller's transaction: no commit, no rollback).  The table is opened first: its metadata lock, held to
    the end of the transaction, makes an index or trigger another session adds wait for the apply's commit
    (reading the definition alone holds nothing, and the merge may be the apply's first statement on the table)."""
    conn.execute(sa.select(sa.literal(1)).select_from(target).limit(0))
    # SHOW reads this one table's definition and triggers (information_schema's TRIGGERS scans the schema)
    prep = conn.dialect.identifier_preparer
    found = conn.exec_driver_sql(f"SHOW INDEX FROM {prep.format_table(target)}").mappings().all()
    indexes: dict[str, set[str]] = {}
    for row in found:
        if int(row["Non_unique"]):
            continue
        if row["Sub_part"] is not None or str(row["Index_type"]).upper() != "BTREE":
            return False
        indexes.setdefault(str(row["Key_name"]), set()).add(str(row["Column_name"]).lower())
    if list(indexes.values()) != [{k.lower() for k in keys}]:
        return False
    within = f" FROM {prep.quote_identifier(target.schema)}" if target.schema else ""
    show = f"SHOW TRIGGERS{within} WHERE `Table` = %(table)s"
    triggers = conn.exec_driver_sql(show, {"table": target.name}).all()
    return not triggers


def _merge_by_upsert(conn: Connection, merge: Merge) -> int:
    candidates = int(conn.execute(sa.select(sa.func.count()).select_from(merge.select.subquery())).scalar() or 0)
    if not candidates:  # nothing to upsert: no INSERT (rendering.insert_selected says why)
        return 0
    if merge.sequence is None:
        conn.execute(upsert_from_select(merge))
        return candidates
    conn.exec_driver_sql(f"SET {OLDER_COUNTER} = 0")
    conn.execute(upsert_from_select(merge, count_older=True))
    older = conn.exec_driver_sql(f"SELECT {OLDER_COUNTER}").scalar()
    return candidates - int(older or 0)


def _merge_by_update(conn: Connection, merge: Merge, rest: list[str]) -> int:
    target, columns, keys, sequence = merge.target, merge.columns, merge.keys, merge.sequence
    src, where = _source(merge.select)
    same_key = sa.and_(*(target.c[k] == src.c[k] for k in keys), where)
    written = 0
    if rest:
        update = sa.update(target).where(same_key).values({target.c[c]: src.c[c] for c in rest})
        if sequence is not None:  # a change older than the stored row is ignored
            stored = target.c[sequence]
            update = update.where(sa.or_(stored.is_(None), stored <= src.c[sequence]))
        written += max(conn.execute(update).rowcount or 0, 0)
    unmatched = ~sa.exists().where(*(target.c[k] == src.c[k] for k in keys))
    new = sa.select(*(src.c[c] for c in columns)).where(where, unmatched)
    return written + insert_selected(conn, target, columns, new)


def _source(select: sa.Select[Any]) -> tuple[sa.FromClause, sa.ColumnElement[bool]]:
    """The table and condition of a select of one table's columns, else the select as a derived table: MariaDB
    materializes a derived table in a multi-table UPDATE (a third of the time of a 200k-row merge)."""
    froms = select.get_final_froms()
    if len(froms) == 1 and all(getattr(c, "table", None) is froms[0] for c in select.selected_columns):
        return froms[0], select.whereclause if select.whereclause is not None else sa.true()
    return select.subquery("xasink_src"), sa.true()
