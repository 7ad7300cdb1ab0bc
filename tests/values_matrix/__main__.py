"""``python -m tests.values_matrix``: run the matrix outside the normal test command (docs/testing.md).

python -m tests.values_matrix              # the CI sample, both databases (XASINK_MATRIX_CELLS: those cells)
python -m tests.values_matrix --full       # every cell of both databases (a soak test: hours)
python -m tests.values_matrix --count      # the number of cells per database
python -m tests.values_matrix --shards     # how far the full matrix in shards is (XASINK_MATRIX_SHARD=i/24)
python -m tests.values_matrix --docs       # write docs/types.md's differences table from listed.py
python -m tests.values_matrix --refused    # the cells of the pairs xasink refuses by type, unnamed (refused.py)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from tests.values_matrix.cells import Cell, product
from tests.values_matrix.listed import docs_table, match
from tests.values_matrix.run import Outcome, tally

ROOT = Path(__file__).resolve().parents[2]
HEADING = "## Differences from Spark's JDBC writer"


def write_docs() -> None:
    """Replace the first table under the differences heading of docs/types.md with :func:`docs_table`."""
    path = ROOT / "docs" / "types.md"
    head, section = path.read_text(encoding="utf-8").split(HEADING, 1)
    lines = section.split("\n")
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    lines[start:end] = docs_table().split("\n")
    path.write_text(head + HEADING + "\n".join(lines), encoding="utf-8")


def tally_report(path: str) -> int:
    """Count a report's cells per database and verdict by today's list (an entry added since counts), and print
    every unlisted one with its replay line; 1 when there is one."""
    outcomes = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        got = json.loads(line)
        cell = Cell.parse(got["cell"])
        kind = got["kind"]
        outcomes.append(Outcome(cell, kind, got["detail"], None if kind in ("same", "refused") else match(cell, kind)))
    for db in ("pg", "mariadb"):
        print(db, tally([o for o in outcomes if o.cell.db == db]))
    unlisted = [o for o in outcomes if o.verdict == "unlisted"]
    groups: dict[tuple[str, str, str, str], list[Outcome]] = {}
    for o in unlisted:
        groups.setdefault((o.cell.db, o.cell.spark, o.cell.column, o.kind), []).append(o)
    for (db, spark, column, kind), found in sorted(groups.items()):
        print(f"{len(found)} x {db} {spark} -> {column} [{kind}] edges {sorted({o.cell.edge for o in found})}")
        print("  " + found[0].line().replace("\n", "\n  "))
    return 1 if unlisted else 0


def print_refused() -> int:
    """The cells of :func:`tests.values_matrix.refused.gap_cells` of both databases, comma-separated on stdout
    (for ``XASINK_MATRIX_CELLS``), and per database how many pairs xasink refuses and how many are unnamed."""
    from tests.values_matrix.refused import gap_cells, refused_pairs

    urls = {
        "pg": os.environ.get("XASINK_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres"),
        "mariadb": os.environ.get("XASINK_TEST_MARIADB_URL", "mysql://root@127.0.0.1:3306/mysql"),
    }
    cells = []
    for db, url in urls.items():
        refused = refused_pairs(db, url)
        found = gap_cells(db, refused)
        print(f"{db}: {len(refused)} pairs refused by type, {len(found)} of them unnamed", file=sys.stderr)
        cells += found
    print(",".join(c.id for c in cells))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.values_matrix")
    parser.add_argument("--full", action="store_true", help="every cell (soak)")
    parser.add_argument("--count", action="store_true", help="print the number of cells per database")
    parser.add_argument("--shards", action="store_true", help="print the full matrix's shards run and to run")
    parser.add_argument("--docs", action="store_true", help="write docs/types.md's differences table")
    parser.add_argument("--tally", metavar="REPORT", help="count a report's (XASINK_MATRIX_REPORT) cells")
    parser.add_argument("--refused", action="store_true", help="print the unnamed cells xasink refuses by type")
    args, rest = parser.parse_known_args()
    if args.tally:
        return tally_report(args.tally)
    if args.refused:
        return print_refused()
    if args.shards:
        from tests.values_matrix.shards import progress

        print(progress())
        return 0
    if args.count:
        for db in ("pg", "mariadb"):
            print(db, len(product(db)))
        return 0
    if args.docs:
        write_docs()
        return 0
    test = "test_matrix_full" if args.full else "test_matrix_sample"
    command = [sys.executable, "-m", "pytest", "-n", "0", "-s", "--timeout", "0", "tests/test_values_matrix.py"]
    command += ["-k", test, *(["--soak"] if args.full else []), *rest]
    return subprocess.call(command, cwd=ROOT)


if __name__ == "__main__":
    sys.exit(main())
