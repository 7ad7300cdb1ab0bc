"""PostgreSQL: an overwrite by swapping the table's storage, inside the apply transaction.

A new table is made like the target (``LIKE … INCLUDING ALL``: columns, defaults, constraints, indexes,
comments, storage), the batch is copied into it ``FREEZE`` (frozen rows: a REPEATABLE READ snapshot older than
the swap sees the new rows, never an empty table, where rows an ordinary insert wrote would be invisible to it),
analyzed, and then, under ``ACCESS EXCLUSIVE`` on the target (readers wait only for the renames), the target is
dropped and the new table takes its name, its indexes' names, owner, grants, comment, replica identity and
identity sequences' names.  DDL is transactional: the swap commits with the batch's mark, or not at all.

A table something binds by OID (a view, a foreign key, a trigger, a rule, a policy, a publication, extended
statistics, a sequence it owns but no default uses, a column of its row type) is refused with :class:`SwapRefused`
and overwritten in place, as are partitioned, inherited, typed, unlogged and non-heap tables, a table something uses
the identity sequence of, a writer that may not own it or create tables in its schema, and an owner that may not
create tables there; so is any error of the swap's own statements that these checks did not foresee.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from xasink.dialects.postgres.appearance import appearance, carry, grants_of
from xasink.dialects.postgres.sql import LOCK_NOT_AVAILABLE, driver_sql, quote_ident, sqlstate_of, string_literal
from xasink.dialects.rendering import statement_text
from xasink.dialects.values import SwapRefused, SwapTarget
from xasink.support.faults import fault

log = logging.getLogger("xasink.dialects.postgres")

# what in pg_depend may refer to the target without binding it by OID: its own indexes, toast table, row type and
# its array, its own non-foreign-key constraints, its column defaults, and the sequences its defaults use
_FOREIGN_DEPENDENTS = """
SELECT pg_describe_object(d.classid, d.objid, d.objsubid)
FROM pg_depend d, pg_class t
WHERE t.oid = :t AND d.refclassid = 'pg_class'::regclass AND d.refobjid = t.oid AND NOT (
       (d.classid = 'pg_class'::regclass AND d.objid IN (
            SELECT indexrelid FROM pg_index WHERE indrelid = t.oid
            UNION ALL SELECT t.reltoastrelid
            UNION ALL SELECT s.objid FROM pg_depend s
                 JOIN pg_depend u ON u.refclassid = 'pg_class'::regclass AND u.refobjid = s.objid
                     AND u.classid = 'pg_attrdef'::regclass
                 JOIN pg_attrdef a ON a.oid = u.objid AND a.adrelid = t.oid
                 WHERE s.refobjid = t.oid AND s.classid = 'pg_class'::regclass AND s.deptype = 'a'
            UNION ALL SELECT s.objid FROM pg_depend s
                 WHERE s.refobjid = t.oid AND s.classid = 'pg_class'::regclass AND s.deptype = 'i'))
    OR (d.classid = 'pg_type'::regclass AND d.objid = t.reltype)
    OR (d.classid = 'pg_constraint'::regclass
        AND d.objid IN (SELECT oid FROM pg_constraint WHERE conrelid = t.oid AND contype <> 'f'))
    OR (d.classid = 'pg_attrdef'::regclass AND d.objid IN (SELECT oid FROM pg_attrdef WHERE adrelid = t.oid)))
UNION ALL
SELECT pg_describe_object(d.classid, d.objid, d.objsubid)
FROM pg_depend d, pg_class t, pg_type y
WHERE t.oid = :t AND y.oid = t.reltype AND d.refclassid = 'pg_type'::regclass
  AND d.refobjid IN (y.oid, y.typarray) AND NOT (d.classid = 'pg_type'::regclass AND d.objid = y.typarray)
  AND NOT (d.classid = 'pg_class'::regclass AND d.objid = t.oid)
UNION ALL
SELECT 'a user of its identity sequence: ' || pg_describe_object(d.classid, d.objid, d.objsubid)
FROM pg_depend s JOIN pg_class q ON q.oid = s.objid AND q.relkind = 'S'
JOIN pg_depend d ON d.refclassid = 'pg_class'::regclass AND d.refobjid = s.objid AND d.deptype <> 'i'
WHERE s.classid = 'pg_class'::regclass AND s.refclassid = 'pg_class'::regclass AND s.refobjid = :t
  AND s.deptype = 'i'
UNION ALL
SELECT 'a foreign key of the table: ' || conname FROM pg_constraint WHERE conrelid = :t AND contype = 'f'
UNION ALL
SELECT 'membership in ' || pg_describe_object(refclassid, refobjid, 0) FROM pg_depend
WHERE classid = 'pg_class'::regclass AND objid = :t AND deptype = 'e'
UNION ALL
SELECT 'a security label' FROM pg_seclabel WHERE classoid = 'pg_class'::regclass AND objoid = :t
UNION ALL
SELECT 'an invalid index (a failed CREATE INDEX CONCURRENTLY): ' || indexrelid::regclass::text
FROM pg_index WHERE indrelid = :t AND NOT indisvalid
UNION ALL
SELECT 'event trigger ' || evtname || ' (it would see the swap''s DDL)' FROM pg_event_trigger WHERE evtenabled <> 'D'
UNION ALL
SELECT 'a subscription that replicates into it' FROM pg_subscription_rel WHERE srrelid = :t
UNION ALL
SELECT 'publication ' || pubname || ' (FOR ALL TABLES: a subscriber would get the new rows beside the old)'
FROM pg_publication WHERE puballtables
"""
# (PostgreSQL 15+) a publication of every table in the target's schema
_SCHEMA_PUBLICATIONS = """
SELECT 'publication ' || p.pubname || ' of its schema' FROM pg_publication_namespace n
JOIN pg_publication p ON p.oid = n.pnpubid JOIN pg_class c ON c.relnamespace = n.pnnspid WHERE c.oid = :t
"""

_TABLE = """
SELECT c.relkind, c.relpersistence, c.relispartition, c.reloftype <> 0, c.relhassubclass,
       EXISTS (SELECT 1 FROM pg_inherits WHERE inhrelid = c.oid), coalesce(am.amname, 'heap'),
       pg_has_role(c.relowner, 'USAGE'), has_schema_privilege(c.relnamespace, 'CREATE'),
       pg_get_userbyid(c.relowner), c.relreplident, c.relrowsecurity, c.relforcerowsecurity,
       obj_description(c.oid, 'pg_class'), c.reloptions, ts.spcname, c.relacl IS NOT NULL,
       has_schema_privilege(c.relowner, c.relnamespace, 'CREATE'), obj_description(c.reltype, 'pg_type')
FROM pg_class c LEFT JOIN pg_am am ON am.oid = c.relam LEFT JOIN pg_tablespace ts ON ts.oid = c.reltablespace
WHERE c.oid = :t
"""

# an index's definition, its names aside: the new table's indexes pair with the target's by it
_INDEXES = """
SELECT c.relname, i.indisprimary, i.indisunique, i.indisreplident, i.indisclustered,
       concat_ws('|', (SELECT string_agg(coalesce(quote_ident(a.attname), '0'), ',' ORDER BY k.o)
                       FROM unnest(i.indkey) WITH ORDINALITY k(n, o)
                       LEFT JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.n),
                 i.indclass::text, i.indcollation::text, i.indoption::text, i.indisunique,
                 i.indisprimary, i.indisexclusion, i.indimmediate, i.indnullsnotdistinct, c.relam, c.reloptions::text,
                 c.reltablespace,
                 pg_get_expr(i.indexprs, i.indrelid), pg_get_expr(i.indpred, i.indrelid))
FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid WHERE i.indrelid = :t ORDER BY i.indexrelid
"""

_COLUMNS = """
SELECT a.attname, a.attstattarget, a.attoptions, a.attidentity <> '', pg_get_serial_sequence(:name, a.attname)
FROM pg_attribute a WHERE a.attrelid = :t AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum
"""

_COLUMN_OPTIONS = ("n_distinct", "n_distinct_inherited")  # a column's planner settings (ALTER COLUMN SET)


def _q(schema: str | None, name: str) -> str:
    return ".".join(quote_ident(p) for p in (schema, name) if p)


def _oid(conn: Connection, schema: str | None, name: str) -> int:
    return int(conn.execute(sa.text("SELECT CAST(:n AS regclass)::oid"), {"n": _q(schema, name)}).scalar_one())


def refusal(conn: Connection, schema: str | None, table: str) -> str | None:
    """Why the table cannot be swapped (None: it can)."""
    oid = _oid(conn, schema, table)
    row = conn.execute(sa.text(_TABLE), {"t": oid}).one()
    kind, persistence, partition, typed, parent, child, am, may_own, may_create = row[:9]
    owner_may_create = row[17]
    if kind != "r" or partition or parent or child or typed:
        return "it is partitioned, a partition, typed or in an inheritance tree"
    if persistence != "p" or am != "heap":
        return f"it is unlogged, temporary or not a heap table ({am})"
    if not may_own or not may_create:
        return "the writer is not a member of its owner's role, or may not create tables in its schema"
    if not owner_may_create:
        return "its owner may not create tables in its schema (the new table could not be given to it)"
    found = [str(r[0]) for r in conn.execute(sa.text(_FOREIGN_DEPENDENTS), {"t": oid})]
    if conn.execute(sa.text("SELECT to_regclass('pg_catalog.pg_publication_namespace')")).scalar() is not None:
        found += [str(r[0]) for r in conn.execute(sa.text(_SCHEMA_PUBLICATIONS), {"t": oid})]
    if found:
        return "something binds it by OID: " + "; ".join(sorted(found)[:5])
    return None


def _execute(conn: Connection, statement: str) -> None:
    conn.exec_driver_sql(driver_sql(statement))


# SQLSTATE classes of an error in the swap's own statements, not a value's (22) nor the connection's or server's
# (08, 40, 53, 57, XX: passed on, as any apply's): a privilege the checks did not foresee (42501: CREATE on a
# tablespace), an object still depending on the old table (2BP01), a feature or a state (0A, 55; not 55P03)
_DEFINITION_CLASSES = ("42", "2B", "0A", "55", "3F")


def swap(conn: Connection, reader: Connection, target: SwapTarget, patience_s: float) -> int:
    """Build the new storage, swap it in and drop the old, inside the caller's transaction (a savepoint of its
    own: the new table must be made in the subtransaction that copies FREEZE into it); the rows loaded.

    An error of the swap's own statements is :class:`SwapRefused` (the savepoint rolled back, the batch applied in
    place), never the apply's: a decided batch must not be kept from its table by a way of applying it.  So are rows
    breaking a constraint (23): the in-place apply's error names the table's own, not the new table's index."""
    try:
        return _swap(conn, reader, target, patience_s)
    except sa.exc.DBAPIError as exc:
        state = sqlstate_of(exc)
        if state is None or state[:2] not in (*_DEFINITION_CLASSES, "23") or state == "55P03":
            raise
        first = (str(getattr(exc, "orig", exc)).strip().splitlines() or [type(exc).__name__])[0]
        what = "the rows break a constraint" if state[:2] == "23" else "a statement of the swap failed"
        raise SwapRefused(f"{what} ({state}: {first})") from None


def _swap(conn: Connection, reader: Connection, target: SwapTarget, patience_s: float) -> int:
    schema, old, new = target.schema, _q(target.schema, target.table), _q(target.schema, target.new)
    why = refusal(conn, schema, target.table)
    if why is not None:
        raise SwapRefused(why)
    oid = _oid(conn, schema, target.table)
    seen = appearance(conn, oid)  # before anything changes (a serial's sequence goes over to the new table)
    table = conn.execute(sa.text(_TABLE), {"t": oid}).one()
    owner, replident, rls, force_rls, comment, options, space = table[9:16]
    if conn.execute(sa.text("SELECT to_regclass(:n)"), {"n": new}).scalar() is not None:
        raise SwapRefused(f"a table named {target.new} is in the way")
    where = f" TABLESPACE {quote_ident(space)}" if space else ""
    with_ = ""
    if options:
        with_ = " WITH (" + ", ".join(f"{quote_ident(k)} = {string_literal(v)}" for k, v in _options(options)) + ")"
    # the indexes after the load: one sorted build each, not a million inserts into each
    _execute(conn, f"CREATE TABLE {new} (LIKE {old} INCLUDING ALL EXCLUDING INDEXES){with_}{where}")
    _execute(conn, f"ALTER TABLE {new} OWNER TO {quote_ident(owner)}")  # first: a serial's sequence needs it
    new_oid = _oid(conn, schema, target.new)
    columns = conn.execute(sa.text(_COLUMNS), {"t": oid, "name": old}).all()
    sequences: list[tuple[str, str]] = []  # (the new identity sequence, the old one's name)
    drawn: list[tuple[str, str, int]] = []  # (the new identity sequence, the old one, where it stood)
    for name, stat, attopts, identity, sequence in columns:
        col = quote_ident(name)
        if stat is not None and stat >= 0:
            _execute(conn, f"ALTER TABLE {new} ALTER COLUMN {col} SET STATISTICS {int(stat)}")
        settable = [(k, v) for k, v in _options(attopts or []) if k in _COLUMN_OPTIONS]
        if settable:
            opts = ", ".join(f"{quote_ident(k)} = {string_literal(v)}" for k, v in settable)
            _execute(conn, f"ALTER TABLE {new} ALTER COLUMN {col} SET ({opts})")
        if identity:  # LIKE made a sequence of its own: it goes on from the target's
            mine = conn.execute(sa.text("SELECT pg_get_serial_sequence(:n, :c)"), {"n": new, "c": name}).scalar_one()
            state = conn.execute(sa.text(f"SELECT last_value, is_called FROM {sequence}")).one()
            conn.execute(
                sa.text("SELECT setval(CAST(:s AS regclass), :v, :c)"), {"s": mine, "v": state[0], "c": state[1]}
            )
            named, kind, persistence = conn.execute(
                sa.text(
                    "SELECT c.relname, format_type(q.seqtypid, NULL), c.relpersistence FROM pg_class c "
                    "JOIN pg_sequence q ON q.seqrelid = c.oid WHERE c.oid = CAST(:s AS regclass)"
                ),
                {"s": sequence},
            ).one()
            # LIKE makes an identity's sequence bigint and logged, whatever the target's was
            _execute(conn, f"ALTER SEQUENCE {mine} AS {kind}")  # (format_type: a type name the server wrote)
            if persistence == "u":
                _execute(conn, f"ALTER SEQUENCE {mine} SET UNLOGGED")
            sequences.append((str(mine), str(named)))
            drawn.append((str(mine), str(sequence), int(state[0])))
        elif sequence is not None:  # a serial: the default of the new table uses the same sequence; it goes along
            _execute(conn, f"ALTER SEQUENCE {sequence} OWNED BY {new}.{col}")
    loaded = _copy_frozen(conn, reader, new, target)
    _build_indexes(conn, oid, new, schema, target.new)
    _execute(conn, f"ANALYZE {new}")
    fault("driver.swap_loaded")
    # readers wait from here to the commit: the renames, grants and the drop
    _lock_exclusive(conn, old, patience_s)
    why = refusal(conn, schema, target.table) or _older_snapshots(conn)  # (a view made since the first check)
    if why is not None:
        raise SwapRefused(why)
    for mine, sequence, then in drawn:  # a nextval() of the old sequence since (not an insert: those wait)
        now = int(conn.execute(sa.text(f"SELECT last_value FROM {sequence}")).scalar_one())
        if now != then:
            conn.execute(
                sa.text(f"SELECT setval(CAST(:s AS regclass), (SELECT last_value FROM {mine}) + :d)"),
                {"s": mine, "d": now - then},
            )
    indexes = _pair_indexes(conn, oid, new_oid)
    grants = grants_of(conn, oid)  # the table's ACL (if it has one) and columns'
    _execute(conn, f"DROP TABLE {old}")  # RESTRICT: anything binding it made meanwhile fails the swap
    _execute(conn, f"ALTER TABLE {new} RENAME TO {quote_ident(target.table)}")
    for fresh, name, _ in indexes:
        _execute(conn, f"ALTER INDEX {_q(schema, fresh)} RENAME TO {quote_ident(name)}")
    for fresh, name in sequences:
        _execute(conn, f"ALTER SEQUENCE {fresh} RENAME TO {quote_ident(name)}")
    carry(conn, old, owner, replident, rls, force_rls, comment, bool(table[16]), grants, indexes)
    if table[18] is not None:  # the row type's comment (the type was renamed with the table)
        _execute(conn, f"COMMENT ON TYPE {old} IS {string_literal(table[18])}")
    built = appearance(conn, new_oid)
    differs = sorted(k for k, v in built.items() if seen.get(k) != v)
    for k in differs:
        log.debug("swap of %s: %s would change from %r to %r", old, k, seen.get(k), built[k])
    if differs:  # rolled back with the savepoint: the batch is applied in place, the table as it was
        raise SwapRefused(f"the new table would differ from the old in what users see: {', '.join(differs)}")
    return loaded


def _lock_exclusive(conn: Connection, table: str, patience_s: float) -> None:
    """ACCESS EXCLUSIVE on the target, asked for without waiting (a lock request queued behind a reader's open
    transaction would queue every new reader behind it), again and again for ``patience_s``; then the swap is
    refused and the batch applied in place, which readers never wait for."""
    deadline = time.monotonic() + patience_s
    while True:
        try:
            with conn.begin_nested():
                _execute(conn, f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE NOWAIT")
            return
        except sa.exc.DBAPIError as exc:
            if sqlstate_of(exc) != LOCK_NOT_AVAILABLE:
                raise
        if time.monotonic() >= deadline:
            raise SwapRefused(f"another session kept the table open for {patience_s:g} s")
        time.sleep(0.05)


def _older_snapshots(conn: Connection) -> str | None:
    """A session of another transaction begun before this one, holding a snapshot: were it REPEATABLE READ, it
    would read the new table after the swap with a snapshot that sees none of its rows but the frozen ones (the new
    rows), where an in-place apply leaves it the old rows; so it keeps the in-place apply.  A session whose start
    the writer may not see (another role's, without pg_read_all_stats) counts as older."""
    found = conn.execute(
        sa.text(
            "SELECT count(*) FROM pg_stat_activity WHERE pid <> pg_backend_pid() AND datid = "
            "(SELECT oid FROM pg_database WHERE datname = current_database()) AND backend_type = 'client backend' "
            "AND backend_xmin IS NOT NULL AND (xact_start IS NULL OR xact_start < (SELECT xact_start "
            "FROM pg_stat_activity WHERE pid = pg_backend_pid()))"
        )
    ).scalar_one()
    return f"{found} session(s) hold a snapshot older than the overwrite" if found else None


def _options(options: list[str]) -> list[tuple[str, str]]:
    return [(o.partition("=")[0], o.partition("=")[2]) for o in options]


_INDEX_DEFINITIONS = """
SELECT i.indisunique, x.conname, pg_get_constraintdef(x.oid), pg_get_indexdef(i.indexrelid),
       format('%I.%I', n.nspname, t.relname), quote_ident(c.relname), obj_description(i.indexrelid, 'pg_class'),
       obj_description(x.oid, 'pg_constraint')
FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_class t ON t.oid = i.indrelid
JOIN pg_namespace n ON n.oid = t.relnamespace LEFT JOIN pg_constraint x ON x.conindid = i.indexrelid
     AND x.conrelid = i.indrelid AND x.contype IN ('p', 'u', 'x')
WHERE i.indrelid = :t ORDER BY i.indexrelid
"""


def _build_indexes(conn: Connection, oid: int, new: str, schema: str | None, base: str) -> None:
    """The target's indexes and the constraints they back, on the loaded new table, in the target's order (so
    they pair by it), under names of their own until the target's are free; their comments."""
    for k, (unique, constraint, condef, indexdef, table, name, comment, concomment) in enumerate(
        conn.execute(sa.text(_INDEX_DEFINITIONS), {"t": oid}).all()
    ):
        made = quote_ident(f"{base}_{k}")
        if conn.execute(sa.text("SELECT to_regclass(:n)"), {"n": _q(schema, f"{base}_{k}")}).scalar() is not None:
            raise SwapRefused(f"a relation named {base}_{k} is in the way")
        if constraint is not None:  # PRIMARY KEY, UNIQUE, EXCLUDE: with its deferrability, INCLUDE, WITH, tablespace
            _execute(conn, f"ALTER TABLE {new} ADD CONSTRAINT {made} {condef}")
            if concomment is not None:
                _execute(conn, f"COMMENT ON CONSTRAINT {made} ON {new} IS {string_literal(concomment)}")
        else:
            head = f"CREATE {'UNIQUE ' if unique else ''}INDEX {name} ON {table} "  # (quoted by the server)
            if not indexdef.startswith(head):
                raise SwapRefused(f"the definition of index {name} could not be read back")
            rest = indexdef[len(head) :]
            _execute(conn, f"CREATE {'UNIQUE ' if unique else ''}INDEX {made} ON {new} {rest}")
        if comment is not None:
            _execute(conn, f"COMMENT ON INDEX {_q(schema, f'{base}_{k}')} IS {string_literal(comment)}")


def _pair_indexes(conn: Connection, old: int, new: int) -> list[tuple[str, str, str]]:
    """The new table's index names paired with the target's (LIKE copies them in the target's order), with what
    the target's index is to the table beyond its definition: 'r' its replica identity, 'c' its CLUSTER index."""
    have = conn.execute(sa.text(_INDEXES), {"t": old}).all()
    made = conn.execute(sa.text(_INDEXES), {"t": new}).all()
    if [h[5] for h in have] != [m[5] for m in made]:
        raise SwapRefused("its indexes could not be reproduced exactly")
    return [
        (str(m[0]), str(h[0]), ("r" if h[3] else "") + ("c" if h[4] else "")) for h, m in zip(have, made, strict=True)
    ]


def _copy_frozen(conn: Connection, reader: Connection, new: str, target: SwapTarget) -> int:
    """COPY the batch's rows from the shadow (``reader``, a second session: one session cannot COPY out and in at
    once) into the new table, FREEZE; the rows copied, checked against the rows read.  A driver error is raised
    as SQLAlchemy's, so the apply step classifies it as any other (a constraint the rows break withdraws)."""
    import psycopg2

    cols = ", ".join(quote_ident(c) for c in target.columns)
    source: Any = reader.connection.dbapi_connection  # psycopg2's: copy_expert, mogrify
    sink: Any = conn.connection.dbapi_connection
    text, params = statement_text(reader, target.rows)
    with source.cursor() as cur:
        select = cur.mogrify(text, params).decode()  # the driver's own quoting of the values
    copy_out = f"COPY ({select}) TO STDOUT"
    copy_in = f"COPY {new} ({cols}) FROM STDIN WITH (FREEZE)"
    rfd, wfd = os.pipe()
    sent: dict[str, Any] = {}

    def pump() -> None:
        try:
            with os.fdopen(wfd, "wb", buffering=1 << 20) as out, source.cursor() as cur:
                cur.copy_expert(copy_out, out, size=1 << 20)
                sent["rows"] = cur.rowcount
        except BaseException as exc:  # noqa: BLE001 - told to the loading side, which raises it
            sent["error"] = exc

    thread = threading.Thread(target=pump, name="xasink-swap-copy", daemon=True)
    thread.start()
    try:
        with os.fdopen(rfd, "rb", buffering=1 << 20) as inp, sink.cursor() as cur:
            cur.copy_expert(copy_in, inp, size=1 << 20)
            loaded = int(cur.rowcount)
    except psycopg2.Error as exc:
        if exc.pgcode == "25000":  # FREEZE refused: a snapshot of this transaction (a REPEATABLE READ default)
            raise SwapRefused(f"COPY FREEZE is refused in this session: {exc.pgerror or exc}") from None
        raise sa.exc.DBAPIError.instance(copy_in, None, exc, psycopg2.Error) from None
    finally:
        thread.join()  # the pipe's read end is closed: a pump still writing stops (EPIPE)
        if "error" in sent:
            reader.invalidate()  # its COPY may be half read
    if "error" in sent:
        error = sent["error"]
        if isinstance(error, psycopg2.Error):
            raise sa.exc.DBAPIError.instance(copy_out, None, error, psycopg2.Error) from None
        raise error
    reader.rollback()
    if sent.get("rows") != loaded:
        raise RuntimeError(f"the swap copied {loaded} rows of the {sent.get('rows')} it read")  # a torn stream
    return loaded
