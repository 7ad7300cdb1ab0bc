"""Multi-target schedules of the scenario checker (issues 27 and 28): writers of one sink each writing one
batch into a table on PostgreSQL and a table on MariaDB in one transaction (``xasink.transaction`` /
``foreach_batch_multi``, driven without Spark by tests/scenarios/driver.py's :func:`multi_write`).

A :class:`MultiSchedule` is drawn from a seed by :func:`draw_multi`: where the decision log is
(``journal_url`` on PostgreSQL, on MariaDB, or none: every run is then refused, since its writes span two
databases and its log would be chosen by their order, FOUND.md 5), two or three writers,
some concurrent, some *replays* started once an earlier run of the same batch ended, with the writes in
the other order (the second database first), some of them for another streaming query (a restart from a
new checkpoint), faults at the multi-target points (the tasks', ``tx.after_write``, the decision's), and
``xasink recover`` runs of either database (``--journal-url`` the log's).  A final recover of both
databases against every log the schedule may have used ends it (one that exits 1 while the other database
still held parts of a decided batch, naming it, is run again once the other was recovered: then it exits 0).

:func:`draw_multi_faults` (issue 37) draws the log on either database (``journal_url``), a fault at any point
of the decision (each driver point as likely as the writes') or of the writes, *replays that write a subset of
the targets* (one database, or both in the other order), the log's sink row held by another session when a
run decides (shorter or longer than ``controlLockTimeout``: a failed decision), locks on either table, and the
session's PostgreSQL killed and started again (tests/scenarios/interference.py).

The oracle (:func:`check_multi`) judges what the runs were told against both tables:

- each run's rows are on both tables or on neither, whole (no half write, no row twice);
- at most one run of a batch is committed and at most one is told "written";
- "written": committed; "skipped": not committed, and a run of its batch *of its query* is;
- an error before the decision (planning, the writes: a replay refused, the log's home checked, another
  query's batch) or a ``BatchAbortedError``: not committed; killed after the decision: committed;
- a run whose claim was taken over before it could decide is never told "written";
- without journal_url every run is refused: never told "written" or "skipped", and one that failed of no
  injected fault was told ``OptionError`` (nothing of it is visible: its error is before the decision);
- nothing is left prepared on either server;
- what each run saw and left when it answered (tests/scenarios/oracle.py's ``answers`` and ``seen_rows``): an
  xasink error, never a raw driver error; nothing of a run told an error (other than "decided, recovery will
  finish it") left prepared outside a decision on either database; a run told "written" saw its rows on every
  table it wrote, one told "skipped" the rows of a run of its batch on every table that run wrote.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from tests.scenarios import model
from tests.scenarios.model import Event
from tests.scenarios.oracle import Told, answers, killed_at, seen_rows, took_over_before, twice, unfinished

DBS = ("pg", "maria")
LOGS = ("pg", "maria", "none")  # journal_url on PostgreSQL, on MariaDB, or none (refused: two databases)
TX_POINTS = ("task.before_prepare", "task.after_prepare", "tx.after_write")
Row = tuple[Any, ...]


@dataclass
class MultiWriter:
    label: str
    batch: int
    partitions: dict[str, list[list[Row]]]  # per database ("pg", "maria")
    order: list[str]  # the order of its writes
    fault: str | None
    start: float  # seconds after the schedule starts, or after ``after`` ended
    after: str | None = None  # a replay: starts once this writer's process ended
    query: str | None = None  # a streaming query's id (foreach_batch_multi), or None (xasink.transaction)

    def rows(self, db: str) -> list[Row]:
        """Its rows for database ``db``: none when it does not write there (a replay of a subset)."""
        return [r for p in self.partitions[db] for r in p] if db in self.order else []

    def pause(self) -> float:
        return model.Writer(self.label, self.batch, [], self.fault, 0.0).pause()


@dataclass
class MultiRecover:
    start: float
    db: str  # the database recovered
    log: str  # the log it reads (its own database's unless the schedule's log is elsewhere)
    anchor: str | None = None  # "w0:driver.after_decide": ``start`` counts from that writer reaching that point


@dataclass(frozen=True)
class FinalRecover:
    """One final ``xasink recover --sink-id`` of a schedule: its exit status (None: killed past its time limit)
    and whether the log it read holds any record of the sink (docs/operations.md: ``recover/no-sink`` exits 2)."""

    rc: int | None
    sink_in_log: bool = True

    @property
    def clean(self) -> bool:
        """Exit 0, or 2 for a sink its log never saw (every writer refused before deciding anything there)."""
        return self.rc == 0 or (self.rc == 2 and not self.sink_in_log)


@dataclass
class MultiSchedule:
    seed: int
    log: str
    writers: list[MultiWriter]
    recovers: list[MultiRecover] = field(default_factory=list)
    name: str = ""
    kind: str = ""  # "" (``draw_multi``) or "multi-interfere" (``draw_multi_faults``)
    events: list[Event] = field(default_factory=list)  # interference (tests/scenarios/interference.py)

    def limit(self, w: MultiWriter) -> float:
        """How long the writer may take before it counts as hung (see :meth:`model.Schedule.limit`)."""
        waits = model.COMMIT_TIMEOUT_S + 6 * model.LOCK_TIMEOUT_S + w.pause() + model.MARGIN_S
        return waits + sum(e.hold for e in self.events)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> MultiSchedule:
        writers = [
            MultiWriter(**{**w, "partitions": {db: model.tuples(p) for db, p in w["partitions"].items()}})
            for w in d["writers"]
        ]
        recovers = [MultiRecover(**r) for r in d.get("recovers", [])]
        events = [Event(**e) for e in d.get("events", [])]
        return cls(**{**d, "writers": writers, "recovers": recovers, "events": events})

    def log_of(self, w: MultiWriter) -> str:
        """The database whose log the run claims and decides in: journal_url's, else its first write's."""
        return self.log if self.log != "none" else w.order[0]

    def replay(self) -> str:
        if self.name:
            return f"XASINK_SCENARIO_FOUND={self.name} pytest tests/test_scenarios.py -k found_multi"
        test = "test_scenarios_multi_interfere" if self.kind else "test_scenarios_multi and not interfere"
        return f"XASINK_SCENARIO_SEED={self.seed} pytest tests/test_scenarios.py -k '{test} and not long'"

    def describe(self) -> str:
        kind = f" ({self.kind})" if self.kind else ""
        lines = [f"{self.name or 'seed ' + str(self.seed)}{kind}: multi-target, journal_url {self.log}"]
        for w in self.writers:
            parts = "; ".join(
                db + " " + (" | ".join(",".join(str(r[0]) for r in p) or "-" for p in w.partitions[db]))
                for db in w.order
            )
            when = f"{w.start:.2f}s after {w.after} ended" if w.after else f"at {w.start:.2f}s"
            query = f" query {w.query}" if w.query else ""
            lines.append(f"  {w.label} batch {w.batch}{query} {when} fault {w.fault or '-'}: [{parts}]")
        for r in self.recovers:
            lines.append(f"  recover {r.db} (log {r.log}) {model.at(r.start, r.anchor)}")
        for e in self.events:
            until = f" or until {e.until}" if e.until else ""
            lines.append(f"  {e.kind} on {e.db} {model.at(e.start, e.anchor)} for {e.hold:.2f}s{until}")
        return "\n".join(lines)


def _fault(rng: random.Random, w: MultiWriter) -> str | None:
    roll = rng.random()
    if roll < 0.3:
        return None
    if roll < 0.55:
        point = rng.choice(TX_POINTS + model.DRIVER_POINTS + ("driver.before_decide",) * 2)
        action = f"sleep={rng.choice((0.3, 0.8, 1.5, 2.5))}"
    elif roll < 0.9:
        point, action = rng.choice(TX_POINTS + model.DRIVER_POINTS + model.AFTER_DECISION), "kill"
    else:
        point, action = rng.choice(TX_POINTS[:2]), "raise" + rng.choice(("", ":a=0"))
    if point.startswith("task."):  # partition numbers restart with each write: p= hits either database's
        full = sorted({p for db in DBS for p, rows in enumerate(w.partitions[db]) if rows})
        return f"{point}:{action}:p={rng.choice(full)}"
    if point == "tx.after_write":
        return f"{point}:{action}:p={rng.randrange(2)}"
    return f"{point}:{action}"


def draw_multi(seed: int) -> MultiSchedule:
    """The multi-target schedule of one seed."""
    rng = random.Random(seed)
    log = LOGS[seed % len(LOGS)]
    stream = rng.random() < 0.4  # foreach_batch_multi (a query id recorded) rather than xasink.transaction
    writers: list[MultiWriter] = []
    for i in range(rng.randint(2, 3)):
        label = f"w{i}"
        parts = {}
        for d, db in enumerate(DBS):  # at least one row on each database, ids unique to the writer
            rows = [(1000 * (i + 1) + 100 * d + k, label) for k in range(rng.randint(1, 4))]
            parts[db] = model.split_rows(rng, rows)
        order = list(DBS) if rng.random() < 0.5 else list(reversed(DBS))
        w = MultiWriter(label, rng.choice((1, 1, 2)), parts, order, None, 0.0)
        if i > 0 and rng.random() < 0.6:  # a replay of an earlier run: the same batch, the writes reordered
            prev = writers[rng.randrange(i)]
            w.batch, w.order, w.after = prev.batch, list(reversed(prev.order)), prev.label
            w.start = rng.choice((0.0, 0.5))
        elif i > 0:
            w.start = round(rng.uniform(0.0, 1.5), 2)
        if stream:
            w.query = "qA" if i == 0 or rng.random() < 0.5 else "qB"
        w.fault = _fault(rng, w)
        writers.append(w)
    recovers = []
    for _ in range(rng.choice((0, 1, 1, 2))):
        db = rng.choice(DBS)
        recovers.append(MultiRecover(round(rng.uniform(0.5, 4.0), 2), db, db if log == "none" else log))
    return MultiSchedule(seed, log, writers, recovers)


def _any_point(rng: random.Random, w: MultiWriter) -> str | None:
    """A fault at one of the decision's points (each as likely as a write's), a kill or a pause, or none."""
    if rng.random() < 0.2:
        return None
    point = rng.choice(model.DRIVER_POINTS + TX_POINTS)
    action = "kill" if rng.random() < 0.6 else f"sleep={rng.choice((0.5, 1.5, 3.0))}"
    if point.startswith("task."):
        full = sorted({p for db in w.order for p, rows in enumerate(w.partitions[db]) if rows})
        return f"{point}:{action}:p={rng.choice(full)}"
    if point == "tx.after_write":
        return f"{point}:{action}:p={rng.randrange(len(w.order))}"
    return f"{point}:{action}"


def _after_writes(w: MultiWriter, pause: float) -> str:
    """An anchor at ``w``'s last write (its branches prepared everywhere, before its decision): the point added
    to its fault spec as a pause."""
    item = f"tx.after_write:sleep={pause}:p={len(w.order) - 1}"
    if not (w.fault or "").startswith("tx.after_write"):
        w.fault = f"{w.fault},{item}" if w.fault else item
    return f"{w.label}:tx.after_write"


def draw_multi_faults(seed: int) -> MultiSchedule:
    """Issue 37's multi-target schedule of one seed (see the module's docstring)."""
    rng = random.Random(seed ^ 0x3737)
    log = DBS[seed % 2]
    stream = rng.random() < 0.3
    writers: list[MultiWriter] = []
    for i in range(rng.randint(2, 3)):
        label = f"w{i}"
        parts = {}
        for d, db in enumerate(DBS):
            rows = [(1000 * (i + 1) + 100 * d + k, label) for k in range(rng.randint(1, 4))]
            parts[db] = model.split_rows(rng, rows)
        order = list(DBS) if rng.random() < 0.5 else list(reversed(DBS))
        w = MultiWriter(label, rng.choice((1, 1, 2)), parts, order, None, 0.0)
        if i > 0 and rng.random() < 0.6:  # a replay of an earlier run's batch, writing a subset of its targets
            prev = writers[rng.randrange(i)]
            w.batch, w.after, w.start = prev.batch, prev.label, rng.choice((0.0, 0.5))
            w.order = rng.choice(([DBS[0]], [DBS[1]], list(reversed(prev.order)), list(reversed(prev.order))))
        elif i > 0:
            w.start = round(rng.uniform(0.0, 1.5), 2)
        if stream:
            w.query = "qA" if i == 0 or rng.random() < 0.6 else "qB"
        w.fault = _any_point(rng, w)
        writers.append(w)
    events = []
    if rng.random() < 0.5:  # the log's sink row held when a run decides: past controlLockTimeout or not
        w = rng.choice([w for w in writers if w.after is None])
        events.append(Event("lock_sink", 0.1, rng.choice((2.0, 6.0, 6.0)), _after_writes(w, 0.5), log))
    if rng.random() < 0.2:
        events.append(
            Event("lock_table", round(rng.uniform(0.0, 3.0), 2), rng.choice((2.0, 6.0)), None, rng.choice(DBS))
        )
    if rng.random() < 0.15:  # the session's own PostgreSQL only: never the shared MariaDB
        w = rng.choice(writers)
        events.append(Event("restart", 0.0, rng.choice((0.5, 2.0)), _after_writes(w, 0.3), "pg"))
    recovers = []
    for _ in range(rng.choice((0, 1, 1, 2))):
        db = rng.choice(DBS)
        recovers.append(MultiRecover(round(rng.uniform(0.5, 5.0), 2), db, log))
    return MultiSchedule(seed, log, writers, recovers, kind="multi-interfere", events=events)


# --------------------------------------------------------------------------- the oracle


def rows_in(db: str) -> Callable[[MultiWriter], list[Row]]:
    """What a writer writes into ``db``'s table."""
    return lambda w: w.rows(db)


def check_multi(
    schedule: MultiSchedule,
    told: dict[str, Told],
    tables: dict[str, list[Row]],
    prepared: list[str],
    recovers: list[FinalRecover],
) -> list[str]:
    """The violations of one run of a multi-target schedule (empty: what the runs were told is true)."""
    found: list[str] = []
    if prepared:
        found.append(f"left prepared after the final recovers: {prepared}")
    if not all(r.clean or r.rc is None for r in recovers):
        found.append(f"a final `xasink recover` exited {[(r.rc, r.sink_in_log) for r in recovers]} (rc, sink in log)")
    if any(r.rc is None for r in recovers):
        found.append("a final `xasink recover` ran past its time limit and was killed")
    found += unfinished(told)
    found += answers(told)
    found += seen_rows(schedule.writers, told, {db: rows_in(db) for db in DBS})
    by_label = {w.label: w for w in schedule.writers}
    present: dict[str, bool] = {}
    for db, rows in tables.items():
        counts = Counter(rows)
        doubled = sorted(r for r, n in counts.items() if n > 1)
        if doubled:
            found.append(f"{db}: rows written twice: {doubled}")
        mine = {w.label: set(w.rows(db)) for w in schedule.writers}
        strays = sorted(r for r in counts if not any(r in rs for rs in mine.values()))
        if strays:
            found.append(f"{db}: rows of no run: {strays}")
        for w in schedule.writers:
            have = mine[w.label] & set(counts)
            if have and have != mine[w.label]:
                found.append(f"{db}: only part of {w.label}'s rows: {sorted(have)}")
            if db not in w.order:
                continue  # a replay of a subset of the targets writes nothing there
            if w.label in present and present[w.label] != bool(have):
                found.append(
                    f"{w.label} (batch {w.batch}) committed on {w.order[0] if present[w.label] else db} only: "
                    "a multi-target batch must be on every target it writes or on none"
                )
            present[w.label] = present.get(w.label, False) or bool(have)
    found += twice((by_label[label].batch for label, p in present.items() if p), "committed (written twice)")
    written = (by_label[label].batch for label, t in told.items() if t.outcome == "written")
    found += twice(written, "told 'written'")
    for label, t in told.items():
        w = by_label[label]
        killed_decided = t.outcome == "killed" and killed_at(w.fault) in model.AFTER_DECISION
        must = t.membership()
        if killed_decided:
            must = True
        if must is True and not present[label]:
            found.append(f"{label} {t.outcome} {t.error.split(' ')[0]} but its rows are not on the targets")
        if must is False and present[label]:
            found.append(f"{label} {t.outcome} {t.phase} {t.error.split(' ')[0]} but its rows are on the targets")
        # refused with OptionError at its second database, unless it lost the batch before it got there: a
        # concurrent run of the same batch took it over (ConcurrentWriterError, LateBranchError; nothing of it
        # is visible, checked above).  CI seed 29: w1 took the batch over while w2 wrote its first database
        lost = any(e in t.error for e in ("ConcurrentWriterError", "LateBranchError"))
        unrefused = t.outcome in ("written", "skipped") or (
            t.outcome == "error" and not w.fault and "OptionError" not in t.error and not lost
        )
        if schedule.log == "none" and unrefused:
            found.append(
                f"{label} {t.outcome} {t.error.split(' ')[0]}: a transaction over two databases without journal_url "
                "must be refused with OptionError (its log would be chosen by the order of writes)"
            )
        if t.outcome == "skipped":
            same = [o for o in schedule.writers if o.batch == w.batch and present[o.label]]
            if not same:
                found.append(f"{label} told 'skipped' but no run of batch {w.batch} is committed")
            elif all(o.query != w.query for o in same):
                found.append(
                    f"{label} (query {w.query}) told 'skipped' for batch {w.batch} committed by query "
                    f"{same[0].query}: a restart from a new checkpoint was taken for a replay"
                )
        if t.outcome == "written" and t.claimed_at is not None and t.committing_at is not None:
            decides = t.committing_at + (w.pause() if (w.fault or "").startswith("driver.before_decide") else 0.0)
            for other, o in told.items():
                # a claim in another log (no journal_url, the writes in another order) takes nothing over
                same_log = schedule.log_of(by_label[other]) == schedule.log_of(w)
                if other != label and by_label[other].batch == w.batch and o.claimed_at is not None and same_log:
                    if took_over_before(t, o, decides):
                        found.append(f"{label} told 'written' though {other} took batch {w.batch} over first")
    return found
