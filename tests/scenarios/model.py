"""The scenario checker's schedules: pure Python, no database, no xasink code.

A :class:`Schedule` is drawn from a seed by :func:`draw`: two to four writers of one sink (same or
different batch ids, empty and non-empty partitions, one write mode per schedule), ``xasink recover``
runs (some under a short statement timeout), and for each writer perhaps a fault at a protocol point
(``kill``, ``raise`` or a pause ``sleep=``).  The same seed always draws the same schedule.  Other kinds
are drawn by :func:`draw_query` (a restart from a new checkpoint), tests/scenarios/interference.py
(interference from outside xasink: :class:`Event`) and tests/scenarios/multi.py (multi-target
transactions).  This module also holds each write mode's semantics (:func:`expected_state`), which the
oracle (tests/scenarios/oracle.py) applies.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import asdict, dataclass, field
from typing import Any

MODES = ("append", "upsert", "overwrite", "replaceWhere", "changes")
KEYS = 12  # keyed modes draw keys from 0..KEYS-1
INITIAL_KEYS = range(0, 6)  # rows the table holds before the schedule ("init")
CHILD_KEYS = (1, 3, 5)  # a child table refers to these parents (ON DELETE CASCADE)
REPLACE_FROM = 4  # replaceWhere's predicate: id >= REPLACE_FROM
TASK_POINTS = ("task.before_load", "task.before_prepare", "task.after_prepare")
DRIVER_POINTS = (
    "driver.before_decide",
    "driver.after_decide",
    "driver.after_first_commit",
    "driver.after_commits",
    "driver.after_mark",
)
AFTER_DECISION = ("driver.after_decide", "driver.after_first_commit", "driver.after_commits", "driver.after_mark")
# an overwrite's swap (docs/write-modes.md): PostgreSQL's inside its apply transaction, MariaDB's committed steps
# (built, renamed: the point of no return, marked); a point the database's apply never reaches never fires
SWAP_POINTS = ("driver.swap_loaded", "driver.swap_built", "driver.swap_renamed", "driver.swap_marked")
COMMIT_TIMEOUT_S = 8  # commitTimeout of every writer (unless the schedule's options say otherwise)
LOCK_TIMEOUT_S = 4  # lockTimeout and controlLockTimeout of every writer (idem)
UNKNOWN_QUERY = "unknown"  # what xasink records for a micro-batch whose query it cannot know (journal/targets.py)
WRITER_OPTIONS = {
    "commitTimeout": COMMIT_TIMEOUT_S,
    "lockTimeout": LOCK_TIMEOUT_S,
    "controlLockTimeout": LOCK_TIMEOUT_S,
}
MARGIN_S = 25.0  # "no process waits past commitTimeout plus a margin" (2 shared CPUs, several sessions)

Row = tuple[Any, ...]  # (id, name) or, for change data, (id, name, seq, is_delete)


@dataclass
class Writer:
    label: str  # w0, w1, ...: also the ``name`` of its rows
    batch: int
    partitions: list[list[Row]]
    fault: str | None  # an XASINK_FAULT spec, or None
    start: float  # seconds after the schedule starts
    query: str | None = None  # the streaming query's id it writes for (``draw_query``), or None
    after: str | None = None  # the user's next run: starts ``start`` seconds after this writer's process ended

    @property
    def rows(self) -> list[Row]:
        return [r for p in self.partitions for r in p]

    def pause(self) -> float:
        if self.fault and "sleep=" in self.fault:  # a spec may name several points (comma-separated)
            return sum(float(s) for s in re.findall(r"sleep=([0-9.]+)", self.fault))
        return 0.0


@dataclass
class Recover:
    start: float
    statement_timeout_ms: int | None  # None: no timeout
    fault: str | None = None  # an XASINK_FAULT spec of the recover process (a pause inside its apply)
    anchor: str | None = None  # "w0:driver.after_commits": ``start`` counts from that writer reaching that point


@dataclass
class Event:
    """Interference from outside xasink (tests/scenarios/interference.py runs it): a reader's transaction holding
    a lock, a column added to the table, the database server killed and started again."""

    kind: str  # one of interference.KINDS
    start: float  # seconds after the schedule starts, or after ``anchor``
    hold: float  # seconds the lock is held, the column stays required, the server stays down
    anchor: str | None = None  # "w0:driver.after_commits": ``start`` counts from that writer reaching that point
    db: str = ""  # a multi-target schedule's database ("pg", "maria"); else the schedule's one
    until: str | None = None  # "w1:driver.after_decide": the hold ends there already, if that writer gets there


def anchor_of(spec: str) -> tuple[str, str]:
    """(writer label, fault point) of an anchor ``"w0:driver.after_commits"``."""
    label, _, point = spec.partition(":")
    return label, point


@dataclass
class Schedule:
    seed: int
    mode: str
    writers: list[Writer]
    recovers: list[Recover] = field(default_factory=list)
    name: str = ""  # a kept schedule's name (tests/scenarios/found.json); drawn ones have none
    kind: str = ""  # "" (``draw``), "query" (``draw_query``), "interfere" (``interference.draw_interfere``)
    events: list[Event] = field(default_factory=list)  # interference from outside xasink
    # the writers' options over WRITER_OPTIONS (journalRetention, shorter timeouts), and "statementTimeoutMs":
    # a statement timeout the target imposes on the writers' sessions (in their URL, as a DBA's role setting)
    options: dict[str, Any] = field(default_factory=dict)
    # keyed modes: a child table refers to the table (an overwrite then replaces in place by key); without one an
    # overwrite swaps the table's storage (PostgreSQL) or renames a new table into its place (MariaDB)
    child: bool = True

    def option(self, name: str) -> Any:
        return {**WRITER_OPTIONS, **self.options}.get(name)

    def limit(self, w: Writer) -> float:
        """How long the writer ``w`` may take before it counts as hung: commitTimeout, three lock waits, its
        pauses, the margin, and whatever the schedule's interference holds (a restart's downtime included)."""
        waits = self.option("commitTimeout") + 3 * self.option("lockTimeout")
        return waits + w.pause() + MARGIN_S + sum(e.hold for e in self.events)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Schedule:
        """A schedule written by :meth:`to_json` (tests/scenarios/found.json keeps those that found bugs)."""
        writers = [Writer(**{**w, "partitions": tuples(w["partitions"])}) for w in d["writers"]]
        recovers = [Recover(**r) for r in d.get("recovers", [])]
        events = [Event(**e) for e in d.get("events", [])]
        return cls(**{**d, "writers": writers, "recovers": recovers, "events": events})

    def replay(self) -> str:
        """How to run this schedule again."""
        if self.name:
            return f"XASINK_SCENARIO_FOUND={self.name} pytest tests/test_scenarios.py -k found"
        test = {
            "query": "test_scenarios_query",
            "interfere": "test_scenarios_interfere",
            "swap": "test_scenarios_swap",
        }.get(self.kind, "test_scenarios")
        return f"XASINK_SCENARIO_SEED={self.seed} pytest tests/test_scenarios.py -k '{test} and not long'"

    def describe(self) -> str:
        kind = f" ({self.kind})" if self.kind else ""
        options = f", options {json.dumps(self.options, sort_keys=True)}" if self.options else ""
        lines = [f"{self.name or 'seed ' + str(self.seed)}{kind}: mode {self.mode}{options}"]
        for w in self.writers:
            parts = " | ".join(
                ",".join(str(r[0]) + ("-" if len(r) > 2 and r[3] else "") for r in p) or "-" for p in w.partitions
            )
            query = f" query {w.query}" if w.query else ""
            when = f"{w.start:.2f}s after {w.after} ended" if w.after else f"at {w.start:.2f}s"
            lines.append(f"  {w.label} batch {w.batch}{query} {when} fault {w.fault or '-'}: [{parts}]")
        for r in self.recovers:
            fault = f" fault {r.fault}" if r.fault else ""
            lines.append(
                f"  recover {at(r.start, r.anchor)} statement timeout {r.statement_timeout_ms or '-'} ms{fault}"
            )
        for e in self.events:
            until = f" or until {e.until}" if e.until else ""
            lines.append(f"  {e.kind}{' on ' + e.db if e.db else ''} {at(e.start, e.anchor)} for {e.hold:.2f}s{until}")
        return "\n".join(lines)


def at(start: float, anchor: str | None) -> str:
    """When an anchored (or timed) item starts, in words."""
    return f"{start:.2f}s after {anchor}" if anchor else f"at {start:.2f}s"


def tuples(partitions: list[list[list[Any]]]) -> list[list[Row]]:
    """Partitions read back from JSON (rows as lists) with their rows as tuples again."""
    return [[tuple(r) for r in p] for p in partitions]


def split_rows(rng: random.Random, rows: list[Row]) -> list[list[Row]]:
    """One to three partitions, some of them empty."""
    n = rng.randint(1, 3)
    parts: list[list[Row]] = [[] for _ in range(n)]
    for row in rows:
        parts[rng.randrange(n)].append(row)
    if rng.random() < 0.3:
        parts.insert(rng.randrange(n + 1), [])  # an empty partition besides
    return parts


def batch_rows(rng: random.Random, mode: str, index: int, label: str, seqs: list[int]) -> list[Row]:
    if rng.random() < 0.2:
        return []  # every partition empty
    if mode == "append":
        return [(1000 * (index + 1) + i, label) for i in range(rng.randint(1, 6))]
    if mode == "replaceWhere":
        keys = rng.sample(range(REPLACE_FROM, KEYS), rng.randint(1, 5))
        if rng.random() < 0.1:
            keys.append(rng.randrange(REPLACE_FROM))  # a row outside replaceWhere: the batch must fail
        return [(k, label) for k in keys]
    keys = rng.sample(range(KEYS), rng.randint(1, 6))
    if mode == "changes":
        out: list[Row] = [(k, label, seqs.pop(), rng.random() < 0.35) for k in keys]
        if rng.random() < 0.2:  # a second change of one key in the same batch: the higher sequence wins
            out.append((keys[0], label, seqs.pop(), rng.random() < 0.5))
        return out
    return [(k, label) for k in keys]


def _fault(rng: random.Random, partitions: list[list[Row]]) -> str | None:
    roll = rng.random()
    if roll < 0.35:
        return None
    if roll < 0.6:  # a pause: the run stays alive but slow at that point (most often just before its decision)
        point = rng.choice(TASK_POINTS + DRIVER_POINTS + ("driver.before_decide",) * 3)
        action = f"sleep={rng.choice((0.3, 0.8, 1.5, 2.5))}"
    elif roll < 0.9:  # a crash, most often right after the decision
        point, action = rng.choice(TASK_POINTS + DRIVER_POINTS + AFTER_DECISION), "kill"
    else:  # a task fails; with a=0 only its first attempt, so the retry may succeed
        point, action = rng.choice(TASK_POINTS), "raise" + rng.choice(("", ":a=0"))
    if point.startswith("task."):
        full = [p for p, rows in enumerate(partitions) if rows]
        if not full:
            return None  # an empty partition reaches no task point
        return f"{point}:{action}:p={rng.choice(full)}"
    return f"{point}:{action}"


def draw(seed: int, mode: str | None = None) -> Schedule:
    """The schedule of one seed; its mode is ``MODES[seed % 5]`` unless given."""
    rng = random.Random(seed)
    mode = mode or MODES[seed % len(MODES)]
    seqs = rng.sample(range(1, 10_000), 40)  # change-data sequences: distinct within a schedule
    writers = []
    batches = [1, 1, 2] if rng.random() < 0.7 else [1, 2, 3]
    start = 0.0
    for i in range(rng.randint(2, 4)):
        label = f"w{i}"
        partitions = split_rows(rng, batch_rows(rng, mode, i, label, seqs))
        writers.append(Writer(label, rng.choice(batches), partitions, _fault(rng, partitions), round(start, 2)))
        start += rng.choice((0.0, 0.1, 0.3, 0.7, 1.2))
    recovers = [
        Recover(round(rng.uniform(0.5, start + 3.0), 2), rng.choice((None, 1, 5, 20, 100)))
        for _ in range(rng.choice((0, 1, 1, 2, 2)))
    ]
    return Schedule(seed, mode, writers, recovers)


def draw_query(seed: int) -> Schedule:
    """A restart from a new checkpoint (issue 28): writers of one batch for streaming queries ``qA`` and
    ``qB`` (another query identity, same sink and batch id), some one after the other, some at once, and a
    true replay of ``qA`` besides; some (issue 37) write where their query cannot be known (``UNKNOWN_QUERY``).
    A run of another query than the one that decided its batch, or of an unknown one, must be refused (an
    error, nothing of it visible), never told "skipped".  Append or upsert."""
    base = draw(seed, "append" if seed % 2 == 0 else "upsert")
    rng = random.Random(seed ^ 0x5EED)
    for i, w in enumerate(base.writers):
        w.batch = 1
        w.query = "qA" if i == 0 else rng.choice(("qA", "qB", "qB"))
        if i > 0 and rng.random() < 0.6:
            w.start = round(base.writers[i - 1].start + rng.choice((3.0, 6.0, 12.0)), 2)  # after it, most likely
    if not any(w.query == "qB" for w in base.writers):
        base.writers[-1].query = "qB"
    # issue 37 item 7: a micro-batch written where its query cannot be known (a pool thread under Spark Connect,
    # a query not tied yet: docs/protocol.md "From which thread") is recorded as UNKNOWN_QUERY; it replays nothing
    blind = random.Random(seed ^ 0x37)
    for w in base.writers[1:]:  # a later run of qA's own batch that cannot say it is qA's: refused, never skipped
        if w.query == "qA" and blind.random() < 0.4:
            w.query = UNKNOWN_QUERY
    base.kind = "query"
    return base


def draw_swap(seed: int) -> Schedule:
    """An overwrite of a table nothing refers to, so it is swapped (PostgreSQL) or renamed in (MariaDB), with
    pauses and kills at the swap's own points, most often between MariaDB's rename and the batch's mark."""
    base = draw(seed, "overwrite")
    rng = random.Random(seed ^ 0x40)
    base.child = False
    for w in base.writers:
        if rng.random() < 0.6:
            point = rng.choice((*SWAP_POINTS, "driver.swap_renamed", "driver.apply_statements"))
            w.fault = f"{point}:{rng.choice(('kill', 'kill', 'sleep=1.5'))}"
    base.kind = "swap"
    return base


def same_query(decided: str | None, mine: str | None) -> bool:
    """Whether a run of query ``mine`` replays a batch its query ``decided`` committed: the same query (a batch
    job's None included); a run whose query cannot be known replays nothing."""
    return mine != UNKNOWN_QUERY and decided == mine


# --------------------------------------------------------------------------- the tables


def initial_rows(mode: str) -> list[Row]:
    if mode == "append":
        return [(i, "init") for i in range(3)]
    if mode == "changes":
        return [(k, "init", 0) for k in INITIAL_KEYS]
    return [(k, "init") for k in INITIAL_KEYS]


def apply_run(mode: str, table: dict[Any, Row], tombs: dict[int, int], rows: list[Row]) -> None:
    """One committed batch of a keyed mode, as docs/write-modes.md defines it."""
    if mode == "overwrite":
        table.clear()
    if mode == "replaceWhere":
        for k in [k for k in table if k >= REPLACE_FROM]:
            del table[k]
    if mode != "changes":
        for r in rows:
            table[r[0]] = r
        return
    newest: dict[int, Row] = {}
    for r in rows:
        if r[0] not in newest or r[2] > newest[r[0]][2]:
            newest[r[0]] = r
    for k, (_, name, seq, delete) in newest.items():
        current = table[k][2] if k in table else tombs.get(k)
        if current is not None and seq < current:
            continue  # an older change never moves a key backwards
        if delete:
            table.pop(k, None)
            tombs[k] = seq
        else:
            table[k] = (k, name, seq)
            tombs.pop(k, None)


def expected_state(mode: str, runs: list[Writer], child_table: bool = True) -> tuple[list[Row], list[Row]]:
    """The table's rows and the child table's rows (none without ``child_table``) after ``runs`` committed in
    this order.

    A child row goes (ON DELETE CASCADE) once its parent key is absent after some batch: a keyed
    overwrite updates the keys it keeps in place, so their children stay.
    """
    if mode == "append":
        return sorted(initial_rows(mode) + [r for w in runs for r in w.rows]), []
    table: dict[Any, Row] = {r[0]: r for r in initial_rows(mode)}
    tombs: dict[int, int] = {}
    child = child_rows() if child_table else []
    for w in runs:
        apply_run(mode, table, tombs, w.rows)
        child = [c for c in child if c[1] in table]
    return sorted(table.values()), child


def can_commit(mode: str, w: Writer) -> bool:
    """Whether the run's rows can be committed at all (replaceWhere: a row outside it fails the batch)."""
    return not (mode == "replaceWhere" and any(r[0] < REPLACE_FROM for r in w.rows))


def child_rows() -> list[Row]:
    """(child id, parent id) rows of the child table before the schedule."""
    return [(100 + k, k) for k in CHILD_KEYS]
