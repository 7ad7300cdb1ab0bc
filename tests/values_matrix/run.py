"""Running cells against Spark's JDBC writer: many cells per Spark job, split in halves when a job is refused.

A batch of value cells of one path and zone is one pair of twin tables: a column per (Spark type, column
type), a row per edge value (NULL below the pair's last one).  When both writers write it, every cell is
judged by the stored text (tests/values_matrix/cells.py ``Column.read``).  When either refuses, the batch
is split in two and each half written again, down to single cells: a cell both refuse is judged by what
xasink left (nothing visible, nothing prepared).  Feature and NullType cells run alone.

A long run that knows the pairs xasink refuses by type (``by_type``) writes each such pair in batches of its
own (xasink refuses any batch it is in), goes to single cells at once when JDBC refuses one of its values, and
judges a pair's non-NULL cells without a write once JDBC refused the pair by type in any write.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from tests.targets import Target
from tests.values_harness import Twin, ValuesDriver, differences, write_both
from tests.values_matrix.cells import COLUMNS, SETUP, SPARK, ZONES, Cell
from tests.values_matrix.listed import Listed, match

MAX_PAIRS = 12  # columns of one batch


@dataclass(frozen=True)
class Outcome:
    """A cell's result: ``same``, ``refused`` (both, xasink leaving nothing), or a difference of ``kind``
    (``value``, ``jdbc-refuses``, ``xasink-refuses``, ``left``: xasink refused and left rows or branches)
    that is ``listed`` (a deliberate difference) or not."""

    cell: Cell
    kind: str
    detail: str = ""
    listed: Listed | None = None

    @property
    def verdict(self) -> str:
        if self.kind in ("same", "refused"):
            return self.kind
        if self.listed is None:
            return "unlisted"
        return "listed"

    def line(self) -> str:
        """What a report says of an unlisted cell, with the command that replays it."""
        return f"{self.cell.id} [{self.kind}] {self.detail}\n  replay: XASINK_MATRIX_CELLS='{self.cell.id}' " + (
            "python -m tests.values_matrix"
        )


def reason(error: str) -> str:
    """A writer's error in one line: the last ``...Error: ...``/``...Exception: ...`` line of its traceback."""
    lines = [line.strip() for line in error.splitlines() if re.search(r"(Error|Exception): ", line)]
    return (lines[-1] if lines else error.strip().splitlines()[0] if error.strip() else "")[:300]


def answer_of(twin: Twin, key: str) -> str:
    return str(twin.answer.get(key) or "")


def _differ(cell: Cell, kind: str, detail: str) -> Outcome:
    return Outcome(cell, kind, detail[:600], match(cell, kind))


class Matrix:
    """Runs cells of one database through one :class:`ValuesDriver` (its zone: America/New_York)."""

    def __init__(
        self,
        driver: ValuesDriver,
        db: Target,
        dbkey: str,
        tmp_path: Path,
        report: str = "",
        by_type: dict[tuple[str, str], str] | None = None,
    ) -> None:
        self.driver, self.db, self.dbkey, self.tmp_path = driver, db, dbkey, tmp_path
        self.report = report  # a file that gets a JSON line per cell as it is judged (a long run's progress)
        # the pairs xasink refuses by type (refused.py), for judging without a write the cells listed.py accepts
        # either way: refused by both, or refused by xasink alone as a listed difference (a long run's shortcut)
        self.by_type = by_type or {}
        # pairs xasink refuses by type that Spark's JDBC writer refused by type in some write, so that their other
        # cells are judged without a write: PostgreSQL's "column is of type date but expression is of type
        # numeric" (its parameter's type, set by the Spark type, whatever the value, path or zone: non-NULL
        # cells), Spark's "Can't get JDBC type for array<int>" (the frame's schema, before any row: every cell)
        self.jdbc_refuses: dict[tuple[str, str], tuple[str, bool]] = {}  # pair: (what JDBC said, NULLs too)
        self.jobs = 0
        for statement in SETUP[dbkey]:
            db.execute(statement)

    def run(self, cells: Iterable[Cell]) -> list[Outcome]:
        """Every cell's outcome, batched by path and zone."""
        groups: dict[tuple[str, ...], list[Cell]] = {}
        alone: list[Cell] = []
        out: list[Outcome] = []
        for cell in cells:
            judged = self._judged_by_type(cell)
            if judged is not None:
                out += self._emit([judged])
            elif cell.spark == "feature" or SPARK[cell.spark].null_type:
                alone.append(cell)
            elif (cell.spark, cell.column) in self.by_type:  # xasink refuses every batch it is in: a batch of its own
                groups.setdefault((cell.path, cell.zone, cell.spark, cell.column), []).append(cell)
            else:
                groups.setdefault((cell.path, cell.zone), []).append(cell)
        for group in groups.values():
            group.sort(key=lambda c: (c.spark, c.column))
            pairs = sorted({(c.spark, c.column) for c in group})
            for i in range(0, len(pairs), MAX_PAIRS):
                chunk = set(pairs[i : i + MAX_PAIRS])
                out += self._emit(self._batch([c for c in group if (c.spark, c.column) in chunk]))
        for cell in alone:
            out += self._emit(self._feature(cell) if cell.spark == "feature" else self._batch([cell]))
        return out

    def _judged_by_type(self, cell: Cell) -> Outcome | None:
        """A cell of a pair xasink refuses by type (its ``PreflightError``, before any branch opens: nothing can be
        left) whose refusal listed.py names: listed whatever JDBC does, so no write can fail it."""
        said = self.by_type.get((cell.spark, cell.column))
        if said is None:
            return None
        entry = match(cell, "xasink-refuses")
        return None if entry is None else Outcome(cell, "xasink-refuses", f"by type, not written: {said[:300]}", entry)

    def _emit(self, outcomes: list[Outcome]) -> list[Outcome]:
        if self.report:
            with open(self.report, "a", encoding="utf-8") as out:
                for o in outcomes:
                    entry = o.listed.key if o.listed else None
                    line = {
                        "cell": o.cell.id,
                        "verdict": o.verdict,
                        "kind": o.kind,
                        "listed": entry,
                        "detail": o.detail,
                    }
                    out.write(json.dumps(line) + "\n")
        return outcomes

    # -- value cells -------------------------------------------------------------------------------
    def _batch(self, cells: list[Cell]) -> list[Outcome]:
        refuses = self.jdbc_refuses
        known = [
            c
            for c in cells
            if (c.spark, c.column) in refuses and (c.value is not None or refuses[c.spark, c.column][1])
        ]
        if known:
            judged = [Outcome(c, "refused", "seen by type: " + refuses[(c.spark, c.column)][0]) for c in known]
            rest = [c for c in cells if c not in known]
            return judged + (self._batch(rest) if rest else [])
        pairs = sorted({(c.spark, c.column) for c in cells})
        names = {pair: f"c{i}" for i, pair in enumerate(pairs)}
        rows: dict[tuple[str, str], list[Cell]] = {pair: [] for pair in pairs}
        for cell in cells:
            rows[(cell.spark, cell.column)].append(cell)
        height = max(len(r) for r in rows.values())
        ddl = ["id int PRIMARY KEY"] + [f"{names[p]} {COLUMNS[self.dbkey][p[1]].ddl}" for p in pairs]
        data: dict[str, pa.Array] = {"id": pa.array(range(height), pa.int32())}
        select = ["id"]
        for pair in pairs:
            values = [c.value for c in rows[pair]] + [None] * (height - len(rows[pair]))
            data[names[pair]] = pa.array(values, SPARK[pair[0]].arrow)
            select.append(f"NULL AS {names[pair]}" if SPARK[pair[0]].null_type else names[pair])
        first = cells[0]
        twin = self._write(", ".join(ddl), pa.table(data), first, select)
        if twin.answer["ok"]:
            return self._judge(twin, pairs, names, rows)
        if len(cells) == 1:
            return [self._refusal(twin, first)]
        judged, rest = self._by_type(twin, cells, names)
        if judged:
            return judged + (self._batch(rest) if rest else [])
        if (
            len(pairs) == 1
            and pairs[0] in self.by_type
            and "Can't get JDBC type for" in answer_of(twin, "error")
            and "PreflightError" in answer_of(twin, "xasink_error")
            and not self._left(twin)
        ):
            self.jdbc_refuses[pairs[0]] = (f"jdbc: {reason(twin.answer['error'])}", True)
            return self._batch(cells)
        if len(pairs) == 1 and pairs[0] in self.by_type:
            # xasink refuses the pair whatever the values and JDBC refused one of them: JDBC's answer per value is
            # what is left to learn, and it mostly refuses them all (halving would take twice the writes)
            return [o for c in cells for o in self._batch([c])]
        if len(pairs) > 1:
            half = self._named(twin.answer, pairs, names) or set(pairs[: len(pairs) // 2])
            parts = [
                [c for c in cells if (c.spark, c.column) in half],
                [c for c in cells if (c.spark, c.column) not in half],
            ]
        else:
            parts = [cells[: len(cells) // 2], cells[len(cells) // 2 :]]
        return self._batch(parts[0]) + self._batch(parts[1])

    def _by_type(self, twin: Twin, cells: list[Cell], names: dict[tuple[str, str], str]) -> tuple[list, list]:
        """Cells judged by a refusal by type, and the rest.  xasink refuses a pair by its types before writing
        (``PreflightError: column 'c3': ...``), whatever the values: if JDBC wrote the batch, every value of
        the pair is a difference; if JDBC refused the pair by type too (PostgreSQL: ``column "c3" is of type
        date but expression is of type numeric``, decided by the setter's type), every non-NULL value of it is
        refused alike (JDBC types a NULL otherwise: those cells run on)."""
        answer = twin.answer
        ours = re.search(r"PreflightError: column '(c\d+)'", answer.get("xasink_error") or answer.get("error", ""))
        if ours is None or self._left(twin):
            return [], cells  # not refused by type, or xasink left something: single cells tell
        pair = next((p for p, name in names.items() if name == ours.group(1)), None)
        if answer["writer"] == "xasink":
            said = reason(answer["error"])
            judged = [
                _differ(c, "xasink-refuses", f"{said} | jdbc wrote the batch")
                for c in cells
                if (c.spark, c.column) == pair
            ]
        else:
            theirs = re.findall(r'column "(c\d+)" is of type .* but expression is of type', reason(answer["error"]))
            if ours.group(1) not in theirs:
                return [], cells
            said = f"by type: jdbc: {reason(answer['error'])} | xasink: {reason(answer['xasink_error'])}"
            if pair in self.by_type:
                self.jdbc_refuses[pair] = (said, False)
            judged = [Outcome(c, "refused", said) for c in cells if (c.spark, c.column) == pair and c.value is not None]
        taken = {c.id for c in (o.cell for o in judged)}
        return judged, [c for c in cells if c.id not in taken]

    def _left(self, twin: Twin) -> bool:
        """Did xasink's refused write leave a row (but the overwrite path's own -1) or a prepared branch?"""
        return bool([r for r in self.db.rows(twin.xasink, "id") if r[0] != -1] or self.db.prepared())

    @staticmethod
    def _named(answer: dict[str, Any], pairs: list[tuple[str, str]], names: dict[tuple[str, str], str]) -> set:
        """The pairs whose columns the writers' errors name (``column 'c3'``, ``"c3"``): split off first, where
        halving would take several writes to find them."""
        said = " ".join(reason(answer.get(key, "")) for key in ("error", "xasink_error"))
        named = {pair for pair in pairs if re.search(rf"\b{names[pair]}\b", said)}
        return named if 0 < len(named) < len(pairs) else set()

    def _write(self, ddl: str, data: pa.Table, cell: Cell, select: list[str] | None = None, after: Any = ()) -> Twin:
        self.jobs += 1
        return write_both(
            self.driver,
            self.db,
            ddl,
            data,
            self.tmp_path,
            cell.path,
            select,
            ZONES[cell.zone],
            after_create=list(after),
        )

    def _read(self, table: str, pairs: list[tuple[str, str]], names: dict[tuple[str, str], str]) -> dict[Any, tuple]:
        exprs = []
        for pair in pairs:
            q = self.db.q(names[pair])
            if self.dbkey == "pg":
                exprs.append(f"{q}::text")
            else:
                exprs.append(f"HEX({q})" if COLUMNS["mariadb"][pair[1]].read == "hex" else f"CAST({q} AS CHAR)")
        got = self.db.execute(f"SELECT id, {', '.join(exprs)} FROM {self.db.q(table)} ORDER BY id")
        return {row[0]: tuple(row[1:]) for row in got}

    def _judge(self, twin: Twin, pairs: list, names: dict, rows: dict) -> list[Outcome]:
        jdbc, ours = self._read(twin.jdbc, pairs, names), self._read(twin.xasink, pairs, names)
        out = []
        for j, pair in enumerate(pairs):
            for i, cell in enumerate(rows[pair]):
                a, b = jdbc.get(i, ("<no row>",) * len(pairs))[j], ours.get(i, ("<no row>",) * len(pairs))[j]
                out.append(Outcome(cell, "same") if a == b else _differ(cell, "value", f"jdbc {a!r} xasink {b!r}"))
        if set(jdbc) != set(ours):  # an overwrite that kept the row before it, on one side
            out = [
                o if o.kind != "same" else _differ(o.cell, "value", f"rows {sorted(jdbc)} {sorted(ours)}") for o in out
            ]
        return out

    def _refusal(self, twin: Twin, cell: Cell) -> Outcome:
        answer = twin.answer
        assert "ClassNotFoundException" not in answer.get("error", ""), f"no JDBC driver jar: {answer['error']}"
        if answer["writer"] == "xasink":
            return _differ(cell, "xasink-refuses", reason(answer["error"]))
        if "xasink_error" not in answer:
            written = self.db.rows(twin.xasink, "id")
            return _differ(cell, "jdbc-refuses", f"jdbc: {reason(answer['error'])} | xasink stored {written!r}")
        left = [r for r in self.db.rows(twin.xasink, "id") if r[0] != -1]
        prepared = self.db.prepared()
        if left or prepared:
            return _differ(
                cell, "left", f"xasink refused ({reason(answer['xasink_error'])}) and left {left} {prepared}"
            )
        return Outcome(cell, "refused", f"jdbc: {reason(answer['error'])} | xasink: {reason(answer['xasink_error'])}")

    # -- feature cells -----------------------------------------------------------------------------
    def _feature(self, cell: Cell) -> list[Outcome]:
        feature = cell.feature
        assert feature is not None
        data = {"id": pa.array([0], pa.int32())}
        data |= {name: pa.array([value], type_) for name, (value, type_) in feature.data.items()}
        twin = self._write("id int PRIMARY KEY, " + feature.columns, pa.table(data), cell, after=feature.after_create)
        if not twin.answer["ok"]:
            return [self._refusal(twin, cell)]
        jdbc, ours = twin.rows()
        names = [d[0] for d in self._describe(twin.jdbc)]
        found = differences(jdbc, ours, names) if len(jdbc) == len(ours) else [("rows", "*", jdbc, ours)]
        return [_differ(cell, "value", f"{found}") if found else Outcome(cell, "same")]

    def _describe(self, table: str) -> list[Any]:
        with self.db.connect() as conn, conn.cursor() as cur:
            cur.execute(f"SELECT * FROM {self.db.q(table)} WHERE 1 = 0")
            return list(cur.description)


def tally(outcomes: list[Outcome]) -> dict[str, int]:
    """Cells by verdict: same, refused, listed, unlisted."""
    counts = {"cells": len(outcomes), "same": 0, "refused": 0, "listed": 0, "unlisted": 0}
    for o in outcomes:
        counts[o.verdict] += 1
    return counts
