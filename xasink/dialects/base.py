"""What every database dialect provides: the XA verbs, recovery, bulk load and checks.

Dialects are the only modules that speak SQL.  The control side (the
driver's journal, commit and sweep) runs through a SQLAlchemy engine; the
branch side (an executor loading rows) uses whatever driver API is fastest.
"""

from __future__ import annotations

import enum
import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import URL, Connection, Engine
from sqlalchemy.pool import NullPool

from xasink.dialects.pooling import watch_checkouts
from xasink.errors import BranchError, ConnectError, XasinkError
from xasink.protocol.xid import Xid
from xasink.support import phases
from xasink.support.masking import display_url, redact, url_secrets

if TYPE_CHECKING:  # rows and types only: the driver's commit path never loads pyarrow
    import pyarrow as pa

log = logging.getLogger(__name__)


SHADOW_INDEX_SUFFIX = "_br"


class ErrorKind(enum.Enum):
    """What an error says about a batch, decided by the dialect from the error's class and nowhere else.

    Only ``ROWS`` may withdraw a decided batch (while none of its rows is visible); ``TRANSIENT`` and
    ``FATAL`` both mean "not finished yet" (the batch stays decided, a later run or recover finishes it);
    ``UNKNOWN_XID`` is settled by reading again, never assumed.
    """

    ROWS = "rows"  # the rows are wrong: a constraint of the table they violate, a value the column cannot hold
    TRANSIENT = "transient"  # not finished, worth retrying: a lost connection, a lock or statement timeout, a
    # cancelled statement, a read-only, full or restarting server (only ever retried outside a branch)
    UNKNOWN_XID = "unknown_xid"  # the server no longer knows the branch
    FATAL = "fatal"  # not finished, and no retry of this step helps (a missing privilege, a bug): say so


@dataclass(frozen=True)
class PreparedTxn:
    """One prepared transaction on the server, ours (``xid`` set) or foreign."""

    gid: str
    xid: Xid | None
    prepared_at: datetime | None = None
    owner: str | None = None
    database: str | None = None


@dataclass(frozen=True)
class BlockedSession:
    """A session waiting for a lock that a prepared transaction holds: what an on-call engineer alerts on."""

    session: int  # PostgreSQL: the backend's pid; MySQL: the thread (connection) id
    database: str | None
    user: str | None
    query_age_s: float | None  # since the blocked statement started (server clock)
    wait_age_s: float | None  # since the lock wait started, where the server says (PostgreSQL 14+, InnoDB)
    blockers: tuple[str, ...]  # PostgreSQL: gids of the prepared transactions; MySQL: ``innodb-trx:<id>``


@dataclass(frozen=True)
class TargetPlan:
    """How rows reach the target table: decided on the driver, shipped to executors."""

    schema: str | None
    table: str
    arrow_schema: pa.Schema  # column names and exact types the table takes
    source_names: tuple[str, ...]  # DataFrame column for each arrow_schema field
    upsert_keys: tuple[str, ...] = ()
    # MySQL family: the table is such that loading with REPLACE gives exactly the upsert's rows
    # (MySQLDialect.replace_is_upsert), so the merge needs no staging table
    upsert_by_replace: bool = False
    # MySQL family: the table has unique indexes besides the key's, where ON DUPLICATE KEY UPDATE would hit
    # another key's row: the branch updates rows found by the key (through ``upsert_index``, the key's unique
    # index) and inserts the rest plainly, so any other unique conflict fails the batch
    upsert_by_update: bool = False
    upsert_index: str | None = None
    # the shadow table of an overwrite / replaceWhere / change-data write (xasink.write_modes.statements):
    # this column of each row is the batch id, filled in by the task
    batch_column: str | None = None
    branch_column: str | None = None  # the shadow's column of each row's branch (its xid's bqual), ditto
    required: tuple[str, ...] = ()  # columns that must not be NULL in any row (change-data keys and sequence)
    # Spark's session time zone (spark.sql.session.timeZone), set in each task: a TimestampNTZType written to a
    # column that holds an instant is that wall time in this zone, as Spark casts it (None: not known)
    time_zone: str | None = None
    # columns whose values the server casts to the column's type (a double into numeric, a decimal into an
    # unconstrained numeric), as it does for Spark's JDBC writer: the PostgreSQL branch inserts them with a cast
    server_casts: tuple[tuple[str, str], ...] = ()  # (column, SQL type)


def branch_failed(xid: Xid, plan: TargetPlan, what: str, hint: str | None = None) -> BranchError:
    """The one shape of a branch's error: which partition, which table, what went wrong, what to do."""
    target = f"{plan.schema}.{plan.table}" if plan.schema else plan.table
    msg = f"partition {xid.partition} could not be written to {target}: {what}"
    if hint:
        msg += f". {hint}"
    return BranchError(msg + ". The branch was rolled back; nothing of this batch is visible.")


def check_required(batch: pa.RecordBatch, plan: TargetPlan, partition: int) -> None:
    """A change without its key or sequence cannot be applied: say so before the branch prepares."""
    for name in plan.required:
        column = batch.column(plan.arrow_schema.get_field_index(name))
        if column.null_count:
            raise BranchError(
                f"partition {partition}: column '{name}' is NULL in some rows; a change needs its key and "
                "sequence to be applied. Filter or fill those rows first. Nothing of this batch is visible."
            )


def check_upsert_keys(batch: pa.RecordBatch, plan: TargetPlan, key_index: list[int], partition: int) -> None:
    """A NULL key never matches a row (ON CONFLICT / ON DUPLICATE KEY), so it cannot be upserted: say so."""
    for i in key_index:
        if batch.column(i).null_count:
            name = plan.arrow_schema.field(i).name
            raise BranchError(
                f"partition {partition}: upsert key column '{name}' is NULL in some rows; a row without a key "
                "cannot be merged. Filter or fill those rows first. Nothing of this batch is visible."
            )


class BranchSession(ABC):
    """One XA branch on its own connection, owned by one task attempt."""

    def __init__(self, xid: Xid) -> None:
        self.xid = xid

    @abstractmethod
    def load(self, batches: Iterator[pa.RecordBatch]) -> int:
        """Load rows inside the branch; returns the number of rows."""

    @abstractmethod
    def prepare(self) -> None:
        """End and PREPARE the branch, verify it is prepared, and disconnect."""

    @abstractmethod
    def rollback(self) -> None:
        """Roll back an unprepared branch and disconnect; never raises."""


@dataclass(frozen=True)
class BranchSettings:
    """How a branch loads its rows: the options that reach a dialect (``WriteOptions.branch_settings``)."""

    # seconds a branch waits for a row lock (0: no limit).  A key held by a prepared branch of the same
    # batch (duplicate keys across partitions) is never released before the task ends: without a limit
    # the task and the driver wait for each other forever.  Option lockTimeout.
    lock_timeout: int = 60
    # rows per bulk statement where the database loads in chunks (MySQL: LOAD DATA / INSERT); option batchsize
    batch_size: int = 10_000
    # MySQL: load with LOAD DATA LOCAL when the server allows it; option localInfile
    local_infile: bool = True
    # seconds a control connection (decide, commit, sweep, recover) waits for a lock (0: no limit): the
    # error is transient, so the step is retried instead of the coordinator waiting forever; option
    # controlLockTimeout
    control_lock_timeout: int = 60


# TCP keepalives of every connection: a peer that died without closing (a server host lost, a cut network)
# is noticed after about IDLE + INTERVAL * COUNT seconds instead of the system default of hours
KEEPALIVE_IDLE_S = 30
KEEPALIVE_INTERVAL_S = 10
KEEPALIVE_COUNT = 3


def set_keepalive(sock: Any) -> None:
    """Turn on TCP keepalives with xasink's timings on a connected socket (a no-op for a Unix socket)."""
    import socket

    if sock is None or getattr(sock, "family", None) not in (socket.AF_INET, socket.AF_INET6):
        return
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for name, value in (
            ("TCP_KEEPIDLE", KEEPALIVE_IDLE_S),
            ("TCP_KEEPINTVL", KEEPALIVE_INTERVAL_S),
            ("TCP_KEEPCNT", KEEPALIVE_COUNT),
        ):
            opt = getattr(socket, name, None)
            if opt is not None:
                sock.setsockopt(socket.IPPROTO_TCP, opt, value)
    except OSError as exc:  # a platform without these options: the connection works, only less watched
        log.debug("TCP keepalive not set: %s", exc)


# (dialect, host:port, setting, value) already warned about in this process: once per run, not per batch
_DURABILITY_WARNED: set[tuple[str, str, str]] = set()


@dataclass(frozen=True)
class DurabilityRisk:
    """A server setting under which a crash can lose prepared branches or decisions."""

    setting: str
    value: str
    fix: str  # what to set, as the operator would type it


def _stamp_connect(dialect: Any, conn_rec: Any, cargs: Any, cparams: Any) -> None:
    conn_rec.info["xasink_connect_start"] = time.time()


def _record_connect(dbapi_conn: Any, conn_rec: Any) -> None:
    start = conn_rec.info.pop("xasink_connect_start", None)
    if start is not None:
        phases.record("connect.control", start, time.time())


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
        sa.event.listen(engine, "connect", self.on_connect)
        if phases.enabled():  # the benchmark's breakdown: what a control connection's set-up costs
            sa.event.listen(engine, "do_connect", _stamp_connect)
            sa.event.listen(engine, "connect", _record_connect)
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
        text = redact(str(orig).strip(), url_secrets(self.url))
        low = text.lower()
        if "password" in low or "access denied" in low or "authentication" in low:
            return ConnectError(
                f"authentication failed for user '{self.url.username}' at {self.where()}: "
                f"check the 'user' and 'password' options ({text.splitlines()[0]})"
            )
        if "does not exist" in low or "unknown database" in low:
            return ConnectError(f"{self.where()}: {text.splitlines()[0]}; create it or fix the database in 'url'")
        return ConnectError(
            f"cannot connect to {self.name} at {self.where()}: is the server running and "
            f"reachable from here? ({text.splitlines()[0] if text else type(orig).__name__})"
        )

    def dispose(self) -> None:
        for engine in (self._engine, self._autocommit_engine):
            if engine is not None:
                engine.dispose()
        self._engine = self._autocommit_engine = None

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
        """Warn (once per process and server) about settings that let a server crash lose prepared branches.

        Exactly once is only as durable as the server: with these settings a crash can forget a prepared
        branch of a decided batch (its rows are lost) or the decision itself.  A warning, not an error: the
        operator may accept the risk (a test server), and the setting is the server's, not the job's.
        """
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
        """The server's clock in UTC (naive), as SQL: every time the decision log stamps, so ages need no client
        clock and no time zone or daylight-saving rule."""
        return sa.func.utc_timestamp()

    def server_now(self, conn: Connection) -> Any:
        """The server's clock in UTC, to age prepared transactions by the clock that stamped them."""
        return conn.execute(sa.select(self.utc_now())).scalar()

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

    def table_kwargs(self) -> dict[str, Any]:
        """Extra keywords for tables xasink creates (e.g. the storage engine)."""
        return {}

    def durable_commit(self, conn: Connection) -> None:  # noqa: B027 - optional hook
        """Make this transaction's COMMIT wait until it is on disk, whatever the server's default.

        The decision must survive a server crash: PREPARE and COMMIT PREPARED are always flushed, an
        ordinary commit (the decision's) not when the server runs with asynchronous commit.
        """

    def relaxed_commit(self, conn: Connection) -> None:  # noqa: B027 - optional hook
        """Let this transaction's COMMIT return before it is on disk, where the server would wait for it.

        Only for a transaction whose loss in a server crash changes nothing that matters: one that wrote
        nothing (it only held the sink lock to read), or the mark of a committed batch (recovery marks a
        decided batch again, its branches answer "unknown" as committed).  PostgreSQL: a ``SELECT ... FOR
        UPDATE`` gives the transaction an id and a WAL record, so its commit waits for a flush otherwise.
        """

    # -- overwrite, replaceWhere, change-data apply (xasink.write_modes.statements) ---------------
    # whether the shadow gets an index on (batch, branch) (named <shadow>SHADOW_INDEX_SUFFIX), and the isolation
    # level of the apply's transaction: InnoDB's locking reads (INSERT .. SELECT, DELETE, at REPEATABLE READ)
    # lock every row they scan, so an apply would wait on another run's prepared rows of the shadow
    index_shadow = False
    apply_isolation: str | None = None

    @abstractmethod
    def lock_apply(self, conn: Connection, name: str) -> None:
        """Take the apply lock ``name`` inside the caller's transaction, waiting at most controlLockTimeout (a
        transient error then): applies of one sink and target run one after the other."""

    def unlock_apply(self, conn: Connection, name: str) -> None:  # noqa: B027 - optional hook
        """Release the apply lock once the transaction ended (a lock that does not end with it)."""

    @abstractmethod
    def referencing_tables(self, conn: Connection, schema: str | None, table: str) -> list[str]:
        """The other tables whose foreign keys reference ``table`` (a self-reference is not listed)."""

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

    def clear_shadow(self, conn: Connection, shadow: sa.TableClause, batch: sa.ColumnElement[bool]) -> None:
        """Delete the applied batch's rows from the shadow, inside the caller's transaction."""
        conn.execute(sa.delete(shadow).where(batch))

    def delete_joined(
        self, target: sa.TableClause, changes: sa.Subquery, condition: sa.ColumnElement[bool]
    ) -> sa.Delete:
        """DELETE the target's rows that match rows of ``changes`` under ``condition``."""
        return sa.delete(target).where(condition)

    @abstractmethod
    def upsert_from_select(
        self,
        target: sa.TableClause,
        columns: list[str],
        select: sa.Select[Any],
        keys: list[str],
        sequence: str | None,
    ) -> sa.Insert:
        """INSERT the selected rows, updating the row of an existing key (only when ``sequence`` is not older)."""

    def merge_from_select(
        self,
        conn: Connection,
        target: sa.TableClause,
        columns: list[str],
        select: sa.Select[Any],
        keys: list[str],
        sequence: str | None,
    ) -> int:
        """Upsert the selected rows into the target, touching only rows whose key matches (any other unique
        conflict is an error), inside the caller's transaction; the rows written as the server counts them."""
        return max(conn.execute(self.upsert_from_select(target, columns, select, keys, sequence)).rowcount or 0, 0)

    def server_cast(self, column: Any, source: pa.DataType, target: pa.DataType) -> str | None:
        """The SQL type to cast to on the server when values of ``target`` go into the reflected column, or None.

        Where the server's cast of what Spark's JDBC writer sends differs from any the client can make (its
        rounding, its display scale), the branch sends the value and lets the server cast it."""
        return None

    def check_table(self, conn: Connection, plan: TargetPlan) -> TargetPlan:
        """Dialect-specific checks of the target table (e.g. storage engine); the plan, refined if need be."""
        return plan

    # -- branch side ---------------------------------------------------------
    @abstractmethod
    def open_branch(self, xid: Xid, plan: TargetPlan) -> BranchSession: ...

    def enable_spare(self) -> None:  # noqa: B027 - optional: dialects whose connections are slow to make
        """Make each branch's connection ahead of time, in the background (a worker's long-lived dialect)."""
