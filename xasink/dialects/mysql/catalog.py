"""What the server's catalog (information_schema) says of a table beyond SQLAlchemy's reflection: the tables
whose foreign keys refer to it, its columns' collations, and the types SQLAlchemy does not know."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from xasink.dialects.type_text import ServerType

_COLUMNS = "FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = COALESCE(:s, DATABASE()) AND TABLE_NAME = :t"


def referencing_tables(conn: Connection, schema: str | None, table: str) -> list[str]:
    """The other tables whose foreign keys refer to ``table`` (``name``, or ``database.name`` elsewhere).

    MariaDB answers this by opening every table of the server (a referencing table can be in any database):
    seconds on a busy server with many tables, which a session's max_statement_time set for the user's
    statements must not cut.  A table under concurrent DDL holds it up to lock_wait_timeout (controlLockTimeout),
    as any statement on that table."""
    unbounded = "SET STATEMENT max_statement_time = 0 FOR " if getattr(conn.dialect, "is_mariadb", False) else ""
    rows = conn.execute(
        sa.text(
            f"{unbounded}SELECT DISTINCT TABLE_SCHEMA, TABLE_NAME FROM information_schema.KEY_COLUMN_USAGE "
            "WHERE REFERENCED_TABLE_SCHEMA = COALESCE(:s, DATABASE()) AND REFERENCED_TABLE_NAME = :t "
            "AND NOT (TABLE_SCHEMA = REFERENCED_TABLE_SCHEMA AND TABLE_NAME = REFERENCED_TABLE_NAME) "
            "ORDER BY 1, 2"
        ),
        {"s": schema, "t": table},
    ).fetchall()
    here = conn.execute(sa.text("SELECT DATABASE()")).scalar()
    return [str(r[1]) if r[0] == here else f"{r[0]}.{r[1]}" for r in rows]


def column_collations(conn: Connection, schema: str | None, table: str) -> dict[str, str]:
    rows = conn.execute(
        sa.text(f"SELECT COLUMN_NAME, COLLATION_NAME {_COLUMNS} AND COLLATION_NAME IS NOT NULL"),
        {"s": schema, "t": table},
    ).all()
    return {str(name): str(collation) for name, collation in rows}


def name_unknown_types(conn: Connection, schema: str | None, table: str, columns: dict[str, Any]) -> None:
    """MariaDB's inet6, inet4 and uuid, and the geometries, are NullType to SQLAlchemy: a shadow made of them
    could not be created ("Can't generate DDL for NullType"), so an overwrite of such a table was refused.  They
    get the server's own text of the type (COLUMN_TYPE), which a shadow's column is made of."""
    unknown = {name for name, col in columns.items() if isinstance(col["type"], sa.types.NullType)}
    if not unknown:
        return
    found = conn.execute(sa.text(f"SELECT COLUMN_NAME, COLUMN_TYPE {_COLUMNS}"), {"s": schema, "t": table}).all()
    for name, type_text in found:
        if name in unknown:
            columns[name] = {**columns[name], "type": ServerType(str(type_text))}
