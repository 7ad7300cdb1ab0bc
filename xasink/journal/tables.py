"""The decision log's tables: creating them on first use, upgrading a log made by an older
xasink, the log's identity, and compacting old batches.

What each table is for is told in :mod:`xasink.journal.log`, whose :class:`~xasink.journal.log.Journal` runs the
protocol's reads and writes on them (claims, decisions, marks).  This part is upkeep: a batch's path only
pays :meth:`JournalTables.ensure`'s one round trip when the log is ready, and the trim runs for about one
batch in ``TRIM_EVERY`` (:mod:`xasink.protocol.recovery`).  ``xasink/journal/sql/*.sql`` (``xasink ddl``) holds
the same DDL for DBAs.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from xasink.dialects.base import Dialect
from xasink.errors import PreflightError
from xasink.journal.grants import check_grants
from xasink.journal.layout import (
    BINARY_COLLATION,
    TARGET_MAX_BYTES,
    log_tables,
    ready_query,
)
from xasink.journal.records import COMMITTED
from xasink.protocol.xid import Xid, new_log_id, valid_log_id

log = logging.getLogger(__name__)


def _information_schema(view: str, column: str) -> sa.TableClause:
    """A view of MySQL's information_schema with the table's schema and name, and ``column``."""
    return sa.table(
        view, sa.column("TABLE_SCHEMA"), sa.column("TABLE_NAME"), sa.column(column), schema="information_schema"
    )


class JournalTables:
    """The decision log's tables in one schema and prefix, and their upkeep; :class:`xasink.journal.log.Journal`
    builds the protocol's operations on it."""

    def __init__(self, dialect: Dialect, schema: str | None = None, prefix: str = "xasink_") -> None:
        self.dialect = dialect
        self.prefix = prefix  # (the shadows' and swaps' names start with it too: xasink.write_modes.spec)
        self.sinks, self.batches, self.claims, self.logs, self.parts = log_tables(schema, prefix)
        self._log_id: str | None = None

    @property
    def tables(self) -> tuple[sa.Table, ...]:
        return (self.logs, self.sinks, self.batches, self.claims)  # parts: made by a transaction (xasink.journal.parts)

    def roles(self) -> list[tuple[str, sa.Table]]:
        """Each table with what it is, for :func:`xasink.journal.grants.check_grants`."""
        return [("log", self.logs), ("sinks", self.sinks), ("batches", self.batches), ("claims", self.claims)] + [
            ("parts", self.parts)
        ]

    # -- set-up ---------------------------------------------------------------
    def exists(self, conn: Connection) -> bool:
        """Whether the log is there for this user.  MySQL/MariaDB answer a user who holds no right on a table
        (a missing one too: a typo in the prefix or schema) "command denied", never "no such table": not
        there for it either (the operator's message says both, xasink.ops.common.missing_log)."""
        try:
            return sa.inspect(conn).has_table(self.batches.name, schema=self.batches.schema)
        except sa.exc.DBAPIError as exc:
            conn.rollback()
            if not self.dialect.denied(exc):
                raise
            return False

    def _ready_log_id(self, conn: Connection) -> str | None:
        """The log's id when every table has every column of this layout, in one round trip; else None.

        What every batch pays: reflecting four tables and their columns costs a dozen catalogue queries.
        A missing table or column fails the statement; then :meth:`ensure` takes the long way.
        """
        query = ready_query(self.sinks.schema, self.sinks.name[: -len("sinks")], self._is_mysql(conn))
        try:
            value = conn.execute(query).scalar()
        except sa.exc.DBAPIError:
            conn.rollback()
            return None
        conn.rollback()
        return str(value) if value is not None and valid_log_id(str(value)) else None

    def ensure(self) -> None:
        """Create the tables if they are missing (first use), and bring a log made by an older xasink up to
        this layout (:meth:`upgrade`); a concurrent creator is fine."""
        with self.dialect.connect(autocommit=True) as conn:  # every batch's check: one statement, no BEGIN
            ready = self._ready_log_id(conn)
        if ready is not None:
            self._log_id = ready
            check_grants(self.dialect, self.roles())
            return
        with self.dialect.connect() as conn:
            inspector = sa.inspect(conn)
            if not all(inspector.has_table(t.name, schema=t.schema) for t in self.tables):
                conn.rollback()
                try:
                    self._create_tables(conn)
                except sa.exc.IntegrityError:  # another process created them at the same moment
                    pass
                except sa.exc.DBAPIError as exc:
                    names = ", ".join(t.fullname for t in self.tables)
                    raise PreflightError(
                        f"cannot create the xasink decision log tables {names}: "
                        f"{str(exc.orig).strip().splitlines()[0]}. Create them with the DDL "
                        "that `xasink ddl postgres` (or `xasink ddl mysql`) prints, or grant CREATE, or pick a "
                        "schema with 'journalSchema'."
                    ) from None
            conn.rollback()
            self.upgrade(conn)
            check_grants(self.dialect, self.roles())  # on this layout's columns
            self._log_id = self._read_or_draw_log_id(conn)

    def _create_tables(self, conn: Connection, attempts: int = 5) -> None:
        """CREATE the missing tables.  MySQL/MariaDB DDL is not transactional: a concurrent creator's tables
        appear one by one, and ours fails with 1050 "already exists" on the first it made; again, with
        checkfirst, creates the rest (or finds them all made)."""
        for attempt in range(attempts):
            try:
                with conn.begin():
                    self.sinks.metadata.create_all(conn, checkfirst=True)
                return
            except sa.exc.IntegrityError:
                raise
            except sa.exc.DBAPIError:
                conn.rollback()
                inspector = sa.inspect(conn)
                done = all(inspector.has_table(t.name, schema=t.schema) for t in self.tables)
                conn.rollback()
                if done:
                    return
                if attempt == attempts - 1:
                    raise
                time.sleep(0.05 * (attempt + 1))

    def _columns(self, conn: Connection, table: sa.Table) -> set[str]:
        found = {str(c["name"]).lower() for c in sa.inspect(conn).get_columns(table.name, schema=table.schema)}
        conn.rollback()
        return found

    def _add_column(self, conn: Connection, table: sa.Table, name: str) -> None:
        """ALTER TABLE ... ADD COLUMN, identifiers quoted by the dialect; a concurrent adder is fine."""
        if name in self._columns(conn, table):
            return
        column = table.c[name]
        ddl = sa.schema.CreateColumn(column).compile(dialect=conn.dialect)
        prep = conn.dialect.identifier_preparer
        try:
            with conn.begin():
                conn.execute(sa.text(f"ALTER TABLE {prep.format_table(table)} ADD COLUMN {ddl}"))
        except sa.exc.DBAPIError as exc:
            conn.rollback()
            if name in self._columns(conn, table):
                return  # added concurrently
            raise PreflightError(
                f"cannot add column {name} to the xasink decision log table {table.fullname} (made by an older "
                f"xasink): {str(exc.orig).strip().splitlines()[0]}. Add it as `xasink ddl postgres` "
                "(or `xasink ddl mysql`) defines it, or grant ALTER."
            ) from None

    def upgrade(self, conn: Connection) -> None:
        """Bring a log made by any older xasink to this layout: each column and collation is checked on its own
        (a log may lack any of them: claims.guard, sinks.horizon, batches.compacted and target were added by
        different versions), so running it again, or after a half-done upgrade, adds only what is missing.

        Older versions deleted committed batches whose id was ``journalRetention`` below the sink's highest:
        for a sink with batches, any id below its highest that the log does not hold may have been
        committed.  Its ``horizon`` records that, so such an id is refused instead of written again.  The
        versions that trimmed so are the ones without ``batches.target``, which is therefore added last.
        """
        have = {t.name: self._columns(conn, t) for t in (self.sinks, self.batches, self.claims, self.logs)}
        trimmed = "target" not in have[self.batches.name]
        missing = [(t, c.name) for t in self.tables for c in t.c if c.name not in have[t.name]]
        collated = self._is_mysql(conn) and bool(self._to_binary(conn))
        if not missing and not collated:
            return
        log.warning("upgrading the xasink decision log %s to this version's layout", self.batches.fullname)
        if trimmed:
            self._add_column(conn, self.sinks, "horizon")
            s, b = self.sinks.c, self.batches.c
            highest = sa.select(sa.func.max(b.batch_id) - 1).where(b.sink_id == s.sink_id).scalar_subquery()
            with conn.begin():
                conn.execute(self.sinks.update().where(s.horizon.is_(None)).values(horizon=highest))
        for table, name in missing:
            if (table, name) != (self.batches, "target"):
                self._add_column(conn, table, name)
        self._add_column(conn, self.batches, "target")
        if self._is_mysql(conn):
            self._make_binary(conn)

    # -- byte-for-byte comparisons (MySQL/MariaDB) ---------------------------------
    @staticmethod
    def _is_mysql(conn: Connection) -> bool:
        return conn.dialect.name in ("mysql", "mariadb")

    def _collated_otherwise(self, conn: Connection, tables: tuple[sa.Table, ...]) -> sa.Select[Any]:
        """How many text columns of ``tables`` compare otherwise than byte for byte (information_schema)."""
        cols = _information_schema("COLUMNS", "COLLATION_NAME")
        schema = self.batches.schema
        return sa.select(sa.func.count()).where(
            cols.c.TABLE_SCHEMA == (sa.literal(schema) if schema else sa.func.database()),
            cols.c.TABLE_NAME.in_([t.name for t in tables]),
            cols.c.COLLATION_NAME != BINARY_COLLATION,
        )

    def _to_binary(self, conn: Connection) -> list[sa.Table]:
        """The log's tables (parts too, if made) whose columns or default collation are not binary."""
        tabs = _information_schema("TABLES", "TABLE_COLLATION")
        schema = self.batches.schema
        found: list[sa.Table] = []
        for table in (*self.tables, self.parts):
            default = conn.execute(
                sa.select(tabs.c.TABLE_COLLATION).where(
                    tabs.c.TABLE_SCHEMA == (sa.literal(schema) if schema else sa.func.database()),
                    tabs.c.TABLE_NAME == table.name,
                )
            ).scalar()
            if default is None:
                continue  # not made (parts: no transaction used this log yet)
            if default != BINARY_COLLATION or conn.execute(self._collated_otherwise(conn, (table,))).scalar():
                found.append(table)
        conn.rollback()
        return found

    def _make_binary(self, conn: Connection) -> None:
        """ALTER TABLE ... CONVERT TO utf8mb4_bin each table that is not yet: no two ids differing only in case
        can be in a table made with a case-insensitive key, so the conversion never meets duplicates."""
        prep = conn.dialect.identifier_preparer
        for table in self._to_binary(conn):
            try:
                with conn.begin():
                    conn.execute(
                        sa.text(
                            f"ALTER TABLE {prep.format_table(table)} CONVERT TO CHARACTER SET utf8mb4 "
                            f"COLLATE {BINARY_COLLATION}"
                        )
                    )
            except sa.exc.DBAPIError as exc:
                conn.rollback()
                raise PreflightError(
                    f"cannot make the xasink decision log table {table.fullname} compare byte for byte (made by "
                    f"an older xasink): {str(exc.orig).strip().splitlines()[0]}. Run the upgrade statements of "
                    "`xasink ddl mysql`, or grant ALTER."
                ) from None

    # -- what a decision records --------------------------------------------------
    def target_too_long(self, conn: Connection, sink_id: str, batch_id: int, target: str) -> str | None:
        """Why ``batches.target`` cannot hold this batch's target whole (None: it can).

        Recovery finishes a decided batch from that record alone (an overwrite's replaceWhere is in it): a
        truncated one cannot be read, so a target that does not fit must fail the batch before its decision.
        MySQL/MariaDB's TEXT holds 65,535 bytes (a session without strict sql_mode would store the first
        ones silently); PostgreSQL's text holds 1 GB.
        """
        size = len(target.encode("utf-8"))
        if not self._is_mysql(conn) or size <= TARGET_MAX_BYTES:
            return None
        what = "what the batch writes, with its replaceWhere," if '"apply"' in target else "what the batch writes"
        return (
            f"sink {sink_id} batch {batch_id}: {what} takes {size} bytes as the decision log records it, too long "
            f"for the decision log: {self.batches.fullname}.target holds {TARGET_MAX_BYTES}, and recovery could "
            "not finish the batch from a truncated record. The batch was rolled back: nothing of it is visible. "
            "Shorten the replaceWhere predicate (a range, or a join on a table of keys, instead of a long IN list)."
        )

    # -- identity ---------------------------------------------------------------
    def _read_log_id(self, conn: Connection) -> str | None:
        value = conn.execute(sa.select(self.logs.c.log_id).where(self.logs.c.slot == 1)).scalar()
        return str(value) if value is not None else None

    def _read_or_draw_log_id(self, conn: Connection) -> str:
        """The log's id; drawn and stored on first use (a concurrent first user's draw wins for both)."""
        found = self._read_log_id(conn)
        conn.rollback()
        if found is None:
            try:
                with conn.begin():
                    conn.execute(
                        self.logs.insert().values(slot=1, log_id=new_log_id(), created_at=self.dialect.utc_now())
                    )
            except sa.exc.IntegrityError:
                pass  # drawn concurrently
            found = self._read_log_id(conn)
            conn.rollback()
        if found is None or not valid_log_id(found):
            raise PreflightError(
                f"the decision log's identity in {self.logs.fullname} is missing or malformed ({found!r}); it must "
                "hold one row with a 10-hex-digit log_id. Restore it: every prepared branch of this log carries it."
            )
        return found

    def find_log_id(self, conn: Connection) -> str | None:
        """This log's identity, or None when the log has none (never written, or made by an older xasink)."""
        if not sa.inspect(conn).has_table(self.logs.name, schema=self.logs.schema):
            return None
        return self._read_log_id(conn)

    def log_id(self, conn: Connection | None = None) -> str:
        """This log's identity (read once, then remembered): branches carrying another one are not ours."""
        if self._log_id is None:
            if conn is not None:
                found = self._read_log_id(conn)
            else:
                with self.dialect.connect() as own:
                    found = self._read_log_id(own)
            if found is None:
                raise PreflightError(
                    f"decision log {self.logs.fullname} has no identity yet: it is created on a writer's first "
                    "batch (or by `xasink ddl postgres` / `xasink ddl mysql`); pass --journal-schema / "
                    "--journal-prefix as the writers used them"
                )
            self._log_id = found
        return self._log_id

    def owns(self, xid: Xid | None, conn: Connection | None = None) -> bool:
        """A branch this log may commit or roll back: ours, and of this very log."""
        return xid is not None and xid.log_id == self.log_id(conn)

    # -- retention --------------------------------------------------------------
    def trim(self, conn: Connection, sink_id: str, keep: int) -> int:
        """Compact the sink's committed batches older than its newest ``keep`` (by decision time, not id).

        Their xid lists are emptied and their claims deleted; their rows stay, one small row per batch, so
        the log still knows every batch it ever committed.  Returns how many batches were compacted.
        """
        b = self.batches.c
        full = conn.execute(
            sa.select(b.batch_id)
            .where(b.sink_id == sink_id, b.state == COMMITTED, b.compacted.is_(False))
            .order_by(b.decided_at.desc(), b.batch_id.desc())
        ).scalars()
        old = [int(x) for x in list(full)[keep:]]
        if not old:
            conn.rollback()
            return 0
        c = self.claims.c
        for i in range(0, len(old), 500):
            chunk = old[i : i + 500]
            conn.execute(
                self.batches.update()
                .where(b.sink_id == sink_id, b.state == COMMITTED, b.batch_id.in_(chunk))
                .values(xids="[]", compacted=True)
            )
            conn.execute(self.claims.delete().where(c.sink_id == sink_id, c.batch_id.in_(chunk)))
            if sa.inspect(conn).has_table(self.parts.name, schema=self.parts.schema):
                p = self.parts.c
                conn.execute(self.parts.delete().where(p.sink_id == sink_id, p.batch_id.in_(chunk)))
        conn.commit()
        return len(old)
