"""Checks before a batch writes: the server (version, XA settings, durability, privileges) and the table
(engine, kind, whether LOAD DATA REPLACE is the same merge as an upsert)."""

from __future__ import annotations

import dataclasses
import logging
import re
from typing import TYPE_CHECKING

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ...errors import PreflightError
from ..base import DurabilityRisk, TargetPlan
from .errors import PRIVILEGE_CODES
from .sql import errno_of

if TYPE_CHECKING:
    from .dialect import MySQLDialect

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


def check_server(dialect: MySQLDialect, conn: Connection) -> None:
    version = str(conn.exec_driver_sql("SELECT VERSION()").scalar_one())
    is_mariadb = "mariadb" in version.lower()
    nums = tuple(int(x) for x in re.findall(r"\d+", version)[:2])
    if is_mariadb and nums < (10, 5):
        raise PreflightError(
            f"MariaDB {version} at {dialect.where()} rolls back a prepared XA transaction when its session ends; "
            "xasink needs MariaDB 10.5 or later"
        )
    if not is_mariadb and nums < (8, 0):
        raise PreflightError(f"MySQL {version} at {dialect.where()} is too old for xasink; use MySQL 8.0 or later")
    try:
        dialect.list_prepared(conn)
    except sa.exc.DBAPIError as exc:
        if errno_of(exc) in PRIVILEGE_CODES:
            raise PreflightError(
                f"user '{dialect.url.username}' may not run XA RECOVER on MySQL at {dialect.where()}, which "
                "xasink needs to finish and clean up branches: GRANT XA_RECOVER_ADMIN ON *.* TO the writing user"
            ) from None
        raise
    if is_mariadb:
        legacy = conn.exec_driver_sql("SHOW GLOBAL VARIABLES LIKE 'legacy_xa_rollback_at_disconnect'").fetchall()
        if legacy and str(legacy[0][1]).upper() in ("ON", "1"):
            raise PreflightError(
                f"MariaDB at {dialect.where()} has legacy_xa_rollback_at_disconnect = ON, which rolls back a "
                "prepared branch when its writer disconnects: SET GLOBAL legacy_xa_rollback_at_disconnect = OFF"
            )
    server_infile = conn.exec_driver_sql("SELECT @@GLOBAL.local_infile").scalar_one()
    if dialect.settings.local_infile and not int(server_infile or 0):
        log.warning(
            "%s at %s has local_infile = OFF: loading with multi-row INSERT instead of LOAD DATA LOCAL "
            "(slower). To use LOAD DATA: SET GLOBAL local_infile = 1; to silence this: localInfile=false",
            dialect.name,
            dialect.where(),
        )


def check_table(dialect: MySQLDialect, conn: Connection, plan: TargetPlan) -> TargetPlan:
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
    if plan.upsert_keys and replace_is_upsert(conn, plan):
        log.info("upsert into %s: LOAD DATA REPLACE (the key is the table's only unique key)", target)
        return dataclasses.replace(plan, upsert_by_replace=True)
    return plan


def replace_is_upsert(conn: Connection, plan: TargetPlan) -> bool:
    """Whether REPLACE leaves exactly the rows ON DUPLICATE KEY UPDATE (every column) would: the upsert key
    is the table's only unique key, no foreign key refers to the table and it has no triggers (then the
    server turns each REPLACE of a row into an UPDATE of it, not a DELETE and INSERT), and every column is
    written (REPLACE would reset the others to their defaults)."""
    where = {"schema": plan.schema, "table": plan.table}
    same_table = "TABLE_SCHEMA = COALESCE(:schema, DATABASE()) AND TABLE_NAME = :table"
    unique = conn.execute(
        sa.text(
            f"SELECT INDEX_NAME, COLUMN_NAME FROM information_schema.STATISTICS WHERE {same_table} AND NON_UNIQUE = 0"
        ),
        where,
    ).all()
    columns = conn.execute(
        sa.text(f"SELECT COLUMN_NAME FROM information_schema.COLUMNS WHERE {same_table}"), where
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
    indexes = {str(name) for name, _ in unique}
    key_columns = {str(col).lower() for _, col in unique}
    return (
        len(indexes) == 1
        and key_columns == {k.lower() for k in plan.upsert_keys}
        and not blockers
        and {str(c).lower() for (c,) in columns} == {n.lower() for n in plan.arrow_schema.names}
    )
