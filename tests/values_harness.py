"""The client side of tests/values_driver.py, shared by the modules that compare xasink with Spark's JDBC writer
(tests/test_values.py, tests/test_values_cases.py, tests/test_values_matrix.py): one driver process per
module, twin tables, cell by cell."""

from __future__ import annotations

import json
import math
import os
import struct
import subprocess
import sys
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
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
    """A value as compared: floats by their bits (NaN, -0.0), decimals by their text (display scale), arrays by
    their elements."""
    if isinstance(value, float):
        return ("float", struct.pack(">d", value).hex() if not math.isnan(value) else "nan")
    if isinstance(value, Decimal):
        return ("decimal", str(value))
    if isinstance(value, memoryview):
        return bytes(value)
    if isinstance(value, list):  # an array column: element by element
        return ("array", tuple(_cell(v) for v in value))
    return value


PATHS = ("bulk", "upsert", "overwrite", "changes")
CHANGES = {"upsertKeyColumns": "id", "deleteFlagColumn": "deleted", "sequenceColumn": "seq"}


@dataclass
class Twin:
    """One frame written by both writers: the driver's answer and the two tables (``jdbc``, ``xasink``)."""

    db: Target
    answer: dict[str, Any]
    jdbc: str
    xasink: str

    def rows(self) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
        """Both tables' rows by id, once both writers wrote."""
        assert self.answer["ok"], self.answer
        return self.db.rows(self.jdbc, "id"), self.db.rows(self.xasink, "id")


def write_both(
    driver: ValuesDriver,
    db: Target,
    columns: str,
    data: pa.Table,
    tmp_path: Path,
    path: str = "bulk",
    select: list[str] | None = None,
    conf: dict[str, str | None] | None = None,
    url_query: str = "",
    after_create: list[str] | None = None,
    options: dict[str, str] | None = None,
) -> Twin:
    """Write data (an ``id`` column first) through JDBC and xasink into twin tables of ``columns``.

    ``path`` is xasink's write path (:data:`PATHS`): ``bulk`` appends; ``upsert`` upserts by ``id`` (JDBC
    appends); ``overwrite`` replaces a row (id -1) both tables held before; ``changes`` applies the frame as
    change data (with a ``seq`` column in the table, unless the frame has one, and a false ``deleted`` flag in
    the frame, which JDBC leaves out).  ``select``: SQL expressions the driver selects from the frame first (a
    NullType: ``NULL AS n``); ``conf``: Spark SQL settings for this write only; ``url_query``: URL parameters
    of both writers (``stringtype=unspecified``); ``after_create``: statements run on each table once made
    (``{table}``: its quoted name, ``{trigger}`` a trigger name of its own); ``options``: xasink's own, more."""
    assert path in PATHS, path
    if path == "changes":
        if "seq" not in data.column_names:  # (a case may bring its own sequence column)
            columns += ", seq bigint"
            data = data.append_column("seq", pc.cast(data.column("id"), pa.int64()))
        data = data.append_column("deleted", pa.array([False] * data.num_rows))
        if select:
            select = [*select, "seq", "deleted"]
    jdbc_table, xasink_table = db.new_table(), db.new_table()
    for table in (jdbc_table, xasink_table):
        db.create_table(table, columns)
        for statement in after_create or []:
            db.execute(statement.format(table=db.q(table), trigger=db.q(f"z_{table}")))
        if path == "overwrite":
            db.execute(f"INSERT INTO {db.q(table)} (id) VALUES (-1)")
    file = tmp_path / f"{xasink_table}.parquet"
    pq.write_table(data, file)
    url = db.url + (("&" if "?" in db.url else "?") + url_query if url_query else "")
    request: dict[str, Any] = {
        "parquet": str(file),
        "jdbc_url": url,
        "jdbc_table": jdbc_table,
        "xasink_url": url,
        "xasink_table": xasink_table,
        "mode": "overwrite" if path == "overwrite" else "append",
        "xasink_options": {
            **{"upsert": {"upsertKeyColumns": "id"}, "changes": CHANGES}.get(path, {}),
            **(options or {}),
        },
        "jdbc_drop": ["deleted"] if path == "changes" else [],
        "select": select or [],
        "conf": conf or {},
    }
    return Twin(db, driver.write(request), jdbc_table, xasink_table)


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
    """JDBC and xasink (its ``path``, one of :data:`PATHS`) store ``data`` into ``columns`` exactly alike."""
    jdbc, ours = write_both(driver, db, columns, data, tmp_path, path).rows()
    assert differences(jdbc, ours, data.column_names) == []
