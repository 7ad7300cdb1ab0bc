"""The scenario checker's schedules and its oracle: pure Python, no database, no xasink code.

A :class:`Schedule` is drawn from a seed by :func:`draw`: two to four writers of one sink (same or
different batch ids, empty and non-empty partitions, one write mode per schedule), ``xasink recover``
runs (some under a short statement timeout), and for each writer perhaps a fault at a protocol point
(``kill``, ``raise`` or a pause ``sleep=``).  The same seed always draws the same schedule.

The oracle (:func:`check`) judges what the runs were *told*, never what the code did or what the
decision log says: it looks for a set of runs whose rows are committed, and an order of them, that
explains the final table exactly (each write mode's semantics applied to the initial rows), under the
constraints the runs' answers impose:

- "written": the run is in the set (its rows were applied before it answered); at most one per batch;
- "skipped": the run is not in the set, and its batch has a run in the set;
- an error that says nothing of the run is visible (a ``BatchAbortedError``, a failure before the
  decision): not in the set; "decided, recovery will finish it" (``CommitIncompleteError``): in it;
  "decided by another run, recovery will finish it" (``ReplayIncompleteError``): not in the set, and its
  batch has a run in the set (a "skipped" whose batch was not finished yet);
- killed by its fault at a point after the decision: in the set (a decided batch is finished forward);
- killed elsewhere, or any other error: either;
- a run in the set was applied after it started, and after every run told "written" that answered
  before it started;
- a run whose claim was superseded (another run of its batch took the batch over after it claimed and
  before it began committing) is never told "written" (docs/protocol.md: one writer per sinkId; the
  newer one takes the batch over);
- the sibling table (never written) and the child rows of keys still present are untouched.

With at most four runs the search is exhaustive (at most 65 ordered subsets).
"""

from __future__ import annotations

import itertools
import json
import random
import re
from collections import Counter
from collections.abc import Iterable
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
COMMIT_TIMEOUT_S = 8  # commitTimeout of every writer
LOCK_TIMEOUT_S = 4  # lockTimeout and controlLockTimeout of every writer
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


@dataclass
class Schedule:
    seed: int
    mode: str
    writers: list[Writer]
    recovers: list[Recover] = field(default_factory=list)
    name: str = ""  # a kept schedule's name (tests/scenarios/found.json); drawn ones have none
    kind: str = ""  # "" (``draw``) or "query" (``draw_query``): which test draws it

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Schedule:
        """A schedule written by :meth:`to_json` (tests/scenarios/found.json keeps those that found bugs)."""
        writers = [Writer(**{**w, "partitions": tuples(w["partitions"])}) for w in d["writers"]]
        recovers = [Recover(**r) for r in d.get("recovers", [])]
        return cls(**{**d, "writers": writers, "recovers": recovers})

    def replay(self) -> str:
        """How to run this schedule again."""
        if self.name:
            return f"XASINK_SCENARIO_FOUND={self.name} pytest tests/test_scenarios.py -k found"
        test = "test_scenarios_query" if self.kind == "query" else "test_scenarios"
        return f"XASINK_SCENARIO_SEED={self.seed} pytest tests/test_scenarios.py -k '{test} and not long'"

    def describe(self) -> str:
        lines = [f"{self.name or 'seed ' + str(self.seed)}: mode {self.mode}"]
        for w in self.writers:
            parts = " | ".join(
                ",".join(str(r[0]) + ("-" if len(r) > 2 and r[3] else "") for r in p) or "-" for p in w.partitions
            )
            query = f" query {w.query}" if w.query else ""
            lines.append(f"  {w.label} batch {w.batch}{query} at {w.start:.2f}s fault {w.fault or '-'}: [{parts}]")
        for r in self.recovers:
            lines.append(f"  recover at {r.start:.2f}s statement timeout {r.statement_timeout_ms or '-'} ms")
        return "\n".join(lines)


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


def _rows(rng: random.Random, mode: str, index: int, label: str, seqs: list[int]) -> list[Row]:
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
        partitions = split_rows(rng, _rows(rng, mode, i, label, seqs))
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
    true replay of ``qA`` besides.  A run of another query than the one that decided its batch must be
    refused (an error, nothing of it visible), never told "skipped".  Append or upsert."""
    base = draw(seed, "append" if seed % 2 == 0 else "upsert")
    rng = random.Random(seed ^ 0x5EED)
    for i, w in enumerate(base.writers):
        w.batch = 1
        w.query = "qA" if i == 0 else rng.choice(("qA", "qB", "qB"))
        if i > 0 and rng.random() < 0.6:
            w.start = round(base.writers[i - 1].start + rng.choice((3.0, 6.0, 12.0)), 2)  # after it, most likely
    if not any(w.query == "qB" for w in base.writers):
        base.writers[-1].query = "qB"
    base.kind = "query"
    return base


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


def expected_state(mode: str, runs: list[Writer]) -> tuple[list[Row], list[Row]]:
    """The table's rows and the child table's rows after ``runs`` committed in this order.

    A child row goes (ON DELETE CASCADE) once its parent key is absent after some batch: a keyed
    overwrite updates the keys it keeps in place, so their children stay.
    """
    if mode == "append":
        return sorted(initial_rows(mode) + [r for w in runs for r in w.rows]), []
    table: dict[Any, Row] = {r[0]: r for r in initial_rows(mode)}
    tombs: dict[int, int] = {}
    child = child_rows()
    for w in runs:
        apply_run(mode, table, tombs, w.rows)
        child = [c for c in child if c[1] in table]
    return sorted(table.values()), child


def can_commit(mode: str, w: Writer) -> bool:
    """Whether the run's rows can be committed at all (replaceWhere: a row outside it fails the batch)."""
    return not (mode == "replaceWhere" and any(r[0] < REPLACE_FROM for r in w.rows))


# --------------------------------------------------------------------------- the oracle


@dataclass
class Told:
    """What one run reported (JSON lines of tests/scenarios/driver.py) and how long it took."""

    outcome: str  # written | skipped | error | killed | hung (killed by the runner) | lost (exited silently)
    started: float  # monotonic, when the process started
    ended: float
    error: str = ""  # the exception's class names, innermost first
    message: str = ""
    phase: str = ""  # where an error was raised: plan, tasks, commit
    claiming_at: float | None = None  # it began its claim (the claim took the batch over in [claiming_at, claimed_at])
    claimed_at: float | None = None  # its claim had taken the batch over by then (None: no claim, or a replay)
    committing_at: float | None = None  # it entered the commit (decision) at this time
    forked_at: float | None = None  # its process began to run the writer
    told_at: float | None = None  # it wrote its outcome

    def replayed(self) -> bool:
        """Told its batch was decided by another run whose finish failed: a "skipped" not finished yet."""
        return self.outcome == "error" and "ReplayIncompleteError" in self.error

    def membership(self) -> bool | None:
        """True: its rows must be committed; False: they must not; None: either."""
        if self.outcome == "written":
            return True
        if self.outcome == "skipped":
            return False
        if self.outcome != "error":
            return None  # killed or hung
        if self.phase in ("plan", "tasks"):
            return False  # it never decided: nothing of it can commit
        if self.replayed():
            return False  # another run's decision of its batch: that run is in the set (see explain)
        if "CommitIncompleteError" in self.error and "DecisionUnknownError" not in self.error:
            return True
        if "BatchAbortedError" in self.error:
            return False
        return None


def check(
    schedule: Schedule,
    told: dict[str, Told],
    table: list[Row],
    prepared: list[str],
    sibling_ok: bool,
    child: list[Row],
    recover_rc: int | None,
) -> list[str]:
    """The violations of one run of the schedule (empty: what the runs were told is true)."""
    found: list[str] = []
    mode = schedule.mode
    if prepared:
        found.append(f"left prepared after the final recover: {prepared}")
    # exit 2 is also the documented answer for a decided batch it had to withdraw (docs/operations.md: its
    # rows break the table, here a row outside replaceWhere), possible when that batch's writer was killed
    # after its decision (PostgreSQL seed 1708)
    withdrawn = any(decided_when_killed(w, told[w.label]) and not can_commit(mode, w) for w in schedule.writers)
    if recover_rc not in (0, None) and not (recover_rc == 2 and withdrawn):
        found.append(f"the final `xasink recover` exited {recover_rc}")
    if not sibling_ok:
        found.append("a table the sink never writes was changed")
    found += unfinished(told)
    by_label = {w.label: w for w in schedule.writers}
    found += twice((by_label[label].batch for label, t in told.items() if t.outcome == "written"), "told 'written'")
    for label, t in told.items():
        w = by_label[label]
        if t.outcome == "written" and not can_commit(mode, w):
            found.append(f"{label} told 'written' though a row is outside replaceWhere")
        if t.outcome != "written" or t.claimed_at is None or t.committing_at is None:
            continue
        # the decision comes after the commit began, and after a pause the schedule put just before it
        decides = t.committing_at + (w.pause() if (w.fault or "").startswith("driver.before_decide") else 0.0)
        for other_label, o in told.items():
            if other_label == label or by_label[other_label].batch != w.batch or o.claimed_at is None:
                continue
            if took_over_before(t, o, decides):
                found.append(
                    f"{label} told 'written' though {other_label} took batch {w.batch} over "
                    f"{decides - o.claimed_at:.3f}s before {label} could decide"
                )
    if explain(schedule, told, table, child) is None and explain(schedule, told, table, None) is not None:
        found.append(
            f"the child table lost rows whose parent key is still there (or kept rows whose parent is gone): {child}"
        )
    elif explain(schedule, told, table, child) is None:
        found.append(
            "no set and order of runs explains the table (and its child rows): "
            f"{table} {child}; told: "
            + "; ".join(f"{label} {t.outcome} {t.phase} {t.error.split(' ')[0]}".strip() for label, t in told.items())
        )
    return found


def took_over_before(t: Told, o: Told, decides: float) -> bool:
    """Whether ``o``'s claim surely came after ``t``'s and before ``t``'s decision at ``decides``.

    Claims are ordered by the journal's sink lock, not by the times the runs wrote down: each is known only
    to lie between its ``claiming_at`` and ``claimed_at``, and a busy machine can stretch that by tenths of
    a second.  Overlapping windows prove nothing (MariaDB seed 9427 under load: a claim written down 0.17 s
    late).
    """
    assert t.claimed_at is not None and o.claimed_at is not None
    began = o.claiming_at if o.claiming_at is not None else o.claimed_at
    return t.claimed_at < began and o.claimed_at < decides


def child_rows() -> list[Row]:
    """(child id, parent id) rows of the child table before the schedule."""
    return [(100 + k, k) for k in CHILD_KEYS]


def explain(schedule: Schedule, told: dict[str, Told], table: list[Row], child: list[Row] | None) -> list[str] | None:
    """An ordered set of runs whose rows give exactly ``table`` (and ``child``, unless None) under every
    constraint, or None."""
    mode, writers = schedule.mode, schedule.writers
    must = {
        w.label
        for w in writers
        if told[w.label].membership() is True or (decided_when_killed(w, told[w.label]) and can_commit(mode, w))
    }
    never = {w.label for w in writers if told[w.label].membership() is False or not can_commit(mode, w)}
    free = [w for w in writers if w.label not in must and w.label not in never]
    fixed = [w for w in writers if w.label in must]
    for extra in range(len(free) + 1):
        for chosen in itertools.combinations(free, extra):
            members = fixed + list(chosen)
            if len({w.batch for w in members}) != len(members):
                continue  # two runs of one batch committed
            batches = {w.batch for w in members}
            if any(
                (told[w.label].outcome == "skipped" or told[w.label].replayed()) and w.batch not in batches
                for w in writers
            ):
                continue
            if any(
                told[w.label].outcome == "skipped"
                and not any(m.batch == w.batch and m.query == w.query for m in members)
                for w in writers
            ):
                continue  # told "skipped" for a batch another streaming query decided: a batch of its own was lost
            orders = itertools.permutations(members) if mode != "append" else [tuple(members)]
            for order in orders:
                if not _ordered(order, told, writers):
                    continue
                rows, children = expected_state(mode, list(order))
                if rows == sorted(table) and (child is None or children == sorted(child)):
                    return [w.label for w in order]
    return None


def twice(batches: Iterable[int], what: str) -> list[str]:
    """A finding per batch more than one run of which ``what`` (one batch id per such run)."""
    return [f"batch {batch}: {n} runs {what}" for batch, n in Counter(batches).items() if n > 1]


def unfinished(told: dict[str, Told]) -> list[str]:
    """The runs that never told their outcome: exited without it, or killed past their time limit."""
    found = []
    for label, t in told.items():
        if t.outcome == "lost":
            found.append(f"{label} exited without telling its outcome")
        if t.outcome == "hung":
            found.append(f"{label} waited past commitTimeout + lock waits + pause + {MARGIN_S}s and was killed")
    return found


def decided_when_killed(w: Writer, t: Told) -> bool:
    """Killed by its fault at a point after the decision (only that fault kills it): the batch is decided, so it
    must be finished forward (docs/protocol.md), by whatever recovery comes next."""
    return t.outcome == "killed" and bool(w.fault) and w.fault.startswith(AFTER_DECISION) and ":kill" in w.fault


def _ordered(order: tuple[Writer, ...], told: dict[str, Told], writers: list[Writer]) -> bool:
    """A run told 'written' that answered before another run started comes before it; so does the committed
    run of a batch another run was told 'skipped' for (the skipped run finished the batch before answering)."""
    answered: dict[str, float] = {}  # committed run -> when its rows were known to be in the table
    for w in writers:
        t = told[w.label]
        if t.outcome in ("written", "skipped"):
            for m in order:
                if m.batch == w.batch:
                    answered[m.label] = min(answered.get(m.label, t.ended), t.ended)
    for i, a in enumerate(order):
        for b in order[i + 1 :]:
            if b.label in answered and answered[b.label] < told[a.label].started:
                return False
    return True
