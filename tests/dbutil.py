"""Small PostgreSQL helpers for tests (plain psycopg2, no xasink code)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg2
import psycopg2.extensions
from psycopg2 import sql

XASINK_GID_PREFIX = "xasink:"
SCRATCH_TABLE = "foreign_scratch"


def libpq_url(url: str) -> str:
    """Accept JDBC (``jdbc:postgresql://``) and SQLAlchemy (``postgresql+driver://``) spellings too."""
    url = url.removeprefix("jdbc:")
    return re.sub(r"^postgres(?:ql)?(?:\+[A-Za-z0-9_]+)?://", "postgresql://", url)


@contextmanager
def connect(url: str) -> Iterator[psycopg2.extensions.connection]:
    """An autocommit connection, closed on exit."""
    conn = psycopg2.connect(libpq_url(url))
    conn.autocommit = True
    try:
        yield conn
    finally:
        conn.close()


def _table(name: str) -> sql.Composable:
    return sql.Identifier(*name.split("."))


def prepared_gids(url: str, prefix: str | None = None) -> list[str]:
    """Gids of the transactions prepared in the URL's database (optionally only those starting with prefix)."""
    with connect(url) as conn, conn.cursor() as cur:
        cur.execute("SELECT gid FROM pg_prepared_xacts WHERE database = current_database() ORDER BY prepared, gid")
        gids = [row[0] for row in cur.fetchall()]
    if prefix is not None:
        gids = [g for g in gids if g.startswith(prefix)]
    return gids


def rows(url: str, table: str, order_by: str = "1") -> list[tuple]:
    """All rows of table (``name`` or ``schema.name``), ordered by the SQL expression order_by."""
    with connect(url) as conn, conn.cursor() as cur:
        cur.execute(sql.SQL("SELECT * FROM {} ORDER BY {}").format(_table(table), sql.SQL(order_by)))
        return list(cur.fetchall())


def make_foreign_prepared(url: str, gid: str, table: str | None = None) -> None:
    """Leave a prepared transaction named gid that is not xasink's: one row inserted into a scratch table."""
    name = _table(table or SCRATCH_TABLE)
    with connect(url) as conn, conn.cursor() as cur:
        cur.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} (x int)").format(name))
        cur.execute("BEGIN")
        cur.execute(sql.SQL("INSERT INTO {} (x) VALUES (1)").format(name))
        cur.execute("PREPARE TRANSACTION %s", (gid,))


def rollback_prepared(url: str, gid: str) -> None:
    with connect(url) as conn, conn.cursor() as cur:
        cur.execute("ROLLBACK PREPARED %s", (gid,))


def commit_prepared(url: str, gid: str) -> None:
    with connect(url) as conn, conn.cursor() as cur:
        cur.execute("COMMIT PREPARED %s", (gid,))
