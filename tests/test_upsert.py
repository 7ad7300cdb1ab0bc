"""Upsert mode (``upsertKeyColumns``) against the embedded PostgreSQL: merge on the key, still exactly once.

Most tests drive the executor and driver pieces directly (branch.write_partition, Coordinator), so each
partition's timing is under the test's control; the Spark tests cover both entry points.  Every test checks
the exact row set and that nothing of ours is left prepared (the autouse fixture checks that too).
"""

from __future__ import annotations

import datetime as dt
import decimal
import re
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import psycopg2
import pyarrow as pa
import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F  # noqa: N812 - Spark's usual alias
from pyspark.sql.types import IntegerType

import xasink
from tests.harness import frame
from tests.targets import (
    MARIADB,
    POSTGRESQL,
    XASINK_GID_PREFIX,
    Target,
    case,
    connect,
    mariadb_connect,
    mariadb_prepared_gids,
    mariadb_rows,
    mariadb_sink_ids,
    prepared_gids,
    rows,
)
from xasink.dialects.postgres import PostgresDialect
from xasink.errors import BranchError, PreflightError, XasinkError
from xasink.options import parse_options
from xasink.protocol.coordinator import Coordinator
from xasink.protocol.partition_writer import write_partition
from xasink.protocol.xid import Xid, new_run_nonce
from xasink.results import BranchOutcome, WriteResult
from xasink.support.faults import InjectedFault
from xasink.write_modes.schema import plan_target

# --------------------------------------------------------------------------- helpers


def sql(url: str, statement: str, *params: Any) -> list[tuple[Any, ...]]:
    with connect(url) as conn, conn.cursor() as cur:
        cur.execute(statement, params or None)
        return list(cur.fetchall()) if cur.description else []


def ours(url: str) -> list[str]:
    return prepared_gids(url, prefix=XASINK_GID_PREFIX)


def new_sink() -> str:
    return f"u{uuid.uuid4().hex[:10]}"


def batch(ids: Sequence[int | None], names: Sequence[str | None]) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays([pa.array(ids, pa.int32()), pa.array(names, pa.string())], names=["id", "name"])


def write_direct(
    url: str,
    table: str,
    partitions: Sequence[pa.RecordBatch | list[pa.RecordBatch]],
    *,
    sink: str | None = None,
    batch_id: int = 0,
    keys: str = "id",
    **extra: Any,
) -> WriteResult:
    """One batch as Spark would run it, without Spark: plan on the driver, a branch per partition, then decide.

    A partition that fails aborts the batch (as Spark's abort does) and re-raises.
    """
    raw = {"url": url, "dbtable": table, "sinkId": sink or new_sink(), "batchId": batch_id, **extra}
    if keys:
        raw["upsertKeyColumns"] = keys
    options = parse_options(raw)
    coordinator = Coordinator(options)
    run = new_run_nonce()
    try:
        coordinator.preflight(len(partitions))
        parts = [p if isinstance(p, list) else [p] for p in partitions]
        with coordinator.dialect.connect() as conn:
            plan = plan_target(coordinator.dialect, conn, options, parts[0][0].schema)
        outcomes: list[BranchOutcome | None] = []
        try:
            for number, batches in enumerate(parts):
                outcomes.append(
                    write_partition(
                        options,
                        plan,
                        batch_id=batch_id,
                        partition=number,
                        task_attempt_id=number,
                        run=run,
                        batches=batches,
                    )
                )
        except BaseException:
            coordinator.abort(batch_id, outcomes)
            raise
        return coordinator.commit(batch_id, outcomes)
    finally:
        coordinator.close()


@pytest.fixture
def table(pg_url: str, fresh_table_name: str) -> Iterator[str]:
    yield fresh_table_name
    sql(pg_url, f'DROP TABLE IF EXISTS "{fresh_table_name}"')


@pytest.fixture
def keyed(pg_url: str, table: str) -> str:
    """A table with a primary key holding ids 0..9 named old<id>."""
    sql(pg_url, f"CREATE TABLE {table} (id int PRIMARY KEY, name text)")
    sql(pg_url, f"INSERT INTO {table} SELECT g, 'old' || g FROM generate_series(0, 9) g")
    return table


OLD = [(i, f"old{i}") for i in range(10)]


# --------------------------------------------------------------------------- merge semantics (no Spark)


def test_upsert_updates_existing_rows_and_inserts_new_ones(pg_url: str, keyed: str) -> None:
    result = write_direct(
        pg_url, keyed, [batch([5, 6, 7], ["n5", "n6", "n7"]), batch([8, 12, 11], ["n8", "n12", "n11"])]
    )
    assert (result.rows, result.branches, result.skipped) == (6, 2, False)
    assert rows(pg_url, keyed) == OLD[:5] + [(5, "n5"), (6, "n6"), (7, "n7"), (8, "n8"), (9, "old9")] + [
        (11, "n11"),
        (12, "n12"),
    ]
    assert ours(pg_url) == []


def test_replay_of_a_committed_upsert_batch_writes_nothing(pg_url: str, keyed: str) -> None:
    sink = new_sink()
    write_direct(pg_url, keyed, [batch([1, 20], ["first", "first"])], sink=sink, batch_id=7)
    after_first = rows(pg_url, keyed)
    sql(pg_url, f"UPDATE {keyed} SET name = 'changed later' WHERE id = 1")  # a replay must not revert this
    replay = write_direct(pg_url, keyed, [batch([1, 20, 21], ["second", "second", "second"])], sink=sink, batch_id=7)
    assert replay.skipped
    expected = [(i, "changed later" if i == 1 else n) for i, n in after_first]
    assert rows(pg_url, keyed) == expected
    assert (1, "first") in after_first and (20, "first") in after_first
    assert ours(pg_url) == []


def test_duplicate_keys_in_one_partition_last_row_wins(
    pg_url: str, keyed: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ON CONFLICT DO UPDATE cannot touch a row twice in one statement: xasink keeps the partition's last row."""
    monkeypatch.setattr(PostgresDialect, "upsert_chunk_rows", 3)  # duplicates within a statement and across them
    part = [
        batch([3, 30, 3, 31, 3], ["a", "x", "b", "y", "c"]),  # chunks [3,30,3] [31,3]
        batch([30, 40, 40], ["z", "p", "q"]),
    ]
    result = write_direct(pg_url, keyed, [part])
    assert result.rows == 8  # rows handed over, before duplicates collapse
    got = dict(rows(pg_url, keyed))
    assert (got[3], got[30], got[31], got[40]) == ("c", "z", "y", "q")
    assert len(got) == 13
    assert ours(pg_url) == []


def test_a_null_key_is_refused_and_nothing_is_written(pg_url: str, keyed: str) -> None:
    with pytest.raises(BranchError, match=r"upsert key column 'id' is NULL"):
        write_direct(pg_url, keyed, [batch([1, 2], ["n1", "n2"]), batch([3, None], ["n3", "nothing"])])
    assert rows(pg_url, keyed) == OLD
    assert ours(pg_url) == []


def test_failure_in_one_partition_leaves_the_table_exactly_as_before(
    pg_url: str, keyed: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Partitions 0 and 1 have updated and inserted rows (prepared) when partition 2 fails: all of it is undone."""
    monkeypatch.setenv("XASINK_FAULT", "task.before_prepare:raise:p=2")
    parts = [batch([0, 1, 100], ["x", "x", "x"]), batch([2, 3, 101], ["x", "x", "x"]), batch([4, 102], ["x", "x"])]
    with pytest.raises(InjectedFault, match="injected fault at task.before_prepare"):
        write_direct(pg_url, keyed, parts)
    assert rows(pg_url, keyed) == OLD
    assert ours(pg_url) == []


def test_equal_keys_in_two_partitions_fail_clearly_instead_of_waiting(pg_url: str, keyed: str) -> None:
    """Partition 0 holds key 5 in a prepared branch; partition 1 would wait for it forever without lockTimeout."""
    parts = [batch([5, 50], ["p0", "p0"]), batch([51, 5], ["p1", "p1"])]
    with pytest.raises(BranchError) as info:
        write_direct(pg_url, keyed, parts, lockTimeout=1)
    text = str(info.value)
    assert "partition 1" in text and "lock timeout" in text, text
    assert "repartition" in text and "df.repartition('id')" in text, text
    assert "INSERT INTO" not in text, "the statement text is noise in the user's error"
    assert rows(pg_url, keyed) == OLD
    assert ours(pg_url) == []


def test_composite_key_and_names_that_need_quoting(pg_url: str, table: str) -> None:
    name = f"Up {table}"
    sql(
        pg_url,
        f'CREATE TABLE "{name}" ("Region" text, "select" int, "value;drop" text, '
        'CONSTRAINT k UNIQUE ("select", "Region"))',
    )
    sql(pg_url, f"INSERT INTO \"{name}\" VALUES ('eu', 1, 'old'), ('us', 1, 'old')")
    try:
        data = pa.RecordBatch.from_arrays(
            [pa.array(["eu", "eu"]), pa.array([1, 2], pa.int32()), pa.array(["new", "new2"])],
            names=["Region", "select", "value;drop"],
        )
        write_direct(pg_url, f'"{name}"', [data], keys="Region,select")
        assert sorted(sql(pg_url, f'SELECT * FROM "{name}"')) == [("eu", 1, "new"), ("eu", 2, "new2"), ("us", 1, "old")]
    finally:
        sql(pg_url, f'DROP TABLE IF EXISTS "{name}"')
    assert ours(pg_url) == []


def test_key_only_table_inserts_missing_keys_once(pg_url: str, table: str) -> None:
    """Nothing to update: ON CONFLICT DO NOTHING."""
    sql(pg_url, f"CREATE TABLE {table} (id int PRIMARY KEY)")
    sql(pg_url, f"INSERT INTO {table} VALUES (1), (2)")
    data = pa.RecordBatch.from_arrays([pa.array([2, 3, 3, 4], pa.int32())], names=["id"])
    write_direct(pg_url, table, [data])
    assert rows(pg_url, table) == [(1,), (2,), (3,), (4,)]


def test_a_created_table_gets_the_keys_as_primary_key(pg_url: str, table: str) -> None:
    write_direct(pg_url, table, [batch([1, 2], ["a", "b"])])
    write_direct(pg_url, table, [batch([2, 3], ["B", "c"])])
    assert rows(pg_url, table) == [(1, "a"), (2, "B"), (3, "c")]
    pk = sql(
        pg_url,
        "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) "
        "WHERE i.indrelid = %s::regclass AND i.indisprimary",
        table,
    )
    assert pk == [("id",)]


def test_every_supported_type_merges_as_append_loads_it(pg_url: str, table: str) -> None:
    """The upsert path binds Arrow arrays as parameters; append uses COPY BINARY: the stored values must agree."""
    ddl = (
        "id bigint PRIMARY KEY, i2 smallint, i4 int, f4 real, f8 double precision, d numeric(12,2), dn numeric, "
        "b boolean, s text, v varchar(8), by bytea, dt date, ts timestamp, tz timestamptz"
    )
    sql(pg_url, f"CREATE TABLE {table} ({ddl})")
    sql(pg_url, f"CREATE TABLE {table}_a ({ddl})")
    utc = dt.timezone.utc
    data = pa.RecordBatch.from_pydict(
        {
            "id": pa.array([1, 2, 3], pa.int64()),
            "i2": pa.array([-32768, None, 7], pa.int16()),
            "i4": pa.array([2**31 - 1, None, 0], pa.int32()),
            "f4": pa.array([1.5, None, float("inf")], pa.float32()),
            "f8": pa.array([-0.1, None, float("nan")], pa.float64()),
            "d": pa.array([decimal.Decimal("1.25"), None, decimal.Decimal("-9999999999.99")], pa.decimal128(12, 2)),
            "dn": pa.array([decimal.Decimal("1.5"), None, decimal.Decimal("-3.000000000001")], pa.decimal128(38, 12)),
            "b": pa.array([True, None, False]),
            "s": pa.array(["tab\there", None, "quote ' \" \\ ünï"]),
            "v": pa.array(["short", None, ""]),
            "by": pa.array([b"\x00\xff", None, b""], pa.binary()),
            "dt": pa.array([dt.date(2024, 2, 29), None, dt.date(1, 1, 1)], pa.date32()),
            "ts": pa.array(
                [dt.datetime(2024, 1, 2, 3, 4, 5, 6), None, dt.datetime(1969, 12, 31, 23, 59)], pa.timestamp("us")
            ),
            "tz": pa.array(
                [dt.datetime(2024, 1, 2, 3, 4, 5, 6, tzinfo=utc), None, dt.datetime(1900, 1, 1, tzinfo=utc)],
                pa.timestamp("us", tz="UTC"),
            ),
        }
    )
    try:
        write_direct(pg_url, f"{table}_a", [data], keys="")
        write_direct(pg_url, table, [data])
        merged = sql(pg_url, f"SELECT t::text FROM {table} t ORDER BY id")
        assert merged == sql(pg_url, f"SELECT t::text FROM {table}_a t ORDER BY id")  # text: NaN = NaN here
        assert len(merged) == 3 and "ünï" in merged[2][0]
    finally:
        sql(pg_url, f"DROP TABLE IF EXISTS {table}_a")


# --------------------------------------------------------------------------- pre-flight: the key must be unique


@pytest.mark.parametrize(
    ("ddl", "keys", "message"),
    [
        pytest.param("id int, name text", "id", r"it has none", id="no-key-at-all"),
        pytest.param(
            "id int, name text, UNIQUE (id, name)", "id", r"it has UNIQUE \(id, name\)", id="wider-unique-constraint"
        ),
        pytest.param("id int PRIMARY KEY, name text", "name", r"PRIMARY KEY \(id\)", id="other-column"),
    ],
)
def test_keys_without_a_unique_index_are_refused_before_any_branch(
    pg_url: str, table: str, ddl: str, keys: str, message: str
) -> None:
    sql(pg_url, f"CREATE TABLE {table} ({ddl})")
    with pytest.raises(PreflightError) as info:
        write_direct(pg_url, table, [batch([1], ["a"])], keys=keys)
    text = str(info.value)
    assert "upsertKeyColumns" in text and "unique" in text.lower() and "CREATE UNIQUE INDEX" in text, text
    assert re.search(message, text), text
    assert rows(pg_url, table) == []


def test_a_partial_unique_index_is_not_a_key(pg_url: str, table: str) -> None:
    sql(pg_url, f"CREATE TABLE {table} (id int, name text)")
    sql(pg_url, f"CREATE UNIQUE INDEX ON {table} (id) WHERE name IS NOT NULL")
    with pytest.raises(PreflightError, match="upsertKeyColumns"):
        write_direct(pg_url, table, [batch([1], ["a"])])


def test_a_unique_index_in_another_column_order_is_a_key(pg_url: str, table: str) -> None:
    sql(pg_url, f"CREATE TABLE {table} (id int, name text, n int)")
    sql(pg_url, f"CREATE UNIQUE INDEX ON {table} (name, id)")
    sql(pg_url, f"INSERT INTO {table} VALUES (1, 'a', 0)")
    data = pa.RecordBatch.from_arrays(
        [pa.array([1, 1], pa.int32()), pa.array(["a", "b"]), pa.array([5, 6], pa.int32())], names=["id", "name", "n"]
    )
    write_direct(pg_url, table, [data], keys="id,name")
    assert rows(pg_url, table) == [(1, "a", 5), (1, "b", 6)]


# --------------------------------------------------------------------------- through Spark


def spark_error_text(exc: BaseException) -> str:
    parts = [str(exc), str(getattr(exc, "_desc", "") or "")]
    return "\n".join(parts)


@pytest.mark.parametrize("path", ["api", "format"])
def test_spark_upsert_updates_inserts_and_replays_nothing(
    spark: SparkSession, pg_url: str, keyed: str, path: str
) -> None:
    sink = new_sink()
    df = frame(spark, range(5, 25), 4, "new")
    if path == "api":
        result = xasink.write(df, pg_url, keyed, sink_id=sink, batch_id=1, upsertKeyColumns="id")
        assert (result.rows, result.skipped) == (20, False)
        again = xasink.write(
            frame(spark, range(40), 4, "replay"), pg_url, keyed, sink_id=sink, batch_id=1, upsertKeyColumns="id"
        )
        assert again.skipped
    else:
        writer = (
            df.write.format("xasink")
            .option("url", pg_url)
            .option("dbtable", keyed)
            .option("sinkId", sink)
            .option("batchId", 1)
            .option("upsertKeyColumns", "id")
            .mode("append")
        )
        writer.save()
        writer.save()  # the same batch again: nothing new
    assert rows(pg_url, keyed) == OLD[:5] + [(i, f"new{i}") for i in range(5, 25)]
    assert ours(pg_url) == []


def test_spark_failure_in_one_partition_leaves_the_table_exactly_as_before(
    spark: SparkSession, pg_url: str, keyed: str
) -> None:
    def poisoned(value: int) -> int:  # the last row of the last partition: the others have merged by then
        if value == 39:
            raise ValueError("boom: row 39 is poisoned")
        return value

    df = frame(spark, range(40), 4, "new").withColumn("id", F.udf(poisoned, IntegerType())("id"))
    with pytest.raises(XasinkError, match="boom: row 39"):
        xasink.write(df, pg_url, keyed, upsertKeyColumns="id")
    assert rows(pg_url, keyed) == OLD
    assert ours(pg_url) == []


def test_spark_format_path_with_equal_keys_in_two_partitions_fails_clearly(
    spark: SparkSession, pg_url: str, keyed: str
) -> None:
    """df.write.format() cannot repartition for the user: the lock wait on the other branch becomes a clear error."""
    df = spark.range(0, 8, 1, 2).selectExpr("cast(id % 4 as int) as id", "concat('dup', id) as name")
    writer = (
        df.write.format("xasink")
        .option("url", pg_url)
        .option("dbtable", keyed)
        .option("upsertKeyColumns", "id")
        .option("lockTimeout", 1)
        .mode("append")
    )
    with pytest.raises(Exception) as info:  # noqa: B017,PT011 - Spark picks the wrapper class
        writer.save()
    text = spark_error_text(info.value)
    assert "xasink.errors.BranchError" in text and "repartition" in text, text[:3000]
    assert rows(pg_url, keyed) == OLD
    assert ours(pg_url) == []


def test_spark_api_repartitions_by_the_key_itself(spark: SparkSession, pg_url: str, keyed: str) -> None:
    """The same DataFrame through xasink.write: equal keys land in one partition, one row per key survives."""
    df = spark.range(0, 8, 1, 2).selectExpr("cast(id % 4 as int) as id", "concat('dup', id % 4) as name")
    result = xasink.write(df, pg_url, keyed, upsertKeyColumns="id", lockTimeout=5)
    assert result.rows == 8
    assert rows(pg_url, keyed) == [(i, f"dup{i}") for i in range(4)] + OLD[4:]
    assert ours(pg_url) == []


def test_a_reader_sees_no_partial_merge_while_the_branch_is_prepared(pg_url: str, keyed: str) -> None:
    """Between PREPARE and the decision, a reader sees the table as before (read committed)."""
    options = parse_options({"url": pg_url, "dbtable": keyed, "sinkId": new_sink(), "upsertKeyColumns": "id"})
    coordinator = Coordinator(options)
    try:
        coordinator.preflight(1)
        with coordinator.dialect.connect() as conn:
            plan = plan_target(coordinator.dialect, conn, options, batch([1], ["a"]).schema)
        outcome = write_partition(
            options,
            plan,
            batch_id=0,
            partition=0,
            task_attempt_id=0,
            run=new_run_nonce(),
            batches=[batch([1, 99], ["x", "y"])],
        )
        assert rows(pg_url, keyed) == OLD  # prepared, not visible
        coordinator.commit(0, [outcome])
    finally:
        coordinator.close()
    assert rows(pg_url, keyed) == [(0, "old0"), (1, "x")] + OLD[2:] + [(99, "y")]
    with pytest.raises(psycopg2.Error):  # and the branch is really gone
        sql(pg_url, f"COMMIT PREPARED '{outcome.gid}'")


# --------------------------------------------------------------------------- MariaDB (ON DUPLICATE KEY UPDATE)


@pytest.fixture
def my_keyed(mariadb_url: str, fresh_table_name: str) -> Iterator[str]:
    """The same keyed table on MariaDB; afterwards no branch of the test's sinks may be left prepared."""
    with mariadb_connect(mariadb_url) as conn, conn.cursor() as cur:
        cur.execute(f"CREATE TABLE `{fresh_table_name}` (id INT PRIMARY KEY, name VARCHAR(40)) ENGINE=InnoDB")
        cur.executemany(f"INSERT INTO `{fresh_table_name}` VALUES (%s, %s)", OLD)
    yield fresh_table_name
    left = mariadb_prepared_gids(mariadb_url, sink_ids=mariadb_sink_ids(mariadb_url))
    with mariadb_connect(mariadb_url) as conn, conn.cursor() as cur:
        cur.execute(f"DROP TABLE IF EXISTS `{fresh_table_name}`")
    assert left == [], f"XA branches left prepared: {left}"


def my_rows(url: str, table: str) -> list[tuple[Any, ...]]:
    return [tuple(r) for r in mariadb_rows(url, table)]


def my_statements(url: str, *statements: str) -> None:
    """Run ``statements`` on MariaDB (a test's own table, made or dropped with the plain driver)."""
    with mariadb_connect(url) as conn, conn.cursor() as cur:
        for statement in statements:
            cur.execute(statement)


def test_mariadb_upsert_updates_inserts_and_replays_nothing(mariadb_url: str, my_keyed: str) -> None:
    sink = new_sink()
    parts = [batch([5, 6, 7], ["n5", "n6", "n7"]), batch([8, 12, 11], ["n8", "n12", "n11"])]
    result = write_direct(mariadb_url, my_keyed, parts, sink=sink, batch_id=3)
    assert (result.rows, result.branches, result.skipped) == (6, 2, False)
    expected = OLD[:5] + [(5, "n5"), (6, "n6"), (7, "n7"), (8, "n8"), (9, "old9"), (11, "n11"), (12, "n12")]
    assert my_rows(mariadb_url, my_keyed) == expected
    replay = write_direct(mariadb_url, my_keyed, [batch([1, 5, 30], ["r", "r", "r"])], sink=sink, batch_id=3)
    assert replay.skipped
    assert my_rows(mariadb_url, my_keyed) == expected


def test_mariadb_duplicate_keys_in_one_partition_last_row_wins(mariadb_url: str, my_keyed: str) -> None:
    write_direct(mariadb_url, my_keyed, [[batch([3, 30, 3], ["a", "x", "b"]), batch([30, 3], ["z", "c"])]])
    got = dict(my_rows(mariadb_url, my_keyed))
    assert (got[3], got[30], len(got)) == ("c", "z", 11)


def test_mariadb_failure_in_one_partition_leaves_the_table_exactly_as_before(
    mariadb_url: str, my_keyed: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XASINK_FAULT", "task.before_prepare:raise:p=1")
    with pytest.raises(InjectedFault):
        write_direct(mariadb_url, my_keyed, [batch([0, 1, 100], ["x", "x", "x"]), batch([2, 101], ["x", "x"])])
    assert my_rows(mariadb_url, my_keyed) == OLD


def test_mariadb_equal_keys_in_two_partitions_fail_clearly(mariadb_url: str, my_keyed: str) -> None:
    with pytest.raises(BranchError) as info:
        write_direct(mariadb_url, my_keyed, [batch([5, 50], ["p0", "p0"]), batch([51, 5], ["p1", "p1"])], lockTimeout=1)
    assert "partition 1" in str(info.value) and "repartition the dataframe" in str(info.value).lower(), str(info.value)
    assert my_rows(mariadb_url, my_keyed) == OLD


def test_mariadb_keys_without_a_unique_index_are_refused(mariadb_url: str, fresh_table_name: str) -> None:
    with mariadb_connect(mariadb_url) as conn, conn.cursor() as cur:
        cur.execute(f"CREATE TABLE `{fresh_table_name}` (id INT, name VARCHAR(40), UNIQUE KEY (id, name))")
    try:
        with pytest.raises(PreflightError, match=r"upsertKeyColumns.*UNIQUE.*\(id, name\)"):
            write_direct(mariadb_url, fresh_table_name, [batch([1], ["a"])])
        assert my_rows(mariadb_url, fresh_table_name) == []
    finally:
        with mariadb_connect(mariadb_url) as conn, conn.cursor() as cur:
            cur.execute(f"DROP TABLE IF EXISTS `{fresh_table_name}`")


def my_plan(url: str, table: str, source: pa.Schema | None = None) -> Any:
    """The plan the driver makes for an upsert on ``id`` of ``source`` rows (default: id, name) into ``table``."""
    options = parse_options({"url": url, "dbtable": table, "upsertKeyColumns": "id"})
    coordinator = Coordinator(options)
    try:
        with coordinator.dialect.connect() as conn:
            return plan_target(coordinator.dialect, conn, options, source or batch([1], ["a"]).schema)
    finally:
        coordinator.close()


# (extra DDL inside CREATE TABLE, statements after it, REPLACE expected): REPLACE only where it equals the merge
_MERGE_SHAPES = {
    "only-primary-key": ("", [], True),
    "second-unique-key": (", UNIQUE KEY (name)", [], False),
    "column-not-written": (", note VARCHAR(8) DEFAULT 'default'", ["UPDATE `{t}` SET note = 'kept'"], False),
    "delete-trigger": (
        "",
        [
            "CREATE TABLE `{t}_log` (what VARCHAR(8)) ENGINE=InnoDB",
            "CREATE TRIGGER `{t}_del` AFTER DELETE ON `{t}` FOR EACH ROW INSERT INTO `{t}_log` VALUES ('deleted')",
        ],
        False,
    ),
    "referenced-by-cascade": (
        "",
        [
            "CREATE TABLE `{t}_child` (pid INT, FOREIGN KEY (pid) REFERENCES `{t}` (id) ON DELETE CASCADE) "
            "ENGINE=InnoDB",
            "INSERT INTO `{t}_child` VALUES (5), (6)",
        ],
        False,
    ),
}


@pytest.mark.parametrize("shape", list(_MERGE_SHAPES))
def test_mariadb_upsert_loads_by_replace_only_where_that_equals_the_merge(
    mariadb_url: str, fresh_table_name: str, shape: str
) -> None:
    """LOAD DATA REPLACE is the fast merge, but deletes where ON DUPLICATE KEY UPDATE updates once the table has
    another unique key, a DELETE trigger or a referencing foreign key, and resets columns it does not load:
    there the staging table is used, and each table ends exactly as the merge leaves it."""
    t = fresh_table_name
    extra, after, replace = _MERGE_SHAPES[shape]
    with mariadb_connect(mariadb_url) as conn, conn.cursor() as cur:
        cur.execute(f"CREATE TABLE `{t}` (id INT PRIMARY KEY, name VARCHAR(40){extra}) ENGINE=InnoDB")
        cur.executemany(f"INSERT INTO `{t}` (id, name) VALUES (%s, %s)", OLD)
        for statement in after:
            cur.execute(statement.format(t=t))
    try:
        assert my_plan(mariadb_url, t).upsert_by_replace is replace
        write_direct(mariadb_url, t, [batch([5, 6], ["n5", "n6"]), batch([7, 12], ["n7", "n12"])])
        got = my_rows(mariadb_url, t)
        expected = OLD[:5] + [(5, "n5"), (6, "n6"), (7, "n7"), (8, "old8"), (9, "old9"), (12, "n12")]
        if shape == "column-not-written":  # updated rows keep the column, the new one takes its default
            assert got == [(*row, "default" if row[0] == 12 else "kept") for row in expected]
        else:
            assert got == expected
        if shape == "delete-trigger":
            assert my_rows(mariadb_url, f"{t}_log") == []
        if shape == "referenced-by-cascade":
            assert my_rows(mariadb_url, f"{t}_child") == [(5,), (6,)]
    finally:
        with mariadb_connect(mariadb_url) as conn, conn.cursor() as cur:
            for name in (f"{t}_child", f"{t}_log", t):
                cur.execute(f"DROP TABLE IF EXISTS `{name}`")


def test_mariadb_replace_upsert_refuses_a_value_that_does_not_fit(mariadb_url: str, my_keyed: str) -> None:
    assert my_plan(mariadb_url, my_keyed).upsert_by_replace
    with pytest.raises(BranchError, match=r"partition 1 could not be written.*name") as info:
        write_direct(mariadb_url, my_keyed, [batch([1, 20], ["ok", "ok"]), batch([2, 21], ["x" * 41, "ok"])])
    assert "nothing of this batch is visible" in str(info.value)
    assert my_rows(mariadb_url, my_keyed) == OLD


@pytest.mark.parametrize(
    ("local_infile", "unwritten_column"),
    [(True, False), (True, True), (False, False)],
    ids=["load-data-replace", "load-data-staging", "multi-row-insert"],
)
def test_mariadb_every_supported_type_merges_as_append_loads_it(
    mariadb_url: str, fresh_table_name: str, local_infile: bool, unwritten_column: bool
) -> None:
    """Every MariaDB upsert path (LOAD DATA REPLACE, LOAD DATA into a staging table, multi-row INSERT) stores
    what append stores.  A column the DataFrame does not write sends LOAD DATA to the staging table.

    The target already holds every key with other values, so each row goes through the merge.
    """
    table, appended = fresh_table_name, f"{fresh_table_name}_a"
    ddl = (
        "id BIGINT PRIMARY KEY, i2 SMALLINT, i4 INT, f4 FLOAT, f8 DOUBLE, d DECIMAL(12,2), b BOOLEAN, "
        "s TEXT, v VARCHAR(8), `by` VARBINARY(16), dt DATE, ts DATETIME(6), tz DATETIME(6)"
    ) + (", note VARCHAR(8) DEFAULT 'kept'" if unwritten_column else "")
    utc = dt.timezone.utc
    data = pa.RecordBatch.from_pydict(
        {
            "id": pa.array([1, 2, 3], pa.int64()),
            "i2": pa.array([-32768, None, 7], pa.int16()),
            "i4": pa.array([2**31 - 1, None, 0], pa.int32()),
            "f4": pa.array([1.5, None, -3.25], pa.float32()),
            "f8": pa.array([-0.1, None, 1e300], pa.float64()),
            "d": pa.array([decimal.Decimal("1.25"), None, decimal.Decimal("-9999999999.99")], pa.decimal128(12, 2)),
            "b": pa.array([True, None, False]),
            "s": pa.array(["tab\there\nnew line", None, "quote ' \" \\ ünï \\N"]),
            "v": pa.array(["short", None, ""]),
            "by": pa.array([b"\x00\xff\t\n\\", None, b""], pa.binary()),
            "dt": pa.array([dt.date(2024, 2, 29), None, dt.date(1000, 1, 1)], pa.date32()),
            "ts": pa.array([dt.datetime(2024, 1, 2, 3, 4, 5, 6), None, dt.datetime(1970, 1, 2)], pa.timestamp("us")),
            "tz": pa.array(
                [dt.datetime(2024, 1, 2, 3, 4, 5, 6, tzinfo=utc), None, dt.datetime(1900, 1, 1, tzinfo=utc)],
                pa.timestamp("us", tz="UTC"),
            ),
        }
    )
    with mariadb_connect(mariadb_url) as conn, conn.cursor() as cur:
        for name in (table, appended):
            cur.execute(f"CREATE TABLE `{name}` ({ddl}) ENGINE=InnoDB")
        cur.executemany(f"INSERT INTO `{table}` (id, s) VALUES (%s, 'seeded')", [(1,), (2,), (3,)])
    try:
        write_direct(mariadb_url, appended, [data], keys="")
        write_direct(mariadb_url, table, [data], localInfile=str(local_infile).lower())
        if local_infile:
            assert my_plan(mariadb_url, table, data.schema).upsert_by_replace is not unwritten_column
        merged = my_rows(mariadb_url, table)
        assert merged == my_rows(mariadb_url, appended)
        assert len(merged) == 3 and merged[2][7] == "quote ' \" \\ ünï \\N" and merged[0][9] == b"\x00\xff\t\n\\"
    finally:
        with mariadb_connect(mariadb_url) as conn, conn.cursor() as cur:
            for name in (table, appended):
                cur.execute(f"DROP TABLE IF EXISTS `{name}`")


# --------------------------------------------------------------------------- only the key's rows (both databases)

# MariaDB loads an upsert by LOAD DATA (localInfile, the default) or by multi-row INSERT: both paths, and the
# same case on PostgreSQL (ON CONFLICT on the key) for parity
_KEY_ONLY_CASES = [case(POSTGRESQL, "default"), case(MARIADB, "true"), case(MARIADB, "false")]


def other_key_conflict(db: Target, table: str, parts: list[pa.RecordBatch], infile: str, keys: str = "id") -> str:
    """Write ``parts`` as an upsert that must fail on a unique index other than the key's: the error's text."""
    extra: dict[str, Any] = {} if db.kind == POSTGRESQL else {"localInfile": infile}
    with pytest.raises(BranchError) as info:
        write_direct(db.url, table, parts, keys=keys, **extra)
    return str(info.value)


def users(names: Sequence[tuple[int, str, str]]) -> pa.RecordBatch:
    ids, emails, people = zip(*names, strict=True)
    return pa.RecordBatch.from_arrays(
        [pa.array(ids, pa.int32()), pa.array(emails), pa.array(people)], names=["id", "email", "name"]
    )


@pytest.mark.parametrize(("db", "infile"), _KEY_ONLY_CASES, indirect=["db"])
def test_an_upsert_never_overwrites_the_row_of_another_key(db: Target, infile: str) -> None:
    """(2, 'alice@x') upserted on id collides with id 1's email: the batch fails naming the index, as PostgreSQL
    does, instead of ON DUPLICATE KEY UPDATE renaming Alice (or REPLACE deleting her); nothing is written."""
    t = db.new_table()
    db.create_table(t, "id int PRIMARY KEY, email varchar(40) NOT NULL, name varchar(40)")
    db.execute(f"CREATE UNIQUE INDEX {t}_email ON {db.q(t)} (email)")
    db.execute(f"INSERT INTO {db.q(t)} VALUES (1, 'alice@x', 'Alice'), (3, 'carol@x', 'Carol')")
    before = db.rows(t)
    fine = users([(3, "carol@x", "Carol 2"), (4, "dave@x", "Dave")])  # a partition that merges cleanly
    text = other_key_conflict(db, t, [fine, users([(2, "alice@x", "Bob")])], infile)
    assert f"{t}_email" in text, text  # the index that conflicts
    assert "partition 1" in text and "nothing of this batch is visible" in text, text
    assert db.rows(t) == before


@pytest.mark.parametrize(("db", "infile"), _KEY_ONLY_CASES, indirect=["db"])
def test_an_upsert_with_another_unique_index_updates_and_inserts_by_the_key(db: Target, infile: str) -> None:
    """No conflict on the other index: rows whose id matches are updated (email too), new ids inserted, and the
    partition's last row of a key wins."""
    t = db.new_table()
    db.create_table(t, "id int PRIMARY KEY, email varchar(40) NOT NULL, name varchar(40)")
    db.execute(f"CREATE UNIQUE INDEX {t}_email ON {db.q(t)} (email)")
    db.execute(f"INSERT INTO {db.q(t)} VALUES (1, 'alice@x', 'Alice'), (3, 'carol@x', 'Carol')")
    extra: dict[str, Any] = {} if db.kind == POSTGRESQL else {"localInfile": infile}
    parts = [
        [users([(1, "alice@y", "Alice 2"), (4, "dave@x", "Dave")]), users([(1, "alice@z", "Alice 3")])],
        users([(5, "eve@x", "Eve"), (3, "carol@x", "Carol 2")]),
    ]
    merged = [(1, "alice@z", "Alice 3"), (3, "carol@x", "Carol 2"), (4, "dave@x", "Dave"), (5, "eve@x", "Eve")]
    result = write_direct(db.url, t, parts, **extra)
    assert result.rows == 5
    assert db.rows(t) == merged
    # the same rows again (another batch): the merge changes nothing, and the batch still commits
    again = write_direct(db.url, t, [users(merged[:2]), users(merged[2:])], **extra)
    assert (again.rows, again.skipped) == (4, False)
    assert db.rows(t) == merged


@pytest.mark.parametrize(("db", "infile"), _KEY_ONLY_CASES, indirect=["db"])
def test_an_upsert_that_changes_no_row_still_commits(db: Target, infile: str) -> None:
    """Every row already in the table as it is (a rerun under a new batch id): nothing changes, and the batch
    commits.  MariaDB counts such a branch as read-only in this table's shape (no primary key, two unique
    keys) unless something was written, and XA COMMIT then answers XA_RBROLLBACK."""
    t = db.new_table()
    db.create_table(t, "code varchar(20) NOT NULL UNIQUE, email varchar(40) NOT NULL UNIQUE")
    db.execute(f"INSERT INTO {db.q(t)} VALUES ('a', 'a@x'), ('b', 'b@x')")
    extra: dict[str, Any] = {} if db.kind == POSTGRESQL else {"localInfile": infile}
    same = pa.RecordBatch.from_arrays([pa.array(["a", "b"]), pa.array(["a@x", "b@x"])], ["code", "email"])
    result = write_direct(db.url, t, [same], keys="code", **extra)
    assert (result.rows, result.skipped) == (2, False)
    assert db.rows(t) == [("a", "a@x"), ("b", "b@x")]


@pytest.mark.parametrize(("db", "infile"), _KEY_ONLY_CASES, indirect=["db"])
def test_an_upsert_whose_update_collides_on_another_index_fails(db: Target, infile: str) -> None:
    """Updating id 3's email to Alice's: a conflict on another index while updating fails the batch too."""
    t = db.new_table()
    db.create_table(t, "id int PRIMARY KEY, email varchar(40) NOT NULL, name varchar(40)")
    db.execute(f"CREATE UNIQUE INDEX {t}_email ON {db.q(t)} (email)")
    db.execute(f"INSERT INTO {db.q(t)} VALUES (1, 'alice@x', 'Alice'), (3, 'carol@x', 'Carol')")
    before = db.rows(t)
    text = other_key_conflict(db, t, [users([(3, "alice@x", "Carol?"), (7, "g@x", "G")])], infile)
    assert f"{t}_email" in text, text
    assert db.rows(t) == before


@pytest.mark.parametrize(("db", "infile"), _KEY_ONLY_CASES, indirect=["db"])
def test_a_prefix_unique_index_never_merges_two_keys(db: Target, infile: str) -> None:
    """MariaDB's UNIQUE (code(4)) holds one code per 4-character prefix: 'ABCD-002' is another key than
    'ABCD-001', so it conflicts (the batch fails naming the index) instead of REPLACE deleting 'ABCD-001' or
    ON DUPLICATE KEY UPDATE overwriting it.  PostgreSQL's equivalent: a unique index on left(code, 4)."""
    t = db.new_table()
    if db.kind == POSTGRESQL:
        db.create_table(t, "code varchar(20) PRIMARY KEY, name varchar(40)")
        db.execute(f"CREATE UNIQUE INDEX {t}_code4 ON {db.q(t)} (left(code, 4))")
    else:
        db.create_table(t, f"code varchar(20) NOT NULL, name varchar(40), UNIQUE KEY {t}_code4 (code(4))")
    db.execute(f"INSERT INTO {db.q(t)} VALUES ('ABCD-001', 'first'), ('WXYZ-001', 'w')")
    before = db.rows(t)
    codes = pa.RecordBatch.from_arrays(
        [pa.array(["WXYZ-001", "ABCD-002"]), pa.array(["w2", "second"])], ["code", "name"]
    )
    text = other_key_conflict(db, t, [codes], infile, keys="code")
    assert f"{t}_code4" in text, text
    assert db.rows(t) == before
    same = pa.RecordBatch.from_arrays([pa.array(["ABCD-001", "EFGH-001"]), pa.array(["again", "e"])], ["code", "name"])
    extra: dict[str, Any] = {} if db.kind == POSTGRESQL else {"localInfile": infile}
    write_direct(db.url, t, [same], keys="code", **extra)
    assert db.rows(t) == [("ABCD-001", "again"), ("EFGH-001", "e"), ("WXYZ-001", "w")]


@pytest.mark.mariadb
@pytest.mark.parametrize("infile", ["true", "false"])
def test_mariadb_a_case_insensitive_key_matches_as_its_unique_index_does(
    mariadb_url: str, fresh_table_name: str, infile: str
) -> None:
    """Under a case-insensitive collation the key's unique index holds one of 'ABC' and 'abc': 'abc' matches the
    row 'ABC' (as ON CONFLICT matches by the arbiter index's equality), updates its other columns and keeps the
    stored key as it is, on every load path (REPLACE would rewrite the key to 'abc')."""
    t = fresh_table_name
    my_statements(
        mariadb_url,
        f"CREATE TABLE `{t}` (code VARCHAR(20) COLLATE utf8mb4_general_ci PRIMARY KEY, name VARCHAR(40)) ENGINE=InnoDB",
        f"INSERT INTO `{t}` VALUES ('ABC', 'old'), ('x', 'x')",
    )
    try:
        codes = pa.RecordBatch.from_arrays([pa.array(["abc", "Y"]), pa.array(["new", "Y"])], ["code", "name"])
        write_direct(mariadb_url, t, [codes], keys="code", localInfile=infile)
        assert my_rows(mariadb_url, t) == [("ABC", "new"), ("x", "x"), ("Y", "Y")]
    finally:
        my_statements(mariadb_url, f"DROP TABLE IF EXISTS `{t}`")


@pytest.mark.mariadb
@pytest.mark.parametrize("infile", ["true", "false"])
def test_mariadb_keyed_merges_of_two_live_branches_never_wait_for_each_other(
    mariadb_url: str, fresh_table_name: str, infile: str
) -> None:
    """Two partitions merging at once, both inserting new ids past the table's end: the merge's lookups by the
    key must take no gap locks (READ COMMITTED), or the second waits for the first until lockTimeout."""
    t = fresh_table_name
    my_statements(
        mariadb_url,
        f"CREATE TABLE `{t}` (id INT PRIMARY KEY, email VARCHAR(40) NOT NULL UNIQUE, name VARCHAR(40)) ENGINE=InnoDB",
        f"INSERT INTO `{t}` VALUES (1, 'a@x', 'A'), (2, 'b@x', 'B'), (3, 'c@x', 'C')",
    )
    raw = {"url": mariadb_url, "dbtable": t, "upsertKeyColumns": "id", "lockTimeout": 2, "localInfile": infile}
    options = parse_options(raw)
    coordinator = Coordinator(options)
    run, log_id = new_run_nonce(), uuid.uuid4().hex[:10]
    opened = []
    try:
        with coordinator.dialect.connect() as conn:
            plan = plan_target(coordinator.dialect, conn, options, users([(1, "a", "a")]).schema)
        assert plan.upsert_by_update
        for number, part in enumerate([[(1, "a@y", "A2"), (10, "j@x", "J")], [(11, "k@x", "K"), (2, "b@y", "B2")]]):
            branch = coordinator.dialect.open_branch(Xid(log_id, "gaps", 0, number, f"{number}-{run}"), plan)
            opened.append(branch)
            assert branch.load(iter([users(part)])) == 2
    finally:
        for branch in opened:
            branch.rollback()
        coordinator.close()
        rest = my_rows(mariadb_url, t)
        my_statements(mariadb_url, f"DROP TABLE IF EXISTS `{t}`")
    assert rest == [(1, "a@x", "A"), (2, "b@x", "B"), (3, "c@x", "C")]


@pytest.mark.parametrize(("db", "infile"), _KEY_ONLY_CASES, indirect=["db"])
def test_equal_keys_in_two_partitions_still_fail_clearly_beside_another_unique_index(db: Target, infile: str) -> None:
    """The key-only merge waits on the other partition's prepared key like ON CONFLICT / ON DUPLICATE KEY UPDATE
    do, and the error still says to repartition by the key."""
    t = db.new_table()
    db.create_table(t, "id int PRIMARY KEY, email varchar(40) NOT NULL, name varchar(40)")
    db.execute(f"CREATE UNIQUE INDEX {t}_email ON {db.q(t)} (email)")
    db.execute(f"INSERT INTO {db.q(t)} VALUES (1, 'alice@x', 'Alice')")
    extra: dict[str, Any] = {} if db.kind == POSTGRESQL else {"localInfile": infile}
    for shared in (1, 9):  # a key in the table (updated by both) and a new one (inserted by both)
        parts = [
            users([(shared, "p0@x", "p0"), (20, "q0@x", "q0")]),
            users([(21, "q1@x", "q1"), (shared, "p1@x", "p1")]),
        ]
        with pytest.raises(BranchError) as info:
            write_direct(db.url, t, parts, lockTimeout=1, **extra)
        assert "partition 1" in str(info.value) and "repartition" in str(info.value).lower(), str(info.value)
        assert db.rows(t) == [(1, "alice@x", "Alice")]


@pytest.mark.parametrize(("db", "infile"), _KEY_ONLY_CASES, indirect=["db"])
def test_an_upsert_into_a_table_with_percent_signs_in_its_names(db: Target, infile: str) -> None:
    """'%' in the table's name and its columns' (the key's included) reaches the server as written: the branch's
    statements are run as they are (PostgreSQL: by ADBC, which formats nothing), never doubled for a driver."""
    t = db.new_table() + "%s %(x)s %%"
    key, name = "id%s", "na%(me)s"
    db.create_table(t, f"{db.q(key)} int PRIMARY KEY, {db.q(name)} varchar(20)")
    db.execute(f"INSERT INTO {db.q(t)} VALUES (1, 'a'), (2, 'b')")
    extra: dict[str, Any] = {} if db.kind == POSTGRESQL else {"localInfile": infile}
    part = pa.RecordBatch.from_arrays([pa.array([1, 5], pa.int32()), pa.array(["a2", "e"])], names=[key, name])
    result = write_direct(db.url, db.q(t), [part], keys=key, **extra)
    assert result.rows == 2
    assert db.rows(t) == [(1, "a2"), (2, "b"), (5, "e")]


@pytest.mark.parametrize("keys", ["", "id`"])
def test_a_backtick_in_a_column_name(db: Target, keys: str) -> None:
    """A column named with a backtick is written as any other, on both databases (MariaDB: SQLAlchemy's reflection
    returns such a name as SHOW CREATE TABLE escapes it, ``id``` for id`, which the dialect undoes)."""
    t = db.new_table()
    db.create_table(t, f"{db.q('id`')} int PRIMARY KEY, {db.q('na`me')} varchar(20)")
    db.execute(f"INSERT INTO {db.q(t)} VALUES (1, 'a')")
    ids = [1, 5] if keys else [5, 6]
    part = pa.RecordBatch.from_arrays([pa.array(ids, pa.int32()), pa.array(["x", "e"])], names=["id`", "na`me"])
    write_direct(db.url, t, [part], keys=keys)
    assert db.rows(t) == ([(1, "x"), (5, "e")] if keys else [(1, "a"), (5, "x"), (6, "e")])
