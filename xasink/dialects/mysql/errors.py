"""What a MySQL/MariaDB error number means for xasink: retry, give up, or tell the user what to fix."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import pymysql
import sqlalchemy as sa

from xasink.dialects.mysql.sql import errno_of
from xasink.dialects.mysql.xa import ER_XAER_NOTA
from xasink.dialects.values import ErrorKind, TargetPlan, branch_failed
from xasink.errors import BranchError, XasinkError
from xasink.protocol.xid import Xid

if TYPE_CHECKING:
    import pyarrow as pa

TRANSIENT_CODES = {
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
    1969,  # MariaDB: max_statement_time exceeded
    3024,  # MySQL: max_execution_time exceeded
    1317,  # query interrupted (KILL QUERY)
    1290,  # the server runs with --read-only (or another option that forbids the statement)
    1792,  # a read-only transaction
    1836,  # read-only mode
    1021,  # disk full
    1114,  # the table is full
    *(1037, 1038, 1041),  # out of memory
}
# the rows are wrong: a constraint of the table they violate, or a value its column cannot hold
ROWS_CODES = {1062, 1586, 1048, 1263, 1364, 1406, 1264, 1366, 1265, 1292, 1452, 1451, 1216, 1217, 3819, 4025, 1690}
PRIVILEGE_CODES = {1227, 1044, 1142}
# warnings about the statement, not about a row: MySQL 8.0.13+ deprecates setting a user variable in an
# expression (a keyed shadow's row number in LOAD DATA's SET), which MariaDB does not
STATEMENT_WARNINGS = {1287}

# what three of the hints below add: LOAD DATA reports a zero date as out of range (1264) or truncated (1265)
ZERO_DATE = "a date the server's sql_mode refuses (NO_ZERO_DATE, NO_ZERO_IN_DATE: 0000-00-00, a zero month or day)"

# error (or LOAD DATA warning) codes a branch can fail with, and what the user should do about them
BRANCH_HINTS = {
    1062: "duplicate key: the rows collide with rows already in the table (or in this batch); "
    "deduplicate the DataFrame or use upsertKeyColumns",
    1048: "NULL in a NOT NULL column: fill or filter the NULLs first",
    1263: "NULL in a NOT NULL column: fill or filter the NULLs first",
    1364: "a NOT NULL column without a default is missing from the DataFrame: add the column",
    1406: "a string or binary value is longer than its column allows: widen the column or truncate the data",
    1264: "a value is out of range for its column: a number too large for its type (widen the column type), or "
    + ZERO_DATE,
    1366: "a string the column's type cannot read (not a number, date or member of it): cast or fix it in Spark first",
    1265: "a value does not fit its column: a string the column's type cannot read (not a number, date or member "
    f"of it), a string longer than its column allows, a number with too many digits, or {ZERO_DATE}: fix the "
    "data in Spark or widen the column type",
    1292: "a date or time the column cannot hold: a string its type cannot read as one, or out of its range "
    "(DATETIME and DATE: the years 1000 to 9999; TIMESTAMP: 1970-01-01 00:00:01 to 2038-01-19 03:14:07 UTC), "
    "or " + ZERO_DATE,
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
UPSERT_CONFLICT_HINT = (
    "a row collides with a row of another key on a unique index other than the upsert key ({keys}): an upsert "
    "updates only the rows whose key matches and inserts the others, so this is a conflict the rows must not "
    "have (as PostgreSQL's ON CONFLICT on the key would refuse it). Fix the rows, or drop or change that index"
)
UPSERT_LOCK_HINT = (
    "another partition of this batch (or another transaction) holds rows with the same upsert keys ({keys}): a "
    "prepared branch keeps them locked until the batch commits, so rows with equal keys must all be in one "
    "partition. Repartition the DataFrame by the key columns first (xasink.write() does this itself)"
)


class BranchBusyError(XasinkError):
    """A prepared branch is still attached to its owner's session; finishing it must wait (transient)."""


class HiddenBranchError(XasinkError):
    """XA COMMIT / ROLLBACK answered OK, yet InnoDB still holds the branch prepared (until a restart): fatal."""


class LockBusyError(BranchBusyError):
    """GET_LOCK was not granted within controlLockTimeout (it answers 0, not an error): transient, as 1205."""


def classify(exc: BaseException) -> ErrorKind:
    code = errno_of(exc)
    if code == ER_XAER_NOTA:
        return ErrorKind.UNKNOWN_XID
    if isinstance(exc, BranchBusyError) or code in TRANSIENT_CODES:
        return ErrorKind.TRANSIENT
    if code in ROWS_CODES:
        return ErrorKind.ROWS
    if isinstance(exc, sa.exc.DBAPIError) and exc.connection_invalidated:
        return ErrorKind.TRANSIENT
    orig = getattr(exc, "orig", exc)
    if code in (None, 0) and isinstance(
        orig,
        (sa.exc.OperationalError, sa.exc.InterfaceError, pymysql.err.OperationalError, pymysql.err.InterfaceError),
    ):
        return ErrorKind.TRANSIENT
    return ErrorKind.FATAL


CHARSET_HINT = (
    "a character the column's character set cannot hold (4-byte UTF-8, such as an emoji, in a utf8mb3 or latin1 "
    "column): make the column utf8mb4, or remove those characters in Spark first"
)
TIME_RANGE_HINT = (
    "a date or time is out of its column's range: a TIMESTAMP column holds 1970-01-01 00:00:01 to 2038-01-19 "
    "03:14:07 UTC (the value read in the server's time_zone), a DATETIME or DATE the years 1000 to 9999; use "
    "DATETIME(6) for instants past 2038, or filter the rows first"
)
_COLUMN = re.compile(r"for column (?:'([^']+)'|(?:`[^`]*`\.)*`([^`]+)`)")


def _temporal_column(text: str, plan: TargetPlan) -> bool:
    """Does the server's message name a column the DataFrame fills with dates or timestamps?"""
    import pyarrow as pa  # (the row side: never imported by the commit path, which reads these codes too)

    found = _COLUMN.search(text)
    name = (found.group(1) or found.group(2)) if found else None
    schema = plan.arrow_schema
    if name is None or schema.get_field_index(name) < 0:
        return False
    type_ = schema.field(name).type
    return bool(pa.types.is_timestamp(type_) or pa.types.is_date(type_))


def branch_error_for(code: int | None, text: str, xid: Xid, plan: TargetPlan) -> BranchError:
    hint = BRANCH_HINTS.get(code or 0)
    if code in (1264, 1265, 1292) and _temporal_column(text, plan):  # "a number is out of range" would mislead
        hint = TIME_RANGE_HINT
    if code == 1366 and "Incorrect string value" in text:
        hint = CHARSET_HINT
    if plan.upsert_keys and code in (1205, 1213):
        hint = UPSERT_LOCK_HINT.format(keys=", ".join(plan.upsert_keys))
    if plan.upsert_keys and code == 1062:
        hint = UPSERT_CONFLICT_HINT.format(keys=", ".join(plan.upsert_keys))
    first = text.splitlines()[0] if text else "unknown error"
    err = branch_failed(xid, plan, first + (f" [{code}]" if code else ""), hint)
    err.errno = code  # type: ignore[attr-defined]
    return err


def load_warning_error(
    warnings: list[tuple[Any, ...]], loaded: int, expected: int, xid: Xid, plan: TargetPlan
) -> BranchError:
    """A LOAD DATA that raised warnings (or stored fewer rows than sent) as the branch's error."""
    if warnings:
        level, code, text = warnings[0][0], int(warnings[0][1]), str(warnings[0][2])
        more = f" (+{len(warnings) - 1} more)" if len(warnings) > 1 else ""
        return branch_error_for(code, f"LOAD DATA {str(level).lower()}: {text}{more}", xid, plan)
    return branch_error_for(None, f"LOAD DATA stored {loaded} of {expected} rows", xid, plan)


def with_row_key(error: BranchError, sent: list[pa.RecordBatch]) -> BranchError:
    """The error with the server's "at row N" (N counts the rows of its LOAD DATA statement, not the partition's)
    replaced by the row's key, as PostgreSQL names a failing row: ``in the row with id=278``."""
    found = re.search(r" at row (\d+)", str(error))
    if found is None:
        return error
    n = int(found.group(1)) - 1
    for batch in sent:
        if n < batch.num_rows:
            key = ", ".join(f"{name}={_shown(batch.column(i)[n].as_py())}" for i, name in enumerate(batch.schema.names))
            new = type(error)(str(error).replace(found.group(0), f" in the row with {key}", 1))
            new.__dict__.update(error.__dict__)
            return new
        n -= batch.num_rows
    return error


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
