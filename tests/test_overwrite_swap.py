"""PostgreSQL: an overwrite swaps the table's storage when nothing binds the table by OID, and keeps what users see.

The swap loads the batch into a new table made like the target, which takes the target's place in the apply
transaction.  Checked here on the real server, before and after one overwrite: the table's columns, defaults,
constraints, indexes, comments, grants (table and column, to another role), owner, reloptions, replica identity,
statistics targets, its identity and serial sequences (the next value goes on), and statistics (analyzed); the
storage changed (a new OID: the swap happened).  Everything that binds the table by OID (a view, a trigger, a rule,
a policy, extended statistics, a publication, a foreign key either way) and a session keeping the table open make
it overwrite in place instead (the OID stays, the log says why), with the same rows.  Readers and kills:
tests/test_write_modes.py (reader polls, older snapshots) and tests/test_write_modes_crash.py.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg2
import pytest
import sqlalchemy as sa

from tests.harness import expected, shadow_tables
from tests.modes_driver import batch_direct, split
from tests.targets import POSTGRESQL, Target, case

pytestmark = pytest.mark.parametrize("db", [case(POSTGRESQL)], indirect=True)

COLUMNS = {"id": "int", "name": "string"}
OLD, NEW = expected(range(300), tag="o"), expected(range(200, 500))


def oid(db: Target, table: str) -> int:
    return int(db.execute("SELECT %s::regclass::oid", db.q(table))[0][0])


def leftovers(db: Target) -> list[tuple[Any, ...]]:
    """Tables a swap builds under another name: none outlives its transaction."""
    return db.execute("SELECT relname FROM pg_class WHERE relname LIKE %s", "xasink\\_sw\\_%")


def what_users_see(db: Target, table: str) -> dict[str, Any]:
    """The table's definition and everything around it that an overwrite must keep (OID aside)."""
    t = db.q(table)
    one = {
        "columns": "SELECT a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull, a.attidentity, "
        "pg_get_expr(d.adbin, d.adrelid), a.attstattarget, "
        "array(SELECT o FROM unnest(a.attoptions) o WHERE o LIKE 'n\\_distinct%%'), "
        "col_description(a.attrelid, a.attnum), "
        "pg_get_serial_sequence(%(t)s, a.attname), a.attacl::text[] FROM pg_attribute a LEFT JOIN pg_attrdef d "
        "ON d.adrelid = a.attrelid AND d.adnum = a.attnum WHERE a.attrelid = %(t)s::regclass AND a.attnum > 0 "
        "AND NOT a.attisdropped ORDER BY a.attnum",
        "indexes": "SELECT i.relname, pg_get_indexdef(i.oid), obj_description(i.oid, 'pg_class'), x.indisreplident, "
        "x.indisclustered FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid "
        "WHERE x.indrelid = %(t)s::regclass ORDER BY 1",
        "constraints": "SELECT conname, pg_get_constraintdef(oid), obj_description(oid, 'pg_constraint') "
        "FROM pg_constraint WHERE conrelid = %(t)s::regclass ORDER BY 1",
        "table": "SELECT pg_get_userbyid(relowner), reloptions, relreplident, obj_description(oid, 'pg_class'), "
        "relrowsecurity, relpersistence FROM pg_class WHERE oid = %(t)s::regclass",
        "grants": "SELECT coalesce(pg_get_userbyid(nullif(g.grantee, 0)), 'PUBLIC'), g.privilege_type, "
        "g.is_grantable FROM pg_class c, aclexplode(c.relacl) g WHERE c.oid = %(t)s::regclass ORDER BY 1, 2",
    }
    with db.connect() as conn, conn.cursor() as cur:
        seen = {}
        for name, query in one.items():
            cur.execute(query, {"t": t})
            seen[name] = [tuple(r) for r in cur.fetchall()]
    return seen


@pytest.fixture
def grantee(db: Target) -> Iterator[str]:
    with db.no_login_role("sw_r") as name:
        yield name


def made_table(db: Target, table: str, grantee: str) -> None:
    """A table with something of everything a swap must carry, filled with OLD (its identity and serial drawn)."""
    t, g = db.q(table), db.q(grantee)
    db.create_table(
        table,
        "gone int, id int PRIMARY KEY, name text NOT NULL CHECK (name <> ''), "
        "n bigint GENERATED ALWAYS AS IDENTITY (START WITH 10 INCREMENT BY 2), s serial, "
        "at timestamptz NOT NULL DEFAULT now()",
    )
    for statement in (
        f"ALTER TABLE {t} DROP COLUMN gone",  # the new table numbers its columns from 1: indexes pair by name
        f"CREATE INDEX {db.q(table + '_nm')} ON {t} (lower(name)) WITH (fillfactor = 70)",
        f"CREATE UNIQUE INDEX {db.q(table + '_ns')} ON {t} (n, s)",
        f"ALTER TABLE {t} ADD CONSTRAINT {db.q(table + '_uq')} UNIQUE (name) DEFERRABLE INITIALLY DEFERRED",
        f"COMMENT ON CONSTRAINT {db.q(table + '_uq')} ON {t} IS 'a constraint comment'",
        f"CREATE UNIQUE INDEX {db.q(table + '_part')} ON {t} (id DESC NULLS LAST) INCLUDE (name) WHERE id > 100",
        f"COMMENT ON TABLE {t} IS 'kept by the swap'",
        f"COMMENT ON COLUMN {t}.name IS 'the name'",
        f"COMMENT ON INDEX {db.q(table + '_nm')} IS 'an index comment'",
        f"ALTER TABLE {t} SET (fillfactor = 80, autovacuum_enabled = false)",
        f"ALTER TABLE {t} ALTER COLUMN name SET STATISTICS 321",
        f"ALTER TABLE {t} ALTER COLUMN id SET (n_distinct = -1)",
        f"ALTER TABLE {t} REPLICA IDENTITY USING INDEX {db.q(table + '_ns')}",
        f"ALTER TABLE {t} CLUSTER ON {db.q(table + '_pkey')}",
        f"GRANT SELECT, INSERT ON {t} TO {g} WITH GRANT OPTION",
        f"GRANT UPDATE (name) ON {t} TO {g}",
        f"REVOKE TRUNCATE ON {t} FROM CURRENT_USER",
    ):
        db.execute(statement)
    db.execute(f"INSERT INTO {t} (id, name) SELECT i, 'o' || i FROM generate_series(0, 299) i")


def overwrite(db: Target, table: str, **options: Any) -> Any:
    return batch_direct(db.url, table, f"sw-{uuid.uuid4().hex[:8]}", 1, COLUMNS, split(200, 300, 3), **options)


def test_a_swapped_overwrite_keeps_what_users_see(db: Target, grantee: str, caplog: pytest.LogCaptureFixture) -> None:
    table = db.new_table()
    made_table(db, table, grantee)
    before, storage = what_users_see(db, table), oid(db, table)
    assert before["grants"] and before["table"][0][1] and before["columns"][3][8]  # grants, options, a sequence
    with caplog.at_level(logging.INFO, logger="xasink"):
        result = overwrite(db, table)
    assert result.rows == 300
    assert "not by a swap" not in caplog.text, caplog.text
    assert oid(db, table) != storage  # the storage was swapped
    after = what_users_see(db, table)
    for name in before:
        assert after[name] == before[name], name
    assert db.rows(table, "id")[0][:2] == (200, "n200") and [r[:2] for r in db.rows(table, "id")] == NEW
    # the identity and the serial go on from where the old rows left them (300 drawn before, 300 by the batch)
    drawn = db.execute(f"SELECT min(n), max(n), min(s), max(s) FROM {db.q(table)}")[0]
    assert drawn == (10 + 2 * 300, 10 + 2 * 599, 301, 600)
    db.execute(f"INSERT INTO {db.q(table)} (id, name) VALUES (-1, 'later')")
    assert db.execute(f"SELECT n, s FROM {db.q(table)} WHERE id = -1")[0] == (10 + 2 * 600, 601)
    # analyzed: the planner knows the new rows
    assert db.execute("SELECT reltuples FROM pg_class WHERE oid = %s::regclass", db.q(table))[0][0] == 300
    assert db.execute("SELECT count(*) FROM pg_stats WHERE tablename = %s", table)[0][0] == 5
    assert leftovers(db) == [] and db.prepared() == []


FALLBACKS = {
    "view": ["CREATE VIEW {v} AS SELECT id, name FROM {t}"],
    "trigger": [
        "CREATE FUNCTION {v}() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN RETURN NEW; END$$",
        "CREATE TRIGGER tr BEFORE INSERT ON {t} FOR EACH ROW EXECUTE FUNCTION {v}()",
    ],
    "rule": ["CREATE RULE r AS ON UPDATE TO {t} DO ALSO NOTIFY sw"],
    "policy": ["CREATE POLICY p ON {t} USING (true)"],
    "statistics": ["CREATE STATISTICS {v} ON id, name FROM {t}"],
    "publication": ["CREATE PUBLICATION {v} FOR TABLE {t}"],
    "referenced": ["CREATE TABLE {v} (id int REFERENCES {t} (id))"],
    "references": [
        "CREATE TABLE {v} (id int PRIMARY KEY)",
        "INSERT INTO {v} SELECT generate_series(0, 999)",
        "ALTER TABLE {t} ADD FOREIGN KEY (id) REFERENCES {v}",
    ],
    "owned sequence": ["CREATE SEQUENCE {v} OWNED BY {t}.id"],
    # fails on the duplicate values and leaves the index invalid: a new one built by the swap would be valid
    "invalid index": ["!CREATE UNIQUE INDEX CONCURRENTLY {v} ON {t} ((id % 2))"],
}
# how the other object goes afterwards (None: with the table)
DROPS = {
    "view": "VIEW",
    "trigger": "FUNCTION",
    "statistics": "STATISTICS",
    "publication": "PUBLICATION",
    "referenced": "TABLE",
    "references": "TABLE",
    "rule": None,
    "policy": None,
    "owned sequence": None,
    "invalid index": None,
}


@pytest.mark.parametrize("binding", sorted(FALLBACKS))
def test_a_table_bound_by_oid_is_overwritten_in_place(
    db: Target, binding: str, caplog: pytest.LogCaptureFixture
) -> None:
    table, other = db.new_table(), f"sw_{uuid.uuid4().hex[:8]}"
    db.keyed_table(table)
    db.execute(f"INSERT INTO {db.q(table)} SELECT i, 'o' || i FROM generate_series(0, 299) i")
    for statement in FALLBACKS[binding]:
        if statement.startswith("!"):
            with pytest.raises(psycopg2.errors.UniqueViolation):
                db.execute(statement[1:].format(t=db.q(table), v=db.q(other)))
        else:
            db.execute(statement.format(t=db.q(table), v=db.q(other)))
    storage = oid(db, table)
    try:
        with caplog.at_level(logging.INFO, logger="xasink"):
            overwrite(db, table)
        assert "not by a swap" in caplog.text or binding == "referenced", caplog.text
        assert oid(db, table) == storage and db.rows(table, "id") == NEW
        assert leftovers(db) == []
    finally:
        kind = DROPS[binding]
        if kind is not None:
            db.execute(f"DROP {kind} IF EXISTS {db.q(other)} CASCADE")


def test_a_session_keeping_the_table_open_makes_it_overwrite_in_place(
    db: Target, caplog: pytest.LogCaptureFixture
) -> None:
    """The exclusive lock is only ever asked for without waiting (a queued request would hold up every new reader),
    for at most controlLockTimeout (here 1 s): a report's open transaction on the table makes it apply in place."""
    table = db.new_table()
    db.keyed_table(table)
    db.execute(f"INSERT INTO {db.q(table)} SELECT i, 'o' || i FROM generate_series(0, 299) i")
    storage = oid(db, table)
    with db.connect() as report, report.cursor() as cur:
        cur.execute("BEGIN")
        cur.execute(f"SELECT count(*) FROM {db.q(table)}")
        with caplog.at_level(logging.INFO, logger="xasink"):
            overwrite(db, table, controlLockTimeout=1)
        cur.execute("COMMIT")
    assert "kept the table open" in caplog.text, caplog.text
    assert oid(db, table) == storage and db.rows(table, "id") == NEW and leftovers(db) == []


# --------------------------------------------------------------------------- what adversary3 found the swap lost


@pytest.fixture
def reporter(db: Target) -> Iterator[str]:
    """A role the writer's default privileges grant SELECT on every table it creates in the schema (a common
    setup: new tables readable by a reporting role)."""
    with db.no_login_role("sw_rep") as name:
        db.execute(f"ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT SELECT ON TABLES TO {db.q(name)}")
        try:
            yield name
        finally:
            db.execute(f"ALTER DEFAULT PRIVILEGES IN SCHEMA public REVOKE SELECT ON TABLES FROM {db.q(name)}")


def overwrite_ten(db: Target, table: str) -> None:
    result = batch_direct(db.url, table, f"sw-{uuid.uuid4().hex[:8]}", 1, COLUMNS, split(100, 10, 2))
    assert result.rows == 10 and [r[:2] for r in db.rows(table, "id")] == expected(range(100, 110))


@pytest.mark.parametrize("explicit_acl", [False, True], ids=["no-acl", "acl"])
def test_a_swapped_overwrite_does_not_grant_what_was_revoked(db: Target, reporter: str, explicit_acl: bool) -> None:
    """A table the reporting role must not read: the DBA revoked the SELECT default privileges gave it, or the
    table predates the default privileges (no ACL of its own).  The new storage, made by CREATE TABLE, got the
    writer's default privileges, and the swap granted only the target's ACL back: the role could read the table
    after one overwrite (adversary3).  Every grant of the new table is revoked first now."""
    table = db.new_table()
    if explicit_acl:
        db.keyed_table(table)  # made after the default privileges: the reporter may read it ...
        db.execute(f"REVOKE SELECT ON {db.q(table)} FROM {db.q(reporter)}")  # ... until the DBA revokes it
    else:
        db.execute(f"ALTER DEFAULT PRIVILEGES IN SCHEMA public REVOKE SELECT ON TABLES FROM {db.q(reporter)}")
        db.keyed_table(table)  # made before the default privileges: no ACL of its own
        db.execute(f"ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT SELECT ON TABLES TO {db.q(reporter)}")
    check = "SELECT has_table_privilege(%s, %s, 'SELECT')"
    assert db.execute(check, reporter, db.q(table))[0][0] is False
    before, storage = what_users_see(db, table), oid(db, table)
    overwrite_ten(db, table)
    assert oid(db, table) != storage  # swapped (not the in-place fallback)
    assert db.execute(check, reporter, db.q(table))[0][0] is False, "the overwrite granted SELECT back"
    assert what_users_see(db, table)["grants"] == before["grants"] or not explicit_acl


def test_a_swapped_overwrite_keeps_column_grants_of_a_table_without_table_grants(db: Target, grantee: str) -> None:
    """Column privileges only: the table has no ACL of its own, and the swap read grants only from one, so the
    column grants were dropped (adversary3)."""
    table = db.new_table()
    db.keyed_table(table)
    t, g = db.q(table), db.q(grantee)
    db.execute(f"GRANT SELECT (name), UPDATE (name) ON {t} TO {g}")
    storage = oid(db, table)
    overwrite_ten(db, table)
    assert oid(db, table) != storage  # swapped
    check = "SELECT has_column_privilege(%s, %s, 'name', %s)"
    assert [db.execute(check, grantee, t, p)[0][0] for p in ("SELECT", "UPDATE")] == [True, True]
    assert db.execute("SELECT relacl IS NULL FROM pg_class WHERE oid = %s::regclass", t)[0][0] is False


# what a table carries that the swap does not rebuild: (setup statements, the query that reads it back); {t} the
# table, {seq} its identity sequence, {g} another role, {table} its bare name.  The swap's check of what users see
# (xasink/dialects/postgres/appearance.py) finds each one changed and applies the batch in place instead.
NOT_REBUILT = {
    "identity-sequence-grant": (
        ["GRANT USAGE, SELECT ON SEQUENCE {seq} TO {g}"],
        "SELECT has_sequence_privilege('{g}', '{seq}', 'USAGE')",
    ),
    "identity-sequence-comment": (
        ["COMMENT ON SEQUENCE {seq} IS 'ids of the orders'"],
        "SELECT obj_description('{seq}'::regclass, 'pg_class')",
    ),
    "toast-reloptions": (
        ["ALTER TABLE {t} SET (toast.autovacuum_enabled = false)"],
        "SELECT tc.reloptions FROM pg_class c JOIN pg_class tc ON tc.oid = c.reltoastrelid "
        "WHERE c.oid = '{t}'::regclass",
    ),
    "index-statistics-target": (
        ["CREATE INDEX {table}_lx ON {t} (lower(name))", "ALTER INDEX {table}_lx ALTER COLUMN 1 SET STATISTICS 500"],
        "SELECT attstattarget FROM pg_attribute WHERE attrelid = '{table}_lx'::regclass",
    ),
    "grant-by-a-grantee": (  # re-granted by the owner, alice's REVOKE would no longer take it (adversary4)
        ["GRANT SELECT ON {t} TO {g} WITH GRANT OPTION", "SET ROLE {g}; GRANT SELECT ON {t} TO PUBLIC; RESET ROLE"],
        "SELECT relacl::text FROM pg_class WHERE oid = '{t}'::regclass",
    ),
    "not-valid-check": (
        [
            "INSERT INTO {t} (id, name) VALUES (5000, 'legacy')",
            "ALTER TABLE {t} ADD CONSTRAINT {table}_ck CHECK (id < 1000) NOT VALID",
        ],
        "SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conrelid = '{t}'::regclass AND contype = 'c'",
    ),
}


@pytest.mark.parametrize("what", sorted(NOT_REBUILT))
def test_what_the_swap_cannot_rebuild_keeps_the_overwrite_in_place(
    db: Target, grantee: str, what: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Each of these was changed by one swapped overwrite (adversary3): an identity sequence's grant or comment,
    the TOAST table's options, an expression index column's statistics target, a NOT VALID check (validated).
    The swap now compares what users see of the new table with the old before it commits, and overwrites in
    place when they differ: the rows are the batch's, the setting as it was, the log says why."""
    table = db.new_table()
    t = db.q(table)
    db.create_table(table, "id int PRIMARY KEY, name text, n bigint GENERATED BY DEFAULT AS IDENTITY")
    seq = db.execute("SELECT pg_get_serial_sequence(%s, 'n')", t)[0][0]
    names = {"t": t, "seq": seq, "g": grantee, "table": table}
    setup, query = NOT_REBUILT[what]
    for statement in setup:
        db.execute(statement.format(**names))
    before, storage = db.execute(query.format(**names)), oid(db, table)
    with caplog.at_level(logging.INFO, logger="xasink"):
        result = batch_direct(db.url, table, f"sw-{uuid.uuid4().hex[:8]}", 1, COLUMNS, split(100, 10, 2))
    assert result.rows == 10 and db.execute(f"SELECT id, name FROM {t} ORDER BY id") == expected(range(100, 110))
    assert db.execute(query.format(**names)) == before
    assert oid(db, table) == storage and "would differ from the old in what users see" in caplog.text, caplog.text
    assert leftovers(db) == []


# --------------------------------------------------------------------------- what adversary4 found


def test_a_table_whose_identity_sequence_another_table_uses_is_overwritten_in_place(
    db: Target, caplog: pytest.LogCaptureFixture
) -> None:
    """Another table's default draws from the target's identity sequence: nothing binds the table itself, but
    DROP TABLE would take the sequence along and fails on that default.  The swap went ahead and failed there, and
    the decided batch could never be applied (CommitIncompleteError, every recovery the same, every later batch
    of the table blocked: adversary4).  Such a table is overwritten in place."""
    table, other = db.new_table(), db.new_table()
    t = db.q(table)
    db.create_table(table, "id int PRIMARY KEY, name text, n bigint GENERATED BY DEFAULT AS IDENTITY")
    db.execute(f"INSERT INTO {t} (id, name) SELECT i, 'o' || i FROM generate_series(0, 299) i")
    seq = db.execute("SELECT pg_get_serial_sequence(%s, 'n')", t)[0][0]
    db.create_table(other, f"k bigint DEFAULT nextval('{seq}')")
    storage = oid(db, table)
    with caplog.at_level(logging.INFO, logger="xasink"):
        overwrite(db, table)
    assert "a user of its identity sequence" in caplog.text, caplog.text
    assert oid(db, table) == storage and db.execute(f"SELECT id, name FROM {t} ORDER BY id") == NEW
    db.execute(f"INSERT INTO {db.q(other)} DEFAULT VALUES")  # the other table's default still draws
    assert leftovers(db) == [] and db.prepared() == []


@pytest.fixture
def no_tablespace_writer(db: Target) -> Iterator[tuple[str, str]]:
    """(a writer's URL, a table of its role in a tablespace the writer may not create in): the swap's CREATE
    TABLE there fails with 42501, which no check foresaw; the writer may do everything else."""
    x = uuid.uuid4().hex[:8]
    owner, writer, space, table = f"sw_o_{x}", f"sw_w_{x}", f"sw_ts_{x}", f"sw_t_{x}"
    data = db.execute("SHOW data_directory")[0][0]
    where = tempfile.mkdtemp(prefix="xasink-ts-", dir="/tmp")
    os.chown(where, os.stat(data).st_uid, os.stat(data).st_gid)
    for statement in (
        f"CREATE ROLE {owner} NOLOGIN",
        f"CREATE ROLE {writer} LOGIN PASSWORD 'pw{x}'",
        f"GRANT {owner} TO {writer}",
        f"GRANT CREATE, USAGE ON SCHEMA public TO {owner}, {writer}",
        f"GRANT ALL ON ALL TABLES IN SCHEMA public TO {writer}",
        f"GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO {writer}",
        f"CREATE TABLESPACE {space} LOCATION '{where}'",
        f"CREATE TABLE {table} (id int PRIMARY KEY, name text) TABLESPACE {space}",
        f"ALTER TABLE {table} OWNER TO {owner}",
        f"INSERT INTO {table} SELECT i, 'o' || i FROM generate_series(0, 299) i",
    ):
        db.execute(statement)
    url = sa.engine.make_url(db.url).set(username=writer, password=f"pw{x}")
    try:
        yield url.render_as_string(hide_password=False), table
    finally:
        for statement in (
            f"DROP TABLE IF EXISTS {table}",
            f"DROP OWNED BY {writer}, {owner}",
            f"DROP ROLE {writer}",
            f"DROP ROLE {owner}",
            f"DROP TABLESPACE {space}",
        ):
            db.execute(statement)
        shutil.rmtree(where, ignore_errors=True)


def test_a_swap_statement_the_checks_did_not_foresee_failing_applies_in_place(
    db: Target, no_tablespace_writer: tuple[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    """Any error of the swap's own DDL (here CREATE on the table's tablespace, 42501) makes the batch apply in
    place: before, it was the apply's error, and the decided batch could never be applied (adversary4)."""
    url, table = no_tablespace_writer
    storage = oid(db, table)
    with caplog.at_level(logging.INFO, logger="xasink"):
        result = batch_direct(url, table, f"sw-{uuid.uuid4().hex[:8]}", 1, COLUMNS, split(200, 300, 3))
    assert result.rows == 300
    assert "a statement of the swap failed (42501" in caplog.text, caplog.text
    assert oid(db, table) == storage and db.execute(f"SELECT id, name FROM {table} ORDER BY id") == NEW
    assert leftovers(db) == [] and db.prepared() == []


# what LIKE does not copy and the swap now carries: (the table's columns, setup, the query that reads it back)
CARRIED = {
    "int-identity": ("id int PRIMARY KEY, name text, n int GENERATED BY DEFAULT AS IDENTITY", [], "data_type"),
    "unlogged-identity-sequence": (
        "id int PRIMARY KEY, name text, n bigint GENERATED BY DEFAULT AS IDENTITY",
        ["ALTER SEQUENCE {seq} SET UNLOGGED"],
        "persistence",
    ),
    "row-type-comment": ("id int PRIMARY KEY, name text", ["COMMENT ON TYPE {t} IS 'one order'"], "type comment"),
}
PROBES = {
    "data_type": "SELECT data_type::text FROM pg_sequences WHERE schemaname || '.' || sequencename = "
    "(SELECT pg_get_serial_sequence('{t}', 'n'))",
    "persistence": "SELECT relpersistence FROM pg_class WHERE oid = pg_get_serial_sequence('{t}', 'n')::regclass",
    "type comment": "SELECT obj_description('{t}'::regtype, 'pg_type')",
}


@pytest.mark.parametrize("what", sorted(CARRIED))
def test_a_swap_carries_the_identity_sequences_type_and_persistence_and_the_row_types_comment(
    db: Target, what: str, caplog: pytest.LogCaptureFixture
) -> None:
    """LIKE makes an identity's sequence bigint and logged, and the row type is new: an int identity's sequence
    became bigint, an unlogged one logged, the row type's comment was lost, and the check did not look (adversary4).
    The swap carries them now, and the check compares them."""
    columns, setup, probe = CARRIED[what]
    table = db.new_table()
    t = db.q(table)
    db.create_table(table, columns)
    seq = db.execute("SELECT pg_get_serial_sequence(%s, 'n')", t)[0][0] if " n " in columns else None
    for statement in setup:
        db.execute(statement.format(t=t, seq=seq))
    db.execute(f"INSERT INTO {t} (id, name) SELECT i, 'o' || i FROM generate_series(0, 299) i")
    query = PROBES[probe].format(t=t)
    before, storage = db.execute(query), oid(db, table)
    with caplog.at_level(logging.INFO, logger="xasink"):
        overwrite(db, table)
    assert "not by a swap" not in caplog.text, caplog.text
    assert oid(db, table) != storage and db.execute(query) == before
    assert db.execute(f"SELECT id, name FROM {t} ORDER BY id") == NEW and leftovers(db) == []


def test_a_writer_without_truncate_on_the_shadow_clears_it_by_delete(db: Target) -> None:
    """Another user's shadow (an administrator's first overwrite made it) granted to the writer as a DBA grants
    tables, SELECT, INSERT, UPDATE, DELETE and no TRUNCATE: the apply's TRUNCATE failed with 42501, an error
    that is not the rows', so the decided batch could never be applied.  The shadow is cleared by DELETE then;
    the writer's batch is applied, the shadow left empty, nothing prepared."""
    x = uuid.uuid4().hex[:8]
    writer, table, s = f"nt_w_{x}", f"nt_t_{x}", f"nt-{x}"
    db.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, name text)")
    db.execute(f"INSERT INTO {table} SELECT i, 'o' || i FROM generate_series(0, 299) i")
    before = shadow_tables(db)
    batch_direct(db.url, table, s, 0, COLUMNS, split(0, 300, 2))  # the administrator's: log and shadow made
    (shadow,) = shadow_tables(db) - before
    db.execute(f"CREATE ROLE {writer} LOGIN PASSWORD 'pw{x}'")
    try:
        db.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {writer}")
        assert db.execute(f"SELECT has_table_privilege('{writer}', '{shadow}', 'TRUNCATE')") == [(False,)]
        url = sa.engine.make_url(db.url).set(username=writer, password=f"pw{x}").render_as_string(hide_password=False)
        result = batch_direct(url, table, s, 1, COLUMNS, split(200, 300, 3))
        assert (result.rows, result.skipped) == (300, False)
        assert db.execute(f"SELECT id, name FROM {table} ORDER BY id") == NEW
        assert db.execute(f"SELECT count(*) FROM {shadow}") == [(0,)]
        assert db.decision(s, 1).state == "committed"  # type: ignore[union-attr]
        assert leftovers(db) == [] and db.prepared() == []
    finally:
        db.execute(f"DROP TABLE IF EXISTS {table}")
        db.execute(f"DROP OWNED BY {writer}")
        db.execute(f"DROP ROLE {writer}")
