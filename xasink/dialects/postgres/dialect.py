"""PostgreSQL: PREPARE TRANSACTION, COPY BINARY through ADBC, pg_prepared_xacts."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import distinct_on
from sqlalchemy.engine import Connection

from xasink.dialects.base import BranchSession, Dialect
from xasink.dialects.postgres import health as pg_health
from xasink.dialects.postgres.sql import (
    ADBC_DB_OPTIONS,
    ARRAY_NULLS,
    BRANCH_HINTS,
    JDBC_SESSION,
    KEEPALIVES,
    LOCK_NOT_AVAILABLE,
    ROWS_CLASSES,
    SORT_MEMORY,
    TRANSIENT_STATES,
    UNKNOWN_XID_STATE,
    UPSERT_LOCK_HINT,
    advisory_key,
    driver_sql,
    quote_ident,
    sqlstate_of,
    string_literal,
)
from xasink.dialects.postgres.types import PostgresTypes
from xasink.dialects.rendering import statement_text
from xasink.dialects.spare import Spare
from xasink.dialects.values import (
    BlockedSession,
    DurabilityRisk,
    ErrorKind,
    Merge,
    PreparedTxn,
    SwapTarget,
    TargetPlan,
    branch_failed,
)
from xasink.errors import BranchError, PreflightError
from xasink.protocol.xid import Xid
from xasink.support.masking import redact, url_secrets

if TYPE_CHECKING:  # rows and types only: the driver's commit path never loads pyarrow
    pass

log = logging.getLogger("xasink.dialects.postgres")
_SYNCHRONOUS = "xasink_synchronous_commit"  # a control session's pool-record flag: it commits durably by default


class PostgresDialect(PostgresTypes, Dialect):
    name = "PostgreSQL"
    default_port = 5432
    # the cluster's system identifier (drawn by initdb; any role may read it) and the database
    identity_sql = "SELECT system_identifier, current_database() FROM pg_control_system()"
    identity_format = "postgresql://{}/{}"
    database_sql = "SELECT current_database()"

    @classmethod
    def table_schema(cls, conn: Connection, table: str) -> str | None:
        name = conn.dialect.identifier_preparer.quote_identifier(table)
        found = conn.execute(
            sa.text(
                "SELECT n.nspname FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
                "WHERE c.oid = pg_catalog.to_regclass(:name)"
            ),
            {"name": name},
        ).scalar()
        return str(found) if found is not None else None

    upsert_chunk_rows = 10_000  # rows per upsert statement (array parameters)

    def connect_args(self) -> dict[str, Any]:
        # an application_name in the URL is the user's (monitoring, pg_stat_activity): it wins over ours
        args: dict[str, Any] = {
            "connect_timeout": 10,
            "application_name": self.url.query.get("application_name", "xasink"),
            **KEEPALIVES,
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
        user = self.url.query.get("options")  # the URL's own options come after ours, so they win (not on arrays)
        args["options"] = f"{ours} {user} {ARRAY_NULLS}" if isinstance(user, str) and user else f"{ours} {ARRAY_NULLS}"
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

        return adbc.connect(self.libpq_uri(), db_kwargs=ADBC_DB_OPTIONS, autocommit=False)

    def adbc_connect(self) -> Any:
        """A new branch connection; failures become a ConnectError that says what to do."""
        try:
            return self._adbc_connect_raw()
        except Exception as exc:  # noqa: BLE001 - any driver error is a connect error here
            raise self.connect_error(exc) from None

    def libpq_uri(self) -> str:
        """A libpq URI for ADBC; it carries the password, so it is never logged."""
        query = {"application_name": "xasink", **{k: str(v) for k, v in KEEPALIVES.items()}, **dict(self.url.query)}
        user = query.get("options")  # the branch reads values as Spark's JDBC writer's sessions do: after the URL's
        query["options"] = f"{user} {JDBC_SESSION}" if isinstance(user, str) and user else JDBC_SESSION
        if self.url.password is not None and not self.url.username:  # a URL renders no password without a user
            query["password"] = self.url.password
        base = self.url.set(drivername="postgresql", query={}).render_as_string(hide_password=False)
        # percent-encode the query ourselves: SQLAlchemy writes a space as '+', which libpq keeps literally
        return base + "?" + urlencode(query, doseq=True, quote_via=quote)

    # -- XA verbs ----------------------------------------------------------
    def commit_prepared(self, conn: Connection, xid: Xid) -> None:
        conn.exec_driver_sql(driver_sql(f"COMMIT PREPARED {string_literal(xid.gid)}"))

    def rollback_prepared(self, conn: Connection, xid: Xid) -> None:
        conn.exec_driver_sql(driver_sql(f"ROLLBACK PREPARED {string_literal(xid.gid)}"))

    def rollback_foreign(self, conn: Connection, gid: str) -> None:
        conn.exec_driver_sql(driver_sql(f"ROLLBACK PREPARED {string_literal(gid)}"))

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
        state = sqlstate_of(exc)
        if state == UNKNOWN_XID_STATE:
            return ErrorKind.UNKNOWN_XID
        if state in TRANSIENT_STATES or (state or "").startswith("08"):
            return ErrorKind.TRANSIENT
        if state is not None and state.startswith(ROWS_CLASSES):
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

    def free_prepared_slots(self, conn: Connection) -> tuple[int, int] | None:
        in_use, limit = pg_health.prepared_capacity(conn)
        return limit - in_use, limit

    def denied(self, exc: BaseException) -> bool:
        return sqlstate_of(exc) == "42501"  # insufficient_privilege

    def deadlocked(self, exc: BaseException) -> bool:
        return sqlstate_of(exc) in ("40P01", "40001")  # deadlock_detected, serialization_failure

    def write_blockers(self, conn: Connection) -> list[str]:
        limit, standby = conn.exec_driver_sql(
            "SELECT current_setting('max_prepared_transactions')::int, pg_is_in_recovery()"
        ).one()
        found = []
        if int(limit) == 0:
            found.append(
                f"PostgreSQL at {self.where()} has max_prepared_transactions = 0, which disables PREPARE TRANSACTION. "
                "Set it to at least the number of partitions you write (e.g. 'ALTER SYSTEM SET "
                "max_prepared_transactions = 64' or postgresql.conf) and restart the server."
            )
        if standby:
            found.append(
                f"PostgreSQL at {self.where()} is a standby (in recovery): it takes no writes. Point the URL at the "
                "primary server."
            )
        return found

    def check_server(self, conn: Connection, branches: int | None) -> None:
        self.warn_durability(conn)
        blockers = self.write_blockers(conn)
        if blockers:
            raise PreflightError(blockers[0])
        if branches:
            limit, in_use = conn.exec_driver_sql(
                "SELECT current_setting('max_prepared_transactions')::int, (SELECT count(*) FROM pg_prepared_xacts)"
            ).one()
            limit, in_use = int(limit), int(in_use)
            if branches > limit - in_use:
                raise PreflightError(
                    f"PostgreSQL at {self.where()} has {limit - in_use} free prepared-transaction slots "
                    f"(max_prepared_transactions = {limit}, {in_use} in use) but this write needs {branches}: "
                    "coalesce to fewer partitions (numPartitions) or raise max_prepared_transactions; "
                    "'xasink recover' finishes what earlier runs left prepared."
                )

    def branch_error(self, exc: BaseException, xid: Xid, plan: TargetPlan) -> BranchError:
        state = sqlstate_of(exc)
        text = redact(str(getattr(exc, "orig", exc)), url_secrets(self.url))
        text = re.sub(r"^[A-Z_]+: \[libpq\] ", "", text.strip())
        text = re.sub(r"Failed to execute query '.*?': (?=ERROR:)", "", text, count=1, flags=re.S)
        text = re.sub(r"^Failed to execute COPY statement: (?:PGRES_[A-Z_]+ )?(?=ERROR:)", "", text, count=1)
        hint = BRANCH_HINTS.get(state or "")
        if plan.upsert_keys and state in ("55P03", "40P01"):
            keys = plan.upsert_keys
            hint = UPSERT_LOCK_HINT.format(keys=", ".join(keys), quoted=", ".join(repr(k) for k in keys))
        if state == "53200" and "prepared transactions" not in text:  # a real out-of-memory
            hint = None
        what = text.splitlines()[0] if text else str(exc)
        # a COPY's CONTEXT names the column and the line (row) of the partition: "COPY t, line 101, column name"
        detail = [ln for ln in text.splitlines()[1:] if ln.startswith(("DETAIL", "HINT", "CONTEXT:  COPY"))]
        if detail:
            what += " (" + "; ".join(d.strip() for d in detail) + ")"
        err = branch_failed(xid, plan, what, hint)
        err.sqlstate = state  # type: ignore[attr-defined]
        return err

    # -- branch ------------------------------------------------------------
    def lock_for_overwrite(self, conn: Connection, schema: str | None, table: str) -> None:
        # SHARE ROW EXCLUSIVE: writers wait for the replace to commit, readers (ACCESS SHARE) never do
        name = conn.dialect.identifier_preparer.format_table(sa.table(table, schema=schema))
        conn.exec_driver_sql(f"LOCK TABLE {name} IN SHARE ROW EXCLUSIVE MODE")

    def lock_apply(self, conn: Connection, name: str) -> None:
        # released with the transaction; a wait past lock_timeout (controlLockTimeout) is 55P03, transient
        conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": advisory_key(name)})

    def check_table(self, conn: Connection, plan: TargetPlan) -> TargetPlan:
        from xasink.dialects.postgres import preflight

        preflight.refuse_generated_values(conn, plan)
        return plan

    def referencing_tables(self, conn: Connection, schema: str | None, table: str) -> list[str]:
        name = ".".join(quote_ident(p) for p in (schema, table) if p)  # a value: its '%' signs single
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
        except sa.exc.DBAPIError as exc:
            savepoint.rollback()
            if sqlstate_of(exc) != LOCK_NOT_AVAILABLE:  # a lost connection (a restart): the caller's to retry
                raise
            conn.execute(sa.delete(shadow).where(batch))
            return
        savepoint.commit()
        # a writer other than the shadow's owner may hold DELETE on it without TRUNCATE (a DBA's grants)
        others = sa.exists(sa.select(sa.literal(1)).select_from(shadow).where(~batch))
        may = sa.func.has_table_privilege(sa.literal(name), sa.literal("TRUNCATE"))
        if conn.execute(sa.select(sa.and_(~others, may))).scalar():
            conn.exec_driver_sql(f"TRUNCATE {name}")
        else:
            conn.execute(sa.delete(shadow).where(batch))

    def create_changes_table(
        self,
        conn: Connection,
        name: str,
        schema: str | None,
        rows: sa.Select[Any],
        keys: list[str],
        sequence: str | None,
    ) -> sa.TableClause:
        # DISTINCT ON sorts once, in memory with a work_mem that holds a batch (the default spills 200k rows to
        # disk); ON COMMIT DROP (a rollback drops it too); the key after the load (one index build); ANALYZE:
        # autovacuum never looks at a temporary table, and the joins need its size and its flag's spread
        table = sa.table(name, *(sa.column(c.name) for c in rows.selected_columns))
        select: sa.Select[Any] = rows
        if sequence is not None:
            src = rows.subquery("xasink_rows_")
            by_key = [src.c[k] for k in keys]
            select = sa.select(*src.c).ext(distinct_on(*by_key)).order_by(*by_key, src.c[sequence].desc())
        prep = conn.dialect.identifier_preparer
        quoted = prep.format_table(table)
        text, params = statement_text(conn, select)
        conn.exec_driver_sql(SORT_MEMORY)
        conn.exec_driver_sql(f"CREATE TEMPORARY TABLE {quoted} ON COMMIT DROP AS {text}", params)
        conn.exec_driver_sql(f"ALTER TABLE {quoted} ADD PRIMARY KEY ({', '.join(prep.quote(k) for k in keys)})")
        conn.exec_driver_sql(f"ANALYZE {quoted}")
        return table

    def upsert_from_select(self, merge: Merge) -> sa.Insert:
        from sqlalchemy.dialects.postgresql import insert

        target, keys, sequence = merge.target, merge.keys, merge.sequence
        stmt = insert(target).from_select(merge.columns, merge.select)
        updates = {c: stmt.excluded[c] for c in merge.columns if c not in keys}
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

    swaps_tables = True

    def swap_table(self, conn: Connection, target: SwapTarget) -> int:
        from xasink.dialects.postgres.swap import swap  # (DDL of an overwrite's swap: the driver's apply only)

        with self.connect() as reader:
            # at most a few seconds' tries for the table's exclusive lock: past them the in-place apply needs none
            return swap(conn, reader, target, min(float(self.settings.control_lock_timeout), 5.0))
