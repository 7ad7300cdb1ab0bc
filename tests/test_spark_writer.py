"""The batch writer through Spark (local mode), into PostgreSQL and MariaDB.

Each test checks what the user relies on: the exact row set (each id once), nothing of ours left
prepared, foreign prepared transactions untouched, and an error that says what went wrong without the
password.  Both entry points are covered: ``xasink.write`` (raises xasink's own error classes) and
``df.write.format("xasink")`` (Spark wraps our error; its text carries our message).

The atomicity, idempotence, task-retry and foreign-transaction tests take the ``db`` fixture and run on
both dialects (ids ``pg`` and ``mariadb``, see tests/targets.py); the rest are PostgreSQL-only (messages
of PostgreSQL's errors, its roles and pg_hba.conf).  MariaDB's own paths (LOAD DATA against INSERT, its
error codes) are in tests/test_mysql_dialect.py.
"""

from __future__ import annotations

import re
import socket
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg2
import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F  # noqa: N812 - Spark's usual alias
from pyspark.sql.types import IntegerType

import xasink
from tests.harness import expected, frame, needs_data_source
from tests.leaks import texts
from tests.targets import (
    MARIADB,
    POSTGRESQL,
    XASINK_FORMAT_ID,
    PostgresTarget,
    Target,
    case,
    libpq_url,
    make_target,
    with_login,
)
from xasink.errors import (
    BatchAbortedError,
    BatchIdentityError,
    BranchError,
    ConnectError,
    OptionError,
    PreflightError,
    XasinkError,
)
from xasink.ops import survey as admin
from xasink.options import parse_options
from xasink.protocol import judgement
from xasink.protocol.coordinator import Coordinator
from xasink.protocol.xid import Xid
from xasink.results import WriteResult
from xasink.spark.versions import HAS_DATA_SOURCE
from xasink.support.embedded import EmbeddedPostgres
from xasink.support.faults import LOCAL_PROPERTY

# Each case run on both databases runs on one of them in CI (both with --soak, tests/conftest.py): the way
# into Spark is the same for both dialects, whose database side test_crash.py, test_hostile.py and the
# scenarios run on both.
pytestmark = pytest.mark.one_database

# The superuser's real password (the test server checks it on every TCP login): the tests pass it as the
# ``password`` option, and it must never appear in any error text.  (test_wrong_password_* uses a role of its own.)
SECRET = PostgresTarget.password
PATHS = ["api", "format"]
# both entry points on PostgreSQL; on MariaDB one is enough where the path is Spark's business, not the dialect's
DB_PATHS = [case(POSTGRESQL, "api"), case(POSTGRESQL, "format"), case(MARIADB, "api")]


# --------------------------------------------------------------------------- helpers


def decided_xids(db: Target, sink_id: str, batch_id: int) -> list[Xid]:
    found = db.decision(sink_id, batch_id)
    assert found is not None, f"no decision recorded for {sink_id}/{batch_id}"
    xids = [Xid.parse(g) for g in found.xids]
    assert all(x is not None for x in xids)
    return [x for x in xids if x is not None]


def new_sink() -> str:
    return f"s{uuid.uuid4().hex[:10]}"


def credentials(db: Target) -> dict[str, Any]:
    """The password option the target's tests pass (PostgreSQL: the never-to-be-shown SECRET; MariaDB: none)."""
    return {"password": db.password} if db.password is not None else {}


def write(db: Target, df: DataFrame, table: str, **options: Any) -> WriteResult:
    return xasink.write(df, db.url, table, **credentials(db), **options)


def assert_no_secret(exc: BaseException, secret: str = SECRET) -> None:
    for text in texts(exc):
        assert secret not in text, f"the password leaked into an error: {text[:500]}"


def format_writer(df: DataFrame, db: Target, table: str, **options: Any) -> Any:
    w = df.write.format("xasink").option("url", db.url).option("dbtable", table)
    for key, value in {**credentials(db), **options}.items():
        w = w.option(key, str(value))
    return w.mode("append")


def failing_write(
    path: str, df: DataFrame, db: Target, table: str, error: type[XasinkError], message: str, **options: Any
) -> BaseException:
    """Run a write that must fail; check the error class (api) or text (format) and that no password leaks."""
    info: pytest.ExceptionInfo[BaseException]
    if path == "api":
        with pytest.raises(error) as info:
            write(db, df, table, **options)
        assert type(info.value) is error, repr(info.value)  # the exact class, not a base or a subclass
        text = str(info.value)
        assert not re.search(r"Traceback|nanoarrow|SQLSTATE: 38000|JVM", text), text  # our message, no dump
    else:
        with pytest.raises(Exception) as info:  # noqa: B017,PT011 - Spark picks the wrapper class
            format_writer(df, db, table, **options).save()
        assert not isinstance(info.value, XasinkError)
        text = "\n".join(texts(info.value))
        assert f"xasink.errors.{error.__name__}" in text or error is XasinkError
    assert re.search(message, text, re.I | re.S), text[:3000]
    if db.password is not None:
        assert_no_secret(info.value, db.password)
    return info.value


@pytest.fixture
def table(pg: Target) -> str:
    return pg.new_table()


# --------------------------------------------------------------------------- happy path, idempotence


@pytest.mark.core
def test_write_commits_every_partition_once(spark: SparkSession, db: Target) -> None:
    table = db.new_table()
    result = write(db, frame(spark, range(120), 4), table)
    assert (result.rows, result.branches, result.skipped) == (120, 4, False)
    assert db.rows(table) == expected(range(120))
    assert sorted(x.partition for x in decided_xids(db, result.sink_id, 0)) == [0, 1, 2, 3]
    assert db.decision(result.sink_id, 0).state == "committed"  # type: ignore[union-attr]
    assert db.prepared(result.sink_id) == []


@pytest.mark.core
def test_rerun_of_committed_batch_writes_nothing(spark: SparkSession, db: Target) -> None:
    table, sink = db.new_table(), new_sink()
    first = write(db, frame(spark, range(40), 2), table, sink_id=sink, batch_id=7)
    assert (first.rows, first.skipped) == (40, False)
    # same (sinkId, batchId), even with other rows: nothing new, through both entry points
    again = write(db, frame(spark, range(1000, 1040), 3), table, sink_id=sink, batch_id=7)
    assert again.skipped is True
    assert (again.sink_id, again.batch_id, again.rows) == (sink, 7, 0)  # this run's rows: none
    assert again.earlier is not None and again.earlier.rows == 40  # the earlier run's
    if HAS_DATA_SOURCE:  # format("xasink"): Spark 4.0+
        format_writer(frame(spark, range(2000, 2040), 3), db, table, sinkId=sink, batchId=7).save()
    assert db.rows(table) == expected(range(40))
    # the next batch id does write
    nxt = write(db, frame(spark, range(500, 510), 2), table, sink_id=sink, batch_id=8)
    assert (nxt.rows, nxt.skipped) == (10, False)
    assert db.rows(table) == expected([*range(40), *range(500, 510)])
    assert sorted(db.decisions(sink)) == [7, 8]
    assert db.prepared(sink) == []


@pytest.mark.parametrize(("db", "path"), DB_PATHS, indirect=["db"])
def test_same_batch_to_another_table_is_refused(spark: SparkSession, db: Target, path: str) -> None:
    """(sinkId, batchId) committed to table A, then aimed at table B: refused, B gets nothing, A unchanged."""
    a, b, sink = db.new_table(), db.new_table(), new_sink()
    assert not write(db, frame(spark, range(40), 2), a, sink_id=sink, batch_id=7).skipped
    message = rf"batch 7 was committed to table \S*\.{a} in database .* now being written to table \S*\.{b} "
    failing_write(path, frame(spark, range(100, 140), 2), db, b, BatchIdentityError, message, sinkId=sink, batchId=7)
    assert not db.table_exists(b) or db.rows(b) == []
    assert db.rows(a) == expected(range(40))
    assert write(db, frame(spark, range(40), 2), a, sink_id=sink, batch_id=7).skipped  # same target: a replay
    assert db.rows(a) == expected(range(40))
    assert db.prepared(sink) == []


# --------------------------------------------------------------------------- atomicity


@pytest.mark.core
@pytest.mark.parametrize(("db", "path"), DB_PATHS, indirect=["db"])
def test_failing_udf_in_one_partition_leaves_nothing(spark: SparkSession, db: Target, path: str) -> None:
    # a serial column proves rows of the other partitions were really loaded (sequences ignore rollback)
    table = db.new_table()
    db.create_table(table, f"{db.serial_column}, id int, name text")

    def poisoned(value: int) -> int:  # nested: cloudpickle ships it by value to the Python workers
        if value == 119:  # the last row: in the last partition, which runs after others have prepared
            raise ValueError("boom: row 119 is poisoned")
        return value

    boom = F.udf(poisoned, IntegerType())
    df = frame(spark, range(120), 4).withColumn("id", boom("id"))
    if path == "api":
        err = failing_write(path, df, db, table, BatchAbortedError, r"rolled back.*ValueError: boom: row 119")
        assert "nothing" in str(err) or "no row" in str(err)
    else:
        needs_data_source()
        failing_write(path, df, db, table, XasinkError, r"ValueError: boom: row 119 is poisoned")
    assert db.rows(table) == []
    assert db.prepared() == []
    assert db.serial_high_water(table) >= 60, "the healthy partitions should have loaded their rows before the failure"


# the error each dialect reports, for each violation in partition 3
CONSTRAINT_MESSAGES = {
    "duplicate-key-in-partition": {
        POSTGRESQL: r"partition 3.*duplicate key.*deduplicate",
        MARIADB: r"partition 3.*Duplicate entry '110' for key 'PRIMARY'.*\[1062\].*deduplicate",
    },
    "duplicate-of-committed-row": {
        POSTGRESQL: r"partition 3.*duplicate key.*\(id\)=\(5000\) already exists",
        MARIADB: r"partition 3.*Duplicate entry '5000' for key 'PRIMARY'.*\[1062\]",
    },
    "null-in-not-null": {
        POSTGRESQL: r"partition 3.*null value in column \"name\".*NOT NULL",
        MARIADB: r"partition 3.*NULL supplied to NOT NULL column 'name'.*NULL in a NOT NULL column",
    },
}


@pytest.mark.parametrize(("db", "path"), DB_PATHS, indirect=["db"])
@pytest.mark.parametrize(
    ("violation", "columns", "id_expr", "name_expr"),
    [
        pytest.param(
            "duplicate-key-in-partition",
            "id int PRIMARY KEY, name text",
            "CASE WHEN id = 119 THEN 110 ELSE id END",
            "name",
            id="duplicate-key-in-partition",
        ),
        pytest.param(
            "duplicate-of-committed-row",
            "id int PRIMARY KEY, name text",
            "CASE WHEN id = 119 THEN 5000 ELSE id END",
            "name",
            id="duplicate-of-committed-row",
        ),
        pytest.param(
            "null-in-not-null",
            "id int, name text NOT NULL",
            "id",
            "CASE WHEN id = 119 THEN NULL ELSE name END",
            id="null-in-not-null",
        ),
    ],
)
def test_constraint_violation_in_one_partition_leaves_nothing(
    spark: SparkSession, db: Target, path: str, violation: str, columns: str, id_expr: str, name_expr: str
) -> None:
    table = db.new_table()
    db.create_table(table, columns)
    db.execute(f"INSERT INTO {db.q(table)} VALUES (5000, 'n5000')")
    df = frame(spark, range(120), 4).selectExpr(f"{id_expr} as id", f"{name_expr} as name")
    failing_write(path, df, db, table, BranchError, CONSTRAINT_MESSAGES[violation][db.kind])
    assert db.rows(table) == [(5000, "n5000")]
    assert db.prepared() == []


def test_duplicate_keys_across_partitions_fail_instead_of_hanging(spark: SparkSession, pg: Target, table: str) -> None:
    """Partition 1 repeats a key partition 0 holds in a prepared branch: a lock wait nobody would ever end.

    lockTimeout turns it into a clear error (PostgreSQL waits forever by default).  MariaDB's error for
    the same wait (1205) is checked without Spark in tests/test_upsert.py.
    """
    pg.keyed_table(table)
    df = frame(spark, range(4), 2).selectExpr("cast(id % 2 as int) as id", "name")  # partition 0: 0,1; partition 1: 0,1
    failing_write("api", df, pg, table, BranchError, r"lock.*lockTimeout.*duplicate keys", lockTimeout=1)
    assert pg.rows(table) == []
    assert pg.prepared() == []


# --------------------------------------------------------------------------- task retry


@pytest.mark.core
@pytest.mark.parametrize("primary_key", [False, True], ids=["heap", "primary-key"])
def test_retried_task_after_prepare_commits_each_row_once(spark: SparkSession, db: Target, primary_key: bool) -> None:
    """Attempt 0 of partition 1 prepares, then fails; Spark's retry adopts its prepared branch (reports it,
    writes nothing, never waits on its locks), and each row commits once."""
    table, sink = db.new_table(), new_sink()
    db.keyed_table(table, primary_key=primary_key)
    spark.sparkContext.setLocalProperty(LOCAL_PROPERTY, "task.after_prepare:raise:p=1:a=0")
    try:
        result = write(db, frame(spark, range(80), 4), table, sink_id=sink, batch_id=3, lockTimeout=10)
    finally:
        spark.sparkContext.setLocalProperty(LOCAL_PROPERTY, None)  # type: ignore[arg-type]
    assert (result.rows, result.branches, result.skipped) == (80, 4, False)
    assert db.rows(table) == expected(range(80))
    xids = {x.partition: x for x in decided_xids(db, sink, 3)}
    assert sorted(xids) == [0, 1, 2, 3]
    # partitions 0 and 1 got the first two task ids of the stage; partition 1's decided branch is attempt 0's
    assert xids[1].task_attempt_id == xids[0].task_attempt_id + 1
    assert db.prepared(sink) == []


# --------------------------------------------------------------------------- numPartitions


def test_num_partitions_coalesces(spark: SparkSession, pg: Target, table: str) -> None:
    sink = new_sink()
    result = write(pg, frame(spark, range(60), 6), table, sink_id=sink, numPartitions=2)
    assert (result.rows, result.branches) == (60, 2)
    assert sorted(x.partition for x in decided_xids(pg, sink, 0)) == [0, 1]
    assert pg.rows(table) == expected(range(60))
    assert pg.prepared() == []


def test_num_partitions_exceeded_by_format_path_fails(spark: SparkSession, pg: Target, table: str) -> None:
    failing_write(
        "format", frame(spark, range(60), 4), pg, table, OptionError, r"numPartitions.*coalesce\(2\)", numPartitions=2
    )
    assert pg.rows(table) == []  # created by the driver before the tasks ran; partitions 0 and 1 rolled back
    assert pg.prepared() == []


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("path", PATHS)
def test_missing_table_without_create(spark: SparkSession, pg: Target, table: str, path: str) -> None:
    failing_write(
        path, frame(spark, range(10), 2), pg, table, PreflightError, rf"no table {table}", createTable="false"
    )
    assert not pg.table_exists(table)
    assert pg.prepared() == []


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(
    ("ddl", "select", "error", "message"),
    [
        pytest.param(
            "id int, name text",
            ["id", "name", "id * 2 as extra"],
            PreflightError,
            r"column 'extra' of the DataFrame is not in table",
            id="column-missing-from-table",
        ),
        pytest.param(
            "id int, name int",
            ["id", "name"],
            BranchError,  # read by the server, as JDBC's with stringtype=unspecified, which refuses 'n0'
            r"invalid input syntax for type integer",
            id="string-into-integer",
        ),
        pytest.param(
            "id int, name varchar(3)",
            ["id", "CASE WHEN id = 19 THEN 'abcd' ELSE 'abc' END as name"],
            BranchError,
            r"partition 1.*too long.*varying\(3\)",
            id="string-too-long",
        ),
        pytest.param(
            "id int, name text",
            ["CASE WHEN id = 19 THEN id + 4000000000 ELSE id END as id", "name"],
            BranchError,
            r"partition 1.*column 'id' does not fit.*int32",
            id="bigint-overflows-integer",
        ),
    ],
)
def test_bad_input_is_explained_and_writes_nothing(
    spark: SparkSession,
    pg: Target,
    table: str,
    path: str,
    ddl: str,
    select: list[str],
    error: type[XasinkError],
    message: str,
) -> None:
    pg.create_table(table, ddl)
    df = spark.range(0, 20, 1, 2).selectExpr("id", "concat('n', id) as name").selectExpr(*select)
    failing_write(path, df, pg, table, error, message)
    assert pg.rows(table) == []
    assert pg.prepared() == []


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("where", ["closed-port", "no-database"])
def test_unreachable_server_is_explained(spark: SparkSession, pg: Target, path: str, where: str) -> None:
    port = int(re.search(r":(\d+)/", pg.url).group(1))  # type: ignore[union-attr]
    if where == "closed-port":
        url, message = f"postgresql://etl:{SECRET}@127.0.0.1:{_closed_port()}/postgres", r"cannot connect to PostgreSQL"
    else:
        url, message = f"jdbc:postgresql://127.0.0.1:{port}/no_such_db", r"no_such_db.*does not exist"
    elsewhere = make_target(POSTGRESQL, url)
    failing_write(path, frame(spark, range(10), 2), elsewhere, "t_never", ConnectError, message, user="postgres")
    assert pg.prepared() == []


def test_overwrite_with_upsert_keys_is_rejected(spark: SparkSession, pg: Target, table: str) -> None:
    with pytest.raises(Exception) as info:  # noqa: B017,PT011
        format_writer(frame(spark, range(10), 2), pg, table).option("upsertKeyColumns", "id").mode("overwrite").save()
    text = "\n".join(texts(info.value))
    assert "xasink.errors.OptionError" in text and "mode('overwrite') replaces them" in text
    assert_no_secret(info.value)
    assert not pg.table_exists(table)
    assert pg.prepared() == []


@pytest.mark.parametrize("path", PATHS)
def test_unknown_option_is_named(spark: SparkSession, pg: Target, table: str, path: str) -> None:
    failing_write(path, frame(spark, range(10), 2), pg, table, OptionError, r"unknown option 'batchIdd'", batchIdd=3)
    assert not pg.table_exists(table)


@pytest.fixture
def password_role(pg_server: EmbeddedPostgres | None, pg: Target) -> Iterator[tuple[str, str]]:
    """A role of its own that must give its password (the test server checks every TCP login: scram)."""
    if pg_server is None:
        pytest.skip("needs the embedded server: an external one may trust every login")
    role, password = f"pw_{uuid.uuid4().hex[:8]}", "right-Pw-9"
    pg.execute(f"CREATE ROLE {role} LOGIN PASSWORD '{password}'")
    pg.execute(f"GRANT CREATE, USAGE ON SCHEMA public TO {role}")
    try:
        yield role, password
    finally:
        pg.execute(f"DROP OWNED BY {role}")  # the table and the journal it created
        pg.execute(f"DROP ROLE {role}")


@pytest.mark.parametrize("path", PATHS)
def test_wrong_password_is_explained_and_hidden(
    spark: SparkSession, pg: Target, table: str, password_role: tuple[str, str], path: str
) -> None:
    role, password = password_role
    with pytest.raises(psycopg2.OperationalError):  # the rule is in force
        psycopg2.connect(libpq_url(with_login(pg.url, role, "wrong")))
    failing_write(
        path,
        frame(spark, range(10), 2),
        pg,
        table,
        ConnectError,
        rf"authentication failed for user '{role}'",
        user=role,
    )
    assert not pg.table_exists(table)
    # the right password reaches the driver and every executor's branch
    result = xasink.write(
        frame(spark, range(10), 2), pg.url, table, user=role, password=password, journalTablePrefix=f"{role}_"
    )
    assert (result.rows, result.branches) == (10, 2)
    assert pg.rows(table) == expected(range(10))


# --------------------------------------------------------------------------- foreign prepared transactions


def test_foreign_prepared_transactions_survive_writes_sweeps_and_recovery(spark: SparkSession, db: Target) -> None:
    table, sink = db.new_table(), new_sink()
    scratch = f"{table}_scratch"
    names = [
        f"foreign-etl-{sink}",
        f"xasink:other-{sink}",  # our prefix, not our format
        f"xasink:{sink}:0/0:1-0123ABCD",  # our sink and batch, an attempt token we never make
        f"xasink:{sink}:1",  # a gtrid without bqual
        f"XASINK:{sink}:0/0:1-0123abcd",
    ]
    foreign: list[str] = []
    try:
        foreign += [db.make_foreign_prepared(n, scratch, format_id=XASINK_FORMAT_ID) for n in names]
        if db.kind == MARIADB:  # XA formatIDs: names that parse as ours, under another formatID, are someone else's
            others = [f"xasink:{sink}:0/1:2-89abcdef", f"xasink:{sink}:1/0:3-89abcdef"]
            foreign += [db.make_foreign_prepared(n, scratch, format_id=1) for n in others]
        assert len(set(foreign)) == len(foreign) and set(foreign) <= db.listed()

        def intact() -> None:
            assert set(foreign) <= db.listed()
            assert [g for g in db.prepared() if Xid.parse(g) is not None] == []

        write(db, frame(spark, range(30), 3), table, sink_id=sink, batch_id=0)  # commit + sweep
        intact()
        boom = F.udf(lambda v: 1 // 0 if v == 59 else v, IntegerType())
        with pytest.raises(BatchAbortedError):  # abort + sweep
            write(db, frame(spark, range(30, 60), 3).withColumn("id", boom("id")), table, sink_id=sink, batch_id=1)
        intact()
        assert write(db, frame(spark, range(30), 3), table, sink_id=sink, batch_id=0).skipped  # replay: recover
        intact()
        coordinator = Coordinator(parse_options({"url": db.url, "dbtable": table, "sinkId": sink, **credentials(db)}))
        try:
            coordinator.recover()  # the sink's recovery
        finally:
            coordinator.close()
        intact()
        report = admin.recover(db.url, older_than_s=0)  # `xasink recover`: every sink of the database
        assert not report.errors
        assert {e.gid for e in report.entries} >= set(foreign)  # seen, and left alone
        assert all(e.action == judgement.IGNORE_FOREIGN for e in report.entries if e.gid in foreign)
        intact()
        assert db.rows(table) == expected(range(30))
    finally:
        for name in foreign:
            db.clear_foreign(name)
    assert not set(foreign) & db.listed()
    assert db.rows(scratch) == []  # none of them was ever committed
