"""Every supported Spark type reaches the database exactly, nulls included; unsupported types fail before writing.

The round trips (into a table xasink creates, and into an existing one) run on PostgreSQL and MariaDB
(``db``).  What a dialect stores each Spark type as is in :data:`CREATED_TYPES`, how a value reads back
there in :func:`stored`, and what a dialect cannot hold at all is left out of its round trip and listed,
with the reason, in :data:`SKIPPED`.  The remaining tests are PostgreSQL-only.
"""

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

from tests.targets import MARIADB, POSTGRESQL, Target

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

# the column types a table created by xasink gets (PostgreSQL: format_type; MariaDB: COLUMN_TYPE)
CREATED_TYPES = {
    POSTGRESQL: {
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
    },
    MARIADB: {
        "id": "int(11)",
        "b": "tinyint(4)",
        "s": "smallint(6)",
        "i": "int(11)",
        "l": "bigint(20)",
        "f": "float",
        "d": "double",
        "dec1": "decimal(10,2)",
        "dec2": "decimal(38,18)",
        "bo": "tinyint(1)",  # BOOLEAN
        "st": "longtext",
        "bi": "longblob",
        "da": "date",
        "ts": "datetime(6)",  # no time zone: the instant is stored as its UTC wall time
        "tn": "datetime(6)",
    },
}

# what a dialect cannot store, left out of its round trip (the rest must come back exactly), and why
NON_FINITE = "NaN and infinite floats"
SKIPPED: dict[str, dict[str, str]] = {
    POSTGRESQL: {},
    MARIADB: {
        NON_FINITE: "MariaDB's FLOAT and DOUBLE have no NaN or infinity; xasink refuses such a value with a clear "
        "error before anything is visible (test_mysql_dialect.py::test_nan_is_refused_clearly). Those cells "
        "are NULL in MariaDB's copy of the rows",
    },
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


def rows_for(kind: str) -> list[tuple[Any, ...]]:
    """ROWS without what the dialect cannot store (:data:`SKIPPED`)."""
    if NON_FINITE not in SKIPPED[kind]:
        return ROWS
    return [tuple(None if isinstance(v, float) and not math.isfinite(v) else v for v in row) for row in ROWS]


def stored(kind: str, column: str, value: Any) -> Any:
    """The value a dialect gives back for ``value`` written to ``column``."""
    if kind == MARIADB and value is not None:
        if column == "bo":
            return int(value)  # BOOLEAN is TINYINT(1)
        if column == "ts":
            return value.astimezone(UTC).replace(tzinfo=None)  # DATETIME: the UTC wall time, naive
    return value


def _f32(x: float) -> float:
    return float(struct.unpack("f", struct.pack("f", x))[0])


def _same(column: str, got: Any, want: Any) -> bool:
    if want is None or got is None:
        return got is None and want is None
    if isinstance(want, float):
        if math.isnan(want):
            return isinstance(got, float) and math.isnan(got)
        if column == "f":  # a float32 column, read back as a double: the same float32 value
            return _f32(got) == _f32(want)
        return bool(got == want)
    if isinstance(want, Decimal):
        return isinstance(got, Decimal) and got == want
    if isinstance(want, bytes):
        return bytes(got) == want
    if isinstance(want, datetime):
        return type(got) is datetime and (got.tzinfo is None) == (want.tzinfo is None) and got == want
    return type(got) is type(want) and got == want


def read_rows(db: Target, table: str) -> list[tuple[Any, ...]]:
    """Every row by id; MariaDB's FLOAT read as DOUBLE (its text form shows only 6 digits of a float32)."""
    with db.connect() as conn, conn.cursor() as cur:
        if db.kind == POSTGRESQL:
            cur.execute("SET TIME ZONE 'UTC'")
        columns = [
            f"CAST({db.q(name)} AS DOUBLE) AS {db.q(name)}" if db.kind == MARIADB and typ == "float" else db.q(name)
            for name, typ in db.column_types(table).items()
        ]
        cur.execute(f"SELECT {', '.join(columns)} FROM {db.q(table)} ORDER BY id")
        return [tuple(r) for r in cur.fetchall()]


def assert_rows_exact(db: Target, table: str, want: list[tuple[Any, ...]], columns: list[str]) -> None:
    got = read_rows(db, table)
    assert len(got) == len(want), f"{len(got)} rows, expected {len(want)}"
    for g, w in zip(got, want, strict=True):
        for name, gv, wv in zip(columns, g, w, strict=True):
            wv = stored(db.kind, name, wv)
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


def test_all_types_into_a_created_table(spark: SparkSession, db: Target) -> None:
    table = db.new_table()
    df = spark.createDataFrame(rows_for(db.kind), SCHEMA).repartition(3)
    save(spark, df, db.url, table)
    assert db.column_types(table) == CREATED_TYPES[db.kind]
    assert db.not_null_columns(table) == ["id"]  # Spark's nullability is kept
    assert_rows_exact(db, table, rows_for(db.kind), [f.name for f in SCHEMA.fields])
    assert db.prepared() == []


def test_all_types_into_an_existing_table(spark: SparkSession, db: Target) -> None:
    table = db.new_table()
    # columns in another order than the DataFrame's, plus one the DataFrame does not have
    ddl = ", ".join(f"{db.q(name)} {typ}" for name, typ in CREATED_TYPES[db.kind].items())
    db.create_table(table, f"extra text DEFAULT 'dflt', {ddl}")
    df = spark.createDataFrame(rows_for(db.kind), SCHEMA).repartition(3)
    # MariaDB: the multi-row INSERT path here, LOAD DATA LOCAL into the created table above
    save(spark, df, db.url, table, createTable="false", **({"localInfile": "false"} if db.kind == MARIADB else {}))
    want = [("dflt", *row) for row in rows_for(db.kind)]
    assert_rows_exact(db, table, want, ["extra", *[f.name for f in SCHEMA.fields]])
    assert db.prepared() == []


def test_create_table_column_types_are_honoured(spark: SparkSession, typed_df: Any, pg: Target) -> None:
    table = pg.new_table()
    save(
        spark,
        typed_df.where("id NOT IN (2, 3)").select("id", "st", "dec1", "l"),  # 2, 3: strings over 64 chars
        pg.url,
        table,
        createTableColumnTypes="ST VARCHAR(64), dec1 NUMERIC(12, 2), l int8",
    )
    assert pg.column_types(table) == {
        "id": "integer",
        "st": "character varying(64)",
        "dec1": "numeric(12,2)",
        "l": "bigint",
    }
    assert read_rows(pg, table) == [(r[0], r[10], r[7], r[4]) for r in ROWS if r[0] not in (2, 3)]


def test_too_long_string_for_varchar_fails_atomically(spark: SparkSession, typed_df: Any, pg: Target) -> None:
    table = pg.new_table()
    with pytest.raises(Exception, match="longer than its column allows"):
        save(spark, typed_df.select("id", "st"), pg.url, table, createTableColumnTypes="st VARCHAR(64)")
    assert read_rows(pg, table) == []  # created, but not one row of the batch
    assert pg.prepared() == []


@pytest.mark.parametrize(
    ("name", "make_type", "value"),
    [
        ("m", lambda: MapType(StringType(), IntegerType()), {"a": 1}),
        ("st", lambda: StructType([StructField("x", IntegerType())]), (1,)),
        ("arr", lambda: ArrayType(ArrayType(IntegerType())), [[1, 2]]),  # (one dimension is written)
    ],
)
def test_unsupported_types_fail_before_any_write(
    spark: SparkSession, pg: Target, name: str, make_type: Callable[[], DataType], value: Any
) -> None:
    table = pg.new_table()
    schema = StructType([StructField("id", IntegerType()), StructField(name, make_type())])
    df = spark.createDataFrame([(1, value), (2, None)], schema)
    with pytest.raises(Exception) as info:
        save(spark, df, pg.url, table)
    msg = str(info.value)
    assert "PreflightError" in msg
    assert f"column '{name}'" in msg and "cannot write" in msg
    assert not pg.table_exists(table)  # not even the table was created
    assert pg.prepared() == []


@pytest.mark.parametrize("upsert", [False, True], ids=["append", "upsert"])
def test_columns_of_user_defined_domain_types_load_as_their_base_types(
    spark: SparkSession, typed_df: Any, pg: Target, upsert: bool
) -> None:
    """Branches resolve types from ADBC's built-in table (not the server's catalogue): a column whose type
    the server defines (a domain, with its own OID and check) still loads, by COPY and by upsert."""
    table, tag = pg.new_table(), uuid.uuid4().hex[:8]
    code, amount = f"code_{tag}", f"amount_{tag}"
    pg.execute(f"CREATE DOMAIN {code} AS varchar(80) CHECK (VALUE <> 'forbidden')")
    pg.execute(f"CREATE DOMAIN {amount} AS numeric(10,2) CHECK (VALUE > -100000000)")
    try:
        pg.create_table(table, f"id integer PRIMARY KEY, st {code}, dec1 {amount}")
        df = typed_df.where("id NOT IN (2, 3)").select("id", "st", "dec1")  # 2, 3: strings over 80 characters
        save(spark, df, pg.url, table, createTable="false", **({"upsertKeyColumns": "id"} if upsert else {}))
        assert read_rows(pg, table) == [(r[0], r[10], r[7]) for r in ROWS if r[0] not in (2, 3)]
        assert pg.prepared() == []
    finally:
        pg.drop_table(table)
        pg.execute(f"DROP DOMAIN {code}, {amount}")


# zone ids Spark takes as spark.sql.session.timeZone (Java's, with ZoneId.SHORT_IDS): those it reads as
# Asia/Kolkata's UTC+05:30, of which Arrow reads none of the prefixed ones and PostgreSQL reads GMT+05:30 POSIX's
# way, as UTC-05:30; and short ids, which Arrow and PostgreSQL do not know (PST: Los Angeles, in its summer time)
KOLKATA = ("Asia/Kolkata", datetime(2024, 1, 15, 2, 0, 0, 123456, tzinfo=timezone.utc), "2024-01-15 07:30:00.123456")
LOS_ANGELES = (
    "America/Los_Angeles",
    datetime(2024, 7, 15, 2, 0, 0, 123456, tzinfo=timezone.utc),
    "2024-07-14 19:00:00.123456",
)
ZONE_SPELLINGS = {
    **{s: KOLKATA for s in ("+05:30", "GMT+05:30", "UTC+5:30", "UT+05:30", "IST")},
    "PST": LOS_ANGELES,
}


@pytest.mark.parametrize("spelling", list(ZONE_SPELLINGS))
def test_a_session_zone_spelled_as_a_java_offset_converts_as_the_region_of_that_offset(
    spark: SparkSession, db: Target, spelling: str
) -> None:
    """A session zone of the offset form (GMT+05:30) stores what Asia/Kolkata (the same offset, no DST) stores,
    and a TimestampType's wall time is Spark's own in that zone; it was refused ("Cannot locate or parse
    timezone 'GMT+05:30'"), found by a new user's review of docs/types.md.  So do Java's short ids (IST, PST)."""
    region, ts, expected_wall = ZONE_SPELLINGS[spelling]
    schema = StructType(
        [
            StructField("id", IntegerType()),
            StructField("ts", TimestampType()),
            StructField("ntz", TimestampNTZType()),
            StructField("d", DateType()),
        ]
    )
    rows = [(0, ts, datetime(2024, 1, 15, 10, 0), date(2024, 1, 15)), (1, None, None, None)]
    wall, instant = ("timestamp", "timestamptz") if db.kind == POSTGRESQL else ("datetime(6)", "timestamp(6) NULL")
    columns = f"id int PRIMARY KEY, ts {wall}, ntz {instant}, d {instant}"
    text = (
        "ts::text, ntz AT TIME ZONE 'UTC', d AT TIME ZONE 'UTC'"
        if db.kind == POSTGRESQL
        else "CAST(ts AS CHAR), CAST(UNIX_TIMESTAMP(ntz) AS CHAR), CAST(UNIX_TIMESTAMP(d) AS CHAR)"
    )
    stored = {}
    before = str(spark.conf.get("spark.sql.session.timeZone"))
    try:
        for zone in (region, spelling):
            spark.conf.set("spark.sql.session.timeZone", zone)
            table = db.new_table()
            db.create_table(table, columns)
            df = spark.createDataFrame(rows, schema)
            save(spark, df, db.url, table, createTable="false")
            stored[zone] = db.execute(f"SELECT id, {text} FROM {db.q(table)} ORDER BY id")
            first = df.where("id = 0").selectExpr("date_format(ts, 'yyyy-MM-dd HH:mm:ss.SSSSSS')").first()
            wall_time = first[0] if first is not None else None
            assert str(stored[zone][0][1]) == wall_time == expected_wall, (zone, stored[zone])
    finally:
        spark.conf.set("spark.sql.session.timeZone", before)
    assert stored[spelling] == stored[region]
    assert db.prepared() == []


def test_a_refused_column_is_named_by_its_server_type(spark: SparkSession, pg: Target) -> None:
    """A timestamp into timetz is refused (JDBC keeps the time of day, dropping the date: docs/types.md), naming
    the column's type as the server does, not SQLAlchemy's generic TIME (a new user's review)."""
    table = pg.new_table()
    pg.create_table(table, "id int, t timetz")
    df = spark.createDataFrame([(1, datetime(2024, 1, 15, 10, 0, tzinfo=UTC))], "id int, t timestamp")
    with pytest.raises(Exception, match="has type TIME WITH TIME ZONE") as info:
        save(spark, df, pg.url, table, createTable="false")
    assert "date_format" in str(info.value)
    assert pg.rows(table) == [] and pg.prepared() == []


@pytest.mark.parametrize("year", [2024, 2040, 2100])
def test_summer_times_after_2037_convert_by_the_zones_rule(spark: SparkSession, db: Target, year: int) -> None:
    """In a zone with daylight saving time, a summer's wall time (and on PostgreSQL, the instant of a
    TimestampNTZType or DateType) is Spark's own in every year.  Arrow reads the system's zone files without the
    rule for the years after 2037 (the TZif footer) and kept standard time all year: 2040-07-01 12:00 New York
    was stored as 11:00 (found by an adversary's review).  (MariaDB's TIMESTAMP takes a wall time in the
    server's zone from both writers: docs/types.md.)"""
    ts = datetime(year, 7, 1, 16, 0, 0, 123456, tzinfo=timezone.utc)  # 12:00 EDT
    fields = [StructField("id", IntegerType()), StructField("ts", TimestampType())]
    row: tuple[Any, ...] = (0, ts)
    columns, read = "id int PRIMARY KEY, ts datetime(6)", "CAST(ts AS CHAR(26))"
    if db.kind == POSTGRESQL:
        fields += [StructField("ntz", TimestampNTZType()), StructField("d", DateType())]
        row += (datetime(year, 7, 1, 12, 0), date(year, 7, 1))
        columns = "id int PRIMARY KEY, ts timestamp, ntz timestamptz, d timestamptz"
        read = "ts::text, extract(epoch FROM ntz)::bigint, extract(epoch FROM d)::bigint"
    before = str(spark.conf.get("spark.sql.session.timeZone"))
    try:
        spark.conf.set("spark.sql.session.timeZone", "America/New_York")
        table = db.new_table()
        db.create_table(table, columns)
        df = spark.createDataFrame([row, (1,) + (None,) * (len(row) - 1)], StructType(fields))
        save(spark, df, db.url, table, createTable="false")
        stored = db.execute(f"SELECT {read} FROM {db.q(table)} WHERE id = 0")
        own = ["date_format(ts, 'yyyy-MM-dd HH:mm:ss.SSSSSS')"]
        if db.kind == POSTGRESQL:
            own += ["unix_seconds(CAST(ntz AS TIMESTAMP))", "unix_seconds(CAST(d AS TIMESTAMP))"]
        first = df.where("id = 0").selectExpr(*own).first()
        assert first is not None
    finally:
        spark.conf.set("spark.sql.session.timeZone", before)
    assert first[0] == f"{year}-07-01 12:00:00.123456"
    assert [tuple(str(v) for v in r) for r in stored] == [tuple(str(v) for v in first)]
    if db.kind == POSTGRESQL:
        assert int(first[1]) - int(first[2]) == 12 * 3600  # (Spark's: noon and midnight of one EDT day)
    assert db.prepared() == []
