"""PostgreSQL: PREPARE TRANSACTION, COPY BINARY through ADBC, pg_prepared_xacts."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg
from sqlalchemy.engine import Connection

from xasink.dialects.base import (
    BlockedSession,
    BranchSession,
    Dialect,
    DurabilityRisk,
    ErrorKind,
    PreparedTxn,
    TargetPlan,
    branch_failed,
)
from xasink.dialects.postgres import health as pg_health
from xasink.dialects.postgres.sql import (
    _ADBC_DB_OPTIONS,
    _BRANCH_HINTS,
    _KEEPALIVES,
    _ROWS_CLASSES,
    _SA_DIALECT,
    _TRANSIENT_STATES,
    _UNKNOWN_XID_STATE,
    _UPSERT_LOCK_HINT,
    _driver_sql,
    _literal,
    _sqlstate,
    advisory_key,
)
from xasink.dialects.spare import Spare
from xasink.errors import BranchError, PreflightError
from xasink.protocol.xid import Xid
from xasink.support.masking import redact, url_secrets

if TYPE_CHECKING:  # rows and types only: the driver's commit path never loads pyarrow
    import pyarrow as pa

log = logging.getLogger("xasink.dialects.postgres")
_SYNCHRONOUS = "xasink_synchronous_commit"  # a control session's pool-record flag: it commits durably by default


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
        # control transactions flush their commit unless one says otherwise (relaxed_commit); a session's
        # startup setting outranks the server's file and a reload, so the decision needs no SET of its own
        ours = "-c synchronous_commit=on"
        # every read under the sink lock must see what committed before the lock was granted: under a
        # REPEATABLE READ or SERIALIZABLE default (server, database or role) the snapshot is the lock
        # statement's start, older than a decision that held the lock meanwhile
        ours += " -c default_transaction_isolation=read\\ committed"
        timeout_ms = int(self.settings.control_lock_timeout) * 1000
        if timeout_ms:  # a lock wait ends in SQLSTATE 55P03, transient: the step is retried, never hangs
            ours += f" -c lock_timeout={timeout_ms}"
        user = self.url.query.get("options")  # the URL's own options come after ours, so they win
        args["options"] = f"{ours} {user}" if isinstance(user, str) and user else ours
        return args

    def on_connect(self, dbapi_conn: Any, record: Any) -> None:
        """Whether this control session commits durably by default (the URL's options may say otherwise)."""
        with dbapi_conn.cursor() as cur:
            cur.execute("SHOW synchronous_commit")
            record.info[_SYNCHRONOUS] = str(cur.fetchone()[0]) == "on"
        dbapi_conn.rollback()

    def socket_fd(self, dbapi_conn: Any) -> int | None:
        return int(dbapi_conn.fileno()) if not dbapi_conn.closed else None

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
        # with synchronous_commit = off a crash right after the decision's COMMIT may lose it; a session
        # that started with it on (connect_args) needs no statement for it
        if not conn.info.get(_SYNCHRONOUS):
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
        if state is not None and state.startswith(_ROWS_CLASSES):
            return ErrorKind.ROWS
        if state == "55000" and "is busy" in str(exc):  # another session is finishing the same gid right now
            return ErrorKind.TRANSIENT
        if isinstance(exc, sa.exc.DBAPIError) and exc.connection_invalidated:
            return ErrorKind.TRANSIENT
        if state is None and isinstance(exc, (sa.exc.OperationalError, sa.exc.InterfaceError)):
            return ErrorKind.TRANSIENT
        return ErrorKind.FATAL

    def durability_risks(self, conn: Connection) -> list[DurabilityRisk]:
        risks = []
        settings = ("fsync", "full_page_writes")  # both reloadable (sighup), no restart; read in one round trip
        values = conn.exec_driver_sql("SELECT current_setting('fsync'), current_setting('full_page_writes')").one()
        for setting, value in zip(settings, map(str, values), strict=True):
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
        import pyarrow as pa

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
            if pa.types.is_floating(source) or pa.types.is_decimal(source):
                return source  # the server casts it, as it does what Spark's JDBC writer sends (server_cast)
            if t.precision is None:
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

    def server_cast(self, column: Any, source: pa.DataType, target: pa.DataType) -> str | None:
        """A double or a decimal of another precision into numeric: the server's cast (float8 to numeric keeps 15
        significant digits, then rounds half away from zero to the column's scale; a decimal keeps its display
        scale in an unconstrained numeric), which no Arrow cast reproduces."""
        import pyarrow as pa

        t = column["type"]
        while isinstance(t, pg.DOMAIN):
            t = t.data_type
        if not isinstance(t, sa.Numeric) or isinstance(t, sa.Float):
            return None
        if pa.types.is_floating(target):
            return str(t.compile(dialect=_SA_DIALECT))
        if pa.types.is_decimal(target) and (t.precision, t.scale or 0) != (target.precision, target.scale):
            return str(t.compile(dialect=_SA_DIALECT))  # an unconstrained numeric too: its precision is None
        return None

    def sql_type(self, arrow_type: pa.DataType) -> sa.types.TypeEngine[Any] | None:
        import pyarrow as pa

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

    def lock_apply(self, conn: Connection, name: str) -> None:
        # released with the transaction; a wait past lock_timeout (controlLockTimeout) is 55P03, transient
        conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": advisory_key(name)})

    def referencing_tables(self, conn: Connection, schema: str | None, table: str) -> list[str]:
        name = conn.dialect.identifier_preparer.format_table(sa.table(table, schema=schema))
        rows = conn.execute(
            sa.text(
                "SELECT DISTINCT conrelid::regclass::text FROM pg_constraint "
                "WHERE contype = 'f' AND confrelid = CAST(:t AS regclass) AND conrelid <> confrelid ORDER BY 1"
            ),
            {"t": name},
        ).fetchall()
        return [str(r[0]) for r in rows]

    def clear_shadow(self, conn: Connection, shadow: sa.TableClause, batch: sa.ColumnElement[bool]) -> None:
        # TRUNCATE when the shadow holds nothing else and no other session has it open (a branch of a run
        # still preparing): no dead rows for VACUUM, ~0.5 s less per million rows; else DELETE the batch's rows
        name = conn.dialect.identifier_preparer.format_table(shadow)
        savepoint = conn.begin_nested()
        try:
            conn.exec_driver_sql(f"LOCK TABLE {name} IN ACCESS EXCLUSIVE MODE NOWAIT")
        except sa.exc.DBAPIError:
            savepoint.rollback()
            conn.execute(sa.delete(shadow).where(batch))
            return
        savepoint.commit()
        if conn.execute(sa.select(sa.literal(1)).select_from(shadow).where(~batch).limit(1)).first() is None:
            conn.exec_driver_sql(f"TRUNCATE {name}")
        else:
            conn.execute(sa.delete(shadow).where(batch))

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
        from xasink.dialects.postgres.branch import PostgresBranch  # the executor's side: pyarrow and ADBC

        return PostgresBranch(self, xid, plan)
