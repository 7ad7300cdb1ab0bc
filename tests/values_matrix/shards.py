"""The full matrix in shards: which shards of which database have run whole, with what result.

``XASINK_MATRIX_SHARD=i/n`` runs shard i of n (:func:`tests.values_matrix.cells.shard`); a shard that ends with
no unlisted difference is recorded in ``shards.json`` beside this module, so a run spread over days (the whole
product is hours per database) adds up, and ``python -m tests.values_matrix --shards`` says how far it is.  A
record counts only while its shard still holds the cells it ran (a cell added to the product makes it stale).
"""

from __future__ import annotations

import fcntl
import json
import subprocess
from pathlib import Path
from typing import Any

from tests.values_matrix.cells import product, shard

RECORDS = Path(__file__).with_name("shards.json")
COUNT = 24  # the shards the full matrix is cut into (docs/testing.md): 400 to 2,100 cells each


def parse(text: str) -> tuple[int, int]:
    """``"i/n"`` as (i, n)."""
    index, _, count = text.partition("/")
    return int(index), int(count)


def commit() -> str:
    """The checkout's commit (read when a shard starts: its code is that commit's, plus any uncommitted change)."""
    got = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=RECORDS.parent)
    return got.stdout.strip() or "unknown"


def record(db: str, part: str, counts: dict[str, int], writes: int, seconds: float, at: str) -> None:
    """Keep a finished shard's result (replacing an earlier run of the same shard)."""
    index, count = parse(part)
    entry = {"db": db, "shard": index, "of": count, **counts, "writes": writes, "seconds": round(seconds)}
    entry["commit"] = at
    with open(RECORDS, "a+", encoding="utf-8") as file:
        fcntl.flock(file, fcntl.LOCK_EX)  # the two databases' runs end at any time
        file.seek(0)
        runs = json.loads(file.read() or "[]")
        runs = [r for r in runs if (r["db"], r["shard"], r["of"]) != (db, index, count)] + [entry]
        runs.sort(key=lambda r: (r["db"], r["of"], r["shard"]))
        file.seek(0)
        file.truncate()
        file.write(json.dumps(runs, indent=1) + "\n")


def runs() -> list[dict[str, Any]]:
    return list(json.loads(RECORDS.read_text(encoding="utf-8"))) if RECORDS.exists() else []


def progress() -> str:
    """Per database: the cells of current records out of the product, the tallies summed, the shards to run."""
    lines = []
    for db in ("pg", "mariadb"):
        total = len(product(db))
        done = [r for r in runs() if r["db"] == db and r["of"] == COUNT]
        current = [r for r in done if r["cells"] == len(shard(db, r["shard"], COUNT))]
        sums = {k: sum(r[k] for r in current) for k in ("cells", "same", "refused", "listed", "unlisted", "writes")}
        hours = sum(r["seconds"] for r in current) / 3600
        todo = sorted(set(range(COUNT)) - {r["shard"] for r in current})
        lines.append(
            f"{db}: {sums['cells']} of {total} cells in {len(current)} of {COUNT} shards ({hours:.1f} h): {sums}"
        )
        stale = sorted(r["shard"] for r in done if r not in current)
        lines.append(f"  to run: {todo}" + (f" (stale: {stale})" if stale else ""))
    return "\n".join(lines)
