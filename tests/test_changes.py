"""The change-data apply (xasink/write_modes/changes.py), on PostgreSQL and MariaDB, without Spark
(tests/modes_driver.py: the data source's planning, one branch per list, ``Coordinator.commit``): the newest
change per key against stored rows and tombstones, exact row sets, tombstones and rows written, a key
changing twice without a sequence, and an apply beside another run's prepared branch of the shadow."""

from __future__ import annotations

import logging
import re
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from tests.cluster import wait_for
from tests.doc_cases import raises
from tests.harness import assert_settled, held_at, shadow_rows
from tests.modes_driver import batch_direct, prepare_stray_branch
from tests.targets import MARIADB, POSTGRESQL, Target, case
from xasink.errors import ApplyError
from xasink.ops import survey as admin
from xasink.protocol.xid import Xid
from xasink.write_modes.spec import shadow_name, tombstone_name

COLUMNS = {"id": "int", "name": "string", "seq": "long", "deleted": "boolean"}
OPTIONS = {"upsertKeyColumns": "id", "deleteFlagColumn": "deleted", "sequenceColumn": "seq"}
Partitions = list[list[tuple[Any, ...]]]  # a batch's rows, one list per partition (branch)


def sink() -> str:
    return f"ch-{uuid.uuid4().hex[:10]}"


def changes(
    db: Target,
    table: str,
    s: str,
    batch: int,
    partitions: list[list[tuple[Any, ...]]],
    sequence: bool = True,
    **opts: Any,
) -> Any:
    options = {**OPTIONS, **opts}
    if not sequence:
        del options["sequenceColumn"]
    return batch_direct(db.url, table, s, batch, COLUMNS, partitions, "append", **options)


def written(caplog: pytest.LogCaptureFixture, s: str, batch: int) -> int:
    """The rows the apply of a batch wrote (updated or inserted), as its log line reports them."""
    line = re.compile(rf"sink {re.escape(s)} batch {batch}: apply changes to \S+ \((\d+) rows\)")
    found = [int(m.group(1)) for r in caplog.records if (m := line.search(r.getMessage()))]
    assert len(found) == 1, found
    return found[0]


def tombstones(db: Target, s: str) -> list[tuple[Any, ...]]:
    decided = db.decision(s, 0)
    assert decided is not None and decided.xids
    log_id = Xid.parse(decided.xids[0]).log_id  # type: ignore[union-attr]
    return db.rows(tombstone_name("xasink_", log_id, s))


def test_keys_changed_several_times_against_stored_rows_and_tombstones(
    db: Target, caplog: pytest.LogCaptureFixture
) -> None:
    """Each key's newest change by sequence, across partitions, against the stored row and an older or newer
    tombstone: the exact rows, tombstones and rows written."""
    caplog.set_level(logging.INFO, logger="xasink.protocol.apply_step")
    table = db.new_table()
    db.create_table(table, "id int PRIMARY KEY, name varchar(20), seq bigint")
    s = sink()
    first = [(k, f"r{k}", 1, False) for k in range(1, 7)]
    changes(db, table, s, 0, [first[:3], first[3:]])
    assert written(caplog, s, 0) == 6
    # tombstones: key 1 and 2 at 5, key 7 (never there) at 5
    changes(db, table, s, 1, [[(1, None, 5, True), (2, None, 5, True)], [(7, None, 5, True)]])
    assert written(caplog, s, 1) == 0
    assert db.rows(table) == [(3, "r3", 1), (4, "r4", 1), (5, "r5", 1), (6, "r6", 1)]
    assert tombstones(db, s) == [(1, 5), (2, 5), (7, 5)]
    batch: Partitions = [
        [(1, "old3", 3, False), (2, "two6", 6, False), (3, None, 9, True), (8, "new1", 1, False)],
        [(1, "old4", 4, False), (2, None, 7, True), (3, "three2", 2, False), (4, "four0", 0, False)],
        [(2, "two8", 8, False), (7, "seven6", 6, False), (8, "new2", 2, False), (5, None, 0, True)],
        [(6, "six1", 1, False)],  # the same sequence as the stored row: applied (not older)
    ]
    changes(db, table, s, 2, batch)
    # 1: both changes older than its tombstone (5): stays deleted.  2: update, delete, re-insert: the re-insert
    # (8) wins over the tombstone (5).  3: deleted at 9 (its update at 2 is older).  4: older than the stored
    # row: ignored.  5: a delete older than the stored row: ignored.  7: newer than its tombstone: inserted.
    # 8: inserted, its newest change (2) wins.
    final = [
        (2, "two8", 8),
        (4, "r4", 1),
        (5, "r5", 1),
        (6, "six1", 1),
        (7, "seven6", 6),
        (8, "new2", 2),
    ]
    assert db.rows(table) == final
    assert tombstones(db, s) == [(1, 5), (3, 9)]  # 2 and 7 are alive again; 3's delete took effect
    assert written(caplog, s, 2) == 4  # 2, 6, 7, 8
    assert shadow_rows(db) == 0 and db.prepared(s) == []
    # a replay of the batch (a new batch id) changes nothing: the keys whose stored sequence equals the change's
    # (2, 6, 7, 8) are written again with the same values
    changes(db, table, s, 3, batch)
    assert written(caplog, s, 3) == 4
    assert db.rows(table) == final
    assert tombstones(db, s) == [(1, 5), (3, 9)]


@pytest.mark.doc_case("error/ApplyError")
def test_a_key_changing_twice_without_a_sequence_fails_the_batch(db: Target, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="xasink.protocol.apply_step")
    table = db.new_table()
    db.create_table(table, "id int PRIMARY KEY, name varchar(20), seq bigint")
    db.execute(f"INSERT INTO {db.q(table)} VALUES (1, 'a', 1), (2, 'b', 1)")
    s = sink()
    once: Partitions = [[(1, "a2", 2, False), (3, "c", 1, False)], [(2, None, 2, True)]]
    changes(db, table, s, 0, once, sequence=False)
    assert written(caplog, s, 0) == 2
    assert db.rows(table) == [(1, "a2", 2), (3, "c", 1)]
    twice: Partitions = [[(1, "x", 3, False)], [(1, None, 4, True), (4, "d", 1, False)]]
    with raises(ApplyError, match=r"key \(1\) changes more than once"):
        changes(db, table, s, 1, twice, sequence=False)
    assert db.rows(table) == [(1, "a2", 2), (3, "c", 1)]
    assert shadow_rows(db) == 0 and db.prepared(s) == []


def test_a_change_data_apply_never_waits_on_another_runs_branch_of_the_shadow(
    db: Target, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A branch of another run of the same batch, prepared into the shadow and never decided, while the decided
    run applies (held after its commits): the apply neither waits on it nor reads its rows."""
    table = db.new_table()
    db.create_table(table, "id int PRIMARY KEY, name varchar(20), seq bigint")
    db.execute(f"INSERT INTO {db.q(table)} VALUES (1, 'a', 1), (2, 'b', 1), (3, 'c', 1)")
    caplog.set_level(logging.INFO, logger="xasink.protocol.apply_step")
    s = sink()
    opts: dict[str, Any] = {"controlLockTimeout": 2, "commitTimeout": 8}  # a wait on the stray's rows fails the write
    mine: Partitions = [[(1, "a2", 2, False), (2, None, 2, True)], [(4, "d", 2, False), (1, "a3", 3, False)]]
    with held_at(monkeypatch, "driver.after_commits") as hold, ThreadPoolExecutor(1) as pool:
        job = pool.submit(changes, db, table, s, 0, mine, **opts)
        hold.wait(what=lambda: job.done() and job.exception())
        stray_rows = [(1, "stray", 9, False), (3, None, 9, True), (5, "stray", 9, False)]
        stray = prepare_stray_branch(db.url, table, s, 0, stray_rows, COLUMNS, "append", **OPTIONS, **opts)
        assert not job.done()
        hold.release()
        job.result(timeout=120)
    assert written(caplog, s, 0) == 2
    assert db.rows(table) == [(1, "a3", 3), (3, "c", 1), (4, "d", 2)]
    assert db.prepared(s) == [stray] if db.kind == POSTGRESQL else len(db.prepared(s)) == 1  # left to its run
    report = admin.recover(db.url, sink_id=s, older_than_s=0)
    assert not report.errors, report.errors
    assert_settled(db, s)
    assert db.rows(table) == [(1, "a3", 3), (3, "c", 1), (4, "d", 2)]


def test_a_role_that_may_not_create_temporary_tables_is_refused_before_any_branch(db: Target) -> None:
    """The apply computes the newest change per key in a temporary table: a role without that privilege is told
    what to grant when the write is planned, not after the decision (when nothing could undo it)."""
    import sqlalchemy as sa

    from tests.targets import mariadb_params
    from xasink.database_url import parse_url
    from xasink.dialects import dialect_for
    from xasink.errors import PreflightError
    from xasink.write_modes.changes import check_changes_table
    from xasink.write_modes.spec import CHANGES, ApplySpec

    table, role = f"t_{uuid.uuid4().hex[:8]}", f"notemp_{uuid.uuid4().hex[:8]}"
    spec = ApplySpec(CHANGES, None, table, table, ("id", "name", "seq"), keys=("id",), sequence="seq")
    shadow = sa.table(table, *(sa.column(c) for c in spec.columns))
    url = parse_url(db.url, password=db.password)
    create = f"CREATE TABLE {db.q(table)} (id int primary key, name text, seq bigint)"
    if db.kind == POSTGRESQL:
        home = f"{role}_db"
        db.execute(f"CREATE DATABASE {db.q(home)}")
        url = url.set(database=home)
        setup = [
            f"REVOKE TEMPORARY ON DATABASE {db.q(home)} FROM PUBLIC",
            f"CREATE ROLE {db.q(role)} LOGIN PASSWORD 'pw-secret'",
            create,
            f"GRANT SELECT ON {db.q(table)} TO {db.q(role)}",
        ]
        drop = [f"DROP DATABASE IF EXISTS {db.q(home)}", f"DROP ROLE IF EXISTS {db.q(role)}"]
    else:
        db.tables.append(table)
        host = mariadb_params(db.url)["host"]
        setup = [
            create,
            f"CREATE USER '{role}'@'{host}' IDENTIFIED BY 'pw-secret'",
            f"GRANT SELECT ON {db.q(table)} TO '{role}'@'{host}'",
        ]
        drop = [f"DROP USER IF EXISTS '{role}'@'{host}'"]
    try:
        owner = dialect_for(url)
        with owner.connect() as conn:
            for statement in setup:
                conn.exec_driver_sql(statement)
                conn.commit()
            check_changes_table(owner, conn, spec, shadow)  # a role that may: nothing to say
        owner.dispose()
        dialect = dialect_for(url.set(username=role, password="pw-secret"))
        with dialect.connect() as conn, pytest.raises(PreflightError, match="temporary table") as err:
            check_changes_table(dialect, conn, spec, shadow)
        dialect.dispose()
        assert "GRANT" in str(err.value) and "pw-secret" not in str(err.value), err.value
    finally:
        for statement in drop:
            db.execute(statement)


TRIGGER = "an insert trigger"
SHAPES = {
    "the key its only unique index": [],
    "another unique index": ["CREATE UNIQUE INDEX {t}_name ON {q} (name, id)"],
    # MariaDB: an INSERT trigger that marks the rows it sees; updated rows must not pass through it
    "an insert trigger": [
        "CREATE TRIGGER {t}_mark BEFORE INSERT ON {q} FOR EACH ROW SET NEW.name = CONCAT(NEW.name, '+')"
    ],
}


@pytest.mark.parametrize(
    ("db", "shape"),
    [case(kind, shape) for shape in SHAPES for kind in (POSTGRESQL, MARIADB) if (kind, shape) != (POSTGRESQL, TRIGGER)],
    indirect=["db"],
)  # PostgreSQL's ON CONFLICT passes every row through BEFORE INSERT triggers: the trigger case is MariaDB's
def test_the_merge_writes_the_same_rows_whatever_the_tables_unique_indexes_and_triggers(
    db: Target, caplog: pytest.LogCaptureFixture, shape: str
) -> None:
    """MariaDB merges by one ``INSERT .. ON DUPLICATE KEY UPDATE`` only when the key is the table's only unique
    index and no trigger is on it, else by an UPDATE then an INSERT: both leave the same rows and report the
    same rows written (updated or inserted; not the rows left alone because the stored row is newer)."""
    caplog.set_level(logging.INFO, logger="xasink.protocol.apply_step")
    table = db.new_table()
    db.create_table(table, "id int PRIMARY KEY, name varchar(20), seq bigint")
    db.execute(f"INSERT INTO {db.q(table)} VALUES (1, 'a', 5), (2, 'b', 5), (3, 'c', 5), (4, 'd', NULL)")
    for statement in SHAPES[shape]:
        db.execute(statement.format(t=table, q=db.q(table)))
    s = sink()
    batch = [
        [(1, "a6", 6, False), (2, "b4", 4, False), (5, "e", 1, False)],  # newer, older, new
        [(3, "c5", 5, False), (4, "d1", 1, False), (6, "f", 2, False), (6, "f3", 3, False)],  # equal, NULL, new
    ]
    changes(db, table, s, 0, batch)
    mark = "+" if shape == "an insert trigger" else ""
    final = [(1, "a6", 6), (2, "b", 5), (3, "c5", 5), (4, "d1", 1), (5, f"e{mark}", 1), (6, f"f3{mark}", 3)]
    assert db.rows(table) == final
    assert written(caplog, s, 0) == 5  # all but key 2, whose stored row is newer
    replay = [[(2, "b3", 3, False), (1, "a5", 5, False)]]  # both older: nothing written
    changes(db, table, s, 1, replay)
    assert written(caplog, s, 1) == 0
    assert db.rows(table)[:2] == [(1, "a6", 6), (2, "b", 5)]
    assert shadow_rows(db) == 0 and db.prepared(s) == []


def test_a_time_sequence_keeps_the_stored_time_of_a_row_left_alone(
    db: Target, caplog: pytest.LogCaptureFixture
) -> None:
    """The sequence may be a change time: a row left alone keeps its stored time exactly (the merge counts the
    rows it leaves alone without touching their values)."""
    import datetime as dt

    caplog.set_level(logging.INFO, logger="xasink.protocol.apply_step")
    table = db.new_table()
    stamp = "timestamp(6)" if db.kind == POSTGRESQL else "datetime(6)"
    db.create_table(table, f"id int PRIMARY KEY, name varchar(20), at {stamp}")
    at = [dt.datetime(2026, 11, 27, 8, 0, 0, 123456) + dt.timedelta(minutes=m) for m in range(4)]
    db.execute(f"INSERT INTO {db.q(table)} VALUES (1, 'a', %s), (2, 'b', %s)", at[2], at[2])
    columns = {"id": "int", "name": "string", "at": "timestamp_ntz", "deleted": "boolean"}
    opts = {"upsertKeyColumns": "id", "deleteFlagColumn": "deleted", "sequenceColumn": "at"}
    s = sink()
    rows = [[(1, "a3", at[3], False), (2, "b1", at[1], False)], [(3, "c", at[0], False)]]
    batch_direct(db.url, table, s, 0, columns, rows, "append", **opts)
    assert db.rows(table) == [(1, "a3", at[3]), (2, "b", at[2]), (3, "c", at[0])]
    assert written(caplog, s, 0) == 2


@pytest.mark.parametrize(
    ("mode", "extra"),
    [
        ("changes", ""),
        ("changes", "another unique index"),
        ("overwrite", "true"),  # the branches load by LOAD DATA
        ("overwrite", "false"),  # by multi-row INSERT
    ],
)
def test_column_names_with_percent_signs(db: Target, caplog: pytest.LogCaptureFixture, mode: str, extra: str) -> None:
    """'%' in a column name (the key's included) reaches the server as written, in the branches' statements and
    in the apply's, whichever way they are run."""
    caplog.set_level(logging.INFO, logger="xasink.protocol.apply_step")
    key, name = "id%s", "na%(me)s %"
    table = db.new_table()
    db.create_table(table, f"{db.q(key)} int PRIMARY KEY, {db.q(name)} varchar(20), seq bigint")
    if extra == "another unique index":
        db.execute(f"CREATE UNIQUE INDEX {table}_n ON {db.q(table)} ({db.q(name)}, {db.q(key)})")
    db.execute(f"INSERT INTO {db.q(table)} VALUES (1, 'a', 1), (2, 'b', 1)")
    s = sink()
    if mode == "changes":
        columns = {key: "int", name: "string", "seq": "long", "deleted": "boolean"}
        opts = {"upsertKeyColumns": key, "deleteFlagColumn": "deleted", "sequenceColumn": "seq"}
        rows: Partitions = [[(1, "a2", 2, False), (3, "c", 2, False)], [(2, None, 2, True), (1, "a0", 0, False)]]
        batch_direct(db.url, table, s, 0, columns, rows, "append", **opts)
        assert db.rows(table) == [(1, "a2", 2), (3, "c", 2)]
        assert written(caplog, s, 0) == 2
    else:
        columns = {key: "int", name: "string", "seq": "long"}
        rows = [[(5, "e", 1), (6, "f", 1)], [(1, "a9", 9)]]
        batch_direct(db.url, table, s, 0, columns, rows, "overwrite", localInfile=extra)
        assert db.rows(table) == [(1, "a9", 9), (5, "e", 1), (6, "f", 1)]
    assert shadow_rows(db) == 0 and db.prepared(s) == []


@pytest.mark.parametrize("db", [case(MARIADB)], indirect=True)
def test_a_unique_index_made_while_the_merge_reads_the_tables_indexes_waits_for_the_apply(
    db: Target, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """MariaDB's merge reads the table's unique indexes inside the apply's transaction: that read holds the
    table, so an index another session makes right after it waits for the apply's commit, and the merge's
    INSERT .. ON DUPLICATE KEY UPDATE never meets a unique index it did not see (there it would update the row of
    another key).  A change-data write with a sequence and no delete flag touches the table first in the merge."""
    from xasink.dialects.mysql import merge

    caplog.set_level(logging.INFO, logger="xasink.protocol.apply_step")
    table = db.new_table()
    db.create_table(table, "id int PRIMARY KEY, name varchar(20), seq bigint")
    db.execute(f"INSERT INTO {db.q(table)} VALUES (1, 'a', 1), (2, 'b', 1)")
    read = merge.key_is_only_unique
    made: list[str] = []

    def then_an_index(conn: Any, target: Any, keys: list[str]) -> bool:
        only = read(conn, target, keys)
        with db.connect() as other, other.cursor() as cur:
            cur.execute("SET SESSION lock_wait_timeout = 1")
            try:
                cur.execute(f"CREATE UNIQUE INDEX {table}_name ON {db.q(table)} (name)")
                made.append("at once")
            except Exception as exc:  # the lock wait, when the apply holds the table
                made.append(str(exc))
        return only

    monkeypatch.setattr(merge, "key_is_only_unique", then_an_index)
    s = sink()
    columns = {"id": "int", "name": "string", "seq": "long"}
    opts = {"upsertKeyColumns": "id", "sequenceColumn": "seq"}
    batch_direct(db.url, table, s, 0, columns, [[(3, "a", 2)]], "append", **opts)  # a new key, 1's name
    assert made and made[0] != "at once", made
    assert db.rows(table) == [(1, "a", 1), (2, "b", 1), (3, "a", 2)]
    assert written(caplog, s, 0) == 1


@pytest.mark.parametrize("db", [case(MARIADB)], indirect=True)
@pytest.mark.parametrize("collation", ["utf8mb4_bin", "utf8mb4_unicode_ci"])
def test_a_string_key_compares_as_the_tables_default_collation_says(
    db: Target, caplog: pytest.LogCaptureFixture, collation: str
) -> None:
    """A string key whose collation is the table's default (reflection names none for the column) compares in
    the shadow and the apply's temporary table as in the target: with utf8mb4_bin, 'a' and 'A' are two keys
    (a shadow of utf8mb4's default collation made them one change, applied to one of them, the other lost);
    with utf8mb4_unicode_ci the key columns compare without an illegal mix of collations (the decided batch
    could never be applied)."""
    caplog.set_level(logging.INFO, logger="xasink.protocol.apply_step")
    table = _collated_table(db, collation)
    db.execute(f"INSERT INTO {db.q(table)} VALUES ('a', 'x', 1)")
    s, columns = sink(), STRING_KEYED
    batch: Partitions = [[("A", "big", 7, False), ("a", "small", 8, False)], [("b", None, 2, True)]]
    batch_direct(db.url, table, s, 0, columns, batch, "append", **OPTIONS)
    if collation == "utf8mb4_bin":
        assert sorted(db.rows(table)) == [("A", "big", 7), ("a", "small", 8)]
        assert written(caplog, s, 0) == 2
    else:  # one key: the newest change wins
        assert db.rows(table) == [("a", "small", 8)]
        assert written(caplog, s, 0) == 1
    assert tombstones(db, s) == [("b", 2)]


@pytest.mark.parametrize("db", [case(MARIADB)], indirect=True)
def test_shadow_and_tombstones_an_earlier_xasink_made_take_the_tables_collation(
    db: Target, caplog: pytest.LogCaptureFixture
) -> None:
    """Shadow and tombstone tables made before they took the target's table collation (utf8mb4's default
    instead of the table's utf8mb4_bin): the next write gives their columns the table's collation in place,
    keeping the deleted keys; 'a' and 'A' are then two keys."""
    caplog.set_level(logging.INFO, logger="xasink.protocol.apply_step")
    table, s = _collated_sink(db, "utf8mb4_bin")
    made = _general_ci(db, s, "shadow", "tombstones")
    batch = [[("A", "big", 7, False)], [("a", "small", 8, False), ("B", "back", 1, False)]]
    batch_direct(db.url, table, s, 1, STRING_KEYED, batch, "append", **OPTIONS)
    assert sorted(db.rows(table)) == [("A", "big", 7), ("B", "back", 1), ("a", "small", 8)]
    assert written(caplog, s, 1) == 3
    assert tombstones(db, s) == [("b", 2)]  # 'B' is another key: its insert keeps 'b' deleted
    for name in made.values():
        collations = db.execute(
            "SELECT DISTINCT collation_name FROM information_schema.columns WHERE table_schema = DATABASE() "
            "AND table_name = %s "
            "AND collation_name IS NOT NULL AND column_name IN ('id', 'name')",  # the shadow's own columns aside
            name,
        )
        assert collations == [("utf8mb4_bin",)], (name, collations)


STRING_KEYED = {"id": "string", "name": "string", "seq": "long", "deleted": "boolean"}


def _collated_table(db: Target, collation: str) -> str:
    """A MariaDB table keyed by a string whose collation is the table's default (reflection names none)."""
    table = db.new_table()
    db.execute(
        f"CREATE TABLE {db.q(table)} (id varchar(10) PRIMARY KEY, name varchar(20), seq bigint) "
        f"ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE={collation}"
    )
    return table


def _collated_sink(db: Target, collation: str, first: tuple[Any, ...] = ("a", "x", 1, False)) -> tuple[str, str]:
    """A :func:`_collated_table` and a change-data sink whose batch 0 wrote ``first`` and deleted key 'b'."""
    table, s = _collated_table(db, collation), sink()
    batch_direct(db.url, table, s, 0, STRING_KEYED, [[first, ("b", None, 2, True)]], "append", **OPTIONS)
    return table, s


def _general_ci(db: Target, s: str, *names: str) -> dict[str, str]:
    """The sink's shadow (and tombstone) tables as an earlier xasink made them: utf8mb4's default collation."""
    log_id = Xid.parse(db.decision(s, 0).xids[0]).log_id  # type: ignore[union-attr]
    made = {"shadow": shadow_name("xasink_", log_id, s), "tombstones": tombstone_name("xasink_", log_id, s)}
    for name in names:
        db.execute(f"ALTER TABLE {db.q(made[name])} CONVERT TO CHARACTER SET utf8mb4 COLLATE utf8mb4_general_ci")
    return {name: made[name] for name in names}


@pytest.mark.parametrize("db", [case(MARIADB)], indirect=True)
@pytest.mark.parametrize("collation", ["utf8mb4_bin", "utf8mb4_unicode_ci"])
def test_a_shadow_an_earlier_xasink_made_holding_a_decided_batch_takes_the_tables_collation(
    db: Target, monkeypatch: pytest.MonkeyPatch, collation: str
) -> None:
    """A shadow of utf8mb4's default collation holding a decided batch not applied yet is mended in place at
    the next write, its rows kept: the next batch's 'a' and 'A' are two keys of a utf8mb4_bin table (a shadow
    kept as it was made them one change, applied to the other's key), and with utf8mb4_unicode_ci both batches
    apply (a kept shadow failed every apply with an illegal mix of collations)."""
    table, s = _collated_sink(db, collation)
    columns = STRING_KEYED
    monkeypatch.setenv("XASINK_FAULT", "driver.after_commits:raise:b=1")
    with pytest.raises(Exception, match="injected fault"):
        batch_direct(
            db.url, table, s, 1, columns, [[("c", "c1", 3, False)], [("d", "d1", 3, False)]], "append", **OPTIONS
        )
    monkeypatch.delenv("XASINK_FAULT")
    _general_ci(db, s, "shadow", "tombstones")
    batch = [[("a", "small", 9, False)], [("A", "big", 10, False)]]
    batch_direct(db.url, table, s, 2, columns, batch, "append", **OPTIONS)
    report = admin.recover(db.url, sink_id=s, older_than_s=0)  # batch 1, decided and loaded before the upgrade
    assert not report.unfinished, report
    expected = [("A", "big", 10), ("a", "small", 9)] if collation == "utf8mb4_bin" else [("a", "big", 10)]
    assert sorted(db.rows(table)) == sorted([*expected, ("c", "c1", 3), ("d", "d1", 3)])
    assert shadow_rows(db) == 0 and db.prepared(s) == []


@pytest.mark.parametrize("db", [case(MARIADB)], indirect=True)
def test_a_shadow_an_earlier_xasink_made_keeps_a_decided_batch_whose_branches_commit_while_it_is_mended(
    db: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The branches of a decided batch still prepared in a shadow of utf8mb4's default collation (its driver
    died; an earlier xasink): the rows are invisible to the next write's mend, which waits for the branches'
    table lock; recovery commits them meanwhile, and the mend keeps their rows (dropping the 'empty' shadow
    lost the batch)."""
    table, s = _collated_sink(db, "utf8mb4_bin")
    columns = STRING_KEYED
    _general_ci(db, s, "shadow", "tombstones")
    with monkeypatch.context() as m:  # an earlier xasink: no mend; its driver dies once the batch is decided
        m.setattr("xasink.write_modes.statements.collation_drift", lambda *_: [])
        m.setenv("XASINK_FAULT", "driver.after_decide:raise:b=1")
        with pytest.raises(Exception, match="injected fault"):
            batch_direct(
                db.url, table, s, 1, columns, [[("c", "c1", 3, False)], [("d", "d1", 3, False)]], "append", **OPTIONS
            )
    assert len(db.prepared(s)) == 2
    with ThreadPoolExecutor(1) as pool:
        later = pool.submit(batch_direct, db.url, table, s, 2, columns, [[("e", "e1", 4, False)]], "append", **OPTIONS)
        # the mend's ALTER of the shadow waits for the prepared branches' locks ('Committing alter table to
        # storage engine', or waiting for the metadata lock)
        mending = (
            "SELECT ID FROM information_schema.PROCESSLIST WHERE DB = DATABASE() AND ID <> CONNECTION_ID() "
            "AND INFO LIKE 'ALTER TABLE xasink\\_sh\\_%'"
        )
        wait_for(lambda: db.execute(mending) or later.done(), 180, "the mend to wait for the branches' locks")
        assert not later.done(), later.result()
        report = admin.recover(db.url, sink_id=s, older_than_s=0)
        later.result()
    assert not report.unfinished, report
    assert db.rows(table) == [("a", "x", 1), ("c", "c1", 3), ("d", "d1", 3), ("e", "e1", 4)]
    assert shadow_rows(db) == 0 and db.prepared(s) == []


@pytest.mark.parametrize("db", [case(MARIADB)], indirect=True)
def test_tombstones_an_earlier_xasink_made_whose_keys_are_one_under_the_tables_collation(db: Target) -> None:
    """Tombstones of utf8mb4's default collation holding 'ß' and 'ss' (two keys there, one under the target's
    utf8mb4_unicode_ci) cannot take the table's collation: the write is refused before any branch, naming the
    tombstone table and what to delete; once the older tombstone is gone the write goes through."""
    from xasink.errors import PreflightError

    table, s = _collated_sink(db, "utf8mb4_unicode_ci", first=("x", "x", 1, False))
    columns = STRING_KEYED
    tomb = _general_ci(db, s, "tombstones")["tombstones"]
    db.execute(f"INSERT INTO {db.q(tomb)} VALUES ('ß', 5), ('ss', 6)")
    batch = [[("ß", "old", 5, False), ("y", "y", 7, False)]]
    with pytest.raises(PreflightError, match=rf"{tomb}.*Duplicate entry.*delete the older of them from {tomb}"):
        batch_direct(db.url, table, s, 1, columns, batch, "append", **OPTIONS)
    assert db.rows(table) == [("x", "x", 1)] and db.prepared(s) == [] and shadow_rows(db) == 0
    db.execute(f"DELETE FROM {db.q(tomb)} WHERE id = 'ß' AND seq = 5")
    batch_direct(db.url, table, s, 1, columns, batch, "append", **OPTIONS)
    assert db.rows(table) == [("x", "x", 1), ("y", "y", 7)]  # 'ß' at 5 is older than the delete of 'ss' at 6


def test_a_shadow_whose_table_changed_is_not_dropped_while_a_decided_batch_is_prepared_in_it(
    db: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A decided batch's branches still prepared in the shadow (its driver died), then a column added to the
    table: the next write would make the shadow anew, but its rows are invisible to a count and a DROP would
    wait for them, then lose them once recovery commits. It is refused, naming 'xasink recover'; after the
    recovery the batch is in the table and the next write makes the shadow anew."""
    from xasink.errors import PreflightError

    table = db.new_table()
    db.create_table(table, "id int PRIMARY KEY, name varchar(20), seq bigint")
    s = sink()
    changes(db, table, s, 0, [[(1, "a", 1, False)]])
    monkeypatch.setenv("XASINK_FAULT", "driver.after_decide:raise:b=1")
    with pytest.raises(Exception, match="injected fault"):
        changes(db, table, s, 1, [[(2, "b", 1, False)], [(3, "c", 1, False)]])
    monkeypatch.delenv("XASINK_FAULT")
    assert len(db.prepared(s)) == 2
    db.execute(f"ALTER TABLE {db.q(table)} ADD COLUMN note varchar(10)")
    columns = {"id": "int", "name": "string", "seq": "long", "note": "string", "deleted": "boolean"}
    later = [[(4, "d", 1, "new", False)]]
    with pytest.raises(PreflightError, match=r"2 prepared branch\(es\).*xasink recover"):
        batch_direct(db.url, table, s, 2, columns, later, "append", **OPTIONS)
    report = admin.recover(db.url, sink_id=s, older_than_s=0)
    assert not report.unfinished, report
    assert db.rows(table) == [(1, "a", 1, None), (2, "b", 1, None), (3, "c", 1, None)]
    batch_direct(db.url, table, s, 2, columns, later, "append", **OPTIONS)
    assert db.rows(table)[-1] == (4, "d", 1, "new")


@pytest.mark.parametrize("mode", ["overwrite", "replaceWhere", "changes"])
def test_a_table_name_with_percent_signs(db: Target, mode: str) -> None:
    """'%' in the target table's name reaches the server as written in every statement of the apply (the
    foreign keys' lookup binds the name as a value: never SQLAlchemy's doubled form)."""
    table = db.new_table() + "%s %(x)s %%"
    db.create_table(table, f"id int PRIMARY KEY, {db.q('na%me')} varchar(20), seq bigint")
    db.execute(f"INSERT INTO {db.q(table)} VALUES (1, 'a', 1), (2, 'b', 1)")
    s = sink()
    columns = {"id": "int", "na%me": "string", "seq": "long"}
    if mode == "changes":
        rows: Partitions = [[(1, "a2", 2, False)], [(2, None, 2, True)]]
        batch_direct(db.url, db.q(table), s, 0, {**columns, "deleted": "boolean"}, rows, "append", **OPTIONS)
        assert db.rows(table) == [(1, "a2", 2)]
    else:
        where = {"replaceWhere": "id >= 2"} if mode == "replaceWhere" else {}
        batch_direct(db.url, db.q(table), s, 0, columns, [[(2, "b2", 2)], [(7, "g", 1)]], "overwrite", **where)
        assert db.rows(table) == ([(1, "a", 1)] if where else []) + [(2, "b2", 2), (7, "g", 1)]
    assert shadow_rows(db) == 0 and db.prepared(s) == []


def test_a_batch_that_inserts_no_row_is_applied_under_a_required_column(db: Target) -> None:
    """A NOT NULL column without a default that the batches do not write (FOUND.md 8.7): a delete-only batch
    deletes its key and an empty batch is written; only a batch that inserts a row is refused (ApplyError:
    its rows break the table).  Fails on main on MariaDB: it checks an INSERT .. SELECT's columns when it
    prepares it, even when no row is selected (1364), so both batches were withdrawn and key 2 stayed."""
    table = db.new_table()
    db.create_table(table, "id int PRIMARY KEY, name varchar(20), seq bigint, req int NOT NULL")
    db.execute(f"INSERT INTO {db.q(table)} VALUES (1, 'a', 1, 10), (2, 'b', 1, 20), (3, 'c', 1, 30)")
    s = sink()
    changes(db, table, s, 0, [[(2, None, 2, True)]])  # deletes only
    assert db.rows(table) == [(1, "a", 1, 10), (3, "c", 1, 30)]
    changes(db, table, s, 1, [[]])  # nothing at all
    assert db.rows(table) == [(1, "a", 1, 10), (3, "c", 1, 30)]
    assert [d.state for d in db.decisions(s).values()] == ["committed", "committed"]
    with pytest.raises(ApplyError):  # a row inserted without the required column: the rows are wrong
        changes(db, table, s, 2, [[(9, "new", 3, False)]])
    assert db.rows(table) == [(1, "a", 1, 10), (3, "c", 1, 30)]
    assert sorted(db.decisions(s)) == [0, 1] and shadow_rows(db) == 0 and db.prepared(s) == []
