"""Shared fixtures: private PostgreSQL, MariaDB, the ``db`` target of both, a local Spark session, leak checks.

Set ``XASINK_TEST_PG_URL`` to run against an existing server (it needs
``max_prepared_transactions`` > 0) instead of starting one.  Tests marked
``soak`` run only with ``--soak`` or ``XASINK_SOAK=1``.

The private PostgreSQL checks passwords (scram-sha-256) on every TCP login, its superuser ``postgres``
included: ``pg_url`` carries :data:`TEST_PG_PASSWORD` (tests/leaks.py's ``SECRET``, which no output may
show), and the tests that pass a ``password`` option pass that same one.  An external server
(``XASINK_TEST_PG_URL``) must accept it as the password option too.  Only the cluster's Unix socket trusts,
for ``pg_ctl``.

Under ``CI=true`` a skipped test fails unless its reason is one of :data:`ALLOWED_SKIPS` (tests/README.md
lists them and why).
"""

from __future__ import annotations

import fcntl
import os
import sys
import uuid
import warnings
import zlib
from collections.abc import Iterator

import psycopg2
import psycopg2.errors
import psycopg2.extensions
import pymysql
import pytest

from tests import doc_cases
from tests.leaks import SECRET
from tests.targets import (
    IDS,
    MARIADB,
    POSTGRESQL,
    XASINK_GID_PREFIX,
    Target,
    connect,
    make_target,
    mariadb_connect,
    mariadb_prepared_gids,
    mariadb_rollback_gid,
    mariadb_sink_ids,
    prepared_gids,
    rollback_prepared,
)
from tests.values_harness import ValuesDriver
from xasink.support.embedded import EmbeddedPostgres
from xasink.support.embedded_mariadb import EmbeddedMariaDB, EmbeddedMariaDBError

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)


# The only skips allowed under CI=true: they hide no feature (see tests/README.md).
ALLOWED_SKIPS = (
    "soak test:",  # long repetitions, run by --soak / XASINK_SOAK=1
    "no url-query-passwd spelling for postgresql",  # 'passwd' is a MySQL-only spelling: nothing to test
    "needs format('xasink'): Spark 3.5",  # the 3.5 version suite: no Python data source API there to test
)
TEST_PG_PASSWORD = SECRET  # the private server's superuser proves it on every TCP login


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    """Under CI=true a skip that hides a feature is a failure, not a quiet 's'.  A test that timed out while
    this process's Spark JVM was in use leaves that JVM's thread stacks in its report and the JVM abandoned
    (tests/jvm.py ``abandon_classic_spark``): the timeout's exception poisoned its py4j connection."""
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    setattr(item, f"report_{report.when}", report)  # documented_cases_witnessed checks only a passed call
    if report.failed and call.excinfo is not None and "from pytest-timeout" in str(call.excinfo.value):
        from tests.jvm import abandon_classic_spark

        report.sections.append(("the Spark JVM at the timeout", abandon_classic_spark()))
    if not report.skipped or os.environ.get("CI") != "true" or hasattr(report, "wasxfail"):
        return
    reason = str(report.longrepr[-1]) if isinstance(report.longrepr, tuple) else str(report.longrepr)
    reason = reason.removeprefix("Skipped: ")
    if not reason.startswith(ALLOWED_SKIPS):
        report.outcome = "failed"
        report.longrepr = f"skipped under CI=true, which hides a feature: {reason} (allowed: tests/README.md)"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--soak", action="store_true", default=False, help="also run the long soak tests")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    run_soak = config.getoption("--soak") or os.environ.get("XASINK_SOAK") == "1"
    skip_soak = pytest.mark.skip(reason="soak test: run with --soak or XASINK_SOAK=1")
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        if "spark" in fixtures and item.get_closest_marker("spark") is None:
            item.add_marker(pytest.mark.spark)
        if "mariadb_url" in fixtures and item.get_closest_marker("mariadb") is None:
            item.add_marker(pytest.mark.mariadb)
        if item.get_closest_marker("soak") is not None and not run_soak:
            item.add_marker(skip_soak)
    one_database_per_case(config, items)
    one_line_per_crash_case(config, items)


# a core test whose MariaDB case runs with --soak only: on an older line it keeps its PostgreSQL case
MARIADB_SOAK_ONLY = {"test_foreach_batch_survives_kills"}


def case_key(item: pytest.Item) -> str:
    """A test and its parameters other than the database: what the two choices below hash."""
    callspec = getattr(item, "callspec", None)
    rest = "-".join(p for p in callspec.id.split("-") if p not in IDS.values()) if callspec is not None else ""
    return f"{item.path.name}::{getattr(item, 'originalname', item.name)}[{rest}]"


def one_database_per_case(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A case run on both databases whose database side other tests cover runs on one of them: PostgreSQL or
    MariaDB by a stable hash of the test and its other parameters.  Such cases are those marked
    ``one_database`` (Spark Connect: the classic session's tests cover the same dialect code) and, on an older
    PySpark line (``XASINK_VERSION_LINE``, set by scripts/test_versions.sh), every core case: 3.5 and 4.0 pick
    opposite databases, so each case runs on each database on some line.  What differs there is the way into
    Spark, the same for both dialects.  ``--soak`` or ``XASINK_BOTH_DATABASES=1`` runs both."""
    line = os.environ.get("XASINK_VERSION_LINE")
    if config.getoption("--soak") or os.environ.get("XASINK_SOAK") == "1":
        return
    if os.environ.get("XASINK_BOTH_DATABASES") == "1":
        return
    flip = int(line.replace(".", "")) % 2 if line else 0
    cases: dict[str, dict[str, pytest.Item]] = {}  # a test and its other parameters -> its items by database
    for item in items:
        callspec = getattr(item, "callspec", None)
        kind = callspec.params.get("db") if callspec is not None else None
        if kind is not None and (line or item.get_closest_marker("one_database") is not None):
            cases.setdefault(case_key(item), {})[kind] = item
    dropped: set[pytest.Item] = set()
    for case, by_kind in cases.items():
        if len(by_kind) < 2:
            continue  # on one database only (a case the other cannot run): kept
        name = case.split("::")[1].split("[")[0]
        chosen = (
            POSTGRESQL if name in MARIADB_SOAK_ONLY else (POSTGRESQL, MARIADB)[(zlib.crc32(case.encode()) + flip) % 2]
        )
        dropped.update(item for kind, item in by_kind.items() if kind != chosen)
    kept = [item for item in items if item not in dropped]
    if dropped:
        config.hook.pytest_deselected(items=sorted(dropped, key=items.index))
        items[:] = kept


def one_line_per_crash_case(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On an older PySpark line (``XASINK_VERSION_LINE``), a core case that kills processes (marked ``crash``)
    runs on one of the two older lines, by a stable hash of the case: the kill, the restart and the recovery
    after it are xasink's code, the same on every line, and what differs per line (the ways into Spark, task
    retries, replays) the core cases that kill nothing check on both.  Each crash case still runs on every
    line's newest neighbour (the main suite, both databases).  ``--soak`` or ``XASINK_BOTH_LINES=1`` runs them
    on both.  Measured: the crash cases were two thirds of each version suite's time (CI, 2026-11-29)."""
    line = os.environ.get("XASINK_VERSION_LINE")
    if not line or config.getoption("--soak") or os.environ.get("XASINK_SOAK") == "1":
        return
    if os.environ.get("XASINK_BOTH_LINES") == "1":
        return
    flip = int(line.replace(".", "")) % 2  # 3.5 -> 1, 4.0 -> 0: the two lines take opposite cases
    dropped = []
    for item in items:
        # a hash of its own: with the database's, the line kept were always the one whose database is PostgreSQL
        if item.get_closest_marker("crash") is not None and (zlib.crc32(b"line " + case_key(item).encode()) + flip) % 2:
            dropped.append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = [item for item in items if item not in dropped]


# The slowest modules, slowest first (seconds of a whole CI run under its load, stop 45).  Under ``--dist
# loadfile`` a worker takes the next module when it is nearly done, in collection order: the longest first
# leaves the short ones to even out the workers' ends (with xdist's own order, by test count, a long module
# of few tests started last).  scripts/test.sh passes --no-loadscope-reorder so that this order holds.
SLOW_MODULES = {
    "test_scenarios.py": 348,
    "test_streaming.py": 307,
    "test_stream_crash.py": 297,
    "test_write_modes.py": 256,
    "test_adversary_visibility.py": 223,
    "test_spark_writer.py": 220,
    "test_connect.py": 183,
    "test_adversary_order.py": 155,
    "test_speculation.py": 150,
    "test_values_dropin.py": 134,
    "test_failed_jobs.py": 125,
    "test_crash.py": 119,
    "test_secrets.py": 118,
    "test_values_matrix.py": 106,
    "test_format_api.py": 89,
    "test_transaction_crash.py": 84,
    "test_faults.py": 80,
    "test_transaction_failures.py": 77,
    "test_spark_versions.py": 73,
    "test_adversary.py": 67,
    "test_hostile.py": 67,
    "test_values_cases.py": 64,
    "test_after_decision.py": 47,
    "test_quiet.py": 46,
    "test_batch_visibility.py": 44,
    "test_write_modes_crash.py": 39,
    "test_stream_threads.py": 38,
    "test_transaction.py": 35,
    "test_values.py": 34,
    "test_status_health.py": 27,
    "test_upsert.py": 27,
    "test_changes.py": 26,
    "test_user_warnings.py": 25,
    "test_wheel.py": 23,
    "test_holder.py": 22,
    "test_property.py": 21,
}


class SlowModulesFirst:
    """Modules in :data:`SLOW_MODULES` order, the rest after them as collected."""

    @pytest.hookimpl(trylast=True)  # after the markers above, the -m selection and pytest's order by fixture
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        first: dict[str, int] = {}
        for i, item in enumerate(items):
            first.setdefault(item.path.name, i)
        items.sort(key=lambda item: (-SLOW_MODULES.get(item.path.name, 0), first[item.path.name]))


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(SlowModulesFirst(), "xasink-slow-modules-first")


# --------------------------------------------------------------------------- the docs' cases (tests/doc_cases.py)


@pytest.fixture(scope="session")
def documented() -> dict[str, doc_cases.Case]:
    return doc_cases.documented_cases()


@pytest.fixture(autouse=True)
def documented_cases_witnessed(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A test that declares ``@pytest.mark.doc_case(...)`` passes only if it witnessed each case it declares."""
    declared = [case for mark in request.node.iter_markers("doc_case") for case in mark.args]
    if not declared:
        yield
        return
    from xasink.ops import cli

    documented: dict[str, doc_cases.Case] = request.getfixturevalue("documented")
    main = cli.main

    def recorded(argv: list[str] | None = None) -> int:  # tests that call xasink.ops.cli.main themselves
        code = main(argv)
        doc_cases.record_cli(list(argv or []), code, "")
        return code

    monkeypatch.setattr(cli, "main", recorded)
    with doc_cases.witnessing() as seen:
        yield
    call = getattr(request.node, "report_call", None)
    if call is not None and call.passed:
        missing = doc_cases.missing(declared, seen, documented)
        assert not missing, f"declared by @pytest.mark.doc_case but not witnessed: {missing}"


# --------------------------------------------------------------------------- PostgreSQL


@pytest.fixture(scope="session")
def pg_server() -> Iterator[EmbeddedPostgres | None]:
    """The session's private PostgreSQL, or None when XASINK_TEST_PG_URL names an external one."""
    if os.environ.get("XASINK_TEST_PG_URL"):
        yield None
        return
    with EmbeddedPostgres(max_prepared_transactions=100, password=TEST_PG_PASSWORD) as server:
        yield server


@pytest.fixture(scope="session")
def pg_url(pg_server: EmbeddedPostgres | None) -> str:
    external = os.environ.get("XASINK_TEST_PG_URL")
    if external:
        return external
    assert pg_server is not None
    return pg_server.url


@pytest.fixture
def pg_conn(pg_url: str) -> Iterator[psycopg2.extensions.connection]:
    with connect(pg_url) as conn:
        yield conn


@pytest.fixture
def fresh_table_name() -> str:
    return f"t_{uuid.uuid4().hex[:8]}"


@pytest.fixture(autouse=True)
def no_prepared_left(request: pytest.FixtureRequest) -> Iterator[None]:
    """After a test that used pg_url, mariadb_url or db: no xasink branch may be left prepared (invariant 5).

    Leftovers are rolled back so later tests start clean, then this test errors with their gids.
    """
    # a module may define a ``db`` of its own (test_recover_cli.py, which checks its leaks itself): not ours
    if "db" in request.fixturenames and not hasattr(request.module, "db"):
        target = request.getfixturevalue("db")  # set up before this check runs, so torn down after it
        assert isinstance(target, Target), target
        yield from _no_target_left(target)
        return
    if "mariadb_url" in request.fixturenames:
        yield from _no_xa_left(request.getfixturevalue("mariadb_url"))
        return
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


# --------------------------------------------------------------------------- MariaDB / MySQL

MARIADB_DEFAULT = "mysql+pymysql://root@127.0.0.1:3306/"


@pytest.fixture(scope="session")
def mariadb_server() -> Iterator[str]:
    """The server the MariaDB tests use: ``XASINK_TEST_MARIADB_URL``'s, else the machine's at 127.0.0.1:3306,
    else - when that one does not answer (a service still starting, or none) - a private one of this session's.

    ``XASINK_TEST_MARIADB_URL=private`` asks for the private server outright.  Without any server the tests
    that need it are skipped, except under CI=true, where that is a failure.
    """
    explicit = os.environ.get("XASINK_TEST_MARIADB_URL", "")
    if explicit != "private":
        server = explicit or MARIADB_DEFAULT
        try:
            with mariadb_connect(server, database=False) as conn, conn.cursor() as cur:
                cur.execute("SELECT VERSION()")
            yield server
            return
        except pymysql.err.MySQLError as exc:
            reason = f"MariaDB/MySQL not reachable at {server.split('@')[-1]} ({exc.args[-1]})"
            if explicit:
                _unavailable(f"{reason}; check XASINK_TEST_MARIADB_URL")
        warnings.warn(f"{reason}: the tests start a private MariaDB server", stacklevel=1)
    private = EmbeddedMariaDB()
    try:
        private.start()
    except EmbeddedMariaDBError as exc:
        _unavailable(f"no MariaDB server: {exc}; set XASINK_TEST_MARIADB_URL")
    try:
        yield private.url
    finally:
        private.stop()


def _unavailable(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(reason, pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def mariadb_url(mariadb_server: str) -> Iterator[str]:
    """A fresh database ``xasink_test_<hex>`` on :func:`mariadb_server`, dropped at the end of the session."""
    server = mariadb_server
    database = f"xasink_test_{uuid.uuid4().hex[:12]}"
    base = server if server.endswith("/") else server.rsplit("/", 1)[0] + "/"
    with mariadb_connect(server, database=False) as conn, conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE `{database}` CHARACTER SET utf8mb4")
    try:
        yield base + database
    finally:
        with mariadb_connect(server, database=False) as conn, conn.cursor() as cur:
            cur.execute("SET SESSION lock_wait_timeout = 10")
            cur.execute(f"DROP DATABASE IF EXISTS `{database}`")


def _no_xa_left(url: str) -> Iterator[None]:
    """No branch of a sink of this session's database may be left prepared (XA RECOVER covers the whole server)."""
    yield
    left = mariadb_prepared_gids(url, sink_ids=mariadb_sink_ids(url))
    if not left:
        return
    for gid in left:
        try:
            mariadb_rollback_gid(url, gid)
        except pymysql.err.MySQLError:  # finished concurrently
            pass
    pytest.fail(f"{len(left)} xasink XA branch(es) left prepared (rolled back now): {left}", pytrace=False)


def _no_target_left(target: Target) -> Iterator[None]:
    yield
    left = target.prepared()
    if not left:
        return
    for gid in left:
        try:
            target.rollback_ours(gid)
        except (psycopg2.Error, pymysql.err.MySQLError):  # finished concurrently
            pass
    pytest.fail(f"{len(left)} xasink branch(es) left prepared on {target.id} (rolled back now): {left}", pytrace=False)


@pytest.fixture(scope="session")
def values_driver() -> Iterator[ValuesDriver]:
    """The values comparison's Spark driver (tests/values_harness.py): one per worker for every values module, a
    JVM started once."""
    d = ValuesDriver()
    try:
        yield d
    finally:
        d.close()


# --------------------------------------------------------------------------- one test, both databases


@pytest.fixture(
    params=[
        pytest.param(POSTGRESQL, id=IDS[POSTGRESQL]),
        pytest.param(MARIADB, id=IDS[MARIADB], marks=pytest.mark.mariadb),
    ]
)
def db(request: pytest.FixtureRequest) -> Iterator[Target]:
    """The database a dialect-neutral test runs against: PostgreSQL (``pg``) and MariaDB (``mariadb``).

    See tests/targets.py.  The tables the test made through it are dropped afterwards; the autouse
    ``no_prepared_left`` checks that nothing of xasink is left prepared on it.
    """
    kind: str = request.param
    yield from _target(kind, request.getfixturevalue("pg_url" if kind == POSTGRESQL else "mariadb_url"))


@pytest.fixture
def pg(pg_url: str) -> Iterator[Target]:
    """The PostgreSQL target alone, for PostgreSQL-only tests; its tables are dropped afterwards."""
    yield from _target(POSTGRESQL, pg_url)


@pytest.fixture
def maria(mariadb_url: str) -> Iterator[Target]:
    """The MariaDB target alone (tests of both servers at once: ``pg`` and ``maria``); its tables are dropped."""
    yield from _target(MARIADB, mariadb_url)


def _target(kind: str, url: str) -> Iterator[Target]:
    target = make_target(kind, url)
    try:
        yield target
    finally:
        target.cleanup()


# --------------------------------------------------------------------------- Spark (sessions: tests/jvm.py)


@pytest.fixture
def spark():  # type: ignore[no-untyped-def]
    """A local classic SparkSession (2 cores; a failed task is retried, up to 3 attempts) with xasink registered."""
    from tests.jvm import classic_spark

    return classic_spark()


@pytest.fixture
def stream(spark, tmp_path, pg_url: str):  # type: ignore[no-untyped-def]
    """One streaming query's input, checkpoint, table and sink id on PostgreSQL (tests/harness.py ``Stream``);
    afterwards every query of the session is stopped and the table dropped."""
    from psycopg2 import sql

    from tests.harness import Stream
    from xasink.support.faults import LOCAL_PROPERTY

    s = Stream(spark, tmp_path, pg_url)
    try:
        yield s
    finally:
        for q in spark.streams.active:
            q.stop()
        spark.sparkContext.setLocalProperty(LOCAL_PROPERTY, None)
        with connect(pg_url) as conn, conn.cursor() as cur:
            # a branch left prepared locks the table for good: the DROP would wait forever (out of the timeout's
            # reach, in libpq); no_prepared_left, torn down after this, names the branch and rolls it back
            cur.execute("SET lock_timeout = '10s'")
            try:
                cur.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(s.table)))
            except psycopg2.errors.LockNotAvailable:
                conn.rollback()


@pytest.fixture(scope="session")
def driver_cds(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str | None]:
    """The class-data archive the Spark drivers a crash test starts share (tests/jvm.py), made once a run.

    Its path goes to the environment the drivers inherit.  Under pytest-xdist the workers share one archive
    (in their common temporary directory, made by the first that asks while the others wait for it).  If it
    cannot be made the drivers run without it (slower, the same otherwise): the path is then None.
    """
    from tests.jvm import CDS_ENV, build_archive

    if os.environ.get("XASINK_VERSION_LINE"):  # the core suite of an older line starts a few drivers only: the
        yield None  # warm-up driver (about 2 minutes on a busy CI machine) costs more than the archive saves
        return
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the run's directory, shared by its workers
    workdir = root / "cds"
    workdir.mkdir(exist_ok=True)
    archive, failed = workdir / "spark-driver.jsa", workdir / "failed.txt"
    with (workdir / "lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not archive.exists() and not failed.exists():
            why = build_archive(archive, workdir / "warm-up")
            if why is not None:
                failed.write_text(why)
    if failed.exists():
        print(f"driver class-data archive not made, drivers start without it: {failed.read_text()}", file=sys.stderr)
        yield None
        return
    os.environ[CDS_ENV] = str(archive)
    try:
        yield str(archive)
    finally:
        os.environ.pop(CDS_ENV, None)


@pytest.fixture(scope="session", autouse=True)
def _stop_spark_at_exit() -> Iterator[None]:
    yield
    if "pyspark.sql" in sys.modules:
        from tests.jvm import stop_classic_spark, stop_connect_spark

        stop_connect_spark()
        stop_classic_spark()
