"""The matrix's pairs xasink refuses by type, found without writing a row: the cells to run against Spark's JDBC
writer to show that each such refusal is either JDBC's too or a difference listed.py names (JDBC writes,
xasink refuses on purpose).

xasink decides such a refusal before any row, from the column's reflected type and the DataFrame's
(``plan_target``'s ``PreflightError``), so one empty table per column type answers for every Spark type in
seconds; whether JDBC writes the pair still takes a write of both writers per pair (``python -m
tests.values_matrix --refused`` prints those cells, one edge value per pair, for ``XASINK_MATRIX_CELLS``).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pyarrow as pa
import sqlalchemy as sa

from tests.values_matrix.cells import COLUMNS, SETUP, SPARK, Cell
from tests.values_matrix.listed import match
from xasink.dialects import dialect_for
from xasink.errors import PreflightError
from xasink.options import parse_options, parse_url
from xasink.write_modes.schema import plan_target

# the edge value a pair's cell takes: an ordinary value of its Spark type, so that a refusal is the type's
EDGES = ("one", "true", "tenth", "cent", "bytes", "today", "micros", "two", "zero", "max", "ascii")


@contextmanager
def _scratch(dbkey: str, url: str, columns: tuple[str, ...]) -> Iterator[str]:
    """A schema (PostgreSQL) or database (MariaDB) of its own, with one table per column type; the URL into it."""
    name = f"xasink_refused_{uuid.uuid4().hex[:8]}"
    admin = sa.create_engine(parse_url(url), isolation_level="AUTOCOMMIT")
    kind = "SCHEMA" if dbkey == "pg" else "DATABASE"
    with admin.connect() as conn:
        conn.exec_driver_sql(f"CREATE {kind} {name}")
    try:
        u = parse_url(url)
        into = u.update_query_dict({"options": f"-csearch_path={name}"}) if dbkey == "pg" else u.set(database=name)
        tables = sa.create_engine(into)
        try:
            with tables.begin() as conn:
                for statement in SETUP[dbkey]:
                    conn.exec_driver_sql(statement)
                for column in columns:
                    ddl = COLUMNS[dbkey][column].ddl
                    conn.exec_driver_sql(f"CREATE TABLE {name}.{_table(column)} (id int, c {ddl})")
        finally:
            tables.dispose()
        yield into.render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f"DROP {kind} {name}" + (" CASCADE" if dbkey == "pg" else ""))
        admin.dispose()


def _table(column: str) -> str:
    return "t_" + column.replace("[]", "_array").replace("-", "_")


def refused_pairs(dbkey: str, url: str, columns: tuple[str, ...] = ()) -> dict[tuple[str, str], str]:
    """(Spark type, column type) -> xasink's refusal, for every pair of the matrix (of ``columns`` only, when
    given) it refuses by type."""
    refused: dict[tuple[str, str], str] = {}
    columns = columns or tuple(COLUMNS[dbkey])
    with _scratch(dbkey, url, columns) as into:
        dialect = dialect_for(parse_url(into))
        try:
            for column in columns:
                options = parse_options({"url": into, "dbtable": _table(column), "sinkId": "refused"})
                for spark, st in SPARK.items():
                    if st.null_type:
                        continue  # NullType is refused before the table is looked at (listed.py "null-type")
                    with dialect.connect() as conn:
                        try:
                            plan_target(dialect, conn, options, pa.schema([("id", pa.int32()), ("c", st.arrow)]))
                        except PreflightError as exc:
                            refused[(spark, column)] = str(exc)
        finally:
            dialect.dispose()
    return refused


def gap_cells(dbkey: str, refused: dict[tuple[str, str], str]) -> list[Cell]:
    """One cell per pair of ``refused`` (:func:`refused_pairs`) that no listed.py entry names: a named
    difference needs no run; the rest must be refused by JDBC too, or the matrix fails it as unlisted."""
    cells = []
    for spark, column in sorted(refused):
        edge = next(e for e in EDGES if e in SPARK[spark].edges)
        cell = Cell(dbkey, spark, column, edge, "bulk", "same")
        entry = match(cell, "xasink-refuses")
        if entry is None:
            cells.append(cell)
    return cells
