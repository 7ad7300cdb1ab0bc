"""PostgreSQL's SQL text and error states: literals, quoting, the upsert statement, SQLSTATE classes."""

from __future__ import annotations

import hashlib
import re

from sqlalchemy.dialects import postgresql as pg

from xasink.dialects.keepalive import KEEPALIVE_COUNT, KEEPALIVE_IDLE_S, KEEPALIVE_INTERVAL_S
from xasink.dialects.values import TargetPlan

SA_DIALECT = pg.psycopg2.dialect()
# identifiers for the statements ADBC runs as they are (the branch's) and for names bound as values: SQLAlchemy's
# own preparer doubles '%' for psycopg2's formatting, which nothing undoes there
# (a dialect whose paramstyle is not printf-like quotes without doubling)
_PREPARER = pg.psycopg2.dialect(paramstyle="named").identifier_preparer

UPSERT_LOCK_HINT = (
    "another partition of this batch (or another transaction) holds rows with the same upsert keys ({keys}): a "
    "prepared branch keeps them locked until the batch commits, so rows with equal keys must all be in one "
    "partition. Repartition the DataFrame by the key columns first, e.g. df.repartition({quoted}) (xasink.write() "
    "does this itself)"
)
# ADBC's built-in table of PostgreSQL types instead of reading pg_type and all of pg_attribute at every
# connect (~40 ms of client CPU on an empty database, minutes on one with many tables: apache/arrow-adbc#1755).
# A branch only sends rows of built-in types (a domain column takes its base type's) and reads a count.
ADBC_DB_OPTIONS = {"adbc.postgresql.type_resolver_mode": "builtin"}
# libpq's TCP keepalives (ignored on a Unix socket): a dead server or network is noticed in about a minute
KEEPALIVES = {
    "keepalives": 1,
    "keepalives_idle": KEEPALIVE_IDLE_S,
    "keepalives_interval": KEEPALIVE_INTERVAL_S,
    "keepalives_count": KEEPALIVE_COUNT,
}
TRANSIENT_STATES = {
    *("40001", "40P01", "55P03", "57P01", "57P02", "57P03", "53300", "58000", "58030"),
    "57014",  # query_canceled: statement_timeout, pg_cancel_backend
    "25006",  # read_only_sql_transaction: a standby, or default_transaction_read_only
    *("53000", "53100", "53200", "53400"),  # insufficient resources: a full disk, out of memory, a limit
    *("25P03", "57P05"),  # idle (in transaction) session timeout
}
# the rows are wrong: integrity constraint violations (23) and values the columns cannot hold (22)
ROWS_CLASSES = ("22", "23")
UNKNOWN_XID_STATE = "42704"
LOCK_NOT_AVAILABLE = "55P03"  # a NOWAIT lock, or a wait past lock_timeout
# the change-data apply's sorts and hashes in memory for the rest of its transaction (never lowering the setting)
SORT_MEMORY = "SELECT set_config('work_mem', '64MB', true) WHERE pg_size_bytes(current_setting('work_mem')) < 67108864"

# A branch that checks for a free prepared-transaction slot holds this session lock (a pair of int4 keys, so
# no single-key advisory lock of xasink can take it) from before it counts until it disconnects after its PREPARE:
# two branches checking at once each count the other, and one that has prepared counts in pg_prepared_xacts.
SLOT_MARK_CLASS = 2019652450  # b"xasb"
SLOT_MARK = f"SELECT pg_advisory_lock({SLOT_MARK_CLASS}, pg_backend_pid())"
# read before the prepared ones: a branch drops its mark (it disconnects) only once prepared, so no read misses it
SLOT_MARKS = (
    f"SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = {SLOT_MARK_CLASS} AND objsubid = 2"
)
SLOT_CAPACITY = "SELECT current_setting('max_prepared_transactions')::int, (SELECT count(*) FROM pg_prepared_xacts)"

NUL_HINT = (
    "a string holds a NUL character (U+0000), which PostgreSQL text cannot store: remove it in Spark "
    "first, e.g. regexp_replace(col, '\\\\x00', '')"
)
# pgjdbc's startup parameters, which win over the database's, the role's and the URL's options: a branch reads
# strings as Spark's JDBC writer's sessions do (UTF-8 text, month-first dates, doubles' shortest exact text), not
# as a database set to LATIN1, 'SQL, DMY' or extra_float_digits = 0 would (found by an adversary's review)
# and array_nulls on: JDBC's arrays keep their NULL elements under a database's or role's array_nulls = off,
# where an array's text (a branch's upsert, the apply's copy from the shadow) would read NULL as a string
ARRAY_NULLS = "-c array_nulls=on"
JDBC_SESSION = f"-c client_encoding=UTF8 -c DateStyle=ISO -c extra_float_digits=3 {ARRAY_NULLS}"
# SQLSTATEs a branch can fail with, and what the user should do about them
BRANCH_HINTS = {
    "23505": "duplicate key: the rows collide with rows already in the table (or in this batch); "
    "deduplicate the DataFrame or use upsertKeyColumns",
    "23502": "NULL in a NOT NULL column: fill or filter the NULLs first",
    "23503": "foreign key violation: load the referenced rows first",
    "23514": "check constraint violation",
    "22001": "a string is longer than its column allows: widen the column or truncate the data",
    "22003": "a number is out of range for its column: widen the column type",
    "22021": NUL_HINT,  # COPY's "invalid byte sequence for encoding UTF8: 0x00"
    "22P05": NUL_HINT,  # "unsupported Unicode escape sequence" (a NUL in a json value)
    # PostgreSQL reports "maximum number of prepared transactions reached" as 53200 (out of memory)
    "53200": "the server has no free prepared-transaction slot: raise max_prepared_transactions "
    "(at least the number of partitions) or coalesce the DataFrame to fewer partitions",
    "55P03": "a row lock was not granted within lockTimeout: another transaction holds the same keys, most "
    "often another partition of this batch (the DataFrame has duplicate keys across partitions) or a "
    "prepared transaction; deduplicate the DataFrame on the table's keys",
    "42501": "permission denied: grant INSERT on the table (and USAGE on its schema) to the writing user",
}


def sqlstate_of(exc: BaseException) -> str | None:
    orig = getattr(exc, "orig", exc)
    for attr in ("pgcode", "sqlstate"):
        code = getattr(orig, attr, None)
        if code:
            return str(code)
    m = re.search(r"SQLSTATE: ([0-9A-Z]{5})", str(orig))
    return m.group(1) if m else None


def string_literal(value: str) -> str:
    """A string literal for the statements that take no bound parameter (PREPARE TRANSACTION, COMMIT PREPARED).

    An escape string (E'...') with every backslash and quote doubled means the same text whatever the
    session's standard_conforming_strings: a plain '...' literal does not (with it off, a backslash escapes).
    """
    if "\x00" in value:
        raise ValueError("a PostgreSQL string cannot hold a NUL character")
    return "E'" + value.replace("\\", "\\\\").replace("'", "''") + "'"


def driver_sql(statement: str) -> str:
    """A statement for SQLAlchemy's exec_driver_sql: psycopg2 formats it with (empty) parameters, so '%' doubles."""
    return statement.replace("%", "%%")


def advisory_key(name: str) -> int:
    """A session lock's name as PostgreSQL's 64-bit advisory lock key (stable across processes and versions)."""
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "big", signed=True)


def quote_ident(name: str) -> str:
    """A quoted identifier as the server reads it (its '%' signs single): for a statement run as written or a
    name bound as a value; through SQLAlchemy's text, use the connection's preparer."""
    return str(_PREPARER.quote_identifier(name))


# the PostgreSQL type of an array's elements as the plan's Arrow type names them (by its text: the driver's
# commit path never loads pyarrow): an array column goes through unnest as array text (postgres/arrays.py)
_ELEMENT_TYPES = {
    "int16": "smallint",
    "int32": "integer",
    "int64": "bigint",
    "float": "real",
    "double": "double precision",
    "bool": "boolean",
    "string": "text",
    "large_string": "text",
    "binary": "bytea",
    "large_binary": "bytea",
    "date32[day]": "date",
}


def _element_type(value_type: object) -> str:
    text = str(value_type)
    if text.startswith("timestamp["):
        return "timestamp with time zone" if "tz=" in text else "timestamp without time zone"
    if text.startswith("decimal"):
        return "numeric"
    return _ELEMENT_TYPES[text]


def _selected(plan: TargetPlan) -> str:
    """The select list over unnest's columns: each as is, or cast by the server to its column's type; an array
    column (bound as array text) read as an array of its elements' type first, as Spark's JDBC writer sends it."""
    casts = dict(plan.server_casts)
    out = []
    for field in plan.arrow_schema:
        n = quote_ident(field.name)
        value_type = getattr(field.type, "value_type", None)
        if value_type is not None:
            n = f"CAST({n} AS {_element_type(value_type)}[])"
        out.append(f"CAST({n} AS {casts[field.name]}) AS {quote_ident(field.name)}" if field.name in casts else n)
    return ", ".join(out)


def insert_sql(plan: TargetPlan) -> str:
    """INSERT .. SELECT .. FROM unnest($1..$n): the bulk load of a table whose columns the server casts."""
    names = plan.arrow_schema.names
    table = ".".join(quote_ident(p) for p in (plan.schema, plan.table) if p)
    cols = ", ".join(quote_ident(n) for n in names)
    params = ", ".join(f"${i + 1}" for i in range(len(names)))
    return f"INSERT INTO {table} ({cols}) SELECT {_selected(plan)} FROM unnest({params}) AS u({cols})"


def upsert_sql(plan: TargetPlan) -> str:
    """INSERT .. SELECT DISTINCT ON (keys) .. FROM unnest($1..$n) .. ON CONFLICT (keys) DO UPDATE, quoted by SQLAlchemy.

    One array parameter per column; DISTINCT ON with the ordinality keeps the last row of a key
    (ON CONFLICT DO UPDATE cannot touch a row twice in one statement); later chunks overwrite earlier ones.
    """
    names = plan.arrow_schema.names
    ordinal = "xasink_ord"
    while ordinal in names:
        ordinal += "_"
    table = ".".join(quote_ident(p) for p in (plan.schema, plan.table) if p)
    cols = ", ".join(quote_ident(n) for n in names)
    keys = ", ".join(quote_ident(k) for k in plan.upsert_keys)
    params = ", ".join(f"${i + 1}" for i in range(len(names)))
    updates = ", ".join(f"{quote_ident(n)} = EXCLUDED.{quote_ident(n)}" for n in names if n not in plan.upsert_keys)
    action = f"DO UPDATE SET {updates}" if updates else "DO NOTHING"
    return (
        f"INSERT INTO {table} ({cols}) SELECT DISTINCT ON ({keys}) {_selected(plan)} "
        f"FROM unnest({params}) WITH ORDINALITY AS u({cols}, {quote_ident(ordinal)}) "
        f"ORDER BY {keys}, {quote_ident(ordinal)} DESC ON CONFLICT ({keys}) {action}"
    )
