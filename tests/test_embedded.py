"""The embedded PostgreSQL the suite relies on: prepared transactions on, and durable across a crash."""

from __future__ import annotations

import uuid
from pathlib import Path

import psycopg2
import psycopg2.extensions
import pytest

from tests.leaks import SECRET, assert_no_secret
from tests.targets import (
    SCRATCH_TABLE,
    libpq_url,
    make_foreign_prepared,
    prepared_gids,
    rollback_prepared,
    rows,
    with_login,
)
from xasink.support.embedded import EmbeddedPostgres


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


def test_the_superuser_proves_its_password_over_tcp(
    pg_server: EmbeddedPostgres | None, pg_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """No trusted TCP login, the fixtures' superuser included: without a password, or with a wrong one, the
    server refuses ``postgres``; with the right one (the URL the fixtures hand out) it lets it in by scram.
    Only the Unix socket trusts, so ``pg_ctl`` can administer the server."""
    if pg_server is None:
        pytest.skip("needs the embedded server: an external one may trust every login")
    monkeypatch.delenv("PGPASSWORD", raising=False)  # libpq would send it when the URL has none
    monkeypatch.setenv("PGPASSFILE", str(tmp_path / "none"))  # nor may a ~/.pgpass answer for the test
    assert "@127.0.0.1:" in pg_url  # over TCP
    refused = {
        "no password supplied": with_login(pg_url, "postgres"),
        'password authentication failed for user "postgres"': with_login(pg_url, "postgres", SECRET + "x"),
    }
    for expected, url in refused.items():
        with pytest.raises(psycopg2.OperationalError) as info:
            psycopg2.connect(libpq_url(url)).close()
        assert expected in str(info.value), str(info.value)
        assert_no_secret(info.value)

    conn = psycopg2.connect(libpq_url(pg_url))
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT current_user, inet_server_addr() IS NOT NULL")  # a TCP session knows its address
            assert cur.fetchone() == ("postgres", True)
            cur.execute("SELECT DISTINCT type, auth_method FROM pg_hba_file_rules ORDER BY 1, 2")
            rules = cur.fetchall()
            cur.execute("SELECT rolpassword LIKE 'SCRAM-SHA-256$%' FROM pg_authid WHERE rolname = 'postgres'")
            assert cur.fetchone() == (True,)
    finally:
        conn.close()
    assert [r for r in rules if r[0] != "local"] == [("host", "scram-sha-256")], rules
    # the socket (no password) still works, for the server's own tools
    local = psycopg2.connect(host=str(pg_server.base_dir), port=pg_server.port, user="postgres", dbname="postgres")
    local.close()
