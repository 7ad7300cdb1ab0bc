"""The decision log's table layout: its tables' columns, and the one query that tells a log is ready.

``xasink/journal/sql/*.sql`` (``xasink ddl``) holds the same DDL for DBAs; tests/test_mysql_dialect.py keeps
the two in step.
"""

from __future__ import annotations

import functools
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import mysql

# MySQL/MariaDB: the log's text columns compare byte for byte, as on PostgreSQL.  The server's default
# collation (utf8mb4_general_ci and the like) ignores case: sinks "Orders" and "orders" would share one row.
# (utf8mb4_bin pads with spaces, but no identity the log compares ends in one: sink ids are [A-Za-z0-9_.-],
# run and log ids hex, targets JSON.)
BINARY_COLLATION = "utf8mb4_bin"
# MySQL/MariaDB: the most batches.target (TEXT) holds, in bytes (see JournalTables.target_too_long)
TARGET_MAX_BYTES = 65_535
MYSQL_TABLE: dict[str, Any] = {"mysql_engine": "InnoDB", "mysql_charset": "utf8mb4", "mysql_collate": BINARY_COLLATION}


def journal_metadata(
    schema: str | None = None, prefix: str = "xasink_"
) -> tuple[sa.Table, sa.Table, sa.Table, sa.Table]:
    """The journal tables; ``xasink/journal/sql/*.sql`` (``xasink ddl``) holds the same DDL for DBAs."""
    md = sa.MetaData(schema=schema)
    sinks = sa.Table(
        f"{prefix}sinks",
        md,
        sa.Column("sink_id", sa.String(32), primary_key=True),
        sa.Column("created_at", sa.DateTime, nullable=False),
        # batch ids up to this one may have been forgotten by an older xasink's trim (set when such a log
        # is upgraded): one of them not in the log is refused, never guessed.  NULL: nothing forgotten
        sa.Column("horizon", sa.BigInteger),
        **MYSQL_TABLE,  # InnoDB: row locks and transactions; binary collation (MySQL/MariaDB); ignored elsewhere
    )
    batches = sa.Table(
        f"{prefix}batches",
        md,
        sa.Column("sink_id", sa.String(32), primary_key=True),
        sa.Column("batch_id", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("state", sa.String(16), nullable=False),
        # MySQL's TEXT holds 64 KiB, a few hundred xids: LONGTEXT there
        sa.Column("xids", sa.Text().with_variant(mysql.LONGTEXT(), "mysql", "mariadb"), nullable=False),
        sa.Column("rows", sa.BigInteger, nullable=False),
        sa.Column("branches", sa.Integer, nullable=False),
        sa.Column("prepare_ms", sa.Integer, nullable=False),
        sa.Column("commit_ms", sa.Integer),
        sa.Column("decided_at", sa.DateTime, nullable=False),
        sa.Column("committed_at", sa.DateTime),
        # the xid list was emptied by retention (the batch is committed; only the fact is kept)
        sa.Column("compacted", sa.Boolean(create_constraint=False), nullable=False, server_default=sa.false()),
        # what the batch wrote: JSON {"db", "schema", "table"[, "query"]}, with the deciding "run" (and a write
        # mode's "apply" step while it is pending); NULL in rows of older logs
        sa.Column("target", sa.Text),
        **MYSQL_TABLE,
    )
    claims = sa.Table(
        f"{prefix}claims",
        md,
        sa.Column("sink_id", sa.String(32), primary_key=True),
        sa.Column("batch_id", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("run", sa.String(8), primary_key=True),
        sa.Column("superseded", sa.Boolean(create_constraint=False), nullable=False),
        sa.Column("claimed_at", sa.DateTime, nullable=False),
        # the session lock a live run's driver holds (xasink.protocol.liveness); NULL for runs that keep none
        sa.Column("guard", sa.String(64)),
        **MYSQL_TABLE,
    )
    logs = sa.Table(
        f"{prefix}log",
        md,
        sa.Column("slot", sa.SmallInteger, primary_key=True, autoincrement=False),  # always 1: one row
        sa.Column("log_id", sa.String(10), nullable=False),
        sa.Column("created_at", sa.DateTime, nullable=False),
        **MYSQL_TABLE,
    )
    return sinks, batches, claims, logs


def parts_table(md: sa.MetaData, prefix: str = "xasink_") -> sa.Table:
    """One row per write of a multi-target transaction (xasink.transaction): its target and prepared xids.

    Recorded by the write's commit without deciding; the transaction decides over all its parts at once,
    and recovery finishes each database's parts (``server``) against this one log.
    """
    return sa.Table(
        f"{prefix}parts",
        md,
        sa.Column("sink_id", sa.String(32), primary_key=True),
        sa.Column("batch_id", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("run", sa.String(8), primary_key=True),
        sa.Column("part", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("server", sa.String(300), nullable=False),  # the target database's server identity
        sa.Column("target", sa.Text, nullable=False),  # JSON {"db", "schema", "table"}
        sa.Column("xids", sa.Text().with_variant(mysql.LONGTEXT(), "mysql", "mariadb"), nullable=False),
        sa.Column("rows", sa.BigInteger, nullable=False),
        sa.Column("prepare_ms", sa.Integer, nullable=False),
        sa.Column("committed", sa.Boolean(create_constraint=False), nullable=False),
        **MYSQL_TABLE,
    )


@functools.lru_cache(maxsize=64)
def log_tables(schema: str | None, prefix: str) -> tuple[sa.Table, sa.Table, sa.Table, sa.Table, sa.Table]:
    """The log's tables, one set per (schema, prefix) for the life of the process.

    SQLAlchemy keys its compiled-statement cache on the Table objects: a coordinator made per batch with
    tables of its own compiled every decision-log statement again (seven a batch, some 7 ms of the driver's
    CPU on each micro-batch).  Table definitions never change once made, so every Journal shares them.
    """
    sinks, batches, claims, logs = journal_metadata(schema, prefix)
    return sinks, batches, claims, logs, parts_table(sinks.metadata, prefix)


@functools.lru_cache(maxsize=64)
def ready_query(schema: str | None, prefix: str, mysql: bool) -> sa.Select[tuple[str]]:
    """The log's id where every table has every column of this layout (a missing one fails the statement)
    and, on MySQL/MariaDB, every text column compares byte for byte.  Built once: SQLAlchemy's cache key of
    a statement this size costs more to compute than the statement's round trip."""
    sinks, batches, claims, logs, _ = log_tables(schema, prefix)
    empty = [
        sa.select(sa.func.count()).select_from(sa.select(*t.c).where(sa.false()).subquery()).scalar_subquery()
        for t in (sinks, batches, claims)
    ]
    query = sa.select(logs.c.log_id).where(logs.c.slot == 1, *(e == 0 for e in empty))
    if mysql:  # COLLATION() of a column is its declared collation, whatever the value: no row is read
        query = query.where(
            *(
                sa.func.collation(sa.select(c).where(sa.false()).scalar_subquery()) == BINARY_COLLATION
                for t in (logs, sinks, batches, claims)
                for c in t.c
                if isinstance(c.type, sa.String)
            )
        )
    return query
