"""The executor's branch: one pymysql connection inside XA START .. XA PREPARE, loading by LOAD DATA LOCAL
(checked: it behaves as IGNORE) or multi-row INSERT, upserting through a staging table (UPDATE by the key, then
a plain INSERT), LOAD DATA REPLACE or ON DUPLICATE KEY UPDATE where the key's index is the only unique one."""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterator
from typing import Any, Protocol

import pyarrow as pa
import pymysql

from xasink.dialects.branch_session import BranchSession
from xasink.dialects.mysql.encoding import check_empty_keys, encode_tsv, is_binary, is_text, python_rows
from xasink.dialects.mysql.errors import PRIVILEGE_CODES, STATEMENT_WARNINGS, with_row_key
from xasink.dialects.mysql.sql import (
    BRANCH_SQL_MODE,
    MAX_LOCK_WAIT,
    VALUE_MODES,
    errno_of,
    quote_ident,
    session_mode,
    set_url_session,
    table_name,
)
from xasink.dialects.mysql.stream import FileLoad, StreamedLoad, open_load
from xasink.dialects.mysql.xa import owner_lock, parse_recover_row, recover_statement, xid_literal
from xasink.dialects.values import SHADOW_TAG_COLUMN, BranchSettings, TargetPlan, branch_tag, check_upsert_keys
from xasink.errors import BranchError
from xasink.protocol.xid import FORMAT_ID, Xid

log = logging.getLogger("xasink.dialects.mysql")
ROW_COUNTER = "@xasink_row_"  # the session's count of the rows a branch loaded into a keyed shadow


class BranchHost(Protocol):
    """What a branch uses of its dialect (:class:`.dialect.MySQLDialect`), which imports this module."""

    settings: BranchSettings
    session: dict[str, str]  # the URL's session variables the branch takes (sql.SESSION_VARIABLES)
    load_data_max_bytes: int
    max_stmt_bytes: int

    def raw_connect(self, local_infile: bool = False) -> pymysql.connections.Connection: ...

    def wait_detached(self, connection_id: int, lock: str) -> None: ...

    def branch_error(self, exc: BaseException, xid: Xid, plan: TargetPlan) -> BranchError: ...

    def load_warning_error(
        self, warnings: list[tuple[Any, ...]], loaded: int, expected: int, xid: Xid, plan: TargetPlan
    ) -> BranchError: ...


class MySQLBranch(BranchSession):
    """A branch: one pymysql connection inside XA START .. XA PREPARE."""

    def __init__(self, dialect: BranchHost, xid: Xid, plan: TargetPlan) -> None:
        super().__init__(xid, plan)
        self.dialect = dialect
        self._xa = xid_literal(xid)
        self.conn = dialect.raw_connect(local_infile=dialect.settings.local_infile)
        self.cursor = self.conn.cursor()
        self.is_mariadb = "mariadb" in self.conn.get_server_info().lower()
        self.tag = branch_tag(xid.bqual)  # a keyed shadow's (batch, tag, row) key: this branch's tag
        try:
            set_url_session(self.cursor, dialect.session)
            # the owner lock names this session as the branch's owner until it has disconnected (see owner_lock)
            self.cursor.execute(
                "SELECT CONNECTION_ID(), @@local_infile, @@max_allowed_packet, GET_LOCK(%s, 0), @@log_bin, "
                "@@binlog_format, @@SESSION.sql_mode",
                (owner_lock(xid),),
            )
            row = self.cursor.fetchone()
            assert row is not None
            self.connection_id, server_infile, max_packet = int(row[0]), int(row[1] or 0), int(row[2])
            # InnoDB refuses to log a READ COMMITTED write as a statement
            statement_log = int(row[4] or 0) == 1 and str(row[5]).upper() == "STATEMENT"
            # the server's modes this session keeps (VALUE_MODES), as JDBC's does; two need LOAD DATA's help
            self.modes = frozenset(VALUE_MODES) & set(str(row[6] or "").upper().split(","))
            lock_wait = int(dialect.settings.lock_timeout) or MAX_LOCK_WAIT
            zone = "@@SESSION" if "time_zone" in dialect.session else "@@GLOBAL"  # the URL's zone, else the server's
            self.cursor.execute(
                # the server's own time zone, as Spark's JDBC writer's session has: a TIMESTAMP column reads
                # the wall time it is sent (the session zone's, as JDBC sends it) in that zone.  A streamed
                # LOAD DATA stays open while the task computes its next batch (see .stream): the server may
                # wait on it as long as on an idle session between statements (wait_timeout, not
                # net_read_timeout's 30 s), and MariaDB's max_statement_time must not cut it
                f"SET SESSION sql_mode = {session_mode(VALUE_MODES)}, time_zone = {zone}.time_zone, "
                "innodb_lock_wait_timeout = %s, "
                "net_read_timeout = GREATEST(@@SESSION.net_read_timeout, @@SESSION.wait_timeout), "
                f"{'max_statement_time = 0, ' if self.is_mariadb else ''}"
                f"{ROW_COUNTER} = 0",  # (a shadow's rows are numbered by it: see load_data_sql)
                (BRANCH_SQL_MODE, lock_wait),
            )
        except Exception as exc:
            self._close()
            raise dialect.branch_error(exc, xid, plan) from None
        self.use_load_data = dialect.settings.local_infile and server_infile == 1
        # upsert by LOAD DATA into a session-private staging table, then merged: MariaDB allows a temporary
        # table inside an XA branch until XA END (tested); MySQL 8 refuses it in some configurations (GTID
        # consistency), so there the upsert stays on the multi-row INSERT path (and preflight refuses a table
        # whose upsert needs the staging table, see preflight.upsert_plan)
        if plan.upsert_keys:
            self.use_load_data = self.use_load_data and self.is_mariadb
        self.staged = bool(plan.upsert_keys) and (
            plan.upsert_by_update or (self.use_load_data and not plan.upsert_by_replace)
        )
        try:
            if self.staged and not statement_log:
                # the merge reads the target by the key: under READ COMMITTED those lookups take no gap locks,
                # so partitions inserting new keys into one gap (ids past the end) never block each other (with
                # a statement binary log they may, until lockTimeout: the error says to repartition)
                self.cursor.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
            self.cursor.execute(f"XA START {self._xa}")
        except Exception as exc:
            self._close()
            raise dialect.branch_error(exc, xid, plan) from None
        self.cursor.max_stmt_length = max(1 << 20, min(max_packet - 4096, dialect.max_stmt_bytes))

    # -- loading --------------------------------------------------------------------------
    def load(self, batches: Iterator[pa.RecordBatch]) -> int:
        if "EMPTY_STRING_IS_NULL" in self.modes and (self.plan.upsert_keys or self.plan.required):
            batches = self._keys_not_empty(batches)
        try:
            if self.use_load_data and self.plan.upsert_by_replace:
                return self._load_data(self._checked_keys(batches), table_name(self.plan), replace=True)
            if self.staged:
                return self._staged_upsert(batches)
            if self.use_load_data:
                return self._load_data(batches, table_name(self.plan))
            return self._insert(batches)
        except BranchError:
            raise
        except Exception as exc:
            raise self.dialect.branch_error(exc, self.xid, self.plan) from None

    def _keys_not_empty(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            check_empty_keys(batch, self.plan, self.xid.partition)
            yield batch

    def load_data_sql(self, path: str, into: str, replace: bool = False) -> str:
        fields: list[tuple[str, str | None]] = []  # (column, what its field is loaded through, if not as it is)
        sets: list[str] = []
        casts = dict(self.plan.server_casts)
        for i, field in enumerate(self.plan.arrow_schema):
            t, name = field.type, quote_ident(field.name)
            if is_binary(t):
                fields.append((name, f"UNHEX({self._field(i, t)})"))
            elif field.name in casts:  # (a type name of the dialect's own server_cast, never the user's text)
                fields.append((name, f"CAST({self._field(i, t)} AS {casts[field.name]})"))
            elif "EMPTY_STRING_IS_NULL" in self.modes and is_text(t):
                fields.append((name, self._field(i, t)))
            else:
                fields.append((name, None))
        if self.plan.row_column:  # a keyed shadow: the branch's tag, its rows numbered in load order
            sets.append(f"{quote_ident(SHADOW_TAG_COLUMN)} = {self.tag}")
            sets.append(f"{quote_ident(self.plan.row_column)} = ({ROW_COUNTER} := {ROW_COUNTER} + 1)")
        # MariaDB drops NO_AUTO_VALUE_ON_ZERO for a column loaded as a field when the statement has a SET
        # clause (a 0 then takes a generated value), but keeps it for a column SET from a variable
        every = "NO_AUTO_VALUE_ON_ZERO" in self.modes and (sets or any(e is not None for _, e in fields))
        cols, assigned = [], []
        for i, (name, expr) in enumerate(fields):
            if expr is None and not every:
                cols.append(name)
            else:
                cols.append(f"@xasink_v{i}")
                assigned.append(f"{name} = {expr or f'@xasink_v{i}'}")
        sets = assigned + sets
        stmt = (
            f"LOAD DATA LOCAL INFILE {self.conn.escape(path)}{' REPLACE' if replace else ''} INTO TABLE {into} "
            "CHARACTER SET utf8mb4 "
            "FIELDS TERMINATED BY '\\t' ESCAPED BY '\\\\' LINES TERMINATED BY '\\n' "
            f"({', '.join(cols)})"
        )
        return stmt + (f" SET {', '.join(sets)}" if sets else "")

    def _field(self, i: int, t: pa.DataType) -> str:
        """A loaded field's variable; NULL for an empty string or binary (its hex: empty too) under the
        server's EMPTY_STRING_IS_NULL, which makes NULL of a '' in a statement (JDBC's ``''`` and ``_binary''``)
        but not of a LOAD DATA field (and of this statement's own '': no such literal here)."""
        if "EMPTY_STRING_IS_NULL" in self.modes and (is_text(t) or is_binary(t)):
            return f"IF(LENGTH(@xasink_v{i}) = 0, NULL, @xasink_v{i})"
        return f"@xasink_v{i}"

    def _staged_upsert(self, batches: Iterator[pa.RecordBatch]) -> int:
        """Load into a staging table, then UPDATE the rows whose key matches and INSERT the others.

        The merge touches only rows whose key matches (the key columns' own equality, which their unique
        index holds unique), as PostgreSQL's ON CONFLICT on the key does: the INSERT is a plain one, so a
        row that collides with another row on any other unique index fails the batch with a duplicate-key
        error naming that index.  (ON DUPLICATE KEY UPDATE and REPLACE would act on whichever index
        conflicts first: another key's row.)

        The staging table has the target's column types and a unique key on the upsert key: loading it
        with REPLACE keeps the partition's last row of each key.  It is dropped before XA END: MariaDB
        refuses DDL on temporary tables once a branch is prepared.  LOAD DATA costs far less client CPU
        than escaping every value for a multi-row INSERT (used when LOAD DATA is off).
        """
        names = self.plan.arrow_schema.names
        keys = self.plan.upsert_keys
        cols = ", ".join(quote_ident(n) for n in names)
        stage_name = "xasink_stage"
        while stage_name == self.plan.table.lower():  # a temporary table would shadow the target
            stage_name += "_"
        stage = ".".join(quote_ident(p) for p in (self.plan.schema, stage_name) if p)  # beside the target
        target = table_name(self.plan)
        defined = [f"UNIQUE KEY ({', '.join(quote_ident(k) for k in keys)})"]
        if self.plan.numbered is not None:  # NULL-able here: the INSERT into the target numbers its NULLs
            name, type_ = self.plan.numbered
            defined.insert(0, f"{quote_ident(name)} {type_} NULL")
        self.cursor.execute(
            f"CREATE TEMPORARY TABLE {stage} ({', '.join(defined)}) ENGINE=InnoDB SELECT {cols} FROM {target} LIMIT 0"
        )
        if self.use_load_data:
            total = self._load_data(self._checked_keys(batches), stage, replace=True)
        else:
            total = self._insert(batches, self.insert_sql(into=stage, verb="REPLACE"))
        # the stage drives and the key's index finds the target's rows: only rows whose key matches are read
        # and locked, whatever the optimizer would guess from the tables' sizes
        index = f" FORCE INDEX ({quote_ident(self.plan.upsert_index)})" if self.plan.upsert_index else ""
        on = " AND ".join(f"t.{quote_ident(k)} = s.{quote_ident(k)}" for k in keys)
        others = [n for n in names if n not in keys]
        joined = f"{stage} s STRAIGHT_JOIN {target} t{index} ON {on}"
        changed = 0
        if others:
            sets = ", ".join(f"t.{quote_ident(n)} = s.{quote_ident(n)}" for n in others)
            self.cursor.execute(f"UPDATE {joined} SET {sets}")
            changed += max(self.cursor.rowcount, 0)  # rows changed (pymysql does not ask for rows found)
        self.cursor.execute(
            f"INSERT INTO {target} ({cols}) SELECT {', '.join(f's.{quote_ident(n)}' for n in names)} FROM {stage} s "
            f"WHERE NOT EXISTS (SELECT 1 FROM {target} t{index} WHERE {on})"
        )
        changed += max(self.cursor.rowcount, 0)
        if not changed:
            # every row was in the table as it is: InnoDB may then count the branch as read-only, and XA COMMIT
            # answers XA_RBROLLBACK.  Inserting a copy of a matched row (its key conflicts, IGNORE drops it)
            # makes it a writer without changing a row (ON DUPLICATE KEY UPDATE always attempted an insert too)
            self.cursor.execute(
                f"INSERT IGNORE INTO {target} ({cols}) SELECT {', '.join(f't.{quote_ident(n)}' for n in names)} "
                f"FROM {joined} LIMIT 1"
            )
        self.cursor.execute(f"DROP TEMPORARY TABLE {stage}")
        return total

    def _checked_keys(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """The batches, each checked for NULL upsert keys before it is loaded."""
        keys = [self.plan.arrow_schema.get_field_index(k) for k in self.plan.upsert_keys]
        for batch in batches:
            check_upsert_keys(batch, self.plan, keys, self.xid.partition)
            yield batch

    def _updates(self) -> str:
        """The ON DUPLICATE KEY UPDATE list: every non-key column takes the new row's value."""
        names = self.plan.arrow_schema.names
        others = [n for n in names if n not in self.plan.upsert_keys] or list(self.plan.upsert_keys[:1])
        return ", ".join(f"{quote_ident(n)} = VALUES({quote_ident(n)})" for n in others)

    def _load_data(self, batches: Iterator[pa.RecordBatch], into: str, replace: bool = False) -> int:
        """Batches streamed into LOAD DATA statements of up to ``load_data_max_bytes`` each (see .stream)."""
        total = 0
        load: StreamedLoad | FileLoad | None = None
        keys = list(self.plan.upsert_keys) or self.plan.arrow_schema.names[:1]
        sent: list[pa.RecordBatch] = []  # the key columns of the statement's rows: an error names a row's key
        try:
            for batch in batches:
                data = encode_tsv(batch)
                if load is None:
                    load = open_load(functools.partial(self._execute_load, into=into, replace=replace))
                load.write(data, batch.num_rows)
                sent.append(batch.select(keys))  # zero-copy: only the key columns' buffers stay referenced
                if load.bytes >= self.dialect.load_data_max_bytes:
                    total += self._finish_load(load, replace, sent)
                    load, sent = None, []
            if load is not None:
                total += self._finish_load(load, replace, sent)
                load = None
        finally:
            if load is not None:  # an error while encoding: the branch is rolled back, the statement must end
                load.abandon()
        return total

    def _execute_load(self, path: str, into: str, replace: bool) -> tuple[int, int]:
        """Run in the load's own thread: rows loaded and the warning count."""
        try:
            self.cursor.execute(self.load_data_sql(path, into, replace))
        except AttributeError:
            if self.conn.open:
                raise
            # a connection lost mid-stream: pymysql then writes its end-of-data packet to the socket it has
            # just dropped ('NoneType' has no attribute 'sendall'), hiding why the branch failed
            raise pymysql.err.OperationalError(2013, "Lost connection to server during LOAD DATA") from None
        return self.cursor.rowcount, self.cursor.warning_count

    def _finish_load(self, load: StreamedLoad | FileLoad, replace: bool, sent: list[pa.RecordBatch]) -> int:
        expected = load.rows
        loaded, warning_count = load.finish()
        # a REPLACE counts a replaced row twice; strict mode makes a row it cannot store an error, not a skip
        stored_all = expected <= loaded <= 2 * expected if replace else loaded == expected
        if warning_count or not stored_all:
            self.cursor.execute("SHOW WARNINGS LIMIT 5")
            warnings = [
                w for w in self.cursor.fetchall() if str(w[0]).lower() != "note" and w[1] not in STATEMENT_WARNINGS
            ]
            if warnings or not stored_all:
                error = self.dialect.load_warning_error(warnings, loaded, expected, self.xid, self.plan)
                raise with_row_key(error, sent)
        return expected

    def insert_sql(self, into: str | None = None, verb: str = "INSERT") -> str:
        """The multi-row statement into the target (an upsert: ON DUPLICATE KEY UPDATE), or ``verb`` into ``into``."""
        names = self.plan.arrow_schema.names + (
            [SHADOW_TAG_COLUMN, self.plan.row_column] if self.plan.row_column else []
        )
        cols = ", ".join(quote_ident(n) for n in names).replace("%", "%%")
        table = (into or table_name(self.plan)).replace("%", "%%")
        stmt = f"{verb} INTO {table} ({cols}) VALUES ({', '.join(['%s'] * len(names))})"
        if self.plan.upsert_keys and into is None:
            stmt += f" ON DUPLICATE KEY UPDATE {self._updates().replace('%', '%%')}"
        return stmt

    def _insert(self, batches: Iterator[pa.RecordBatch], stmt: str | None = None) -> int:
        """Multi-row INSERT: pymysql's executemany packs rows into statements of up to max_stmt_length bytes."""
        stmt = stmt or self.insert_sql()
        keys = [self.plan.arrow_schema.get_field_index(k) for k in self.plan.upsert_keys]
        step = self.dialect.settings.batch_size
        total = 0
        for batch in batches:
            if keys:
                check_upsert_keys(batch, self.plan, keys, self.xid.partition)
            for start in range(0, batch.num_rows, step):
                chunk = batch.slice(start, step)
                rows = python_rows(chunk, "EMPTY_STRING_IS_NULL" in self.modes)
                if self.plan.row_column:  # a keyed shadow: numbered as LOAD DATA numbers them
                    rows = [(*r, self.tag, total + i + 1) for i, r in enumerate(rows)]
                self.cursor.executemany(stmt, rows)
                total += chunk.num_rows
        return total

    # -- prepare / roll back ----------------------------------------------------------------
    def hold_prepare_lock(self, names: list[str]) -> None:
        # GET_LOCK is exclusive: any free slot will do; only when all are taken, wait for the partition's own
        wait_s = int(self.dialect.settings.lock_timeout) or MAX_LOCK_WAIT
        try:
            for name, timeout in [(n, 0) for n in names] + [(names[0], wait_s)]:
                self.cursor.execute("SELECT GET_LOCK(%s, %s)", (name, timeout))
                row = self.cursor.fetchone()
                if row and row[0] == 1:
                    return
        except Exception as exc:
            raise self.dialect.branch_error(exc, self.xid, self.plan) from None
        raise BranchError(
            f"branch {self.xid}: every slot of its run's prepare lock stayed taken for {wait_s} s (lockTimeout); "
            "nothing of this attempt was prepared"
        )

    def prepare(self) -> None:
        try:
            self.cursor.execute(f"XA END {self._xa}")
            self.cursor.execute(f"XA PREPARE {self._xa}")
            listed = self._listed()
        except Exception as exc:
            self.rollback()
            raise self.dialect.branch_error(exc, self.xid, self.plan) from None
        self._close()
        if listed is False:
            raise BranchError(f"branch {self.xid} was not prepared (the server rolled it back); nothing of it remains")
        self.dialect.wait_detached(self.connection_id, owner_lock(self.xid))

    def _listed(self) -> bool | None:
        """Whether XA RECOVER lists the branch; None when this user may not run XA RECOVER (MySQL 8)."""
        stmt, hex_data = recover_statement(self.is_mariadb)
        try:
            self.cursor.execute(stmt)
        except pymysql.err.MySQLError as exc:
            if errno_of(exc) in PRIVILEGE_CODES:
                return None
            raise
        want = (FORMAT_ID, self.xid.gtrid.encode(), self.xid.bqual.encode())
        return any(parse_recover_row(r, hex_data) == want for r in self.cursor.fetchall())

    def rollback(self) -> None:
        for stmt in (f"XA END {self._xa}", f"XA ROLLBACK {self._xa}"):
            try:
                self.cursor.execute(stmt)
            except Exception as exc:  # noqa: BLE001 - disconnecting rolls an unprepared branch back anyway
                log.debug("%s of %s: %s", stmt.split(" X'")[0], self.xid, exc)
        self._close()

    def _close(self) -> None:
        try:
            self.conn.close()
        except Exception:  # noqa: BLE001,S110 - closing a dead connection
            pass
