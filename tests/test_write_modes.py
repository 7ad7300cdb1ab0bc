"""Write modes (issue 18) against their contract, on PostgreSQL and MariaDB: exact row sets, atomicity, other sessions.

Overwrite (``mode("overwrite")``), ``replaceWhere``, change-data apply (``deleteFlagColumn`` /
``sequenceColumn``), through ``df.write.format("xasink")``, ``xasink.write``, ``xasink.foreach_batch`` and a
streaming query in complete output mode.
Some tests drive the batch without Spark (tests/modes_driver.py: the data source's own planning, one
``write_partition`` per branch, ``Coordinator.commit``) where they must hold the driver at a fault point
in this process (``XASINK_FAULT=...:sleep=S``) or run it beside another session.  Every check reads the
database with the plain driver.  The killed-driver tests are in test_write_modes_crash.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
import warnings
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from pyspark.sql import DataFrame, SparkSession

import xasink
import xasink.support.faults
from tests import doc_cases
from tests.cluster import wait_for
from tests.harness import (
    apply_lock_held,
    assert_settled,
    expected,
    failed_tasks,
    fill,
    held_at,
    log_table_locked,
    seen_while,
    shadow_rows,
    spark_jobs,
    storage_of,
)
from tests.modes_driver import OPTIONS_ENV, batch_direct, overwrite_direct, prepare_stray_branch, split
from tests.targets import MARIADB, POSTGRESQL, Target, case
from xasink.database_url import parse_url
from xasink.dialects import dialect_for
from xasink.errors import (
    ApplyError,
    BatchAbortedError,
    BatchBlockedError,
    CommitIncompleteError,
    OptionError,
    PreflightError,
)
from xasink.ops import survey as admin
from xasink.options import parse_options
from xasink.protocol.xid import Xid
from xasink.spark.versions import HAS_DATA_SOURCE
from xasink.support.faults import LOCAL_PROPERTY, InjectedFault
from xasink.write_modes.spec import shadow_name, tombstone_name


def sink() -> str:
    return f"wm-{uuid.uuid4().hex[:10]}"


def rows_frame(spark: SparkSession, rows: list[tuple[int, str]], partitions: int = 3) -> DataFrame:
    return spark.createDataFrame(rows, "id int, name string").repartition(partitions)


def overwrite(df: DataFrame, db: Target, table: str, sink_id: str, batch_id: int, **options: Any) -> None:
    w = (
        df.write.format("xasink")
        .option("url", db.url)
        .option("dbtable", table)
        .option("sinkId", sink_id)
        .option("batchId", batch_id)
    )
    for key, value in options.items():
        w = w.option(key, str(value))
    w.mode("overwrite").save()


@pytest.fixture
def reader_grantee(db: Target) -> Iterator[str]:
    """A role (PostgreSQL) or user (MariaDB) with no login, to be granted SELECT on a table; dropped afterwards."""
    with db.no_login_role("wm_r") as name:
        yield name


def table_extras(db: Target, table: str, grantee: str) -> tuple[Any, ...]:
    """The table's identity, its secondary index, comment and the grantee's SELECT: what an overwrite must keep."""
    if db.kind == POSTGRESQL:
        index = db.execute("SELECT indexname FROM pg_indexes WHERE tablename = %s AND indexname LIKE %s", table, "%_nm")
        comment = db.execute("SELECT obj_description(%s::regclass, 'pg_class')", db.q(table))
        grant = db.execute("SELECT has_table_privilege(%s, %s, 'SELECT')", grantee, db.q(table))
    else:
        index = db.execute(
            "SELECT DISTINCT INDEX_NAME FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = DATABASE() "
            "AND TABLE_NAME = %s AND INDEX_NAME LIKE %s",
            table,
            "%\\_nm",
        )
        comment = db.execute(
            "SELECT TABLE_COMMENT FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = %s",
            table,
        )
        grant = db.execute(
            "SELECT PRIVILEGE_TYPE FROM information_schema.TABLE_PRIVILEGES WHERE GRANTEE = %s "
            "AND TABLE_SCHEMA = DATABASE() AND TABLE_NAME = %s",
            f"'{grantee}'@'localhost'",
            table,
        )
    return storage_of(db, table), index, comment, grant


# --------------------------------------------------------------------------- overwrite


def test_overwrite_replaces_every_row_at_once_and_keeps_the_table(
    db: Target, spark: SparkSession, reader_grantee: str
) -> None:
    """Exactly the batch's rows afterwards; same index, comment, grant (the storage swapped: PostgreSQL by its
    catalog, MariaDB by RENAME TABLE); a replay writes nothing."""
    table = db.new_table()
    db.keyed_table(table)
    fill(db, table, expected(range(300), tag="o"))
    if db.kind == POSTGRESQL:
        db.execute(f"CREATE INDEX {db.q(table + '_nm')} ON {db.q(table)} (name)")
        db.execute(f"COMMENT ON TABLE {db.q(table)} IS 'kept by overwrite'")
        db.execute(f"GRANT SELECT ON {db.q(table)} TO {db.q(reader_grantee)}")
    else:
        db.execute(f"CREATE INDEX {db.q(table + '_nm')} ON {db.q(table)} (name(8))")
        db.execute(f"ALTER TABLE {db.q(table)} COMMENT = 'kept by overwrite'")
        db.execute(f"GRANT SELECT ON {db.q(table)} TO '{reader_grantee}'@'localhost'")
    before = table_extras(db, table, reader_grantee)
    assert before[1] and before[2] == [("kept by overwrite",)] and before[3] in ([(True,)], [("SELECT",)]), before
    s = sink()
    new = expected(range(200, 500))  # keys 200..299 kept, 0..199 gone, 300..499 new
    overwrite(rows_frame(spark, new), db, table, s, 7, truncate="true", cascadeTruncate="false")
    assert db.rows(table) == new
    after = table_extras(db, table, reader_grantee)
    assert after[1:] == before[1:]  # its index, comment and grant kept
    assert after[0] != before[0]  # swapped (tests/test_overwrite_swap.py, tests/test_overwrite_rename.py)
    assert db.decision(s, 7) is not None and db.decision(s, 7).state == "committed"  # type: ignore[union-attr]
    assert shadow_rows(db) == 0

    # a replay of the same (sinkId, batchId) writes nothing, even though the table changed since
    fill(db, table, [(9999, "later")])
    result = xasink.write(rows_frame(spark, new[:10]), db.url, table, sink_id=s, batch_id=7, mode="overwrite")
    assert result.skipped
    assert db.rows(table) == [*new, (9999, "later")]

    # cascadeTruncate=true is refused before anything runs
    with pytest.raises(OptionError, match="cascadeTruncate"):
        xasink.write(
            rows_frame(spark, new), db.url, table, sink_id=s, batch_id=8, mode="overwrite", cascadeTruncate="true"
        )
    assert db.rows(table) == [*new, (9999, "later")] and db.decision(s, 8) is None


@pytest.mark.parametrize(
    ("db", "cause"),
    # each failure costs Spark's task retries and the abort's settle window (4 s): one cause per database
    [case(POSTGRESQL, "fault"), case(MARIADB, "bad-data")],
    indirect=["db"],
)
def test_a_failing_partition_leaves_the_old_rows(db: Target, spark: SparkSession, cause: str) -> None:
    """One partition fails (an injected fault before PREPARE, or a value the column refuses): old rows stay exactly."""
    table = db.new_table()
    db.create_table(table, "id int PRIMARY KEY, name varchar(8)")
    old = expected(range(100), tag="o")
    fill(db, table, old)
    s = sink()
    new = expected(range(50, 350))
    rows = new if cause == "fault" else [*new[:-1], (349, "far-too-long-for-varchar-8")]
    df = spark.createDataFrame(rows, "id int, name string").coalesce(3)
    if cause == "fault":
        spark.sparkContext.setLocalProperty(LOCAL_PROPERTY, "task.before_prepare:raise:p=1")
    try:
        with pytest.raises(BatchAbortedError if cause == "fault" else Exception) as info:
            xasink.write(df, db.url, table, sink_id=s, batch_id=0, mode="overwrite")
    finally:
        spark.sparkContext.setLocalProperty(LOCAL_PROPERTY, None)  # type: ignore[arg-type]
    assert isinstance(info.value, xasink.errors.XasinkError), repr(info.value)
    assert db.rows(table) == old
    assert db.prepared(s) == []
    assert db.decision(s, 0) is None
    assert shadow_rows(db) == 0  # (a rerun of the batch, fixed, lands: test_a_batch_breaking_a_constraint_...)


def test_a_keyed_overwrite_of_mostly_the_same_keys_does_not_wait_on_itself(db: Target, spark: SparkSession) -> None:
    """Primary key, 1800 of 2000 keys kept and 200 new, 3 branches: no branch waits on another (no deadlock)."""
    table = db.new_table()
    db.keyed_table(table)
    fill(db, table, expected(range(2000), tag="o"))
    new = expected(range(200, 2200))
    # a branch waiting on a sibling waits until lockTimeout (the sibling holds its locks until the decision):
    # its task fails, and so would its retries; a deadlock's victim fails at once
    with spark_jobs(spark) as jobs:
        result = xasink.write(
            rows_frame(spark, new), db.url, table, sink_id=sink(), batch_id=0, mode="overwrite", lockTimeout=5
        )
    assert (result.rows, result.branches) == (2000, 3)
    assert db.rows(table) == new
    assert jobs and failed_tasks(spark, jobs) == 0, "a branch waited for another (lock timeout or deadlock)"


def test_an_empty_dataframe_empties_the_table(db: Target, spark: SparkSession) -> None:
    """An empty DataFrame (two empty partitions) empties the table; foreach_batch(mode="overwrite") refills it."""
    table = db.new_table()
    db.keyed_table(table)
    fill(db, table, expected(range(50), tag="o"))
    s = sink()
    overwrite(spark.createDataFrame([], "id int, name string").repartition(2), db, table, s, 0)
    assert db.rows(table) == []
    assert_settled(db, s)
    write = xasink.foreach_batch(db.url, table, s, mode="overwrite", truncate="yes")
    result = write(rows_frame(spark, expected(range(40, 60)), 2), 1)
    assert db.rows(table) == expected(range(40, 60)) and not result.skipped


def test_a_batch_breaking_a_constraint_leaves_the_old_rows(db: Target, spark: SparkSession) -> None:
    table = db.new_table()
    db.keyed_table(table)
    db.execute(f"INSERT INTO {db.q(table)} VALUES (1, 'old1'), (2, 'old2')")
    s = sink()
    dup = spark.createDataFrame([(7, "a"), (7, "b"), (8, "c")], "id int, name string").repartition(2)
    with pytest.raises(ApplyError, match="could not overwrite") as info:
        xasink.write(dup, db.url, table, sink_id=s, batch_id=0, mode="overwrite")
    said = str(info.value)
    assert "table keeps its old rows" in said
    # the key found twice is named, and the table's own index (not the internal one a swap builds on PostgreSQL)
    if db.kind == "postgresql":
        assert "(id)=(7)" in said and f'"{table}_pkey"' in said and "xasink_" not in said, said
    else:
        assert "Duplicate entry '7'" in said and "'PRIMARY'" in said and "xasink_" not in said, said
    assert db.rows(table) == [(1, "old1"), (2, "old2")]
    assert db.prepared(s) == []
    # this test database's shadows only: the MariaDB server is shared with other sessions' databases
    here = "current_schema()" if db.kind == "postgresql" else "DATABASE()"
    shadows = [
        r[0]
        for r in db.execute(
            f"SELECT table_name FROM information_schema.tables WHERE table_schema = {here} AND table_name LIKE %s",
            "xasink_sh_%",
        )
    ]
    assert shadows and all(db.execute(f"SELECT count(*) FROM {db.q(t)}") == [(0,)] for t in shadows)
    # the withdrawn batch is not a replay: fixed, it lands
    fixed = spark.createDataFrame([(7, "a"), (8, "c")], "id int, name string")
    xasink.write(fixed, db.url, table, sink_id=s, batch_id=0, mode="overwrite")
    assert db.rows(table) == [(7, "a"), (8, "c")]


def test_overwrite_of_a_table_other_tables_refer_to(db: Target, spark: SparkSession) -> None:
    """truncate=true is accepted and changes nothing: the rows are deleted, so a referenced table works too."""
    table, child = db.new_table(), db.new_table()
    db.keyed_table(table)
    db.execute(f"INSERT INTO {db.q(table)} VALUES (1, 'old1'), (2, 'old2')")
    s = sink()
    df = spark.createDataFrame([(2, "new2"), (3, "new3")], "id int, name string")
    xasink.write(df, db.url, table, sink_id=s, batch_id=0, mode="overwrite", truncate="true")
    assert db.rows(table) == [(2, "new2"), (3, "new3")]
    db.create_table(child, f"id int PRIMARY KEY, parent int REFERENCES {db.q(table)} (id)")
    df = spark.createDataFrame([(3, "newer3"), (4, "new4")], "id int, name string")
    xasink.write(df, db.url, table, sink_id=s, batch_id=1, mode="overwrite", truncate="true")
    assert db.rows(table) == [(3, "newer3"), (4, "new4")]
    db.drop_table(child)  # before its parent: MariaDB refuses to drop a referenced table


@pytest.mark.parametrize("action", ["CASCADE", "SET NULL", "NO ACTION"])
def test_an_overwrite_changes_no_other_table(db: Target, action: str) -> None:
    """Issue 27: a table another table refers to ``ON DELETE <action>``.  An overwrite with exactly the same
    keys leaves the referencing table as it was (it emptied it with CASCADE, nulled it with SET NULL, and
    failed with NO ACTION); one that drops keys changes the referencing rows of those keys only, exactly as
    the user's own DELETE of them would (NO ACTION: the overwrite fails, and nothing changes)."""
    parent, child = db.new_table(), db.new_table()
    db.keyed_table(parent)
    fill(db, parent, expected(range(200), tag="o"))
    db.create_table(child, f"id int PRIMARY KEY, parent int REFERENCES {db.q(parent)} (id) ON DELETE {action}")
    db.execute(f"INSERT INTO {db.q(child)} (id, parent) SELECT id + 1000, id FROM {db.q(parent)}")
    children = db.rows(child)
    assert len(children) == 200
    s = sink()
    try:
        overwrite_direct(db.url, parent, s, 0, split(0, 200, 3))  # the same keys, new names
        assert db.rows(parent) == expected(range(200))
        assert db.rows(child) == children
        moved = split(50, 200, 3)  # keys 0..49 are gone, 200..249 are new
        if action == "NO ACTION":
            with pytest.raises(ApplyError, match="foreign key|constraint"):
                overwrite_direct(db.url, parent, s, 1, moved)
            assert db.rows(parent) == expected(range(200))
            assert db.rows(child) == children
        else:
            overwrite_direct(db.url, parent, s, 1, moved)
            assert db.rows(parent) == expected(range(50, 250))
            if action == "CASCADE":
                assert db.rows(child) == [c for c in children if c[1] >= 50]
            else:
                assert db.rows(child) == [(c[0], None if c[1] < 50 else c[1]) for c in children]
        assert shadow_rows(db) == 0 and db.prepared(s) == []
    finally:
        db.drop_table(child)  # before its parent: MariaDB refuses to drop a referenced table


def test_replace_where_of_a_referenced_table_deletes_only_the_gone_keys_it_matches(db: Target) -> None:
    """replaceWhere on a table another refers to ``ON DELETE CASCADE``: replaced in place within the rows the
    condition matches; only the matching rows whose keys are gone are deleted (and their referencing rows)."""
    parent, child = db.new_table(), db.new_table()
    db.keyed_table(parent)
    old = [(i, f"a{i}") for i in range(10)] + [(i, f"b{i}") for i in range(10, 20)]
    fill(db, parent, old)
    db.create_table(child, f"id int PRIMARY KEY, parent int REFERENCES {db.q(parent)} (id) ON DELETE CASCADE")
    db.execute(f"INSERT INTO {db.q(child)} (id, parent) SELECT id + 100, id FROM {db.q(parent)}")
    children = db.rows(child)
    s = sink()
    try:
        batch = [expected(range(5, 10)), expected(range(20, 25))]
        overwrite_direct(db.url, parent, s, 0, batch, replaceWhere="name LIKE 'a%' OR name LIKE 'n%'")
        assert db.rows(parent) == expected(range(5, 10)) + old[10:] + expected(range(20, 25))
        assert db.rows(child) == [c for c in children if c[1] >= 5]
        assert shadow_rows(db) == 0 and db.prepared(s) == []
    finally:
        db.drop_table(child)


def test_an_overwrite_of_a_referenced_table_without_a_primary_key_is_refused(db: Target) -> None:
    """Rows of a table without a primary key cannot be replaced in place: refused before anything is written,
    naming the referencing table."""
    parent, child = db.new_table(), db.new_table()
    db.create_table(parent, "id int NOT NULL UNIQUE, name varchar(20)")
    fill(db, parent, expected(range(10), tag="o"))
    db.create_table(child, f"id int PRIMARY KEY, parent int REFERENCES {db.q(parent)} (id) ON DELETE CASCADE")
    db.execute(f"INSERT INTO {db.q(child)} (id, parent) SELECT id, id FROM {db.q(parent)}")
    s = sink()
    try:
        with pytest.raises(PreflightError, match=f"{child}.*primary key"):
            overwrite_direct(db.url, parent, s, 0, split(0, 10, 2))
        assert db.rows(parent) == expected(range(10), tag="o")
        assert db.rows(child) == [(i, i) for i in range(10)]
        assert db.decision(s, 0) is None and db.prepared(s) == []
    finally:
        db.drop_table(child)


@pytest.mark.parametrize("db", [case(MARIADB)], indirect=True)  # PostgreSQL reads its catalog: no such scan
def test_the_search_for_referencing_tables_outlasts_a_session_statement_timeout(db: Target) -> None:
    """MariaDB finds the tables that refer to an overwritten one by opening every table of the server: a CI
    run's overwrite preflight failed on a raw max_statement_time error (the user's URL set 1 s) while the
    server was busy.  Under a 1 microsecond statement timeout, which cuts that query alone, it still answers."""
    parent, child = db.new_table(), db.new_table()
    db.keyed_table(parent)
    db.create_table(child, f"id int PRIMARY KEY, parent int REFERENCES {db.q(parent)} (id)")
    dialect = dialect_for(parse_url(db.url, password=db.password))
    try:
        with dialect.connect() as conn:
            conn.exec_driver_sql("SET SESSION max_statement_time = 0.000001")
            with pytest.raises(sa.exc.OperationalError, match="max_statement_time"):  # the timeout is in force
                conn.exec_driver_sql("SELECT count(*) FROM information_schema.KEY_COLUMN_USAGE").all()
            assert dialect.referencing_tables(conn, None, parent) == [child]
    finally:
        dialect.dispose()
        db.drop_table(child)  # before its parent: MariaDB refuses to drop a referenced table


def test_a_database_error_while_checking_before_the_write_is_told_as_such(db: Target, spark: SparkSession) -> None:
    """Another session holds the decision log's table, so the log read before the write waits past
    controlLockTimeout: the user got SQLAlchemy's raw OperationalError.  Now BatchAbortedError with the cause,
    saying this run wrote nothing and what an earlier run of the batch left is as it was (here batch 0,
    committed: its rows stay; the first wording, "nothing of this batch was written", was false for it:
    adversary review); nothing is decided for batch 1.  (It first cut the checks with a 1 microsecond
    statement timeout on MariaDB: a statement the server finished first passed, and CI once saw no error.)"""
    table = db.new_table()
    db.keyed_table(table)
    s = sink()
    xasink.write(rows_frame(spark, expected(range(3))), db.url, table, sink_id=s, batch_id=0, mode="overwrite")
    df = spark.createDataFrame([(7, "a")], "id int, name string")
    with log_table_locked(db):
        for batch in (0, 1):  # a replay of the committed batch, a new one
            with pytest.raises(BatchAbortedError) as info:
                xasink.write(df, db.url, table, sink_id=s, batch_id=batch, mode="overwrite", controlLockTimeout=1)
            message = str(info.value)
            assert f"batch {batch}: checking the server and table" in message and "lock" in message.lower()
            assert "This run wrote nothing" in message and "same sinkId and batchId" in message, message
            assert "nothing of this batch was written" not in message, message
        for batch in (0, 2) if HAS_DATA_SOURCE else ():  # format("xasink"): its planning's checks or log steps
            with pytest.raises(BatchAbortedError) as info, xasink.spark_errors():
                options: dict[str, str | int] = {
                    "url": db.url,
                    "dbtable": table,
                    "sinkId": s,
                    "batchId": str(batch),
                    "controlLockTimeout": 1,
                }
                df.write.format("xasink").options(**options).mode("append").save()
            message = str(info.value)
            assert f"batch {batch}: " in message and "same sinkId and batchId" in message, message
            assert "This run wrote nothing" in message or "This run prepared nothing" in message, message
            assert "nothing of this batch was written" not in message, message
    assert db.rows(table) == expected(range(3))
    assert db.decision(s, 1) is None and db.decision(s, 2) is None and db.prepared(s) == []


def test_write_modes_are_refused_inside_a_transaction(db: Target, spark: SparkSession) -> None:
    table = db.new_table()
    db.keyed_table(table)
    df = spark.createDataFrame([(1, "a")], "id int, name string")
    with pytest.raises(OptionError, match="not supported inside xasink.transaction"):  # noqa: SIM117
        with xasink.transaction(sink_id=sink(), batch_id=0) as tx:
            tx.write(df, db.url, table, upsertKeyColumns="id", sequenceColumn="id2")
    assert db.rows(table) == []


def test_the_log_keeps_no_apply_step_once_a_batch_is_applied(db: Target, spark: SparkSession) -> None:
    table = db.new_table()
    db.keyed_table(table)
    s = sink()
    xasink.write(spark.createDataFrame([(1, "a")], "id int, name string"), db.url, table, sink_id=s, mode="overwrite")
    (target,) = db.execute("SELECT target FROM xasink_batches WHERE sink_id = %s", s)[0]
    assert table in target and "apply" not in target and "shadow" not in target


def test_truncate_options_of_an_overwrite() -> None:
    """truncate: any value is accepted and changes nothing; cascadeTruncate: false accepted, true refused."""
    base = {"url": "postgresql://u@h/d", "dbtable": "t", "sinkId": "s"}
    for value in ("true", "false", "yes", "banana"):
        parse_options({**base, "truncate": value}).with_mode("overwrite")
    parse_options({**base, "cascadeTruncate": "false"}).with_mode("overwrite")
    with pytest.raises(OptionError, match="cascadeTruncate"):
        parse_options({**base, "cascadeTruncate": "true"}).with_mode("overwrite")


def test_readers_see_exactly_the_old_or_the_new_rows(db: Target, monkeypatch: pytest.MonkeyPatch) -> None:
    """A reader polling count and sum throughout, the driver held 1.5 s between the commits and the apply.

    While held, the batch's branches are committed (into the shadow): the reader must still see the old
    rows, then exactly the new ones; never an empty table or a mix.
    """
    table = db.new_table()
    db.keyed_table(table)
    old, new = expected(range(1000), tag="o"), expected(range(500, 2000))
    fill(db, table, old)
    storage = storage_of(db, table)
    signature = {"old": (1000, sum(range(1000))), "new": (1500, sum(range(500, 2000)))}
    monkeypatch.setenv("XASINK_FAULT", "driver.after_commits:sleep=1.5")
    s = sink()
    ran: list[Any] = []

    def write() -> None:
        t0 = time.monotonic()
        ran.append(overwrite_direct(db.url, table, s, 0, split(500, 1500, 3)))
        ran.append(time.monotonic() - t0)

    seen = seen_while(db, table, write)
    result, took = ran
    assert result.rows == 1500 and took >= 1.5  # the driver was held
    assert set(seen) <= set(signature.values()), f"a reader saw neither the old nor the new rows: {seen}"
    assert seen.get(signature["old"], 0) > 10 and seen.get(signature["new"], 0) > 0, seen
    assert db.rows(table) == new and db.prepared(s) == [] and shadow_rows(db) == 0
    assert storage_of(db, table) != storage  # the table's storage was swapped under the polling reader


def begin_snapshot(db: Target, cur: Any) -> None:
    """Start a REPEATABLE READ transaction and take its snapshot without touching any table."""
    if db.kind == POSTGRESQL:
        cur.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        cur.execute("SELECT 1")
    else:
        cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT")


def count_and_sum(cur: Any, db: Target, table: str) -> tuple[int, int]:
    cur.execute(f"SELECT count(*), coalesce(sum(id), 0) FROM {db.q(table)}")
    n, total = cur.fetchone()
    return int(n), int(total)


@pytest.mark.parametrize("truncate", ["false", "true"])
def test_a_snapshot_older_than_the_overwrite_still_sees_the_old_rows(db: Target, truncate: str) -> None:
    """Readers never see an empty table: not even a REPEATABLE READ transaction whose snapshot predates the
    replacing transaction and reads the table after it committed.  The issue-18 contract: ``truncate`` is
    accepted and changes nothing, so this holds with ``truncate=true`` too (PostgreSQL's TRUNCATE is not
    MVCC-safe: such a snapshot sees the table empty)."""
    table = db.new_table()
    db.keyed_table(table)
    fill(db, table, expected(range(200), tag="o"))
    with db.connect() as conn, conn.cursor() as cur:
        begin_snapshot(db, cur)
        overwrite_direct(db.url, table, sink(), 0, split(100, 200, 2), truncate=truncate)
        assert count_and_sum(cur, db, table) == (200, sum(range(200))), "an older snapshot lost the old rows"
        cur.execute("COMMIT")
        assert count_and_sum(cur, db, table) == (200, sum(range(100, 300)))


@pytest.mark.parametrize("truncate", ["false", "true"])
def test_readers_do_not_wait_for_an_overwrite(db: Target, truncate: str) -> None:
    """An overwrite never makes a reader wait, whatever ``truncate`` says: with a reporting session's
    transaction open on the table, a new reader still answers at once (PostgreSQL: a TRUNCATE queued behind
    that session's ACCESS SHARE lock would make every new reader queue behind it)."""
    table = db.new_table()
    db.keyed_table(table)
    fill(db, table, expected(range(200), tag="o"))
    s = sink()
    with db.connect() as report, report.cursor() as held, ThreadPoolExecutor(1) as pool:
        held.execute("BEGIN")
        assert count_and_sum(held, db, table)[0] == 200  # the report keeps its transaction open
        job = pool.submit(overwrite_direct, db.url, table, s, 0, split(100, 200, 2), truncate=truncate)
        try:
            deadline = time.monotonic() + 180  # (a hang, not a timing: a loaded CI is slow)
            while db.decision(s, 0) is None and not job.done():
                assert time.monotonic() < deadline, "the batch was never decided"
                time.sleep(0.05)
            time.sleep(0.5)  # the apply step has started (and may be waiting)
            with db.connect() as conn, conn.cursor() as cur:
                # a reader queued behind the overwrite would wait as long as the report's transaction stays open
                # (to the end of this block): it runs out of its lock wait instead, whatever the machine's speed
                if db.kind == POSTGRESQL:
                    cur.execute("SET lock_timeout = '20s'")
                else:
                    cur.execute("SET SESSION lock_wait_timeout = 20")
                seen = count_and_sum(cur, db, table)
                assert seen in ((200, sum(range(200))), (200, sum(range(100, 300))))
        finally:
            held.execute("COMMIT")
            job.result(timeout=60)
    assert db.rows(table) == expected(range(100, 300))


def test_a_recovery_racing_the_driver_applies_the_batch_once(db: Target, monkeypatch: pytest.MonkeyPatch) -> None:
    """``xasink recover`` runs while the driver is held between the commits and the apply: whichever of them
    applies the batch, it is applied once (no primary key here, so a second apply would double the rows)."""
    table = db.new_table()
    db.keyed_table(table, primary_key=False)
    fill(db, table, expected(range(100), tag="o"))
    monkeypatch.setenv("XASINK_FAULT", "driver.after_commits:sleep=2")
    s = sink()
    with ThreadPoolExecutor(1) as pool:
        job = pool.submit(overwrite_direct, db.url, table, s, 0, split(50, 150, 3))
        deadline = time.monotonic() + 180  # (a hang, not a timing: a loaded CI is slow)
        while (d := db.decision(s, 0)) is None or db.prepared(s):
            assert time.monotonic() < deadline and not job.done(), "the driver never reached its commits"
            time.sleep(0.05)
        report = admin.recover(db.url, sink_id=s, older_than_s=0)
        assert not report.errors, report.errors
        result = job.result(timeout=60)
    assert d is not None and result.rows == 150
    assert db.rows(table) == expected(range(50, 200))
    assert db.decision(s, 0).state == "committed"  # type: ignore[union-attr]
    assert shadow_rows(db) == 0


def test_an_apply_reads_only_its_decided_branches_and_never_waits_on_another_runs(
    db: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 27: a branch of another run of the same batch, prepared into the shadow and never decided, while
    the decided run applies (held after its commits): the apply does not wait on it (MariaDB: an INSERT ..
    SELECT or DELETE scanning the shadow locked its rows) and applies only its own branches' rows; recovery
    then rolls the stray branch back."""
    table = db.new_table()
    db.keyed_table(table)
    fill(db, table, expected(range(10), tag="o"))
    s = sink()
    opts: dict[str, Any] = {"controlLockTimeout": 2, "commitTimeout": 8}  # a wait on the stray's rows fails the write
    with held_at(monkeypatch, "driver.after_commits") as hold, ThreadPoolExecutor(1) as pool:
        job = pool.submit(overwrite_direct, db.url, table, s, 0, split(100, 20, 2), **opts)
        hold.wait(what=lambda: job.done() and job.exception())
        stray = prepare_stray_branch(db.url, table, s, 0, [(500, "stray"), (101, "stray")], **opts)
        assert len(db.prepared(s)) == 1, stray  # prepared before the apply starts
        assert not job.done()
        hold.release()
        result = job.result(timeout=120)
    assert result.rows == 20
    assert db.rows(table) == expected(range(100, 120))
    assert db.decision(s, 0).state == "committed"  # type: ignore[union-attr]
    assert db.prepared(s) == [stray] if db.kind == POSTGRESQL else len(db.prepared(s)) == 1  # left to its run
    report = admin.recover(db.url, sink_id=s, older_than_s=0)  # the stray's run is gone: it can never commit
    assert not report.errors, report.errors
    assert db.prepared(s) == []
    assert db.rows(table) == expected(range(100, 120))
    assert shadow_rows(db) == 0


def test_a_batch_decided_before_shadow_rows_carried_their_branch_is_applied_by_recovery(
    db: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A shadow made by an earlier xasink (no ``xasink_branch_`` column) holding a decided, unapplied batch, as
    an upgrade can find it: recovery applies the batch's rows as they were written."""
    table = db.new_table()
    db.keyed_table(table)
    fill(db, table, expected(range(10), tag="o"))
    monkeypatch.setenv("XASINK_FAULT", "driver.after_commits:raise")
    s = sink()
    with pytest.raises(InjectedFault):
        overwrite_direct(db.url, table, s, 0, split(100, 20, 2))
    decided = db.decision(s, 0)
    assert decided is not None and decided.state == "committing" and db.prepared(s) == []
    shadow = shadow_name("xasink_", Xid.parse(decided.xids[0]).log_id, s)  # type: ignore[union-attr]
    db.execute(f"ALTER TABLE {db.q(shadow)} DROP COLUMN xasink_branch_")  # as an earlier xasink made it
    assert shadow_rows(db) == 20
    report = admin.recover(db.url, sink_id=s, older_than_s=0)
    assert not report.errors, report.errors
    assert db.rows(table) == expected(range(100, 120))
    assert db.decision(s, 0).state == "committed"  # type: ignore[union-attr]
    assert shadow_rows(db) == 0


def test_two_sinks_overwriting_one_table_at_once_leave_one_batch(db: Target) -> None:
    """Two overwrites of the same table from two sinks at the same time: applied one after the other, the
    table ends with exactly one batch's rows (no mix, no deadlock).  Both are the first writers of a new
    decision log, so they also create it concurrently."""
    table = db.new_table()
    db.keyed_table(table)
    fill(db, table, expected(range(100), tag="o"))
    a, b = expected(range(0, 300)), expected(range(200, 400))
    # two driver processes (tests/modes_driver.py; a process holds one run guard per decision log)
    driver = str(Path(__file__).resolve().parent / "modes_driver.py")
    env = {k: v for k, v in os.environ.items() if not k.startswith("XASINK_FAULT")}
    # a decision log of their own, which both create at the same moment (MariaDB: non-transactional DDL)
    env[OPTIONS_ENV] = json.dumps({"journalTablePrefix": f"wm{uuid.uuid4().hex[:6]}_"})
    procs = [
        subprocess.Popen(
            [sys.executable, driver, "direct", db.url, table, sink(), "0", str(lo), str(n), "3"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for lo, n in ((0, 300), (200, 200))
    ]
    outs = [p.communicate(timeout=120)[0].decode(errors="replace") for p in procs]
    assert [p.returncode for p in procs] == [0, 0], "\n".join(o[-3000:] for o in outs)
    assert db.rows(table) in (a, b)


@pytest.mark.parametrize("db", [case(POSTGRESQL)], indirect=True)
def test_overwrite_of_a_table_in_another_schema_keeps_its_shadow_there(db: Target) -> None:
    """``dbtable`` = schema.table: the shadow is made in the target's schema (PostgreSQL; a MariaDB schema is a
    database of its own, which the session's database fixtures do not make)."""
    schema = f"wm_{uuid.uuid4().hex[:8]}"
    db.execute(f"CREATE SCHEMA {db.q(schema)}")
    try:
        table = f"{schema}.t"
        db.keyed_table(table)
        fill(db, table, expected(range(30), tag="o"))
        overwrite_direct(db.url, table, sink(), 0, split(10, 40, 2))
        assert db.rows(table) == expected(range(10, 50))
        shadows = db.execute(
            "SELECT table_schema FROM information_schema.tables WHERE table_name LIKE %s AND table_schema = %s",
            "xasink\\_sh\\_%",
            schema,
        )
        assert shadows == [(schema,)], shadows
    finally:
        db.execute(f"DROP SCHEMA {db.q(schema)} CASCADE")


# --------------------------------------------------------------------------- replaceWhere


def test_replace_where_replaces_only_the_matching_rows(db: Target, spark: SparkSession) -> None:
    table = db.new_table()
    db.create_table(table, "id int PRIMARY KEY, day varchar(10), v int")
    days = ["2026-11-21", "2026-11-22", "2026-11-23"]
    old = [(i, days[i % 3], i) for i in range(90)]
    with db.connect() as conn, conn.cursor() as cur:
        cur.executemany(f"INSERT INTO {db.q(table)} VALUES (%s, %s, %s)", old)
    schema = "id int, day string, v int"
    pred = "day = '2026-11-22' AND 'a:b%' LIKE 'a:%'"  # a colon and a percent sign reach the SQL as written
    s = sink()
    # day 22: ids 1, 4, ... 88; the batch keeps half of them (new v) and adds ids 100..119
    batch = [(i, "2026-11-22", 1000 + i) for i in range(1, 90, 6)] + [(i, "2026-11-22", i) for i in range(100, 120)]
    overwrite(spark.createDataFrame(batch, schema).repartition(3), db, table, s, 0, replaceWhere=pred)
    untouched = [r for r in old if r[1] != "2026-11-22"]
    after = sorted(untouched + batch)
    assert db.rows(table) == after

    # a batch row outside the predicate: ApplyError, nothing visible, nothing prepared, shadow empty
    assert issubclass(ApplyError, BatchAbortedError)
    outside = [(200, "2026-11-22", 1), (201, "2026-11-24", 2), (202, None, 3)]
    with pytest.raises(ApplyError, match="do not match replaceWhere"):
        xasink.write(
            spark.createDataFrame(outside, schema).repartition(2),
            db.url,
            table,
            sink_id=s,
            batch_id=1,
            mode="overwrite",
            replaceWhere=pred,
        )
    assert db.rows(table) == after
    assert db.prepared(s) == [] and db.decision(s, 1) is None and shadow_rows(db) == 0

    # replaceWhereCheck=false lets it through: day 22 rows replaced by the whole batch
    overwrite(
        spark.createDataFrame(outside, schema).repartition(2),
        db,
        table,
        s,
        1,
        replaceWhere=pred,
        replaceWhereCheck="false",
    )
    assert db.rows(table) == sorted(untouched + outside, key=lambda r: r[0])

    # replaceWhere belongs to an overwrite: with any other mode it is refused before anything runs
    with pytest.raises(OptionError, match="replaceWhere"):
        xasink.write(spark.createDataFrame(outside, schema), db.url, table, sink_id=s, batch_id=2, replaceWhere=pred)
    assert db.decision(s, 2) is None


def test_replace_where_may_name_the_table(db: Target, spark: SparkSession) -> None:
    """A predicate naming the table's columns as ``table.column`` passes the check before any task runs, so the
    batch must land (or be refused before anything is prepared), not be withdrawn after its decision."""
    table = db.new_table()
    db.create_table(table, "id int PRIMARY KEY, day varchar(10), v int")
    db.execute(f"INSERT INTO {db.q(table)} VALUES (1, '2026-11-21', 1), (2, '2026-11-22', 2)")
    pred = f"{db.q(table)}.day = '2026-11-22'"
    batch = spark.createDataFrame([(3, "2026-11-22", 3)], "id int, day string, v int")
    try:
        xasink.write(batch, db.url, table, sink_id=sink(), batch_id=0, mode="overwrite", replaceWhere=pred)
    except PreflightError:
        assert db.rows(table) == [(1, "2026-11-21", 1), (2, "2026-11-22", 2)]
    else:
        assert db.rows(table) == [(1, "2026-11-21", 1), (3, "2026-11-22", 3)]


# --------------------------------------------------------------------------- change-data apply


def test_change_data_apply_keeps_the_newest_change_of_each_key(db: Target, spark: SparkSession) -> None:
    """Through foreach_batch's keyword options: last by sequence wins, late changes never move a row back."""
    table = db.new_table()
    db.create_table(table, "id int PRIMARY KEY, name varchar(20), seq bigint")
    db.execute(f"INSERT INTO {db.q(table)} VALUES (1, 'a', 5), (2, 'b', 5), (3, 'c', 5), (6, 'f', 5)")
    columns = db.column_types(table)
    schema = "deleted boolean, id int, name string, seq long"  # the flag first: it is never written
    write = xasink.foreach_batch(
        db.url, table, sink(), upsertKeyColumns="id", deleteFlagColumn="deleted", sequenceColumn="seq"
    )
    changes = [
        (False, 1, "a6", 6),
        (True, 1, None, 7),
        (False, 1, "a8", 8),  # update, delete, re-insert of key 1: the re-insert wins
        (False, 2, "b9", 9),
        (True, 2, None, 8),  # delete then re-insert of key 2, out of order in the frame
        (True, 3, None, 6),  # delete
        (True, 4, None, 6),  # delete of a missing key: fine
        (False, 5, "e", 6),  # insert
        (False, 6, "f-old", 4),  # older than the stored row: ignored
    ]
    write(spark.createDataFrame(changes, schema).repartition(3), 0)
    current = [(1, "a8", 8), (2, "b9", 9), (5, "e", 6), (6, "f", 5)]
    assert db.rows(table) == current
    assert db.column_types(table) == columns  # the flag column was not added or written

    # a new batch id carrying older changes (a replay from an earlier position): nothing moves back
    late = [(False, 1, "stale", 7), (True, 2, None, 8), (False, 3, "back", 5), (True, 5, None, 5), (False, 6, "x", 4)]
    write(spark.createDataFrame(late, schema).repartition(2), 1)
    assert db.rows(table) == current

    # and newer ones still apply
    write(spark.createDataFrame([(True, 6, None, 10), (False, 3, "again", 7)], schema), 2)
    assert db.rows(table) == [(1, "a8", 8), (2, "b9", 9), (3, "again", 7), (5, "e", 6)]


def test_a_change_never_overwrites_the_row_of_another_key(db: Target, spark: SparkSession) -> None:
    """Change-data apply is an upsert: a change to id 2 carrying id 1's email conflicts on the email index, so
    the decision is withdrawn and the table keeps its rows, on MariaDB (where ON DUPLICATE KEY UPDATE would
    rewrite id 1's row) as on PostgreSQL."""
    table = db.new_table()
    db.create_table(table, "id int PRIMARY KEY, email varchar(20) NOT NULL, seq bigint")
    db.execute(f"CREATE UNIQUE INDEX {table}_email ON {db.q(table)} (email)")
    db.execute(f"INSERT INTO {db.q(table)} VALUES (1, 'alice@x', 1), (3, 'carol@x', 1)")
    schema = "id int, email string, seq long, deleted boolean"
    opts: dict[str, Any] = {"upsertKeyColumns": "id", "deleteFlagColumn": "deleted", "sequenceColumn": "seq"}
    clash = spark.createDataFrame([(3, "carol@y", 2, False), (2, "alice@x", 2, False)], schema)
    with pytest.raises(ApplyError) as info:
        xasink.write(clash, db.url, table, sink_id=sink(), batch_id=0, **opts)
    assert f"{table}_email" in str(info.value), str(info.value)
    assert db.rows(table) == [(1, "alice@x", 1), (3, "carol@x", 1)]
    fine = spark.createDataFrame([(3, "carol@y", 2, False), (2, "bob@x", 2, False), (1, None, 2, True)], schema)
    xasink.write(fine, db.url, table, sink_id=sink(), batch_id=0, **opts)
    assert db.rows(table) == [(2, "bob@x", 2), (3, "carol@y", 2)]


def test_a_late_change_does_not_bring_back_a_deleted_key(db: Target, spark: SparkSession) -> None:
    table = db.new_table()
    db.create_table(table, "id int PRIMARY KEY, name varchar(20), seq bigint")
    s = sink()
    schema = "id int, name string, seq long, deleted boolean"
    opts: dict[str, Any] = {"upsertKeyColumns": "id", "deleteFlagColumn": "deleted", "sequenceColumn": "seq"}
    first = spark.createDataFrame([(1, "a", 1, False), (2, "b", 1, False), (3, "c", 1, False)], schema)
    xasink.write(first, db.url, table, sink_id=s, batch_id=0, **opts)
    deletes = spark.createDataFrame([(1, None, 9, True), (2, None, 9, True)], schema)
    xasink.write(deletes, db.url, table, sink_id=s, batch_id=1, **opts)
    assert db.rows(table) == [(3, "c", 1)]
    # late: older than the deletes (ignored); newer re-insert of key 2 (applied, and it stays)
    late = spark.createDataFrame([(1, "stale", 5, False), (2, "back", 10, False)], schema).repartition(2)
    xasink.write(late, db.url, table, sink_id=s, batch_id=2, **opts)
    assert db.rows(table) == [(2, "back", 10), (3, "c", 1)]
    # key 2 is alive again: an older delete of it is ignored, an older update too
    xasink.write(spark.createDataFrame([(2, None, 9, True)], schema), db.url, table, sink_id=s, batch_id=3, **opts)
    assert db.rows(table) == [(2, "back", 10), (3, "c", 1)]


def test_two_change_data_applies_of_one_sink_at_once_equal_one_after_the_other(
    db: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 27: batch 7 deletes key 1 at sequence 10; batch 8 (a backfill of the same sink) upserts key 1 at
    sequence 5 and applies while batch 7's apply is held before its commit.  The applies are serialized by
    the sink and target's apply lock, so the result is that of one after the other (in either order): key 1
    stays deleted and its tombstone stays.  (Batch 7 is held 10 s: batch 8 is a new driver process, which
    must reach its apply meanwhile; without the lock the test fails on PostgreSQL, where batch 8's upsert
    waits on the delete.  InnoDB's locking read of the tombstone made MariaDB wait already.)"""
    table = db.new_table()
    db.create_table(table, "id int PRIMARY KEY, name varchar(20), seq bigint")
    s = sink()
    columns = {"id": "int", "name": "string", "seq": "long", "deleted": "boolean"}
    opts: dict[str, Any] = {"upsertKeyColumns": "id", "deleteFlagColumn": "deleted", "sequenceColumn": "seq"}
    batch_direct(db.url, table, s, 6, columns, [[(1, "a", 1, False), (2, "b", 1, False)]], "append", **opts)
    with held_at(monkeypatch, "driver.apply_statements:b=7") as hold, ThreadPoolExecutor(1) as pool:
        seven = pool.submit(batch_direct, db.url, table, s, 7, columns, [[(1, None, 10, True)]], "append", **opts)
        hold.wait(what=lambda: seven.done() and seven.exception())  # batch 7's apply deleted key 1, holds there
        late = [[(1, "back", 5, False)], [(2, "b8", 6, False)]]
        eight = {"url": db.url, "table": table, "sink_id": s, "batch_id": 8, "columns": columns}
        eight.update(partitions=late, mode="append", options=opts)
        env = {k: v for k, v in os.environ.items() if not k.startswith("XASINK_FAULT")}
        driver = str(Path(__file__).resolve().parent / "modes_driver.py")
        args = [sys.executable, driver, "batch", json.dumps(eight)]
        # another driver process (a process holds one run guard per decision log), its output in a file
        with tempfile.TemporaryFile() as err, subprocess.Popen(args, env=env, stdout=err, stderr=err) as out:
            # batch 8 reaches its apply while batch 7's is held, and waits (for the apply lock; without it, on
            # PostgreSQL, for the deleted row)
            wait_for(lambda: blocked_here(db) or out.poll() is not None, 180, "batch 8 to wait", interval=0.25)
            hold.release()
            out.wait(timeout=180)
            err.seek(0)
            assert out.returncode == 0, err.read().decode(errors="replace")[-3000:]
        seven.result(timeout=120)
    assert db.rows(table) == [(2, "b8", 6)]
    decided = db.decision(s, 8)
    assert decided is not None and decided.xids
    log_id = Xid.parse(decided.xids[0]).log_id  # type: ignore[union-attr]
    assert db.rows(tombstone_name("xasink_", log_id, s)) == [(1, 10)]
    assert [db.decision(s, b).state for b in (6, 7, 8)] == ["committed"] * 3  # type: ignore[union-attr]
    assert_settled(db, s)


def test_complete_mode_keeps_the_table_equal_to_the_aggregate(db: Target, spark: SparkSession, tmp_path: Path) -> None:
    table = db.new_table()
    db.create_table(table, "k varchar(10) PRIMARY KEY, n bigint")
    src, chk = tmp_path / "in", tmp_path / "chk"
    src.mkdir()
    s = sink()

    def add(name: str, keys: list[str]) -> None:
        (src / name).write_text("\n".join(json.dumps({"k": k}) for k in keys))

    def run() -> None:
        counts = spark.readStream.schema("k string").json(str(src)).groupBy("k").count().withColumnRenamed("count", "n")
        query = (
            counts.writeStream.outputMode("complete")
            .format("xasink")
            .option("url", db.url)
            .option("dbtable", table)
            .option("sinkId", s)
            .option("checkpointLocation", str(chk))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(120)
        assert query.exception() is None

    add("1.json", ["a", "b", "a"])
    run()
    assert db.rows(table) == [("a", 2), ("b", 1)]
    add("2.json", ["b", "c"])
    run()
    assert db.rows(table) == [("a", 2), ("b", 2), ("c", 1)]


# --------------------------------------------------------------------------- other sessions


@pytest.fixture
def open_insert(db: Target) -> Iterator[Any]:
    """Another session with an uncommitted INSERT of (5000, 'other') into the table set up by the test."""
    holder: dict[str, Any] = {}

    def begin(table: str) -> Any:
        conn = db.connect()
        raw = conn.__enter__()
        holder["ctx"], holder["conn"] = conn, raw
        cur = raw.cursor()
        cur.execute("BEGIN")
        cur.execute(f"INSERT INTO {db.q(table)} (id, name) VALUES (5000, 'other')")
        return cur

    yield begin
    if "ctx" in holder:
        try:
            holder["conn"].rollback()
        finally:
            holder["ctx"].__exit__(None, None, None)


def wait_decided(db: Target, s: str, batch: int, timeout_s: float = 180.0) -> None:
    deadline = time.monotonic() + timeout_s
    while db.decision(s, batch) is None:
        assert time.monotonic() < deadline, "the batch was never decided"
        time.sleep(0.1)


def table_under_open_insert(
    db: Target, open_insert: Any
) -> tuple[str, list[tuple[int, str]], list[tuple[int, str]], Any]:
    """A keyed table holding 100 old rows, another session's insert into it left open; the rows to write."""
    table = db.new_table()
    db.keyed_table(table)
    old, new = expected(range(100), tag="o"), expected(range(50, 250))
    fill(db, table, old)
    return table, old, new, open_insert(table)


def test_an_overwrite_waits_for_an_open_insert_then_replaces_it(
    db: Target, spark: SparkSession, open_insert: Any
) -> None:
    table, old, new, other = table_under_open_insert(db, open_insert)
    s = sink()
    with ThreadPoolExecutor(1) as pool:
        job = pool.submit(xasink.write, rows_frame(spark, new), db.url, table, sink_id=s, batch_id=0, mode="overwrite")
        wait_decided(db, s, 0)
        waiting = wait_for(lambda: db.lock_waiters(f"%{table}%") or job.done(), 120, "the apply to wait")
        assert not job.done(), f"the apply did not wait for the open insert: {job.result()}, {waiting}"
        assert db.rows(table) == old  # readers see the old rows meanwhile
        other.execute("COMMIT")
        result = job.result(timeout=60)
    assert result.rows == 200 and not result.skipped
    assert db.rows(table) == new  # the row committed before the apply ran was replaced like any old row
    assert db.decision(s, 0).state == "committed"  # type: ignore[union-attr]
    assert_settled(db, s)


def test_an_overwrite_blocked_past_commit_timeout_is_finished_by_recover(
    db: Target, spark: SparkSession, open_insert: Any
) -> None:
    table, old, new, other = table_under_open_insert(db, open_insert)
    s = sink()
    with pytest.raises(CommitIncompleteError, match="old rows"):
        xasink.write(
            rows_frame(spark, new),
            db.url,
            table,
            sink_id=s,
            batch_id=0,
            mode="overwrite",
            controlLockTimeout=1,
            commitTimeout=2,
        )
    assert db.rows(table) == old
    assert db.decision(s, 0).state == "committing"  # type: ignore[union-attr]
    assert db.prepared(s) == []  # the branches are committed into the shadow
    other.execute("ROLLBACK")
    # what `xasink recover` runs (the CLI itself is run by test_write_modes_crash.py)
    report = admin.recover(db.url, sink_id=s, older_than_s=0)
    assert not report.errors, report.errors
    assert db.rows(table) == new
    assert db.decision(s, 0).state == "committed"  # type: ignore[union-attr]
    assert_settled(db, s)


@pytest.mark.parametrize("keyed", [True, False])
def test_an_overwrite_that_inserts_no_row_is_applied_under_a_required_column(db: Target, keyed: bool) -> None:
    """A NOT NULL column without a default the batches do not write: an empty replaceWhere batch deletes the
    rows of its condition, an empty overwrite empties the table (in place by the key, or DELETE + INSERT
    without one); a batch that inserts a row is refused (ApplyError).  Fails on main on MariaDB (FOUND.md
    8.7's sibling): the INSERT .. SELECT of no row failed with 1364, and the decision was withdrawn."""
    table = db.new_table()
    db.create_table(table, f"id int{' PRIMARY KEY' if keyed else ''}, name varchar(20), req int NOT NULL")
    db.execute(f"INSERT INTO {db.q(table)} VALUES (1, 'a', 10), (2, 'b', 20), (3, 'c', 30)")
    s = f"ow{uuid.uuid4().hex[:8]}"
    overwrite_direct(db.url, table, s, 0, [[]], replaceWhere="id >= 3")
    assert db.rows(table) == [(1, "a", 10), (2, "b", 20)]
    with pytest.raises(ApplyError):
        overwrite_direct(db.url, table, s, 1, [[(5, "e")]])
    assert db.rows(table) == [(1, "a", 10), (2, "b", 20)]
    overwrite_direct(db.url, table, s, 2, [[]])
    assert db.rows(table) == []
    assert sorted(db.decisions(s)) == [0, 2] and shadow_rows(db) == 0 and db.prepared(s) == []


# --------------------------------------------------------------------------- decision order (issue 37)


@pytest.mark.doc_case("error/BatchBlockedError")
def test_a_newer_overwrite_never_decides_while_an_older_decided_one_is_unapplied(db: Target, open_insert: Any) -> None:
    """Issue 37 item 1: batch 5 is decided but its apply is blocked (told CommitIncompleteError); batch 6 of the
    same sink fails before its decision with BatchBlockedError, nothing of it visible, while the block holds;
    once it is gone, batch 6 finishes batch 5 first, then takes effect itself (failed on main: batch 6
    decided, and a later recover applied batch 5 over it)."""
    table, old, _, other = table_under_open_insert(db, open_insert)
    s = sink()
    opts = {"controlLockTimeout": 1, "commitTimeout": 2}
    with pytest.raises(CommitIncompleteError, match="old rows"):
        overwrite_direct(db.url, table, s, 5, split(100, 10, 2), **opts)
    with doc_cases.raises(BatchBlockedError, match=f"sink {s} batch 5 of the same table") as err:
        overwrite_direct(db.url, table, s, 6, split(200, 10, 2), **opts)
    assert f"xasink recover --url <the table's database> --sink-id {s}" in str(err.value)
    assert db.decision(s, 6) is None and db.prepared(s) == [] and db.rows(table) == old
    s2 = sink()  # another sink writing the same table is held back the same way
    with pytest.raises(BatchBlockedError, match=f"sink {s} batch 5 of the same table"):
        overwrite_direct(db.url, table, s2, 0, split(300, 10, 2), **opts)
    assert db.decisions(s2) == {} and db.prepared(s2) == [] and db.rows(table) == old
    other.execute("ROLLBACK")
    result = overwrite_direct(db.url, table, s, 6, split(200, 10, 2), **opts)
    assert result.rows == 10 and not result.skipped
    assert db.rows(table) == expected(range(200, 210))
    assert {b: d.state for b, d in db.decisions(s).items()} == {5: "committed", 6: "committed"}
    assert_settled(db, s)


@pytest.mark.parametrize("db", [case(MARIADB)], indirect=True)  # PostgreSQL: the kept schedule (FOUND.md 8.2)
def test_a_run_finds_its_decision_applied_and_compacted_while_it_stalled(
    db: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 37 item 2: the driver of batch 5 stalls after its commits; a recover applies the batch, and
    batch 6 (journalRetention=1) compacts it.  The stalled run recognizes its own decision by its run and is
    told "written" (failed on main: ApplyError, "withdrew the decision", while its rows were there)."""
    table = db.new_table()
    db.keyed_table(table)
    fill(db, table, expected(range(10), tag="o"))
    # the stall lasts until the test releases it: a fixed 12 s ran out under a loaded CI before batch 6 had
    # compacted batch 5, and the run then never met its compacted decision
    s = sink()
    with held_at(monkeypatch, "driver.after_commits:b=5") as hold, ThreadPoolExecutor(1) as pool:
        job = pool.submit(overwrite_direct, db.url, table, s, 5, split(100, 20, 2), journalRetention=1)
        hold.wait(what=lambda: job.done() and job.exception())
        report = admin.recover(db.url, sink_id=s, older_than_s=0)
        assert not report.errors, report.errors
        assert db.rows(table) == expected(range(100, 120))
        # another driver process (a process holds one run guard per decision log)
        driver = str(Path(__file__).resolve().parent / "modes_driver.py")
        env = {k: v for k, v in os.environ.items() if not k.startswith("XASINK_FAULT")}
        env[OPTIONS_ENV] = json.dumps({"journalRetention": 1})
        args = [sys.executable, driver, "direct", db.url, table, s, "6", "300", "5", "1"]
        done = subprocess.run(args, env=env, capture_output=True, timeout=180)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert db.decision(s, 5).xids == []  # type: ignore[union-attr]  # compacted
        assert not job.done()
        hold.release()
        result = job.result(timeout=120)
    assert result.rows == 20 and not result.skipped
    assert db.rows(table) == expected(range(300, 305))
    assert {b: d.state for b, d in db.decisions(s).items()} == {5: "committed", 6: "committed"}
    assert_settled(db, s)


def blocked_here(db: Target) -> bool:
    """Whether a session of the test database waits for a lock: a row's, a table's, an advisory lock (PostgreSQL),
    a row's or GET_LOCK's (MariaDB; its INNODB_TRX is a cache: poll it at most every 0.1 s)."""
    if db.kind == POSTGRESQL:
        return bool(db.lock_waiters())
    waiting = (
        "SELECT ID FROM information_schema.PROCESSLIST WHERE DB = DATABASE() AND ID <> CONNECTION_ID() AND "
        "(STATE = 'User lock' OR ID IN (SELECT trx_mysql_thread_id FROM information_schema.INNODB_TRX "
        "WHERE trx_state = 'LOCK WAIT'))"
    )
    return bool(db.execute(waiting))


def batch_row_locked(db: Target, sink_id: str, batch_id: int) -> bool:
    """Whether another session holds the log's row of the batch (an apply marks it inside its transaction)."""
    with db.connect() as conn, conn.cursor() as cur:
        if db.kind == POSTGRESQL:
            conn.autocommit = False
        else:
            conn.begin()
        try:
            cur.execute(
                f"SELECT batch_id FROM {db.q('xasink_batches')} WHERE sink_id = %s AND batch_id = %s FOR UPDATE NOWAIT",
                (sink_id, batch_id),
            )
            return False
        except Exception as exc:  # noqa: BLE001 - the lock is not available: PostgreSQL 55P03, MariaDB 1205
            if getattr(exc, "pgcode", None) == "55P03" or (exc.args and exc.args[0] == 1205):
                return True
            raise
        finally:
            conn.rollback()


@pytest.mark.parametrize("db", [case(POSTGRESQL)], indirect=True)  # MariaDB: the kept schedule (FOUND.md 8.3)
def test_a_withdrawal_that_lost_its_race_to_a_recovery_is_told_written(
    db: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 37 item 3: the driver's apply fails on its rows (a NOT NULL column without a default, added after
    the decision), and its withdrawal waits for the sink's row, which another session holds; meanwhile the
    column gets its default back and a recover applies the batch (held inside its apply).  The withdrawal
    finds the batch applied and the driver is told "written" (failed on main: ApplyError, "nothing of this
    batch is visible", while all of it was)."""
    table = db.new_table()
    db.keyed_table(table)
    fill(db, table, expected(range(10), tag="o"))
    monkeypatch.setenv("XASINK_FAULT", "driver.after_commits:sleep=2:b=5,driver.apply_statements:sleep=3")
    s = sink()
    opts = {"controlLockTimeout": 30, "commitTimeout": 30}
    with ThreadPoolExecutor(2) as pool, db.connect() as holder, holder.cursor() as cur:
        job = pool.submit(overwrite_direct, db.url, table, s, 5, split(100, 20, 2), **opts)
        deadline = time.monotonic() + 180  # (a hang, not a timing: a loaded CI is slow)
        while db.decision(s, 5) is None or db.prepared(s):
            assert time.monotonic() < deadline and not job.done(), "the driver never reached its commits"
            time.sleep(0.05)
        db.execute(f"ALTER TABLE {db.q(table)} ADD COLUMN c INT NOT NULL DEFAULT 0")
        db.execute(f"ALTER TABLE {db.q(table)} ALTER COLUMN c DROP DEFAULT")
        cur.execute("BEGIN")
        cur.execute(f"SELECT sink_id FROM {db.q('xasink_sinks')} WHERE sink_id = %s FOR UPDATE", (s,))
        deadline = time.monotonic() + 60  # the driver wakes, its apply fails on the rows (its transaction, with
        while not db.lock_waiters("%xasink_sinks%"):  # the batch's row, ends), its withdrawal waits
            assert time.monotonic() < deadline and not job.done(), "the driver's withdrawal never waited"
            time.sleep(0.05)
        db.execute(f"ALTER TABLE {db.q(table)} ALTER COLUMN c SET DEFAULT 0")
        recovery = pool.submit(admin.recover, db.url, sink_id=s, older_than_s=0)
        deadline = time.monotonic() + 60  # the recover holds the batch's row, marked but not committed, in its apply
        while not batch_row_locked(db, s, 5):  # (a fixed 1.5 s was too short on a loaded machine: CI failed)
            assert time.monotonic() < deadline and not recovery.done(), "the recover never reached its apply"
            time.sleep(0.05)
        cur.execute("COMMIT")
        result = job.result(timeout=60)
        report = recovery.result(timeout=60)
    assert not report.errors, report.errors
    assert result.rows == 20 and not result.skipped
    assert db.rows(table) == [(i, f"n{i}", 0) for i in range(100, 120)]
    assert db.decision(s, 5).state == "committed"  # type: ignore[union-attr]
    assert_settled(db, s)


def test_an_overwrite_whose_tables_apply_lock_stays_held_is_aborted_through_write(
    spark: SparkSession, db: Target
) -> None:
    """The public API's side of tests/test_adversary_order.py: another session holds the table's apply lock past
    commitTimeout, nothing of the table pending.  ``xasink.write`` raises BatchAbortedError saying so; nothing of
    the batch is visible, decided or prepared, and the same batch then writes once the lock is free."""
    table, s = db.new_table(), sink()
    db.keyed_table(table)
    old, new = expected(range(10), tag="o"), expected(range(100, 110))
    fill(db, table, old)
    opts: dict[str, Any] = {"controlLockTimeout": "1", "commitTimeout": "4"}
    with apply_lock_held(db, table), pytest.raises(BatchAbortedError, match="apply lock was not granted") as err:
        xasink.write(rows_frame(spark, new), db.url, table, sink_id=s, batch_id=1, mode="overwrite", **opts)
    assert "nothing of it is visible" in str(err.value), err.value
    assert db.rows(table) == old and db.decision(s, 1) is None and db.prepared(s) == []
    assert (
        xasink.write(rows_frame(spark, new), db.url, table, sink_id=s, batch_id=1, mode="overwrite", **opts).rows == 10
    )
    assert db.rows(table) == new and shadow_rows(db) == 0


# a column type SQLAlchemy does not reflect, of each database
UNREFLECTED = {POSTGRESQL: "p point", MARIADB: "i6 inet6"}


@pytest.mark.parametrize("mode", ["append", "overwrite"])
def test_a_column_type_sqlalchemy_does_not_know_raises_no_warning(db: Target, mode: str) -> None:
    """SQLAlchemy warns "Did not recognize type 'inet6'" at every reflection of such a table, the target's
    and its shadow's; xasink names the type itself, so the user was warned at every batch with nothing to do."""
    table = db.new_table()
    db.create_table(table, f"id int PRIMARY KEY, name text, {UNREFLECTED[db.kind]}")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        result = batch_direct(db.url, table, sink(), 0, {"id": "int", "name": "string"}, split(0, 4, 2), mode)
    assert result.rows == 4
    assert [str(w.message) for w in seen if "recognize" in str(w.message)] == []
    assert [r[:2] for r in db.rows(table)] == expected(range(4))
