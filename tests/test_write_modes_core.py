"""Overwrite, replaceWhere and change-data apply through Spark, on PostgreSQL and MariaDB: exact row sets."""

from __future__ import annotations

import uuid

import pytest
from pyspark.sql import SparkSession

import xasink
from tests.targets import Target
from xasink.errors import ApplyError, OptionError


def sink() -> str:
    return f"m{uuid.uuid4().hex[:10]}"


def test_overwrite_replaces_every_row_and_keeps_the_table(db: Target, spark: SparkSession) -> None:
    table = db.new_table()
    db.keyed_table(table)
    db.execute(f"INSERT INTO {db.q(table)} VALUES (1, 'old1'), (2, 'old2'), (3, 'old3')")
    db.execute(
        f"CREATE INDEX {db.q(table + '_n')} ON {db.q(table)} (id, name(8))"
        if db.kind == "mariadb"
        else f"CREATE INDEX {db.q(table + '_n')} ON {db.q(table)} (name)"
    )
    df = spark.createDataFrame([(2, "new2"), (3, "new3"), (4, "new4")], "id int, name string").repartition(3)
    s = sink()
    (
        df.write.format("xasink")
        .option("url", db.url)
        .option("dbtable", table)
        .option("sinkId", s)
        .option("truncate", "true")
        .mode("overwrite")
        .save()
    )
    assert db.rows(table) == [(2, "new2"), (3, "new3"), (4, "new4")]
    # a rerun of the same batch writes nothing, even after the table changed
    db.execute(f"INSERT INTO {db.q(table)} VALUES (9, 'later')")
    (
        df.write.format("xasink")
        .option("url", db.url)
        .option("dbtable", table)
        .option("sinkId", s)
        .mode("overwrite")
        .save()
    )
    assert db.rows(table) == [(2, "new2"), (3, "new3"), (4, "new4"), (9, "later")]
    # an empty batch empties the table
    empty = spark.createDataFrame([], "id int, name string")
    xasink.write(empty, db.url, table, sink_id=s, batch_id=1, mode="overwrite")
    assert db.rows(table) == []


def test_replace_where_replaces_matching_rows_and_checks_the_batch(db: Target, spark: SparkSession) -> None:
    table = db.new_table()
    db.create_table(table, "id int PRIMARY KEY, day varchar(10), v int")
    db.execute(f"INSERT INTO {db.q(table)} VALUES (1, '2026-11-21', 1), (2, '2026-11-22', 2), (3, '2026-11-22', 3)")
    s = sink()
    new = spark.createDataFrame([(3, "2026-11-22", 30), (4, "2026-11-22", 40)], "id int, day string, v int")
    pred = "day = '2026-11-22' AND 'a:b%' LIKE 'a:%'"
    xasink.write(new, db.url, table, sink_id=s, batch_id=0, mode="overwrite", replaceWhere=pred)
    assert db.rows(table) == [(1, "2026-11-21", 1), (3, "2026-11-22", 30), (4, "2026-11-22", 40)]
    outside = spark.createDataFrame([(5, "2026-11-23", 50)], "id int, day string, v int")
    with pytest.raises(ApplyError, match="do not match replaceWhere"):
        xasink.write(outside, db.url, table, sink_id=s, batch_id=1, mode="overwrite", replaceWhere=pred)
    assert db.rows(table) == [(1, "2026-11-21", 1), (3, "2026-11-22", 30), (4, "2026-11-22", 40)]
    # the withdrawn batch can run again; without the check it lands
    xasink.write(
        outside, db.url, table, sink_id=s, batch_id=1, mode="overwrite", replaceWhere=pred, replaceWhereCheck="false"
    )
    assert db.rows(table) == [(1, "2026-11-21", 1), (5, "2026-11-23", 50)]
    with pytest.raises(OptionError, match="replaceWhere"):
        xasink.write(outside, db.url, table, sink_id=s, batch_id=2, replaceWhere=pred)


def test_change_data_apply(db: Target, spark: SparkSession) -> None:
    table = db.new_table()
    db.create_table(table, "id int PRIMARY KEY, name varchar(20), seq bigint")
    db.execute(f"INSERT INTO {db.q(table)} VALUES (1, 'a', 5), (2, 'b', 5), (3, 'c', 5)")
    s = sink()
    schema = "id int, name string, seq long, deleted boolean"
    changes = spark.createDataFrame(
        [
            (1, "a1", 6, False),
            (1, None, 7, True),
            (1, "a3", 8, False),  # update, delete, re-insert: last wins
            (2, None, 6, True),  # delete
            (3, "old", 4, False),  # older than stored: ignored
            (4, None, 6, True),  # delete of a missing key
            (5, "e", 6, False),  # insert
        ],
        schema,
    ).repartition(3)
    opts = {"upsertKeyColumns": "id", "deleteFlagColumn": "deleted", "sequenceColumn": "seq"}
    xasink.write(changes, db.url, table, sink_id=s, batch_id=0, **opts)
    assert db.rows(table) == [(1, "a3", 8), (3, "c", 5), (5, "e", 6)]
    late = spark.createDataFrame([(1, "stale", 7, False), (5, None, 5, True)], schema)
    xasink.write(late, db.url, table, sink_id=s, batch_id=1, **opts)
    assert db.rows(table) == [(1, "a3", 8), (3, "c", 5), (5, "e", 6)]


def test_complete_mode_keeps_the_table_equal_to_the_aggregate(db: Target, spark: SparkSession, tmp_path) -> None:  # type: ignore[no-untyped-def]
    import json

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


def test_a_late_change_does_not_bring_back_a_deleted_key(db: Target, spark: SparkSession) -> None:
    table = db.new_table()
    db.create_table(table, "id int PRIMARY KEY, name varchar(20), seq bigint")
    s = sink()
    schema = "id int, name string, seq long, deleted boolean"
    opts = {"upsertKeyColumns": "id", "deleteFlagColumn": "deleted", "sequenceColumn": "seq"}
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


def test_a_batch_breaking_a_constraint_leaves_the_old_rows(db: Target, spark: SparkSession) -> None:
    table = db.new_table()
    db.keyed_table(table)
    db.execute(f"INSERT INTO {db.q(table)} VALUES (1, 'old1'), (2, 'old2')")
    s = sink()
    dup = spark.createDataFrame([(7, "a"), (7, "b"), (8, "c")], "id int, name string").repartition(2)
    with pytest.raises(ApplyError, match="could not overwrite") as info:
        xasink.write(dup, db.url, table, sink_id=s, batch_id=0, mode="overwrite")
    assert "table keeps its old rows" in str(info.value)
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
