"""The shadow of an overwrite or replaceWhere: on MariaDB/MySQL keyed by (batch, tag, row), each branch tagging
and numbering its rows (LOAD DATA or multi-row INSERT alike), so the apply reads and deletes its branches' rows by
a range of the clustered index; on PostgreSQL a plain heap.  Either way the table ends with exactly the batch."""

from __future__ import annotations

import uuid

import pytest

from tests.harness import expected, fill, shadow_rows
from tests.modes_driver import overwrite_direct, split
from tests.targets import POSTGRESQL, Target


def sink() -> str:
    return f"ks-{uuid.uuid4().hex[:10]}"


def shadow_key(db: Target) -> list[list[str]]:
    """The primary key columns of each shadow table of the test database (in key order)."""
    here = "current_schema()" if db.kind == POSTGRESQL else "DATABASE()"
    names = [
        r[0]
        for r in db.execute(
            f"SELECT table_name FROM information_schema.tables WHERE table_schema = {here} AND table_name LIKE %s",
            "xasink\\_sh\\_%",
        )
    ]
    keys = []
    for name in names:
        rows = db.execute(
            "SELECT k.column_name FROM information_schema.table_constraints c "
            "JOIN information_schema.key_column_usage k ON k.constraint_name = c.constraint_name "
            "AND k.table_schema = c.table_schema AND k.table_name = c.table_name "
            f"WHERE c.constraint_type = 'PRIMARY KEY' AND c.table_schema = {here} AND c.table_name = %s "
            "ORDER BY k.ordinal_position",
            name,
        )
        keys.append([str(r[0]) for r in rows])
    return keys


@pytest.mark.parametrize("local_infile", ["true", "false"])
def test_overwrites_loaded_either_way_leave_exactly_each_batch(db: Target, local_infile: str) -> None:
    """Two overwrites (most keys the same, some gone, some new) and a replaceWhere, the branches loading by LOAD
    DATA or by multi-row INSERT: exactly each batch's rows, the shadow empty, nothing prepared."""
    table = db.new_table()
    db.keyed_table(table)
    fill(db, table, expected(range(10), tag="o"))
    s = sink()
    assert overwrite_direct(db.url, table, s, 0, split(100, 60, 3), localInfile=local_infile).rows == 60
    assert db.rows(table) == expected(range(100, 160))
    assert shadow_rows(db) == 0 and db.prepared(s) == []
    assert overwrite_direct(db.url, table, s, 1, split(130, 70, 4), localInfile=local_infile).rows == 70
    assert db.rows(table) == expected(range(130, 200))
    keyed = ("xasink_batch_", "xasink_tag_", "xasink_row_")
    assert {tuple(k) for k in shadow_key(db)} == ({()} if db.kind == POSTGRESQL else {keyed})  # every shadow made so
    rows = split(150, 20, 2)
    got = overwrite_direct(db.url, table, s, 2, rows, localInfile=local_infile, replaceWhere="id >= 150 AND id < 180")
    assert got.rows == 20
    assert db.rows(table) == expected(range(130, 150), range(150, 170), range(180, 200))
    assert shadow_rows(db) == 0 and db.prepared(s) == []


def test_an_earlier_layout_holding_a_decided_batch_is_named_as_an_upgrade(mariadb_url: str) -> None:
    """A MariaDB shadow in the layout before its key (no tag, no row; an index on batch and branch) still holding
    a decided batch's rows: the next write is refused with what to do (recover applies that layout), not told
    that the target changed and that the shadow may be dropped; the rows stay."""
    import sqlalchemy as sa

    from tests.targets import mariadb_connect
    from xasink.database_url import parse_url
    from xasink.dialects import dialect_for
    from xasink.errors import PreflightError
    from xasink.write_modes.spec import OVERWRITE, ApplySpec
    from xasink.write_modes.statements import ensure_shadow

    table, shadow = f"t_{uuid.uuid4().hex[:8]}", f"xasink_sh_{uuid.uuid4().hex[:8]}"
    with mariadb_connect(mariadb_url) as conn, conn.cursor() as cur:
        cur.execute(f"CREATE TABLE `{table}` (id int PRIMARY KEY, name varchar(20))")
        cur.execute(
            f"CREATE TABLE `{shadow}` (id int, name varchar(20), xasink_batch_ bigint NOT NULL, "
            f"xasink_branch_ varchar(64) NOT NULL, KEY `{shadow}_br` (xasink_batch_, xasink_branch_))"
        )
        cur.execute(f"INSERT INTO `{shadow}` VALUES (1, 'n1', 0, '0:abc')")
    dialect = dialect_for(parse_url(mariadb_url))
    try:
        spec = ApplySpec(OVERWRITE, None, table, shadow, ("id", "name"))
        with dialect.connect() as conn, pytest.raises(PreflightError, match="earlier xasink.*xasink recover") as err:
            ensure_shadow(dialect, conn, spec)
        assert "drop" not in str(err.value)
        with dialect.connect() as conn:
            assert conn.execute(sa.text(f"SELECT count(*) FROM `{shadow}`")).scalar() == 1
    finally:
        dialect.dispose()
        with mariadb_connect(mariadb_url) as conn, conn.cursor() as cur:
            cur.execute(f"DROP TABLE IF EXISTS `{table}`, `{shadow}`")
