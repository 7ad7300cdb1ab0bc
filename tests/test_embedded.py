"""The embedded PostgreSQL the suite relies on: prepared transactions on, and durable across a crash."""

from __future__ import annotations

import uuid

import psycopg2.extensions
import pytest

from tests.dbutil import SCRATCH_TABLE, make_foreign_prepared, prepared_gids, rollback_prepared, rows
from xasink.embedded import EmbeddedPostgres


def test_max_prepared_transactions(pg_server: EmbeddedPostgres | None, pg_conn: psycopg2.extensions.connection) -> None:
    with pg_conn.cursor() as cur:
        cur.execute("SHOW max_prepared_transactions")
        (value,) = cur.fetchone()
    if pg_server is None:
        assert int(value) > 0, "XASINK_TEST_PG_URL server has max_prepared_transactions = 0"
    else:
        assert int(value) == 100


def test_prepared_transaction_survives_restart(pg_server: EmbeddedPostgres | None, pg_url: str) -> None:
    if pg_server is None:
        pytest.skip("external server (XASINK_TEST_PG_URL): cannot restart it")
    gid = f"foreign:embedded-test:{uuid.uuid4().hex[:8]}"
    make_foreign_prepared(pg_url, gid)
    visible = rows(pg_url, SCRATCH_TABLE)
    try:
        assert gid in prepared_gids(pg_url)
        pg_server.restart()
        assert pg_server.url == pg_url
        assert gid in prepared_gids(pg_url)
        assert rows(pg_url, SCRATCH_TABLE) == visible  # its insert is still pending
    finally:
        if gid in prepared_gids(pg_url):
            rollback_prepared(pg_url, gid)
    assert gid not in prepared_gids(pg_url)
