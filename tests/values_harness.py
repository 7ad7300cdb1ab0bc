"""The client side of tests/values_driver.py, shared by the modules that compare xasink with Spark's JDBC writer
(tests/test_values.py, tests/test_values_cases.py): one driver process per module, twin tables, cell by cell."""

from __future__ import annotations

import json
import math
import os
import struct
import subprocess
import sys
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from tests.targets import Target

ROOT = Path(__file__).resolve().parent.parent


class ValuesDriver:
    """The comparison's Spark driver process (tests/values_driver.py), one per test module."""

    def __init__(self) -> None:
        env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.values_driver"],
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self._answer().get("ready")

    def _answer(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("VALUES "):
                return dict(json.loads(line[len("VALUES ") :]))
        raise AssertionError(f"the values driver ended (exit {self.proc.wait()})")

    def write(self, request: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        return self._answer()

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def _cell(value: Any) -> Any:
    """A value as compared: floats by their bits (NaN, -0.0), decimals by their text (display scale)."""
    if isinstance(value, float):
        return ("float", struct.pack(">d", value).hex() if not math.isnan(value) else "nan")
    if isinstance(value, Decimal):
        return ("decimal", str(value))
    if isinstance(value, memoryview):
        return bytes(value)
    return value


def write_both(
    driver: ValuesDriver,
    db: Target,
    columns: str,
    data: pa.Table,
    tmp_path: Path,
    upsert: bool = False,
    select: list[str] | None = None,
    conf: dict[str, str] | None = None,
    url_query: str = "",
) -> tuple[dict[str, Any], str, str]:
    """Write data through JDBC and xasink into twin tables of ``columns``: the driver's answer and the two tables.

    ``select``: SQL expressions the driver selects from the frame first (a NullType: ``NULL AS n``); ``conf``:
    Spark SQL settings for this write only (``spark.sql.caseSensitive``); ``url_query``: URL parameters of both
    writers (``stringtype=unspecified``)."""
    jdbc_table, xasink_table = db.new_table(), db.new_table()
    for table in (jdbc_table, xasink_table):
        db.create_table(table, columns)
    path = tmp_path / f"{xasink_table}.parquet"
    pq.write_table(data, path)
    url = db.url + (("&" if "?" in db.url else "?") + url_query if url_query else "")
    answer = driver.write(
        {
            "parquet": str(path),
            "jdbc_url": url,
            "jdbc_table": jdbc_table,
            "xasink_url": url,
            "xasink_table": xasink_table,
            "upsert": ["id"] if upsert else [],
            "select": select or [],
            "conf": conf or {},
        }
    )
    return answer, jdbc_table, xasink_table


def both_writers(
    driver: ValuesDriver,
    db: Target,
    columns: str,
    data: pa.Table,
    tmp_path: Path,
    upsert: bool = False,
    select: list[str] | None = None,
    conf: dict[str, str] | None = None,
) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """Write data (an ``id`` column first) through JDBC and xasink into twin tables; both tables' rows by id."""
    answer, jdbc_table, xasink_table = write_both(driver, db, columns, data, tmp_path, upsert, select, conf)
    assert answer["ok"], answer
    return db.rows(jdbc_table, "id"), db.rows(xasink_table, "id")


def differences(
    jdbc: list[tuple[Any, ...]], ours: list[tuple[Any, ...]], names: list[str]
) -> list[tuple[Any, str, Any, Any]]:
    """(id, column, JDBC's value, xasink's value) of every cell that differs."""
    assert len(jdbc) == len(ours)
    out = []
    for a, b in zip(jdbc, ours, strict=True):
        assert a[0] == b[0]
        for name, x, y in zip(names, a, b, strict=True):
            if _cell(x) != _cell(y):
                out.append((a[0], name, x, y))
    return out


def assert_stored_alike(
    driver: ValuesDriver, db: Target, columns: str, data: pa.Table, tmp_path: Path, path: str
) -> None:
    """JDBC and xasink (its ``path``: "bulk" or "upsert") store ``data`` into ``columns`` exactly alike."""
    jdbc, ours = both_writers(driver, db, columns, data, tmp_path, upsert=path == "upsert")
    assert differences(jdbc, ours, data.column_names) == []
