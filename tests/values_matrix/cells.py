"""The matrix's cells (issue 38): Spark type x column type x edge value x write path x zone, and column features.

A cell is one value of one Spark type into one column type of one database, written by one path with the
Spark session zone equal to the JVM's (``same``) or not (``other``); a feature cell is a column that fills
itself (a default, a generated or identity column, a trigger reading the session).  A cell's id spells it
whole (``pg:int:smallint:max:bulk:same``, ``mariadb:feature:auto-zero:upsert:same``), so an id replays it
alone; a seed picks a sample of the product and its order, deterministically.
"""

from __future__ import annotations

import functools
import random
import zlib
from dataclasses import dataclass
from datetime import date, datetime, timezone
from decimal import Decimal
from typing import Any

import pyarrow as pa

from tests.targets import MARIADB, POSTGRESQL
from tests.values_harness import PATHS

UTC = timezone.utc
# the session zone: the JVM's (America/New_York) set explicitly, another, or never set (Spark's default)
ZONES: dict[str, dict[str, str | None]] = {
    "same": {},
    "other": {"spark.sql.session.timeZone": "Asia/Kolkata"},
    "unset": {"spark.sql.session.timeZone": None},
}
DBS = {"pg": POSTGRESQL, "mariadb": MARIADB}


def _ts(
    year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0, microsecond: int = 0
) -> datetime:
    return datetime(year, month, day, hour, minute, second, microsecond, tzinfo=UTC)


_INSTANTS = {
    "epoch": _ts(1970, 1, 1),
    "micros": _ts(2026, 1, 15, 12, 0, 0, 123456),
    "dst-gap": _ts(2026, 3, 8, 7, 0),  # 03:00 EDT, just after New York's gap
    "dst-overlap": _ts(2026, 11, 1, 6, 30),  # 01:30 EST, the overlap's second pass
    "lmt-1850": _ts(1850, 1, 1, 12, 0),  # before 1883: New York on local mean time
    "gap-1582": _ts(1582, 10, 10, 12, 0),  # in the Julian-Gregorian gap
    "y2038": _ts(2038, 1, 19, 3, 14, 8),  # one second past MariaDB's TIMESTAMP
    "far-min": _ts(1, 1, 1),
    "far-max": _ts(9999, 12, 31, 23, 59, 59, 999999),
}
_WALL = {
    "epoch": datetime(1970, 1, 1),
    "micros": datetime(2026, 1, 15, 12, 0, 0, 123456),
    "dst-gap": datetime(2026, 3, 8, 2, 30),  # no such wall time in New York
    "dst-overlap": datetime(2026, 11, 1, 1, 30),  # two instants in New York
    "gap-1582": datetime(1582, 10, 10, 12, 0),
    "far-min": datetime(1, 1, 1),
    "far-max": datetime(9999, 12, 31, 23, 59, 59, 999999),
}


@dataclass(frozen=True)
class SparkType:
    """A Spark type as the Parquet file the driver reads spells it, and its edge values by name."""

    arrow: pa.DataType
    edges: dict[str, Any]
    null_type: bool = False  # Spark's NullType: selected as ``NULL AS c``


def _ints(bits: int) -> dict[str, Any]:
    return {"min": -(2 ** (bits - 1)), "max": 2 ** (bits - 1) - 1, "zero": 0, "one": 1, "null": None}


_FLOATS: dict[str, float | None] = {
    "zero": 0.0,
    "neg-zero": -0.0,
    "tenth": 0.1,
    "nan": float("nan"),
    "inf": float("inf"),
}
_FLOATS |= {"-inf": float("-inf"), "null": None}
SPARK: dict[str, SparkType] = {
    "bool": SparkType(pa.bool_(), {"true": True, "false": False, "null": None}),
    "byte": SparkType(pa.int8(), _ints(8)),
    "short": SparkType(pa.int16(), _ints(16)),
    "int": SparkType(pa.int32(), _ints(32)),
    "long": SparkType(pa.int64(), _ints(64)),
    "float": SparkType(
        pa.float32(), {**_FLOATS, "max": 3.4028234663852886e38, "subnormal": 1.401298464324817e-45, "e20": 1e20}
    ),
    "double": SparkType(
        pa.float64(),
        {**_FLOATS, "max": 1.7976931348623157e308, "subnormal": 5e-324, "tie": 2.675, "e39": 1e39, "e-50": 1e-50},
    ),
    "dec10_2": SparkType(
        pa.decimal128(10, 2),
        {
            "max": Decimal("99999999.99"),
            "min": Decimal("-99999999.99"),
            "zero": Decimal("0.00"),
            "cent": Decimal("0.01"),
            "tie": Decimal("2.65"),
            "null": None,
        },
    ),
    "dec38_18": SparkType(
        pa.decimal128(38, 18),
        {
            "max": Decimal("99999999999999999999.999999999999999999"),
            "tiny": Decimal("0.000000000000000001"),
            "zero": Decimal("0E-18"),
            "null": None,
        },
    ),
    "dec38_0": SparkType(
        pa.decimal128(38, 0),
        {"max": Decimal("9" * 38), "min": Decimal("-" + "9" * 38), "one": Decimal(1), "null": None},
    ),
    "string": SparkType(
        pa.string(),
        {
            "empty": "",
            "ascii": "abc",
            "astral": "\U0001f600\U0001d11e",
            "nul": "a\x00b",
            "digits": "42",
            "date": "2024-01-15",
            "json": '{"b": 1, "a": [1, 2]}',
            "uuid": "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
            "inet": "192.168.0.1/24",
            "label": "a",
            "long": "x" * 300,
            "null": None,
        },
    ),
    "binary": SparkType(pa.binary(), {"empty": b"", "bytes": b"\x00\xff\x01", "long": b"\xab" * 300, "null": None}),
    "date": SparkType(
        pa.date32(),
        {
            "epoch": date(1970, 1, 1),
            "today": date(2024, 1, 15),
            "dst-gap": date(2026, 3, 8),
            "gap-1582": date(1582, 10, 10),
            "far-min": date(1, 1, 1),
            "far-max": date(9999, 12, 31),
            "null": None,
        },
    ),
    "ts": SparkType(pa.timestamp("us", "UTC"), {**_INSTANTS, "null": None}),
    "ntz": SparkType(pa.timestamp("us"), {**_WALL, "null": None}),
    "ints": SparkType(pa.list_(pa.int32()), {"two": [1, 2], "empty": [], "inner-null": [None, 3], "null": None}),
    "strings": SparkType(pa.list_(pa.string()), {"two": ["a", "b"], "empty": [], "quote": ['"{,}\\'], "null": None}),
    "void": SparkType(pa.int32(), {"null": None}, null_type=True),
}


@dataclass(frozen=True)
class Column:
    """A column type: its DDL, and how its stored value is read as text (for both tables alike)."""

    ddl: str
    read: str = "text"  # text | hex


PG_COLUMNS: dict[str, Column] = {
    "smallint": Column("smallint"),
    "integer": Column("integer"),
    "bigint": Column("bigint"),
    "numeric": Column("numeric"),
    "numeric10_2": Column("numeric(10,2)"),
    "real": Column("real"),
    "double": Column("double precision"),
    "text": Column("text"),
    "varchar10": Column("varchar(10)"),
    "char5": Column("char(5)"),
    "bytea": Column("bytea"),
    "date": Column("date"),
    "timestamp": Column("timestamp"),
    "timestamptz": Column("timestamptz"),
    "boolean": Column("boolean"),
    "jsonb": Column("jsonb"),
    "uuid": Column("uuid"),
    "inet": Column("inet"),
    "enum": Column("xasink_matrix_enum"),
    "int[]": Column("integer[]"),
    "text[]": Column("text[]"),
}
PG_SETUP = [
    "DO $$ BEGIN CREATE TYPE xasink_matrix_enum AS ENUM ('a', 'b'); EXCEPTION WHEN duplicate_object THEN NULL; END $$",
    "CREATE OR REPLACE FUNCTION xasink_matrix_zone() RETURNS trigger LANGUAGE plpgsql AS "
    "$$ BEGIN NEW.z := current_setting('TimeZone') || ' ' || localtimestamp(0)::date::text; RETURN NEW; END $$",
]
MARIA_COLUMNS: dict[str, Column] = {
    "tinyint": Column("tinyint"),
    "tinyint-u": Column("tinyint unsigned"),
    "smallint": Column("smallint"),
    "smallint-u": Column("smallint unsigned"),
    "int": Column("int"),
    "int-u": Column("int unsigned"),
    "bigint": Column("bigint"),
    "bigint-u": Column("bigint unsigned"),
    "decimal10_2": Column("decimal(10,2)"),
    "decimal65_30": Column("decimal(65,30)"),
    "float": Column("float"),
    "double": Column("double"),
    "bit1": Column("bit(1)", "hex"),
    "bit8": Column("bit(8)", "hex"),
    "char5": Column("char(5)"),
    "varchar10": Column("varchar(10)"),
    "text": Column("text"),
    "binary4": Column("binary(4)", "hex"),
    "varbinary8": Column("varbinary(8)", "hex"),
    "blob": Column("blob", "hex"),
    "date": Column("date"),
    "datetime": Column("datetime"),
    "datetime3": Column("datetime(3)"),
    "datetime6": Column("datetime(6)"),
    "timestamp": Column("timestamp NULL"),
    "timestamp6": Column("timestamp(6) NULL"),
    "year": Column("year"),
    "time": Column("time"),
    "json": Column("json"),
    "enum": Column("enum('a','b')"),
    "set": Column("set('a','b')"),
}
COLUMNS = {"pg": PG_COLUMNS, "mariadb": MARIA_COLUMNS}
SETUP = {"pg": PG_SETUP, "mariadb": []}


@dataclass(frozen=True)
class Feature:
    """A column that fills itself: the table's columns besides ``id``, the frame's, and statements per table."""

    columns: str
    data: dict[str, tuple[Any, pa.DataType]]  # one row: column -> (value, type)
    after_create: tuple[str, ...] = ()


_V = {"v": (5, pa.int32())}
FEATURES: dict[str, dict[str, Feature]] = {
    "pg": {
        "default": Feature("v int, d int DEFAULT 7, s text DEFAULT 'x'", _V),
        "zone-default": Feature("v int, z text DEFAULT current_setting('TimeZone')", _V),
        "local-default": Feature("v int, l text DEFAULT (timestamptz '2026-01-15 12:00+00')::text", _V),
        "generated": Feature("v int, g int GENERATED ALWAYS AS (v * 2) STORED", _V),
        "generated-given": Feature("v int, g int GENERATED ALWAYS AS (v * 2) STORED", {**_V, "g": (10, pa.int32())}),
        "identity": Feature("v int, n int GENERATED BY DEFAULT AS IDENTITY", _V),
        "identity-always": Feature("v int, n int GENERATED ALWAYS AS IDENTITY", {**_V, "n": (9, pa.int32())}),
        "trigger-zone": Feature(
            "v int, z text",
            _V,
            ("CREATE TRIGGER zone BEFORE INSERT ON {table} FOR EACH ROW EXECUTE FUNCTION xasink_matrix_zone()",),
        ),
    },
    "mariadb": {
        "default": Feature("v int, d int DEFAULT 7, s varchar(5) DEFAULT 'x'", _V),
        "generated": Feature("v int, g int AS (v * 2) VIRTUAL", _V),
        "generated-given": Feature("v int, g int AS (v * 2) PERSISTENT", {**_V, "g": (10, pa.int32())}),
        "auto": Feature("v int, n int NOT NULL AUTO_INCREMENT, UNIQUE KEY (n)", _V),
        "auto-zero": Feature("v int, n int NOT NULL AUTO_INCREMENT, UNIQUE KEY (n)", {**_V, "n": (0, pa.int32())}),
        "auto-null": Feature("v int, n int NULL AUTO_INCREMENT, UNIQUE KEY (n)", {**_V, "n": (None, pa.int32())}),
        "trigger-zone": Feature(
            "v int, z varchar(64)",
            _V,
            ("CREATE TRIGGER {trigger} BEFORE INSERT ON {table} FOR EACH ROW SET NEW.z = @@session.time_zone",),
        ),
    },
}


@dataclass(frozen=True)
class Cell:
    """One cell of the matrix; ``spark`` is ``feature`` for a feature cell, ``column`` then names the feature."""

    db: str
    spark: str
    column: str
    edge: str
    path: str
    zone: str

    @property
    def id(self) -> str:
        return ":".join((self.db, self.spark, self.column, self.edge, self.path, self.zone))

    @classmethod
    def parse(cls, cell_id: str) -> Cell:
        db, spark, column, edge, path, zone = cell_id.split(":")
        cell = cls(db, spark, column, edge, path, zone)
        assert cell in _cells_of(db), f"no such cell: {cell_id}"  # noqa: B101 - a typo in a replay line
        return cell

    @property
    def feature(self) -> Feature | None:
        return FEATURES[self.db][self.column] if self.spark == "feature" else None

    @property
    def value(self) -> Any:
        return SPARK[self.spark].edges[self.edge]


def _zones(spark: str, column: str) -> tuple[str, ...]:
    """Zones that can change the cell: a temporal type on either side (and PostgreSQL text from a zone)."""
    temporal = spark in ("date", "ts", "ntz", "string") or any(word in column for word in ("date", "time", "year"))
    return tuple(ZONES) if temporal else ("same",)


def product(db: str) -> list[Cell]:
    """Every cell of one database (``pg`` or ``mariadb``), in a fixed order."""
    cells = [
        Cell(db, spark, column, edge, path, zone)
        for spark, st in SPARK.items()
        for column in COLUMNS[db]
        for edge in st.edges
        for path in PATHS
        for zone in _zones(spark, column)
    ]
    cells += [Cell(db, "feature", name, "-", path, zone) for name in FEATURES[db] for path in PATHS for zone in ZONES]
    return cells


def sample(db: str, seed: int, size: int | None) -> list[Cell]:
    """``size`` cells of :func:`product` drawn by ``seed`` (all of them for None), in the seed's order."""
    cells = product(db)
    rng = random.Random(f"{db}:{seed}")
    if size is None or size >= len(cells):
        rng.shuffle(cells)
        return cells
    return rng.sample(cells, size)


@functools.cache
def _cells_of(db: str) -> frozenset[Cell]:
    return frozenset(product(db))


def shard(db: str, index: int, count: int) -> list[Cell]:
    """Shard ``index`` of ``count`` of :func:`product`: every cell of the pairs (Spark type, column type) whose
    stable hash falls in it, so that a shard writes a pair's edges, paths and zones in the dense batches of
    :class:`tests.values_matrix.run.Matrix` (a random sample of the same size takes several times the writes).
    The ``count`` shards together are the whole product, each cell in one."""
    assert 0 <= index < count, f"no shard {index} of {count}"  # noqa: B101 - a typo in XASINK_MATRIX_SHARD
    return [c for c in product(db) if zlib.crc32(f"{c.spark}|{c.column}".encode()) % count == index]
