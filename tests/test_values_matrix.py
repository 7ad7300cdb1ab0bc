"""Issue 38's generated matrix: cells of Spark type x column type x edge value x write path x zone, and column
features, each written by xasink and by Spark's JDBC writer (tests/values_matrix/).  A cell is stored alike,
or refused by both (xasink leaving nothing visible and nothing prepared), or differs as
tests/values_matrix/listed.py lists it; an unlisted difference fails with the line that replays it.

CI runs a seeded sample (``XASINK_MATRIX_SEED``, ``XASINK_MATRIX_SIZE`` cells per database); the whole
product is a soak test (``python -m tests.values_matrix --full``, docs/testing.md).  ``XASINK_MATRIX_CELLS``
(cell ids, comma-separated) replays those cells alone; ``XASINK_MATRIX_SHARD=i/n`` runs shard i of n of the whole
product (every cell of some pairs: the full matrix in parts); ``XASINK_MATRIX_REPORT`` gets a JSON line per cell.
``XASINK_MATRIX_BY_TYPE=1`` (the full run's default) judges without a write the cells of pairs xasink refuses by
type where listed.py names that refusal (no write could fail them); the sample and replays write every cell.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tests.values_harness import ValuesDriver
from tests.values_matrix import shards
from tests.values_matrix.cells import Cell, product, sample, shard
from tests.values_matrix.listed import docs_table
from tests.values_matrix.refused import gap_cells, refused_pairs
from tests.values_matrix.run import Matrix, tally

ROOT = Path(__file__).resolve().parent.parent
SEED = int(os.environ.get("XASINK_MATRIX_SEED", "38"))
SIZE = int(os.environ.get("XASINK_MATRIX_SIZE", "18"))
DBS = [pytest.param("pg", id="pg"), pytest.param("mariadb", id="mariadb", marks=pytest.mark.mariadb)]


def _cells(dbkey: str, size: int | None) -> list[Cell]:
    chosen = os.environ.get("XASINK_MATRIX_CELLS", "")
    if chosen:
        return [Cell.parse(c) for c in chosen.split(",") if c.startswith(dbkey + ":")]
    part = os.environ.get("XASINK_MATRIX_SHARD", "")
    if part:
        return shard(dbkey, *shards.parse(part))
    return sample(dbkey, SEED, size)


def _run(
    values_driver: ValuesDriver, request: pytest.FixtureRequest, tmp_path: Path, dbkey: str, size: int | None
) -> None:
    cells = _cells(dbkey, size)
    if not cells:
        pytest.skip(f"XASINK_MATRIX_CELLS names no cell of {dbkey}")
    db = request.getfixturevalue("pg" if dbkey == "pg" else "maria")
    by_type = {}
    whole = size is None or bool(os.environ.get("XASINK_MATRIX_SHARD"))
    if os.environ.get("XASINK_MATRIX_BY_TYPE", "1" if whole else "0") == "1":
        by_type = refused_pairs(dbkey, request.getfixturevalue("pg_url" if dbkey == "pg" else "mariadb_url"))
    matrix = Matrix(values_driver, db, dbkey, tmp_path, os.environ.get("XASINK_MATRIX_REPORT", ""), by_type)
    started, at = time.monotonic(), shards.commit()
    outcomes = matrix.run(cells)
    counts = tally(outcomes)
    part = os.environ.get("XASINK_MATRIX_SHARD", "")
    which = f"shard {part}" if part else f"seed {SEED}"
    print(f"\nmatrix {dbkey} {which}: {counts}, {matrix.jobs} writes of both writers")
    unlisted = [o.line() for o in outcomes if o.verdict == "unlisted"]
    assert not unlisted, f"{len(unlisted)} unlisted difference(s) of {len(outcomes)} cells:\n" + "\n".join(unlisted)
    if part:
        shards.record(dbkey, part, counts, matrix.jobs, time.monotonic() - started, at)


@pytest.mark.parametrize("dbkey", DBS)
def test_matrix_sample(values_driver: ValuesDriver, request: pytest.FixtureRequest, tmp_path: Path, dbkey: str) -> None:
    _run(values_driver, request, tmp_path, dbkey, SIZE)


@pytest.mark.soak
@pytest.mark.timeout(0)
@pytest.mark.parametrize("dbkey", DBS)
def test_matrix_full(values_driver: ValuesDriver, request: pytest.FixtureRequest, tmp_path: Path, dbkey: str) -> None:
    _run(values_driver, request, tmp_path, dbkey, None)


def test_docs_list_the_listed_differences() -> None:
    """docs/types.md's differences table is tests/values_matrix/listed.py's (``python -m tests.values_matrix
    --docs`` writes it)."""
    text = (ROOT / "docs" / "types.md").read_text(encoding="utf-8")
    section = text.split("## Differences from Spark's JDBC writer", 1)[1]
    assert docs_table() in section, "docs/types.md's differences table is stale: python -m tests.values_matrix --docs"


def test_cell_ids_replay() -> None:
    """A cell's id spells it whole, and a seed draws the same sample every time."""
    cells = product("pg") + product("mariadb")
    assert len({c.id for c in cells}) == len(cells)
    assert all(Cell.parse(c.id) == c for c in sample("mariadb", 5, 50))
    assert sample("pg", SEED, 30) == sample("pg", SEED, 30)


def test_shards_are_the_whole_product_each_cell_once() -> None:
    """The full matrix run in shards (``XASINK_MATRIX_SHARD``) leaves no cell out and runs none twice."""
    for db in ("pg", "mariadb"):
        parts = [shard(db, i, 7) for i in range(7)]
        ids = [c.id for part in parts for c in part]
        assert sorted(ids) == sorted(c.id for c in product(db)) and len(set(ids)) == len(ids)
        assert all(parts)
    for run in shards.runs():  # what the full matrix's record says (docs/testing.md)
        assert run["unlisted"] == 0 and run["cells"] == run["same"] + run["refused"] + run["listed"], run


@pytest.mark.parametrize("dbkey", DBS)
def test_pairs_refused_by_type_are_found_without_writing(request: pytest.FixtureRequest, dbkey: str) -> None:
    """``--refused`` (refused.py): a pair xasink refuses by its types is found from an empty table, a pair it
    writes is not, and a refusal listed as a deliberate difference is not a cell to settle."""
    url = request.getfixturevalue("pg_url" if dbkey == "pg" else "mariadb_url")
    if dbkey == "pg":
        columns, refused, written, named = ("integer", "text"), ("binary", "integer"), ("string", "integer"), "date"
    else:
        columns, refused, written, named = ("int", "text"), ("binary", "int"), ("string", "int"), "date"
    found = refused_pairs(dbkey, url, columns)
    assert refused in found and "PreflightError" not in found[refused] and "cannot be written" in found[refused]
    assert written not in found and ("int", columns[0]) not in found
    assert (named, "text") in found  # refused, and listed in docs/types.md: not a gap
    cells = {(c.spark, c.column) for c in gap_cells(dbkey, found)}
    assert refused in cells and (named, "text") not in cells
