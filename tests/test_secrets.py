"""The password never shows, wherever the user put it (issue 15 item 3).

A Spark job hands credentials over in one of several spellings: the ``password`` option, the URL's
user-info (``user:pw@host``), or the URL's query (``?user=etl&password=...``, any case, ``passwd`` for
MySQL).  Each spelling is tried against the real servers, through ``xasink status`` and ``xasink recover``
(table and ``--json``, with and without ``-v``), a wrong password, an unreachable server, a write with its
log captured at DEBUG, and the reprs of every object a user may print.  The leak check also looks for the
password percent-encoded, as it stands in a URL.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import pyarrow as pa
import pytest
from sqlalchemy.engine import make_url

import xasink
from tests import targets
from tests.harness import sink_row_locked
from tests.leaks import ROOT, SECRET, assert_no_secret, no_secret_in_output  # noqa: F401 - autouse fixture
from xasink.errors import OptionError
from xasink.options import parse_options
from xasink.protocol.coordinator import Coordinator
from xasink.protocol.partition_writer import write_partition
from xasink.protocol.xid import new_run_nonce
from xasink.support.embedded import free_port
from xasink.write_modes.schema import plan_target

Q = quote(SECRET, safe="")  # as it stands in a URL: the '#' in it is %23


@dataclass
class Server:
    """Where a test logs in: host, port, database and a user whose password is :data:`SECRET`."""

    kind: str  # postgresql | mariadb
    host: str
    port: int
    database: str
    user: str
    sink: str = ""  # a sink with one committed batch in this database's decision log

    def seed(self) -> Server:
        """Write one batch, so that the decision log exists and ``status --sink-id`` has a row to show."""
        coordinator, _, _ = write_one_batch(self.forms()["url-userinfo"], self)
        self.sink = coordinator.options.sink_id
        coordinator.close()
        return self

    def forms(self, password: str = Q, port: int | None = None) -> dict[str, str]:
        """Every spelling of the same login; ``password`` is already percent-encoded."""
        h, p, d, u, pw = self.host, port or self.port, self.database, self.user, password
        if self.kind == "postgresql":
            return {
                "jdbc-query": f"jdbc:postgresql://{h}:{p}/{d}?user={u}&password={pw}",
                "jdbc-query-upper": f"jdbc:postgresql://{h}:{p}/{d}?user={u}&PASSWORD={pw}&ApplicationName=x",
                "jdbc-userinfo": f"jdbc:postgresql://{u}:{pw}@{h}:{p}/{d}",
                "url-userinfo": f"postgresql://{u}:{pw}@{h}:{p}/{d}",
                "url-query": f"postgresql://{h}:{p}/{d}?user={u}&password={pw}",
            }
        return {
            "jdbc-query": f"jdbc:mariadb://{h}:{p}/{d}?user={u}&password={pw}",
            "jdbc-query-upper": f"jdbc:mysql://{h}:{p}/{d}?User={u}&Password={pw}",
            "jdbc-userinfo": f"jdbc:mysql://{u}:{pw}@{h}:{p}/{d}",
            "url-userinfo": f"mysql://{u}:{pw}@{h}:{p}/{d}",
            "url-query": f"mysql://{h}:{p}/{d}?user={u}&password={pw}",
            "url-query-passwd": f"mysql://{h}:{p}/{d}?user={u}&passwd={pw}",
        }

    @property
    def plain(self) -> str:
        """The same login for the plain-driver helpers of tests/targets.py."""
        scheme = "postgresql" if self.kind == "postgresql" else "mysql"
        return f"{scheme}://{self.user}:{Q}@{self.host}:{self.port}/{self.database}"


@pytest.fixture(scope="module")
def pg_server_login(pg_url: str) -> Iterator[Server]:
    """A PostgreSQL role of its own with password :data:`SECRET` (scram: the test server checks it), dropped after."""
    u = make_url(pg_url)
    user = f"xs_{uuid.uuid4().hex[:10]}"
    with targets.connect(pg_url) as conn, conn.cursor() as cur:
        cur.execute(f"CREATE ROLE {user} LOGIN SUPERUSER PASSWORD %s", (SECRET,))
    try:
        yield Server("postgresql", u.host or "127.0.0.1", u.port or 5432, u.database or "postgres", user).seed()
    finally:
        with targets.connect(pg_url) as conn, conn.cursor() as cur:
            cur.execute(f"DROP OWNED BY {user}")
            cur.execute(f"DROP ROLE {user}")


@pytest.fixture(scope="module")
def maria_server_login(mariadb_url: str) -> Iterator[Server]:
    """A MariaDB user of its own with password :data:`SECRET`, dropped after the module."""
    p = targets.mariadb_params(mariadb_url)
    user = f"xs_{uuid.uuid4().hex[:10]}"
    with targets.mariadb_connect(mariadb_url, database=False) as conn, conn.cursor() as cur:
        cur.execute(f"CREATE USER IF NOT EXISTS '{user}'@'{p['host']}' IDENTIFIED BY %s", (SECRET,))
        cur.execute(f"GRANT ALL PRIVILEGES ON *.* TO '{user}'@'{p['host']}'")
    try:
        yield Server("mariadb", p["host"], p["port"], p["database"], user).seed()
    finally:
        with targets.mariadb_connect(mariadb_url, database=False) as conn, conn.cursor() as cur:
            cur.execute(f"DROP USER IF EXISTS '{user}'@'{p['host']}'")


@pytest.fixture(params=["postgresql", pytest.param("mariadb", marks=pytest.mark.mariadb)])
def server(request: pytest.FixtureRequest) -> Server:
    login = "pg_server_login" if request.param == "postgresql" else "maria_server_login"
    value: Server = request.getfixturevalue(login)
    return value


def no_secret(*items: BaseException | str | None) -> None:
    """Neither the password nor its percent-encoded form (assert_no_secret looks for both)."""
    assert_no_secret(*items, secret=SECRET)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "xasink.ops.cli", *args], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    no_secret(proc.stdout, proc.stderr)
    return proc


SCHEMA = pa.schema([("id", pa.int64()), ("v", pa.string())])


def write_one_batch(url: str, server: Server) -> tuple[Coordinator, xasink.WriteResult, str]:
    """A real two-branch batch through the protocol pieces (no Spark): prepare, decide, commit."""
    table = f"t_{uuid.uuid4().hex[:8]}"
    sink = f"sec{uuid.uuid4().hex[:8]}"
    options = parse_options({"url": url, "dbtable": table, "sinkId": sink})
    coordinator = Coordinator(options)
    coordinator.preflight()
    with coordinator.dialect.connect() as conn:
        plan = plan_target(coordinator.dialect, conn, options, SCHEMA)
    run = new_run_nonce()
    outcomes = [
        write_partition(
            options,
            plan,
            batch_id=0,
            partition=part,
            task_attempt_id=part + 1,
            run=run,
            batches=iter(
                [
                    pa.RecordBatch.from_arrays(
                        [pa.array(ids, pa.int64()), pa.array([f"v{i}" for i in ids])], schema=SCHEMA
                    )
                ]
            ),
        )
        for part, ids in enumerate([[1, 2, 3], [4, 5]])
    ]
    result = coordinator.commit(0, outcomes)
    return coordinator, result, table


FORMS = ["jdbc-query", "jdbc-query-upper", "jdbc-userinfo", "url-userinfo", "url-query", "url-query-passwd"]


def form_url(server: Server, form: str, **kw: object) -> str:
    forms = server.forms(**kw)  # type: ignore[arg-type]
    if form not in forms:
        pytest.skip(f"no {form} spelling for {server.kind}")
    return forms[form]


def rows(server: Server, table: str) -> list[tuple[Any, ...]]:
    if server.kind == "postgresql":
        return targets.rows(server.plain, table)
    return targets.mariadb_rows(server.plain, table)


# --------------------------------------------------------------------------- the CLI, every spelling


@pytest.mark.parametrize("form", FORMS)
def test_cli_masks_the_password_in_every_spelling(server: Server, form: str) -> None:
    """status and recover, table and JSON, quiet and -v: the URL is shown, its password never."""
    for name, url in [(form, form_url(server, form))]:
        runs = [
            cli("status", "--url", url, "--older-than", "0s", "--sink-id", server.sink),
            cli("-v", "status", "--url", url, "--json", "--sink-id", server.sink),
            cli("-v", "recover", "--url", url, "--dry-run", "--sink-id", server.sink),
            cli("recover", "--url", url, "--dry-run", "--json", "--sink-id", server.sink),
            cli("-v", "status", "--url", url, "--prometheus", "--sink-id", server.sink, "--crit-prepared-age", "0"),
        ]
        for proc in runs:
            assert proc.returncode == 0, f"{name}: {proc.args[3:]}\n{proc.stdout}{proc.stderr}"
        assert server.sink in runs[0].stdout and server.sink in runs[1].stdout
        for proc in (runs[0], runs[2]):
            server_line = proc.stdout.splitlines()[0]
            assert server_line.startswith("server: "), proc.stdout
            assert f"{server.user}:***@{server.host}:{server.port}/{server.database}" in server_line, (
                name,
                server_line,
            )
        for proc in (runs[1], runs[3]):
            doc = json.loads(proc.stdout)
            assert f"{server.user}:***@" in doc["url"], (name, doc["url"])
        assert "Traceback" not in runs[1].stderr + runs[2].stderr
        up = f'xasink_up{{server="{server.host}:{server.port}",database="{server.database}"}} 1'
        assert up in runs[4].stdout.splitlines(), (name, runs[4].stdout)
        assert f'sink="{server.sink}"' in runs[4].stdout
        if server.user != server.database:  # PostgreSQL's: both "postgres"
            assert server.user not in runs[4].stdout  # labels: server, database and sink, never the login


@pytest.mark.parametrize("form", FORMS)
def test_python_api_reports_mask_the_password(server: Server, form: str) -> None:
    for name, url in [(form, form_url(server, form))]:
        status = xasink.status(url, sink_id=server.sink)
        report = xasink.recover(url, dry_run=True, sink_id=server.sink)
        assert [s.sink_id for s in status.sinks] == [server.sink] and not status.errors, status
        for text in (
            repr(status),
            str(status),
            repr(report),
            json.dumps(status.to_dict(), default=str),
            json.dumps(report.to_dict(), default=str),
        ):
            no_secret(text)
        assert f"{server.user}:***@" in status.url, (name, status.url)


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize("form", FORMS)
def test_wrong_password_is_refused_without_showing_it(server: Server, form: str) -> None:
    wrong = quote(SECRET + "x", safe="")
    for name, url in [(form, form_url(server, form, password=wrong))]:
        for args in (["status", "--url", url], ["-v", "recover", "--url", url, "--dry-run", "--json"]):
            proc = cli(*args)
            assert proc.returncode == (3 if args[0] == "status" else 2), (name, proc.stdout, proc.stderr)
            out = proc.stdout + proc.stderr
            assert "authentication failed" in out and server.user in out, (name, out)
        with pytest.raises(xasink.ConnectError) as info:
            xasink.status(url)
        no_secret(info.value)
        with pytest.raises(xasink.ConnectError) as info:
            Coordinator(parse_options({"url": url, "dbtable": "t"})).preflight()
        no_secret(info.value)
        assert "authentication failed" in str(info.value)


def test_unreachable_server_error_does_not_show_the_password(server: Server) -> None:
    for name, url in server.forms(port=free_port()).items():
        proc = cli("-v", "status", "--url", url, "--json")
        assert proc.returncode == 3, (name, proc.stdout, proc.stderr)  # status: UNKNOWN
        assert "cannot connect" in json.loads(proc.stdout)["error"]
        proc = cli("status", "--url", url, "--prometheus")
        assert proc.returncode == 3 and "cannot connect" in proc.stderr, (name, proc.stderr)
        assert " 0" in next(ln for ln in proc.stdout.splitlines() if ln.startswith("xasink_up{")), proc.stdout
        proc = cli("recover", "--url", url, "--dry-run")
        assert proc.returncode == 2 and "cannot connect" in proc.stderr, (name, proc.stderr)
        with pytest.raises(xasink.ConnectError) as info:
            xasink.recover(url)
        no_secret(info.value)


def test_option_errors_do_not_show_the_password(server: Server) -> None:
    for url in server.forms().values():
        for bad in ({"dbtable": "a.b.c"}, {"dbtable": "t", "batchsize": "many"}, {"dbtable": "t", "nope": "1"}):
            with pytest.raises(OptionError) as info:
                parse_options({"url": url, **bad})
            no_secret(info.value)


# --------------------------------------------------------------------------- a write: logs, results, reprs


@pytest.mark.parametrize("form", FORMS)
def test_a_write_logs_and_shows_no_password(server: Server, form: str, caplog: pytest.LogCaptureFixture) -> None:
    """A real batch with the log at DEBUG; then every object a user may print."""
    caplog.set_level(logging.DEBUG, logger="xasink")
    for name, url in [(form, form_url(server, form))]:
        coordinator, result, table = write_one_batch(url, server)
        try:
            assert sorted(rows(server, table)) == [(i, f"v{i}") for i in range(1, 6)], name
            assert result.rows == 5 and result.branches == 2
            options = coordinator.options
            assert options.url.username == server.user and options.url.password == SECRET, name
            shown = [
                repr(result),
                str(result),
                repr(options),
                str(options),
                repr(options.url),
                str(options.url),
                repr(coordinator),
                repr(coordinator.dialect),
                repr(coordinator.dialect.engine),
                repr(options.with_batch(1)),
            ]
            no_secret(*shown)
            assert "***" in repr(options), repr(options)
        finally:
            coordinator.close()
    messages = [logging.Formatter("%(message)s").format(r) for r in caplog.records]
    assert any("committed 5 rows" in m for m in messages), messages
    no_secret(*messages)


def test_password_option_wins_over_the_url_and_is_masked(server: Server) -> None:
    """The ``password`` option beside a URL that holds another: the option wins, neither is shown."""
    other = "not-the-" + SECRET[::-1]
    for url in server.forms(password=quote(other, safe="")).values():
        options = parse_options({"url": url, "dbtable": "t", "password": SECRET})
        assert options.url.password == SECRET
        for text in (repr(options), str(options.url), repr(options.url)):
            no_secret(text)
            assert other not in text and quote(other, safe="") not in text, text


# --------------------------------------------------------------------------- through Spark


@pytest.mark.spark
@pytest.mark.parametrize("form", ["jdbc-query", "jdbc-userinfo", "url-query"])
def test_spark_writes_and_failures_show_no_password(
    spark: Any, server: Server, form: str, caplog: pytest.LogCaptureFixture
) -> None:
    """format("xasink") and xasink.write with the password in the URL: a committed batch, then a job that
    fails in a task; the result, the error (its JVM trace included) and the log never show the password."""
    caplog.set_level(logging.DEBUG, logger="xasink")
    url = form_url(server, form)
    table = f"t_{uuid.uuid4().hex[:8]}"
    df = spark.range(0, 10, 1, 2).selectExpr("id", "cast(id as string) as v")
    df.write.format("xasink").option("url", url).option("dbtable", table).mode("append").save()
    result = xasink.write(df, url, table)
    no_secret(str(result), repr(result))
    assert result.rows == 10 and len(rows(server, table)) == 20
    bad = spark.range(0, 20, 1, 2).selectExpr("id", "cast(assert_true(id < 15, 'id too big') as string) as v")
    with pytest.raises(xasink.BatchAbortedError) as info:
        xasink.write(bad, url, table)
    no_secret(info.value)
    assert "id too big" in str(info.value)
    assert len(rows(server, table)) == 20
    no_secret(*(logging.Formatter("%(message)s").format(r) for r in caplog.records))


@pytest.mark.spark
def test_a_transaction_whose_log_has_a_password_shows_it_nowhere(
    spark: Any, server: Server, caplog: pytest.LogCaptureFixture
) -> None:
    """xasink.transaction with the decision log's password in journal_url (and the write's in its URL): a
    committed transaction, then one whose log sink row another session holds past controlLockTimeout while
    its second write runs.  Its error, the result and the log at DEBUG never show the password, and the failed one
    leaves nothing visible and nothing prepared."""

    caplog.set_level(logging.DEBUG, logger="xasink")
    url = form_url(server, "url-userinfo")
    log = targets.make_target(targets.POSTGRESQL if server.kind == "postgresql" else targets.MARIADB, server.plain)
    table, sink = f"t_{uuid.uuid4().hex[:8]}", f"txs-{uuid.uuid4().hex[:8]}"
    df = spark.range(0, 6, 1, 2).selectExpr("id", "cast(id as string) as v")
    with xasink.transaction(sink_id=sink, batch_id=1, journal_url=url) as tx:
        tx.write(df, url, table)
    no_secret(str(tx.result), repr(tx.result))
    with pytest.raises(xasink.BatchAbortedError) as info:
        with xasink.transaction(sink_id=sink, batch_id=2, journal_url=url, controlLockTimeout=1) as tx:
            tx.write(df.selectExpr("id + 100 as id", "v"), url, table)  # the transaction's claim
            with sink_row_locked(log, sink):  # then its tasks cannot check their branches in the log
                tx.write(df.selectExpr("id + 200 as id", "v"), url, f"{table}_2", lockTimeout=1)
    no_secret(info.value)
    assert "nothing it wrote is visible" in str(info.value), info.value
    assert sorted(r[0] for r in rows(server, table)) == list(range(6))  # not the transaction's first write either
    assert not log.table_exists(f"{table}_2") or rows(server, f"{table}_2") == []
    assert log.prepared(sink) == []
    no_secret(*(logging.Formatter("%(message)s").format(r) for r in caplog.records))


# --------------------------------------------------------------------------- the masking functions themselves


def test_display_url_masks_password_and_secret_query_values() -> None:
    from xasink.options import parse_url
    from xasink.support.masking import display_url, url_secrets

    url = parse_url(f"postgresql://etl:{Q}@h:5432/db?sslmode=require&sslpassword={Q}")
    assert display_url(url) == "postgresql+psycopg2://etl:***@h:5432/db?sslmode=require&sslpassword=***"
    assert url_secrets(url) == (SECRET, SECRET)
    assert url.query["sslmode"] == "require"  # the query is kept for the driver, only shown masked


def test_redact_removes_every_quoting_and_credential_shapes() -> None:
    from xasink.support.masking import redact

    text = (
        f"raw {SECRET} sql '{SECRET}' url {Q} "
        "dsn host=h password='other secret' port=1 uri postgresql://u:xyz@h/db?PASSWORD=abc&x=1"
    )
    out = redact(text, [SECRET, None])
    no_secret(out)
    for gone in ("other secret", "xyz", "abc"):
        assert gone not in out, out
    assert "port=1" in out and "x=1" in out and "postgresql://u:***@h/db" in out


def test_a_retry_policy_over_another_databases_log_masks_both_passwords() -> None:
    """A transaction's decision log may be on another database, with other credentials, than the write it
    judges errors for (txwrite's recording of a part): a message the policy writes loses both passwords."""
    from xasink.dialects import dialect_for
    from xasink.options import parse_url
    from xasink.protocol.retry import RetryPolicy

    other = "log-only-" + SECRET[::-1]
    options = parse_options({"url": f"postgresql://etl:{Q}@h:5432/db", "dbtable": "t", "sinkId": "s"})
    policy = RetryPolicy(dialect_for(parse_url(f"mysql://log:{quote(other, safe='')}@h2:3306/logs")), options)
    told = policy.describe(RuntimeError(f"server said {other} and {SECRET}"))
    assert other not in told and SECRET not in told and told.startswith("RuntimeError: server said "), told


def test_cli_log_formatter_cleans_tracebacks() -> None:
    from xasink.support.masking import RedactingFormatter

    try:
        raise RuntimeError(f"driver said: cannot use {SECRET}")
    except RuntimeError:
        record = logging.LogRecord("xasink", logging.INFO, __file__, 1, "failure %s", (Q,), sys.exc_info())
    line = RedactingFormatter("%(levelname)s %(message)s", [SECRET]).format(record)
    assert "RuntimeError" in line and "***" in line
    no_secret(line)


@pytest.mark.parametrize(
    "url, query",
    [
        (f"jdbc:postgresql://h:5432/db?user=etl&password={Q}", {}),
        (f"jdbc:postgresql://h:5432/db?USER=etl&PASSWORD={Q}&sslmode=require", {"sslmode": "require"}),
        (f"jdbc:postgresql://etl:{Q}@h:5432/db", {}),
        (f"jdbc:mariadb://etl:{Q}@h:5432/db", {}),
        (f"jdbc:mysql://h:5432/db?User=etl&Password={Q}", {}),
        (f"postgresql://h:5432/db?user=etl&password={Q}&application_name=a", {"application_name": "a"}),
        (f"postgresql+psycopg2://etl@h:5432/db?Password={Q}", {}),
        (f"mysql://h:5432/db?user=etl&passwd={Q}&charset=utf8mb4", {"charset": "utf8mb4"}),
        (f"mysql+pymysql://etl:{Q}@h:5432/db", {}),
    ],
)
def test_parse_url_keeps_credentials_only_in_the_credentials(url: str, query: dict[str, str]) -> None:
    """Wherever user and password were written, they end up in the URL's credentials, never in its query."""
    parsed = parse_options({"url": url, "dbtable": "t"}).url
    assert (parsed.username, parsed.password, parsed.host, parsed.port, parsed.database) == (
        "etl",
        SECRET,
        "h",
        5432,
        "db",
    )
    assert dict(parsed.query) == query
