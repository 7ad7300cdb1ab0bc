"""Shared fixtures: a private PostgreSQL for the session, a local Spark session, leak checks.

Set ``XASINK_TEST_PG_URL`` to run against an existing server (it needs
``max_prepared_transactions`` > 0) instead of starting one.  Tests marked
``soak`` run only with ``--soak`` or ``XASINK_SOAK=1``.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator

import psycopg2
import psycopg2.extensions
import pytest

from tests.dbutil import XASINK_GID_PREFIX, libpq_url, prepared_gids, rollback_prepared
from xasink.embedded import EmbeddedPostgres

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--soak", action="store_true", default=False, help="also run the long soak tests")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    run_soak = config.getoption("--soak") or os.environ.get("XASINK_SOAK") == "1"
    skip_soak = pytest.mark.skip(reason="soak test: run with --soak or XASINK_SOAK=1")
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        if "spark" in fixtures and item.get_closest_marker("spark") is None:
            item.add_marker(pytest.mark.spark)
        if item.get_closest_marker("soak") is not None and not run_soak:
            item.add_marker(skip_soak)


# --------------------------------------------------------------------------- PostgreSQL


@pytest.fixture(scope="session")
def pg_server() -> Iterator[EmbeddedPostgres | None]:
    """The session's private PostgreSQL, or None when XASINK_TEST_PG_URL names an external one."""
    if os.environ.get("XASINK_TEST_PG_URL"):
        yield None
        return
    server = EmbeddedPostgres(max_prepared_transactions=100)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def pg_url(pg_server: EmbeddedPostgres | None) -> str:
    external = os.environ.get("XASINK_TEST_PG_URL")
    if external:
        return external
    assert pg_server is not None
    return pg_server.url


@pytest.fixture
def pg_conn(pg_url: str) -> Iterator[psycopg2.extensions.connection]:
    conn = psycopg2.connect(libpq_url(pg_url))
    conn.autocommit = True
    try:
        yield conn
    finally:
        conn.close()


@pytest.fixture
def fresh_table_name() -> str:
    return f"t_{uuid.uuid4().hex[:8]}"


@pytest.fixture(autouse=True)
def no_prepared_left(request: pytest.FixtureRequest) -> Iterator[None]:
    """After a test that used pg_url: no xasink branch may be left prepared (invariant 5).

    Leftovers are rolled back so later tests start clean, then this test errors with their gids.
    """
    if "pg_url" not in request.fixturenames:
        yield
        return
    url: str = request.getfixturevalue("pg_url")
    yield
    left = prepared_gids(url, prefix=XASINK_GID_PREFIX)
    if not left:
        return
    for gid in left:
        try:
            rollback_prepared(url, gid)
        except psycopg2.Error:  # finished concurrently
            pass
    pytest.fail(f"{len(left)} xasink prepared transaction(s) left behind (rolled back now): {left}", pytrace=False)


# --------------------------------------------------------------------------- Spark


@pytest.fixture(scope="session")
def spark():  # type: ignore[no-untyped-def]
    """A local[2] SparkSession with the xasink data source registered."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2]")
        .appName("xasink-tests")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .getOrCreate()
    )
    import xasink

    xasink.register(session)
    try:
        yield session
    finally:
        session.stop()
