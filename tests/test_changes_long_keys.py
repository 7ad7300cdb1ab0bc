"""MariaDB: a change-data write whose upsert key is longer than an InnoDB index allows (a long UNIQUE, which
MariaDB keeps as a hash): the apply's temporary table of the newest change per key is keyed by a unique hash
then, and the write is applied exactly as before that table existed (it was refused when planned)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from tests.modes_driver import batch_direct
from tests.targets import mariadb_connect, mariadb_prepared_gids, mariadb_rows

COLUMNS = {"k": "string", "v": "string", "seq": "long", "deleted": "boolean"}


@pytest.mark.parametrize("key_type", ["varchar(1000)", "text"])
@pytest.mark.parametrize(
    "options",
    [{"deleteFlagColumn": "deleted"}, {"sequenceColumn": "seq"}],
    ids=["deletes-without-sequence", "sequence-without-deletes"],
)
def test_a_change_data_write_keyed_by_a_long_unique_column(
    mariadb_url: str, key_type: str, options: dict[str, str]
) -> None:
    table, sink = f"t_{uuid.uuid4().hex[:8]}", f"lk-{uuid.uuid4().hex[:8]}"
    with mariadb_connect(mariadb_url) as conn, conn.cursor() as cur:
        cur.execute(f"CREATE TABLE `{table}` (k {key_type} NOT NULL, v varchar(20), seq bigint, UNIQUE (k))")
        cur.execute(f"INSERT INTO `{table}` VALUES ('a', 'x', 1), ('b', 'y', 1)")
    parts: list[list[tuple[Any, ...]]]
    try:
        if "sequenceColumn" in options:
            parts = [[("a", "x2", 2, False), ("b", "old", 0, False)], [("c", "z", 1, False), ("a", "x3", 3, False)]]
            want = [("a", "x3", 3), ("b", "y", 1), ("c", "z", 1)]
        else:
            parts = [[("a", "x2", 2, False), ("b", None, 2, True)], [("c", "z", 1, False)]]
            want = [("a", "x2", 2), ("c", "z", 1)]
        cols = COLUMNS if "deleteFlagColumn" in options else {n: t for n, t in COLUMNS.items() if n != "deleted"}
        parts = [[r if "deleteFlagColumn" in options else r[:3] for r in p] for p in parts]
        options = {"upsertKeyColumns": "k", **options}
        loaded = batch_direct(mariadb_url, table, sink, 0, cols, parts, "append", **options).rows
        assert loaded == sum(map(len, parts))
        assert mariadb_rows(mariadb_url, table) == want
        assert mariadb_prepared_gids(mariadb_url, [sink]) == []
    finally:
        with mariadb_connect(mariadb_url) as conn, conn.cursor() as cur:
            cur.execute(f"DROP TABLE IF EXISTS `{table}`")
