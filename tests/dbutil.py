"""Small database helpers for tests: PostgreSQL (plain psycopg2) and MariaDB/MySQL (plain pymysql); no xasink code."""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlsplit

import psycopg2
import psycopg2.extensions
import pymysql
from psycopg2 import sql

XASINK_GID_PREFIX = "xasink:"
SCRATCH_TABLE = "foreign_scratch"


def libpq_url(url: str) -> str:
    """Accept JDBC (``jdbc:postgresql://``) and SQLAlchemy (``postgresql+driver://``) spellings too."""
    url = url.removeprefix("jdbc:")
    return re.sub(r"^postgres(?:ql)?(?:\+[A-Za-z0-9_]+)?://", "postgresql://", url)


_LOGIN = re.compile(r"^((?:jdbc:)?[A-Za-z][A-Za-z0-9+.-]*://)(?:[^@/?#]*@)?")


def with_login(url: str, user: str, password: str | None = None) -> str:
    """The same URL logging in as user, with password (percent-encoded) or none: another role, a wrong password."""
    info = quote(user, safe="") + (":" + quote(password, safe="") if password is not None else "")
    return _LOGIN.sub(lambda m: f"{m.group(1)}{info}@", url, count=1)


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


# --------------------------------------------------------------------------- MariaDB / MySQL (plain pymysql)

XASINK_FORMAT_ID = 0x78617331  # xasink.xid.FORMAT_ID, repeated here so these helpers stay independent of xasink


def mariadb_params(url: str) -> dict[str, Any]:
    """pymysql keywords for ``mysql[+driver]://user:pw@host:port/db`` or ``jdbc:mysql|mariadb://host:port/db``."""
    parts = urlsplit(re.sub(r"^(?:jdbc:)?(?:mysql|mariadb)(?:\+[A-Za-z0-9_]+)?://", "mysql://", url))
    query = dict(parse_qsl(parts.query))
    return {
        "host": parts.hostname or "127.0.0.1",
        "port": parts.port or 3306,
        "user": unquote(parts.username) if parts.username else query.get("user", "root"),
        "password": unquote(parts.password) if parts.password else query.get("password", ""),
        "database": parts.path.lstrip("/") or None,
        "charset": "utf8mb4",
        "autocommit": True,
    }


@contextmanager
def mariadb_connect(url: str, database: bool = True) -> Iterator[pymysql.connections.Connection]:
    """An autocommit pymysql connection (to the URL's database unless ``database`` is False), closed on exit."""
    params = mariadb_params(url)
    if not database:
        params["database"] = None
    conn = pymysql.connect(**params)
    try:
        yield conn
    finally:
        conn.close()


def mariadb_recover(url: str) -> list[tuple[int, bytes, bytes]]:
    """Every prepared XA transaction of the server (XA RECOVER knows no database) as (formatID, gtrid, bqual)."""
    with mariadb_connect(url, database=False) as conn, conn.cursor() as cur:
        cur.execute("XA RECOVER")
        out = []
        for fmt, glen, blen, data in cur.fetchall():
            raw = data if isinstance(data, bytes) else str(data).encode()
            out.append((int(fmt), raw[: int(glen)], raw[int(glen) : int(glen) + int(blen)]))
        return out


def mariadb_prepared_gids(url: str, sink_ids: Iterable[str] | None = None) -> list[str]:
    """Gids (``gtrid/bqual``) of xasink's prepared branches on the server, optionally only of the given sinks."""
    wanted = set(sink_ids) if sink_ids is not None else None
    gids = []
    for fmt, gtrid, bqual in mariadb_recover(url):
        if fmt != XASINK_FORMAT_ID or not gtrid.startswith(XASINK_GID_PREFIX.encode()):
            continue
        gid = f"{gtrid.decode()}/{bqual.decode()}"
        if wanted is None or gid.split(":")[1] in wanted:
            gids.append(gid)
    return sorted(gids)


def mariadb_sink_ids(url: str, prefix: str = "xasink_") -> list[str]:
    """Sinks recorded in the URL's database journal (none when it has no journal yet)."""
    with mariadb_connect(url) as conn, conn.cursor() as cur:
        cur.execute(
            "SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = %s",
            (f"{prefix}sinks",),
        )
        row = cur.fetchone()
        if not row or not row[0]:
            return []
        cur.execute(f"SELECT sink_id FROM `{prefix}sinks`")
        return [r[0] for r in cur.fetchall()]


def _mariadb_table(name: str) -> str:
    return ".".join("`" + p.replace("`", "``") + "`" for p in name.split("."))


def mariadb_rows(url: str, table: str, order_by: str = "1") -> list[tuple]:
    """All rows of table (``name`` or ``db.name``), ordered by the SQL expression order_by."""
    with mariadb_connect(url) as conn, conn.cursor() as cur:
        cur.execute(f"SELECT * FROM {_mariadb_table(table)} ORDER BY {order_by}")
        return list(cur.fetchall())


def mariadb_xa_literal(format_id: int, gtrid: bytes, bqual: bytes) -> str:
    return f"X'{gtrid.hex()}',X'{bqual.hex()}',{int(format_id)}"


def mariadb_wait_detached(url: str, connection_id: int, timeout_s: float = 30.0) -> None:
    """Wait until the server has finished disconnecting a session: only then may another one finish its branch."""
    deadline = time.monotonic() + timeout_s
    with mariadb_connect(url, database=False) as conn, conn.cursor() as cur:
        while True:
            cur.execute("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = %s", (connection_id,))
            row = cur.fetchone()
            if not row or not row[0]:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"session {connection_id} still connected after {timeout_s}s")
            time.sleep(0.005)


def mariadb_make_foreign_prepared(
    url: str, gtrid: bytes, bqual: bytes = b"", format_id: int = 1, table: str | None = None
) -> tuple[int, bytes, bytes]:
    """Leave a prepared XA transaction that is not xasink's (one row in a scratch table), owner disconnected."""
    name = _mariadb_table(table or SCRATCH_TABLE)
    xa = mariadb_xa_literal(format_id, gtrid, bqual)
    with mariadb_connect(url) as conn, conn.cursor() as cur:
        cur.execute(f"CREATE TABLE IF NOT EXISTS {name} (x int) ENGINE=InnoDB")
        cur.execute("SELECT CONNECTION_ID()")
        row = cur.fetchone()
        assert row is not None
        cur.execute(f"XA START {xa}")
        cur.execute(f"INSERT INTO {name} (x) VALUES (1)")
        cur.execute(f"XA END {xa}")
        cur.execute(f"XA PREPARE {xa}")
    mariadb_wait_detached(url, int(row[0]))
    return format_id, gtrid, bqual


def mariadb_rollback_xa(url: str, format_id: int, gtrid: bytes, bqual: bytes) -> None:
    with mariadb_connect(url, database=False) as conn, conn.cursor() as cur:
        cur.execute(f"XA ROLLBACK {mariadb_xa_literal(format_id, gtrid, bqual)}")


def mariadb_rollback_gid(url: str, gid: str) -> None:
    """Roll back one of xasink's branches by its ``gtrid/bqual`` gid."""
    gtrid, bqual = gid.split("/", 1)
    mariadb_rollback_xa(url, XASINK_FORMAT_ID, gtrid.encode(), bqual.encode())
