"""MariaDB/MySQL: an overwrite by renaming a new table into the target's place.

Views, grants and the code around the table bind it by name, and ``RENAME TABLE t TO old, new TO t`` swaps both
names at once.  But DDL commits: the swap cannot commit with the batch's mark, as PostgreSQL's does.  So the
old storage takes a name that says which decision swapped it (:func:`xasink.write_modes.swap.rename_names`):
the rename is the point of no return, and the table under that name is its witness until the mark has
committed.  The caller (:mod:`xasink.protocol.renamed_overwrite`) runs the steps under the table's apply lock,
which GET_LOCK keeps across the commits.

The new table is ``CREATE TABLE … LIKE`` the target (columns, defaults, indexes, CHECK constraints, comments,
table options, partitioning), its AUTO_INCREMENT counter set to the target's, loaded by one
``INSERT … SELECT`` into the empty table (InnoDB logs no undo per row there) and analyzed.  ``LIKE`` copies
no trigger and no foreign key, and a system-versioned table's history would be lost: such tables, tables other
engines than InnoDB hold, and a writer that may not create, rename or drop tables are overwritten in place
(:class:`SwapRefused`, nothing changed).
"""

from __future__ import annotations

import logging

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from xasink.dialects.mysql.catalog import referencing_tables
from xasink.dialects.mysql.errors import PRIVILEGE_CODES
from xasink.dialects.mysql.sql import errno_of, quote_ident
from xasink.dialects.rendering import insert_selected
from xasink.dialects.values import SwapRefused, SwapTarget

log = logging.getLogger("xasink.dialects.mysql")

MAX_NAME = 64
LOCK_WAIT_TIMEOUT = 1205  # also MariaDB's answer to a metadata lock not granted within lock_wait_timeout
_TABLES = "FROM information_schema.TABLES WHERE TABLE_SCHEMA = COALESCE(:s, DATABASE())"


def _q(schema: str | None, name: str) -> str:
    return f"{quote_ident(schema)}.{quote_ident(name)}" if schema else quote_ident(name)


def refusal(conn: Connection, schema: str | None, table: str) -> str | None:
    """Why the target cannot be swapped without changing what others see (None: it can)."""
    found = conn.execute(
        sa.text(f"SELECT ENGINE, TABLE_TYPE {_TABLES} AND TABLE_NAME = :t"), {"s": schema, "t": table}
    ).first()
    if found is None:
        return "the table was not found in information_schema"
    engine, kind = found
    if str(kind).upper() == "SYSTEM VERSIONED":
        return "it is system-versioned (a new table would have no history)"
    if str(engine).upper() != "INNODB":
        return f"its engine is {engine}, not InnoDB"
    triggers = conn.execute(
        sa.text(
            "SELECT TRIGGER_NAME FROM information_schema.TRIGGERS WHERE EVENT_OBJECT_SCHEMA = COALESCE(:s, DATABASE()) "
            "AND EVENT_OBJECT_TABLE = :t ORDER BY 1"
        ),
        {"s": schema, "t": table},
    ).scalars()
    named = ", ".join(map(str, triggers))
    if named:
        return f"it has triggers ({named}), which a new table would not have"
    parents = conn.execute(
        sa.text(
            "SELECT CONSTRAINT_NAME FROM information_schema.REFERENTIAL_CONSTRAINTS "
            "WHERE CONSTRAINT_SCHEMA = COALESCE(:s, DATABASE()) AND TABLE_NAME = :t ORDER BY 1"
        ),
        {"s": schema, "t": table},
    ).scalars()
    named = ", ".join(map(str, parents))
    if named:
        return f"it has foreign keys ({named}), which a new table would not have"
    children = referencing_tables(conn, schema, table)
    if children:
        return f"{', '.join(children)} refer to it by foreign keys"
    return None


def exists(conn: Connection, schema: str | None, name: str) -> bool:
    found = conn.execute(sa.text(f"SELECT 1 {_TABLES} AND TABLE_NAME = :t"), {"s": schema, "t": name}).first()
    return found is not None


def named_like(conn: Connection, schema: str | None, prefix: str) -> list[str]:
    """The tables whose names start with ``prefix`` (matched literally)."""
    pattern = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
    rows = conn.execute(sa.text(f"SELECT TABLE_NAME {_TABLES} AND TABLE_NAME LIKE :p"), {"s": schema, "p": pattern})
    return sorted(str(r[0]) for r in rows)


def drop(conn: Connection, schema: str | None, name: str) -> None:
    conn.exec_driver_sql(f"DROP TABLE IF EXISTS {_q(schema, name)}")
    conn.commit()


def _refused(exc: BaseException) -> bool:
    return errno_of(exc) in PRIVILEGE_CODES | {1143}


def build(conn: Connection, target: SwapTarget) -> int:
    """Make ``target.new`` like the target and load the batch into it (committed: DDL commits); the rows
    loaded.  A leftover of an earlier attempt is dropped first.  A writer who may not create the table:
    :class:`SwapRefused`, nothing left behind."""
    old, new = _q(target.schema, target.table), _q(target.schema, target.new)
    try:
        drop(conn, target.schema, target.new)
        conn.exec_driver_sql(f"CREATE TABLE {new} LIKE {old}")
        conn.commit()  # (DDL commits on the server: this keeps the connection's state the same)
    except sa.exc.DBAPIError as exc:
        conn.rollback()
        if _refused(exc):
            raise SwapRefused(f"the writer may not create a table beside it ({exc.orig})") from None
        raise
    try:
        if not getattr(conn.dialect, "is_mariadb", False):  # MySQL 8 caches the catalog's counters
            conn.exec_driver_sql("SET SESSION information_schema_stats_expiry = 0")
        counter = conn.execute(
            sa.text(f"SELECT AUTO_INCREMENT {_TABLES} AND TABLE_NAME = :t"),
            {"s": target.schema, "t": target.table},
        ).scalar()
        if counter:  # the next generated value goes on from the target's, not from the batch's largest
            conn.exec_driver_sql(f"ALTER TABLE {new} AUTO_INCREMENT = {int(counter)}")
        conn.commit()
        table = sa.table(target.new, *(sa.column(c) for c in target.columns), schema=target.schema)
        rows = insert_selected(conn, table, list(target.columns), target.rows)
        conn.commit()
        conn.exec_driver_sql(f"ANALYZE TABLE {new}").all()  # its answer is a result set, never an error
        conn.commit()
        return rows
    except BaseException:
        conn.rollback()
        _drop_quietly(conn, target.schema, target.new)
        raise


def rename(conn: Connection, target: SwapTarget, witness: str, patience_s: float) -> None:
    """``RENAME TABLE target TO witness, new TO target``: both or neither.  A session keeping the target open
    past ``patience_s`` (its metadata lock), or a writer who may not rename it: :class:`SwapRefused` and the
    new table dropped, the target untouched."""
    old, new = _q(target.schema, target.table), _q(target.schema, target.new)
    kept = int(conn.exec_driver_sql("SELECT @@SESSION.lock_wait_timeout").scalar() or 31_536_000)
    conn.exec_driver_sql(f"SET SESSION lock_wait_timeout = {max(1, int(patience_s))}")
    try:
        conn.exec_driver_sql(f"RENAME TABLE {old} TO {_q(target.schema, witness)}, {new} TO {old}")
        conn.commit()
    except sa.exc.DBAPIError as exc:
        conn.rollback()
        if not (_refused(exc) or errno_of(exc) == LOCK_WAIT_TIMEOUT):
            raise
        _drop_quietly(conn, target.schema, target.new)
        why = "a session kept it open" if errno_of(exc) == LOCK_WAIT_TIMEOUT else "the writer may not rename it"
        raise SwapRefused(f"{why} ({exc.orig})") from None
    finally:
        try:
            conn.exec_driver_sql(f"SET SESSION lock_wait_timeout = {kept}")
            conn.commit()
        except sa.exc.DBAPIError as exc:  # a lost session: the next statement says so
            log.debug("lock_wait_timeout not restored (%s)", exc)


def _drop_quietly(conn: Connection, schema: str | None, name: str) -> None:
    try:
        drop(conn, schema, name)
    except sa.exc.DBAPIError as exc:  # the next attempt drops it first
        log.warning("could not drop %s, built for an overwrite's swap: %s", name, exc.orig)


class RenamingSwap:
    """:class:`xasink.dialects.values.RenameSwap` for MariaDB/MySQL, waiting at most ``patience_s`` for the
    target's metadata lock (past it the in-place apply, which needs no such lock)."""

    max_name = MAX_NAME

    def __init__(self, patience_s: float) -> None:
        self.patience_s = patience_s

    def refusal(self, conn: Connection, schema: str | None, table: str) -> str | None:
        return refusal(conn, schema, table)

    def exists(self, conn: Connection, schema: str | None, name: str) -> bool:
        return exists(conn, schema, name)

    def named_like(self, conn: Connection, schema: str | None, prefix: str) -> list[str]:
        return named_like(conn, schema, prefix)

    def build(self, conn: Connection, target: SwapTarget) -> int:
        return build(conn, target)

    def rename(self, conn: Connection, target: SwapTarget, witness: str) -> None:
        rename(conn, target, witness, self.patience_s)

    def drop(self, conn: Connection, schema: str | None, name: str) -> None:
        drop(conn, schema, name)
