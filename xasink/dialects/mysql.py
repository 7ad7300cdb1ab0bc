"""MySQL 8 / MariaDB 10.5+: XA START..PREPARE on pymysql, LOAD DATA LOCAL or multi-row INSERT, XA RECOVER.

A branch is one pymysql connection: ``XA START``, rows, ``XA END``, ``XA PREPARE``, disconnect.  The
driver finishes branches with ``XA COMMIT`` / ``XA ROLLBACK`` over SQLAlchemy (``mysql+pymysql``).

Two server facts shape the branch side:

* A prepared branch can be finished by another session only after its owner disconnected.  Before that,
  ``XA COMMIT`` answers XAER_NOTA as if the xid did not exist, and on MariaDB 10.11 an ``XA COMMIT`` that
  races with the owner's disconnect can even answer OK while the transaction stays prepared, unlisted and
  holding its locks until the server restarts (measured: about 1 in 500 immediate commits).  So the
  branch does not report its xid until the server has finished the disconnect: its session is gone from
  ``information_schema.PROCESSLIST`` (a user always sees their own sessions); the server detaches the
  transaction before it removes the session from that list.
* ``LOAD DATA LOCAL`` behaves as ``LOAD DATA ... IGNORE``: duplicates and bad values become warnings and
  rows are skipped or altered, whatever ``sql_mode`` says.  Every LOAD is therefore checked: the affected
  row count must equal the rows sent and no warning may be raised, else the branch fails.

Rows travel as tab-separated text (``\\N`` for NULL; backslash, tab, newline, CR and NUL escaped with a
backslash), binary columns as hex through ``UNHEX()``; strings, NULLs and bytes round-trip exactly.
Timestamps with a time zone are written as UTC wall time (the branch session runs with time_zone
'+00:00', so TIMESTAMP columns get the right instant).  Enabling ``local_infile`` lets the server ask
the client for a file: branch connections only enable it when the option ``localInfile`` allows it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import re
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pymysql
import sqlalchemy as sa
from sqlalchemy.dialects import mysql
from sqlalchemy.dialects.mysql import pymysql as sa_pymysql
from sqlalchemy.engine import Connection

from ..errors import BranchError, PreflightError, XasinkError
from ..masking import redact, url_secrets
from ..xid import FORMAT_ID, Xid
from .base import (
    BranchSession,
    Dialect,
    DurabilityRisk,
    ErrorKind,
    PreparedTxn,
    TargetPlan,
    branch_failed,
    check_upsert_keys,
    set_keepalive,
)

log = logging.getLogger(__name__)


def _share_preferred_tls_context() -> None:
    """One TLS context per process for pymysql's PREFERRED mode (no ssl options given), not one per connection.

    pymysql >= 1.2 builds ``ssl.create_default_context()`` for every such connection, which loads the
    system CA bundle (~25 ms here) only to set CERT_NONE; a batch opens several connections per branch
    and on the driver, so this was most of a small batch's time (benchmarks: profile of MariaDB writes).
    The context is identical every time, so sharing it changes nothing but the cost.
    """
    original = getattr(pymysql.connections.Connection, "_create_ssl_ctx", None)
    if original is None or getattr(original, "xasink_shared", False):
        return
    shared: list[Any] = []

    def create_ssl_ctx(self: Any, sslp: Any) -> Any:
        if isinstance(sslp, dict) and not sslp:
            if not shared:
                shared.append(original(self, sslp))
            return shared[0]
        return original(self, sslp)

    create_ssl_ctx.xasink_shared = True  # type: ignore[attr-defined]
    pymysql.connections.Connection._create_ssl_ctx = create_ssl_ctx  # type: ignore[method-assign]


_share_preferred_tls_context()

_SA_DIALECT = sa_pymysql.dialect()
_PREPARER = _SA_DIALECT.identifier_preparer

# the branch session's sql_mode: bad values fail instead of being truncated; 0 stays 0 in AUTO_INCREMENT
# columns; and no ANSI_QUOTES / NO_BACKSLASH_ESCAPES, which would change how our statements parse
BRANCH_SQL_MODE = "STRICT_ALL_TABLES,NO_ENGINE_SUBSTITUTION,NO_AUTO_VALUE_ON_ZERO"
_MAX_LOCK_WAIT = 1_073_741_824  # innodb_lock_wait_timeout's maximum: "no limit"
DETACH_TIMEOUT_S = 30.0
OWNER_WAIT_S = 5.0  # longest wait for a branch's owner to finish disconnecting before XA COMMIT / ROLLBACK

# Sessions still disconnecting while InnoDB holds their transaction attached: the branch's owner (named by its
# owner lock), whether it is still listed or already gone from PROCESSLIST, and any transaction of a session
# that is gone or being killed or quitting (an owner past releasing its locks but not yet detached).
_DISCONNECTING_SQL = (
    "SELECT ID FROM information_schema.PROCESSLIST WHERE ID = IS_USED_LOCK(%(lock)s) UNION "
    "SELECT t.trx_mysql_thread_id FROM information_schema.INNODB_TRX t WHERE t.trx_mysql_thread_id <> 0 "
    "AND t.trx_state <> 'ROLLING BACK' AND (t.trx_mysql_thread_id = IS_USED_LOCK(%(lock)s) OR NOT EXISTS "
    "(SELECT 1 FROM information_schema.PROCESSLIST p WHERE p.ID = t.trx_mysql_thread_id "
    "AND p.COMMAND NOT IN ('Killed', 'Quit')))"
)
_DISCONNECTING_SQL_NO_TRX = (  # without the PROCESS privilege (INNODB_TRX is not readable)
    "SELECT ID FROM information_schema.PROCESSLIST WHERE ID = IS_USED_LOCK(%(lock)s)"
)

ER_XAER_NOTA = 1397
_TRANSIENT_CODES = {
    1399,  # XAER_RMFAIL: the control session is in the wrong XA state; a fresh connection fixes it
    1400,  # XAER_OUTSIDE
    1440,  # XAER_DUPID
    1613,  # XA_RBTIMEOUT
    1614,  # XA_RBDEADLOCK
    1205,  # lock wait timeout
    1213,  # deadlock
    1040,  # too many connections
    1053,  # server shutdown in progress
    1927,  # MariaDB: connection killed
    2002,  # cannot connect (socket)
    2003,  # cannot connect (TCP)
    2006,  # server has gone away
    2013,  # lost connection during query
    2055,  # lost connection (SSL)
    4031,  # MySQL: disconnected by the server (idle timeout)
}
_PRIVILEGE_CODES = {1227, 1044, 1142}

# error (or LOAD DATA warning) codes a branch can fail with, and what the user should do about them
_BRANCH_HINTS = {
    1062: "duplicate key: the rows collide with rows already in the table (or in this batch); "
    "deduplicate the DataFrame or use upsertKeyColumns",
    1048: "NULL in a NOT NULL column: fill or filter the NULLs first",
    1263: "NULL in a NOT NULL column: fill or filter the NULLs first",
    1364: "a NOT NULL column without a default is missing from the DataFrame: add the column",
    1406: "a string or binary value is longer than its column allows: widen the column or truncate the data",
    1264: "a number is out of range for its column: widen the column type",
    1366: "a value does not fit the column's type: cast it in Spark first",
    1265: "a value does not fit its column (a string longer than its column allows, or a number with too many "
    "digits): widen the column type or fix the data",
    1292: "a date or time value is out of the column's range (MySQL DATETIME: years 1000-9999)",
    1146: "the table does not exist (dropped or renamed after the write was planned)",
    1045: "access denied: check the 'user' and 'password' options",
    1142: "permission denied: grant INSERT (and UPDATE for upserts) on the table to the writing user",
    1452: "foreign key violation: load the referenced rows first",
    3819: "check constraint violation",
    4025: "check constraint violation",
    1148: "LOAD DATA LOCAL is disabled: set the option localInfile=false, or enable local_infile on the server",
    3948: "LOAD DATA LOCAL is disabled: set the option localInfile=false, or SET GLOBAL local_infile = 1",
    1153: "a row is larger than the server's max_allowed_packet: raise max_allowed_packet",
    1205: "a row lock was not granted within lockTimeout: another transaction holds the same keys, most often "
    "another partition of this batch (duplicate keys across partitions) or a prepared branch left behind "
    "(run 'xasink recover'); deduplicate the DataFrame on the table's keys",
    1213: "deadlock with another transaction on the same rows",
    1440: "a branch with this xid exists already: the same task attempt ran twice",
}
_UPSERT_LOCK_HINT = (
    "another partition of this batch (or another transaction) holds rows with the same upsert keys ({keys}): a "
    "prepared branch keeps them locked until the batch commits, so rows with equal keys must all be in one "
    "partition. Repartition the DataFrame by the key columns first (xasink.write() does this itself)"
)


class BranchBusyError(XasinkError):
    """A prepared branch is still attached to its owner's session; finishing it must wait (transient)."""


def _ident(name: str) -> str:
    return str(_PREPARER.quote_identifier(name))


def _table(plan: TargetPlan) -> str:
    return ".".join(_ident(p) for p in (plan.schema, plan.table) if p)


def _errno(exc: BaseException) -> int | None:
    orig = getattr(exc, "orig", exc)
    args = getattr(orig, "args", ())
    if args and isinstance(args[0], int) and not isinstance(args[0], bool):
        return int(args[0])
    return None


def xa_literal(format_id: int, gtrid: bytes, bqual: bytes) -> str:
    """The xid as XA verbs take it: hex literals, so no byte of it needs quoting."""
    return f"X'{gtrid.hex()}',X'{bqual.hex()}',{int(format_id)}"


def xid_literal(xid: Xid) -> str:
    return xa_literal(FORMAT_ID, xid.gtrid.encode("ascii"), xid.bqual.encode("ascii"))


def owner_lock(xid: Xid) -> str:
    """The user lock a branch's session holds while it owns the branch: ``IS_USED_LOCK`` names that session.

    A lock name is at most 64 characters, so the gid is hashed; the lock is released only when the session
    ends, so whoever finishes the branch can wait for exactly that session's disconnect.
    """
    return "xasink-owner:" + hashlib.blake2b(xid.gid.encode(), digest_size=16).hexdigest()


def foreign_gid(format_id: int, gtrid: bytes, bqual: bytes) -> str:
    """How a transaction that is not ours is named in listings: ``xa:<formatID>:<gtrid hex>:<bqual hex>``."""
    return f"xa:{format_id}:{gtrid.hex()}:{bqual.hex()}"


def parse_foreign_gid(gid: str) -> tuple[int, bytes, bytes] | None:
    m = re.fullmatch(r"xa:(-?\d+):((?:[0-9a-f]{2})*):((?:[0-9a-f]{2})*)", gid)
    if m is None:
        return None
    return int(m[1]), bytes.fromhex(m[2]), bytes.fromhex(m[3])


def parse_recover_row(row: Sequence[Any], hex_data: bool) -> tuple[int, bytes, bytes] | None:
    """(formatID, gtrid, bqual) from an XA RECOVER row; ``hex_data`` for ``XA RECOVER CONVERT XID``."""
    try:
        format_id, glen, blen, data = int(row[0]), int(row[1]), int(row[2]), row[3]
        if isinstance(data, str):
            raw = bytes.fromhex(data[2:]) if hex_data and data[:2].lower() == "0x" else data.encode("utf-8")
        else:
            raw = bytes(data)
    except (ValueError, TypeError, IndexError):
        return None
    if glen < 0 or blen < 0 or len(raw) != glen + blen:
        return None
    return format_id, raw[:glen], raw[glen:]


def recover_statement(is_mariadb: bool) -> tuple[str, bool]:
    """MySQL 8 can return the xid as hex (CONVERT XID); MariaDB returns raw bytes with their lengths."""
    return ("XA RECOVER", False) if is_mariadb else ("XA RECOVER CONVERT XID", True)


# --------------------------------------------------------------------------- row encoding

_HEX = np.frombuffer(b"".join(f"{i:02X}".encode() for i in range(256)), dtype=np.uint8).reshape(256, 2)
_NULL = "\\N"
_ESCAPES = (("\\", "\\\\"), ("\t", "\\t"), ("\n", "\\n"), ("\r", "\\r"), ("\x00", "\\0"))


def _offsets(arr: pa.Array) -> np.ndarray:
    return np.frombuffer(arr.buffers()[1], dtype=np.int64)[arr.offset : arr.offset + len(arr) + 1]


def hex_column(arr: pa.Array) -> pa.Array:
    """Upper-case hex of every value (large_string, no nulls: NULL becomes ``\\N``)."""
    arr = arr.cast(pa.large_binary())
    if len(arr) == 0:
        return pa.array([], pa.large_string())
    offsets = _offsets(arr)
    data_buf = arr.buffers()[2]
    data = np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    hexed = _HEX[data[offsets[0] : offsets[-1]]].ravel()
    new_offsets = (offsets - offsets[0]) * 2
    out = pa.Array.from_buffers(pa.large_string(), len(arr), [None, pa.py_buffer(new_offsets), pa.py_buffer(hexed)])
    if arr.null_count:
        out = pc.if_else(arr.is_valid(), out, pa.scalar(_NULL, pa.large_string()))
    return out


def _check_finite(arr: pa.Array, name: str) -> None:
    if pa.types.is_floating(arr.type) and len(arr):
        bad = pc.sum(pc.or_(pc.is_nan(arr), pc.is_inf(arr))).as_py()
        if bad:
            raise BranchError(
                f"column '{name}' holds {bad} NaN or infinite value(s), which MySQL cannot store: "
                "replace them (e.g. with NULL) first. Nothing of this batch is visible."
            )


def text_column(arr: pa.Array) -> pa.Array:
    """One column as LOAD DATA text (large_string, no nulls); binary columns go through :func:`hex_column`."""
    t = arr.type
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return hex_column(arr)
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        out = arr.cast(pa.large_string())
        for old, new in _ESCAPES:
            out = pc.replace_substring(out, old, new)
    elif pa.types.is_boolean(t):
        out = arr.cast(pa.int8()).cast(pa.large_string())
    elif pa.types.is_timestamp(t):
        out = arr.cast(pa.timestamp(t.unit)).cast(pa.large_string())  # tz-aware: its UTC wall time
    elif pa.types.is_float32(t):
        # the server parses a number as a double: the shortest float32 text can lie beyond the float32
        # range ("3.4028235e+38" > FLT_MAX, refused as out of range); the exact double of the value cannot
        out = arr.cast(pa.float64()).cast(pa.large_string())
    else:
        out = arr.cast(pa.large_string())
    return out.fill_null(_NULL) if out.null_count else out


def encode_tsv(batch: pa.RecordBatch) -> pa.Buffer:
    """The batch as LOAD DATA input: fields by tab, lines by newline, escaped by backslash."""
    for name, col in zip(batch.schema.names, batch.columns, strict=True):
        _check_finite(col, name)
    cols = [text_column(c) for c in batch.columns]
    tab, newline, empty = (pa.scalar(x, pa.large_string()) for x in ("\t", "\n", ""))
    line = pc.binary_join_element_wise(*cols, tab) if len(cols) > 1 else cols[0]
    line = pc.binary_join_element_wise(line, empty, newline)  # line + "\n" + ""
    if isinstance(line, pa.ChunkedArray):
        line = line.combine_chunks()
    offsets = _offsets(line)
    return line.buffers()[2].slice(int(offsets[0]), int(offsets[-1] - offsets[0]))


def python_rows(batch: pa.RecordBatch) -> list[tuple[Any, ...]]:
    """The batch as Python tuples for pymysql's multi-row INSERT (tz-aware timestamps as UTC wall time)."""
    columns = []
    for name, col in zip(batch.schema.names, batch.columns, strict=True):
        _check_finite(col, name)
        if pa.types.is_timestamp(col.type) and col.type.tz is not None:
            col = col.cast(pa.timestamp(col.type.unit))
        columns.append(col.to_pylist())
    return list(zip(*columns, strict=True))


# --------------------------------------------------------------------------- the branch


class MySQLBranch(BranchSession):
    """A branch: one pymysql connection inside XA START .. XA PREPARE."""

    def __init__(self, dialect: MySQLDialect, xid: Xid, plan: TargetPlan) -> None:
        super().__init__(xid)
        self.dialect = dialect
        self.plan = plan
        self._xa = xid_literal(xid)
        self.conn = dialect.raw_connect(local_infile=dialect.settings.local_infile)
        self.cursor = self.conn.cursor()
        self.is_mariadb = "mariadb" in self.conn.get_server_info().lower()
        try:
            # the owner lock names this session as the branch's owner until it has disconnected (see owner_lock)
            self.cursor.execute(
                "SELECT CONNECTION_ID(), @@local_infile, @@max_allowed_packet, GET_LOCK(%s, 0)", (owner_lock(xid),)
            )
            row = self.cursor.fetchone()
            assert row is not None
            self.connection_id, server_infile, max_packet = int(row[0]), int(row[1] or 0), int(row[2])
            lock_wait = int(dialect.settings.lock_timeout) or _MAX_LOCK_WAIT
            self.cursor.execute(
                "SET SESSION sql_mode = %s, time_zone = '+00:00', innodb_lock_wait_timeout = %s",
                (BRANCH_SQL_MODE, lock_wait),
            )
            self.cursor.execute(f"XA START {self._xa}")
        except Exception as exc:
            self._close()
            raise dialect.branch_error(exc, xid, plan) from None
        self.use_load_data = dialect.settings.local_infile and server_infile == 1
        # upsert by LOAD DATA into a session-private staging table, merged in one INSERT .. SELECT: MariaDB
        # allows a temporary table inside an XA branch until XA END (tested); MySQL 8 refuses it in some
        # configurations (GTID consistency), so there the upsert stays on the multi-row INSERT path
        if plan.upsert_keys:
            self.use_load_data = self.use_load_data and self.is_mariadb
        self.cursor.max_stmt_length = max(1 << 20, min(max_packet - 4096, dialect.max_stmt_bytes))

    # -- loading --------------------------------------------------------------------------
    def load(self, batches: Iterator[pa.RecordBatch]) -> int:
        try:
            if self.use_load_data and self.plan.upsert_by_replace:
                return self._load_data(self._checked_keys(batches), _table(self.plan), replace=True)
            if self.use_load_data and self.plan.upsert_keys:
                return self._staged_upsert(batches)
            if self.use_load_data:
                return self._load_data(batches, _table(self.plan))
            return self._insert(batches)
        except BranchError:
            raise
        except Exception as exc:
            raise self.dialect.branch_error(exc, self.xid, self.plan) from None

    def load_data_sql(self, path: str, into: str, replace: bool = False) -> str:
        cols, sets = [], []
        for i, field in enumerate(self.plan.arrow_schema):
            t = field.type
            if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
                cols.append(f"@xasink_v{i}")
                sets.append(f"{_ident(field.name)} = UNHEX(@xasink_v{i})")
            else:
                cols.append(_ident(field.name))
        stmt = (
            f"LOAD DATA LOCAL INFILE {self.conn.escape(path)}{' REPLACE' if replace else ''} INTO TABLE {into} "
            "CHARACTER SET utf8mb4 "
            "FIELDS TERMINATED BY '\\t' ESCAPED BY '\\\\' LINES TERMINATED BY '\\n' "
            f"({', '.join(cols)})"
        )
        return stmt + (f" SET {', '.join(sets)}" if sets else "")

    def _staged_upsert(self, batches: Iterator[pa.RecordBatch]) -> int:
        """LOAD DATA into a staging table, then one INSERT .. SELECT .. ON DUPLICATE KEY UPDATE in load order.

        Far less client CPU than escaping every value for a multi-row INSERT.  The staging table has the
        target's column types but no keys (duplicate keys within the partition reach the merge, where the
        last row wins by the load ordinal) and is dropped before XA END: MariaDB refuses DDL on temporary
        tables once a branch is prepared.
        """
        names = self.plan.arrow_schema.names
        ordinal = "xasink_ord"
        while ordinal in {n.lower() for n in names}:  # column names are case-insensitive
            ordinal += "_"
        cols = ", ".join(_ident(n) for n in names)
        stage_name = "xasink_stage"
        while stage_name == self.plan.table.lower():  # a temporary table would shadow the target
            stage_name += "_"
        stage = ".".join(_ident(p) for p in (self.plan.schema, stage_name) if p)  # beside the target
        self.cursor.execute(
            f"CREATE TEMPORARY TABLE {stage} ({_ident(ordinal)} BIGINT AUTO_INCREMENT PRIMARY KEY) ENGINE=InnoDB "
            f"SELECT {cols} FROM {_table(self.plan)} LIMIT 0"
        )
        total = self._load_data(self._checked_keys(batches), stage)
        self.cursor.execute(
            f"INSERT INTO {_table(self.plan)} ({cols}) SELECT {cols} FROM {stage} ORDER BY {_ident(ordinal)} "
            f"ON DUPLICATE KEY UPDATE {self._updates()}"
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
        return ", ".join(f"{_ident(n)} = VALUES({_ident(n)})" for n in others)

    def _load_data(self, batches: Iterator[pa.RecordBatch], into: str, replace: bool = False) -> int:
        """Batches are written to a private temp file and loaded every ``batch_size`` rows (or 64 MiB)."""
        fd, path = tempfile.mkstemp(prefix="xasink-", suffix=".tsv")
        total = pending = 0
        try:
            stmt = self.load_data_sql(path, into, replace)
            with os.fdopen(fd, "wb") as f:
                for batch in batches:
                    f.write(encode_tsv(batch))
                    pending += batch.num_rows
                    if pending >= self.dialect.settings.batch_size or f.tell() >= self.dialect.load_data_max_bytes:
                        f.flush()
                        self._run_load(stmt, pending, replace)
                        total += pending
                        pending = 0
                        f.seek(0)
                        f.truncate()
                if pending:
                    f.flush()
                    self._run_load(stmt, pending, replace)
                    total += pending
        finally:
            try:
                os.unlink(path)
            except OSError:
                pass
        return total

    def _run_load(self, stmt: str, expected: int, replace: bool = False) -> None:
        self.cursor.execute(stmt)
        loaded = self.cursor.rowcount
        # a REPLACE counts a replaced row twice; strict mode makes a row it cannot store an error, not a skip
        stored_all = expected <= loaded <= 2 * expected if replace else loaded == expected
        if self.cursor.warning_count or not stored_all:
            self.cursor.execute("SHOW WARNINGS LIMIT 5")
            warnings = [w for w in self.cursor.fetchall() if str(w[0]).lower() != "note"]
            if warnings or not stored_all:
                raise self.dialect.load_warning_error(warnings, loaded, expected, self.xid, self.plan)

    def insert_sql(self) -> str:
        names = self.plan.arrow_schema.names
        cols = ", ".join(_ident(n) for n in names).replace("%", "%%")
        stmt = f"INSERT INTO {_table(self.plan).replace('%', '%%')} ({cols}) VALUES ({', '.join(['%s'] * len(names))})"
        if self.plan.upsert_keys:
            stmt += f" ON DUPLICATE KEY UPDATE {self._updates().replace('%', '%%')}"
        return stmt

    def _insert(self, batches: Iterator[pa.RecordBatch]) -> int:
        """Multi-row INSERT: pymysql's executemany packs rows into statements of up to max_stmt_length bytes."""
        stmt = self.insert_sql()
        keys = [self.plan.arrow_schema.get_field_index(k) for k in self.plan.upsert_keys]
        step = self.dialect.settings.batch_size
        total = 0
        for batch in batches:
            if keys:
                check_upsert_keys(batch, self.plan, keys, self.xid.partition)
            for start in range(0, batch.num_rows, step):
                chunk = batch.slice(start, step)
                self.cursor.executemany(stmt, python_rows(chunk))
                total += chunk.num_rows
        return total

    # -- prepare / roll back ----------------------------------------------------------------
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
        self.dialect.wait_detached(self.connection_id)

    def _listed(self) -> bool | None:
        """Whether XA RECOVER lists the branch; None when this user may not run XA RECOVER (MySQL 8)."""
        stmt, hex_data = recover_statement(self.is_mariadb)
        try:
            self.cursor.execute(stmt)
        except pymysql.err.MySQLError as exc:
            if _errno(exc) in _PRIVILEGE_CODES:
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


# --------------------------------------------------------------------------- the dialect


class MySQLDialect(Dialect):
    name = "MySQL"
    default_port = 3306
    load_data_max_bytes = 64 << 20  # a LOAD DATA file is loaded once it reaches this size
    max_stmt_bytes = 4 << 20  # largest multi-row INSERT statement (capped by max_allowed_packet)

    def connect_args(self) -> dict[str, Any]:
        return {"connect_timeout": 10, "charset": "utf8mb4"}

    def raw_connect(self, local_infile: bool = False) -> pymysql.connections.Connection:
        """A plain pymysql connection (autocommit) with the URL's settings; failures become ConnectError."""
        _, kwargs = _SA_DIALECT.create_connect_args(self.url)
        kwargs.update(self.connect_args())
        kwargs.update(autocommit=True, local_infile=local_infile)
        try:
            conn = pymysql.connect(**kwargs)
        except pymysql.err.MySQLError as exc:
            raise self.connect_error(exc) from None
        set_keepalive(getattr(conn, "_sock", None))
        return conn

    def on_connect(self, dbapi_conn: Any, record: Any) -> None:
        """A control connection: TCP keepalives, and lock waits bounded by controlLockTimeout (error 1205,
        transient: the step is retried) for row locks (InnoDB) and table metadata locks alike."""
        set_keepalive(getattr(dbapi_conn, "_sock", None))
        timeout = int(self.settings.control_lock_timeout)
        if timeout:
            with dbapi_conn.cursor() as cur:
                cur.execute("SET SESSION innodb_lock_wait_timeout = %s, lock_wait_timeout = %s", (timeout, timeout))

    def wait_detached(self, connection_id: int, timeout_s: float = DETACH_TIMEOUT_S) -> None:
        """Return once the server has finished disconnecting session ``connection_id`` (see the module doc)."""
        conn = self.raw_connect()
        try:
            cur = conn.cursor()
            deadline = time.monotonic() + timeout_s
            delay = 0.001
            while True:
                if self._session_gone(cur, connection_id):
                    return
                if time.monotonic() > deadline:
                    raise BranchError(
                        f"the server did not release session {connection_id} within {timeout_s:.0f}s after it "
                        "prepared its branch; the branch is rolled back by the batch's abort"
                    )
                time.sleep(delay)
                delay = min(delay * 2, 0.05)
        finally:
            conn.close()

    _trx_visible = True  # whether this user may read INNODB_TRX (the PROCESS privilege)
    _stuck: frozenset[int] = frozenset()  # sessions await_owner gave up on (per dialect, i.e. per engine)

    def _session_gone(self, cur: Any, connection_id: int) -> bool:
        """Whether session ``connection_id`` has left PROCESSLIST and InnoDB no longer holds a transaction of it.

        MariaDB removes a session from PROCESSLIST before InnoDB detaches its prepared transaction
        (``THD::free_connection`` runs after ``server_threads.erase``), so both are checked.
        """
        query = "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = %s"
        if self._trx_visible:
            trx = "SELECT COUNT(*) FROM information_schema.INNODB_TRX WHERE trx_mysql_thread_id = %s"
            query = f"SELECT ({query}) + ({trx})"
        try:
            cur.execute(query, (connection_id,) * query.count("%s"))
        except pymysql.err.MySQLError as exc:
            if not self._trx_visible or _errno(exc) not in _PRIVILEGE_CODES:
                raise
            self._trx_visible = False
            return self._session_gone(cur, connection_id)
        row = cur.fetchone()
        return row is None or int(row[0]) == 0

    def await_owner(self, conn: Connection, xid: Xid | None, timeout_s: float = OWNER_WAIT_S) -> None:
        """Wait until no session that may own the branch is still disconnecting: then XA COMMIT / ROLLBACK is safe.

        A verb that lands while the owner's disconnect is in flight can answer OK (or XAER_NOTA) while the
        transaction stays prepared, unlisted and holding its row locks until the server restarts (measured on
        MariaDB 10.11 for COMMIT and ROLLBACK: tests/test_dialect_edges.py).  A branch's session holds its
        owner lock, so the owner is known while it lives; an owner already past releasing it shows as an
        InnoDB transaction of a session that is gone, killed or quitting.  Bounded: a hung owner is left to
        the verb's XAER_NOTA handling.
        """
        lock = owner_lock(xid) if xid is not None else "xasink-owner:-"  # foreign: no owner lock
        deadline = time.monotonic() + timeout_s
        delay = 0.001
        while True:
            query = _DISCONNECTING_SQL if self._trx_visible else _DISCONNECTING_SQL_NO_TRX
            try:
                pending = {int(r[0]) for r in conn.exec_driver_sql(query, {"lock": lock})} - self._stuck
            except sa.exc.DBAPIError as exc:
                if not self._trx_visible or _errno(exc) not in _PRIVILEGE_CODES:
                    raise
                self._trx_visible = False
                continue
            if not pending:
                return
            if time.monotonic() > deadline:
                # a session that takes this long (a hung writer, another application's huge disconnect) is
                # not waited for again: the next branches would each wait as long for nothing
                self._stuck = self._stuck | pending
                log.debug("%s: sessions %s still disconnecting after %.0fs; going on", xid, sorted(pending), timeout_s)
                return
            time.sleep(delay)
            delay = min(delay * 2, 0.05)

    # -- XA verbs ------------------------------------------------------------------------
    def _finish(self, conn: Connection, verb: str, literal: str, key: tuple[int, bytes, bytes]) -> None:
        self.await_owner(conn, Xid.from_xa(*key))
        try:
            conn.exec_driver_sql(f"XA {verb} {literal}")
        except sa.exc.DBAPIError as exc:
            # XAER_NOTA also answers a branch whose owner has not disconnected yet: it is still listed.
            # A branch reports its xid only once detached, so this is a writer that is just finishing (or
            # hung).  Retrying at once races with its disconnect (see the module doc): a commit fails as
            # transient (the coordinator retries after a backoff); a roll-back is left to the next sweep.
            if _errno(exc) == ER_XAER_NOTA and key in self._recovered(conn):
                if verb == "ROLLBACK":
                    log.warning(
                        "XA ROLLBACK %s: still attached to its writer's session; left for the next sweep", literal
                    )
                    return
                raise BranchBusyError(
                    f"XA {verb} of {literal}: the branch is still attached to its writer's session; retry later"
                ) from exc
            raise

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

    def _recovered(self, conn: Connection) -> list[tuple[int, bytes, bytes]]:
        stmt, hex_data = recover_statement(bool(getattr(conn.dialect, "is_mariadb", False)))
        rows = conn.exec_driver_sql(stmt).fetchall()
        return [p for p in (parse_recover_row(r, hex_data) for r in rows) if p is not None]

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
        for format_id, gtrid, bqual in self._recovered(conn):
            xid = Xid.from_xa(format_id, gtrid, bqual)
            out.append(PreparedTxn(xid.gid if xid else foreign_gid(format_id, gtrid, bqual), xid))
        return out

    def classify(self, exc: BaseException) -> ErrorKind:
        code = _errno(exc)
        if code == ER_XAER_NOTA:
            return ErrorKind.UNKNOWN_XID
        if isinstance(exc, BranchBusyError) or code in _TRANSIENT_CODES:
            return ErrorKind.TRANSIENT
        if isinstance(exc, sa.exc.DBAPIError) and exc.connection_invalidated:
            return ErrorKind.TRANSIENT
        orig = getattr(exc, "orig", exc)
        if code in (None, 0) and isinstance(
            orig,
            (sa.exc.OperationalError, sa.exc.InterfaceError, pymysql.err.OperationalError, pymysql.err.InterfaceError),
        ):
            return ErrorKind.TRANSIENT
        return ErrorKind.FATAL

    def durability_risks(self, conn: Connection) -> list[DurabilityRisk]:
        flush, log_bin, sync_binlog = conn.exec_driver_sql(
            "SELECT @@GLOBAL.innodb_flush_log_at_trx_commit, @@GLOBAL.log_bin, @@GLOBAL.sync_binlog"
        ).one()
        risks = []
        if str(flush) != "1":  # 0 and 2 flush the redo log (and so XA PREPARE) about once a second
            fix = "innodb_flush_log_at_trx_commit = 1: SET GLOBAL innodb_flush_log_at_trx_commit = 1 (and my.cnf)"
            risks.append(DurabilityRisk("innodb_flush_log_at_trx_commit", str(flush), fix))
        if str(log_bin).upper() in ("1", "ON") and str(sync_binlog) != "1":  # XA PREPARE is in the binary log too
            fix = "sync_binlog = 1: SET GLOBAL sync_binlog = 1 (and my.cnf)"
            risks.append(DurabilityRisk("sync_binlog", str(sync_binlog), fix))
        return risks

    def check_server(self, conn: Connection, branches: int | None) -> None:
        self.warn_durability(conn)
        version = str(conn.exec_driver_sql("SELECT VERSION()").scalar_one())
        is_mariadb = "mariadb" in version.lower()
        nums = tuple(int(x) for x in re.findall(r"\d+", version)[:2])
        if is_mariadb and nums < (10, 5):
            raise PreflightError(
                f"MariaDB {version} at {self.where()} rolls back a prepared XA transaction when its session ends; "
                "xasink needs MariaDB 10.5 or later"
            )
        if not is_mariadb and nums < (8, 0):
            raise PreflightError(f"MySQL {version} at {self.where()} is too old for xasink; use MySQL 8.0 or later")
        try:
            self.list_prepared(conn)
        except sa.exc.DBAPIError as exc:
            if _errno(exc) in _PRIVILEGE_CODES:
                raise PreflightError(
                    f"user '{self.url.username}' may not run XA RECOVER on MySQL at {self.where()}, which xasink needs "
                    "to finish and clean up branches: GRANT XA_RECOVER_ADMIN ON *.* TO the writing user"
                ) from None
            raise
        if is_mariadb:
            legacy = conn.exec_driver_sql("SHOW GLOBAL VARIABLES LIKE 'legacy_xa_rollback_at_disconnect'").fetchall()
            if legacy and str(legacy[0][1]).upper() in ("ON", "1"):
                raise PreflightError(
                    f"MariaDB at {self.where()} has legacy_xa_rollback_at_disconnect = ON, which rolls back a "
                    "prepared branch when its writer disconnects: SET GLOBAL legacy_xa_rollback_at_disconnect = OFF"
                )
        server_infile = conn.exec_driver_sql("SELECT @@GLOBAL.local_infile").scalar_one()
        if self.settings.local_infile and not int(server_infile or 0):
            log.warning(
                "%s at %s has local_infile = OFF: loading with multi-row INSERT instead of LOAD DATA LOCAL "
                "(slower). To use LOAD DATA: SET GLOBAL local_infile = 1; to silence this: localInfile=false",
                self.name,
                self.where(),
            )

    def check_table(self, conn: Connection, plan: TargetPlan) -> TargetPlan:
        row = conn.execute(
            sa.text(
                "SELECT ENGINE, TABLE_TYPE FROM information_schema.TABLES "
                "WHERE TABLE_SCHEMA = COALESCE(:schema, DATABASE()) AND TABLE_NAME = :table"
            ),
            {"schema": plan.schema, "table": plan.table},
        ).first()
        conn.rollback()
        target = f"{plan.schema}.{plan.table}" if plan.schema else plan.table
        if row is None:
            return plan  # reflection found it a moment ago; the branch will say what happened
        engine, kind = row
        if str(kind).upper() != "BASE TABLE":
            raise PreflightError(f"{target} is a {str(kind).lower()}: xasink writes into base tables only")
        if str(engine or "").lower() != "innodb":
            raise PreflightError(
                f"table {target} uses the {engine} storage engine, which has no XA transactions: rows would "
                f"become visible before the batch commits. Convert it: ALTER TABLE {target} ENGINE=InnoDB"
            )
        if plan.upsert_keys and self.replace_is_upsert(conn, plan):
            log.info("upsert into %s: LOAD DATA REPLACE (the key is the table's only unique key)", target)
            return dataclasses.replace(plan, upsert_by_replace=True)
        return plan

    def replace_is_upsert(self, conn: Connection, plan: TargetPlan) -> bool:
        """Whether REPLACE leaves exactly the rows ON DUPLICATE KEY UPDATE (every column) would: the upsert key
        is the table's only unique key, no foreign key refers to the table and it has no triggers (then the
        server turns each REPLACE of a row into an UPDATE of it, not a DELETE and INSERT), and every column is
        written (REPLACE would reset the others to their defaults)."""
        where = {"schema": plan.schema, "table": plan.table}
        same_table = "TABLE_SCHEMA = COALESCE(:schema, DATABASE()) AND TABLE_NAME = :table"
        unique = conn.execute(
            sa.text(
                "SELECT INDEX_NAME, COLUMN_NAME FROM information_schema.STATISTICS "
                f"WHERE {same_table} AND NON_UNIQUE = 0"
            ),
            where,
        ).all()
        columns = conn.execute(
            sa.text(f"SELECT COLUMN_NAME FROM information_schema.COLUMNS WHERE {same_table}"), where
        ).all()
        blockers = conn.execute(
            sa.text(
                "SELECT (SELECT COUNT(*) FROM information_schema.TRIGGERS WHERE "
                "EVENT_OBJECT_SCHEMA = COALESCE(:schema, DATABASE()) AND EVENT_OBJECT_TABLE = :table) + "
                "(SELECT COUNT(*) FROM information_schema.REFERENTIAL_CONSTRAINTS WHERE "
                "UNIQUE_CONSTRAINT_SCHEMA = COALESCE(:schema, DATABASE()) AND REFERENCED_TABLE_NAME = :table)"
            ),
            where,
        ).scalar()
        conn.rollback()
        indexes = {str(name) for name, _ in unique}
        key_columns = {str(col).lower() for _, col in unique}
        return (
            len(indexes) == 1
            and key_columns == {k.lower() for k in plan.upsert_keys}
            and not blockers
            and {str(c).lower() for (c,) in columns} == {n.lower() for n in plan.arrow_schema.names}
        )

    def branch_error(self, exc: BaseException, xid: Xid, plan: TargetPlan) -> BranchError:
        code = _errno(exc)
        orig = getattr(exc, "orig", exc)
        args: tuple[Any, ...] = tuple(getattr(orig, "args", ()))
        text = str(args[1]) if len(args) > 1 else str(orig)
        return self._branch_error(code, redact(text.strip(), url_secrets(self.url)), xid, plan)

    def load_warning_error(
        self, warnings: list[tuple[Any, ...]], loaded: int, expected: int, xid: Xid, plan: TargetPlan
    ) -> BranchError:
        if warnings:
            level, code, text = warnings[0][0], int(warnings[0][1]), str(warnings[0][2])
            more = f" (+{len(warnings) - 1} more)" if len(warnings) > 1 else ""
            return self._branch_error(code, f"LOAD DATA {str(level).lower()}: {text}{more}", xid, plan)
        return self._branch_error(None, f"LOAD DATA stored {loaded} of {expected} rows", xid, plan)

    def _branch_error(self, code: int | None, text: str, xid: Xid, plan: TargetPlan) -> BranchError:
        hint = _BRANCH_HINTS.get(code or 0)
        if plan.upsert_keys and code in (1205, 1213):
            hint = _UPSERT_LOCK_HINT.format(keys=", ".join(plan.upsert_keys))
        first = text.splitlines()[0] if text else "unknown error"
        err = branch_failed(xid, plan, first + (f" [{code}]" if code else ""), hint)
        err.errno = code  # type: ignore[attr-defined]
        return err

    # -- tables -------------------------------------------------------------------------
    def arrow_type(self, column: Any, source: pa.DataType) -> pa.DataType | None:
        t = column["type"]
        unsigned = bool(getattr(t, "unsigned", False))
        if isinstance(t, mysql.TINYINT):  # BOOLEAN is TINYINT(1): it takes booleans, and small integers
            if pa.types.is_boolean(source):
                return pa.bool_()
            return pa.uint8() if unsigned else pa.int8()
        if isinstance(t, sa.Boolean):
            return pa.bool_()
        if isinstance(t, sa.SmallInteger):
            return pa.uint16() if unsigned else pa.int16()
        if isinstance(t, sa.BigInteger):
            return pa.uint64() if unsigned else pa.int64()
        if isinstance(t, sa.Integer):  # INT, MEDIUMINT
            return pa.uint32() if unsigned else pa.int32()
        if isinstance(t, mysql.YEAR):
            return pa.int16()
        if isinstance(t, mysql.FLOAT):
            return pa.float32()
        if isinstance(t, sa.Float):  # DOUBLE, REAL
            return pa.float64()
        if isinstance(t, sa.Numeric):
            precision = t.precision if t.precision is not None else 10
            return pa.decimal128(precision, t.scale or 0) if precision <= 38 else pa.decimal256(precision, t.scale or 0)
        if isinstance(t, (sa.String, sa.JSON)):  # CHAR, VARCHAR, *TEXT, ENUM, SET, JSON
            return pa.string()
        if isinstance(t, sa.types._Binary):  # BINARY, VARBINARY, *BLOB
            return pa.binary()
        if isinstance(t, sa.DateTime):  # DATETIME, TIMESTAMP
            tz_source = pa.types.is_timestamp(source) and source.tz is not None
            return pa.timestamp("us", tz="UTC") if tz_source else pa.timestamp("us")
        if isinstance(t, sa.Date):
            return pa.date32()
        return None

    def sql_type(self, arrow_type: pa.DataType) -> sa.types.TypeEngine[Any] | None:
        t = arrow_type
        ints = {
            pa.int8(): mysql.TINYINT(),
            pa.int16(): mysql.SMALLINT(),
            pa.int32(): mysql.INTEGER(),
            pa.int64(): mysql.BIGINT(),
            pa.uint8(): mysql.TINYINT(unsigned=True),
            pa.uint16(): mysql.SMALLINT(unsigned=True),
            pa.uint32(): mysql.INTEGER(unsigned=True),
            pa.uint64(): mysql.BIGINT(unsigned=True),
        }
        if t in ints:
            return ints[t]
        if pa.types.is_float32(t):
            return mysql.FLOAT()
        if pa.types.is_float64(t):
            return mysql.DOUBLE()
        if pa.types.is_decimal(t):
            if t.precision > 65 or t.scale > 30 or t.scale < 0:
                return None
            return mysql.DECIMAL(t.precision, t.scale)
        if pa.types.is_boolean(t):
            return mysql.BOOLEAN()
        if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_null(t):
            return mysql.LONGTEXT()
        if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
            return mysql.LONGBLOB()
        if pa.types.is_date(t):
            return mysql.DATE()
        if pa.types.is_timestamp(t):
            return mysql.DATETIME(fsp=6)  # a tz-aware timestamp is stored as its UTC wall time
        return None

    def parse_type(self, text: str) -> sa.types.TypeEngine[Any]:
        m = re.fullmatch(
            r"\s*([A-Za-z][A-Za-z0-9 ]*?)\s*(?:\(\s*(\d+)\s*(?:,\s*(\d+)\s*)?\))?\s*(unsigned)?\s*", text, re.I
        )
        if m is None:
            raise PreflightError(f"createTableColumnTypes: cannot parse type {text!r}")
        name = " ".join(m.group(1).lower().split())
        unsigned = m.group(4) is not None
        if name.endswith(" unsigned"):
            name, unsigned = name[: -len(" unsigned")], True
        name = {
            "bool": "boolean",
            "integer": "int",
            "long": "bigint",
            "string": "longtext",
            "double precision": "double",
            "real": "double",
            "character varying": "varchar",
            "character": "char",
            "numeric": "decimal",
            "dec": "decimal",
        }.get(name, name)
        cls = _SA_DIALECT.ischema_names.get(name)
        if cls is None:
            raise PreflightError(f"createTableColumnTypes: unknown MySQL type {text!r}")
        args = [int(a) for a in m.groups()[1:3] if a is not None]
        kwargs: dict[str, Any] = {}
        if unsigned:
            if not issubclass(cls, (sa.Integer, sa.Numeric)):
                raise PreflightError(f"createTableColumnTypes: type {text!r} cannot be UNSIGNED")
            kwargs["unsigned"] = True
        try:
            if name in ("datetime", "timestamp", "time"):
                return cls(fsp=args[0] if args else None)  # type: ignore[no-any-return]
            return cls(*args, **kwargs)  # type: ignore[no-any-return]
        except TypeError:
            raise PreflightError(f"createTableColumnTypes: type {text!r} takes no such arguments") from None

    def table_kwargs(self) -> dict[str, Any]:
        return {"mysql_engine": "InnoDB", "mysql_charset": "utf8mb4"}

    # -- branch ------------------------------------------------------------------------
    def open_branch(self, xid: Xid, plan: TargetPlan) -> BranchSession:
        return MySQLBranch(self, xid, plan)
