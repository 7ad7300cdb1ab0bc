"""The databases a dialect-neutral test runs against: one :class:`Target` per dialect, and the plain
database helpers the tests and the test drivers share (one module: what was tests/dbutil.py is here).

The ``db`` fixture (tests/conftest.py) is parametrized over ``postgresql`` (id ``pg``, the session's
private server) and ``mariadb`` (id ``mariadb``, the machine's server, a fresh database per session).
A test written against ``db`` states its checks once; the target answers them with the plain driver
(psycopg2 / pymysql, through the helpers below: a URL in, rows out, no xasink code), never with xasink
code (but for naming an XA transaction the way ``xasink recover`` lists it), so a bug in xasink cannot
hide itself from the check.

What differs per dialect lives here: identifier quoting, DDL (storage engine, serial columns), how
prepared transactions are listed and named (``pg_prepared_xacts`` gids, ``XA RECOVER`` xids), lock
timeouts, column types.  MariaDB's ``XA RECOVER`` lists the whole server, where other test sessions may
be running: :meth:`Target.prepared` only reports branches of sinks registered in this session's
database, and tests give their foreign transactions unique names.
"""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlsplit

import psycopg2
import psycopg2.errors
import psycopg2.extensions
import pymysql
import pytest
from psycopg2 import sql

from tests.leaks import SECRET
from xasink.protocol.xid import Xid

# --------------------------------------------------------------------------- plain helpers: a URL in, rows out

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

XASINK_FORMAT_ID = 0x78617331  # xasink.protocol.xid.FORMAT_ID, repeated: these helpers stay independent of xasink


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


# --------------------------------------------------------------------------- targets

POSTGRESQL = "postgresql"
MARIADB = "mariadb"
IDS = {POSTGRESQL: "pg", MARIADB: "mariadb"}


@dataclass(frozen=True)
class Decision:
    """One row of the decision log (``xasink_batches``), read with the plain driver."""

    batch_id: int
    state: str
    xids: list[str]  # the decided gids, as listed in the log
    rows: int
    branches: int
    prepare_ms: int
    commit_ms: int | None


class Target(ABC):
    """One database under test, and the test's tables in it (dropped when the test ends)."""

    kind = ""
    # the password the tests pass explicitly (the ``password`` option), or None to pass none; an error
    # text must never show it
    password: str | None = None

    def __init__(self, url: str) -> None:
        self.url = url  # what users pass to xasink (``url`` option), user included
        self.tables: list[str] = []
        self.foreign: list[str] = []  # listed names of the foreign transactions the test made

    @property
    def id(self) -> str:
        return IDS[self.kind]

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.id}>"

    # -- names and statements -------------------------------------------------------------------
    @abstractmethod
    def q(self, name: str) -> str:
        """A quoted identifier (``schema.name`` parts each quoted)."""

    @abstractmethod
    @contextmanager
    def connect(self) -> Iterator[Any]:
        """A plain autocommit DB-API connection to the test database (psycopg2 / pymysql)."""

    def execute(self, statement: str, *params: Any) -> list[tuple[Any, ...]]:
        """Run one statement (``%s`` placeholders in both drivers); its rows, if it returns any."""
        with self.connect() as conn, conn.cursor() as cur:
            cur.execute(statement, params or None)
            return [tuple(r) for r in cur.fetchall()] if cur.description else []

    def rows(self, table: str, order_by: str = "1") -> list[tuple[Any, ...]]:
        """All rows of table, ordered by the SQL expression order_by."""
        return self.execute(f"SELECT * FROM {self.q(table)} ORDER BY {order_by}")

    # -- tables -----------------------------------------------------------------------------------
    def new_table(self) -> str:
        """A fresh table name, dropped when the test ends (whether xasink or the test creates it)."""
        name = f"t_{uuid.uuid4().hex[:8]}"
        self.tables.append(name)
        return name

    table_options = ""  # after a CREATE TABLE's column list (MariaDB: ENGINE=InnoDB)

    def create_table(self, table: str, columns: str) -> None:
        """``CREATE TABLE table (columns)`` in the dialect's DDL (MariaDB: InnoDB), dropped when the test ends."""
        if table not in self.tables:
            self.tables.append(table)
        self.execute(f"CREATE TABLE {self.q(table)} ({columns}){self.table_options}")

    def keyed_table(self, table: str, primary_key: bool = True) -> None:
        """``(id int [PRIMARY KEY], name text)``: the shape of the tests' frames."""
        self.create_table(table, f"id int{' PRIMARY KEY' if primary_key else ''}, name text")

    # a column that numbers inserted rows whether or not their transaction commits
    serial_column = ""

    @abstractmethod
    def serial_high_water(self, table: str) -> int:
        """How many values ``serial_column`` of table has handed out (committed or rolled back)."""

    @abstractmethod
    def table_exists(self, table: str) -> bool: ...

    @abstractmethod
    def drop_table(self, *tables: str) -> None:
        """Drop, unless a branch a failed test left prepared holds a lock (the leak check reports that)."""

    @abstractmethod
    def column_types(self, table: str) -> dict[str, str]:
        """Column name -> the server's full type name, in table order."""

    @abstractmethod
    def not_null_columns(self, table: str) -> list[str]: ...

    @abstractmethod
    @contextmanager
    def no_login_role(self, prefix: str) -> Iterator[str]:
        """A role (PostgreSQL) or locked user (MariaDB) nobody logs in as, to be granted things; dropped after."""

    def cleanup(self) -> None:
        """Roll back the test's foreign transactions that are still prepared, then drop its tables."""
        for name in self.foreign:
            self.clear_foreign(name)
        if self.tables:
            self.drop_table(*self.tables)

    # -- prepared transactions --------------------------------------------------------------------
    @abstractmethod
    def prepared(self, sink_id: str | None = None, batch_id: int | None = None) -> list[str]:
        """Gids (``xasink:<sink>:<batch>/<partition>:<attempt>``) of xasink's branches prepared for this database.

        Optionally only those of one sink (and batch).  Sorted.
        """

    @abstractmethod
    def listed(self) -> set[str]:
        """Every prepared transaction the server lists, named as xasink names it (ours and foreign)."""

    @abstractmethod
    def rollback_ours(self, gid: str) -> None:
        """Roll back one of xasink's branches by gid (a leak check's clean-up)."""

    @abstractmethod
    def make_foreign_prepared(self, name: str, table: str, format_id: int | None = None) -> str:
        """Leave a prepared transaction that is not xasink's (one row in ``table``); returns its listed name.

        MariaDB: ``name`` is split at the first '/' into gtrid and bqual, under XA formatID ``format_id``
        (default 1; xasink's own is :data:`XASINK_FORMAT_ID`).  MariaDB refuses a second
        transaction with the same gtrid and bqual under another formatID.  PostgreSQL: ``name`` is the gid.
        Whatever is still prepared when the test ends is rolled back by :meth:`cleanup`.
        """

    @abstractmethod
    def clear_foreign(self, listed_name: str) -> None:
        """Roll back a foreign transaction made by :meth:`make_foreign_prepared`, if it is still prepared."""

    # -- the decision log -----------------------------------------------------------------------
    def decisions(self, sink_id: str, prefix: str = "xasink_") -> dict[int, Decision]:
        """The decision log's records of one sink, by batch id (none when the log does not exist yet)."""
        if not self.table_exists(f"{prefix}batches"):
            return {}
        found = self.execute(
            f"SELECT batch_id, state, xids, {self.q('rows')}, branches, prepare_ms, commit_ms "
            f"FROM {self.q(prefix + 'batches')} WHERE sink_id = %s",
            sink_id,
        )
        return {
            int(b): Decision(int(b), str(s), list(json.loads(x)), int(r), int(n), int(p), None if c is None else int(c))
            for b, s, x, r, n, p, c in found
        }

    def knows_sink(self, sink_id: str, prefix: str = "xasink_") -> bool:
        """Whether the decision log holds any record of the sink (its row, or a batch of it)."""
        return any(
            self.table_exists(prefix + t)
            and self.execute(f"SELECT 1 FROM {self.q(prefix + t)} WHERE sink_id = %s", sink_id)
            for t in ("sinks", "batches")
        )

    def decision(self, sink_id: str, batch_id: int) -> Decision | None:
        return self.decisions(sink_id).get(batch_id)

    # -- locks --------------------------------------------------------------------------------------
    @abstractmethod
    def set_lock_timeout(self, cursor: Any, seconds: int) -> None:
        """Make the session's statements give up after waiting ``seconds`` for a row lock."""

    @abstractmethod
    def lock_waiters(self, statement_like: str = "%") -> list[str]:
        """The sessions of this database waiting for a lock, running a statement ``LIKE statement_like`` (any
        case): PostgreSQL's application_name of each, MariaDB's connection id.  Tests poll it for "the other
        side now waits", instead of sleeping."""


# --------------------------------------------------------------------------- PostgreSQL


class PostgresTarget(Target):
    kind = POSTGRESQL
    # the superuser's real password (the test server checks it on every TCP login); never shown in an error
    password = SECRET
    serial_column = "seq bigserial"

    def q(self, name: str) -> str:
        return ".".join('"' + p.replace('"', '""') + '"' for p in name.split("."))

    @contextmanager
    def no_login_role(self, prefix: str) -> Iterator[str]:
        name = f"{prefix}_{uuid.uuid4().hex[:8]}"
        self.execute(f"CREATE ROLE {self.q(name)} NOLOGIN")
        try:
            yield name
        finally:
            self.execute(f"DROP OWNED BY {self.q(name)}")
            self.execute(f"DROP ROLE {self.q(name)}")

    @contextmanager
    def connect(self) -> Iterator[Any]:
        with connect(self.url) as conn:
            yield conn

    def serial_high_water(self, table: str) -> int:
        return int(self.execute("SELECT last_value FROM " + self.q(f"{table}_seq_seq"))[0][0])

    def table_exists(self, table: str) -> bool:
        return self.execute("SELECT to_regclass(%s) IS NOT NULL", self.q(table))[0][0] is True

    def drop_table(self, *tables: str) -> None:
        with self.connect() as conn, conn.cursor() as cur:
            cur.execute("SET lock_timeout = '2s'")
            try:
                cur.execute(f"DROP TABLE IF EXISTS {', '.join(self.q(t) for t in tables)}")
            except psycopg2.errors.LockNotAvailable:
                pass

    def column_types(self, table: str) -> dict[str, str]:
        found = self.execute(
            "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute "
            "WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
            self.q(table),
        )
        return dict(found)  # type: ignore[arg-type]

    def not_null_columns(self, table: str) -> list[str]:
        found = self.execute(
            "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0 AND attnotnull "
            "AND NOT attisdropped ORDER BY attnum",
            self.q(table),
        )
        return [r[0] for r in found]

    def prepared(self, sink_id: str | None = None, batch_id: int | None = None) -> list[str]:
        prefix = XASINK_GID_PREFIX
        if sink_id is not None:
            prefix += f"{sink_id}:" + (f"{batch_id}/" if batch_id is not None else "")
        return sorted(prepared_gids(self.url, prefix=prefix))

    def listed(self) -> set[str]:
        return set(prepared_gids(self.url))

    def rollback_ours(self, gid: str) -> None:
        rollback_prepared(self.url, gid)

    def make_foreign_prepared(self, name: str, table: str, format_id: int | None = None) -> str:
        if table not in self.tables:
            self.tables.append(table)
        make_foreign_prepared(self.url, name, table=table)
        self.foreign.append(name)
        return name

    def clear_foreign(self, listed_name: str) -> None:
        if listed_name in self.listed():
            rollback_prepared(self.url, listed_name)

    def set_lock_timeout(self, cursor: Any, seconds: int) -> None:
        cursor.execute(f"SET lock_timeout = '{int(seconds)}s'")

    def lock_waiters(self, statement_like: str = "%") -> list[str]:
        q = (
            "SELECT application_name FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock' AND pid <> pg_backend_pid() AND query ILIKE %s"
        )
        return [str(name) for (name,) in self.execute(q, statement_like)]


# --------------------------------------------------------------------------- MariaDB


def mariadb_user_url(admin_url: str) -> str:
    """The JDBC spelling a Spark user writes for the session database (user and password in the query)."""
    p = mariadb_params(admin_url)
    query = f"user={quote(p['user'], safe='')}"
    if p["password"]:
        query += f"&password={quote(p['password'], safe='')}"
    return f"jdbc:mariadb://{p['host']}:{p['port']}/{p['database']}?{query}"


class MariaDBTarget(Target):
    kind = MARIADB
    password = None  # root logs in without one; tests/test_mysql_dialect.py covers a wrong one
    serial_column = "seq BIGINT AUTO_INCREMENT PRIMARY KEY"
    table_options = " ENGINE=InnoDB"

    def __init__(self, admin_url: str) -> None:
        super().__init__(mariadb_user_url(admin_url))
        self.admin_url = admin_url  # mysql+pymysql://..., for the plain-driver helpers

    @contextmanager
    def no_login_role(self, prefix: str) -> Iterator[str]:
        name = f"{prefix}_{uuid.uuid4().hex[:8]}"
        self.execute(f"CREATE USER '{name}'@'localhost' ACCOUNT LOCK")
        try:
            yield name
        finally:
            self.execute(f"DROP USER '{name}'@'localhost'")

    def q(self, name: str) -> str:
        return ".".join("`" + p.replace("`", "``") + "`" for p in name.split("."))

    @contextmanager
    def connect(self) -> Iterator[Any]:
        with mariadb_connect(self.admin_url) as conn:
            yield conn

    def serial_high_water(self, table: str) -> int:
        # InnoDB's counter is not rolled back either; ANALYZE makes information_schema read the live value
        self.execute(f"ANALYZE TABLE {self.q(table)}")
        found = self.execute(
            "SELECT AUTO_INCREMENT FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = %s",
            table,
        )
        return int(found[0][0]) - 1

    def table_exists(self, table: str) -> bool:
        found = self.execute(
            "SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = %s",
            table,
        )
        return bool(found[0][0])

    def drop_table(self, *tables: str) -> None:
        with self.connect() as conn, conn.cursor() as cur:
            cur.execute("SET SESSION lock_wait_timeout = 2")
            try:
                cur.execute(f"DROP TABLE IF EXISTS {', '.join(self.q(t) for t in tables)}")
            except pymysql.err.OperationalError as exc:
                if exc.args[0] != 1205:
                    raise

    def column_types(self, table: str) -> dict[str, str]:
        found = self.execute(
            "SELECT COLUMN_NAME, COLUMN_TYPE FROM information_schema.COLUMNS "
            "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = %s ORDER BY ORDINAL_POSITION",
            table,
        )
        return {str(n): str(t) for n, t in found}

    def not_null_columns(self, table: str) -> list[str]:
        found = self.execute(
            "SELECT COLUMN_NAME FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() "
            "AND TABLE_NAME = %s AND IS_NULLABLE = 'NO' ORDER BY ORDINAL_POSITION",
            table,
        )
        return [str(r[0]) for r in found]

    def prepared(self, sink_id: str | None = None, batch_id: int | None = None) -> list[str]:
        sinks = mariadb_sink_ids(self.admin_url) if sink_id is None else [sink_id]
        gids = mariadb_prepared_gids(self.admin_url, sink_ids=sinks)
        if batch_id is not None:
            gids = [g for g in gids if g.startswith(f"{XASINK_GID_PREFIX}{sink_id}:{batch_id}/")]
        return gids

    @staticmethod
    def listed_name(format_id: int, gtrid: bytes, bqual: bytes) -> str:
        """As xasink lists it: an xid of ours as ``gtrid/bqual``, any other as ``xa:<formatID>:<hex>:<hex>``."""
        xid = Xid.from_xa(format_id, gtrid, bqual)
        return xid.gid if xid is not None else f"xa:{format_id}:{gtrid.hex()}:{bqual.hex()}"

    def listed(self) -> set[str]:
        return {self.listed_name(*x) for x in mariadb_recover(self.admin_url)}

    def rollback_ours(self, gid: str) -> None:
        mariadb_rollback_gid(self.admin_url, gid)

    def make_foreign_prepared(self, name: str, table: str, format_id: int | None = None) -> str:
        if table not in self.tables:
            self.tables.append(table)
        gtrid, _, bqual = name.partition("/")
        xa = mariadb_make_foreign_prepared(
            self.admin_url, gtrid.encode(), bqual.encode(), 1 if format_id is None else format_id, table
        )
        self.foreign.append(self.listed_name(*xa))
        return self.foreign[-1]

    def clear_foreign(self, listed_name: str) -> None:
        if listed_name.startswith("xa:"):
            _, fmt, gtrid, bqual = listed_name.split(":")
            xa = (int(fmt), bytes.fromhex(gtrid), bytes.fromhex(bqual))
        else:
            g, _, b = listed_name.partition("/")
            xa = (XASINK_FORMAT_ID, g.encode(), b.encode())
        if xa in mariadb_recover(self.admin_url):
            mariadb_rollback_xa(self.admin_url, *xa)

    def set_lock_timeout(self, cursor: Any, seconds: int) -> None:
        cursor.execute(f"SET SESSION innodb_lock_wait_timeout = {int(seconds)}")

    def lock_waiters(self, statement_like: str = "%") -> list[str]:
        # InnoDB's row-lock waits.  INNODB_TRX is a cache that InnoDB refreshes only when it was last read more
        # than 0.1 s ago (the whole server's reads): a caller polling every 0.05 s would read the same stale
        # cache forever, so the reads of this process keep that distance
        with _TRX_CACHE_PACE:
            time.sleep(max(0.0, _trx_cache_read[0] + 0.12 - time.monotonic()))
            q = (
                "SELECT trx_mysql_thread_id FROM information_schema.INNODB_TRX "
                "WHERE trx_state = 'LOCK WAIT' AND trx_query LIKE %s AND trx_mysql_thread_id <> CONNECTION_ID()"
            )
            try:
                return [str(ident) for (ident,) in self.execute(q, statement_like)]
            finally:
                _trx_cache_read[0] = time.monotonic()


_TRX_CACHE_PACE = threading.Lock()
_trx_cache_read = [0.0]  # when this process last read INNODB_TRX (MariaDBTarget.lock_waiters)


def is_lock_timeout(target: Target, exc: BaseException) -> bool:
    """Whether exc is the server giving up on a row lock (PostgreSQL 55P03, MariaDB 1205)."""
    if target.kind == MARIADB:
        return isinstance(exc, pymysql.err.OperationalError) and exc.args[0] == 1205
    return isinstance(exc, psycopg2.errors.LockNotAvailable)


def case(kind: str, *values: Any) -> Any:
    """One case of a test parametrized over ``db`` together with other arguments (``indirect=["db"]``).

    For a test whose other arguments need not be crossed with both dialects, e.g.
    ``@pytest.mark.parametrize(("db", "path"), [case(POSTGRESQL, "api"), case(MARIADB, "api")], indirect=["db"])``.
    Its id is the dialect's id and the values (``pg-api``).
    """
    marks = [pytest.mark.mariadb] if kind == MARIADB else []
    return pytest.param(kind, *values, id="-".join([IDS[kind], *map(str, values)]), marks=marks)


def make_target(kind: str, url: str) -> Target:
    return PostgresTarget(url) if kind == POSTGRESQL else MariaDBTarget(url)
