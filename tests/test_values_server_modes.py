"""A MariaDB server whose ``sql_mode`` changes values (issue 38): Spark's JDBC writer's session starts from the
server's mode, and xasink's branches keep its modes that change a written value (``VALUE_MODES``,
xasink/dialects/mysql/sql.py), on every path, and none that would change how xasink's own statements parse.

Before, the branches ran a fixed mode: a 0 into an AUTO_INCREMENT column took a generated value where JDBC
kept it (NO_AUTO_VALUE_ON_ZERO), ``''`` stayed ``''`` where JDBC stored NULL (EMPTY_STRING_IS_NULL), extra
fractional digits were truncated where JDBC's were rounded (TIME_ROUND_FRACTIONAL), and an invalid date was
refused or a zero date stored where JDBC did the opposite (ALLOW_INVALID_DATES, NO_ZERO_DATE).  The server is
a private one (tests/harness.py ``private_mariadb``): the shared server's global mode is every test's.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from urllib.parse import quote

import pyarrow as pa
import pytest

from tests.harness import private_mariadb
from tests.targets import MARIADB, Target, make_target
from tests.test_values_cases import Case, check_case_on, ints
from tests.values_harness import PATHS, ValuesDriver, write_both

pytestmark = [pytest.mark.spark, pytest.mark.mariadb]

# the value-changing modes, and ANSI_QUOTES and NO_BACKSLASH_ESCAPES, which xasink's sessions must drop (its
# statements quote with backticks and escape with backslashes)
MODES = (
    "STRICT_TRANS_TABLES,ERROR_FOR_DIVISION_BY_ZERO,NO_AUTO_VALUE_ON_ZERO,TIME_ROUND_FRACTIONAL,"
    "EMPTY_STRING_IS_NULL,NO_ZERO_DATE,NO_ZERO_IN_DATE,ALLOW_INVALID_DATES,ANSI_QUOTES,NO_BACKSLASH_ESCAPES,"
    "NO_ENGINE_SUBSTITUTION"
)

ZERO_REFUSED = "sql_mode refuses (NO_ZERO_DATE, NO_ZERO_IN_DATE"


def dates(columns: str, *values: str | None, refused: str | None = None, paths: tuple[str, ...] = PATHS) -> Case:
    """Two rows whose first written column (after id and seq) takes ``values``, strings the server reads as dates."""
    name = columns.split()[0]
    data = {"id": ints(0, 1), "seq": ints(0, 0), name: pa.array(list(values), pa.string())}
    return Case(MARIADB, f"id int PRIMARY KEY, seq int, {columns}", data, refused=refused, paths=paths)


CHANGED = Case(
    MARIADB,
    "id int PRIMARY KEY, seq int, n int AUTO_INCREMENT UNIQUE KEY, t text, v varchar(5), b varbinary(5), "
    "dt datetime, w datetime, tm time, d date, q varchar(9)",
    {
        "id": ints(0, 1, 2),
        "seq": ints(0, 0, 0),
        "n": ints(0, 5, None),  # 0 kept, not numbered
        "t": pa.array(["", "x", None]),  # '' stored as NULL
        "v": pa.array(["", "", "y"]),
        "b": pa.array([b"", b"x", None]),
        "dt": pa.array(["2024-01-15 10:00:00.999999", "2024-01-15 10:00:00.4", None]),  # rounded
        "w": pa.array([datetime(2024, 1, 15, 10, 0, 0, 999999), None, None], pa.timestamp("us", "UTC")),
        "tm": pa.array(["10:00:00.7", None, "23:59:59.5"]),
        "d": pa.array(["2024-02-30", None, "2023-11-31"]),  # an invalid date, admitted
        "q": pa.array(["a\\b'c\"", "", None]),  # backslashes and quotes read as the default mode reads them
    },
    paths=PATHS,
)
CASES = {
    "values-the-modes-change": CHANGED,
    # the multi-row INSERT path (no LOAD DATA), which the server reads as it reads JDBC's statements
    "values-the-modes-change-by-insert": dataclasses.replace(CHANGED, options={"localInfile": "false"}),
    # a stored generated column is computed again by an overwrite's or change-data's apply, from the shadow's
    # rows, in a control session: under the server's date modes too (an adversary's review: the apply refused
    # an invalid date JDBC stores, and stored a zero date JDBC refuses)
    "a-generated-date-from-an-invalid-date": dates("s varchar(20), g date AS (s) STORED", "2024-02-30", None),
    "a-generated-date-from-a-zero-date": dates(
        "s varchar(20), g date AS (s) STORED", "2024-01-15", "0000-00-00", refused="0000-00-00"
    ),
    "maria-a-zero-date": dates("d date", "2024-01-15", "0000-00-00", refused=ZERO_REFUSED),
    "maria-a-zero-in-a-date": dates("d date", "2024-01-15", "2024-00-10", refused=ZERO_REFUSED, paths=("bulk",)),
}


@pytest.fixture(scope="module")
def modal() -> Iterator[Target]:
    """A database on a private MariaDB whose global sql_mode is :data:`MODES`."""
    with private_mariadb(f"xasink_modes_{uuid.uuid4().hex[:8]}", {"sql-mode": MODES}) as (_, url):
        db = make_target(MARIADB, url)
        assert set(db.execute("SELECT @@GLOBAL.sql_mode")[0][0].split(",")) == set(MODES.split(","))
        yield db


@pytest.mark.parametrize(
    ("name", "path"), [pytest.param(n, p, id=f"{n}-{p}") for n, case in CASES.items() for p in case.paths]
)
def test_the_servers_value_modes_apply_as_in_spark_jdbc(
    values_driver: ValuesDriver, modal: Target, tmp_path: Path, name: str, path: str
) -> None:
    check_case_on(values_driver, modal, tmp_path, CASES[name], path)
    assert modal.prepared() == []


@pytest.mark.parametrize("path", ["upsert", "changes"])
def test_an_empty_key_is_a_null_key_under_empty_string_is_null(
    values_driver: ValuesDriver, modal: Target, tmp_path: Path, path: str
) -> None:
    """The server stores an empty string as NULL, so an empty upsert or change-data key is refused as a NULL key
    is, before the branch prepares: a change-data apply failed after the decision ("Column 'id' cannot be
    null"), an upsert stored a NULL key (an adversary's review).  JDBC, which the harness makes append there,
    stores the NULL."""
    data = pa.table({"id": pa.array(["a", ""]), "seq": ints(0, 1), "v": ints(1, 2)})
    twin = write_both(values_driver, modal, "id varchar(5), seq int, v int, UNIQUE KEY (id)", data, tmp_path, path)
    assert twin.answer["writer"] == "xasink", twin.answer
    assert "key column 'id' is an empty string in some rows" in twin.answer["error"]
    assert "EMPTY_STRING_IS_NULL" in twin.answer["error"]
    assert modal.rows(twin.xasink) == [] and modal.prepared() == []


# the same modes (and a session zone) from the URL's sessionVariables, on the shared server (its own mode the
# default): Connector/J sets them on JDBC's session after connecting, and xasink's sessions take sql_mode and
# time_zone from them (they were dropped)
URL_VARIABLES = "sql_mode='STRICT_TRANS_TABLES,NO_AUTO_VALUE_ON_ZERO,TIME_ROUND_FRACTIONAL,EMPTY_STRING_IS_NULL," + (
    "ALLOW_INVALID_DATES',time_zone='+05:30'"
)
OF_THE_URL = dataclasses.replace(
    CHANGED,
    columns=CHANGED.columns + ", z timestamp(6) NULL",
    data={**CHANGED.data, "z": pa.array([datetime(2024, 7, 1, 12, 0), None, None], pa.timestamp("us", "UTC"))},
    url_query="sessionVariables=" + quote(URL_VARIABLES, safe=""),
)


@pytest.mark.parametrize("path", PATHS)
def test_the_urls_session_variables_apply_as_in_spark_jdbc(
    values_driver: ValuesDriver, maria: Target, tmp_path: Path, path: str
) -> None:
    check_case_on(values_driver, maria, tmp_path, OF_THE_URL, path)
