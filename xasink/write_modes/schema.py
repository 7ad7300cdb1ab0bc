"""Match a DataFrame's Arrow schema to the target table: reflect, create, check, and conform batches.

The plan is made once on the driver (so bad input fails before any branch
opens) and shipped to the executors, which only cast.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa
import sqlalchemy as sa
from sqlalchemy.engine import Connection

from xasink.dialects.base import Dialect
from xasink.dialects.type_text import reflected_columns
from xasink.dialects.values import TargetPlan
from xasink.errors import PreflightError
from xasink.options import WriteOptions


def _kind(t: pa.DataType) -> str:
    if pa.types.is_null(t):
        return "null"
    if pa.types.is_integer(t):
        return "int"
    if pa.types.is_floating(t):
        return "float"
    if pa.types.is_decimal(t):
        return "decimal"
    if pa.types.is_boolean(t):
        return "bool"
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "string"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return "binary"
    if pa.types.is_date(t):
        return "date"
    if pa.types.is_timestamp(t):
        return "timestamp"
    if pa.types.is_list(t) and _kind(t.value_type) not in ("array", "null", "unsupported"):
        return "array"  # one-dimensional arrays of the scalars (PostgreSQL's array columns)
    return "unsupported"


# what a value may become in the tasks (xasink.write_modes.conform), as Spark's JDBC writer converts it; a lossy
# conversion (a fraction into an integer, a time of day into a date) is refused there, value by value
_COMPATIBLE = {
    "int": {"int", "float", "decimal"},
    "float": {"float", "decimal", "int"},
    "decimal": {"decimal", "float", "int"},
    "bool": {"bool"},
    "string": {"string", "binary"},
    "binary": {"binary"},
    "date": {"date", "timestamp"},
    "timestamp": {"timestamp", "date"},
    "array": {"array"},
}


def _compatible(source: pa.DataType, target: pa.DataType) -> bool:
    """Whether a value of ``source`` may be conformed to ``target`` (an array's elements as the scalars)."""
    if _kind(source) == "array" and _kind(target) == "array":
        return _compatible(source.value_type, target.value_type)
    if pa.types.is_fixed_size_binary(target):  # a MariaDB / MySQL BIT(n) column: a boolean or an integer
        return _kind(source) in ("bool", "int")
    return _kind(target) in _COMPATIBLE.get(_kind(source), set())


def _what_to_do(source: pa.DataType, target: pa.DataType) -> str:
    """The advice for a refused pair, where Spark's JDBC writer stores something xasink will not guess
    (docs/types.md lists each)."""
    if _kind(source) in ("date", "timestamp") and _kind(target) in ("string", "binary"):
        return (
            "format it in Spark first (date_format(col, 'yyyy-MM-dd HH:mm:ss'), or a cast to string): Spark's JDBC "
            "writer stores its driver's text of the value in the JVM's time zone, which xasink cannot see"
        )
    if _kind(source) in ("bool", "int", "float", "decimal") and _kind(target) in ("date", "timestamp"):
        return (
            "a number is no date: convert it in Spark first (to_date(col.cast('string'), 'yyyyMMdd'), or "
            "timestamp_seconds)"
        )
    if _kind(source) in ("bool", "int", "float", "decimal") and _kind(target) == "binary":
        return (
            "a number's bytes are not its digits: cast it in Spark to the bytes you mean (col.cast('string') "
            "gives its digits, which Spark's JDBC writer stores: 1 as the byte 0x31)"
        )
    if _kind(source) == "binary" and _kind(target) == "string":
        return (
            "encode it in Spark first (hex(col), base64(col), or decode(col, 'UTF-8') for bytes that are text): "
            "Spark's JDBC writer leaves the bytes to the server, which stores its own text of them (PostgreSQL: "
            "\\x0102, as bytea_output says)"
        )
    return "cast it in Spark first"


def _type_text(conn: Connection, column_type: Any) -> str:
    """A reflected type as the server names it (TIME WITH TIME ZONE, not SQLAlchemy's generic TIME)."""
    try:
        return str(column_type.compile(dialect=conn.dialect))
    except sa.exc.SQLAlchemyError:  # (NullType: a type SQLAlchemy does not know)
        return str(column_type)


def _what_to_do_unwritable(column_type: Any, source: pa.DataType) -> str:
    """The advice for a column type that takes nothing of the DataFrame's type."""
    if isinstance(column_type, sa.Time) and _kind(source) == "timestamp":
        return (
            "format it in Spark first, e.g. date_format(col, 'HH:mm:ss.SSSSSS'): Spark's JDBC writer stores its "
            "time of day and drops the date, which xasink will not do silently"
        )
    return "cast it in Spark first, or write to a column of another type"


def check_source_types(source: pa.Schema) -> None:
    seen: set[str] = set()
    for f in source:
        if _kind(f.type) == "null":
            raise PreflightError(
                f"column '{f.name}' has Spark's NullType (e.g. lit(None)), which has no SQL type: Spark's JDBC "
                f"writer refuses it too (\"Can't get JDBC type for void\"). Cast it to the column's type first, "
                f"e.g. lit(None).cast('int'). Nothing was written."
            )
        if _kind(f.type) == "unsupported":
            raise PreflightError(
                f"column '{f.name}' has type {f.type}, which xasink cannot write; supported: integers, floats, "
                "decimal, boolean, string, binary, date, timestamp, and one-dimensional arrays of them. Convert "
                "it first, e.g. with to_json()."
            )
        if f.name in seen:
            raise PreflightError(f"the DataFrame has two columns named '{f.name}'")
        seen.add(f.name)


def _qualified(options: WriteOptions) -> str:
    return str(options.table)


def create_table(dialect: Dialect, conn: Connection, options: WriteOptions, source: pa.Schema) -> None:
    overrides = {c.lower(): t for c, t in options.create_table_column_types}
    unknown = set(overrides) - {f.name.lower() for f in source}
    if unknown:
        raise PreflightError(f"createTableColumnTypes names columns not in the DataFrame: {sorted(unknown)}")
    cols = []
    for f in source:
        sql_type: sa.types.TypeEngine[Any] | None
        if f.name.lower() in overrides:
            sql_type = dialect.parse_type(overrides[f.name.lower()])
        else:
            sql_type = dialect.sql_type(f.type)
        if sql_type is None:
            raise PreflightError(f"column '{f.name}': no {dialect.name} type for {f.type}")
        key = f.name in options.upsert_key_columns  # an upsert needs a unique key: make it the primary key
        # never AUTO_INCREMENT / SERIAL: the keys are the DataFrame's (MariaDB numbered a key 0 anew)
        cols.append(sa.Column(f.name, sql_type, nullable=f.nullable and not key, primary_key=key, autoincrement=False))
    table = sa.Table(options.table.name, sa.MetaData(schema=options.table.schema), *cols, **dialect.table_kwargs())
    try:
        table.create(conn, checkfirst=True)
        conn.commit()
    except sa.exc.DBAPIError as exc:
        conn.rollback()
        said = str(exc.orig).strip().splitlines()[0]
        if dialect.denied(exc):
            raise PreflightError(
                f"no table {_qualified(options)}, and {_user(options)} may not create it ({said}): "
                "create it (e.g. as the administrator who granted the writer's privileges), or grant the user "
                "CREATE"
            ) from None
        raise PreflightError(f"cannot create table {_qualified(options)}: {said}") from None


def _user(options: WriteOptions) -> str:
    return f"user '{options.url.username}'" if options.url.username else "the URL's user"


def _has_table(dialect: Dialect, conn: Connection, options: WriteOptions) -> bool:
    """Whether the table exists, as far as the user can tell: MariaDB answers a user who holds no privilege on
    a table (a missing one too) 'command denied', never 'no such table'; a table the user cannot see is not
    there for it either."""
    try:
        return sa.inspect(conn).has_table(options.table.name, schema=options.table.schema)
    except sa.exc.DBAPIError as exc:
        conn.rollback()
        if not dialect.denied(exc):
            raise
        return False


def plan_target(dialect: Dialect, conn: Connection, options: WriteOptions, source: pa.Schema) -> TargetPlan:
    """Reflect (creating the table in append mode if allowed) and map every DataFrame column to a table column."""
    check_source_types(source)
    table, schema = options.table.name, options.table.schema
    insp = sa.inspect(conn)
    if schema is not None and schema not in insp.get_schema_names():
        raise PreflightError(f"schema '{schema}' of table {_qualified(options)} does not exist; create it first")
    if not _has_table(dialect, conn, options):
        if not options.create_table:
            raise PreflightError(
                f"no table {_qualified(options)} ({_user(options)} sees none): create it (and grant "
                "the writer INSERT on it), or let xasink create it from the DataFrame schema with createTable=true"
            )
        conn.rollback()
        create_table(dialect, conn, options, source)
        insp = sa.inspect(conn)
    columns = {dialect.reflected_name(c["name"]): c for c in reflected_columns(insp, table, schema)}
    dialect.name_unknown_types(conn, schema, table, columns)
    conn.rollback()
    by_lower: dict[str, list[str]] = {}
    for column_name in columns:
        by_lower.setdefault(column_name.lower(), []).append(column_name)
    fields = []
    server_casts: list[tuple[str, str]] = []
    folded: list[tuple[str, str]] = []
    lowered = [f.name.lower() for f in source]
    twins = tuple(f.name for f in source if lowered.count(f.name.lower()) > 1)
    for f in source:
        name = _matched(f.name, columns, by_lower, options, twins)
        if name != f.name:
            folded.append((f.name, name))
        col = columns[name]
        shown = _type_text(conn, col["type"])  # (for the messages below)
        target = dialect.arrow_type(col, f.type)
        if target is None and _kind(f.type) == "array":
            raise PreflightError(
                f"column '{f.name}': the DataFrame's {f.type} cannot be written to column '{name}' of type "
                f"{shown} in {_qualified(options)}: xasink writes an array only into a PostgreSQL array column "
                "(one dimension) whose elements take the array's; convert it first, e.g. with to_json()"
            )
        if target is None:
            raise PreflightError(
                f"column '{name}' of {_qualified(options)} has type {shown}, into which xasink does not write "
                f"the DataFrame's {f.type} (docs/types.md lists what each column type takes): "
                f"{_what_to_do_unwritable(col['type'], f.type)}"
            )
        if not _compatible(f.type, target):
            raise PreflightError(
                f"column '{f.name}': the DataFrame's {f.type} cannot be written to column '{name}' "
                f"of type {shown} in {_qualified(options)}; {_what_to_do(f.type, target)}"
            )
        fields.append(pa.field(name, target, nullable=True))
        cast = dialect.server_cast(col, f.type, target)
        if cast is not None:
            server_casts.append((name, cast))
    for key in options.upsert_key_columns:
        if key not in [fl.name for fl in fields]:
            raise PreflightError(f"option 'upsertKeyColumns': '{key}' is not a column being written")
    if options.upsert_key_columns:
        check_upsert_key(insp, options, dialect.reflected_name)
    plan = TargetPlan(
        schema,
        table,
        pa.schema(fields),
        tuple(f.name for f in source),
        options.upsert_key_columns,
        server_casts=tuple(server_casts),
        case_folded=tuple(folded),
        case_twins=twins,
    )
    return dialect.check_table(conn, plan)


def _matched(
    name: str, columns: dict[str, Any], by_lower: dict[str, list[str]], options: WriteOptions, twins: tuple[str, ...]
) -> str:
    """The table column a DataFrame column fills: the one spelled exactly, else the only one equal without case.

    (Spark's JDBC writer takes the table's first column equal without case, even where another is spelled
    exactly: docs/types.md lists this difference.)"""
    if name in columns:
        return name
    candidates = by_lower.get(name.lower(), [])
    if name in twins:
        raise PreflightError(
            f"the DataFrame has columns {', '.join(t for t in twins if t.lower() == name.lower())}, whose names "
            f"are equal without case, and '{name}' is not a column of table {_qualified(options)} as spelled; "
            "rename the DataFrame's columns to the table's exactly"
        )
    if len(candidates) == 1:
        return candidates[0]
    if candidates:
        raise PreflightError(
            f"column '{name}' of the DataFrame matches {len(candidates)} columns of table {_qualified(options)} "
            f"without case ({', '.join(candidates)}) and none as spelled; rename it to the one it should fill"
        )
    raise PreflightError(
        f"column '{name}' of the DataFrame is not in table {_qualified(options)} "
        f"(it has: {', '.join(columns)}); add the column or select/rename the DataFrame's"
    )


def check_name_case(plan: TargetPlan, case_sensitive: bool) -> None:
    """In a task, where spark.sql.caseSensitive is known: match names as Spark's JDBC writer does.  Case-sensitive,
    a column spelled otherwise in the table is no match; otherwise two DataFrame columns cannot differ by case."""
    target = f"{plan.schema}.{plan.table}" if plan.schema else plan.table
    if case_sensitive and plan.case_folded:
        ours, theirs = plan.case_folded[0]
        raise PreflightError(
            f"spark.sql.caseSensitive is true, and column '{ours}' of the DataFrame is spelled '{theirs}' in table "
            f"{target}: rename the DataFrame's column, or set spark.sql.caseSensitive=false. Nothing was written."
        )
    if not case_sensitive and plan.case_twins:
        raise PreflightError(
            f"the DataFrame has columns {', '.join(plan.case_twins)}, whose names are equal without case, and "
            "spark.sql.caseSensitive is false: rename them, or set spark.sql.caseSensitive=true. Nothing was written."
        )


def check_upsert_key(insp: sa.Inspector, options: WriteOptions, named: Callable[[str], str] = str) -> None:
    """The upsert keys must be exactly the columns of a primary key or unique index: that is what the merge hits.
    ``named``: a reflected column name as the server spells it (Dialect.reflected_name)."""
    keys = options.upsert_key_columns
    if len(set(keys)) != len(keys):
        raise PreflightError(f"option 'upsertKeyColumns': a column is named twice in {', '.join(keys)}")
    table, schema = options.table.name, options.table.schema
    found: list[str] = []
    pk = insp.get_pk_constraint(table, schema=schema).get("constrained_columns") or []
    candidates: list[tuple[str, list[Any]]] = [("PRIMARY KEY", pk)] if pk else []
    candidates += [("UNIQUE", u["column_names"]) for u in insp.get_unique_constraints(table, schema=schema)]
    for ix in insp.get_indexes(table, schema=schema):
        partial = any(k.endswith("_where") and v is not None for k, v in ix.get("dialect_options", {}).items())
        if ix.get("unique") and not partial and None not in ix["column_names"]:
            candidates.append(("UNIQUE INDEX", ix["column_names"]))
    for kind, columns in candidates:
        columns = [named(c) if isinstance(c, str) else c for c in columns]
        if set(columns) == set(keys):
            return
        found.append(f"{kind} ({', '.join(str(c) for c in columns)})")
    have = f"it has {'; '.join(dict.fromkeys(found))}" if found else "it has none"
    raise PreflightError(
        f"option 'upsertKeyColumns' ({', '.join(keys)}): table {_qualified(options)} has no primary key or unique "
        f"index on exactly these columns ({have}), and the merge needs one to find the existing row. Add one, e.g. "
        f"CREATE UNIQUE INDEX ON {_qualified(options)} ({', '.join(keys)}), or name the columns of an existing key."
    )
