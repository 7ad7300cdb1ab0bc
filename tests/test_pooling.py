"""Pooled control connections (xasink.dialects.pooling) against the real servers: a checkout sends nothing
while the connection is healthy, and a connection the server killed is replaced, not handed out."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pymysql
import pytest
import sqlalchemy as sa
from sqlalchemy.engine.interfaces import DBAPIConnection

from tests.targets import mariadb_connect
from xasink.dialects import Dialect, dialect_for, pooling
from xasink.options import parse_options

SESSION_ID = {"postgresql": "SELECT pg_backend_pid()", "mysql": "SELECT CONNECTION_ID()"}


@pytest.fixture(params=["postgresql", "mariadb"])
def pooled(request: pytest.FixtureRequest) -> Iterator[tuple[str, Dialect]]:
    url = request.getfixturevalue("pg_url" if request.param == "postgresql" else "mariadb_url")
    opts = parse_options({"url": url, "dbtable": "unused", "sinkId": "pooling"})
    dialect = dialect_for(opts.url, pool_size=1)
    yield url, dialect
    dialect.dispose()


@contextmanager
def _admin(url: str) -> Iterator[Any]:
    """A cursor on a connection of its own, in autocommit."""
    if url.startswith("postgresql"):
        import psycopg2

        conn = psycopg2.connect(url)
        conn.autocommit = True
        try:
            with conn.cursor() as cur:
                yield cur
        finally:
            conn.close()
        return
    with mariadb_connect(url) as conn, conn.cursor() as cur:
        yield cur


def _kill(url: str, session: int) -> None:
    """End ``session`` from another connection, and wait until the server has let it go."""
    if url.startswith("postgresql"):
        kill, gone = "SELECT pg_terminate_backend(%s)", "SELECT count(*) FROM pg_stat_activity WHERE pid = %s"
    else:
        kill, gone = "KILL %s", "SELECT count(*) FROM information_schema.processlist WHERE id = %s"
    with _admin(url) as cur:
        cur.execute(kill, (session,))
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            cur.execute(gone, (session,))
            if cur.fetchone()[0] == 0:
                return
            time.sleep(0.05)
    raise AssertionError(f"session {session} still there after it was killed")


def _count_pings(engine: sa.engine.Engine, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    pings: list[str] = []
    original = engine.dialect.do_ping

    def counted(dbapi_conn: DBAPIConnection) -> bool:
        pings.append("ping")
        return bool(original(dbapi_conn))

    monkeypatch.setattr(engine.dialect, "do_ping", counted)
    return pings


def _session(conn: sa.Connection) -> int:
    return int(conn.exec_driver_sql(SESSION_ID[conn.dialect.name]).scalar_one())


@pytest.mark.parametrize("autocommit", [False, True])
def test_a_healthy_pooled_connection_is_checked_out_without_a_ping(
    pooled: tuple[str, Dialect], autocommit: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, dialect = pooled
    with dialect.connect(autocommit=autocommit) as conn:
        session = _session(conn)
    pings = _count_pings(dialect.autocommit_engine if autocommit else dialect.engine, monkeypatch)
    for _ in range(3):
        with dialect.connect(autocommit=autocommit) as conn:
            assert _session(conn) == session, "the pool opened a new connection instead of reusing the healthy one"
    assert pings == [], "a checkout pinged a healthy connection"


def test_a_long_idle_connection_is_pinged(pooled: tuple[str, Dialect], monkeypatch: pytest.MonkeyPatch) -> None:
    _, dialect = pooled
    with dialect.connect() as conn:
        session = _session(conn)
    monkeypatch.setattr(pooling, "IDLE_PING_S", -1.0)
    pings = _count_pings(dialect.engine, monkeypatch)
    with dialect.connect() as conn:
        assert _session(conn) == session
    assert pings == ["ping"]


@pytest.mark.parametrize("autocommit", [False, True])
def test_a_connection_the_server_killed_is_replaced_at_checkout(pooled: tuple[str, Dialect], autocommit: bool) -> None:
    url, dialect = pooled
    with dialect.connect(autocommit=autocommit) as conn:
        session = _session(conn)
    _kill(url, session)
    with dialect.connect(autocommit=autocommit) as conn:  # no error: the dead connection is never handed out
        fresh = _session(conn)
        assert conn.exec_driver_sql("SELECT 7").scalar_one() == 7
    assert fresh != session


def test_pymysql_socket_is_seen(mariadb_url: str) -> None:
    """The MySQL dialect finds pymysql's socket, so its checkouts skip the ping too."""
    opts = parse_options({"url": mariadb_url, "dbtable": "unused", "sinkId": "pooling"})
    dialect = dialect_for(opts.url, pool_size=1)
    try:
        with dialect.connect() as conn:
            raw = conn.connection.dbapi_connection
            assert isinstance(raw, pymysql.connections.Connection)
            fd = dialect.socket_fd(raw)
            assert fd is not None and fd >= 0 and not pooling.socket_readable(fd)
    finally:
        dialect.dispose()
