"""What every database dialect provides: the XA verbs, recovery, bulk load and checks.

Dialects (and the decision log) are the only modules that speak SQL: the control side (journal, commit, sweep) on a
SQLAlchemy engine, the branch side (an executor loading rows) on the fastest driver API."""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import URL, Connection, Engine
from sqlalchemy.pool import NullPool

from xasink.dialects.branch_session import BranchSession
from xasink.dialects.login import connect_error
from xasink.dialects.pooling import watch_checkouts
from xasink.dialects.values import (
    BlockedSession,
    BranchSettings,
    DurabilityRisk,
    ErrorKind,
    Merge,
    PreparedTxn,
    RenameSwap,
    SwapRefused,
    SwapTarget,
    TargetPlan,
)
from xasink.errors import XasinkError
from xasink.protocol.xid import Xid
from xasink.support import phases
from xasink.support.masking import display_url, redact, url_secrets

if TYPE_CHECKING:  # rows and types only: the driver's commit path never loads pyarrow
    import pyarrow as pa

log = logging.getLogger(__name__)


# (dialect, host:port, setting, value) already warned about in this process: once per run, not per batch
_DURABILITY_WARNED: set[tuple[str, str, str]] = set()


class Dialect(ABC):
    """One place per database."""

    name: str = ""

    def __init__(self, url: URL, settings: BranchSettings | None = None, pool_size: int = 0) -> None:
        self.url = url
        self.settings = settings or BranchSettings()
        self.pool_size = pool_size
        self._engine: Engine | None = None
        self._autocommit_engine: Engine | None = None

    # -- control side -------------------------------------------------------
    @property
    def engine(self) -> Engine:
        """Control connections in transactions (the journal, the sink lock, reads)."""
        if self._engine is None:
            self._engine = self._make_engine()
        return self._engine

    @property
    def autocommit_engine(self) -> Engine:
        """Control connections in autocommit (COMMIT PREPARED, XA verbs), pooled apart (see :mod:`.pooling`)."""
        if self._autocommit_engine is None:
            self._autocommit_engine = self._make_engine(isolation_level="AUTOCOMMIT")
        return self._autocommit_engine

    def _make_engine(self, **options: Any) -> Engine:
        pooling: dict[str, Any] = {"poolclass": NullPool}
        if self.pool_size > 0:
            # overflow: a step may hold a connection while it opens another (the sink lock, then a rollback),
            # and threads of one process share the pool; overflow connections close when returned
            pooling = {"pool_size": self.pool_size, "max_overflow": max(self.pool_size, 8)}
        engine = sa.create_engine(self.url, connect_args=self.connect_args(), **pooling, **options)
        if self.pool_size > 0:  # a server restart leaves no dead connection in use (see .pooling)
            watch_checkouts(engine, self.socket_fd)
        sa.event.listen(engine, "connect", self.on_connect, insert=True)  # before SQLAlchemy reads sql_mode
        if phases.enabled():  # the benchmark's breakdown: what a control connection's set-up costs
            sa.event.listen(engine, "do_connect", phases.stamp_connect)
            sa.event.listen(engine, "connect", phases.record_connect)
        return engine

    def socket_fd(self, dbapi_conn: Any) -> int | None:
        """The control connection's socket descriptor (None: unknown, so every checkout pings)."""
        return None

    def on_connect(self, dbapi_conn: Any, record: Any) -> None:  # noqa: B027 - optional hook
        """Session settings of a new control connection the driver's connect arguments cannot carry."""

    def connect_args(self) -> dict[str, Any]:
        return {}

    def connect(self, autocommit: bool = False) -> Connection:
        """A control connection; connection failures become a :class:`ConnectError` that says what to do."""
        try:
            return (self.autocommit_engine if autocommit else self.engine).connect()
        except sa.exc.DBAPIError as exc:
            raise self.connect_error(exc) from None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({display_url(self.url)})"

    def where(self) -> str:
        return f"{self.url.host or 'localhost'}:{self.url.port or self.default_port}/{self.url.database}"

    default_port = 0

    def connect_error(self, exc: BaseException) -> XasinkError:
        orig = getattr(exc, "orig", exc)
        text = redact(str(orig).strip(), url_secrets(self.url)) or type(orig).__name__
        return connect_error(self.name, self.where(), self.url.username, self.url.database, text)

    def dispose(self) -> None:
        for engine in (self._engine, self._autocommit_engine):
            if engine is not None:
                engine.dispose()
        self._engine = self._autocommit_engine = None

    def before_finishing(self, xids: Sequence[Xid]) -> None:  # noqa: B027 - optional hook
        """Before COMMIT / ROLLBACK PREPARED of many branches (MariaDB: all owners' exits seen at once). No raise."""

    @abstractmethod
    def commit_prepared(self, conn: Connection, xid: Xid) -> None: ...

    @abstractmethod
    def rollback_prepared(self, conn: Connection, xid: Xid) -> None: ...

    @abstractmethod
    def rollback_foreign(self, conn: Connection, gid: str) -> None:
        """Roll back a transaction that is not ours; only ever on an operator's explicit request."""

    @abstractmethod
    def list_prepared(self, conn: Connection) -> list[PreparedTxn]:
        """Every prepared transaction this connection's database could finish."""

    @abstractmethod
    def prepared_capacity(self, conn: Connection) -> tuple[int, int | None]:
        """Prepared transactions on the whole server, and the server's limit on them (None: it has none)."""

    @abstractmethod
    def blocked_by_prepared(self, conn: Connection) -> list[BlockedSession]:
        """Sessions of the server waiting for a lock that a prepared transaction holds."""

    @abstractmethod
    def classify(self, exc: BaseException) -> ErrorKind: ...

    @abstractmethod
    def check_server(self, conn: Connection, branches: int | None) -> None:
        """Raise :class:`PreflightError` when the server cannot hold ``branches`` prepared branches."""

    def free_prepared_slots(self, conn: Connection) -> tuple[int, int] | None:
        """(free, limit) of the server's prepared-transaction slots; None where there is no limit (MySQL)."""
        return None

    def denied(self, exc: BaseException) -> bool:
        """Whether the server refused a statement for want of a privilege (the user needs a GRANT)."""
        return False

    def deadlocked(self, exc: BaseException) -> bool:
        """Whether the server rolled this transaction back whole as a deadlock's victim (run it again)."""
        return False

    def write_blockers(self, conn: Connection) -> list[str]:
        """Why xasink cannot write on this server at all, each with its fix (``xasink status``: CRITICAL)."""
        return []

    def durability_risks(self, conn: Connection) -> list[DurabilityRisk]:
        """The server's settings under which a crash can lose what PREPARE or the decision wrote."""
        return []

    def durability_warnings(self, conn: Connection) -> list[str]:
        """What :meth:`warn_durability` says about this server, every time it is asked (a write's result)."""
        server = f"{self.url.host or 'localhost'}:{self.url.port or self.default_port}"
        return [
            f"{self.name} at {server} has {risk.setting} = {risk.value}: a server crash can lose prepared branches "
            f"of a decided batch, so rows can be lost despite exactly-once writes. Set {risk.fix}"
            for risk in self.durability_risks(conn)
        ]

    def warn_durability(self, conn: Connection) -> None:
        """Warn once per process and server about settings under which a crash can forget a prepared branch or the
        decision (not an error: the operator may accept the risk, and the setting is the server's, not the job's)."""
        server = f"{self.url.host or 'localhost'}:{self.url.port or self.default_port}"
        for text in self.durability_warnings(conn):
            key = (self.name, server, text)
            if key in _DURABILITY_WARNED:
                continue
            _DURABILITY_WARNED.add(key)
            log.warning("%s", text)

    # -- tables --------------------------------------------------------------
    @abstractmethod
    def arrow_type(self, column: Any, source: pa.DataType) -> pa.DataType | None:
        """The Arrow type that loads exactly into a reflected column (fed from ``source``), or None."""

    @abstractmethod
    def sql_type(self, arrow_type: pa.DataType) -> sa.types.TypeEngine[Any] | None:
        """The column type a new table gets for an Arrow type, or None if unsupported."""

    @abstractmethod
    def parse_type(self, text: str) -> sa.types.TypeEngine[Any]:
        """A ``createTableColumnTypes`` entry as a SQLAlchemy type of this dialect."""

    def utc_now(self) -> sa.sql.ColumnElement[Any]:
        """The server's clock in UTC (naive), as SQL: every time the log stamps (ages need no client clock or zone)."""
        return sa.func.utc_timestamp()

    def server_now(self, conn: Connection) -> Any:
        """The server's clock in UTC, to age prepared transactions by the clock that stamped them."""
        return conn.execute(sa.select(self.utc_now())).scalar()

    # -- where a connection is ----------------------------------------------------------
    # which database a connection reaches, as the server itself names it (not the URL's host alias): a query
    # whose row fills the format.  A multi-target transaction's decision log records it with each part and
    # recovery compares it, so the string of a server and database must never change
    identity_sql = ""
    identity_format = ""
    database_sql = ""  # the database the session is in (the decision log records it with each batch)

    @classmethod
    def server_identity(cls, conn: Connection) -> str:
        """Which database a connection reaches (see ``identity_sql``)."""
        return cls.identity_format.format(*conn.execute(sa.text(cls.identity_sql)).one())

    @classmethod
    def session_database(cls, conn: Connection) -> str:
        """The database this connection's session is in."""
        return str(conn.execute(sa.text(cls.database_sql)).scalar())

    @classmethod
    def table_schema(cls, conn: Connection, table: str) -> str | None:
        """The schema an unqualified ``table`` is found in by this session (None: none there), not always the
        default one where a table is created (PostgreSQL searches search_path): the decision log records the
        table the writer found, so a run of another search_path (``xasink recover``, a sink naming it
        ``schema.table``) is one target with it."""
        return None

    def ping(self, conn: Connection) -> None:
        """One round trip on an open connection, raising when its session is gone (a run guard's watch)."""
        conn.exec_driver_sql("SELECT 1")

    # -- session locks: the liveness of writer runs ---------------------------------
    @abstractmethod
    def try_session_lock(self, conn: Connection, name: str) -> bool:
        """Take the session lock ``name`` without waiting; held until released or the session ends."""

    @abstractmethod
    def release_session_lock(self, conn: Connection, name: str) -> None: ...

    @abstractmethod
    def held_session_locks(self, conn: Connection, names: Iterable[str]) -> set[str]:
        """Which of ``names`` some session holds now."""

    @abstractmethod
    def server_uptime_s(self, conn: Connection) -> float:
        """Seconds since the server started: session locks held before a restart are being taken again."""

    def table_kwargs(self, like: sa.Table | None = None) -> dict[str, Any]:
        """Extra keywords for tables xasink creates (e.g. the storage engine); ``like``: a reflected table whose
        defaults the new one keeps (a shadow's columns compare as the target's)."""
        return {}

    def durable_commit(self, conn: Connection) -> None:  # noqa: B027 - optional hook
        """Make this transaction's COMMIT wait until it is on disk, whatever the server's default: the decision
        must survive a crash (PREPARE and COMMIT PREPARED are always flushed, an ordinary commit not always)."""

    def relaxed_commit(self, conn: Connection) -> None:  # noqa: B027 - optional hook
        """Let this transaction's COMMIT return before it is on disk, where the server would wait for it.

        Only for a transaction whose loss in a server crash changes nothing that matters: one that wrote
        nothing (it only held the sink lock to read), or the mark of a committed batch (recovery marks a
        decided batch again, its branches answer "unknown" as committed).  PostgreSQL: a ``SELECT ... FOR
        UPDATE`` gives the transaction an id and a WAL record, so its commit waits for a flush otherwise."""

    # -- overwrite, replaceWhere, change-data apply (xasink.write_modes.statements) ---------------
    # whether the shadow's primary key is (batch, SHADOW_TAG_COLUMN, SHADOW_ROW_COLUMN), filled by the branch, and
    # the isolation level of the apply's transaction: InnoDB's locking reads (INSERT .. SELECT, DELETE, at
    # REPEATABLE READ) lock every row they scan, so an apply would wait on another run's prepared rows of the
    # shadow; keyed so, the apply reads and deletes its branches' rows by a range of the clustered index (a
    # secondary (batch, branch) index, as before, cost a lookup per row and a second index to load and delete)
    keyed_shadow = False
    prepare_lock_slots = 1  # session locks a run's prepare lock spans (xasink.protocol.prepare_lock): 1 if shareable
    apply_isolation: str | None = None

    def check_apply(self, conn: Connection) -> None:  # noqa: B027 - optional hook
        """Planning a write with an apply step: :class:`PreflightError` when its sessions could not run the apply."""

    @abstractmethod
    def lock_apply(self, conn: Connection, name: str) -> None:
        """Take the apply lock ``name`` inside the caller's transaction, waiting at most controlLockTimeout (a
        transient error then): applies of one sink and target run one after the other."""

    def unlock_apply(self, conn: Connection, name: str) -> None:  # noqa: B027 - optional hook
        """Release the apply lock once the transaction ended (a lock that does not end with it)."""

    @abstractmethod
    def referencing_tables(self, conn: Connection, schema: str | None, table: str) -> list[str]:
        """The other tables whose foreign keys reference ``table`` (a self-reference is not listed)."""

    def column_collations(self, conn: Connection, schema: str | None, table: str) -> dict[str, str]:
        """The collation of each string column whose comparisons a table's defaults decide (MariaDB/MySQL)."""
        return {}

    def modify_columns(self, conn: Connection, table: sa.Table, collations: dict[str, str]) -> None:  # noqa: B027
        """Give the columns of a table xasink made these collations (a table an earlier xasink made)."""

    def delete_missing(
        self,
        conn: Connection,
        target: sa.TableClause,
        keys: list[str],
        batch: sa.Select[Any],
        scope: sa.ColumnElement[bool],
    ) -> None:
        """DELETE the target's rows in ``scope`` whose key is not among the keys ``batch`` selects (one column
        per key, in order, named apart from the target's columns so ``scope`` reads only the target's)."""
        kept = batch.subquery("xasink_kept_")
        same = sa.and_(*(col == target.c[k] for col, k in zip(kept.c, keys, strict=True)))
        conn.execute(sa.delete(target).where(scope, ~sa.exists().where(same)))

    def lock_for_overwrite(self, conn: Connection, schema: str | None, table: str) -> None:  # noqa: B027
        """Keep other writers out of the table while its rows are replaced (readers are never blocked)."""

    swaps_tables = False  # an overwrite may swap the table's storage (swap_table)

    def rename_swap(self) -> RenameSwap | None:
        """An overwrite's swap on a database whose DDL commits, run step by step by the apply (None: none)."""
        return None

    def swap_table(self, conn: Connection, target: SwapTarget) -> int:
        """Swap the table's storage in the caller's transaction; the rows loaded, or :class:`SwapRefused` (nothing
        changed: the caller applies in place)."""
        raise SwapRefused(f"{self.name} overwrites in place")

    def clear_shadow(self, conn: Connection, shadow: sa.TableClause, batch: sa.ColumnElement[bool]) -> None:
        """Delete the applied batch's rows from the shadow, inside the caller's transaction."""
        conn.execute(sa.delete(shadow).where(batch))

    def delete_joined(
        self, target: sa.TableClause, changes: sa.FromClause, condition: sa.ColumnElement[bool]
    ) -> sa.Delete:
        """DELETE the target's rows that match rows of ``changes`` under ``condition``."""
        return sa.delete(target).where(condition)

    @abstractmethod
    def create_changes_table(
        self,
        conn: Connection,
        name: str,
        schema: str | None,
        rows: sa.Select[Any],
        keys: list[str],
        sequence: str | None,
    ) -> sa.TableClause:
        """The newest of ``rows`` per key by ``sequence`` (ties in no defined order; None: no key is there twice)
        in a temporary table ``name`` keyed by ``keys``, made inside the caller's transaction without committing
        it, gone at its end or by :meth:`drop_changes_table`: computed once for a change-data apply's statements."""

    def drop_changes_table(self, conn: Connection, table: sa.TableClause) -> None:  # noqa: B027 - optional hook
        """Drop the temporary table of :meth:`create_changes_table` (one the transaction's end does not drop)."""

    @abstractmethod
    def upsert_from_select(self, merge: Merge) -> sa.Insert:
        """INSERT the selected rows, updating the row of an existing key (only when its ``sequence`` is not older)."""

    def merge_from_select(self, conn: Connection, merge: Merge) -> int:
        """Upsert the selected rows into the target, touching only rows whose key matches (any other unique
        conflict is an error), inside the caller's transaction; the rows written as the server counts them."""
        return max(conn.execute(self.upsert_from_select(merge)).rowcount or 0, 0)

    def server_cast(self, column: Any, source: pa.DataType, target: pa.DataType) -> str | None:
        """The SQL type to cast ``target``'s values to on the server, or None: where the server's cast of what
        Spark's JDBC writer sends differs from any the client can make (rounding, display scale)."""
        return None

    def reflected_name(self, name: str) -> str:
        """A column name from SQLAlchemy's reflection as the server spells it."""
        return name

    def name_unknown_types(  # noqa: B027 - optional hook
        self, conn: Connection, schema: str | None, table: str, columns: dict[str, Any]
    ) -> None:
        """Give the reflected ``columns`` whose type SQLAlchemy does not know (NullType) the server's type."""

    def check_table(self, conn: Connection, plan: TargetPlan) -> TargetPlan:
        """Dialect-specific checks of the target table (e.g. storage engine); the plan, refined if need be."""
        return plan

    # -- branch side ---------------------------------------------------------
    @abstractmethod
    def open_branch(self, xid: Xid, plan: TargetPlan) -> BranchSession: ...

    def enable_spare(self) -> None:  # noqa: B027 - optional: dialects whose connections are slow to make
        """Make each branch's connection ahead of time, in the background (a worker's long-lived dialect)."""
