"""Every supported Spark type reaches PostgreSQL exactly, nulls included; unsupported types fail before writing."""

from __future__ import annotations

import math
import struct
import uuid
from collections.abc import Callable
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import pytest
from pyspark.sql import SparkSession
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from tests.dbutil import connect, prepared_gids

UTC = timezone.utc

SCHEMA = StructType(
    [
        StructField("id", IntegerType(), nullable=False),
        StructField("b", ByteType()),
        StructField("s", ShortType()),
        StructField("i", IntegerType()),
        StructField("l", LongType()),
        StructField("f", FloatType()),
        StructField("d", DoubleType()),
        StructField("dec1", DecimalType(10, 2)),
        StructField("dec2", DecimalType(38, 18)),
        StructField("bo", BooleanType()),
        StructField("st", StringType()),
        StructField("bi", BinaryType()),
        StructField("da", DateType()),
        StructField("ts", TimestampType()),
        StructField("tn", TimestampNTZType()),
    ]
)

# the column types a table created by xasink gets (format_type)
CREATED_TYPES = {
    "id": "integer",
    "b": "smallint",
    "s": "smallint",
    "i": "integer",
    "l": "bigint",
    "f": "real",
    "d": "double precision",
    "dec1": "numeric(10,2)",
    "dec2": "numeric(38,18)",
    "bo": "boolean",
    "st": "text",
    "bi": "bytea",
    "da": "date",
    "ts": "timestamp with time zone",
    "tn": "timestamp without time zone",
}

F32_MAX = struct.unpack("f", struct.pack("f", 3.4028234663852886e38))[0]

ROWS: list[tuple[Any, ...]] = [
    (
        1,
        -128,
        -32768,
        -(2**31),
        -(2**63),
        F32_MAX,
        1.7976931348623157e308,
        Decimal("-99999999.99"),
        Decimal("-99999999999999999999.999999999999999999"),
        False,
        "",
        b"",
        date(1, 1, 1),
        datetime(1, 1, 1, tzinfo=UTC),
        datetime(1, 1, 1),
    ),
    (
        2,
        127,
        32767,
        2**31 - 1,
        2**63 - 1,
        -1.5,
        2.2250738585072014e-308,
        Decimal("99999999.99"),
        Decimal("12345678901234567890.123456789012345678"),
        True,
        "quote ' double \" tab\t nl\n cr\r\n backslash \\ \\N \\\\. ünïcödé 表 😀",
        b"\x00\x01\x00\xff\\\n",
        date(9999, 12, 31),
        datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
        datetime(9999, 12, 31, 23, 59, 59, 999999),
    ),
    (
        3,
        0,
        0,
        0,
        0,
        float("nan"),
        float("nan"),
        Decimal("0.00"),
        Decimal("0E-18"),
        True,
        "x" * 5000,
        bytes(range(256)) * 4,
        date(1970, 1, 1),
        datetime(1970, 1, 1, tzinfo=UTC),
        datetime(1970, 1, 1),
    ),
    (
        4,
        1,
        -1,
        7,
        -7,
        float("inf"),
        float("-inf"),
        Decimal("0.01"),
        Decimal("0.000000000000000001"),
        False,
        "NULL",
        b"\x00",
        date(1582, 10, 10),  # inside the Julian/Gregorian gap: proleptic Gregorian on both sides
        datetime(2024, 2, 29, 12, 30, 45, 123456, tzinfo=timezone(timedelta(hours=5, minutes=30))),
        datetime(2024, 2, 29, 12, 30, 45, 123456),
    ),
    (
        5,
        -1,
        1,
        -7,
        7,
        float("-inf"),
        float("inf"),
        Decimal("-0.01"),
        Decimal("-1.5"),
        True,
        " leading and trailing ",
        b"\xde\xad\xbe\xef",
        date(2000, 2, 29),
        datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
        datetime(1969, 12, 31, 23, 59, 59, 999999),
    ),
    (6, *([None] * (len(SCHEMA.fields) - 1))),
]


def _f32(x: float) -> float:
    return float(struct.unpack("f", struct.pack("f", x))[0])


def _same(column: str, got: Any, want: Any) -> bool:
    if want is None or got is None:
        return got is None and want is None
    if isinstance(want, float):
        if math.isnan(want):
            return isinstance(got, float) and math.isnan(got)
        if column == "f":  # real: PostgreSQL prints the shortest text that reads back as the same float32
            return _f32(got) == _f32(want)
        return bool(got == want)
    if isinstance(want, Decimal):
        return isinstance(got, Decimal) and got == want
    if isinstance(want, bytes):
        return bytes(got) == want
    if isinstance(want, datetime):
        return type(got) is datetime and (got.tzinfo is None) == (want.tzinfo is None) and got == want
    return type(got) is type(want) and got == want


def read_rows(url: str, table: str) -> list[tuple[Any, ...]]:
    with connect(url) as conn, conn.cursor() as cur:
        cur.execute("SET TIME ZONE 'UTC'")
        cur.execute(f'SELECT * FROM "{table}" ORDER BY id')
        return list(cur.fetchall())


def column_types(url: str, table: str) -> dict[str, str]:
    with connect(url) as conn, conn.cursor() as cur:
        cur.execute(
            "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute "
            "WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped",
            (f'"{table}"',),
        )
        return dict(cur.fetchall())


def assert_rows_exact(url: str, table: str, want: list[tuple[Any, ...]], columns: list[str]) -> None:
    got = read_rows(url, table)
    assert len(got) == len(want), f"{len(got)} rows, expected {len(want)}"
    for g, w in zip(got, want, strict=True):
        for name, gv, wv in zip(columns, g, w, strict=True):
            assert _same(name, gv, wv), f"row {w[0]} column {name}: got {gv!r}, expected {wv!r}"


def save(spark: SparkSession, df: Any, url: str, table: str, **options: str) -> None:
    writer = df.write.format("xasink").option("url", url).option("dbtable", table)
    writer = writer.option("sinkId", f"types-{uuid.uuid4().hex[:8]}")
    for key, value in options.items():
        writer = writer.option(key, value)
    writer.mode("append").save()


@pytest.fixture
def typed_df(spark: SparkSession) -> Any:
    return spark.createDataFrame(ROWS, SCHEMA).repartition(3)


def test_all_types_into_a_created_table(spark: SparkSession, typed_df: Any, pg_url: str, fresh_table_name: str) -> None:
    save(spark, typed_df, pg_url, fresh_table_name)
    assert column_types(pg_url, fresh_table_name) == CREATED_TYPES
    with connect(pg_url) as conn, conn.cursor() as cur:
        cur.execute(
            "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0 AND attnotnull",
            (fresh_table_name,),
        )
        assert [r[0] for r in cur.fetchall()] == ["id"]  # Spark's nullability is kept
    assert_rows_exact(pg_url, fresh_table_name, ROWS, [f.name for f in SCHEMA.fields])
    assert prepared_gids(pg_url, prefix="xasink:") == []


def test_all_types_into_an_existing_table(
    spark: SparkSession, typed_df: Any, pg_url: str, fresh_table_name: str
) -> None:
    ddl = ", ".join(f'"{name}" {typ}' for name, typ in CREATED_TYPES.items())
    with connect(pg_url) as conn, conn.cursor() as cur:
        # columns in another order than the DataFrame's, plus one the DataFrame does not have
        cur.execute(f"CREATE TABLE \"{fresh_table_name}\" (extra text DEFAULT 'dflt', {ddl})")
    save(spark, typed_df, pg_url, fresh_table_name, createTable="false")
    want = [("dflt", *row) for row in ROWS]
    assert_rows_exact(pg_url, fresh_table_name, want, ["extra", *[f.name for f in SCHEMA.fields]])
    assert prepared_gids(pg_url, prefix="xasink:") == []


def test_create_table_column_types_are_honoured(
    spark: SparkSession, typed_df: Any, pg_url: str, fresh_table_name: str
) -> None:
    save(
        spark,
        typed_df.where("id NOT IN (2, 3)").select("id", "st", "dec1", "l"),  # 2, 3: strings over 64 chars
        pg_url,
        fresh_table_name,
        createTableColumnTypes="ST VARCHAR(64), dec1 NUMERIC(12, 2), l int8",
    )
    assert column_types(pg_url, fresh_table_name) == {
        "id": "integer",
        "st": "character varying(64)",
        "dec1": "numeric(12,2)",
        "l": "bigint",
    }
    assert read_rows(pg_url, fresh_table_name) == [(r[0], r[10], r[7], r[4]) for r in ROWS if r[0] not in (2, 3)]


def test_too_long_string_for_varchar_fails_atomically(
    spark: SparkSession, typed_df: Any, pg_url: str, fresh_table_name: str
) -> None:
    with pytest.raises(Exception, match="longer than its column allows"):
        save(spark, typed_df.select("id", "st"), pg_url, fresh_table_name, createTableColumnTypes="st VARCHAR(64)")
    assert read_rows(pg_url, fresh_table_name) == []  # created, but not one row of the batch
    assert prepared_gids(pg_url, prefix="xasink:") == []


@pytest.mark.parametrize(
    ("name", "make_type", "value"),
    [
        ("m", lambda: MapType(StringType(), IntegerType()), {"a": 1}),
        ("st", lambda: StructType([StructField("x", IntegerType())]), (1,)),
        ("arr", lambda: ArrayType(IntegerType()), [1, 2]),
    ],
)
def test_unsupported_types_fail_before_any_write(
    spark: SparkSession, pg_url: str, fresh_table_name: str, name: str, make_type: Callable[[], DataType], value: Any
) -> None:
    schema = StructType([StructField("id", IntegerType()), StructField(name, make_type())])
    df = spark.createDataFrame([(1, value), (2, None)], schema)
    with pytest.raises(Exception) as info:
        save(spark, df, pg_url, fresh_table_name)
    msg = str(info.value)
    assert "PreflightError" in msg
    assert f"column '{name}'" in msg and "cannot write" in msg
    with connect(pg_url) as conn, conn.cursor() as cur:
        cur.execute("SELECT to_regclass(%s)", (fresh_table_name,))
        assert cur.fetchone() == (None,)  # not even the table was created
    assert prepared_gids(pg_url, prefix="xasink:") == []
