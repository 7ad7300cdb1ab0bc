"""The scenario checker's oracle: pure Python, no database, no xasink code.

It judges what the runs were *told*, never what the code did or what the decision log says: it looks for a
set of runs whose rows are committed, and an order of them, that explains the final table exactly (each
write mode's semantics applied to the initial rows, tests/scenarios/model.py), under the constraints the
runs' answers impose:

- "written": the run is in the set (its rows were applied before it answered); at most one per batch;
- "skipped": the run is not in the set, and its batch has a run in the set;
- an error that says nothing of the run is visible (a ``BatchAbortedError``, a failure before the
  decision): not in the set; "decided, recovery will finish it" (``CommitIncompleteError``): in it;
  "decided by another run, recovery will finish it" (``ReplayIncompleteError``): not in the set, and its
  batch has a run in the set (a "skipped" whose batch was not finished yet);
- killed by its fault at a point after the decision: in the set (a decided batch is finished forward);
  "decided" (told ``CommitIncompleteError``, or killed after the decision) but inserting rows while the
  schedule made a column of the table required: either (its rows may rightly be withdrawn then); with a
  row outside replaceWhere: not in the set (docs/errors.md: its apply fails for the rows, and recovery
  withdraws it);
- killed elsewhere, or any other error: either;
- decision order is the order of effect (DESIGN invariant 12): a run in the set was decided before its
  process ended (only the holder of its batch's claim decides, in its own process), so it takes effect
  before every run of the set that started after that, whatever it was told: "written", "decided,
  recovery will finish it", or nothing (killed after its decision).  The run of a batch another run was
  told "skipped" (or "decided by another run") for was decided before that answer, too;
- a run whose claim was superseded (another run of its batch took the batch over after it claimed and
  before it began committing) is never told "written" (docs/protocol.md: one writer per sinkId; the
  newer one takes the batch over);
- the sibling table (never written) and the child rows of keys still present are untouched.

With at most four runs the search is exhaustive (at most 65 ordered subsets).  Besides the table, what each
run saw and left when it answered (tests/scenarios/runner.py records it):

- an error from the batch's check and claim on (phase ``claim``) is an xasink error (``XasinkError``) carrying
  its cause, never a raw driver error (DESIGN invariant 13); an injected ``raise`` fault is the test's own; one
  while planning the table (before any branch of the run exists) is a poor message, not a broken promise;
- a run told an error other than "decided, recovery will finish it" left none of its branches prepared
  outside a decision (invariant 13: every failure before the decision rolls back every prepared part);
- append mode: a run told "written" saw its rows in the table right after the answer, one told "skipped"
  the rows of a run of its batch (rows appended are never taken away, so a later look proves nothing
  false).
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tests.scenarios.model import (
    AFTER_DECISION,
    MARGIN_S,
    UNKNOWN_QUERY,
    Row,
    Schedule,
    Writer,
    can_commit,
    expected_state,
    same_query,
)

RowsOf = Callable[[Any], list[Row]]  # the rows a writer writes into one table


@dataclass
class Told:
    """What one run reported (JSON lines of tests/scenarios/driver.py) and how long it took."""

    outcome: str  # written | skipped | error | killed | hung (killed by the runner) | lost (exited silently)
    started: float  # monotonic, when the process started
    ended: float
    error: str = ""  # the exception's class names, innermost first
    message: str = ""
    phase: str = ""  # where an error was raised: plan, claim (the batch's check, claim and recovery), tasks, commit
    claiming_at: float | None = None  # it began its claim (the claim took the batch over in [claiming_at, claimed_at])
    claimed_at: float | None = None  # its claim had taken the batch over by then (None: no claim, or a replay)
    committing_at: float | None = None  # it entered the commit (decision) at this time
    forked_at: float | None = None  # its process began to run the writer
    told_at: float | None = None  # it wrote its outcome
    run: str | None = None  # its run nonce (the last part of its branches' xids)
    faults: dict[str, float] = field(default_factory=dict)  # fault point -> when the run reached it
    # its branches still prepared when its process ended and listed in no decision (the runner looks once the
    # process ended, for a run told an error that promises a clean end: see must_leave_nothing)
    leftover: list[str] = field(default_factory=list)
    seen: dict[str, list[int]] | None = None  # the ids in each table right after it answered (append mode)

    def replayed(self) -> bool:
        """Told its batch was decided by another run whose finish failed: a "skipped" not finished yet."""
        return self.outcome == "error" and "ReplayIncompleteError" in self.error

    def classes(self) -> list[str]:
        return self.error.split()

    def membership(self) -> bool | None:
        """True: its rows must be committed; False: they must not; None: either."""
        if self.outcome == "written":
            return True
        if self.outcome == "skipped":
            return False
        if self.outcome != "error":
            return None  # killed or hung
        if self.phase in ("plan", "claim", "tasks"):
            return False  # it never decided: nothing of it can commit
        if self.replayed():
            return False  # another run's decision of its batch: that run is in the set (see explain)
        if "CommitIncompleteError" in self.error and "DecisionUnknownError" not in self.error:
            return True
        if "BatchAbortedError" in self.error:
            return False
        return None

    def must_leave_nothing(self) -> bool:
        """Told an error that is not "decided, recovery will finish it": every branch of the run that no decision
        lists must be rolled back by the time it answers (DESIGN invariant 13)."""
        return self.outcome == "error" and "CommitIncompleteError" not in self.classes()


def check(
    schedule: Schedule,
    told: dict[str, Told],
    table: list[Row],
    prepared: list[str],
    sibling_ok: bool,
    child: list[Row],
    recover_rc: int | None,
    sink_in_log: bool = True,
) -> list[str]:
    """The violations of one run of the schedule (empty: what the runs were told is true).  ``sink_in_log``:
    whether the log holds any record of the sink after the runs (a final ``recover --sink-id`` of a sink no run
    recorded, every run refused before it planned, exits 2: docs/operations.md ``recover/no-sink``)."""
    found: list[str] = []
    mode = schedule.mode
    if prepared:
        found.append(f"left prepared after the final recover: {prepared}")
    # exit 2 is also the documented answer for a decided batch it had to withdraw (docs/operations.md: its
    # rows break the table, here a row outside replaceWhere), possible when that batch's writer was killed
    # after its decision (PostgreSQL seed 1708) or told CommitIncompleteError for it (seed 10568)
    withdrawn = any(
        (decided_when_killed(w, told[w.label]) or told[w.label].membership() is True) and not can_commit(mode, w)
        for w in schedule.writers
    )
    if recover_rc not in (0, None) and not (recover_rc == 2 and (withdrawn or not sink_in_log)):
        found.append(f"the final `xasink recover` exited {recover_rc}")
    if not sibling_ok:
        found.append("a table the sink never writes was changed")
    found += unfinished(told)
    found += answers(told)
    by_label = {w.label: w for w in schedule.writers}
    found += twice((by_label[label].batch for label, t in told.items() if t.outcome == "written"), "told 'written'")
    if mode == "append":
        found += seen_rows(schedule.writers, told, {"table": lambda w: w.rows})
    for label, t in told.items():
        w = by_label[label]
        if t.outcome == "written" and not can_commit(mode, w):
            found.append(f"{label} told 'written' though a row is outside replaceWhere")
        if t.outcome == "skipped" and w.query == UNKNOWN_QUERY:
            found.append(f"{label} told 'skipped' though its query cannot be known: it replays nothing")
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
        unordered = explain(schedule, told, table, None, ordered=False)
        why = (
            f" (only in an order where a run takes effect before one decided before it started: {unordered})"
            if unordered is not None
            else ""
        )
        found.append(
            f"no set and order of runs explains the table (and its child rows){why}: {table} {child}; told: "
            + "; ".join(f"{label} {t.outcome} {t.phase} {t.error.split(' ')[0]}".strip() for label, t in told.items())
        )
    return found


def answers(told: dict[str, Told]) -> list[str]:
    """What each run was told and left when it answered: an xasink error, and nothing prepared outside a decision
    after an error that promises a clean end (DESIGN invariant 13)."""
    found = []
    for label, t in told.items():
        # planning the table (before any branch of the run exists) may still end in a driver's error: a poor
        # message, not a broken promise (FOUND.md 5); from the batch's check and claim on, an xasink error
        raw = t.outcome == "error" and t.phase != "plan" and not {"XasinkError", "InjectedFault"} & set(t.classes())
        if raw:
            found.append(
                f"{label} was told a raw {t.classes()[0] if t.classes() else 'error'} ({t.phase}), not an xasink "
                f"error with its cause: {t.message[:300]}"
            )
        if t.leftover:
            what = t.classes()[0] if t.classes() else t.outcome
            found.append(
                f"{label} was told {what} ({t.phase}) but left {len(t.leftover)} branch(es) prepared that no "
                f"decision lists: {t.leftover}"
            )
    return found


def seen_rows(writers: Sequence[Any], told: dict[str, Told], tables: dict[str, RowsOf]) -> list[str]:
    """Append mode: a run told "written" saw all its rows in every table right after its answer, one told
    "skipped" (a finished replay) all the rows of some run of its batch.  ``tables``: table name -> the rows a
    writer writes there (a function of the writer)."""
    found = []
    for w in writers:
        t = told[w.label]
        if t.outcome not in ("written", "skipped") or t.seen is None:
            continue
        candidates = [w] if t.outcome == "written" else [o for o in writers if o.batch == w.batch and o is not w]
        gaps = {o.label: missing(o, t.seen, tables) for o in candidates}
        if all(gaps.values()):
            what = "its rows were" if t.outcome == "written" else "no run of its batch had its rows"
            found.append(
                f"{w.label} told '{t.outcome}' for batch {w.batch}, but right after the answer {what} all in the "
                f"tables: missing " + "; ".join(f"{label}'s {gap}" for label, gap in gaps.items())
            )
    return found


def missing(w: Any, seen: dict[str, list[int]], tables: dict[str, RowsOf]) -> dict[str, list[int]]:
    """The ids of ``w``'s rows not ``seen``, by table (only tables where some are missing)."""
    gaps = {name: sorted({r[0] for r in of(w)} - set(seen.get(name, []))) for name, of in tables.items()}
    return {name: ids for name, ids in gaps.items() if ids}


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


def explain(
    schedule: Schedule, told: dict[str, Told], table: list[Row], child: list[Row] | None, ordered: bool = True
) -> list[str] | None:
    """An ordered set of runs whose rows give exactly ``table`` (and ``child``, unless None) under every
    constraint (``ordered`` False: but the order of decisions), or None."""
    mode, writers = schedule.mode, schedule.writers
    must = {
        w.label
        for w in writers
        if (told[w.label].membership() is True or decided_when_killed(w, told[w.label]))
        and (told[w.label].outcome == "written" or (can_commit(mode, w) and not withdrawable(schedule, w)))
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
                and not any(m.batch == w.batch and same_query(m.query, w.query) for m in members)
                for w in writers
            ):
                continue  # told "skipped" for a batch another streaming query decided: a batch of its own was lost
            orders = itertools.permutations(members) if mode != "append" else [tuple(members)]
            for order in orders:  # appended rows are the same in any order: no order to check
                if ordered and mode != "append" and not _ordered(order, told, writers):
                    continue
                rows, children = expected_state(mode, list(order), schedule.child)
                if rows == sorted(table) and (child is None or children == sorted(child)):
                    return [w.label for w in order]
    return None


def withdrawable(schedule: Schedule, w: Writer) -> bool:
    """Whether a decided batch of ``w`` may rightly be withdrawn for its rows, besides a row outside replaceWhere
    (``can_commit``): its apply inserts rows while the schedule made a column required (NOT NULL without a
    default), so its rows may break the table when the apply runs.  A batch that inserts no row (empty, or
    only deletions) breaks nothing: its withdrawal is never right."""
    if mode_applies(schedule.mode) and any(e.kind == "require_column" for e in schedule.events):
        return any(not (len(r) > 3 and r[3]) for r in w.rows)
    return False


def mode_applies(mode: str) -> bool:
    """The write modes whose batches are applied (and may be withdrawn) after the decision."""
    return mode in ("overwrite", "replaceWhere", "changes")


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
            found.append(f"{label} waited past commitTimeout + lock waits + pauses + {MARGIN_S}s and was killed")
    return found


def killed_at(fault: str | None) -> str | None:
    """The point a fault spec kills its process at (a spec may list several points), or None."""
    for item in (fault or "").split(","):
        point, *rest = item.strip().split(":")
        actions = [a for a in rest if "=" not in a or a.startswith("sleep=")]
        if point and (not actions or actions[-1] == "kill"):  # no action named: kill
            return point
    return None


def decided_when_killed(w: Writer, t: Told) -> bool:
    """Killed by its fault at a point after the decision (only that fault kills it): the batch is decided, so it
    must be finished forward (docs/protocol.md), by whatever recovery comes next."""
    return t.outcome == "killed" and killed_at(w.fault) in AFTER_DECISION


def _ordered(order: tuple[Writer, ...], told: dict[str, Told], writers: list[Writer]) -> bool:
    """Decision order is the order of effect (DESIGN invariant 12): a run of the set decided before its process
    ended, so it comes before every run of the set that started after that; the run of a batch another run
    was told "skipped" (or "decided by another run, recovery will finish it") for was decided before that
    answer."""
    decided: dict[str, float] = {m.label: told[m.label].ended for m in order}  # decided by then, at the latest
    for w in writers:
        t = told[w.label]
        if t.outcome == "skipped" or t.replayed():
            for m in order:
                if m.batch == w.batch:
                    decided[m.label] = min(decided[m.label], t.ended)
    for i, a in enumerate(order):
        for b in order[i + 1 :]:
            if decided[b.label] < told[a.label].started:
                return False
    return True
