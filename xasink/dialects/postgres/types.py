"""Type mapping between Arrow (Spark's rows) and PostgreSQL columns: reflection, CREATE TABLE, the
createTableColumnTypes option and the casts left to the server."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg

from xasink.dialects.postgres.sql import SA_DIALECT
from xasink.dialects.type_text import ServerType, parse_type_text

if TYPE_CHECKING:  # rows and types only: the driver's commit path never loads pyarrow
    import pyarrow as pa


class PostgresTypes:
    """The dialect's type mapping (a base of :class:`PostgresDialect`); pyarrow is imported on first use."""

    def name_unknown_types(self, conn: Any, schema: str | None, table: str, columns: dict[str, Any]) -> None:
        unknown = {name for name, col in columns.items() if isinstance(col["type"], sa.types.NullType)}
        if not unknown:
            return
        relation = conn.dialect.identifier_preparer.format_table(sa.table(table, schema=schema))
        found = conn.execute(
            sa.text(
                "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute "
                "WHERE attrelid = CAST(:relation AS regclass) AND attnum > 0 AND NOT attisdropped"
            ),
            {"relation": relation},
        )
        for name, type_name in found:
            if name in unknown:
                columns[name] = {**columns[name], "type": ServerType(type_name)}

    def arrow_type(self, column: Any, source: pa.DataType) -> pa.DataType | None:
        import pyarrow as pa

        t = column["type"]
        while isinstance(t, pg.DOMAIN):  # a domain loads as its base type; the server checks its constraint
            t = t.data_type
        if isinstance(t, sa.ARRAY):  # a list into an array column: its elements as into a column of their type
            if not pa.types.is_list(source) or t.dimensions not in (None, 1):
                return None if pa.types.is_list(source) else self._other(t, source)
            element = self.arrow_type({"type": t.item_type}, source.value_type)
            return None if element is None else pa.list_(element)
        if pa.types.is_list(source):
            return None
        text_column = isinstance(t, sa.String) and not isinstance(t, sa.Enum)
        if pa.types.is_string(source) and not text_column:  # a date, an integer, jsonb, an enum...: the
            return self._other(t, source)  # server's reading of the string, as JDBC's with stringtype=unspecified
        if text_column and _number_or_boolean(source):
            return source  # its text is the server's cast of the value, as of what Spark's JDBC writer sends
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
        return self._other(t, source)

    @staticmethod
    def _other(t: Any, source: pa.DataType) -> pa.DataType | None:
        import pyarrow as pa

        if (pa.types.is_string(source) or pa.types.is_large_string(source)) and not isinstance(t, sa.types.NullType):
            return pa.string()  # jsonb, uuid, inet, an enum, an array...: the server's input function reads it
        return None

    def server_cast(self, column: Any, source: pa.DataType, target: pa.DataType) -> str | None:
        """A double or a decimal of another precision into numeric: the server's cast (float8 to numeric keeps 15
        significant digits, then rounds half away from zero to the column's scale; a decimal keeps its display
        scale in an unconstrained numeric), which no Arrow cast reproduces."""
        import pyarrow as pa

        t = column["type"]
        while isinstance(t, pg.DOMAIN):
            t = t.data_type
        if isinstance(t, sa.ARRAY) and pa.types.is_list(target):  # cast as a whole where its elements need it
            element = self.server_cast({"type": t.item_type}, source.value_type, target.value_type)
            return None if element is None else str(t.compile(dialect=SA_DIALECT))
        text_column = isinstance(t, sa.String) and not isinstance(t, sa.Enum)
        if text_column and _number_or_boolean(target):  # cast to text; a varchar(n) too long refuses it then
            return "TEXT"
        if pa.types.is_string(target) and not text_column and not isinstance(t, sa.types.NullType):
            # a string into a column of another type (jsonb, uuid, inet, an enum): the server converts it, as it
            # does what Spark's JDBC writer sends with stringtype=unspecified
            return str(t.compile(dialect=SA_DIALECT))
        if not isinstance(t, sa.Numeric) or isinstance(t, sa.Float):
            return None
        if pa.types.is_floating(target):
            return str(t.compile(dialect=SA_DIALECT))
        if pa.types.is_decimal(target) and (t.precision, t.scale or 0) != (target.precision, target.scale):
            return str(t.compile(dialect=SA_DIALECT))  # an unconstrained numeric too: its precision is None
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
        if pa.types.is_list(t):  # as Spark's JDBC writer: an array of the elements' type (INTEGER[])
            element = self.sql_type(t.value_type)
            return None if element is None or pa.types.is_list(t.value_type) else pg.ARRAY(element)
        return None

    def parse_type(self, text: str) -> sa.types.TypeEngine[Any]:
        return parse_type_text(text, "PostgreSQL", SA_DIALECT.ischema_names, _ALIASES, _build)


def _number_or_boolean(t: pa.DataType) -> bool:
    import pyarrow as pa

    return bool(pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t) or pa.types.is_boolean(t))


_ALIASES = {
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
}


def _build(cls: Any, name: str, args: list[int], unsigned: bool) -> sa.types.TypeEngine[Any]:
    return cls(*args)  # type: ignore[no-any-return]
