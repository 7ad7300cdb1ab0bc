"""What users see of a PostgreSQL table besides its rows: carried over to the swap's new table, then checked.

The swap (:mod:`xasink.dialects.postgres.swap`) builds a new table and carries over what LIKE does not copy;
this is its check that nothing was missed: ACLs with their grantors (a grant re-made by the owner could no
longer be revoked by the role that made it; a missing ACL is read as its owner's default), comments (the row
type's too), options (the TOAST table's too), statistics targets and planner settings (n_distinct) of columns
(index expression columns' too), constraints (NOT VALID kept), identity and serial sequences (their ACLs,
comments, type and persistence).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from xasink.dialects.postgres.sql import driver_sql, quote_ident, string_literal
from xasink.dialects.values import SwapRefused

_ACL = """(SELECT string_agg(x, ',' ORDER BY x) FROM (SELECT concat_ws(':',
            coalesce(pg_get_userbyid(nullif(g.grantee, 0)), 'PUBLIC'), g.privilege_type, g.is_grantable,
            pg_get_userbyid(g.grantor)) AS x
            FROM aclexplode({acl}) g) acl)"""
_APPEARANCE = f"""
SELECT pg_get_userbyid(c.relowner), {_ACL.format(acl="coalesce(c.relacl, acldefault('r', c.relowner))")},
       obj_description(c.oid, 'pg_class'), c.reloptions::text,
       (SELECT t.reloptions::text FROM pg_class t WHERE t.oid = c.reltoastrelid),
       c.relreplident::text || c.relrowsecurity::text || c.relforcerowsecurity::text || c.reltablespace::text,
       (SELECT string_agg(concat_ws('|', a.attname, a.attstattarget,
                                    (SELECT string_agg(o, ',' ORDER BY o) FROM unnest(a.attoptions) o
                                     WHERE split_part(o, '=', 1) IN ('n_distinct', 'n_distinct_inherited')),
                                    col_description(c.oid, a.attnum), {_ACL.format(acl="a.attacl")}),
                          ';' ORDER BY a.attnum)
        FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped),
       (SELECT string_agg(concat_ws('|', conname, contype, convalidated, pg_get_constraintdef(oid),
                                    obj_description(oid, 'pg_constraint')), ';'
                          ORDER BY conname)
        FROM pg_constraint WHERE conrelid = c.oid),
       (SELECT string_agg(concat_ws('|', ic.relname, i.indisclustered, ic.reloptions::text,
                                    obj_description(ic.oid, 'pg_class'),
                                    (SELECT string_agg(ia.attstattarget::text, ',' ORDER BY ia.attnum)
                                     FROM pg_attribute ia WHERE ia.attrelid = ic.oid)), ';' ORDER BY ic.relname)
        FROM pg_index i JOIN pg_class ic ON ic.oid = i.indexrelid WHERE i.indrelid = c.oid),
       (SELECT string_agg(concat_ws('|', a.attname, sc.relname, pg_get_userbyid(sc.relowner),
                                    obj_description(sc.oid, 'pg_class'), sc.relpersistence,
                                    (SELECT format_type(q.seqtypid, NULL) FROM pg_sequence q
                                     WHERE q.seqrelid = sc.oid),
                                    {_ACL.format(acl="coalesce(sc.relacl, acldefault('s', sc.relowner))")}),
                          ';' ORDER BY a.attnum)
        FROM pg_attribute a
        JOIN pg_class sc ON sc.oid = CAST(pg_get_serial_sequence(CAST(c.oid AS regclass)::text, a.attname) AS regclass)
        WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped),
       obj_description(c.reltype, 'pg_type')
FROM pg_class c WHERE c.oid = :t
"""
ASPECTS = (
    "owner",
    "grants",
    "comment",
    "options",
    "TOAST options",
    "replica identity, row security, tablespace",
    "columns (statistics, options, comments, grants)",
    "constraints",
    "indexes",
    "sequences",
    "row type's comment",
)


def appearance(conn: Connection, oid: int) -> dict[str, Any]:
    """What users see of the table (:data:`_APPEARANCE`), by aspect: a swap whose new table differs in any is
    refused (the batch is applied in place), so no grant, comment or setting is lost or changed by it."""
    return dict(zip(ASPECTS, conn.execute(sa.text(_APPEARANCE), {"t": oid}).one(), strict=True))


_GRANTS = """
SELECT coalesce(pg_get_userbyid(nullif(g.grantee, 0)), ''), g.privilege_type, g.is_grantable, NULL::name
FROM pg_class c, aclexplode(c.relacl) g WHERE c.oid = :t
UNION ALL
SELECT coalesce(pg_get_userbyid(nullif(g.grantee, 0)), ''), g.privilege_type, g.is_grantable, a.attname
FROM pg_attribute a, aclexplode(a.attacl) g WHERE a.attrelid = :t AND a.attnum > 0 AND NOT a.attisdropped
"""

# who holds a privilege on the table now (its ACL as CREATE TABLE left it: default privileges included)
_ACL_GRANTEES = """
SELECT DISTINCT coalesce(pg_get_userbyid(nullif(g.grantee, 0)), '')
FROM pg_class c, aclexplode(c.relacl) g WHERE c.oid = CAST(:t AS regclass)
"""


def grants_of(conn: Connection, oid: int) -> list[Any]:
    """The table's own ACL entries (none when it has no ACL of its own) and its columns', by name."""
    return list(conn.execute(sa.text(_GRANTS), {"t": oid}).all())


def carry(
    conn: Connection,
    table: str,
    owner: str,
    replident: str,
    rls: bool,
    force_rls: bool,
    comment: str | None,
    had_acl: bool,
    grants: Sequence[Any],
    indexes: list[tuple[str, str, str]],
) -> None:
    """What users see of the table that LIKE does not copy: grants, comment, replica identity, CLUSTER index, RLS.

    The new table's ACL is what CREATE TABLE gave it, its creator's default privileges included: every grant of
    it is revoked first, so a privilege revoked on the target never comes back; a target without an ACL of its
    own gets its owner's default privileges, then the target's table and column grants, by its owner."""
    fresh = conn.execute(sa.text(_ACL_GRANTEES), {"t": table}).scalars().all()
    names = ", ".join(["PUBLIC", quote_ident(owner), *(quote_ident(str(g)) for g in fresh if g and g != owner)])
    conn.exec_driver_sql(driver_sql(f"REVOKE ALL ON {table} FROM {names}"))
    if not had_acl:
        conn.exec_driver_sql(driver_sql(f"GRANT ALL ON {table} TO {quote_ident(owner)}"))
    for grantee, privilege, grantable, column in grants:
        if not str(privilege).replace(" ", "").isalpha():
            raise SwapRefused(f"an unknown privilege {privilege!r}")
        on = f"{privilege} ({quote_ident(column)})" if column else str(privilege)
        to = quote_ident(grantee) if grantee else "PUBLIC"
        conn.exec_driver_sql(driver_sql(f"GRANT {on} ON {table} TO {to}{' WITH GRANT OPTION' if grantable else ''}"))
    if comment is not None:
        conn.exec_driver_sql(driver_sql(f"COMMENT ON TABLE {table} IS {string_literal(comment)}"))
    identity = {"n": "NOTHING", "f": "FULL"}.get(replident)
    for _, name, role in indexes:
        if "r" in role and replident == "i":
            identity = f"USING INDEX {quote_ident(name)}"
        if "c" in role:
            conn.exec_driver_sql(driver_sql(f"ALTER TABLE {table} CLUSTER ON {quote_ident(name)}"))
    if identity:
        conn.exec_driver_sql(driver_sql(f"ALTER TABLE {table} REPLICA IDENTITY {identity}"))
    if rls:
        conn.exec_driver_sql(driver_sql(f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY"))
    if force_rls:
        conn.exec_driver_sql(driver_sql(f"ALTER TABLE {table} FORCE ROW LEVEL SECURITY"))
