"""What the writing user may do on the decision log's tables, checked before a write opens a branch.

A DBA who creates the log with ``xasink ddl`` grants the writers what its header lists.  A grant left out must
fail the write before anything is prepared, naming the GRANT (a :class:`PreflightError`), never in the middle
of a batch as "run it again" (a BatchAbortedError that no rerun can cure).  The server itself is asked: each
privilege is tried with a statement that can touch no row (``WHERE false``), so roles, schema-wide and
column grants count exactly as they will for the real statements.  A success is remembered for the process
(the next write of a reused Spark worker pays nothing); a failure is checked again next time.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from xasink.dialects.base import Dialect
from xasink.errors import PreflightError

# what the protocol does on each table (the log's identity row is only read and inserted; a sink's row is
# locked FOR UPDATE, which PostgreSQL grants with UPDATE, and its horizon set by an upgrade)
NEEDED = {
    "log": ("SELECT", "INSERT"),
    "sinks": ("SELECT", "INSERT", "UPDATE"),
    "batches": ("SELECT", "INSERT", "UPDATE", "DELETE"),
    "claims": ("SELECT", "INSERT", "UPDATE", "DELETE"),
    "parts": ("SELECT", "INSERT", "UPDATE", "DELETE"),
}
# what docs/operations.md and the header of ``xasink ddl`` grant on each table
DOCUMENTED = {"log": "SELECT, INSERT"}
_ALL = "SELECT, INSERT, UPDATE, DELETE"

_checked: set[tuple[str, str]] = set()  # (server and user, table): granted


def _probe(table: sa.Table, privilege: str) -> sa.Executable:
    """A statement that needs ``privilege`` on ``table`` (and nothing else) and changes no row."""
    first = next(iter(table.c))
    if privilege == "SELECT":
        return sa.select(sa.literal(1)).select_from(table).where(sa.false())
    if privilege == "INSERT":  # every column: MySQL's strict mode refuses a statement that leaves one without default
        columns = list(table.c)
        return table.insert().from_select(columns, sa.select(*(sa.null() for _ in columns)).where(sa.false()))
    if privilege == "UPDATE":
        return table.update().where(sa.false()).values({first: sa.null()})
    return table.delete().where(sa.false())


def check_grants(dialect: Dialect, tables: Sequence[tuple[str, sa.Table]]) -> None:
    """Raise :class:`PreflightError` naming every privilege the user lacks on ``tables`` ((role, table): the
    role is the table's kind, ``sinks``, ``parts``...).  Tables that do not exist are skipped."""
    who = f"{dialect.url.render_as_string(hide_password=True)}"
    todo = [(role, t) for role, t in tables if (who, t.fullname) not in _checked]
    if not todo:
        return
    missing: list[tuple[str, sa.Table, str]] = []
    with dialect.connect(autocommit=True) as conn:
        for role, table in todo:
            if not _exists(dialect, conn, table):
                continue
            lacking = [p for p in NEEDED[role] if not _allowed(dialect, conn, table, p)]
            missing += [(role, table, p) for p in lacking]
            if not lacking:
                _checked.add((who, table.fullname))
    if missing:
        user = dialect.url.username or "the writing user"
        lines = [f"{p} on {t.fullname}" for _, t, p in missing]
        grants = {f"GRANT {DOCUMENTED.get(role, _ALL)} ON {t.fullname} TO {user}" for role, t, _ in missing}
        raise PreflightError(
            f"user {user} lacks {', '.join(lines)}, which the xasink decision log needs; nothing was written. "
            f"Grant what `xasink ddl postgres` (or `xasink ddl mysql`) lists (creating a table it lacks from that "
            f"DDL first): {'; '.join(sorted(grants))}"
        )


def _exists(dialect: Dialect, conn: Connection, table: sa.Table) -> bool:
    """Whether the table is there; one the user may not even describe (MySQL: no right on it at all) counts
    as there, since the protocol's own checks for it would fail the same way."""
    try:
        return sa.inspect(conn).has_table(table.name, schema=table.schema)
    except sa.exc.DBAPIError as exc:
        if dialect.denied(exc):
            return True
        raise


def _allowed(dialect: Dialect, conn: Connection, table: sa.Table, privilege: str) -> bool:
    try:
        conn.execute(_probe(table, privilege))
    except sa.exc.DBAPIError as exc:
        if dialect.denied(exc):
            return False
        raise
    return True
