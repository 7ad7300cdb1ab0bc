"""MariaDB: an overwrite renames a new table into the target's place, and keeps what users see.

The branches load the shadow; the apply makes a table ``LIKE`` the target, loads the batch into it and runs
``RENAME TABLE t TO witness, new TO t`` (xasink/protocol/renamed_overwrite.py).  Checked here on the real server,
before and after one overwrite: the definition (columns, defaults, indexes, CHECK constraints, comments, table
options), grants to another user on the table and a column, a view on the table, the next AUTO_INCREMENT value,
the table's statistics (analyzed) and its storage (a new InnoDB table id: the swap happened).  Triggers, foreign
keys either way, a definition ``LIKE`` does not copy, a session keeping the
table open and an older REPEATABLE READ snapshot make it overwrite in place instead (the table id stays, the log
says why), with the same rows.  Kills at each step: tests/test_write_modes_crash.py; readers:
tests/test_write_modes.py.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.harness import expected, own_mariadb, run_driver, storage_of, swap_tables
from tests.modes_driver import batch_direct, split
from tests.procs import ROOT
from tests.targets import MARIADB, Target, case

pytestmark = pytest.mark.parametrize("db", [case(MARIADB)], indirect=True)


@pytest.fixture(scope="module")
def mariadb_url() -> Iterator[str]:
    """A server of this module's own (:func:`tests.harness.own_mariadb`): the rename must not meet other files'
    snapshots."""
    yield from own_mariadb("rename")


COLUMNS = {"id": "int", "name": "string"}
DRIVER = ROOT / "tests" / "modes_driver.py"
NEW = expected(range(200, 500))
SWAPPED = "by a swap"
IN_PLACE = "not by a swap"


def overwrite(db: Target, table: str, **options: Any) -> Any:
    return batch_direct(db.url, table, f"rn-{uuid.uuid4().hex[:8]}", 1, COLUMNS, split(200, 300, 3), **options)


def in_schema(db: Target, query: str, *params: Any) -> list[tuple[Any, ...]]:
    return db.execute(query.replace("{here}", "TABLE_SCHEMA = DATABASE()"), *params)


def what_users_see(db: Target, table: str, grantee: str) -> dict[str, Any]:
    """The table's definition and everything around it that an overwrite must keep (its storage aside)."""
    definition = db.execute(f"SHOW CREATE TABLE {db.q(table)}")[0][1]
    user = f"'{grantee}'@'localhost'"
    return {
        "definition": " ".join(w for w in definition.split() if not w.startswith("AUTO_INCREMENT=")),
        "table grants": in_schema(
            db,
            "SELECT PRIVILEGE_TYPE, IS_GRANTABLE FROM information_schema.TABLE_PRIVILEGES "
            "WHERE GRANTEE = %s AND {here} AND TABLE_NAME = %s ORDER BY 1",
            user,
            table,
        ),
        "column grants": in_schema(
            db,
            "SELECT COLUMN_NAME, PRIVILEGE_TYPE FROM information_schema.COLUMN_PRIVILEGES "
            "WHERE GRANTEE = %s AND {here} AND TABLE_NAME = %s ORDER BY 1, 2",
            user,
            table,
        ),
        "index comments": in_schema(
            db,
            "SELECT DISTINCT INDEX_NAME, INDEX_COMMENT FROM information_schema.STATISTICS "
            "WHERE {here} AND TABLE_NAME = %s ORDER BY 1",
            table,
        ),
    }


@pytest.fixture
def grantee(db: Target) -> Iterator[str]:
    with db.no_login_role("rn_r") as name:
        yield name


def made_table(db: Target, table: str, grantee: str) -> None:
    """A table with something of everything the copy must carry, filled with 300 old rows (AUTO_INCREMENT drawn)."""
    t, g = db.q(table), f"'{grantee}'@'localhost'"
    db.create_table(
        table,
        "id int PRIMARY KEY, name varchar(40) NOT NULL COMMENT 'the name', "
        "n bigint NOT NULL AUTO_INCREMENT, at datetime(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3), "
        f"UNIQUE KEY {db.q(table + '_n')} (n), KEY {db.q(table + '_nm')} (name(8)) COMMENT 'an index comment', "
        f"CONSTRAINT {db.q(table + '_ck')} CHECK (name <> '')",
    )
    for statement in (
        f"ALTER TABLE {t} COMMENT = 'kept by the swap', STATS_PERSISTENT = 1, ROW_FORMAT = DYNAMIC",
        f"GRANT SELECT, INSERT ON {t} TO {g} WITH GRANT OPTION",
        f"GRANT UPDATE (name) ON {t} TO {g}",
        f"INSERT INTO {t} (id, name) SELECT seq, concat('o', seq) FROM seq_0_to_299",
    ):
        db.execute(statement)


def test_a_renamed_overwrite_keeps_what_users_see(db: Target, grantee: str, caplog: pytest.LogCaptureFixture) -> None:
    table, view = db.new_table(), db.new_table()
    made_table(db, table, grantee)
    db.execute(f"CREATE VIEW {db.q(view)} AS SELECT id, name FROM {db.q(table)} WHERE id >= 250")
    try:
        before, storage = what_users_see(db, table, grantee), storage_of(db, table)
        counter = db.serial_high_water(table) + 1
        assert (
            counter > 300 and before["table grants"] and before["column grants"] and len(before["index comments"]) == 3
        )
        with caplog.at_level(logging.INFO, logger="xasink"):
            result = overwrite(db, table)
        assert result.rows == 300
        assert SWAPPED in caplog.text and IN_PLACE not in caplog.text, caplog.text
        assert storage_of(db, table) != storage  # the storage was swapped
        after = what_users_see(db, table, grantee)
        for name in before:
            assert after[name] == before[name], name
        assert [r[:2] for r in db.rows(table, "id")] == NEW
        # the view binds the name: it reads the new rows
        assert db.execute(f"SELECT count(*), min(id) FROM {db.q(view)}")[0] == (250, 250)
        # AUTO_INCREMENT goes on from the old table's counter: above its rows' 1..300 (a new table would start at
        # 1 again), at most where it stood (InnoDB reserves ahead for INSERT ... SELECT and forgets what it
        # reserved when it opens the table again)
        low, high = db.execute(f"SELECT min(n), max(n) FROM {db.q(table)}")[0]
        assert 300 < low <= counter and high == low + 299, (low, high, counter)
        db.execute(f"INSERT INTO {db.q(table)} (id, name) VALUES (-1, 'later')")
        assert db.execute(f"SELECT n FROM {db.q(table)} WHERE id = -1")[0][0] > high
        # analyzed: the optimizer's statistics count the new rows
        stats = "SELECT n_rows FROM mysql.innodb_table_stats WHERE database_name = DATABASE() AND table_name = %s"
        assert db.execute(stats, table) == [(300,)]
        assert swap_tables(db) == [] and db.prepared() == []
    finally:
        db.execute(f"DROP VIEW IF EXISTS {db.q(view)}")


@pytest.fixture
def data_directory() -> Iterator[str]:
    """A directory the server (the machine's service, user ``mysql``) may keep a table's file in."""
    import pwd

    where = tempfile.mkdtemp(prefix="xasink-dd-", dir="/tmp")
    user = pwd.getpwnam("mysql")
    os.chown(where, user.pw_uid, user.pw_gid)
    try:
        yield where
    finally:
        shutil.rmtree(where, ignore_errors=True)


# what makes the table overwrite in place: statements ({t} the table, {o} another name, {d} a data directory)
FALLBACKS: dict[str, tuple[Any, ...]] = {
    "trigger": (["CREATE TRIGGER {o} BEFORE INSERT ON {t} FOR EACH ROW SET NEW.name = NEW.name"], "triggers"),
    "references": (
        ["CREATE TABLE {o} (id int PRIMARY KEY)", "INSERT INTO {o} SELECT seq FROM seq_0_to_999"],
        "foreign keys",
        "ALTER TABLE {t} ADD FOREIGN KEY (id) REFERENCES {o} (id)",
    ),
    "referenced": (["CREATE TABLE {o} (id int, FOREIGN KEY (id) REFERENCES {t} (id))"], "refer to it"),
    "data-directory": ([], "SHOW CREATE TABLE"),  # (made there: LIKE does not copy DATA DIRECTORY)
}


@pytest.mark.parametrize("binding", sorted(FALLBACKS))
def test_a_table_a_new_one_could_not_stand_for_is_overwritten_in_place(
    db: Target, binding: str, data_directory: str, caplog: pytest.LogCaptureFixture
) -> None:
    table, other = db.new_table(), f"rn_{uuid.uuid4().hex[:8]}"
    setup, why, *after = FALLBACKS[binding]
    assert isinstance(why, str)
    names = {"t": db.q(table), "o": db.q(other), "d": data_directory}
    if binding == "data-directory":
        db.execute(f"CREATE TABLE {db.q(table)} (id int PRIMARY KEY, name text) DATA DIRECTORY = '{data_directory}'")
    else:
        db.keyed_table(table)
    db.execute(f"INSERT INTO {db.q(table)} SELECT seq, concat('o', seq) FROM seq_0_to_299")
    try:
        for statement in [*setup, *after]:
            db.execute(statement.format(**names))
        storage = storage_of(db, table)
        with caplog.at_level(logging.INFO, logger="xasink"):
            overwrite(db, table)
        assert IN_PLACE in caplog.text and why in caplog.text, caplog.text
        assert db.rows(table, "id") == NEW and storage_of(db, table) == storage
        assert swap_tables(db) == [] and db.prepared() == []
    finally:
        if binding == "referenced":
            db.execute(f"DROP TABLE IF EXISTS {db.q(other)}")
        db.execute(f"DROP TABLE IF EXISTS {db.q(table)}")
        db.execute(f"DROP TABLE IF EXISTS {db.q(other)}")


def test_a_session_keeping_the_table_open_makes_it_overwrite_in_place_and_no_reader_waits(
    db: Target, caplog: pytest.LogCaptureFixture
) -> None:
    """A READ COMMITTED report keeps its transaction open on the table (its metadata lock).  The rename asks for
    the exclusive lock only without waiting (a queued request would hold up every new reader), for at most
    controlLockTimeout (here 2 s), then the batch is applied in place; a new reader never waits meanwhile."""
    table = db.new_table()
    db.keyed_table(table)
    db.execute(f"INSERT INTO {db.q(table)} SELECT seq, concat('o', seq) FROM seq_0_to_299")
    storage = storage_of(db, table)
    waits: list[float] = []
    with db.connect() as report, report.cursor() as held, ThreadPoolExecutor(1) as pool:
        held.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
        held.execute("START TRANSACTION")
        held.execute(f"SELECT count(*) FROM {db.q(table)}")
        with caplog.at_level(logging.INFO, logger="xasink"):
            job = pool.submit(overwrite, db, table, controlLockTimeout=2)
            with db.connect() as conn, conn.cursor() as cur:
                while not job.done():
                    t0 = time.monotonic()
                    cur.execute(f"SELECT count(*) FROM {db.q(table)}")
                    waits.append(time.monotonic() - t0)
                    time.sleep(0.02)
            job.result()
        held.execute("COMMIT")
    assert "a session kept it open" in caplog.text, caplog.text
    assert len(waits) > 20 and max(waits) < 0.5, f"a reader waited {max(waits):.2f} s"
    assert storage_of(db, table) == storage and db.rows(table, "id") == NEW
    assert swap_tables(db) == [] and db.prepared() == []


def test_an_older_repeatable_read_snapshot_makes_it_overwrite_in_place(
    db: Target, caplog: pytest.LogCaptureFixture
) -> None:
    """A REPEATABLE READ transaction whose snapshot predates the new table's rows would read the renamed table as
    empty or fail with error 1412 (Table definition has changed): while one is open, the batch is applied in place,
    and that snapshot still reads the old rows, then the new ones once it ends."""
    table = db.new_table()
    db.keyed_table(table)
    db.execute(f"INSERT INTO {db.q(table)} SELECT seq, concat('o', seq) FROM seq_0_to_299")
    storage = storage_of(db, table)
    with db.connect() as conn, conn.cursor() as cur:
        cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT")
        with caplog.at_level(logging.INFO, logger="xasink"):
            overwrite(db, table, controlLockTimeout=1)
        cur.execute(f"SELECT count(*), min(id) FROM {db.q(table)}")
        assert cur.fetchone() == (300, 0)
        cur.execute("COMMIT")
    assert "hold a snapshot older than the new table's rows" in caplog.text, caplog.text
    assert storage_of(db, table) == storage and db.rows(table, "id") == NEW
    assert swap_tables(db) == [] and db.prepared() == []


# --------------------------------------------------------------------------- what the adversary found


def test_one_sink_overwriting_two_tables_at_once_builds_each_apart(db: Target, tmp_path: Path) -> None:
    """One sink's batch 1 overwrites a table and waits between its build and its rename; meanwhile its batch 2
    overwrites another table (two driver processes).  The new table was named by the sink alone: batch 2's build
    dropped batch 1's and made it like its own table, and batch 1's rename put batch 2's rows and definition into
    the first table (adversary).  It is named by the sink and the table now."""
    first, second = db.new_table(), db.new_table()
    db.keyed_table(first)
    db.create_table(second, "id int PRIMARY KEY, name text, only_here int DEFAULT 7")
    for t in (first, second):
        db.execute(f"INSERT INTO {db.q(t)} (id, name) SELECT seq, concat('o', seq) FROM seq_0_to_99")
    s, held = f"rn-{uuid.uuid4().hex[:8]}", "driver.swap_built:sleep=6"

    def run(table: str, batch: int, first_id: int, n: int) -> int:
        args = ["direct", db.url, table, s, str(batch), str(first_id), str(n), "2"]
        return run_driver(DRIVER, args, held, tmp_path / f"{batch}.log")

    with ThreadPoolExecutor(2) as pool:
        one = pool.submit(run, first, 1, 1000, 30)
        deadline = time.monotonic() + 120
        while not swap_tables(db):  # batch 1's new table is built: it sleeps before its rename
            assert time.monotonic() < deadline and not one.done(), "batch 1 never built its new table"
            time.sleep(0.05)
        two = pool.submit(run, second, 2, 5000, 20)
        assert (one.result(timeout=300), two.result(timeout=300)) == (0, 0)
    assert db.rows(first, "id") == expected(range(1000, 1030))
    assert [r[:2] for r in db.rows(second, "id")] == expected(range(5000, 5020))
    assert "only_here" not in db.execute(f"SHOW CREATE TABLE {db.q(first)}")[0][1]
    assert swap_tables(db) == [] and db.prepared() == []


def test_a_session_zone_west_of_the_servers_still_sees_an_older_snapshot(
    db: Target, caplog: pytest.LogCaptureFixture
) -> None:
    """The check of older snapshots compared INNODB_TRX's start times (the server's system zone) with NOW() (the
    session's): with the URL's ``time_zone`` west of the server's, no transaction counted as older, and a
    REPEATABLE READ reader saw the renamed table empty (adversary).  The report's transaction here began before
    the overwrite on another table, so it holds no lock on the target."""
    table, other = db.new_table(), db.new_table()
    db.keyed_table(table)
    db.keyed_table(other)
    db.execute(f"INSERT INTO {db.q(table)} SELECT seq, concat('o', seq) FROM seq_0_to_299")
    zone = db.execute("SELECT TIMESTAMPDIFF(HOUR, UTC_TIMESTAMP(), NOW())")[0][0]
    west = f"{int(zone) - 5:+03d}:00"
    url = f"{db.url}&sessionVariables=time_zone%3D'{west.replace(':', '%3A')}'"
    with db.connect() as conn, conn.cursor() as cur:
        cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        cur.execute("START TRANSACTION")
        cur.execute(f"SELECT count(*) FROM {db.q(other)}")  # its snapshot, taken before the overwrite
        with caplog.at_level(logging.INFO, logger="xasink"):
            result = batch_direct(url, table, f"rn-{uuid.uuid4().hex[:8]}", 1, COLUMNS, split(200, 300, 3))
        assert result.rows == 300
        cur.execute(f"SELECT count(*), min(id) FROM {db.q(table)}")
        assert cur.fetchone() == (300, 0), "a snapshot older than the overwrite lost the old rows"
        cur.execute("COMMIT")
    assert "hold a snapshot older than the new table's rows" in caplog.text, caplog.text
    assert db.rows(table, "id") == NEW and swap_tables(db) == [] and db.prepared() == []
