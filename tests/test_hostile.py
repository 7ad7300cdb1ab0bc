"""Hostile names and bad input: quoted safely, refused clearly, nothing visible, nothing prepared.

* Table, schema and column names built as SQL injection (quotes, semicolons, comments, ``%s`` and ``$1``
  placeholders, spaces) are written through Spark into tables with exactly those names; two victim
  tables prove no statement ran that the user did not intend.  Hostile option values (sinkId,
  journalSchema, createTableColumnTypes, a database name) and a hostile foreign gid are refused or
  handled without running anything.
* The bad-input matrix covers what ``tests/test_spark_writer.py`` does not: a missing NOT NULL column,
  numeric overflow, unsupported and incompatible types, a missing schema, invalid option values (through
  Spark's own option path), a server that is down (stopped, or going down in the middle of the batch)
  and exhausted prepared-transaction slots.  Each case checks the error's class and text, that nothing
  is visible and nothing prepared.
* The password given to every write appears in no log record, exception or output (autouse check).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from psycopg2 import sql as psql
from pyspark.sql import DataFrame, SparkSession

import xasink
from tests.cluster import Tally, host_port, tally_fixture
from tests.leaks import SECRET, assert_no_secret, no_secret_in_output, run_cli, texts  # noqa: F401 - autouse fixture
from tests.targets import connect, make_foreign_prepared, prepared_gids, rollback_prepared
from tests.tcp_proxy import TcpProxy
from xasink.errors import (
    BatchAbortedError,
    BranchError,
    ConnectError,
    OptionError,
    PreflightError,
    XasinkError,
)
from xasink.options import parse_options, parse_table
from xasink.protocol.coordinator import Coordinator
from xasink.support.embedded import EmbeddedPostgres

VICTIMS = ("victim", "students")

# --------------------------------------------------------------------------- fixtures


tally = tally_fixture("test_hostile")


@pytest.fixture
def victims(pg_url: str) -> Iterator[None]:
    """Two tables an injection would drop or empty; each must keep its one row."""
    for name in VICTIMS:
        sql(pg_url, f"CREATE TABLE IF NOT EXISTS {name} (x int)")
        sql(pg_url, f"TRUNCATE {name}")
        sql(pg_url, f"INSERT INTO {name} VALUES (42)")
    yield
    for name in VICTIMS:
        assert sql(pg_url, "SELECT to_regclass(%s) IS NOT NULL", name)[0][0], f"table {name} was dropped"
        assert sql(pg_url, f"SELECT x FROM {name}") == [(42,)], f"table {name} was changed"


@pytest.fixture(scope="module")
def small_pg() -> Iterator[EmbeddedPostgres]:
    """A second server with only two prepared-transaction slots (and one a test may stop); it checks passwords too."""
    with EmbeddedPostgres(max_prepared_transactions=2, password=SECRET) as server:
        yield server


# --------------------------------------------------------------------------- helpers


def sql(url: str, statement: str | psql.Composable, *params: Any) -> list[tuple[Any, ...]]:
    with connect(url) as conn, conn.cursor() as cur:
        cur.execute(statement, params or None)
        return list(cur.fetchall()) if cur.description else []


def ident(schema: str | None, name: str) -> psql.Composable:
    return psql.Identifier(schema, name) if schema else psql.Identifier(name)


def exists(url: str, schema: str | None, name: str) -> bool:
    found = sql(
        url,
        "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE c.relname = %s AND n.nspname = coalesce(%s, 'public')",
        name,
        schema,
    )
    return bool(found[0][0])


def columns(url: str, schema: str | None, name: str) -> list[str]:
    found = sql(
        url,
        "SELECT a.attname FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid "
        "JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE c.relname = %s AND n.nspname = coalesce(%s, 'public') AND a.attnum > 0 ORDER BY a.attnum",
        name,
        schema,
    )
    return [r[0] for r in found]


def ours(url: str) -> list[str]:
    return prepared_gids(url, prefix="xasink:")


def frame(spark: SparkSession, columns: list[str], n: int = 20, partitions: int = 2) -> DataFrame:
    """n rows: an int id and, for each further column, the text '<column>-<id>', under exactly these names."""
    exprs = ["cast(id as int)"] + [f"concat('v', id) as c{i}" for i in range(1, len(columns))]
    return spark.range(0, n, 1, partitions).selectExpr(*exprs).toDF(*columns)


def expected(columns: list[str], n: int = 20) -> list[tuple[Any, ...]]:
    return [(i, *[f"v{i}"] * (len(columns) - 1)) for i in range(n)]


def write_fails(
    run: Callable[[], Any], error: type[XasinkError], message: str, tally: Tally, spark_wrapped: bool = False
) -> str:
    """Run a write that must fail with ``error`` matching ``message``; returns the error text."""
    with pytest.raises(Exception) as info:  # noqa: B017,PT011 - the class is checked below
        run()
    assert_no_secret(info.value)
    text = "\n".join(texts(info.value))
    if spark_wrapped:  # df.write.format(...).save(): Spark wraps our error; its text carries class and message
        assert f"xasink.errors.{error.__name__}" in text, text[:3000]
    else:
        assert isinstance(info.value, error), f"{type(info.value).__name__}: {text[:3000]}"
    assert re.search(message, text, re.I | re.S), text[:3000]
    tally.add(bad_inputs=1)
    return text


# =========================================================================== hostile names


HOSTILE_TABLES = [
    pytest.param('"x""; DROP TABLE victim; --"', id="double-quote-drop"),
    pytest.param("Robert'); DROP TABLE students;--", id="bobby-tables"),
    pytest.param('"a\'b"', id="single-quote"),
    pytest.param('"sp ace; DELETE FROM victim"', id="space-delete"),
    pytest.param('"pct%s%(x)s $1"', id="placeholders"),
    pytest.param('"we ird"."t""; TRUNCATE victim; --"', id="schema-and-table"),
]
HOSTILE_COLUMNS = [
    "id",
    'x"; DROP TABLE victim; --',
    "Robert'); DROP TABLE students;--",
    "a'b",
    "sp ace",
    "pct%s $1",
]


@pytest.mark.parametrize("dbtable", HOSTILE_TABLES)
def test_hostile_table_and_column_names_are_quoted(
    spark: SparkSession, pg_url: str, victims: None, tally: Tally, dbtable: str
) -> None:
    """The table and its columns get exactly the hostile names; the rows land once; the victims stay."""
    target = parse_table(dbtable, "postgresql")
    if target.schema:
        sql(pg_url, psql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(psql.Identifier(target.schema)))
    try:
        result = xasink.write(frame(spark, HOSTILE_COLUMNS), pg_url, dbtable, password=SECRET)
        assert (result.rows, result.branches) == (20, 2)
        assert exists(pg_url, target.schema, target.name), f"no table named exactly {target.name!r}"
        assert columns(pg_url, target.schema, target.name) == HOSTILE_COLUMNS
        have = sql(pg_url, psql.SQL("SELECT * FROM {} ORDER BY 1").format(ident(target.schema, target.name)))
        want = expected(HOSTILE_COLUMNS)
        tally.rows(have, want)
        tally.add(hostile_names=1 + len(HOSTILE_COLUMNS))
        assert have == want
        assert ours(pg_url) == []
    finally:
        sql(pg_url, psql.SQL("DROP TABLE IF EXISTS {}").format(ident(target.schema, target.name)))
        if target.schema:
            sql(pg_url, psql.SQL("DROP SCHEMA IF EXISTS {}").format(psql.Identifier(target.schema)))


def test_upsert_keyed_by_a_hostile_column(spark: SparkSession, pg_url: str, victims: None, tally: Tally) -> None:
    table = f"u_{uuid.uuid4().hex[:6]}"
    key = "k'); DROP TABLE victim; --"
    cols = [key, 'v"; TRUNCATE students; --']
    sql(pg_url, psql.SQL("CREATE TABLE {} ({} int PRIMARY KEY, {} text)").format(*map(psql.Identifier, [table, *cols])))
    try:
        for n in (10, 15):  # 10 inserted, then 10 updated and 5 inserted
            result = xasink.write(frame(spark, cols, n=n), pg_url, table, password=SECRET, upsertKeyColumns=key)
            assert result.rows == n
        have = sql(pg_url, psql.SQL("SELECT * FROM {} ORDER BY 1").format(psql.Identifier(table)))
        tally.rows(have, expected(cols, 15))
        tally.add(hostile_names=len(cols))
        assert have == expected(cols, 15)
        assert ours(pg_url) == []
    finally:
        sql(pg_url, psql.SQL("DROP TABLE IF EXISTS {}").format(psql.Identifier(table)))


@pytest.mark.parametrize(
    ("option", "value", "error", "message"),
    [
        ("sinkId", "x'; DROP TABLE victim; --", OptionError, r"option 'sinkId'.*invalid"),
        ("createTableColumnTypes", "id INT); DROP TABLE victim; --", OptionError, r"createTableColumnTypes"),
        ("journalTablePrefix", "x; DROP TABLE victim; --", OptionError, r"journalTablePrefix"),
        ("dbtable", 'x"; DROP TABLE victim; --', OptionError, r"option 'dbtable'"),
        ("journalSchema", 'j"; DROP TABLE victim; --', PreflightError, r"cannot create the xasink decision log"),
        ("upsertKeyColumns", "id); DROP TABLE victim; --", PreflightError, r"upsertKeyColumns.*not a column"),
    ],
)
def test_hostile_option_values_run_nothing(
    spark: SparkSession,
    pg_url: str,
    victims: None,
    tally: Tally,
    option: str,
    value: str,
    error: type[XasinkError],
    message: str,
) -> None:
    table = f"h_{uuid.uuid4().hex[:6]}"
    opts: dict[str, Any] = {"password": SECRET, option: value}
    target = opts.pop("dbtable", table)
    write_fails(lambda: xasink.write(frame(spark, ["id", "name"]), pg_url, target, **opts), error, message, tally)
    tally.add(hostile_names=1)
    assert not exists(pg_url, None, table) or sql(pg_url, f"SELECT count(*) FROM {table}") == [(0,)]
    sql(pg_url, f"DROP TABLE IF EXISTS {table}")
    assert ours(pg_url) == []


def test_hostile_database_name_is_only_a_name(spark: SparkSession, pg_url: str, victims: None, tally: Tally) -> None:
    host, port = host_port(pg_url)
    url = f"postgresql://postgres@{host}:{port}/postgres'; DROP TABLE victim; --"
    write_fails(
        lambda: xasink.write(frame(spark, ["id"]), url, "t", password=SECRET), ConnectError, r"does not exist", tally
    )
    tally.add(hostile_names=1)


def test_hostile_foreign_gid_is_untouched_then_rolled_back_only_on_request(
    spark: SparkSession, pg_url: str, victims: None, tally: Tally
) -> None:
    """A foreign prepared transaction named as an injection survives writes and recovery; the operator's
    explicit ``--rollback-foreign`` rolls back exactly it."""
    gid = "x'); DROP TABLE victim; --"
    scratch = f"scratch_{uuid.uuid4().hex[:6]}"
    make_foreign_prepared(pg_url, gid, table=scratch)
    table = f"g_{uuid.uuid4().hex[:6]}"
    try:
        sink = f"g{uuid.uuid4().hex[:8]}"
        xasink.write(frame(spark, ["id"]), pg_url, table, sink_id=sink, password=SECRET)
        Coordinator(parse_options({"url": pg_url, "dbtable": table, "sinkId": sink})).recover()
        assert gid in prepared_gids(pg_url)
        url = pg_url  # the superuser's password in the URL: the CLI must not show it
        for args in (["status"], ["recover", "--older-than", "0s"], ["recover", "--rollback-foreign", gid]):
            cli = run_cli(*args, "--url", url, "--json")
            assert cli.returncode == 0, cli.stdout + cli.stderr
            if args[-1] != gid:
                assert gid in prepared_gids(pg_url)
        assert gid not in prepared_gids(pg_url)
        assert sql(pg_url, f"SELECT count(*) FROM {scratch}") == [(0,)]  # rolled back, not committed
        tally.add(hostile_names=1)
    finally:
        if gid in prepared_gids(pg_url):
            rollback_prepared(pg_url, gid)
        sql(pg_url, f"DROP TABLE IF EXISTS {table}, {scratch}")


# =========================================================================== the bad-input matrix

BAD_DATA = [
    pytest.param(
        "id int, name text, created date NOT NULL",
        ["id", "concat('n', id) as name"],
        BranchError,
        r"null value in column \"created\".*NOT NULL",
        id="not-null-column-missing",
    ),
    pytest.param(
        "id int, amount numeric(5,2)",
        ["id", "cast(id * 10000 as int) as amount"],
        BranchError,
        r"column 'amount' does not fit.*decimal",
        id="numeric-overflow",
    ),
    pytest.param(
        "id int, flag int",
        ["id", "id % 2 = 0 as flag"],
        PreflightError,
        r"column 'flag'.*bool.*cannot be written",
        id="boolean-into-integer",
    ),
    pytest.param(
        "id int, payload text",
        ["id", "cast(concat('b', id) as binary) as payload"],
        PreflightError,
        r"column 'payload'.*binary.*cannot be written",
        id="binary-into-text",
    ),
    pytest.param(
        "id int, tags text",
        ["id", "array('a', 'b') as tags"],
        PreflightError,
        r"column 'tags'.*(cannot write|cannot be written)",
        id="array-unsupported",
    ),
    pytest.param(
        "id int, at timestamp",
        ["id", "to_date('2020-01-01') as at", "id as extra"],
        PreflightError,
        r"column 'extra' of the DataFrame is not in table",
        id="extra-column",
    ),
]


@pytest.mark.parametrize(("ddl", "select", "error", "message"), BAD_DATA)
def test_bad_data_is_explained_and_writes_nothing(
    spark: SparkSession,
    pg_url: str,
    tally: Tally,
    ddl: str,
    select: list[str],
    error: type[XasinkError],
    message: str,
) -> None:
    table = f"b_{uuid.uuid4().hex[:6]}"
    sql(pg_url, f"CREATE TABLE {table} ({ddl})")
    try:
        df = spark.range(0, 20, 1, 2).selectExpr(*select)
        write_fails(lambda: xasink.write(df, pg_url, table, password=SECRET), error, message, tally)
        assert sql(pg_url, f"SELECT count(*) FROM {table}") == [(0,)]
        assert ours(pg_url) == []
    finally:
        sql(pg_url, f"DROP TABLE IF EXISTS {table}")


def test_missing_schema_is_named(spark: SparkSession, pg_url: str, tally: Tally) -> None:
    write_fails(
        lambda: xasink.write(frame(spark, ["id"]), pg_url, "no_such_schema.t", password=SECRET),
        PreflightError,
        r"schema 'no_such_schema'.*does not exist",
        tally,
    )
    assert ours(pg_url) == []


INVALID_OPTIONS = [  # each refused by parse_options (tests/test_options.py has the full list); here via Spark
    ("batchsize", "ten", r"option 'batchsize': expected an integer"),
    ("createTable", "maybe", r"option 'createTable': expected true or false"),
    ("batchId", "9223372036854775808", r"option 'batchId'"),
    ("sinkId", "a b", r"option 'sinkId'"),
    ("url", f"postgresql://etl:{SECRET}@127.0.0.1:notaport/db", r"option 'url'"),
    ("url", f"jdbc:postgresql://127.0.0.1/db?user=etl&password={SECRET}&ssl=true", r"option 'url'.*ssl"),
    ("cascadeTruncate", "true", r"option 'cascadeTruncate'"),
    ("replaceWhere", "id > 1", r"option 'replaceWhere'.*mode\('overwrite'\)"),
]


@pytest.mark.parametrize(
    ("option", "value", "message"), INVALID_OPTIONS, ids=[f"{o}={v[:20]}" for o, v, _ in INVALID_OPTIONS]
)
def test_invalid_option_values_through_spark(
    spark: SparkSession, pg_url: str, tally: Tally, option: str, value: str, message: str
) -> None:
    """Through Spark's own option path (df.write.format): refused on the driver, before any task."""
    table = f"o_{uuid.uuid4().hex[:6]}"
    opts = {"url": pg_url, "dbtable": table, "password": SECRET, option: value}
    writer = frame(spark, ["id", "name"]).write.format("xasink").options(**opts).mode("append")
    write_fails(writer.save, OptionError, message, tally, spark_wrapped=True)
    assert not exists(pg_url, None, table)
    assert ours(pg_url) == []


# --------------------------------------------------------------------------- the server


def test_server_down_is_explained(spark: SparkSession, small_pg: EmbeddedPostgres, tally: Tally) -> None:
    small_pg.stop(remove=False)
    try:
        write_fails(
            lambda: xasink.write(frame(spark, ["id"]), small_pg.url, "t", password=SECRET),
            ConnectError,
            rf"cannot connect to PostgreSQL at 127\.0\.0\.1:{small_pg.port}/postgres: is the server running",
            tally,
        )
    finally:
        small_pg.start()


def test_server_going_down_mid_batch_leaves_nothing(
    spark: SparkSession, pg_url: str, tally: Tally, fresh_table_name: str
) -> None:
    """The first branch's COPY is cut and the server stays unreachable: the write fails clearly; once it is
    back, the sink's next write (its recovery) clears whatever was prepared, and nothing was visible."""
    table, sink = fresh_table_name, f"d{uuid.uuid4().hex[:8]}"
    sql(pg_url, f"CREATE TABLE {table} (id int, name text)")
    with TcpProxy(*host_port(pg_url)) as proxy:
        host, port = host_port(pg_url)
        url = pg_url.replace(f"@{host}:{port}/", f"@127.0.0.1:{proxy.port}/")
        proxy.cut_on(b"COPY", times=1, after_reply=False, then_down=True)
        write_fails(
            lambda: xasink.write(frame(spark, ["id", "name"], n=40, partitions=2), url, table, sink, password=SECRET),
            XasinkError,
            r"cannot connect|rolled back|could not be written",
            tally,
        )
        assert proxy.cut == 1
        assert sql(pg_url, f"SELECT count(*) FROM {table}") == [(0,)]
        proxy.reset()
        again = xasink.write(frame(spark, ["id", "name"], n=40, partitions=2), url, table, sink, password=SECRET)
        assert again.rows == 40
    have = sql(pg_url, f"SELECT id, name FROM {table} ORDER BY id")
    tally.rows(have, expected(["id", "name"], 40))
    assert have == expected(["id", "name"], 40)
    assert ours(pg_url) == []
    sql(pg_url, f"DROP TABLE {table}")


@pytest.mark.parametrize("path", ["api", "format"])
def test_prepared_transaction_slots_exhausted(
    spark: SparkSession, small_pg: EmbeddedPostgres, tally: Tally, path: str
) -> None:
    """Four branches, two slots: refused before any task when the driver knows the count (numPartitions, or
    xasink.write counting a DataFrame without a shuffle), else by the first task without a slot, before it
    loads its rows (format("xasink") without numPartitions): a PreflightError either way."""
    url, table = small_pg.url, f"m_{uuid.uuid4().hex[:6]}"
    df = frame(spark, ["id", "name"], n=40, partitions=4)
    if path == "api":
        write_fails(
            lambda: xasink.write(df, url, table, password=SECRET, numPartitions=4),
            PreflightError,
            r"2 free prepared-transaction slots.*needs 4",
            tally,
        )
    else:
        save = df.write.format("xasink").options(url=url, dbtable=table, password=SECRET).mode("append").save
        write_fails(save, PreflightError, r"no free prepared-transaction slot for partition \d", tally, True)
    assert not exists(url, None, table) or sql(url, f"SELECT count(*) FROM {table}") == [(0,)]
    assert ours(url) == []
    sql(url, f"DROP TABLE IF EXISTS {table}")


def test_batch_aborted_message_names_the_failing_udf_without_secrets(
    spark: SparkSession, pg_url: str, tally: Tally, fresh_table_name: str
) -> None:
    """A job failing for a reason of its own (a failed assert_true) says so: rolled back, nothing visible."""
    df = spark.range(0, 20, 1, 2).selectExpr(
        "cast(id as int) as id", "cast(assert_true(id < 15, 'id too big') as int) as ok"
    )
    write_fails(
        lambda: xasink.write(df, pg_url, fresh_table_name, password=SECRET),
        BatchAbortedError,
        r"rolled back.*no row of it is visible.*id too big",
        tally,
    )
    assert not exists(pg_url, None, fresh_table_name) or sql(pg_url, f"SELECT count(*) FROM {fresh_table_name}") == [
        (0,)
    ]
    sql(pg_url, f"DROP TABLE IF EXISTS {fresh_table_name}")
