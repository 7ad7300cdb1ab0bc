"""MySQL 8 / MariaDB 10.5+: XA START..PREPARE on pymysql, LOAD DATA LOCAL or multi-row INSERT, XA RECOVER.

A branch is one pymysql connection: ``XA START``, rows, ``XA END``, ``XA PREPARE``, disconnect.  The
driver finishes branches with ``XA COMMIT`` / ``XA ROLLBACK`` over SQLAlchemy (``mysql+pymysql``).

Two server facts shape the branch side:

* A prepared branch can be finished by another session only after its owner disconnected.  Before that,
  ``XA COMMIT`` answers XAER_NOTA as if the xid did not exist, and on MariaDB 10.11 an ``XA COMMIT`` or
  ``XA ROLLBACK`` that races with the owner's disconnect answers OK while the transaction stays prepared,
  unlisted and holding its locks until the server restarts.  So the branch does not report its xid until
  its session is gone from ``information_schema.PROCESSLIST`` (a user always sees their own sessions), and
  whoever finishes a branch sends the verb only once InnoDB is proven to have detached it (:mod:`.owner`).
* ``LOAD DATA LOCAL`` behaves as ``LOAD DATA ... IGNORE``: duplicates and bad values become warnings and
  rows are skipped or altered, whatever ``sql_mode`` says.  Every LOAD is therefore checked: the affected
  row count must equal the rows sent and no warning may be raised, else the branch fails.

Rows travel as tab-separated text (``\\N`` for NULL; backslash, tab, newline, CR and NUL escaped with a
backslash), binary columns as hex through ``UNHEX()``; strings, NULLs and bytes round-trip exactly.
Timestamps are written as Spark's JDBC writer writes them: a TimestampType as its wall time in Spark's
session time zone, in a branch session that keeps the server's time_zone (docs/types.md).  Enabling
``local_infile`` lets the server ask the client for a file: branch connections only enable it when the
option ``localInfile`` allows it.

The package keeps one job per module, as Flink's XA package does: :mod:`.xa` (how an xid is spelled and
listed), :mod:`.errors` (what a server error means), :mod:`.encoding` (rows as LOAD DATA text),
:mod:`.owner` (proving a branch's owner has let go of it), :mod:`.innodb` (InnoDB's view of its
transactions), :mod:`.branch` (the executor's branch), :mod:`.preflight` (server and table checks),
:mod:`.types` (type mapping) and :mod:`.dialect` (the driver's XA verbs, tying the rest together).
"""

from typing import TYPE_CHECKING, Any

from xasink.dialects.mysql.dialect import MySQLDialect
from xasink.dialects.mysql.errors import BranchBusyError
from xasink.dialects.mysql.sql import BRANCH_SQL_MODE
from xasink.dialects.mysql.xa import (
    foreign_gid,
    owner_lock,
    parse_foreign_gid,
    parse_recover_row,
    recover_statement,
    xa_literal,
    xid_literal,
)

if TYPE_CHECKING:
    from xasink.dialects.mysql.branch import MySQLBranch
    from xasink.dialects.mysql.encoding import encode_tsv, hex_column, python_rows, text_column

# the executor's side (pyarrow, numpy) is imported on first use: the driver's commit path needs none of it
_LAZY = {
    "MySQLBranch": "branch",
    "encode_tsv": "encoding",
    "hex_column": "encoding",
    "python_rows": "encoding",
    "text_column": "encoding",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import import_module

    return getattr(import_module(f"{__name__}.{module}"), name)


__all__ = [
    "BRANCH_SQL_MODE",
    "BranchBusyError",
    "MySQLBranch",
    "MySQLDialect",
    "encode_tsv",
    "foreign_gid",
    "hex_column",
    "owner_lock",
    "parse_foreign_gid",
    "parse_recover_row",
    "python_rows",
    "recover_statement",
    "text_column",
    "xa_literal",
    "xid_literal",
]
