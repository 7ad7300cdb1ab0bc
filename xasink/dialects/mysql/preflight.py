"""Checks before a batch writes: the server (version, XA settings, durability, privileges) and the table
(engine, kind, and how an upsert merges so that it touches only the rows whose key matches)."""

from __future__ import annotations

import dataclasses
import logging
import re

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from xasink.dialects.base import Dialect
from xasink.dialects.mysql.errors import PRIVILEGE_CODES
from xasink.dialects.mysql.sql import errno_of
from xasink.dialects.values import DurabilityRisk, TargetPlan
from xasink.errors import PreflightError

log = logging.getLogger("xasink.dialects.mysql")


def durability_risks(conn: Connection) -> list[DurabilityRisk]:
    flush, log_bin, sync_binlog = conn.exec_driver_sql(
        "SELECT @@GLOBAL.innodb_flush_log_at_trx_commit, @@GLOBAL.log_bin, @@GLOBAL.sync_binlog"
    ).one()
    risks = []
    if str(flush) != "1":  # 0 and 2 flush the redo log (and so XA PREPARE) about once a second
        fix = "innodb_flush_log_at_trx_commit = 1: SET GLOBAL innodb_flush_log_at_trx_commit = 1 (and my.cnf)"
        risks.append(DurabilityRisk("innodb_flush_log_at_trx_commit", str(flush), fix))
    if str(log_bin).upper() in ("1", "ON") and str(sync_binlog) != "1":  # XA PREPARE is in the binary log too
        fix = "sync_binlog = 1: SET GLOBAL sync_binlog = 1 (and my.cnf)"
        risks.append(DurabilityRisk("sync_binlog", str(sync_binlog), fix))
    return risks


def write_blockers(dialect: Dialect, conn: Connection, read_only: bool = True) -> list[str]:
    """What stops XA writes on this server, with the fix; ``read_only``: also a server in read-only mode (a
    writer with READ ONLY ADMIN may still write there, so only ``xasink status`` reports it)."""
    version, writes_refused = conn.exec_driver_sql("SELECT VERSION(), @@GLOBAL.read_only").one()
    version = str(version)
    is_mariadb = "mariadb" in version.lower()
    nums = tuple(int(x) for x in re.findall(r"\d+", version)[:2])
    found = []
    if is_mariadb and nums < (10, 5):
        found.append(
            f"MariaDB {version} at {dialect.where()} rolls back a prepared XA transaction when its session ends; "
            "xasink needs MariaDB 10.5 or later"
        )
    if not is_mariadb and nums < (8, 0):
        found.append(f"MySQL {version} at {dialect.where()} is too old for xasink; use MySQL 8.0 or later")
    if is_mariadb:
        legacy = conn.exec_driver_sql("SHOW GLOBAL VARIABLES LIKE 'legacy_xa_rollback_at_disconnect'").fetchall()
        if legacy and str(legacy[0][1]).upper() in ("ON", "1"):
            found.append(
                f"MariaDB at {dialect.where()} has legacy_xa_rollback_at_disconnect = ON, which rolls back a "
                "prepared branch when its writer disconnects: SET GLOBAL legacy_xa_rollback_at_disconnect = OFF"
            )
    if read_only and str(writes_refused).upper() in ("1", "ON"):
        found.append(
            f"{dialect.name} at {dialect.where()} has read_only = ON: writers without the READ ONLY ADMIN (or "
            "SUPER) privilege cannot write, nor can recovery finish a branch. SET GLOBAL read_only = OFF, or point "
            "the URL at the primary server"
        )
    return found


def check_server(dialect: Dialect, conn: Connection) -> None:
    blockers = write_blockers(dialect, conn, read_only=False)
    if blockers:
        raise PreflightError(blockers[0])
    try:
        dialect.list_prepared(conn)
    except sa.exc.DBAPIError as exc:
        if errno_of(exc) in PRIVILEGE_CODES:
            raise PreflightError(
                f"user '{dialect.url.username}' may not run XA RECOVER on MySQL at {dialect.where()}, which "
                "xasink needs to finish and clean up branches: GRANT XA_RECOVER_ADMIN ON *.* TO the writing user"
            ) from None
        raise
    server_infile = conn.exec_driver_sql("SELECT @@GLOBAL.local_infile").scalar_one()
    if dialect.settings.local_infile and not int(server_infile or 0):
        log.warning(
            "%s at %s has local_infile = OFF: loading with multi-row INSERT instead of LOAD DATA LOCAL "
            "(slower). To use LOAD DATA: SET GLOBAL local_infile = 1; to silence this: localInfile=false",
            dialect.name,
            dialect.where(),
        )


def check_apply(dialect: Dialect, conn: Connection) -> None:
    """Refuse a write whose apply step (overwrite, replaceWhere, change-data) the binary log would refuse.

    The apply runs at READ COMMITTED (its reads of the shadow lock nothing a prepared branch holds), and InnoDB
    will not log a READ COMMITTED write as a statement (error 1665): with binlog_format = STATEMENT the batch
    would be decided and its branches committed, and then no apply, by the driver or ``xasink recover``, could
    ever run.  The session's own values count (a user with the privilege may log by row for its session).
    """
    log_bin, logged, binlog_format = conn.exec_driver_sql(
        "SELECT @@GLOBAL.log_bin, @@SESSION.sql_log_bin, @@SESSION.binlog_format"
    ).one()
    conn.rollback()
    if (
        str(log_bin).upper() in ("1", "ON")
        and str(logged).upper() in ("1", "ON")
        and str(binlog_format).upper() == "STATEMENT"
    ):
        raise PreflightError(
            f"{dialect.name} at {dialect.where()} has binlog_format = STATEMENT with the binary log on: an overwrite, "
            "replaceWhere or change-data write applies its batch at READ COMMITTED, which statement-based logging "
            "refuses (error 1665), so the batch could be decided but never applied. SET GLOBAL binlog_format = "
            "'MIXED' (or 'ROW'; also in my.cnf), or log this user's sessions by row, or write with mode('append')"
        )


def check_table(dialect: Dialect, conn: Connection, plan: TargetPlan) -> TargetPlan:
    row = conn.execute(
        sa.text(
            "SELECT ENGINE, TABLE_TYPE FROM information_schema.TABLES "
            "WHERE TABLE_SCHEMA = COALESCE(:schema, DATABASE()) AND TABLE_NAME = :table"
        ),
        {"schema": plan.schema, "table": plan.table},
    ).first()
    conn.rollback()
    target = f"{plan.schema}.{plan.table}" if plan.schema else plan.table
    if row is None:
        return plan  # reflection found it a moment ago; the branch will say what happened
    engine, kind = row
    if str(kind).upper() != "BASE TABLE":
        raise PreflightError(f"{target} is a {str(kind).lower()}: xasink writes into base tables only")
    if str(engine or "").lower() != "innodb":
        raise PreflightError(
            f"table {target} uses the {engine} storage engine, which has no XA transactions: rows would "
            f"become visible before the batch commits. Convert it: ALTER TABLE {target} ENGINE=InnoDB"
        )
    refuse_generated(conn, plan, target)
    if plan.upsert_keys:
        return upsert_plan(conn, plan, target)
    return plan


def refuse_generated(conn: Connection, plan: TargetPlan, target: str) -> None:
    """A value for a generated column is refused, as the server refuses it to an INSERT (error 1906, Spark's JDBC
    writer's): LOAD DATA would drop it silently and store the column's expression instead."""
    found = conn.execute(
        sa.text(
            "SELECT COLUMN_NAME, EXTRA FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = COALESCE(:schema, "
            "DATABASE()) AND TABLE_NAME = :table AND (EXTRA LIKE '%VIRTUAL%' OR EXTRA LIKE '%STORED%' OR "
            "EXTRA LIKE '%PERSISTENT%')"  # (not MySQL 8's DEFAULT_GENERATED: a column with an expression default)
        ),
        {"schema": plan.schema, "table": plan.table},
    ).all()
    conn.rollback()
    written = {n.lower() for n in plan.arrow_schema.names}
    generated = [(str(name), str(extra)) for name, extra in found if str(name).lower() in written]
    if generated:
        shown = ", ".join(f"'{name}' ({extra})" for name, extra in generated)
        raise PreflightError(
            f"the DataFrame has a value for generated column(s) {shown} of {target}, which the server computes "
            "and refuses to take (error 1906, as Spark's JDBC writer gets). Drop those columns from the DataFrame "
            "before writing. Nothing was written."
        )


@dataclasses.dataclass(frozen=True)
class UniqueIndex:
    name: str
    columns: tuple[str, ...]  # lower case, in index order
    prefix: bool  # some column is indexed by a prefix only (UNIQUE (code(4)))

    def show(self) -> str:
        return f"{self.name} ({', '.join(self.columns)}){' (a prefix index)' if self.prefix else ''}"


def unique_indexes(conn: Connection, plan: TargetPlan) -> list[UniqueIndex]:
    """The table's unique indexes, from information_schema."""
    found = conn.execute(
        sa.text(
            "SELECT INDEX_NAME, COLUMN_NAME, SUB_PART FROM information_schema.STATISTICS "
            "WHERE TABLE_SCHEMA = COALESCE(:schema, DATABASE()) AND TABLE_NAME = :table AND NON_UNIQUE = 0 "
            "ORDER BY INDEX_NAME = 'PRIMARY' DESC, INDEX_NAME, SEQ_IN_INDEX"
        ),
        {"schema": plan.schema, "table": plan.table},
    ).all()
    conn.rollback()
    out: dict[str, UniqueIndex] = {}
    for name, column, sub_part in found:
        was = out.get(str(name), UniqueIndex(str(name), (), False))
        out[str(name)] = UniqueIndex(was.name, (*was.columns, str(column).lower()), was.prefix or sub_part is not None)
    return list(out.values())


def upsert_plan(conn: Connection, plan: TargetPlan, target: str) -> TargetPlan:
    """How the branch merges, so that it touches only rows whose key matches (as PostgreSQL's ON CONFLICT on the
    key does) and any other unique conflict fails the batch.

    ON DUPLICATE KEY UPDATE and REPLACE act on whichever unique index conflicts first: safe only when the key's
    own index (all of its columns, no prefix) is the table's only unique index.  Otherwise the branch updates
    the rows found by the key and inserts the rest with a plain INSERT (``upsert_by_update``), so a conflict on
    any other index (a prefix index on the key included: 'ABCD-002' is not the key 'ABCD-001') is a
    duplicate-key error naming that index.  "The key matches" means the key columns' own equality (their
    collation), which is also what their unique index holds unique.
    """
    indexes = unique_indexes(conn, plan)
    keys = {k.lower() for k in plan.upsert_keys}
    own = [ix for ix in indexes if set(ix.columns) == keys and not ix.prefix]
    others = [ix for ix in indexes if ix not in own]
    lookup = next(iter(own or [ix for ix in indexes if set(ix.columns) == keys]), None)
    by_update = bool(others)
    if by_update and not conn.dialect.is_mariadb:  # type: ignore[attr-defined]
        # the key-only merge loads a temporary table inside the branch, which MySQL 8 may refuse
        raise PreflightError(
            f"option 'upsertKeyColumns' ({', '.join(plan.upsert_keys)}): table {target} has unique index(es) "
            f"{'; '.join(ix.show() for ix in others)} besides the key's, and on MySQL the upsert (INSERT .. ON "
            "DUPLICATE KEY UPDATE) would update the row that conflicts on any of them, even one of another key. "
            "Drop those unique indexes, or upsert on MariaDB, or write with mode('append') into a staging table"
        )
    plan = dataclasses.replace(plan, upsert_index=lookup.name if lookup else None, upsert_by_update=by_update)
    if not by_update and replace_is_upsert(conn, plan):
        log.info("upsert into %s: LOAD DATA REPLACE (the key is the table's only unique key)", target)
        return dataclasses.replace(plan, upsert_by_replace=True)
    if by_update:
        log.info(
            "upsert into %s: UPDATE by the key, then INSERT (the table has other unique indexes: %s)",
            target,
            "; ".join(ix.show() for ix in others),
        )
        plan = dataclasses.replace(plan, numbered=numbered_column(conn, plan))
    return plan


_NUMBER_TYPE = re.compile(r"[a-z]+(\(\d+(,\d+)?\))?( unsigned)?( zerofill)?", re.I)


def numbered_column(conn: Connection, plan: TargetPlan) -> tuple[str, str] | None:
    """The written AUTO_INCREMENT column and its type, if any: the server makes it NOT NULL, and a staging table
    made from it by CREATE .. SELECT would refuse the NULLs an INSERT numbers."""
    found = conn.execute(
        sa.text(
            "SELECT COLUMN_NAME, COLUMN_TYPE FROM information_schema.COLUMNS WHERE "
            "TABLE_SCHEMA = COALESCE(:schema, DATABASE()) AND TABLE_NAME = :table AND EXTRA LIKE '%auto_increment%'"
        ),
        {"schema": plan.schema, "table": plan.table},
    ).first()
    conn.rollback()
    written = {n.lower(): n for n in plan.arrow_schema.names}
    if found is None or str(found[0]).lower() not in written or not _NUMBER_TYPE.fullmatch(str(found[1])):
        return None  # (an AUTO_INCREMENT column is a number's; any other text is not put into a statement)
    return written[str(found[0]).lower()], str(found[1])


def replace_is_upsert(conn: Connection, plan: TargetPlan) -> bool:
    """Whether REPLACE leaves exactly the rows ON DUPLICATE KEY UPDATE (every column) would: the upsert key
    is the table's only unique key (all of its columns, no prefix), its columns compare byte for byte (a
    case-insensitive key 'abc' matches the row 'ABC', and REPLACE would rewrite its key to 'abc'), no foreign
    key refers to the table and it has no triggers (then the server turns each REPLACE of a row into an
    UPDATE of it, not a DELETE and INSERT), and every column is written (REPLACE would reset the others to
    their defaults)."""
    where = {"schema": plan.schema, "table": plan.table}
    same_table = "TABLE_SCHEMA = COALESCE(:schema, DATABASE()) AND TABLE_NAME = :table"
    columns = conn.execute(
        sa.text(f"SELECT COLUMN_NAME, COLLATION_NAME FROM information_schema.COLUMNS WHERE {same_table}"), where
    ).all()
    blockers = conn.execute(
        sa.text(
            "SELECT (SELECT COUNT(*) FROM information_schema.TRIGGERS WHERE "
            "EVENT_OBJECT_SCHEMA = COALESCE(:schema, DATABASE()) AND EVENT_OBJECT_TABLE = :table) + "
            "(SELECT COUNT(*) FROM information_schema.REFERENTIAL_CONSTRAINTS WHERE "
            "UNIQUE_CONSTRAINT_SCHEMA = COALESCE(:schema, DATABASE()) AND REFERENCED_TABLE_NAME = :table)"
        ),
        where,
    ).scalar()
    conn.rollback()
    keys = {k.lower() for k in plan.upsert_keys}
    only_key = all(set(ix.columns) == keys and not ix.prefix for ix in unique_indexes(conn, plan))
    exact = all(
        collation is None or str(collation).lower().endswith("_bin") or str(collation).lower() == "binary"
        for name, collation in columns
        if str(name).lower() in keys
    )
    return (
        only_key
        and exact
        and not blockers
        and {str(c).lower() for c, _ in columns} == {n.lower() for n in plan.arrow_schema.names}
    )
