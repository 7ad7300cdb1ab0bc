"""Every cell xasink stores is the one Spark's JDBC writer stores in the same existing column (DESIGN.md "Values").

One DataFrame goes through both writers into twin tables (tests/values_driver.py: its own Spark driver, with
the session time zone and the JVM's America/New_York and the JDBC drivers on the class path), and the two
tables are compared cell by cell with the plain driver.  Where Spark's JDBC writer breaks Spark's own
semantics, xasink keeps the semantics: those cells are listed in :data:`DOCUMENTED` (and in docs/types.md).
The property test draws random values; ``XASINK_VALUES_EXAMPLES`` sets how many examples (default 4).
"""

from __future__ import annotations

import math
import os
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.targets import MARIADB, POSTGRESQL, Target
from tests.values_harness import ValuesDriver, assert_stored_alike, differences, write_both

pytestmark = pytest.mark.spark

TZ = "America/New_York"
EXAMPLES = int(os.environ.get("XASINK_VALUES_EXAMPLES", "4"))
UTC = timezone.utc


# --------------------------------------------------------------------------- 1. timestamps

# 2026 in New York: clocks jump 02:00 -> 03:00 on March 8 and fall back 02:00 -> 01:00 on November 1
INSTANTS = [
    datetime(2026, 7, 1, 12, 0, tzinfo=UTC),  # 08:00 EDT
    datetime(2026, 1, 15, 12, 0, 0, 123456, tzinfo=UTC),  # 07:00 EST
    datetime(2026, 3, 8, 6, 59, 59, 999999, tzinfo=UTC),  # 01:59:59.999999 EST, just before the gap
    datetime(2026, 3, 8, 7, 0, tzinfo=UTC),  # 03:00 EDT, just after it
    datetime(2026, 11, 1, 5, 30, tzinfo=UTC),  # 01:30 EDT, first pass through the overlap
    datetime(2026, 11, 1, 6, 30, tzinfo=UTC),  # 01:30 EST, second pass
    datetime(1970, 1, 2, 0, 0, 0, 500000, tzinfo=UTC),
    datetime(2038, 1, 19, 3, 14, 7, tzinfo=UTC),  # the last second MariaDB's TIMESTAMP holds
]
WALL_TIMES = [
    datetime(2026, 7, 1, 12, 0),
    datetime(2026, 1, 15, 12, 0, 0, 123456),
    datetime(2026, 3, 8, 1, 59, 59, 999999),
    datetime(2026, 3, 8, 2, 30),  # in the gap: no such wall time in New York
    datetime(2026, 3, 8, 3, 0),
    datetime(2026, 11, 1, 1, 30),  # in the overlap: two instants have this wall time
    datetime(2026, 11, 1, 0, 59, 59),
    datetime(2026, 11, 1, 2, 0),
]
TIMESTAMP_COLUMNS = {
    POSTGRESQL: "id int PRIMARY KEY, ts_plain timestamp(6), ts_tz timestamptz, ntz_plain timestamp(6), "
    "ntz_tz timestamptz",
    MARIADB: "id int PRIMARY KEY, ts_plain DATETIME(6), ts_tz TIMESTAMP(6) NULL, ntz_plain DATETIME(6), "
    "ntz_tz TIMESTAMP(6) NULL",
}
# Spark's JDBC writer turns a TimestampNTZType into a java.sql.Timestamp in the JVM's zone: a wall time in the
# gap comes out an hour later, one in the overlap takes the later instant (Spark's cast: the earlier), and
# MariaDB gets it shifted by the session's offset.  xasink keeps Spark's semantics there (docs/types.md): these
# are the cells where the two differ, by id
GAP, OVERLAP = 3, 5
DOCUMENTED = {
    (POSTGRESQL, "ntz_plain"): {GAP},
    (POSTGRESQL, "ntz_tz"): {OVERLAP},
    (MARIADB, "ntz_plain"): set(range(len(WALL_TIMES))),
    (MARIADB, "ntz_tz"): set(range(len(WALL_TIMES))),
}


def spark_semantics(kind: str, column: str, wall: datetime | None) -> datetime | None:
    """What a TimestampNTZType cell holds by Spark's rules: its wall time, or (PostgreSQL timestamptz) the
    instant of that wall time in the session zone (zoneinfo's fold=0 is Spark's rule in gaps and overlaps)."""
    if wall is None or kind == MARIADB or column == "ntz_plain":
        return wall
    return wall.replace(tzinfo=ZoneInfo(TZ)).astimezone(UTC)


def timestamps_table() -> pa.Table:
    instants = pa.array(INSTANTS + [None], pa.timestamp("us", tz="UTC"))
    walls = pa.array(WALL_TIMES + [None], pa.timestamp("us"))
    ids = pa.array(range(len(INSTANTS) + 1), pa.int32())
    return pa.table({"id": ids, "ts_plain": instants, "ts_tz": instants, "ntz_plain": walls, "ntz_tz": walls})


@pytest.mark.parametrize("path", ["bulk", "upsert"])
def test_timestamps_are_stored_as_spark_jdbc_stores_them(
    values_driver: ValuesDriver, db: Target, tmp_path: Path, path: str
) -> None:
    data = timestamps_table()
    jdbc, ours = write_both(values_driver, db, TIMESTAMP_COLUMNS[db.kind], data, tmp_path, path).rows()
    names = data.column_names
    for row in ours:  # the NTZ columns hold Spark's semantics, whatever JDBC stores
        wall = WALL_TIMES[row[0]] if row[0] < len(WALL_TIMES) else None
        for column in ("ntz_plain", "ntz_tz"):
            assert row[names.index(column)] == spark_semantics(db.kind, column, wall), (row[0], column)
    diff = differences(jdbc, ours, names)
    found: dict[tuple[str, str], set[int]] = {}
    for row_id, column, _, _ in diff:
        found.setdefault((db.kind, column), set()).add(row_id)
    assert found == {k: v for k, v in DOCUMENTED.items() if k[0] == db.kind}, diff


# --------------------------------------------------------------------------- 2. doubles into decimals

TINY_AND_HUGE = [1e-13, 1.0000000000001, 6.02214076e-23, 0.1 + 0.2, 1e300, 5e-324, 2.2250738585072014e-308, -1e-300]
SMALL = [2.675, 0.125, -2.675, -0.125, 1.005, 0.015, 12345678.995, 0.1 + 0.2]
NUMBER_COLUMNS = {
    POSTGRESQL: "id int PRIMARY KEY, d_wide numeric, d_small numeric(10,2)",
    MARIADB: "id int PRIMARY KEY, d_wide DECIMAL(65,30), d_small DECIMAL(10,2)",
}


def doubles_table(kind: str) -> pa.Table:
    wide = list(TINY_AND_HUGE)
    if kind == MARIADB:  # DECIMAL(65,30) holds 35 integer digits
        wide[4] = 1.2345678901234567e34
    else:
        wide += [math.nan, math.inf, -math.inf]
    small = SMALL + [0.0] * (len(wide) - len(SMALL))
    return pa.table(
        {
            "id": pa.array(range(len(wide) + 1), pa.int32()),
            "d_wide": pa.array(wide + [None], pa.float64()),
            "d_small": pa.array(small + [None], pa.float64()),
        }
    )


@pytest.mark.parametrize("path", ["bulk", "upsert"])
def test_doubles_into_decimal_columns_are_cast_by_the_server(
    values_driver: ValuesDriver, db: Target, tmp_path: Path, path: str
) -> None:
    assert_stored_alike(values_driver, db, NUMBER_COLUMNS[db.kind], doubles_table(db.kind), tmp_path, path)


# --------------------------------------------------------------------------- 3. decimals into doubles

DECIMAL_COLUMNS = {
    POSTGRESQL: "id int PRIMARY KEY, dec38 double precision, dec_scale numeric, dec_real real",
    MARIADB: "id int PRIMARY KEY, dec38 DOUBLE, dec_scale DECIMAL(20,4), dec_real FLOAT",
}


def decimals_table() -> pa.Table:
    import random

    rnd = random.Random(29)
    wide = [Decimal(rnd.randrange(-(10**38) + 1, 10**38)).scaleb(-18) for _ in range(40)]
    wide += [Decimal("0.1"), Decimal("1.000000000000000001"), Decimal("-99999999999999999999.999999999999999999")]
    scaled = [Decimal("1.50"), Decimal("0.00"), Decimal("-12.30"), Decimal("100.00")]
    scaled += [Decimal(rnd.randrange(-(10**9), 10**9)).scaleb(-2) for _ in range(len(wide) - len(scaled))]
    return pa.table(
        {
            "id": pa.array(range(len(wide) + 1), pa.int32()),
            "dec38": pa.array(wide + [None], pa.decimal128(38, 18)),
            "dec_scale": pa.array(scaled + [None], pa.decimal128(10, 2)),
            "dec_real": pa.array(wide + [None], pa.decimal128(38, 18)),
        }
    )


@pytest.mark.parametrize("path", ["bulk", "upsert"])
def test_decimals_into_double_columns_are_correctly_rounded(
    values_driver: ValuesDriver, db: Target, tmp_path: Path, path: str
) -> None:
    assert_stored_alike(values_driver, db, DECIMAL_COLUMNS[db.kind], decimals_table(), tmp_path, path)


# --------------------------------------------------------------------------- random values, every column


def _dst_transition(year: int, spring: bool) -> datetime:
    """New York's 02:00 wall time of the year's spring or fall clock change (the rules since 1987)."""
    if year >= 2007:
        month, nth = (3, 2) if spring else (11, 1)
    else:
        month, nth = (4, 1) if spring else (10, -1)
    if nth > 0:
        first = datetime(year, month, 1)
        day = 1 + (6 - first.weekday()) % 7 + 7 * (nth - 1)
    else:
        last = datetime(year, month, 31)
        day = 31 - (last.weekday() + 1) % 7
    return datetime(year, month, day, 2, 0)


near_dst = st.builds(
    lambda year, spring, seconds, micros: (
        _dst_transition(year, spring) + timedelta(seconds=seconds, microseconds=micros)
    ),
    st.integers(1987, 2037),
    st.booleans(),
    st.integers(-2 * 3600, 2 * 3600),
    st.integers(0, 999_999),
)
wall_times = st.one_of(near_dst, st.datetimes(datetime(1971, 1, 2), datetime(2037, 12, 31)))
CONTROL = [chr(i) for i in range(32)] + ["\x7f", "\x85", "\u2028", "\ufeff"]


@st.composite
def frames(draw: st.DrawFn, kind: str) -> tuple[str, pa.Table]:
    """(the table's columns, a frame of random rows) for one database."""
    precision = draw(st.integers(1, 38))
    scale = draw(st.integers(0, min(precision, 30 if kind == MARIADB else 38)))
    wide_scale = draw(st.integers(0, min(37 - (precision - scale), 30 if kind == MARIADB else 37)))
    # the unscaled integer, so every value fits decimal(precision, scale) exactly (st.decimals' bounds pass
    # through a 28-digit context and can overshoot; so would scaleb)
    decimals = st.integers(-(10**precision) + 1, 10**precision - 1).map(lambda i: Decimal(f"{i}e-{scale}"))
    finite = kind == MARIADB  # MariaDB holds no NaN nor infinity (both writers refuse them)
    doubles = st.floats(allow_nan=not finite, allow_infinity=not finite)
    wide_doubles = st.floats(-1e33, 1e33) if kind == MARIADB else doubles
    alphabet = st.one_of(st.sampled_from(CONTROL), st.characters(codec="utf-8"))
    texts = st.text(alphabet, max_size=12)
    if kind == POSTGRESQL:  # text holds no NUL in PostgreSQL (both writers refuse it)
        texts = texts.map(lambda s: s.replace("\x00", ""))
    rows = draw(st.integers(1, 8))

    def column(strategy: st.SearchStrategy[Any]) -> list[Any]:
        return draw(st.lists(st.one_of(st.none(), strategy), min_size=rows, max_size=rows))

    walls = column(wall_times)
    instants = [None if w is None else w.replace(tzinfo=ZoneInfo(TZ)).astimezone(UTC) for w in column(wall_times)]
    decimal_values = column(decimals)
    double_values = column(doubles)
    data = pa.table(
        {
            "id": pa.array(range(rows), pa.int32()),
            "dec_same": pa.array(decimal_values, pa.decimal128(precision, scale)),
            "dec_wide": pa.array(decimal_values, pa.decimal128(precision, scale)),
            "dec_double": pa.array(decimal_values, pa.decimal128(precision, scale)),
            "d_double": pa.array(double_values, pa.float64()),
            "d_wide": pa.array(column(wide_doubles), pa.float64()),
            "d_small": pa.array(column(st.floats(-1e13, 1e13)), pa.float64()),
            "ts_plain": pa.array(instants, pa.timestamp("us", tz="UTC")),
            "ts_tz": pa.array(instants, pa.timestamp("us", tz="UTC")),
            "ntz_plain": pa.array(walls, pa.timestamp("us")),
            "ntz_tz": pa.array(walls, pa.timestamp("us")),
            "txt": pa.array(column(texts), pa.string()),
            "bin": pa.array(column(st.binary(max_size=16)), pa.binary()),
        }
    )
    if kind == POSTGRESQL:
        columns = (
            f"id int PRIMARY KEY, dec_same numeric({precision},{scale}), dec_wide numeric, "
            "dec_double double precision, d_double double precision, d_wide numeric, d_small numeric(20,6), "
            "ts_plain timestamp(6), ts_tz timestamptz, ntz_plain timestamp(6), ntz_tz timestamptz, txt text, bin bytea"
        )
    else:
        columns = (
            f"id int PRIMARY KEY, dec_same DECIMAL({precision},{scale}), dec_wide DECIMAL(38,{wide_scale}), "
            "dec_double DOUBLE, d_double DOUBLE, d_wide DECIMAL(65,30), d_small DECIMAL(20,6), "
            "ts_plain DATETIME(6), ts_tz TIMESTAMP(6) NULL, ntz_plain DATETIME(6), ntz_tz DATETIME(6), "
            "txt LONGTEXT, bin LONGBLOB"
        )
    return columns, data


@pytest.mark.parametrize("path", ["bulk", "upsert"])
def test_random_values_are_stored_as_spark_jdbc_stores_them(
    values_driver: ValuesDriver, db: Target, tmp_path: Path, path: str
) -> None:
    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(frames(db.kind))
    def check(frame: tuple[str, pa.Table]) -> None:
        columns, data = frame
        jdbc, ours = write_both(values_driver, db, columns, data, tmp_path, path).rows()
        names = data.column_names
        walls = data.column("ntz_plain").to_pylist()
        for row in ours:  # NTZ cells: Spark's semantics (JDBC differs in gaps, overlaps and on MariaDB)
            for column in ("ntz_plain", "ntz_tz"):
                assert row[names.index(column)] == spark_semantics(db.kind, column, walls[row[0]]), (row, column)
        diff = [d for d in differences(jdbc, ours, names) if d[1] not in ("ntz_plain", "ntz_tz")]
        assert diff == [], (columns, diff)

    check()


# --------------------------------------------------------------------------- floats (FloatType)

FLOATS = [0.1, 0.123456789, 1e-40, 3.4028235e38, -2.675, 16777217.0, 1.1754944e-38, 7e-45]
FLOAT_COLUMNS = {
    POSTGRESQL: "id int PRIMARY KEY, f_real real, f_double double precision, f_wide numeric",
    MARIADB: "id int PRIMARY KEY, f_real FLOAT, f_double DOUBLE, f_wide DECIMAL(65,30)",
}


@pytest.mark.parametrize("path", ["bulk", "upsert"])
def test_floats_are_stored_as_spark_jdbc_stores_them(
    values_driver: ValuesDriver, db: Target, tmp_path: Path, path: str
) -> None:
    floats = FLOATS
    if db.kind == MARIADB:  # Spark's JDBC writer sends a float as Float.toString's text, so MariaDB differs:
        # Float.MAX_VALUE as 3.4028235E38, beyond FLOAT's range (JDBC fails, xasink writes it); and before
        # Java 19 some floats with more digits than needed (1.17549435E-38; xasink: the shortest, 1.1754944e-38)
        floats = [f for f in FLOATS if f not in (3.4028235e38, 1.1754944e-38)]
    values = pa.array(floats + [None], pa.float32())
    data = pa.table(
        {"id": pa.array(range(len(values)), pa.int32()), "f_real": values, "f_double": values, "f_wide": values}
    )
    jdbc, ours = write_both(values_driver, db, FLOAT_COLUMNS[db.kind], data, tmp_path, path).rows()
    assert differences(jdbc, ours, data.column_names) == []
