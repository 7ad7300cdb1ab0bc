"""The MySQL/MariaDB dialect: connections, the driver's XA verbs (after the owner's disconnect), session
locks and listings; checks, types and branches live in their own modules."""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import pymysql
import sqlalchemy as sa
from sqlalchemy.engine import Connection

from xasink.dialects.base import BranchSession, Dialect
from xasink.dialects.keepalive import set_keepalive
from xasink.dialects.mysql import catalog, errors, health, preflight
from xasink.dialects.mysql import merge as merge_sql
from xasink.dialects.mysql.errors import BranchBusyError, LockBusyError
from xasink.dialects.mysql.owner import DETACH_TIMEOUT_S, OWNER_WAIT_S, Owner, OwnerWatch
from xasink.dialects.mysql.sql import (
    APPLY_VALUE_MODES,
    BRANCH_SQL_MODE,
    SA_DIALECT,
    errno_of,
    session_mode,
    set_url_session,
    url_session_variables,
)
from xasink.dialects.mysql.swap import RenamingSwap
from xasink.dialects.mysql.xa import ER_XAER_NOTA, foreign_gid, parse_foreign_gid, recovered, xa_literal, xid_literal
from xasink.dialects.rendering import statement_text
from xasink.dialects.values import (
    SHADOW_INDEX_SUFFIX,
    SHADOW_TAG_COLUMN,
    BlockedSession,
    BranchSettings,
    DurabilityRisk,
    ErrorKind,
    Merge,
    PreparedTxn,
    TargetPlan,
)
from xasink.errors import BranchError
from xasink.protocol.xid import FORMAT_ID, Xid
from xasink.support.masking import redact, url_secrets

if TYPE_CHECKING:  # rows and types only: the driver's commit path never loads pyarrow
    import pyarrow as pa

log = logging.getLogger("xasink.dialects.mysql")


KEY_TOO_LONG = (1071, 1170)  # a key longer than an InnoDB index allows; a BLOB/TEXT key without a prefix length


class MySQLDialect(Dialect):
    name = "MySQL"
    default_port = 3306
    # the server's host name and port, and the database
    identity_sql, identity_format = "SELECT @@hostname, @@port, DATABASE()", "mysql://{}:{}/{}"
    database_sql = "SELECT DATABASE()"
    load_data_max_bytes = 64 << 20  # a streamed LOAD DATA statement ends once it has carried this much
    max_stmt_bytes = 4 << 20  # largest multi-row INSERT statement (capped by max_allowed_packet)

    def __init__(self, url: sa.URL, settings: BranchSettings | None = None, pool_size: int = 0) -> None:
        url, self.session = url_session_variables(url)  # (the driver knows no such URL parameter)
        super().__init__(url, settings, pool_size)

    def connect_args(self) -> dict[str, Any]:
        return {"connect_timeout": 10, "charset": "utf8mb4"}

    def raw_connect(self, local_infile: bool = False) -> pymysql.connections.Connection:
        """A plain pymysql connection (autocommit) with the URL's settings; failures become ConnectError."""
        _, kwargs = SA_DIALECT.create_connect_args(self.url)
        kwargs.update(self.connect_args())
        kwargs.update(autocommit=True, local_infile=local_infile)
        try:
            conn = pymysql.connect(**kwargs)
        except pymysql.err.MySQLError as exc:
            raise self.connect_error(exc) from None
        set_keepalive(getattr(conn, "_sock", None))
        return conn

    def on_connect(self, dbapi_conn: Any, record: Any) -> None:
        """A control connection: TCP keepalives; the sql_mode the log and the apply rely on (a value too long for
        its column fails, not stored truncated: sql.py); row and metadata lock waits bounded by controlLockTimeout
        (error 1205, transient: the step is retried)."""
        set_keepalive(getattr(dbapi_conn, "_sock", None))
        timeout = int(self.settings.control_lock_timeout)
        mode = session_mode(APPLY_VALUE_MODES)
        with dbapi_conn.cursor() as cur:
            set_url_session(cur, self.session)  # (an apply's defaults read its zone)
            if timeout:
                cur.execute(
                    f"SET SESSION sql_mode = {mode}, innodb_lock_wait_timeout = %s, lock_wait_timeout = %s",
                    (BRANCH_SQL_MODE, timeout, timeout),
                )
            else:
                cur.execute(f"SET SESSION sql_mode = {mode}", (BRANCH_SQL_MODE,))

    def socket_fd(self, dbapi_conn: Any) -> int | None:
        sock = getattr(dbapi_conn, "_sock", None)
        return sock.fileno() if sock is not None else None

    @functools.cached_property
    def owners(self) -> OwnerWatch:
        return OwnerWatch(self.raw_connect)

    def wait_detached(self, connection_id: int, lock: str, timeout_s: float = DETACH_TIMEOUT_S) -> None:
        """Return once a branch's session (``connection_id``, owner lock ``lock``) has left, after PREPARE."""
        self.owners.wait_detached(connection_id, lock, timeout_s)

    def await_owner(self, conn: Connection, xid: Xid | None, timeout_s: float = OWNER_WAIT_S) -> Owner | None:
        """Return once the branch's owner is proven detached, else BranchBusyError (see :mod:`.owner`)."""
        return self.owners.await_owner(conn, xid, timeout_s)

    def before_finishing(self, xids: Sequence[Xid]) -> None:
        """Prove the owners of many branches detached at once, so their verbs need not wait one by one."""
        if not xids:
            return
        try:
            with self.connect(autocommit=True) as conn:
                self.owners.prove(conn, xids)
        except Exception as exc:  # noqa: BLE001 - each verb still waits for its own owner (and says what failed)
            log.info("owners of %d branches not looked at together: %s", len(xids), exc)

    def dispose(self) -> None:
        if "owners" in self.__dict__:  # its witness connection
            self.owners.close()
        super().dispose()

    # -- XA verbs ------------------------------------------------------------------------
    def _finish(self, conn: Connection, verb: str, literal: str, key: tuple[int, bytes, bytes]) -> None:
        xid = Xid.from_xa(*key)
        try:
            owner = self.await_owner(conn, xid)
        except BranchBusyError as exc:
            if verb == "ROLLBACK":  # (still listed: the next sweep or recover finds it again)
                log.warning("XA ROLLBACK %s: %s", literal, exc)
                return
            raise
        try:
            conn.exec_driver_sql(f"XA {verb} {literal}")
        except sa.exc.DBAPIError as exc:
            # XAER_NOTA also answers a branch whose owner has not disconnected yet: it is still listed.
            # A branch reports its xid only once detached, so this is a writer that is just finishing (or
            # hung).  Retrying at once races with its disconnect (see the module doc): a commit fails as
            # transient (the coordinator retries after a backoff); a roll-back is left to the next sweep.
            if errno_of(exc) == ER_XAER_NOTA and key in recovered(conn):
                if verb == "ROLLBACK":
                    log.warning(
                        "XA ROLLBACK %s: still attached to its writer's session; left for the next sweep", literal
                    )
                    return
                raise BranchBusyError(
                    f"XA {verb} of {literal}: the branch is still attached to its writer's session; retry later"
                ) from exc
            raise
        self.owners.finished(xid, owner, verb, literal)

    def commit_prepared(self, conn: Connection, xid: Xid) -> None:
        self._finish(conn, "COMMIT", xid_literal(xid), (FORMAT_ID, xid.gtrid.encode(), xid.bqual.encode()))

    def rollback_prepared(self, conn: Connection, xid: Xid) -> None:
        self._finish(conn, "ROLLBACK", xid_literal(xid), (FORMAT_ID, xid.gtrid.encode(), xid.bqual.encode()))

    def rollback_foreign(self, conn: Connection, gid: str) -> None:
        xid = Xid.parse(gid)
        if xid is not None:
            self.rollback_prepared(conn, xid)
            return
        parsed = parse_foreign_gid(gid)
        if parsed is None:
            raise ValueError(f"{gid!r} is not an XA transaction name as listed (xa:<formatID>:<gtrid>:<bqual> hex)")
        self._finish(conn, "ROLLBACK", xa_literal(*parsed), parsed)

    # -- session locks (server-wide names, like XA) -------------------------------------
    def try_session_lock(self, conn: Connection, name: str) -> bool:
        return conn.execute(sa.text("SELECT GET_LOCK(:n, 0)"), {"n": name}).scalar() == 1

    def release_session_lock(self, conn: Connection, name: str) -> None:
        conn.execute(sa.text("SELECT RELEASE_LOCK(:n)"), {"n": name})

    def held_session_locks(self, conn: Connection, names: Iterable[str]) -> set[str]:
        wanted = sorted(set(names))
        if not wanted:
            return set()
        params = {f"n{i}": n for i, n in enumerate(wanted)}
        probes = ", ".join(f"IS_USED_LOCK(:n{i})" for i in range(len(wanted)))
        row = conn.execute(sa.text(f"SELECT {probes}"), params).one()
        return {n for n, holder in zip(wanted, row, strict=True) if holder is not None}

    def server_uptime_s(self, conn: Connection) -> float:
        row = conn.exec_driver_sql("SHOW GLOBAL STATUS LIKE 'Uptime'").one()
        return float(row[1])

    def list_prepared(self, conn: Connection) -> list[PreparedTxn]:
        """Every prepared XA transaction of the server (XA RECOVER has no database): ours parse, others are foreign."""
        out = []
        for format_id, gtrid, bqual in recovered(conn):
            xid = Xid.from_xa(format_id, gtrid, bqual)
            out.append(PreparedTxn(xid.gid if xid else foreign_gid(format_id, gtrid, bqual), xid))
        return out

    def prepared_capacity(self, conn: Connection) -> tuple[int, int | None]:
        return health.prepared_capacity(conn)

    def blocked_by_prepared(self, conn: Connection) -> list[BlockedSession]:
        return health.blocked_by_prepared(conn)

    def classify(self, exc: BaseException) -> ErrorKind:
        return errors.classify(exc)

    def durability_risks(self, conn: Connection) -> list[DurabilityRisk]:
        return preflight.durability_risks(conn)

    def check_server(self, conn: Connection, branches: int | None) -> None:
        self.warn_durability(conn)
        preflight.check_server(self, conn)

    def denied(self, exc: BaseException) -> bool:
        return errno_of(exc) in errors.PRIVILEGE_CODES | {1143}  # 1143: a column's privilege

    def deadlocked(self, exc: BaseException) -> bool:
        return errno_of(exc) == 1213  # InnoDB rolled the whole transaction back: "try restarting transaction"

    def write_blockers(self, conn: Connection) -> list[str]:
        return preflight.write_blockers(self, conn)

    keyed_shadow = True

    def check_apply(self, conn: Connection) -> None:
        preflight.check_apply(self, conn)

    # the apply reads the shadow (INSERT .. SELECT, joins) as a consistent read, locking none of its rows
    apply_isolation = "READ COMMITTED"
    prepare_lock_slots = 64  # GET_LOCK is exclusive only: a run's tasks take turns only within a slot

    def clear_shadow(self, conn: Connection, shadow: sa.TableClause, batch: sa.ColumnElement[bool]) -> None:
        # by the (batch, tag, row) key (a shadow made before it: the (batch, branch) index), whatever the
        # optimizer would pick: a scan would lock (and wait on) another run's prepared rows.  The condition
        # holds only a batch id and bquals ([0-9a-f:-]).
        name = conn.dialect.identifier_preparer.format_table(shadow)
        keyed = SHADOW_TAG_COLUMN in shadow.c
        index = "PRIMARY" if keyed else conn.dialect.identifier_preparer.quote(shadow.name + SHADOW_INDEX_SUFFIX)
        where = batch.compile(dialect=conn.dialect, compile_kwargs={"literal_binds": True})
        conn.exec_driver_sql(f"DELETE {name} FROM {name} FORCE INDEX ({index}) WHERE {where}")

    def lock_apply(self, conn: Connection, name: str) -> None:
        # GET_LOCK outlives the transaction: unlock_apply releases it (or the session's end does)
        timeout = int(self.settings.control_lock_timeout) or 365 * 86400
        got = conn.execute(sa.text("SELECT GET_LOCK(:n, :t)"), {"n": name, "t": timeout}).scalar()
        if got != 1:
            raise LockBusyError(f"the apply lock {name} was not granted within {timeout} s: another apply runs")

    def unlock_apply(self, conn: Connection, name: str) -> None:
        conn.execute(sa.text("SELECT RELEASE_LOCK(:n)"), {"n": name})

    def referencing_tables(self, conn: Connection, schema: str | None, table: str) -> list[str]:
        return catalog.referencing_tables(conn, schema, table)

    def rename_swap(self) -> RenamingSwap:
        return RenamingSwap(min(float(self.settings.control_lock_timeout), 5.0))

    def column_collations(self, conn: Connection, schema: str | None, table: str) -> dict[str, str]:
        return catalog.column_collations(conn, schema, table)

    def name_unknown_types(self, conn: Connection, schema: str | None, table: str, columns: dict[str, Any]) -> None:
        catalog.name_unknown_types(conn, schema, table, columns)

    def modify_columns(self, conn: Connection, table: sa.Table, collations: dict[str, str]) -> None:
        changes = []
        for name, collation in collations.items():
            column = table.c[name]
            kind = column.type.copy()
            kind.collation = collation  # type: ignore[attr-defined]
            fresh = sa.Column(name, kind, nullable=column.nullable)
            sa.Table(table.name, sa.MetaData(), fresh)
            changes.append(f"MODIFY COLUMN {sa.schema.CreateColumn(fresh).compile(dialect=conn.dialect)}")
        conn.exec_driver_sql(f"ALTER TABLE {conn.dialect.identifier_preparer.format_table(table)} {', '.join(changes)}")

    def delete_missing(
        self,
        conn: Connection,
        target: sa.TableClause,
        keys: list[str],
        batch: sa.Select[Any],
        scope: sa.ColumnElement[bool],
    ) -> None:
        # DELETE t FROM t LEFT JOIN (the batch's keys) ON .. WHERE no match: the derived table is materialized
        # with a key (NOT EXISTS / NOT IN would scan the shadow once per row of the target: 100k rows, minutes).
        # SQLAlchemy has no multi-table DELETE with an outer join: the statement is its SELECT's text.
        kept = batch.subquery("xasink_kept_")
        cols = list(kept.c)
        on = sa.and_(*(col == target.c[k] for col, k in zip(cols, keys, strict=True)))
        gone = sa.and_(cols[0].is_(None), scope)
        probe: sa.Select[Any] = sa.select(sa.literal_column("1")).select_from(target.outerjoin(kept, on)).where(gone)
        text, params = statement_text(conn, probe)
        head = "SELECT 1 \nFROM "
        assert text.startswith(head), text
        name = conn.dialect.identifier_preparer.format_table(target)
        conn.exec_driver_sql(f"DELETE {name} FROM {text[len(head) :]}", params)

    def create_changes_table(
        self,
        conn: Connection,
        name: str,
        schema: str | None,
        rows: sa.Select[Any],
        keys: list[str],
        sequence: str | None,
    ) -> sa.TableClause:
        # a TEMPORARY table's CREATE and DROP commit nothing; it outlives a rollback, so one left by a failed
        # apply of this session goes first.  Its SELECT reads the shadow as a consistent read (READ COMMITTED).
        # The newest change per key by an upsert into the keyed table: a window function's sort of the batch
        # (every column) took four times as long
        table = sa.table(name, *(sa.column(c.name) for c in rows.selected_columns), schema=schema)
        prep = conn.dialect.identifier_preparer
        quoted = prep.format_table(table)
        key = ", ".join(prep.quote_identifier(k) for k in keys)
        text, params = statement_text(conn, rows if sequence is None else rows.limit(0))
        conn.exec_driver_sql(f"DROP TEMPORARY TABLE IF EXISTS {quoted}")
        try:
            conn.exec_driver_sql(f"CREATE TEMPORARY TABLE {quoted} (PRIMARY KEY ({key})) ENGINE=InnoDB {text}", params)
        except sa.exc.DBAPIError as exc:
            if errno_of(exc) not in KEY_TOO_LONG:
                raise
            # a key longer than an InnoDB index allows (the target's long UNIQUE is a hash): a unique hash key
            conn.exec_driver_sql(f"CREATE TEMPORARY TABLE {quoted} (UNIQUE KEY ({key})) ENGINE=InnoDB {text}", params)
        if sequence is not None:
            columns = [c.name for c in rows.selected_columns]
            conn.execute(self.upsert_from_select(Merge(table, columns, rows, keys, sequence)))
        return table

    def drop_changes_table(self, conn: Connection, table: sa.TableClause) -> None:
        conn.exec_driver_sql(f"DROP TEMPORARY TABLE {conn.dialect.identifier_preparer.format_table(table)}")

    def upsert_from_select(self, merge: Merge) -> sa.Insert:
        return merge_sql.upsert_from_select(merge)

    def merge_from_select(self, conn: Connection, merge: Merge) -> int:
        return merge_sql.merge_from_select(conn, merge)

    def reflected_name(self, name: str) -> str:
        """SQLAlchemy reads the names from SHOW CREATE TABLE and leaves a backtick in one doubled (`a``b`)."""
        return name.replace("``", "`")

    def check_table(self, conn: Connection, plan: TargetPlan) -> TargetPlan:
        return preflight.check_table(self, conn, plan)

    def replace_is_upsert(self, conn: Connection, plan: TargetPlan) -> bool:
        return preflight.replace_is_upsert(conn, plan)

    def branch_error(self, exc: BaseException, xid: Xid, plan: TargetPlan) -> BranchError:
        code = errno_of(exc)
        orig = getattr(exc, "orig", exc)
        args: tuple[Any, ...] = tuple(getattr(orig, "args", ()))
        text = str(args[1]) if len(args) > 1 else str(orig)
        return errors.branch_error_for(code, redact(text.strip(), url_secrets(self.url)), xid, plan)

    def load_warning_error(
        self, warnings: list[tuple[Any, ...]], loaded: int, expected: int, xid: Xid, plan: TargetPlan
    ) -> BranchError:
        return errors.load_warning_error(warnings, loaded, expected, xid, plan)

    # -- tables -------------------------------------------------------------------------
    def arrow_type(self, column: Any, source: pa.DataType) -> pa.DataType | None:
        from xasink.dialects.mysql import types

        return types.arrow_type(column, source)

    def server_cast(self, column: Any, source: pa.DataType, target: pa.DataType) -> str | None:
        from xasink.dialects.mysql import types

        return types.server_cast(column, source)

    def sql_type(self, arrow_type: pa.DataType) -> sa.types.TypeEngine[Any] | None:
        from xasink.dialects.mysql import types

        return types.sql_type(arrow_type)

    def parse_type(self, text: str) -> sa.types.TypeEngine[Any]:
        from xasink.dialects.mysql import types

        return types.parse_type(text)

    def table_kwargs(self, like: sa.Table | None = None) -> dict[str, Any]:
        kwargs = {"mysql_engine": "InnoDB", "mysql_charset": "utf8mb4"}
        collate = like.dialect_kwargs.get("mysql_collate") if like is not None else None
        if collate:  # reflection names a column's collation only where it is not the table's: keep the table's
            kwargs.pop("mysql_charset")
            kwargs["mysql_collate"] = str(collate)
        return kwargs

    # -- branch ------------------------------------------------------------------------
    def open_branch(self, xid: Xid, plan: TargetPlan) -> BranchSession:
        from xasink.dialects.mysql.branch import MySQLBranch  # the executor's side: pyarrow and the row encoding

        return MySQLBranch(self, xid, plan)
