"""User options: Spark-JDBC-compatible names, strict validation that names the option, no password leaks."""

from __future__ import annotations

import logging
from typing import Any

import psycopg2.extensions
import pytest

from xasink.dialects.postgres import PostgresDialect
from xasink.errors import OptionError
from xasink.options import KNOWN, TableName, WriteOptions, parse_options

PG = "postgresql://db.example:5432/shop"
SECRET = "s3cr3t-P@ss:w/rd?&%é"


def opts(**extra: Any) -> WriteOptions:
    raw: dict[str, Any] = {"url": PG, "dbtable": "orders"}
    raw.update(extra)
    return parse_options(raw)


def error(raw: dict[str, Any], *, streaming: bool = False) -> str:
    with pytest.raises(OptionError) as info:
        parse_options(raw, streaming=streaming)
    return str(info.value)


# --------------------------------------------------------------------------- keys and URLs


def test_keys_are_case_insensitive() -> None:
    o = parse_options(
        {
            "URL": PG,
            "DbTable": "orders",
            "SINKID": "s1",
            "batchid": "7",
            "NumPartitions": 3,
            "CREATETABLECOLUMNTYPES": "id BIGINT",
            "JournalRetention": "5",
        }
    )
    assert (o.sink_id, o.batch_id, o.num_partitions, o.journal_retention) == ("s1", 7, 3, 5)
    assert o.create_table_column_types == (("id", "BIGINT"),)
    assert o.sink_id_given


def test_defaults() -> None:
    o = opts()
    assert o.backend == "postgresql"
    assert o.batch_id == 0
    assert o.num_partitions is None
    assert not o.sink_id_given
    assert o.sink_id != opts().sink_id  # a fresh id per write without sinkId: a rerun writes again
    assert o.create_table and o.journal_prefix == "xasink_" and o.journal_retention == 1000


def test_jdbc_postgresql_url_with_credentials_in_query() -> None:
    o = parse_options(
        {"url": "jdbc:postgresql://db.example:5433/shop?user=etl&password=s3cr%40t&ApplicationName=x", "dbtable": "t"}
    )
    assert o.url.drivername == "postgresql+psycopg2"
    assert (o.url.host, o.url.port, o.url.database) == ("db.example", 5433, "shop")
    assert (o.url.username, o.url.password) == ("etl", "s3cr@t")
    assert dict(o.url.query) == {"application_name": "x"}  # pgjdbc's name for libpq's parameter


def test_options_override_url_credentials() -> None:
    o = parse_options(
        {"url": "jdbc:postgresql://h/d?user=a&password=b", "dbtable": "t", "user": "etl", "password": SECRET}
    )
    assert (o.url.username, o.url.password) == ("etl", SECRET)
    o = parse_options({"url": "postgresql://a:b@h/d", "dbtable": "t", "user": "etl", "password": SECRET})
    assert (o.url.username, o.url.password) == ("etl", SECRET)


def test_an_application_name_in_the_url_wins_over_xasinks() -> None:
    for url in ("postgresql://etl@h/d?application_name=orders-etl", "jdbc:postgresql://h/d?ApplicationName=orders-etl"):
        dialect = PostgresDialect(parse_options({"url": url, "dbtable": "t"}).url)
        assert psycopg2.extensions.parse_dsn(dialect.libpq_uri())["application_name"] == "orders-etl"
        assert dialect.connect_args()["application_name"] == "orders-etl"
    assert (
        PostgresDialect(parse_options({"url": "postgresql://h/d", "dbtable": "t"}).url).connect_args()[
            "application_name"
        ]
        == "xasink"
    )


def test_jdbc_tls_parameters_are_kept_or_refused() -> None:
    o = parse_options({"url": "jdbc:postgresql://h/d?sslmode=verify-full&sslrootcert=/ca.pem", "dbtable": "t"})
    assert dict(o.url.query) == {"sslmode": "verify-full", "sslrootcert": "/ca.pem"}
    uri = PostgresDialect(o.url).libpq_uri()
    assert psycopg2.extensions.parse_dsn(uri)["sslmode"] == "verify-full"
    assert "sslMode" in error({"url": "jdbc:mysql://h/d?sslMode=REQUIRED", "dbtable": "t"})
    assert "ssl" in error({"url": "jdbc:postgresql://h/d?ssl=true", "dbtable": "t"})


def test_libpq_uri_keeps_query_parameters_exactly() -> None:
    o = parse_options(
        {"url": "postgresql://etl@h:5433/d?options=-c%20lock_timeout%3D5s&sslmode=require", "dbtable": "t"}
    )
    dsn = psycopg2.extensions.parse_dsn(PostgresDialect(o.url).libpq_uri())
    assert dsn == {
        "user": "etl",
        "host": "h",
        "port": "5433",
        "dbname": "d",
        # the URL's options, then the startup settings of Spark's JDBC writer's sessions, which win over them
        "options": "-c lock_timeout=5s -c client_encoding=UTF8 -c DateStyle=ISO -c extra_float_digits=3 "
        "-c array_nulls=on",
        "sslmode": "require",
        "application_name": "xasink",
        # TCP keepalives on branch connections too (issue 15 item 11); the URL's own keepalives* would win
        "keepalives": "1",
        "keepalives_idle": "30",
        "keepalives_interval": "10",
        "keepalives_count": "3",
    }


def test_control_connection_options_put_the_urls_own_last() -> None:
    """The control connection's synchronous_commit and lock_timeout come first in libpq's options: the URL's
    own settings win; but for array_nulls, last (an overwrite's apply copies arrays as text)."""
    o = parse_options({"url": "postgresql://etl@h/d?options=-c%20lock_timeout%3D5s", "dbtable": "t"})
    args = PostgresDialect(o.url, o.branch_settings).connect_args()
    assert args["options"] == (
        "-c synchronous_commit=on -c default_transaction_isolation=read\\ committed"
        " -c lock_timeout=60000 -c lock_timeout=5s -c array_nulls=on"
    )
    assert (args["keepalives"], args["keepalives_idle"]) == (1, 30)
    o = parse_options({"url": "postgresql://etl@h/d", "dbtable": "t", "controlLockTimeout": "0"})
    assert PostgresDialect(o.url, o.branch_settings).connect_args()["options"] == (
        "-c synchronous_commit=on -c default_transaction_isolation=read\\ committed -c array_nulls=on"
    )


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://etl@db.example:5432/shop",
        "postgres://etl@db.example:5432/shop",
        "postgresql+psycopg2://etl@db.example:5432/shop",
        "postgresql+asyncpg://etl@db.example:5432/shop",
        "  jdbc:postgresql://db.example:5432/shop?user=etl  ",
        "JDBC:PostgreSQL://db.example:5432/shop?user=etl",
    ],
)
def test_postgres_url_spellings(url: str) -> None:
    o = parse_options({"url": url, "dbtable": "t"})
    assert o.url.drivername == "postgresql+psycopg2"
    assert (o.url.username, o.url.host, o.url.port, o.url.database) == ("etl", "db.example", 5432, "shop")


@pytest.mark.parametrize(
    "url",
    ["jdbc:mysql://h:3306/shop", "jdbc:mariadb://h:3306/shop", "mysql://h/shop", "mariadb://h/shop"],
)
def test_mysql_urls_select_mysql(url: str) -> None:
    o = parse_options({"url": url, "dbtable": "t"})
    assert o.backend == "mysql"
    assert o.url.drivername == "mysql+pymysql"
    assert o.url.database == "shop"


def test_password_never_in_repr_or_str() -> None:
    for raw in (
        {"url": PG, "dbtable": "t", "password": SECRET},
        {"url": f"jdbc:postgresql://h/d?user=u&password={SECRET.replace('%', '%25').replace('&', '%26')}"},
        {"url": f"postgresql://u:{SECRET.replace('%', '%25').replace('@', '%40').replace('/', '%2F')}@h/d"},
    ):
        raw.setdefault("dbtable", "t")
        o = parse_options(raw)
        assert o.url.password == SECRET
        for text in (repr(o), str(o), repr(o.url), str(o.url), f"{o}"):
            assert SECRET not in text
            assert "s3cr3t" not in text
        # the dialect's libpq URI carries it exactly (percent-encoded), for the branch connection only
        assert psycopg2.extensions.parse_dsn(PostgresDialect(o.url).libpq_uri())["password"] == SECRET


def test_password_not_in_option_errors() -> None:
    base = {"url": PG, "password": SECRET}
    for raw in (
        {**base, "dbtable": "a.b.c"},
        {**base, "dbtable": "t", "sinkId": "no spaces"},
        {**base, "dbtable": "t", "bogus": SECRET},
        {**base, "dbtable": "t", "batchId": "x"},
        {"url": f"jdbc:oracle:thin:u/{SECRET}@h:1521/x", "dbtable": "t"},
        {"url": f"mssql://u:{SECRET}@h/d", "dbtable": "t"},
        {"url": f"jdbc:postgresql://h:{SECRET}/d", "dbtable": "t"},
        {"url": f"postgresql://u:{SECRET}@h", "dbtable": "t"},
        {"url": f"not a url {SECRET}", "dbtable": "t"},
    ):
        assert "s3cr3t" not in error(raw)


# --------------------------------------------------------------------------- errors name the option


@pytest.mark.parametrize(
    ("raw", "named"),
    [
        ({"dbtable": "t"}, "'url'"),
        ({"url": PG}, "'dbtable'"),
        ({"url": PG, "dbtable": "t", "bogusOption": "1"}, "'bogusOption'"),
        ({"url": PG, "dbtable": "t", "query": "select 1"}, "'query'"),
        ({"url": PG, "dbtable": "t", "cascadeTruncate": "true"}, "'cascadeTruncate'"),
        ({"url": PG, "dbtable": "t", "deleteFlagColumn": "op"}, "'deleteFlagColumn'"),
        ({"url": PG, "dbtable": "t", "sequenceColumn": "lsn"}, "'sequenceColumn'"),
        ({"url": PG, "dbtable": "t", "upsertKeyColumns": "id", "deleteFlagColumn": "id"}, "'deleteFlagColumn'"),
        ({"url": PG, "dbtable": "t", "batchId": "-1"}, "'batchId'"),
        ({"url": PG, "dbtable": "t", "batchId": "abc"}, "'batchId'"),
        ({"url": PG, "dbtable": "t", "batchId": "1.5"}, "'batchId'"),
        ({"url": PG, "dbtable": "t", "batchId": str(2**63)}, "'batchId'"),
        ({"url": PG, "dbtable": "t", "numPartitions": "0"}, "'numPartitions'"),
        ({"url": PG, "dbtable": "t", "numPartitions": "-3"}, "'numPartitions'"),
        ({"url": PG, "dbtable": "t", "numPartitions": "many"}, "'numPartitions'"),
        ({"url": PG, "dbtable": "t", "sinkId": "a" * 33}, "'sinkId'"),
        ({"url": PG, "dbtable": "t", "sinkId": "a:b"}, "'sinkId'"),
        ({"url": PG, "dbtable": "t", "sinkId": "ordérs"}, "'sinkId'"),
        ({"url": PG, "dbtable": "t", "sinkId": ""}, "'sinkId'"),
        ({"url": PG, "dbtable": "t", "createTable": "maybe"}, "'createTable'"),
        ({"url": PG, "dbtable": "t", "journalTablePrefix": "x; drop"}, "'journalTablePrefix'"),
        ({"url": PG, "dbtable": "t", "commitParallelism": "0"}, "'commitParallelism'"),
        ({"url": "jdbc:oracle:thin:@h:1521/x", "dbtable": "t"}, "'url'"),
        ({"url": "jdbc:sqlserver://h;databaseName=d", "dbtable": "t"}, "'url'"),
        ({"url": "sqlite:///x.db", "dbtable": "t"}, "'url'"),
        ({"url": "not a url", "dbtable": "t"}, "'url'"),
        ({"url": "postgresql://h", "dbtable": "t"}, "'url'"),
        ({"url": "jdbc:postgresql://h:port/d", "dbtable": "t"}, "'url'"),
    ],
)
def test_invalid_options_are_named(raw: dict[str, Any], named: str) -> None:
    assert named in error(raw)


def test_unknown_option_lists_known_ones() -> None:
    msg = error({"url": PG, "dbtable": "t", "sinkid_": "x"})
    assert "'sinkid_'" in msg and "sinkId" in msg and "dbtable" in msg


def test_spark_jdbc_options_accepted() -> None:
    o = opts(driver="org.postgresql.Driver", isolationLevel="READ_COMMITTED", checkpointLocation="/tmp/c", path="/x")
    assert o.table == TableName("orders")


def test_streaming_requires_sink_id_and_forbids_batch_id() -> None:
    assert "'sinkId'" in error({"url": PG, "dbtable": "t"}, streaming=True)
    assert "'batchId'" in error({"url": PG, "dbtable": "t", "sinkId": "s", "batchId": "3"}, streaming=True)
    o = parse_options({"url": PG, "dbtable": "t", "sinkId": " s-1.x_ "}, streaming=True)
    assert o.sink_id == "s-1.x_" and o.sink_id_given


def test_integer_limits() -> None:
    assert opts(batchId=str(2**63 - 1)).batch_id == 2**63 - 1
    assert opts(batchId=" 42 ").batch_id == 42
    assert opts(batchId="").batch_id == 0
    assert opts(numPartitions=100_000).num_partitions == 100_000


# --------------------------------------------------------------------------- dbtable


@pytest.mark.parametrize(
    ("raw", "schema", "name"),
    [
        ("orders", None, "orders"),
        ("Orders", None, "orders"),
        ("Public.Orders", "public", "orders"),
        (" public . orders ", "public", "orders"),
        ('"Public"."Orders"', "Public", "Orders"),
        ('"my.schema"."my.table"', "my.schema", "my.table"),
        ('"say ""hi"""', None, 'say "hi"'),
        ('"with space".t', "with space", "t"),
        ("`ticks.x`", None, "ticks.x"),
        ("Bestellungen_Ü", None, "bestellungen_Ü"),  # PostgreSQL folds only ASCII letters
        ('"Ünïcode"."表"', "Ünïcode", "表"),
        ("x" * 63, None, "x" * 63),
    ],
)
def test_dbtable_postgres(raw: str, schema: str | None, name: str) -> None:
    assert opts(dbtable=raw).table == TableName(name, schema)


def test_dbtable_mysql_keeps_case() -> None:
    o = parse_options({"url": "mysql://h/d", "dbtable": "Shop.Orders"})
    assert o.table == TableName("Orders", "Shop")


@pytest.mark.parametrize(
    "raw",
    [
        "a.b.c",
        '"a"."b"."c"',
        "",
        "   ",
        ".t",
        "s.",
        "a..b",
        '""',
        '"unterminated',
        '"a"b',
        "x" * 64,
        "é" * 32,  # 64 bytes
        "t\x00",
        "x" * 100_000,
    ],
)
def test_dbtable_rejected(raw: str) -> None:
    msg = error({"url": PG, "dbtable": raw})
    assert "'dbtable'" in msg
    assert len(msg) < 400  # a huge value is not echoed whole


def test_dbtable_str_is_unquoted_display() -> None:
    assert str(opts(dbtable='"my.schema".t').table) == "my.schema.t"


# --------------------------------------------------------------------------- createTableColumnTypes


def test_column_types() -> None:
    o = opts(
        createTableColumnTypes='id BIGINT, amount NUMERIC(10, 2),name VARCHAR(64) , "Odd,Name" double precision, '
        '"q""x" TIMESTAMP WITH TIME ZONE, `b` decimal( 12 , 3 )'
    )
    assert o.create_table_column_types == (
        ("id", "BIGINT"),
        ("amount", "NUMERIC(10, 2)"),
        ("name", "VARCHAR(64)"),
        ("Odd,Name", "double precision"),
        ('q"x', "TIMESTAMP WITH TIME ZONE"),
        ("b", "decimal( 12 , 3 )"),
    )
    assert opts(createTableColumnTypes="").create_table_column_types == ()


@pytest.mark.parametrize(
    "raw",
    [
        "INT; DROP TABLE x",
        "id INT; DROP TABLE x",
        "id INT); DROP TABLE x; --",
        "id INT DEFAULT 1; DROP TABLE x",
        "id INT -- comment",
        "id VARCHAR(64)) , x INT",
        "id VARCHAR('a')",
        "id NUMERIC(10, 2, 3)",
        "id INT,",
        ", id INT",
        "id",
        "1id INT",
        "id INT\nDROP TABLE x",
        "id INT /* x */",
        "id 'INT'",
        "id ВИГИНТ",
        "id " + "A" * 100_000 + ";",
    ],
)
def test_column_types_rejected(raw: str) -> None:
    msg = error({"url": PG, "dbtable": "t", "createTableColumnTypes": raw})
    assert "'createTableColumnTypes'" in msg
    assert len(msg) < 400


def test_hostile_values_in_other_options() -> None:
    long = "x" * 100_000
    for raw in (
        {"url": PG, "dbtable": "t", "batchId": long},
        {"url": PG, "dbtable": "t", "sinkId": long},
        {"url": PG, "dbtable": "t", "createTable": long},
        {"url": PG, "dbtable": "t", "sinkId": "s'; DROP TABLE t; --"},
        {"url": PG, "dbtable": "t", "sinkId": "s\x00"},
        {"url": PG, "dbtable": "t", "journalSchema": "x" * 64},
    ):
        msg = error(raw)
        assert len(msg) < 400


def test_surrounding_whitespace_is_trimmed() -> None:
    assert opts(sinkId=" s1\n").sink_id == "s1"
    assert opts(batchId="\t9 ").batch_id == 9


def test_commit_timeout_and_the_deprecated_commit_retries() -> None:
    """commitTimeout bounds the work after the decision (default minutes); commitRetries is only a cap if set."""
    o = opts()
    assert o.commit_timeout == 300 and o.commit_retries is None
    o = parse_options({"url": PG, "dbtable": "t", "COMMITTIMEOUT": " 5 ", "CommitRetries": "2"})
    assert (o.commit_timeout, o.commit_retries) == (5, 2)
    assert opts(commitTimeout="0").commit_timeout == 0  # one try of each step, no retry
    assert "'commitTimeout'" in error({"url": PG, "dbtable": "t", "commitTimeout": "-1"})
    assert "'commitTimeout'" in error({"url": PG, "dbtable": "t", "commitTimeout": "5min"})


# --------------------------------------------------------------------------- editor help: typed keyword options

# the options write() and foreach_batch() take as arguments of their own, or that only the format API has
POSITIONAL = {"url", "dbtable", "sinkId", "batchId"}
NOT_KEYWORDS = {"cascadeTruncate"}  # refused unless false: not offered


@pytest.mark.parametrize("name", ["write", "foreach_batch"])
def test_every_option_is_a_typed_keyword_with_its_errors_documented(name: str) -> None:
    """``help(xasink.write)`` and editors show every option with its type; the docstring lists what it raises.
    Every other keyword still goes through ``**options`` (Spark JDBC names xasink accepts and ignores)."""
    import inspect
    import typing

    import xasink
    from xasink.spark import api

    fn = getattr(xasink, name)
    params = inspect.signature(fn).parameters
    keywords = {p.name for p in params.values() if p.kind is inspect.Parameter.KEYWORD_ONLY}
    wanted = set(KNOWN.values()) - POSITIONAL - NOT_KEYWORDS
    assert keywords == wanted
    assert all(params[k].default is None for k in keywords)
    hints = typing.get_type_hints(getattr(api, name))
    assert all(type(None) in typing.get_args(hints[k]) for k in keywords), {k: hints[k] for k in keywords}
    assert any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    doc = inspect.getdoc(fn) or ""
    assert "Raises:" in doc and "Returns:" in doc
    if name == "write":
        assert all(k in doc for k in keywords), [k for k in keywords if k not in doc]
        raised = {"OptionError", "PreflightError", "ConnectError", "BranchError", "BatchAbortedError", "ApplyError"}
        raised |= {"ConcurrentWriterError", "BatchIdentityError", "ForgottenBatchError", "CommitIncompleteError"}
        raised |= {"DecisionUnknownError", "ReplayIncompleteError", "JournalError", "XasinkWarning"}
        assert [e for e in sorted(raised) if e not in doc] == []


def test_keyword_options_and_options_go_together_and_an_option_twice_is_refused() -> None:
    """No DataFrame is touched: the options are checked first."""
    import xasink

    with pytest.raises(OptionError, match="'numPartitions' is given twice"):
        xasink.write(None, "postgresql://h/db", "t", numPartitions=2, NUMPARTITIONS=3)  # type: ignore[arg-type]
    with pytest.raises(OptionError, match="unknown option 'numparts'"):
        xasink.write(None, "postgresql://h/db", "t", numparts=2)  # type: ignore[arg-type]
    with pytest.raises(OptionError, match="'batchsize'"):
        xasink.foreach_batch("postgresql://h/db", "t", "s", batchsize=0)


@pytest.mark.parametrize(
    "url",
    [
        "jdbc:mysql://h:3306/d?sessionVariables=sql_mode%3D'ANSI%2CNO_AUTO_VALUE_ON_ZERO'%2Ctime_zone%3D'%2B00:00'"
        "%2Cwait_timeout%3D5&user=u",
        "mysql://u@h:3306/d?sessionVariables=sql_mode%3D'ANSI%2CNO_AUTO_VALUE_ON_ZERO'%2Ctime_zone%3D'%2B00:00'"
        "%2Cwait_timeout%3D5",
    ],
    ids=["jdbc", "sqlalchemy"],
)
def test_mysql_session_variables_reach_the_sessions_not_the_driver(url: str, caplog: pytest.LogCaptureFixture) -> None:
    """Connector/J's sessionVariables: sql_mode and time_zone are set on xasink's sessions, as on JDBC's; the
    rest are not, which a warning says, and pymysql, which knows no such parameter, never sees it."""
    from xasink.dialects.mysql import MySQLDialect

    o = parse_options({"url": url, "dbtable": "t"})
    with caplog.at_level(logging.WARNING):
        dialect = MySQLDialect(o.url, o.branch_settings)
    assert "sessionVariables wait_timeout are not set on xasink's sessions" in caplog.text
    assert dialect.session == {"sql_mode": "ANSI,NO_AUTO_VALUE_ON_ZERO", "time_zone": "+00:00"}
    assert dict(dialect.url.query) == {}
    assert (dialect.url.host, dialect.url.database, dialect.url.username) == ("h", "d", "u")
