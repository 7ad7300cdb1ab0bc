"""The decision log's tables (issue 28, items 6, 7 and 9): identities compare byte for byte, a log made by any
earlier released version is upgraded to every column it needs (automatically, and by ``xasink/journal/sql/*.sql``),
and a decision the log cannot store whole fails instead of being truncated.

The earlier layouts are built from their original DDL, kept in ``tests/journal_layouts`` as the oldest layout
plus each later version's additions (see its README).
Every test runs on PostgreSQL and MariaDB and checks the exact rows, the log's layout as the server reports
it, and that nothing is left prepared.
"""

from __future__ import annotations

import re
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import pytest

import xasink
from tests.harness import TargetSink, cli, expected
from tests.modes_driver import overwrite_direct, split
from tests.targets import MARIADB, POSTGRESQL, MariaDBTarget, Target, with_login
from xasink.dialects import dialect_for
from xasink.errors import BatchAbortedError
from xasink.journal.log import Journal
from xasink.journal.parts import ensure_parts
from xasink.ops import ddl
from xasink.ops import survey as admin
from xasink.options import parse_url
from xasink.support.faults import InjectedFault

ROOT = Path(__file__).resolve().parent
LAYOUTS = ("4689743", "0eaf902", "64bf378", "338ceb4", "4f4d6a9")  # oldest first; see journal_layouts/README.md
TABLES = ("log", "sinks", "batches", "claims", "parts")


def sql_name(kind: str) -> str:
    return "postgres" if kind == POSTGRESQL else "mysql"


def statements(text: str, prefix: str) -> list[str]:
    """The statements of a .sql text, comments dropped, the tables renamed to ``prefix``."""
    text = re.sub(r"--[^\n]*", "", text).replace("xasink_", prefix)
    return [s.strip() for s in text.split(";") if s.strip()]


def layout_ddl(kind: str, commit: str) -> str:
    """The DDL that makes the log as the version at ``commit`` created it: the blocks of
    ``journal_layouts/<db>.sql`` up to and including its ``-- LAYOUT <commit>`` block."""
    text = (ROOT / "journal_layouts" / f"{sql_name(kind)}.sql").read_text()
    blocks = re.split(r"^-- LAYOUT (\w+)[^\n]*", text, flags=re.MULTILINE)  # [header, commit, ddl, commit, ddl, ...]
    commits = blocks[1::2]
    return "".join(blocks[2 : 2 * commits.index(commit) + 3 : 2])


def old_log(db: Target, commit: str, prefix: str) -> None:
    """The decision log as the version at ``commit`` created it, with the tables named ``prefix``*."""
    db.tables.extend(prefix + t for t in TABLES)
    for statement in statements(layout_ddl(db.kind, commit), prefix):
        db.execute(statement)


def hand_upgrade(db: Target, prefix: str) -> None:
    """What a DBA runs where writers may not ALTER: the shipped file (its CREATEs make the tables an older log
    lacks), then the upgrade statements it lists between its BEGIN UPGRADE and END UPGRADE lines."""
    text = ddl.ddl(sql_name(db.kind))
    for statement in statements(text, prefix):
        db.execute(statement)
    block = text[text.index("-- BEGIN UPGRADE") : text.index("-- END UPGRADE")].splitlines()[1:]
    upgrade = "\n".join(line.removeprefix("--   ") for line in block if line.startswith("--   "))
    for statement in statements(upgrade, prefix):
        db.execute(statement)


def layout(db: Target, prefix: str) -> dict[str, Any]:
    """The log's tables as the server describes them: columns (type, nullability, default, collation), keys
    and indexes, table collation; table names without their prefix."""
    names = tuple(prefix + t for t in TABLES)
    found: dict[str, Any] = {}
    if db.kind == POSTGRESQL:
        columns = db.execute(
            "SELECT table_name, column_name, data_type, character_maximum_length, is_nullable, column_default, "
            "collation_name FROM information_schema.columns WHERE table_schema = current_schema() "
            "AND table_name IN %s",
            names,
        )
        indexes = db.execute(
            "SELECT tablename, indexname, indexdef FROM pg_indexes WHERE schemaname = current_schema() "
            "AND tablename IN %s",
            names,
        )
        tables: list[tuple[Any, ...]] = []
    else:
        columns = db.execute(
            "SELECT TABLE_NAME, COLUMN_NAME, COLUMN_TYPE, IS_NULLABLE, COLUMN_DEFAULT, COLLATION_NAME, "
            "CHARACTER_SET_NAME FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME IN %s",
            names,
        )
        indexes = db.execute(
            "SELECT TABLE_NAME, INDEX_NAME, NON_UNIQUE, SEQ_IN_INDEX, COLUMN_NAME FROM information_schema.STATISTICS "
            "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME IN %s",
            names,
        )
        tables = db.execute(
            "SELECT TABLE_NAME, ENGINE, TABLE_COLLATION FROM information_schema.TABLES "
            "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME IN %s",
            names,
        )
    for row in [*columns, *indexes, *tables]:
        table = str(row[0])[len(prefix) :]
        rest = tuple(str(v).replace(prefix, "xasink_") if isinstance(v, str) else v for v in row[1:])
        found.setdefault(table, set()).add(rest)
    return found


def fresh_layout(db: Target) -> dict[str, Any]:
    """A log made by this version: created by a writer's first use, its parts table by a transaction's."""
    prefix = f"xn{uuid.uuid4().hex[:6]}_"
    db.tables.extend(prefix + t for t in TABLES)
    auto_upgrade(db, prefix)
    return layout(db, prefix)


def auto_upgrade(db: Target, prefix: str) -> None:
    """What a writer of this version does to the log it finds (creating what is missing), and a transaction."""
    dialect = dialect_for(parse_url(db.url, password=db.password))
    try:
        journal = Journal(dialect, prefix=prefix)
        journal.ensure()
        ensure_parts(journal)
    finally:
        dialect.dispose()


def binary_collations(db: Target, prefix: str) -> set[str]:
    """MariaDB: the collations of the log's text columns and tables (byte-for-byte comparisons: utf8mb4_bin)."""
    names = tuple(prefix + t for t in TABLES)
    found = db.execute(
        "SELECT COLLATION_NAME FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME IN %s "
        "AND COLLATION_NAME IS NOT NULL UNION SELECT TABLE_COLLATION FROM information_schema.TABLES "
        "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME IN %s",
        names,
        names,
    )
    return {str(r[0]) for r in found}


# --------------------------------------------------------------------------- item 7: upgrading earlier logs


@pytest.mark.parametrize("commit", LAYOUTS)
def test_log_of_each_earlier_layout_is_upgraded_by_the_first_write(db: Target, commit: str) -> None:
    """An old log holding a committed batch 3 of a sink: this version's writer upgrades it to every column it
    needs; 3 stays a replay, 4 is written, a rerun of 4 is a replay; the layout is what this version makes."""
    prefix = f"xl{uuid.uuid4().hex[:6]}_"
    old_log(db, commit, prefix)
    table = db.new_table()
    db.keyed_table(table, primary_key=False)
    sink_id = f"lu{uuid.uuid4().hex[:10]}"
    db.execute(f"INSERT INTO {db.q(prefix + 'sinks')} (sink_id, created_at) VALUES (%s, CURRENT_TIMESTAMP)", sink_id)
    db.execute(
        f"INSERT INTO {db.q(prefix + 'batches')} (sink_id, batch_id, state, xids, {db.q('rows')}, branches, "
        "prepare_ms, commit_ms, decided_at, committed_at) "
        "VALUES (%s, 3, 'committed', '[]', 10, 1, 1, 1, CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)",
        sink_id,
    )
    s = TargetSink(db, sink_id=sink_id, table=table, journalTablePrefix=prefix)  # preflight upgrades the log
    assert s.batch(3, range(0, 10)).skipped
    assert not s.batch(4, range(10, 20)).skipped
    assert s.batch(4, range(10, 20)).skipped
    assert s.rows() == expected(range(10, 20))
    assert {b: d.state for b, d in db.decisions(sink_id, prefix).items()} == {3: "committed", 4: "committed"}
    # a log whose trim may have forgotten batches (no target column yet) got its horizon; a newer one none
    horizon = db.execute(f"SELECT horizon FROM {db.q(prefix + 'sinks')} WHERE sink_id = %s", sink_id)
    assert horizon == [(2 if LAYOUTS.index(commit) < LAYOUTS.index("338ceb4") else None,)]
    assert db.prepared(sink_id) == []
    ensure_parts_too = layout(db, prefix)
    ensure_parts_too.pop("parts", None)  # made by a transaction's first use only
    want = fresh_layout(db)
    want.pop("parts")
    assert ensure_parts_too == want
    if db.kind == MARIADB:
        assert binary_collations(db, prefix) == {"utf8mb4_bin"}


@pytest.mark.parametrize("commit", LAYOUTS)
def test_hand_written_upgrade_yields_the_automatic_layout(db: Target, commit: str) -> None:
    """``xasink/journal/sql/*.sql`` run by hand on an old log gives the layout this version's writers make of it (and
    the one it makes anew); running it twice changes nothing."""
    by_hand, auto = f"xh{uuid.uuid4().hex[:6]}_", f"xa{uuid.uuid4().hex[:6]}_"
    old_log(db, commit, by_hand)
    old_log(db, commit, auto)
    hand_upgrade(db, by_hand)
    auto_upgrade(db, auto)
    assert layout(db, by_hand) == layout(db, auto) == fresh_layout(db)
    hand_upgrade(db, by_hand)
    auto_upgrade(db, auto)
    assert layout(db, by_hand) == layout(db, auto)


# --------------------------------------------------------------------------- item 6: identities byte for byte


def test_sink_ids_that_differ_only_in_case_are_two_sinks(db: Target) -> None:
    """Sinks ``Ord<hex>`` and ``ord<hex>``: each one's batch 7 is written (not skipped as the other's), status
    reads each one's batches only, and ``recover --sink-id`` clears the one named and leaves the other's."""
    tail = uuid.uuid4().hex[:10]
    upper = TargetSink(db, primary_key=False, sink_id=f"Ord{tail}")
    lower = TargetSink(db, primary_key=False, sink_id=f"ord{tail}")
    assert not upper.batch(7, range(0, 10)).skipped
    assert not lower.batch(7, range(10, 20)).skipped
    assert upper.rows() == expected(range(0, 10))
    assert lower.rows() == expected(range(10, 20))
    dialect = dialect_for(parse_url(db.url, password=db.password))
    try:
        journal = Journal(dialect)
        with dialect.connect() as conn:
            for s in (upper, lower):
                assert [(r.sink_id, r.batch_id) for r in journal.recent(conn, s.sink_id)] == [(s.sink_id, 7)]
                assert journal.horizon(conn, s.sink_id) is None
            assert {upper.sink_id, lower.sink_id} <= set(journal.sink_ids(conn))
    finally:
        dialect.dispose()
    # undecided branches of both (their runs are gone): recovery of one sink touches only its own
    upper.prepare(8, range(30, 34))
    lower.prepare(8, range(40, 44))
    assert len(db.prepared(upper.sink_id)) == len(db.prepared(lower.sink_id)) == 2
    url = db.url if db.password is None else with_login(db.url, urlsplit(db.url).username or "", db.password)
    for s in (upper, lower):  # xasink status: each sink's own batch and branches
        st = xasink.status(url, sink_id=s.sink_id, older_than_s=0)
        assert [x.sink_id for x in st.sinks] == [s.sink_id]
        assert [(r["batch_id"], r["state"], r["rows"]) for r in st.sinks[0].recent] == [(7, "committed", 10)]
        assert st.sinks[0].prepared_branches == 2
    code, out, err = cli("recover", "--url", url, "--sink-id", lower.sink_id, "--older-than", "0s")
    assert code == 0, out + err
    assert db.prepared(lower.sink_id) == []
    assert len(db.prepared(upper.sink_id)) == 2
    code, out, err = cli("recover", "--url", url, "--sink-id", upper.sink_id, "--older-than", "0s")
    assert code == 0, out + err
    assert db.prepared(upper.sink_id) == []
    assert upper.rows() == expected(range(0, 10))
    assert lower.rows() == expected(range(10, 20))


# --------------------------------------------------------------------------- item 9: nothing stored truncated


def long_replace_where(ids: range, size: int) -> str:
    """A replaceWhere over ``ids`` longer than ``size`` bytes (a long IN list of names no row has)."""
    names = ", ".join(f"'zz{i:07d}'" for i in range(size // 11 + 1))
    return f"(id BETWEEN {ids.start} AND {ids.stop - 1} OR name IN ({names}))"


def test_a_replace_where_the_log_cannot_hold_fails_the_decision(db: Target, monkeypatch: pytest.MonkeyPatch) -> None:
    """A replaceWhere longer than MariaDB's TEXT (64 KiB), on sessions whose sql_mode is not strict (the URL's
    init_command sets ''; xasink's control sessions must set their own): the decision fails with a clear
    error, nothing is visible and nothing prepared, instead of a truncated decision that recovery cannot read
    (it then marked the batch committed without applying it).  PostgreSQL's text holds it: written whole."""
    table = db.new_table()
    db.keyed_table(table)
    db.execute(f"INSERT INTO {db.q(table)} VALUES (1, 'old1'), (2, 'old2'), (500, 'kept')")
    predicate = long_replace_where(range(0, 100), 70_000)
    sink_id = f"lw{uuid.uuid4().hex[:10]}"
    # the driver dies right after deciding: recovery finishes the batch from the log alone
    monkeypatch.setenv("XASINK_FAULT", "driver.after_decide:raise")
    if db.kind == POSTGRESQL:
        url = db.url
        with pytest.raises(InjectedFault):
            overwrite_direct(url, table, sink_id, 0, split(0, 10, 2), replaceWhere=predicate)
        report = admin.recover(url, sink_id=sink_id, older_than_s=0)
        assert not report.errors, report.errors
        assert db.rows(table, "id") == [*(row for part in split(0, 10, 2) for row in part), (500, "kept")]
        assert db.decision(sink_id, 0).state == "committed"  # type: ignore[union-attr]
    else:
        assert isinstance(db, MariaDBTarget)
        url = db.admin_url + "?init_command=" + quote("SET SESSION sql_mode = ''")
        with pytest.raises(BatchAbortedError, match=r"replaceWhere.*too long for the decision log"):
            overwrite_direct(url, table, sink_id, 0, split(0, 10, 2), replaceWhere=predicate)
        report = admin.recover(url, sink_id=sink_id, older_than_s=0)
        assert not report.errors, report.errors
        assert db.rows(table, "id") == [(1, "old1"), (2, "old2"), (500, "kept")]
        assert db.decision(sink_id, 0) is None
    assert db.prepared(sink_id) == []


@pytest.mark.mariadb
def test_control_sessions_set_their_own_strict_sql_mode(mariadb_url: str) -> None:
    """Whatever the server's or the URL's sql_mode (here '' by the URL's init_command), xasink's control
    sessions, pooled and autocommit, run in strict mode: a too long value fails instead of being truncated."""
    url = mariadb_url + "?init_command=" + quote("SET SESSION sql_mode = ''")
    dialect = dialect_for(parse_url(url))
    try:
        for autocommit in (False, True):
            with dialect.connect(autocommit=autocommit) as conn:
                modes = str(conn.exec_driver_sql("SELECT @@SESSION.sql_mode").scalar()).split(",")
                assert "STRICT_ALL_TABLES" in modes and "NO_AUTO_VALUE_ON_ZERO" not in modes, modes
                assert "ANSI_QUOTES" not in modes and "NO_BACKSLASH_ESCAPES" not in modes
    finally:
        dialect.dispose()
