"""PostgreSQL: PREPARE TRANSACTION, COPY BINARY through ADBC, pg_prepared_xacts."""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Iterable, Iterator
from typing import Any
from urllib.parse import quote, urlencode

import pyarrow as pa
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg
from sqlalchemy.engine import Connection

from ..errors import BranchError, PreflightError
from ..masking import redact, url_secrets
from ..xid import Xid
from . import pg_health
from .base import (
    KEEPALIVE_COUNT,
    KEEPALIVE_IDLE_S,
    KEEPALIVE_INTERVAL_S,
    BlockedSession,
    BranchSession,
    Dialect,
    DurabilityRisk,
    ErrorKind,
    PreparedTxn,
    TargetPlan,
    branch_failed,
    check_upsert_keys,
)
from .spare import Spare

log = logging.getLogger(__name__)

_SA_DIALECT = pg.psycopg2.dialect()

_UPSERT_LOCK_HINT = (
    "another partition of this batch (or another transaction) holds rows with the same upsert keys ({keys}): a "
    "prepared branch keeps them locked until the batch commits, so rows with equal keys must all be in one "
    "partition. Repartition the DataFrame by the key columns first, e.g. df.repartition({quoted}) (xasink.write() "
    "does this itself)"
)
# ADBC's built-in table of PostgreSQL types instead of reading pg_type and all of pg_attribute at every
# connect (~40 ms of client CPU on an empty database, minutes on one with many tables: apache/arrow-adbc#1755).
# A branch only sends rows of built-in types (a domain column takes its base type's) and reads a count.
_ADBC_DB_OPTIONS = {"adbc.postgresql.type_resolver_mode": "builtin"}
# libpq's TCP keepalives (ignored on a Unix socket): a dead server or network is noticed in about a minute
_KEEPALIVES = {
    "keepalives": 1,
    "keepalives_idle": KEEPALIVE_IDLE_S,
    "keepalives_interval": KEEPALIVE_INTERVAL_S,
    "keepalives_count": KEEPALIVE_COUNT,
}
_TRANSIENT_STATES = {"40001", "40P01", "55P03", "57P01", "57P02", "57P03", "53300", "58000", "58030"}
_UNKNOWN_XID_STATE = "42704"

# SQLSTATEs a branch can fail with, and what the user should do about them
_BRANCH_HINTS = {
    "23505": "duplicate key: the rows collide with rows already in the table (or in this batch); "
    "deduplicate the DataFrame or use upsertKeyColumns",
    "23502": "NULL in a NOT NULL column: fill or filter the NULLs first",
    "23503": "foreign key violation: load the referenced rows first",
    "23514": "check constraint violation",
    "22001": "a string is longer than its column allows: widen the column or truncate the data",
    "22003": "a number is out of range for its column: widen the column type",
    # PostgreSQL reports "maximum number of prepared transactions reached" as 53200 (out of memory)
    "53200": "the server has no free prepared-transaction slot: raise max_prepared_transactions "
    "(at least the number of partitions) or coalesce the DataFrame to fewer partitions",
    "55P03": "a row lock was not granted within lockTimeout: another transaction holds the same keys, most "
    "often another partition of this batch (the DataFrame has duplicate keys across partitions) or a "
    "prepared transaction; deduplicate the DataFrame on the table's keys",
    "42501": "permission denied: grant INSERT on the table (and USAGE on its schema) to the writing user",
}


def _sqlstate(exc: BaseException) -> str | None:
    orig = getattr(exc, "orig", exc)
    for attr in ("pgcode", "sqlstate"):
        code = getattr(orig, attr, None)
        if code:
            return str(code)
    m = re.search(r"SQLSTATE: ([0-9A-Z]{5})", str(orig))
    return m.group(1) if m else None


def _literal(value: str) -> str:
    """A string literal for the statements that take no bound parameter (PREPARE TRANSACTION, COMMIT PREPARED).

    An escape string (E'...') with every backslash and quote doubled means the same text whatever the
    session's standard_conforming_strings: a plain '...' literal does not (with it off, a backslash escapes).
    """
    if "\x00" in value:
        raise ValueError("a PostgreSQL string cannot hold a NUL character")
    return "E'" + value.replace("\\", "\\\\").replace("'", "''") + "'"


def _driver_sql(statement: str) -> str:
    """A statement for SQLAlchemy's exec_driver_sql: psycopg2 formats it with (empty) parameters, so '%' doubles."""
    return statement.replace("%", "%%")


def advisory_key(name: str) -> int:
    """A session lock's name as PostgreSQL's 64-bit advisory lock key (stable across processes and versions)."""
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "big", signed=True)


def _ident(name: str) -> str:
    return str(_SA_DIALECT.identifier_preparer.quote_identifier(name))


def upsert_sql(plan: TargetPlan) -> str:
    """INSERT .. SELECT DISTINCT ON (keys) .. FROM unnest($1..$n) .. ON CONFLICT (keys) DO UPDATE, quoted by SQLAlchemy.

    One array parameter per column; DISTINCT ON with the ordinality keeps the last row of a key
    (ON CONFLICT DO UPDATE cannot touch a row twice in one statement); later chunks overwrite earlier ones.
    """
    names = plan.arrow_schema.names
    ordinal = "xasink_ord"
    while ordinal in names:
        ordinal += "_"
    table = ".".join(_ident(p) for p in (plan.schema, plan.table) if p)
    cols = ", ".join(_ident(n) for n in names)
    keys = ", ".join(_ident(k) for k in plan.upsert_keys)
    params = ", ".join(f"${i + 1}" for i in range(len(names)))
    updates = ", ".join(f"{_ident(n)} = EXCLUDED.{_ident(n)}" for n in names if n not in plan.upsert_keys)
    action = f"DO UPDATE SET {updates}" if updates else "DO NOTHING"
    return (
        f"INSERT INTO {table} ({cols}) SELECT DISTINCT ON ({keys}) {cols} "
        f"FROM unnest({params}) WITH ORDINALITY AS u({cols}, {_ident(ordinal)}) "
        f"ORDER BY {keys}, {_ident(ordinal)} DESC ON CONFLICT ({keys}) {action}"
    )


class PostgresBranch(BranchSession):
    """A branch: one ADBC connection in a transaction, rows loaded by binary COPY, then PREPAREd."""

    def __init__(self, dialect: PostgresDialect, xid: Xid, plan: TargetPlan) -> None:
        super().__init__(xid)
        self.dialect = dialect
        self.plan = plan
        spare = dialect.spare.take() if dialect.spare is not None else None
        self.conn = spare if spare is not None else dialect.adbc_connect()
        self.cursor = self.conn.cursor()
        set_timeout = f"SET lock_timeout = {int(dialect.settings.lock_timeout) * 1000}"
        try:
            try:
                self.cursor.execute(set_timeout)
            except Exception as exc:  # noqa: BLE001 - a spare the server dropped: nothing written, connect anew
                if spare is None:
                    raise
                log.debug("spare branch connection unusable (%s): connecting anew", exc)
                self._close()
                self.conn = dialect.adbc_connect()
                self.cursor = self.conn.cursor()
                self.cursor.execute(set_timeout)
        except Exception as exc:
            self.rollback()
            raise dialect.branch_error(exc, xid, plan) from None
        if dialect.spare is not None:
            dialect.spare.refill()

    def load(self, batches: Iterator[pa.RecordBatch]) -> int:
        count = 0
        source_error: list[BaseException] = []

        def counted() -> Iterator[pa.RecordBatch]:
            nonlocal count
            try:
                for batch in batches:
                    count += batch.num_rows
                    yield batch
            except BaseException as exc:
                source_error.append(exc)
                raise

        try:
            if self.plan.upsert_keys:
                self._upsert(counted())
            else:
                reader = pa.RecordBatchReader.from_batches(self.plan.arrow_schema, counted())
                self.cursor.adbc_ingest(self.plan.table, reader, mode="append", db_schema_name=self.plan.schema)
        except BranchError:
            raise
        except Exception as exc:
            if source_error:  # the rows' own iterator failed (e.g. a value that does not fit): ADBC wraps it
                raise source_error[0] from None
            raise self.dialect.branch_error(exc, self.xid, self.plan) from None
        return count

    def _upsert(self, batches: Iterator[pa.RecordBatch]) -> None:
        """Merge each chunk with one INSERT ... SELECT FROM unnest(arrays) ... ON CONFLICT DO UPDATE.

        Chosen over a staging table (temporary tables cannot be PREPAREd; an UNLOGGED one needs
        CREATE on the schema and churns the catalog) after measuring both: the merge dominates
        either way (benchmarks/upsert_strategies.py).  Duplicate keys in a partition: the last row wins.
        """
        sql = upsert_sql(self.plan)
        keys = [self.plan.arrow_schema.get_field_index(k) for k in self.plan.upsert_keys]
        step = self.dialect.upsert_chunk_rows
        for batch in batches:
            check_upsert_keys(batch, self.plan, keys, self.xid.partition)
            for start in range(0, batch.num_rows, step):
                chunk = batch.slice(start, step)
                offsets = pa.array([0, chunk.num_rows], type=pa.int32())
                params = pa.RecordBatch.from_arrays(
                    [pa.ListArray.from_arrays(offsets, col) for col in chunk.columns],
                    names=[f"p{i}" for i in range(chunk.num_columns)],
                )
                self.cursor.execute(sql, parameters=params)

    def prepare(self) -> None:
        try:
            self.cursor.execute(f"PREPARE TRANSACTION {_literal(self.xid.gid)}")
            self.cursor.execute("SELECT count(*) FROM pg_prepared_xacts WHERE gid = $1", parameters=(self.xid.gid,))
            row = self.cursor.fetchone()
        except Exception as exc:
            raise self.dialect.branch_error(exc, self.xid, self.plan) from None
        finally:
            self._close()
        if not row or row[0] != 1:
            raise BranchError(f"branch {self.xid} was not prepared (the server rolled it back); nothing of it remains")

    def rollback(self) -> None:
        try:
            self.conn.rollback()
        except Exception as exc:  # noqa: BLE001 - the connection may be gone; the server rolls back then
            log.debug("rollback of %s: %s", self.xid, exc)
        self._close()

    def _close(self) -> None:
        for obj in (self.cursor, self.conn):
            try:
                obj.close()
            except Exception:  # noqa: BLE001,S110 - closing a dead connection
                pass


class PostgresDialect(Dialect):
    name = "PostgreSQL"
    default_port = 5432
    upsert_chunk_rows = 10_000  # rows per upsert statement (array parameters)

    def connect_args(self) -> dict[str, Any]:
        # an application_name in the URL is the user's (monitoring, pg_stat_activity): it wins over ours
        args: dict[str, Any] = {
            "connect_timeout": 10,
            "application_name": self.url.query.get("application_name", "xasink"),
            **_KEEPALIVES,
        }
        timeout_ms = int(self.settings.control_lock_timeout) * 1000
        if timeout_ms:  # a lock wait ends in SQLSTATE 55P03, transient: the step is retried, never hangs
            ours = f"-c lock_timeout={timeout_ms}"
            user = self.url.query.get("options")  # the URL's own options come after ours, so they win
            args["options"] = f"{ours} {user}" if isinstance(user, str) and user else ours
        return args

    spare: Spare[Any] | None = None  # a branch connection made ahead (executors: see enable_spare)

    def enable_spare(self) -> None:
        if self.spare is None:
            self.spare = Spare(self._adbc_connect_raw)

    def _adbc_connect_raw(self) -> Any:
        import adbc_driver_postgresql.dbapi as adbc

        return adbc.connect(self.libpq_uri(), db_kwargs=_ADBC_DB_OPTIONS, autocommit=False)

    def adbc_connect(self) -> Any:
        """A new branch connection; failures become a ConnectError that says what to do."""
        try:
            return self._adbc_connect_raw()
        except Exception as exc:  # noqa: BLE001 - any driver error is a connect error here
            raise self.connect_error(exc) from None

    def libpq_uri(self) -> str:
        """A libpq URI for ADBC; it carries the password, so it is never logged."""
        query = {"application_name": "xasink", **{k: str(v) for k, v in _KEEPALIVES.items()}, **dict(self.url.query)}
        if self.url.password is not None and not self.url.username:  # a URL renders no password without a user
            query["password"] = self.url.password
        base = self.url.set(drivername="postgresql", query={}).render_as_string(hide_password=False)
        # percent-encode the query ourselves: SQLAlchemy writes a space as '+', which libpq keeps literally
        return base + "?" + urlencode(query, doseq=True, quote_via=quote)

    # -- XA verbs ----------------------------------------------------------
    def commit_prepared(self, conn: Connection, xid: Xid) -> None:
        conn.exec_driver_sql(_driver_sql(f"COMMIT PREPARED {_literal(xid.gid)}"))

    def rollback_prepared(self, conn: Connection, xid: Xid) -> None:
        conn.exec_driver_sql(_driver_sql(f"ROLLBACK PREPARED {_literal(xid.gid)}"))

    def rollback_foreign(self, conn: Connection, gid: str) -> None:
        conn.exec_driver_sql(_driver_sql(f"ROLLBACK PREPARED {_literal(gid)}"))

    def durable_commit(self, conn: Connection) -> None:
        # with synchronous_commit = off a crash right after the decision's COMMIT may lose it
        conn.exec_driver_sql("SET LOCAL synchronous_commit = on")

    def relaxed_commit(self, conn: Connection) -> None:
        conn.exec_driver_sql("SET LOCAL synchronous_commit = off")

    # -- session locks --------------------------------------------------------
    def try_session_lock(self, conn: Connection, name: str) -> bool:
        return bool(conn.execute(sa.text("SELECT pg_try_advisory_lock(:k)"), {"k": advisory_key(name)}).scalar())

    def release_session_lock(self, conn: Connection, name: str) -> None:
        conn.execute(sa.text("SELECT pg_advisory_unlock(:k)"), {"k": advisory_key(name)})

    def held_session_locks(self, conn: Connection, names: Iterable[str]) -> set[str]:
        by_key = {advisory_key(n) & 0xFFFFFFFFFFFFFFFF: n for n in names}
        if not by_key:
            return set()
        rows = conn.execute(
            sa.text(
                "SELECT classid::bigint, objid::bigint FROM pg_locks WHERE locktype = 'advisory' "
                "AND objsubid = 1 AND granted AND database = (SELECT oid FROM pg_database "
                "WHERE datname = current_database())"
            )
        ).fetchall()
        return {by_key[k] for k in ((int(hi) << 32) | int(lo) for hi, lo in rows) if k in by_key}

    def server_uptime_s(self, conn: Connection) -> float:
        return float(conn.exec_driver_sql("SELECT EXTRACT(EPOCH FROM now() - pg_postmaster_start_time())").scalar_one())

    def utc_now(self) -> sa.sql.ColumnElement[Any]:
        return sa.func.timezone("UTC", sa.func.now())

    def list_prepared(self, conn: Connection) -> list[PreparedTxn]:
        rows = conn.exec_driver_sql(
            "SELECT gid, prepared AT TIME ZONE 'UTC', owner, database FROM pg_prepared_xacts "
            "WHERE database = current_database() ORDER BY prepared"
        ).fetchall()
        return [PreparedTxn(r[0], Xid.parse(r[0]), r[1], r[2], r[3]) for r in rows]

    def prepared_capacity(self, conn: Connection) -> tuple[int, int | None]:
        return pg_health.prepared_capacity(conn)

    def blocked_by_prepared(self, conn: Connection) -> list[BlockedSession]:
        return pg_health.blocked_by_prepared(conn)

    def classify(self, exc: BaseException) -> ErrorKind:
        state = _sqlstate(exc)
        if state == _UNKNOWN_XID_STATE:
            return ErrorKind.UNKNOWN_XID
        if state in _TRANSIENT_STATES or (state or "").startswith("08"):
            return ErrorKind.TRANSIENT
        if state == "55000" and "is busy" in str(exc):  # another session is finishing the same gid right now
            return ErrorKind.TRANSIENT
        if isinstance(exc, sa.exc.DBAPIError) and exc.connection_invalidated:
            return ErrorKind.TRANSIENT
        if state is None and isinstance(exc, (sa.exc.OperationalError, sa.exc.InterfaceError)):
            return ErrorKind.TRANSIENT
        return ErrorKind.FATAL

    def durability_risks(self, conn: Connection) -> list[DurabilityRisk]:
        risks = []
        for setting in ("fsync", "full_page_writes"):  # both reloadable (sighup), no restart
            value = str(conn.exec_driver_sql(f"SHOW {setting}").scalar_one())
            if value.lower() != "on":
                fix = f"{setting} = on: ALTER SYSTEM SET {setting} = on; SELECT pg_reload_conf()"
                risks.append(DurabilityRisk(setting, value, fix))
        return risks

    def check_server(self, conn: Connection, branches: int | None) -> None:
        self.warn_durability(conn)
        limit = int(conn.exec_driver_sql("SHOW max_prepared_transactions").scalar_one())
        if limit == 0:
            raise PreflightError(
                f"PostgreSQL at {self.where()} has max_prepared_transactions = 0, which disables PREPARE TRANSACTION. "
                "Set it to at least the number of partitions you write (e.g. 'ALTER SYSTEM SET "
                "max_prepared_transactions = 64' or postgresql.conf) and restart the server."
            )
        if branches:
            in_use = int(conn.exec_driver_sql("SELECT count(*) FROM pg_prepared_xacts").scalar_one())
            if branches > limit - in_use:
                raise PreflightError(
                    f"PostgreSQL at {self.where()} has {limit - in_use} free prepared-transaction slots "
                    f"(max_prepared_transactions = {limit}, {in_use} in use) but this write needs {branches}: "
                    "coalesce to fewer partitions (numPartitions) or raise max_prepared_transactions."
                )

    def branch_error(self, exc: BaseException, xid: Xid, plan: TargetPlan) -> BranchError:
        state = _sqlstate(exc)
        text = redact(str(getattr(exc, "orig", exc)), url_secrets(self.url))
        text = re.sub(r"^[A-Z_]+: \[libpq\] ", "", text.strip())
        text = re.sub(r"Failed to execute query '.*?': (?=ERROR:)", "", text, count=1, flags=re.S)
        text = re.sub(r"^Failed to execute COPY statement: (?:PGRES_[A-Z_]+ )?(?=ERROR:)", "", text, count=1)
        hint = _BRANCH_HINTS.get(state or "")
        if plan.upsert_keys and state in ("55P03", "40P01"):
            keys = plan.upsert_keys
            hint = _UPSERT_LOCK_HINT.format(keys=", ".join(keys), quoted=", ".join(repr(k) for k in keys))
        if state == "53200" and "prepared transactions" not in text:  # a real out-of-memory
            hint = None
        what = text.splitlines()[0] if text else str(exc)
        detail = [ln for ln in text.splitlines()[1:] if ln.startswith(("DETAIL", "HINT"))]
        if detail:
            what += " (" + "; ".join(d.strip() for d in detail) + ")"
        err = branch_failed(xid, plan, what, hint)
        err.sqlstate = state  # type: ignore[attr-defined]
        return err

    # -- tables ------------------------------------------------------------
    def arrow_type(self, column: Any, source: pa.DataType) -> pa.DataType | None:
        t = column["type"]
        while isinstance(t, pg.DOMAIN):  # a domain loads as its base type; the server checks its constraint
            t = t.data_type
        if isinstance(t, sa.SmallInteger):
            return pa.int16()
        if isinstance(t, sa.BigInteger):
            return pa.int64()
        if isinstance(t, sa.Integer):
            return pa.int32()
        if isinstance(t, sa.REAL):
            return pa.float32()
        if isinstance(t, sa.Float):
            return pa.float64()
        if isinstance(t, sa.Numeric):
            if t.precision is None:  # unconstrained numeric takes any scale: keep the source's
                if pa.types.is_decimal(source):
                    return source
                return pa.decimal128(20, 0) if pa.types.is_integer(source) else pa.decimal128(38, 12)
            if t.precision <= 38:
                return pa.decimal128(t.precision, t.scale or 0)
            return pa.decimal256(t.precision, t.scale or 0)
        if isinstance(t, sa.Boolean):
            return pa.bool_()
        if isinstance(t, (sa.String,)) and not isinstance(t, sa.Enum):
            return pa.string()
        if isinstance(t, sa.LargeBinary):
            return pa.binary()
        if isinstance(t, sa.DateTime):
            return pa.timestamp("us", tz="UTC") if t.timezone else pa.timestamp("us")
        if isinstance(t, sa.Date):
            return pa.date32()
        return None

    def sql_type(self, arrow_type: pa.DataType) -> sa.types.TypeEngine[Any] | None:
        t = arrow_type
        if pa.types.is_int8(t) or pa.types.is_int16(t):
            return sa.SmallInteger()
        if pa.types.is_int32(t):
            return sa.Integer()
        if pa.types.is_int64(t):
            return sa.BigInteger()
        if pa.types.is_float32(t):
            return pg.REAL()
        if pa.types.is_float64(t):
            return pg.DOUBLE_PRECISION()
        if pa.types.is_decimal(t):
            return sa.Numeric(t.precision, t.scale)
        if pa.types.is_boolean(t):
            return sa.Boolean()
        if pa.types.is_string(t) or pa.types.is_large_string(t):
            return sa.Text()
        if pa.types.is_binary(t) or pa.types.is_large_binary(t):
            return pg.BYTEA()
        if pa.types.is_date(t):
            return sa.Date()
        if pa.types.is_timestamp(t):
            return pg.TIMESTAMP(timezone=t.tz is not None)
        if pa.types.is_null(t):
            return sa.Text()
        return None

    def parse_type(self, text: str) -> sa.types.TypeEngine[Any]:
        m = re.fullmatch(r"\s*([A-Za-z][A-Za-z0-9 ]*?)\s*(?:\(\s*(\d+)\s*(?:,\s*(\d+)\s*)?\))?\s*", text)
        if m is None:
            raise PreflightError(f"createTableColumnTypes: cannot parse type {text!r}")
        name = " ".join(m.group(1).lower().split())
        name = {
            "int": "integer",
            "int4": "integer",
            "int8": "bigint",
            "int2": "smallint",
            "varchar": "character varying",
            "char": "character",
            "float8": "double precision",
            "float4": "real",
            "bool": "boolean",
            "decimal": "numeric",
            "timestamptz": "timestamp with time zone",
            "double": "double precision",
            "string": "text",
            "long": "bigint",
            "binary": "bytea",
        }.get(name, name)
        cls = _SA_DIALECT.ischema_names.get(name)
        if cls is None:
            raise PreflightError(f"createTableColumnTypes: unknown PostgreSQL type {text!r}")
        args = [int(a) for a in m.groups()[1:] if a is not None]
        try:
            return cls(*args) if args else cls()  # type: ignore[no-any-return]
        except TypeError:
            raise PreflightError(f"createTableColumnTypes: type {text!r} takes no such arguments") from None

    # -- branch ------------------------------------------------------------
    def lock_for_overwrite(self, conn: Connection, schema: str | None, table: str) -> None:
        # SHARE ROW EXCLUSIVE: writers wait for the replace to commit, readers (ACCESS SHARE) never do
        name = conn.dialect.identifier_preparer.format_table(sa.table(table, schema=schema))
        conn.exec_driver_sql(f"LOCK TABLE {name} IN SHARE ROW EXCLUSIVE MODE")

    def upsert_from_select(
        self,
        target: sa.TableClause,
        columns: list[str],
        select: sa.Select[Any],
        keys: list[str],
        sequence: str | None,
    ) -> sa.Insert:
        from sqlalchemy.dialects.postgresql import insert

        stmt = insert(target).from_select(columns, select)
        updates = {c: stmt.excluded[c] for c in columns if c not in keys}
        if not updates:
            return stmt.on_conflict_do_nothing(index_elements=keys)
        newer = None
        if sequence is not None:
            stored = target.c[sequence]
            newer = sa.or_(stored.is_(None), stored <= stmt.excluded[sequence])
        return stmt.on_conflict_do_update(index_elements=keys, set_=updates, where=newer)

    def open_branch(self, xid: Xid, plan: TargetPlan) -> BranchSession:
        return PostgresBranch(self, xid, plan)
