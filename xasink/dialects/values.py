"""What dialects and the protocol hand each other: error kinds, prepared and blocked sessions, branch settings, the
target plan and the checks of a branch's rows against it."""

from __future__ import annotations

import enum
import hashlib
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

import sqlalchemy as sa

from xasink.errors import BranchError
from xasink.protocol.xid import Xid

if TYPE_CHECKING:  # rows and types only: the driver's commit path never loads pyarrow
    import pyarrow as pa
    from sqlalchemy.engine import Connection


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
    # MySQL family, that merge: the written AUTO_INCREMENT column, (name, its COLUMN_TYPE), which the staging table
    # declares NULL-able so that a NULL reaches the target's INSERT, which numbers it as it does JDBC's INSERT
    numbered: tuple[str, str] | None = None
    # the shadow table of an overwrite / replaceWhere / change-data write (xasink.write_modes.statements):
    # this column of each row is the batch id, filled in by the task
    batch_column: str | None = None
    branch_column: str | None = None  # the shadow's column of each row's branch (its xid's bqual), ditto
    # the shadow's column numbering the branch's rows, where the dialect keys its shadow so (the loader fills it)
    row_column: str | None = None
    required: tuple[str, ...] = ()  # columns that must not be NULL in any row (change-data keys and sequence)
    # Spark's session time zone (spark.sql.session.timeZone), set in each task: a TimestampNTZType written to a
    # column that holds an instant is that wall time in this zone, as Spark casts it (None: not known)
    time_zone: str | None = None
    # columns whose values the server casts to the column's type (a double into numeric, a decimal into an
    # unconstrained numeric), as it does for Spark's JDBC writer: the PostgreSQL branch inserts them with a cast
    server_casts: tuple[tuple[str, str], ...] = ()  # (column, SQL type)
    # column names as Spark's JDBC writer matches them, which depends on spark.sql.caseSensitive, known in the
    # tasks only (xasink.write_modes.schema.check_name_case): (DataFrame column, table column) pairs whose names
    # match only without case, and DataFrame columns whose names are equal without case (ID and id)
    case_folded: tuple[tuple[str, str], ...] = ()
    case_twins: tuple[str, ...] = ()


@dataclass(frozen=True)
class Merge:
    """Rows to upsert by key into a table (the apply step of a change-data write): what a merge statement is
    made of."""

    target: sa.TableClause
    columns: list[str]  # the target's columns the selected rows fill, in the select's order
    select: sa.Select[Any]
    keys: list[str]
    sequence: str | None = None  # a row older than the stored one by this column leaves it as it is


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


@dataclass(frozen=True)
class DurabilityRisk:
    """A server setting under which a crash can lose prepared branches or decisions."""

    setting: str
    value: str
    fix: str  # what to set, as the operator would type it


# -- the shadow table of overwrite, replaceWhere and change-data writes (xasink.write_modes.shadow)
SHADOW_INDEX_SUFFIX = "_br"  # a shadow made by xasink before SHADOW_ROW_COLUMN: its (batch, branch) index
# a shadow keyed by (batch, tag, row) (``Dialect.keyed_shadow``): each row's branch as a number (branch_tag of its
# bqual), and the row's number within its branch; the branch column itself stays out of the key
SHADOW_TAG_COLUMN, SHADOW_ROW_COLUMN = "xasink_tag_", "xasink_row_"


def branch_tag(bqual: str) -> int:
    """A branch's number in a keyed shadow: a 63-bit hash of its bqual, the same in the loader and the apply."""
    return int.from_bytes(hashlib.blake2b(bqual.encode(), digest_size=8).digest(), "big") >> 1


class SwapRefused(Exception):
    """An overwrite cannot swap the table's storage without changing what others see, or cannot do it at all:
    it is applied in place instead (the message says why, for the log)."""


class RenameSwap(Protocol):
    """An overwrite's swap by renaming, on a database whose DDL commits (MariaDB/MySQL): step by step, each
    committed, the rename leaving the old storage under a witness's name (:mod:`xasink.dialects.mysql.swap`)."""

    max_name: int

    def refusal(self, conn: Connection, schema: str | None, table: str) -> str | None: ...
    def exists(self, conn: Connection, schema: str | None, name: str) -> bool: ...
    def named_like(self, conn: Connection, schema: str | None, prefix: str) -> list[str]: ...
    def everywhere(self, conn: Connection, prefix: str) -> list[tuple[str, str]]: ...
    def build(self, conn: Connection, target: SwapTarget) -> int: ...
    def rename(self, conn: Connection, target: SwapTarget, witness: str) -> None: ...
    def drop(self, conn: Connection, schema: str | None, name: str) -> None: ...


@dataclass(frozen=True)
class SwapTarget:
    """An overwrite to apply by swapping storage: the target, the name its new storage is built under, and the
    SELECT of the decided batch's rows from the shadow (the target's ``columns``, in that order)."""

    schema: str | None
    table: str
    new: str
    columns: tuple[str, ...]
    rows: sa.Select[Any]
