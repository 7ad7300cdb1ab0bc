"""Type mapping between Arrow (Spark's rows) and MySQL columns: reflection, CREATE TABLE and the
createTableColumnTypes option."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import sqlalchemy as sa
from sqlalchemy.dialects import mysql

from xasink.dialects.mysql.sql import SA_DIALECT
from xasink.dialects.type_text import parse_type_text


def arrow_type(column: Any, source: pa.DataType) -> pa.DataType | None:
    t = column["type"]
    unsigned = bool(getattr(t, "unsigned", False))
    if pa.types.is_list(source):  # no array type (Spark's JDBC writer refuses them too)
        return None
    if isinstance(t, mysql.BIT):  # a boolean or an integer as the column's bytes (big-endian), as its value
        if pa.types.is_boolean(source) or pa.types.is_integer(source):
            return pa.binary(((t.length or 1) + 7) // 8)  # (fixed-size: only a BIT column takes this type)
        return None
    if pa.types.is_string(source) and not isinstance(t, sa.types._Binary):
        # a number, a DATETIME, a TIME, a YEAR...: the server's reading of the string, as of the string Spark's
        # JDBC writer sends (LOAD DATA reads every field as text; an INSERT's quoted literal is that string)
        return pa.string()
    if isinstance(t, mysql.TINYINT):  # BOOLEAN is TINYINT(1): it takes booleans, and small integers
        if pa.types.is_boolean(source):
            return pa.bool_()
        return pa.uint8() if unsigned else pa.int8()
    if isinstance(t, sa.Boolean):
        return pa.bool_()
    if pa.types.is_boolean(source) and isinstance(t, (sa.Integer, sa.Numeric, sa.Float)):
        return source  # 1 or 0, as the server stores the boolean Spark's JDBC writer sends (PostgreSQL refuses it)
    if isinstance(t, sa.SmallInteger):
        return pa.uint16() if unsigned else pa.int16()
    if isinstance(t, sa.BigInteger):
        return pa.uint64() if unsigned else pa.int64()
    if isinstance(t, sa.Integer):  # INT, MEDIUMINT
        return pa.uint32() if unsigned else pa.int32()
    if isinstance(t, mysql.YEAR):
        return pa.int16()
    # a number of another kind goes as its own text: the server converts and rounds it, as it does the
    # literal Spark's JDBC writer sends (a decimal's exact digits, a double's shortest digits)
    numeric = isinstance(t, (sa.Numeric, sa.Float))  # DECIMAL, DOUBLE, FLOAT (Float is no Numeric in SQLAlchemy 2.1)
    if numeric and (pa.types.is_floating(source) or pa.types.is_decimal(source)):
        return source
    if isinstance(t, mysql.FLOAT):
        return pa.float32()
    if isinstance(t, sa.Float):  # DOUBLE, REAL
        return pa.float64()
    if isinstance(t, sa.Numeric):
        precision = t.precision if t.precision is not None else 10
        return pa.decimal128(precision, t.scale or 0) if precision <= 38 else pa.decimal256(precision, t.scale or 0)
    if isinstance(t, sa.String) and not isinstance(t, (sa.Enum, mysql.SET)):
        if pa.types.is_integer(source) or pa.types.is_decimal(source) or pa.types.is_boolean(source):
            return source  # its text, as the server stores the literal Spark's JDBC writer sends (true is 1)
        if pa.types.is_binary(source) or pa.types.is_large_binary(source):
            return pa.binary()  # the bytes, which the server reads in the column's character set, as JDBC's
    if isinstance(t, (sa.String, sa.JSON)):  # CHAR, VARCHAR, *TEXT, ENUM, SET, JSON
        return pa.string()
    if isinstance(t, sa.types._Binary):  # BINARY, VARBINARY, *BLOB
        return pa.binary()
    if isinstance(t, sa.DateTime):  # DATETIME, TIMESTAMP: as Spark's JDBC writer, an instant's session wall time
        return pa.timestamp("us")
    if isinstance(t, sa.Date):  # (a string went as text above)
        return pa.date32()
    return None


def server_cast(column: Any, source: pa.DataType) -> str | None:
    """YEAR takes a number as Spark's JDBC writer sends it: LOAD DATA reads its field as text, and the text '0'
    is the year 2000 where the number 0 is 0000 (1 to 99 read alike either way); the load casts it back.  A
    string stays text, as JDBC sends it."""
    return "SIGNED" if isinstance(column["type"], mysql.YEAR) and not pa.types.is_string(source) else None


def sql_type(arrow_type: pa.DataType) -> sa.types.TypeEngine[Any] | None:
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
        return mysql.DATETIME(fsp=6)  # a tz-aware timestamp is stored as its wall time in the session zone
    return None


_ALIASES = {
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
}


def _build(cls: Any, name: str, args: list[int], unsigned: bool) -> sa.types.TypeEngine[Any]:
    if name in ("datetime", "timestamp", "time"):
        return cls(fsp=args[0] if args else None)  # type: ignore[no-any-return]
    return cls(*args, **({"unsigned": True} if unsigned else {}))  # type: ignore[no-any-return]


def parse_type(text: str) -> sa.types.TypeEngine[Any]:
    return parse_type_text(text, "MySQL", SA_DIALECT.ischema_names, _ALIASES, _build, unsigned=(sa.Integer, sa.Numeric))
