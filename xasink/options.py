"""User options, parsed and validated once into a frozen value.

Names follow Spark's JDBC writer so that ``format("jdbc")`` becomes
``format("xasink")`` with nothing else changed.  Keys are case-insensitive.
Every check runs before any work starts and names the offending option.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from sqlalchemy.engine import URL

from xasink.database_url import parse_url
from xasink.dialects.values import BranchSettings
from xasink.errors import OptionError
from xasink.protocol.xid import MAX_BATCH_ID, MAX_SINK_ID, valid_sink_id
from xasink.support.masking import display_url

# Spark JDBC options accepted for drop-in compatibility but without effect here.
IGNORED = {
    "driver",
    "isolationlevel",
    "sessioninitstatement",
    "querytimeout",
    "checkpointlocation",
    "path",
    "queryname",
    "createtableoptions",
    "truncate",  # an overwrite never drops the table: its rows are replaced in one transaction (write-modes.md)
}
REJECTED = {
    "query": "'query' is a read option; name the target table with 'dbtable'",
}
MODES = ("append", "overwrite")
_IDENT_MAX = 63


@dataclass(frozen=True)
class TableName:
    """A possibly schema-qualified table name, as the database will see it (no quoting)."""

    name: str
    schema: str | None = None

    def __str__(self) -> str:
        return f"{self.schema}.{self.name}" if self.schema else self.name


@dataclass(frozen=True)
class WriteOptions:
    """Everything a write needs, validated.  ``url`` carries the password; the repr shows it masked."""

    url: URL
    table: TableName
    sink_id: str
    sink_id_given: bool
    batch_id: int
    num_partitions: int | None = None
    create_table_column_types: tuple[tuple[str, str], ...] = ()
    create_table: bool = True
    batch_size: int = 10_000
    journal_schema: str | None = None
    journal_prefix: str = "xasink_"
    commit_parallelism: int = 4
    # deprecated: when set, also caps the retries of each branch's COMMIT (the old few-second budget)
    commit_retries: int | None = None
    # seconds the coordinator keeps finishing a decided batch (commits, the mark) through transient errors
    commit_timeout: int = 300
    journal_retention: int = 1000
    upsert_key_columns: tuple[str, ...] = ()
    local_infile: bool = True
    lock_timeout: int = 60  # seconds a branch waits for a row lock; bounds a wait on a prepared branch
    control_lock_timeout: int = 60  # seconds a control connection (decide, commit, sweep) waits for a lock
    mode: str = "append"  # Spark's save mode: "overwrite" replaces the table's rows (or replaceWhere's) at commit
    replace_where: str | None = None  # overwrite only the rows matching this SQL predicate (the job author's SQL)
    replace_where_check: bool = True  # a batch row outside replaceWhere fails the batch
    delete_flag_column: str | None = None  # change-data apply: a true flag deletes the row's key (not written)
    sequence_column: str | None = None  # change-data apply: the newest change of a key wins, older ones are ignored
    # "branch": each branch's rows are visible as its COMMIT lands; "batch": readers see none or all of the
    # batch (it goes through the shadow and reaches the table in one transaction, as the write modes do)
    visibility: str = "branch"
    extra: Mapping[str, str] = field(default_factory=dict, repr=False)

    @property
    def backend(self) -> str:
        return self.url.get_backend_name()

    @property
    def branch_settings(self) -> BranchSettings:
        return BranchSettings(self.lock_timeout, self.batch_size, self.local_infile, self.control_lock_timeout)

    @property
    def control_pool_size(self) -> int:
        """The driver's connections to a database: the commit's parallel COMMITs, and its journal steps."""
        return self.commit_parallelism + 2

    @property
    def change_data(self) -> bool:
        """Change-data apply: rows are changes of keys (deletes, ordered by a sequence), not new rows."""
        return self.delete_flag_column is not None or self.sequence_column is not None

    @property
    def applies_at_commit(self) -> bool:
        """Rows go through the shadow table and reach the target in one local transaction at commit."""
        return self.mode == "overwrite" or self.change_data or self.visibility == "batch"

    def with_mode(self, mode: str) -> WriteOptions:
        """The options under Spark's save mode (the writer learns it from Spark, not from an option)."""
        return check_mode(replace(self, mode=mode))

    def with_batch(self, batch_id: int) -> WriteOptions:
        return replace(self, batch_id=batch_id)

    def __repr__(self) -> str:
        shown = (
            f"{f.name}={display_url(self.url) if f.name == 'url' else repr(getattr(self, f.name))}"
            for f in fields(self)
            if f.repr
        )
        return f"WriteOptions({', '.join(shown)})"


_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
_QUOTED_PART = re.compile(r'"((?:[^"]|"")+)"|`((?:[^`]|``)+)`|([^."`]+)')


def parse_table(raw: str, backend: str) -> TableName:
    """Split ``schema.table`` (parts may be quoted with "" or ``); fold unquoted names as the database does."""
    text = raw.strip()
    parts: list[str] = []
    pos = 0
    while True:
        m = _QUOTED_PART.match(text, pos)
        if m is None:
            raise OptionError(
                f"option 'dbtable': cannot parse {raw[:80]!r}; use table or schema.table "
                '(quote parts containing dots with "double quotes")'
            )
        if m.group(1) is not None:
            part = m.group(1).replace('""', '"')
        elif m.group(2) is not None:
            part = m.group(2).replace("``", "`")
        else:
            part = m.group(3).strip()
            if backend == "postgresql":
                part = part.translate(_ASCII_LOWER)  # PostgreSQL folds only ASCII letters
        if not part or "\x00" in part or len(part.encode()) > _IDENT_MAX:
            raise OptionError(
                f"option 'dbtable': invalid name part {part[:80]!r} (empty, NUL or over {_IDENT_MAX} bytes)"
            )
        parts.append(part)
        pos = m.end()
        if pos == len(text):
            break
        if text[pos] != ".":
            raise OptionError(f"option 'dbtable': unexpected {text[pos]!r} in {raw[:80]!r}")
        pos += 1
    if len(parts) > 2:
        raise OptionError(f"option 'dbtable': {raw[:80]!r} has more than two parts; use schema.table")
    return TableName(parts[-1], parts[0] if len(parts) == 2 else None)


def _int(opts: Mapping[str, str], key: str, name: str, default: int | None, lo: int, hi: int) -> int | None:
    raw = opts.get(key)
    if raw is None or str(raw).strip() == "":
        return default
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise OptionError(f"option '{name}': expected an integer, got {str(raw)[:40]!r}") from None
    if not lo <= value <= hi:
        raise OptionError(f"option '{name}': {value} is out of range [{lo}, {hi}]")
    return value


def _bool(opts: Mapping[str, str], key: str, name: str, default: bool) -> bool:
    raw = opts.get(key)
    if raw is None:
        return default
    text = str(raw).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise OptionError(f"option '{name}': expected true or false, got {str(raw)[:40]!r}")


def _split_top_level(raw: str) -> list[str]:
    """Split on commas outside quotes and parentheses: "NUMERIC(10, 2)" and a quoted "a,b" stay whole."""
    items: list[str] = []
    buf: list[str] = []
    quote, depth = "", 0
    for ch in raw:
        if quote:
            quote = "" if ch == quote else quote  # a doubled quote closes and reopens
        elif ch in '"`':
            quote = ch
        elif ch in "()":
            depth += 1 if ch == "(" else -1
        elif ch == "," and depth == 0:
            items.append("".join(buf))
            buf = []
            continue
        buf.append(ch)
    items.append("".join(buf))
    return items


def _column_types(raw: str | None) -> tuple[tuple[str, str], ...]:
    """Parse ``createTableColumnTypes`` ("id BIGINT, name VARCHAR(64)") into (column, type) pairs."""
    if not raw:
        return ()
    out: list[tuple[str, str]] = []
    for item in _split_top_level(raw):
        m = re.fullmatch(r'\s*("(?:[^"]|"")+"|`(?:[^`]|``)+`|[A-Za-z_][A-Za-z0-9_$]*)\s+(.+?)\s*', item)
        if m is None:
            raise OptionError(
                f"option 'createTableColumnTypes': cannot parse {item.strip()[:80]!r}; "
                "expected 'column TYPE, column TYPE'"
            )
        col = m.group(1)
        if col[0] in '"`':
            col = col[1:-1].replace(col[0] * 2, col[0])
        out.append((col, m.group(2)))
    for col, typ in out:
        if not re.fullmatch(r"[A-Za-z][A-Za-z0-9 ]*(\(\s*\d+\s*(,\s*\d+\s*)?\))?", typ):
            raise OptionError(
                f"option 'createTableColumnTypes': type {typ[:80]!r} of column {col[:80]!r} is not a plain SQL "
                "type name such as BIGINT, VARCHAR(64) or NUMERIC(12,2)"
            )
    return tuple(out)


KNOWN = {
    "url": "url",
    "dbtable": "dbtable",
    "user": "user",
    "password": "password",
    "sinkid": "sinkId",
    "batchid": "batchId",
    "numpartitions": "numPartitions",
    "createtablecolumntypes": "createTableColumnTypes",
    "batchsize": "batchsize",
    "journalschema": "journalSchema",
    "journaltableprefix": "journalTablePrefix",
    "commitparallelism": "commitParallelism",
    "commitretries": "commitRetries",
    "committimeout": "commitTimeout",
    "journalretention": "journalRetention",
    "locktimeout": "lockTimeout",
    "controllocktimeout": "controlLockTimeout",
    "createtable": "createTable",
    "upsertkeycolumns": "upsertKeyColumns",
    "localinfile": "localInfile",
    "replacewhere": "replaceWhere",
    "replacewherecheck": "replaceWhereCheck",
    "deleteflagcolumn": "deleteFlagColumn",
    "sequencecolumn": "sequenceColumn",
    "cascadetruncate": "cascadeTruncate",
    "visibility": "visibility",
}
VISIBILITIES = ("branch", "batch")


def parse_options(raw: Mapping[str, Any], *, streaming: bool = False) -> WriteOptions:
    """Validate user options (keys in any case).  Raises :class:`OptionError` naming the option."""
    opts: dict[str, str] = {}
    for key, value in raw.items():
        low = str(key).lower()
        if low in REJECTED:
            raise OptionError(f"option '{key}': {REJECTED[low]}")
        if low not in KNOWN and low not in IGNORED:
            hint = ", ".join(sorted(KNOWN.values()))
            raise OptionError(f"unknown option '{key}'; xasink accepts: {hint}")
        if value is not None:
            opts[low] = str(value)
    if "url" not in opts:
        raise OptionError("option 'url' is required, e.g. jdbc:postgresql://host:5432/db")
    if "dbtable" not in opts:
        raise OptionError("option 'dbtable' is required: the target table, e.g. public.orders")
    url = parse_url(opts["url"], opts.get("user"), opts.get("password"))
    table = parse_table(opts["dbtable"], url.get_backend_name())

    sink_raw = opts.get("sinkid")
    if sink_raw is None:
        if streaming:
            raise OptionError(
                "option 'sinkId' is required for streaming: a stable name for this query, "
                "e.g. .option('sinkId', 'orders-stream')"
            )
        sink_id, sink_given = "w" + uuid.uuid4().hex[:16], False
    else:
        sink_id, sink_given = sink_raw.strip(), True
        if not valid_sink_id(sink_id):
            raise OptionError(
                f"option 'sinkId': {sink_raw[:60]!r} is invalid; use 1 to {MAX_SINK_ID} characters "
                "from A-Z a-z 0-9 _ . -"
            )
    batch_id = _int(opts, "batchid", "batchId", 0, 0, MAX_BATCH_ID)
    if streaming and "batchid" in opts:
        raise OptionError("option 'batchId' cannot be set for streaming: Spark's micro-batch id is used")
    keys = tuple(k.strip() for k in opts.get("upsertkeycolumns", "").split(",") if k.strip())
    journal_schema = opts.get("journalschema") or None
    prefix = opts.get("journaltableprefix", "xasink_")
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,40}", prefix):
        raise OptionError("option 'journalTablePrefix': use up to 41 letters, digits and underscores")
    if journal_schema is not None and (len(journal_schema.encode()) > _IDENT_MAX or "\x00" in journal_schema):
        raise OptionError("option 'journalSchema': invalid schema name")
    if _bool(opts, "cascadetruncate", "cascadeTruncate", False):
        raise OptionError(
            "option 'cascadeTruncate': xasink's overwrite replaces the rows of the target table only, in one "
            "transaction; it never empties other tables. Delete the referencing rows in your job, or give the "
            "foreign keys ON DELETE CASCADE"
        )
    flag = _column_option(opts, "deleteflagcolumn", "deleteFlagColumn")
    sequence = _column_option(opts, "sequencecolumn", "sequenceColumn")
    if (flag or sequence) and not keys:
        raise OptionError(
            f"option '{'deleteFlagColumn' if flag else 'sequenceColumn'}' applies changes by key: set "
            "'upsertKeyColumns' to the table's key columns too"
        )
    if flag is not None and (flag in keys or flag == sequence):
        raise OptionError(f"option 'deleteFlagColumn': '{flag}' is also a key or the sequence column")
    replace_where = opts.get("replacewhere")
    if replace_where is not None and not replace_where.strip():
        replace_where = None
    visibility = opts.get("visibility", "branch").strip().lower() or "branch"
    if visibility not in VISIBILITIES:
        raise OptionError(
            f"option 'visibility': {opts['visibility'][:40]!r} is not one of 'branch' (each branch's rows "
            "visible as it commits, the default) or 'batch' (readers see none or all of the batch)"
        )
    return WriteOptions(
        url=url,
        table=table,
        sink_id=sink_id,
        sink_id_given=sink_given,
        batch_id=batch_id or 0,
        num_partitions=_int(opts, "numpartitions", "numPartitions", None, 1, 100_000),
        create_table_column_types=_column_types(opts.get("createtablecolumntypes")),
        create_table=_bool(opts, "createtable", "createTable", True),
        batch_size=_int(opts, "batchsize", "batchsize", 10_000, 1, 10_000_000) or 10_000,
        journal_schema=journal_schema,
        journal_prefix=prefix,
        commit_parallelism=_int(opts, "commitparallelism", "commitParallelism", 4, 1, 64) or 4,
        commit_retries=_int(opts, "commitretries", "commitRetries", None, 0, 100),
        commit_timeout=_int(opts, "committimeout", "commitTimeout", 300, 0, 86_400) or 0,
        journal_retention=_int(opts, "journalretention", "journalRetention", 1000, 1, 10**9) or 1000,
        upsert_key_columns=keys,
        local_infile=_bool(opts, "localinfile", "localInfile", True),
        lock_timeout=_int(opts, "locktimeout", "lockTimeout", 60, 0, 86_400) or 0,
        control_lock_timeout=_int(opts, "controllocktimeout", "controlLockTimeout", 60, 0, 86_400) or 0,
        replace_where=replace_where,
        replace_where_check=_bool(opts, "replacewherecheck", "replaceWhereCheck", True),
        delete_flag_column=flag,
        sequence_column=sequence,
        visibility=visibility,
    )


def _column_option(opts: Mapping[str, str], key: str, name: str) -> str | None:
    value = opts.get(key, "").strip()
    if not value:
        return None
    if "," in value:
        raise OptionError(f"option '{name}': name one column, not a list ({value[:60]!r})")
    return value


def check_mode(options: WriteOptions) -> WriteOptions:
    """The options that only make sense together: refused before any work starts."""
    if options.mode not in MODES:
        raise OptionError(f"save mode '{options.mode}' is not supported; use 'append' or 'overwrite'")
    if options.replace_where is not None and options.mode != "overwrite":
        raise OptionError(
            "option 'replaceWhere' replaces the rows matching it: use it with mode('overwrite') "
            "(in xasink.write / foreach_batch: mode='overwrite')"
        )
    if options.mode == "overwrite" and options.upsert_key_columns:
        raise OptionError(
            "option 'upsertKeyColumns' merges rows into the table, mode('overwrite') replaces them: use one "
            "(for change-data apply with deletes: mode('append') with deleteFlagColumn)"
        )
    return options
