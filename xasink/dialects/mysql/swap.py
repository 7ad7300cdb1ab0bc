"""MariaDB/MySQL: an overwrite by renaming a new table into the target's place.

Views, grants and the code around the table bind it by name, and ``RENAME TABLE t TO old, new TO t`` swaps both
names at once.  But DDL commits: the swap cannot commit with the batch's mark, as PostgreSQL's does.  So the
old storage takes a name that says which decision swapped it (:func:`xasink.write_modes.swap.witness_name`):
the rename is the point of no return, and the table under that name is its witness until the mark has
committed.  The caller (:mod:`xasink.protocol.renamed_overwrite`) runs the steps under the table's apply lock,
which GET_LOCK keeps across the commits.

The new table is ``CREATE TABLE … LIKE`` the target (columns, defaults, indexes, CHECK constraints, comments,
table options, partitioning; compared by ``SHOW CREATE TABLE``, so a definition ``LIKE`` does not reproduce, such
as a DATA DIRECTORY, applies in place), its AUTO_INCREMENT counter set to the target's, loaded by one
``INSERT … SELECT`` into the empty table (InnoDB logs no undo per row there) and analyzed.  ``LIKE`` copies
no trigger and no foreign key: such tables, tables of another engine than InnoDB, and a writer that may not
create, rename or drop tables are overwritten in place (:class:`SwapRefused`, nothing changed).
"""

from __future__ import annotations

import logging
import re
import time
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from xasink.dialects.mysql.catalog import referencing_tables
from xasink.dialects.mysql.errors import PRIVILEGE_CODES
from xasink.dialects.mysql.innodb import read_views
from xasink.dialects.mysql.sql import driver_sql, errno_of, quote_ident
from xasink.dialects.rendering import insert_selected
from xasink.dialects.values import SwapRefused, SwapTarget

log = logging.getLogger("xasink.dialects.mysql")

MAX_NAME = 64
RETRY_S = 0.15  # between two tries of the rename
# how long older snapshots may hold the rename up: most end within milliseconds, and a long report's REPEATABLE
# READ transaction would cost every overwrite the whole patience (on a busy server, someone always holds one)
SNAPSHOT_PATIENCE_S = 1.0
LOCK_WAIT_TIMEOUT = 1205  # also MariaDB's answer to a metadata lock not granted within lock_wait_timeout
_TABLES = "FROM information_schema.TABLES WHERE TABLE_SCHEMA = COALESCE(:s, DATABASE())"


def _q(schema: str | None, name: str) -> str:
    return f"{quote_ident(schema)}.{quote_ident(name)}" if schema else quote_ident(name)


def refusal(conn: Connection, schema: str | None, table: str) -> str | None:
    """Why the target cannot be swapped without changing what others see (None: it can)."""
    found = conn.execute(sa.text(f"SELECT ENGINE {_TABLES} AND TABLE_NAME = :t"), {"s": schema, "t": table}).first()
    if found is None:
        return "the table was not found in information_schema"
    (engine,) = found  # (a system-versioned table is refused at planning: base tables only)
    if str(engine).upper() != "INNODB":
        return f"its engine is {engine}, not InnoDB"
    triggers = conn.execute(
        sa.text(
            "SELECT TRIGGER_NAME FROM information_schema.TRIGGERS WHERE EVENT_OBJECT_SCHEMA = COALESCE(:s, DATABASE()) "
            "AND EVENT_OBJECT_TABLE = :t ORDER BY 1"
        ),
        {"s": schema, "t": table},
    ).scalars()
    named = ", ".join(map(str, triggers))
    if named:
        return f"it has triggers ({named}), which a new table would not have"
    parents = conn.execute(
        sa.text(
            "SELECT CONSTRAINT_NAME FROM information_schema.REFERENTIAL_CONSTRAINTS "
            "WHERE CONSTRAINT_SCHEMA = COALESCE(:s, DATABASE()) AND TABLE_NAME = :t ORDER BY 1"
        ),
        {"s": schema, "t": table},
    ).scalars()
    named = ", ".join(map(str, parents))
    if named:
        return f"it has foreign keys ({named}), which a new table would not have"
    children = referencing_tables(conn, schema, table)
    if children:
        return f"{', '.join(children)} refer to it by foreign keys"
    return None


def exists(conn: Connection, schema: str | None, name: str) -> bool:
    found = conn.execute(sa.text(f"SELECT 1 {_TABLES} AND TABLE_NAME = :t"), {"s": schema, "t": name}).first()
    return found is not None


def named_like(conn: Connection, schema: str | None, prefix: str) -> list[str]:
    """The tables whose names start with ``prefix``."""
    rows = conn.execute(
        sa.text(f"SELECT TABLE_NAME {_TABLES} AND TABLE_NAME LIKE :p"), {"s": schema, "p": _like(prefix)}
    )
    return sorted(str(r[0]) for r in rows)


def everywhere(conn: Connection, prefix: str) -> list[tuple[str, str]]:
    """(schema, table) of every table the writer can see whose name starts with ``prefix``."""
    found = "SELECT TABLE_SCHEMA, TABLE_NAME FROM information_schema.TABLES WHERE TABLE_NAME LIKE :p ORDER BY 1, 2"
    return [(str(r[0]), str(r[1])) for r in conn.execute(sa.text(found), {"p": _like(prefix)})]


def _like(prefix: str) -> str:
    """A LIKE pattern of the names starting with ``prefix``, matched literally."""
    return prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


def drop(conn: Connection, schema: str | None, name: str) -> None:
    conn.exec_driver_sql(driver_sql(f"DROP TABLE IF EXISTS {_q(schema, name)}"))
    conn.commit()


def definition(conn: Connection, schema: str | None, name: str) -> str:
    """The table's ``SHOW CREATE TABLE`` without its name and counter, to compare two tables' definitions."""
    text = str(conn.exec_driver_sql(driver_sql(f"SHOW CREATE TABLE {_q(schema, name)}")).one()[1])
    head, _, body = text.partition("(")
    return re.sub(r" AUTO_INCREMENT=\d+", "", "CREATE TABLE (" + body) if head.startswith("CREATE TABLE") else text


def _refused(exc: BaseException) -> bool:
    return errno_of(exc) in PRIVILEGE_CODES | {1143}


def build(conn: Connection, target: SwapTarget) -> tuple[int, datetime]:
    """Make ``target.new`` like the target and load the batch into it (committed: DDL commits); the rows
    loaded and the server's time (UTC) after their commit.  A leftover of an earlier attempt is dropped first.  A
    writer who may not create the table, or a copy that differs: :class:`SwapRefused`, nothing left behind."""
    old, new = _q(target.schema, target.table), _q(target.schema, target.new)
    try:
        drop(conn, target.schema, target.new)
        conn.exec_driver_sql(driver_sql(f"CREATE TABLE {new} LIKE {old}"))
        conn.commit()  # (DDL commits on the server: this keeps the connection's state the same)
        same = definition(conn, target.schema, target.table) == definition(conn, target.schema, target.new)
    except sa.exc.DBAPIError as exc:
        conn.rollback()
        _drop_quietly(conn, target.schema, target.new)
        why = "the writer may not create a table beside it" if _refused(exc) else "a statement of the swap failed"
        raise SwapRefused(f"{why} ({exc.orig})") from None
    if not same:
        _drop_quietly(conn, target.schema, target.new)
        raise SwapRefused("a table made like it would differ from it in SHOW CREATE TABLE")
    try:
        if not getattr(conn.dialect, "is_mariadb", False):  # MySQL 8 caches the catalog's counters
            conn.exec_driver_sql("SET SESSION information_schema_stats_expiry = 0")
        counter = conn.execute(
            sa.text(f"SELECT AUTO_INCREMENT {_TABLES} AND TABLE_NAME = :t"),
            {"s": target.schema, "t": target.table},
        ).scalar()
        if counter:  # the next generated value goes on from the target's, not from the batch's largest
            conn.exec_driver_sql(driver_sql(f"ALTER TABLE {new} AUTO_INCREMENT = {int(counter)}"))
        conn.commit()
        table = sa.table(target.new, *(sa.column(c) for c in target.columns), schema=target.schema)
        rows = insert_selected(conn, table, list(target.columns), target.rows)
        conn.commit()
        conn.exec_driver_sql(driver_sql(f"ANALYZE TABLE {new}")).all()  # its answer is a result set, never an error
        loaded_at = conn.exec_driver_sql("SELECT UTC_TIMESTAMP()").scalar_one()
        conn.commit()
        return rows, loaded_at
    except BaseException:
        conn.rollback()
        _drop_quietly(conn, target.schema, target.new)
        raise


def older_snapshots(conn: Connection, loaded_at: datetime) -> str | None:
    """Other sessions' snapshots (InnoDB read views) of transactions begun before the new table's rows were
    committed (``loaded_at``, UTC): reading the table after the rename, one taken before the new table was made
    gets error 1412, one taken between its CREATE and the load's commit sees it empty.  Read live from ``SHOW
    ENGINE INNODB STATUS`` (which says which transaction reads by a view, and for how long it has been active,
    in whole seconds: counted from a second earlier); a list it does not show whole counts as one.  (A session
    keeping the target open holds its metadata lock: the rename waits for none, below.)"""
    try:
        age = int(
            conn.execute(sa.text("SELECT TIMESTAMPDIFF(SECOND, :at, UTC_TIMESTAMP())"), {"at": loaded_at}).scalar_one()
        )
        me = int(conn.exec_driver_sql("SELECT CONNECTION_ID()").scalar_one())
        status = conn.exec_driver_sql("SHOW ENGINE INNODB STATUS").one()
    except sa.exc.DBAPIError as exc:
        if not _refused(exc):
            raise
        return f"the writer may not see the server's transactions (PROCESS privilege: {exc.orig})"
    finally:
        conn.rollback()
    views = read_views(str(status[2]))
    if views is None:
        return "SHOW ENGINE INNODB STATUS did not list every transaction"
    found = sum(1 for session, active in views if session != me and active >= age - 1)
    return f"{found} session(s) hold a snapshot older than the new table's rows" if found else None


def rename(conn: Connection, target: SwapTarget, witness: str, patience_s: float, loaded_at: datetime) -> None:
    """``RENAME TABLE target TO witness, new TO target``: both or neither.  The target's metadata lock is only ever
    asked for without waiting (MariaDB's NOWAIT; MySQL's shortest wait, 1 s): a queued request would hold up
    every new reader.  Tried until ``patience_s`` ran out while a session keeps the target open, or for at most
    :data:`SNAPSHOT_PATIENCE_S` while one holds an older snapshot (:func:`older_snapshots`), then
    :class:`SwapRefused`, as for a writer who may not rename it: the new table dropped, the target untouched."""
    old, new = _q(target.schema, target.table), _q(target.schema, target.new)
    mariadb = bool(getattr(conn.dialect, "is_mariadb", False))
    statement = f"RENAME TABLE {old}{' NOWAIT' if mariadb else ''} TO {_q(target.schema, witness)}, {new} TO {old}"
    start = time.monotonic()
    deadline, snapshots_deadline = start + patience_s, start + min(patience_s, SNAPSHOT_PATIENCE_S)
    while True:
        why = older_snapshots(conn, loaded_at)
        if why is not None and time.monotonic() >= snapshots_deadline:
            _drop_quietly(conn, target.schema, target.new)
            raise SwapRefused(why)
        if why is None:
            try:
                if not mariadb:
                    conn.exec_driver_sql("SET SESSION lock_wait_timeout = 1")
                conn.exec_driver_sql(driver_sql(statement))
                conn.commit()
                return
            except sa.exc.DBAPIError as exc:
                conn.rollback()
                if _refused(exc):
                    _drop_quietly(conn, target.schema, target.new)
                    raise SwapRefused(f"the writer may not rename it ({exc.orig})") from None
                if errno_of(exc) != LOCK_WAIT_TIMEOUT:
                    raise
                why = "a session kept it open"
            finally:
                if not mariadb:
                    _restore_wait(conn)
        if time.monotonic() >= deadline:
            _drop_quietly(conn, target.schema, target.new)
            raise SwapRefused(why)
        time.sleep(RETRY_S)


def _restore_wait(conn: Connection) -> None:
    try:
        conn.exec_driver_sql("SET SESSION lock_wait_timeout = @@GLOBAL.lock_wait_timeout")
        conn.commit()
    except sa.exc.DBAPIError as exc:  # a lost session: the next statement says so
        log.debug("lock_wait_timeout not restored (%s)", exc)


def _drop_quietly(conn: Connection, schema: str | None, name: str) -> None:
    try:
        drop(conn, schema, name)
    except sa.exc.DBAPIError as exc:  # the next attempt drops it first
        log.warning("could not drop %s, built for an overwrite's swap: %s", name, exc.orig)


class RenamingSwap:
    """:class:`xasink.dialects.values.RenameSwap` for MariaDB/MySQL, waiting at most ``patience_s`` for the
    target's metadata lock (past it the in-place apply, which needs no such lock)."""

    max_name = MAX_NAME

    def __init__(self, patience_s: float) -> None:
        self.patience_s = patience_s
        self.loaded_at: datetime | None = None  # (when the build's rows were committed, on the server's clock)

    def refusal(self, conn: Connection, schema: str | None, table: str) -> str | None:
        return refusal(conn, schema, table)

    def exists(self, conn: Connection, schema: str | None, name: str) -> bool:
        return exists(conn, schema, name)

    def named_like(self, conn: Connection, schema: str | None, prefix: str) -> list[str]:
        return named_like(conn, schema, prefix)

    def build(self, conn: Connection, target: SwapTarget) -> int:
        rows, self.loaded_at = build(conn, target)
        return rows

    def rename(self, conn: Connection, target: SwapTarget, witness: str) -> None:
        assert self.loaded_at is not None, "rename before build"
        rename(conn, target, witness, self.patience_s, self.loaded_at)

    def everywhere(self, conn: Connection, prefix: str) -> list[tuple[str, str]]:
        return everywhere(conn, prefix)

    def drop(self, conn: Connection, schema: str | None, name: str) -> None:
        drop(conn, schema, name)
