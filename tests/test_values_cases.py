"""Single cases against Spark's JDBC writer (issue 38): one table of cases, each a few rows into twin tables.

A case is stored alike by both writers (every cell, as tests/test_values.py compares them), or refused by
both: then xasink's error says what its message must say, and its table stays empty (nothing visible; the
autouse ``no_prepared_left`` checks nothing is left prepared).  The driver's session and JVM zone are
America/New_York (tests/values_driver.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from tests.targets import MARIADB, POSTGRESQL, Target
from tests.values_harness import ValuesDriver, differences, write_both

pytestmark = pytest.mark.spark


@dataclass(frozen=True)
class Case:
    """Columns of the twin tables, the frame's columns (``id`` first), and what both writers do with them."""

    kind: str
    columns: str
    data: dict[str, pa.Array]
    refused: str | None = None  # both writers refuse; xasink's message holds this text
    not_said: str | None = None  # ... and not this one (a misleading message of before)
    paths: tuple[str, ...] = ("bulk",)
    select: list[str] = field(default_factory=list)
    conf: dict[str, str | None] = field(default_factory=dict)
    url_query: str = ""  # both writers' URL parameters
    setup: str = ""  # a statement run before the tables are made (a type they use)
    options: dict[str, str] = field(default_factory=dict)  # xasink's own options (localInfile)
    xfail: str = ""  # a difference found and not fixed yet: a strict xfail saying what


def ints(*values: int | None) -> pa.Array:
    return pa.array(values, pa.int32())


def doubles(*values: float | None) -> pa.Array:
    return pa.array(values, pa.float64())


SENSITIVE: dict[str, str | None] = {"spark.sql.caseSensitive": "true"}
CASES: dict[str, Case] = {
    # 1. a DateType into timestamptz is midnight in the session zone (2024-01-15 05:00+00 in New York)
    "pg-date-into-timestamptz": Case(
        POSTGRESQL,
        "id int PRIMARY KEY, d_tz timestamptz, d_plain timestamp",
        {
            "id": ints(0, 1, 2),
            "d_tz": pa.array([date(2024, 1, 15), date(2024, 7, 1), None], pa.date32()),
            "d_plain": pa.array([date(2024, 1, 15), date(2024, 7, 1), None], pa.date32()),
        },
        paths=("bulk", "upsert"),
    ),
    # 2. 0 into AUTO_INCREMENT: a generated value (two zeros are no duplicate key)
    "maria-zero-into-auto-increment": Case(
        MARIADB,
        "id int PRIMARY KEY, n int NOT NULL AUTO_INCREMENT, UNIQUE KEY (n)",
        {"id": ints(1, 2), "n": ints(0, 0)},
        paths=("bulk", "upsert"),
    ),
    # 3. defaults that read the session's zone see the Spark session's, as JDBC's sessions see the JVM's
    "pg-session-zone": Case(
        POSTGRESQL,
        "id int PRIMARY KEY, v int, zone text DEFAULT current_setting('TimeZone'), "
        "noon text DEFAULT (timestamptz '2026-01-15 12:00:00+00')::text",
        {"id": ints(0, 1), "v": ints(5, None)},
        paths=("bulk", "upsert"),
    ),
    # 4. a value for a generated column is refused (JDBC: error 1906), on the LOAD DATA path too
    "maria-virtual-column": Case(
        MARIADB,
        "id int PRIMARY KEY, v int, g int AS (v * 2) VIRTUAL",
        {"id": ints(0, 1), "v": ints(1, 2), "g": ints(2, 4)},
        refused="generated column",
    ),
    "maria-persistent-column": Case(
        MARIADB,
        "id int PRIMARY KEY, v int, g int AS (v * 2) PERSISTENT",
        {"id": ints(0, 1), "v": ints(1, 2), "g": ints(2, 4)},
        refused="generated column",
    ),
    # 5. a double into real: out of its range is refused, as PostgreSQL's float8-to-float4 cast refuses it
    "pg-real-overflow": Case(
        POSTGRESQL, "id int PRIMARY KEY, r real", {"id": ints(0, 1), "r": doubles(1.5, 1e39)}, refused="out of range"
    ),
    "pg-real-negative-overflow": Case(
        POSTGRESQL, "id int PRIMARY KEY, r real", {"id": ints(0), "r": doubles(-1e39)}, refused="out of range"
    ),
    "pg-real-underflow": Case(
        POSTGRESQL, "id int PRIMARY KEY, r real", {"id": ints(0), "r": doubles(1e-50)}, refused="out of range"
    ),
    "pg-real-in-range": Case(
        POSTGRESQL,
        "id int PRIMARY KEY, r real",
        {
            "id": ints(0, 1, 2, 3, 4, 5, 6),
            "r": doubles(1e-40, -1e-45, float("inf"), float("-inf"), float("nan"), 3.4028234e38, None),
        },
        paths=("bulk", "upsert"),
    ),
    # NullType has no SQL type: JDBC refuses it ("Can't get JDBC type for void")
    "pg-null-type": Case(
        POSTGRESQL, "id int PRIMARY KEY, n int", {"id": ints(0)}, refused="NullType", select=["id", "NULL AS n"]
    ),
    # integers into numeric(4,2): stored with the scale where they fit, refused naming the column's range
    "pg-int-into-numeric": Case(
        POSTGRESQL,
        "id int PRIMARY KEY, n numeric(4,2)",
        {"id": ints(0, 1, 2, 3), "n": ints(5, -12, 99, None)},
        paths=("bulk", "upsert"),
    ),
    "pg-int-overflows-numeric": Case(
        POSTGRESQL,
        "id int PRIMARY KEY, n numeric(4,2)",
        {"id": ints(0, 1), "n": ints(5, 100)},
        refused="less than 10^2",
        not_said="Precision",
    ),
    "maria-negative-into-unsigned": Case(
        MARIADB,
        "id int PRIMARY KEY, u int unsigned",
        {"id": ints(0, 1), "u": ints(1, -1)},
        refused="0 to 4294967295",
        not_said="2147483647",
    ),
    # column matching: a MariaDB column whose name holds a backtick
    "maria-backtick-column": Case(
        MARIADB, "id int PRIMARY KEY, `a``b` int", {"id": ints(0, 1), "a`b": ints(7, None)}, paths=("bulk", "upsert")
    ),
    # column matching: spark.sql.caseSensitive=true as JDBC honours it; a table with both "ID" and id
    "pg-case-sensitive": Case(
        POSTGRESQL,
        'id int PRIMARY KEY, "Name" int',
        {"id": ints(0), "name": ints(1)},
        refused="spark.sql.caseSensitive is true",
        conf=SENSITIVE,
    ),
    "maria-case-sensitive": Case(
        MARIADB,
        "id int PRIMARY KEY, Name int",
        {"id": ints(0), "name": ints(1)},
        refused="spark.sql.caseSensitive is true",
        conf=SENSITIVE,
    ),
    "pg-case-insensitive": Case(POSTGRESQL, 'id int PRIMARY KEY, "Name" int', {"id": ints(0), "name": ints(1)}),
    "pg-both-cases-sensitive": Case(
        POSTGRESQL,
        '"ID" int, id int PRIMARY KEY',
        {"id": ints(0, 1), "ID": ints(5, None)},
        conf=SENSITIVE,
        paths=("bulk", "upsert"),
    ),
    "pg-both-cases-insensitive": Case(
        POSTGRESQL,
        '"ID" int, id int PRIMARY KEY',
        {"a": ints(0), "b": ints(5)},
        refused="equal without case",
        select=["a AS id", "b AS ID"],
    ),
    "pg-both-cases-neither-spelled": Case(
        POSTGRESQL,
        '"ID" int, id int PRIMARY KEY, v int',
        {"Id": ints(0), "v": ints(5)},
        refused="matches 2 columns",
        not_said="is not in table",
    ),
    # strings into jsonb, json, uuid, inet and an enum: the server converts them (JDBC: stringtype=unspecified)
    "pg-strings-into-other-types": Case(
        POSTGRESQL,
        "id int PRIMARY KEY, j jsonb, js json, u uuid, ip inet, mood xasink_mood",
        {
            "id": ints(0, 1),
            "j": pa.array(['{"b": 1, "a": [1, 2]}', None]),
            "js": pa.array(['{"b": 1,  "a": 2}', "null"]),
            "u": pa.array(["A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11", None]),
            "ip": pa.array(["192.168.0.1/24", "::1"]),
            "mood": pa.array(["happy", None]),
        },
        url_query="stringtype=unspecified",
        setup="DO $$ BEGIN CREATE TYPE xasink_mood AS ENUM ('sad', 'happy'); EXCEPTION WHEN duplicate_object "
        "THEN NULL; END $$",
        paths=("bulk", "upsert"),
    ),
    # found by the values matrix (tests/test_values_matrix.py): a session that never set its zone, and a column
    # the server casts (a double into numeric); xasink stored 2024-01-15 00:00+00, JDBC midnight in the JVM's
    # zone (05:00+00).  xasink.register sets the zone to its value, so the tasks see it
    "pg-date-into-timestamptz-zone-unset": Case(
        POSTGRESQL,
        "id int PRIMARY KEY, d timestamptz, n numeric",
        {"id": ints(0), "d": pa.array([date(2024, 1, 15)], pa.date32()), "n": doubles(0.1)},
        conf={"spark.sql.session.timeZone": None},
    ),
    # 0 into YEAR is 0000 (LOAD DATA's text '0' read as the year 2000 before); two digits read as JDBC's number
    "maria-zero-into-year": Case(
        MARIADB,
        "id int PRIMARY KEY, y year",
        {"id": ints(0, 1, 2, 3, 4, 5, 6), "y": pa.array([0, 5, 69, 70, 1901, 2155, None], pa.int16())},
        paths=("bulk", "upsert"),
    ),
    "maria-year-out-of-range": Case(
        MARIADB,
        "id int PRIMARY KEY, y year",
        {"id": ints(0, 1), "y": pa.array([2024, 100], pa.int16())},
        refused="out of range",
        paths=("bulk", "upsert"),
    ),
    "pg-string-not-json": Case(
        POSTGRESQL,
        "id int PRIMARY KEY, j jsonb",
        {"id": ints(0), "j": pa.array(["{not json"])},
        url_query="stringtype=unspecified",
        refused="invalid input syntax for type json",
    ),
}


def frame(case: Case) -> pa.Table:
    return pa.table(case.data)


@pytest.mark.parametrize(
    ("name", "path"),
    [
        pytest.param(
            name,
            path,
            id=f"{name}-{path}",
            marks=([pytest.mark.mariadb] if case.kind == MARIADB else [])
            + ([pytest.mark.xfail(strict=True, reason=case.xfail)] if case.xfail else []),
        )
        for name, case in CASES.items()
        for path in case.paths
    ],
)
def test_case_as_spark_jdbc_writes_it(
    values_driver: ValuesDriver, request: pytest.FixtureRequest, tmp_path: Path, name: str, path: str
) -> None:
    check_case(values_driver, request, tmp_path, CASES[name], path)


def check_case(
    values_driver: ValuesDriver, request: pytest.FixtureRequest, tmp_path: Path, case: Case, path: str
) -> None:
    """Write the case's frame by both writers (xasink by ``path``): stored alike, or refused by both."""
    check_case_on(
        values_driver, request.getfixturevalue("pg" if case.kind == POSTGRESQL else "maria"), tmp_path, case, path
    )


def check_case_on(values_driver: ValuesDriver, db: Target, tmp_path: Path, case: Case, path: str) -> None:
    """:func:`check_case` on ``db`` (a server of the test's own)."""
    data = frame(case)
    if case.setup:
        db.execute(case.setup)
    twin = write_both(
        values_driver,
        db,
        case.columns,
        data,
        tmp_path,
        path,
        case.select,
        case.conf,
        case.url_query,
        None,
        case.options,
    )
    answer, jdbc_table, xasink_table = twin.answer, twin.jdbc, twin.xasink
    if case.refused is None:
        assert answer["ok"], answer
        jdbc, ours = db.rows(jdbc_table, "id"), db.rows(xasink_table, "id")
        columns = [c[0] for c in _described(db, xasink_table)]
        assert len(ours) == data.num_rows, ours
        assert differences(jdbc, ours, columns) == [], (jdbc, ours)
        return
    xasink_error = answer.get("xasink_error") if answer.get("writer") == "jdbc" else None
    assert xasink_error is not None, f"both writers must refuse: {answer}"
    assert case.refused in xasink_error, xasink_error
    if case.not_said is not None:
        assert case.not_said not in xasink_error, xasink_error
    assert [r for r in db.rows(xasink_table, "id") if r[0] != -1] == []  # (an overwrite keeps the row before it)
    assert len(db.rows(xasink_table)) == (1 if path == "overwrite" else 0)


def _described(db: Target, table: str) -> list[Any]:
    with db.connect() as conn, conn.cursor() as cur:
        cur.execute(f"SELECT * FROM {db.q(table)} WHERE 1 = 0")
        return list(cur.description)
