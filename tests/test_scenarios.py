"""The scenario checker (issues 27 and 37): seeded concurrent schedules against both databases, judged by an
oracle.

Each schedule (tests/scenarios/model.py) runs two to four writers of one sink at once, without Spark
(tests/scenarios/driver.py), with pauses and SIGKILLs at protocol points and ``xasink recover`` runs,
then a final recover; the oracle (tests/scenarios/oracle.py) checks that what every run was told is true of
the table.  Kinds: ``draw`` (the core), ``draw_query`` (a restart from a new checkpoint), ``draw_interfere``
(interference from outside xasink: locks, timeouts, a column added, trims, a server killed;
tests/scenarios/interference.py), ``draw_multi`` and ``draw_multi_faults`` (multi-target transactions,
tests/scenarios/multi.py).

- CI: a few fixed seeds per kind and database (``CI_SEEDS``, ``QUERY_CI_SEEDS``, ``INTERFERE_CI_SEEDS``,
  ``MULTI_CI_SEEDS``, ``MULTI_FAULTS_CI_SEEDS``; ``XASINK_SCENARIO_COUNT=N`` runs seeds ``XASINK_SCENARIO_BASE``
  (default 0) .. +N instead), and the schedules kept in tests/scenarios/found.json / found_multi.json because
  they found the bugs of tests/scenarios/FOUND.md, one test each (``XASINK_SCENARIO_FOUND=<name>`` runs one).
  Those still open on main are strict xfails (:data:`OPEN`): the integrator removes each once its fix merged.
- ``soak``: ``XASINK_SCENARIO_LONG`` (default 1000) seeds per database from ``XASINK_SCENARIO_BASE``, every kind
  (see :func:`test_scenarios_long`, :func:`test_scenarios_multi_long`).
- Replay: ``XASINK_SCENARIO_SEED=<seed>`` runs that one schedule (each database).  The schedule is the
  same; the interleaving of real processes is not, so a race may need a few runs to show again.

A violation fails the test with each failing schedule, what its runs were told, what the oracle saw and
the seed to replay it; ``XASINK_SCENARIO_REPORT=<file>`` also appends every schedule run there as a JSON line
(with, for a violation, the schedule itself, the report and the writers' logs).  Schedules that kill a database
server run on the session's private PostgreSQL, and on MariaDB on a private server of this module's own
(never the shared one).
"""

from __future__ import annotations

import json
import os
import traceback
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import harness
from tests.scenarios import model, oracle
from tests.scenarios.interference import draw_interfere, restarts
from tests.scenarios.multi import (
    FinalRecover,
    MultiSchedule,
    MultiWriter,
    Row,
    check_multi,
    draw_multi,
    draw_multi_faults,
)
from tests.scenarios.multi_runner import MultiOutcome, MultiRunner
from tests.scenarios.runner import Outcome, Runner, env_int
from tests.scenarios.servers import PostgresRestarts, PrivateMariaDB
from tests.targets import IDS, MARIADB, POSTGRESQL, Target, make_target
from xasink.support.embedded import EmbeddedPostgres

# seed % 5 picks the mode (append, upsert, overwrite, replaceWhere, changes); 2 and 13 showed bug 1 of
# FOUND.md (child rows cascaded by an overwrite / replaceWhere) on both databases; about 5-10 s each
CI_SEEDS = (0, 1, 2, 4, 9, 13)


# restarts from a new checkpoint (draw_query: another streaming query's writer of a decided batch); a few s each
QUERY_CI_SEEDS = (0, 1, 3)
# multi-target transactions over PostgreSQL and MariaDB (tests/scenarios/multi.py): seed % 3 picks where the
# log is (journal_url on PostgreSQL, on MariaDB, none); replays with the writes reordered, other queries' runs.
# None of them runs two writers of a batch at once in two logs (FOUND.md 5, kept in found_multi.json); ~5 s each
MULTI_CI_SEEDS = (0, 4, 8, 14, 18, 29, 32, 36)
# an overwrite swapped or renamed in (draw_swap), kills at the swap's points; 2: a kill after MariaDB's rename
SWAP_CI_SEEDS = (2, 7)
# interference from outside xasink (draw_interfere); 10-30 s each
INTERFERE_CI_SEEDS = (113, 125)
# multi-target faults at every point, subset replays, a held log row, a PostgreSQL restart (draw_multi_faults)
MULTI_FAULTS_CI_SEEDS = (116, 127, 133)
# the long run: every seed draws the core kind, every fifth also a restart from a new checkpoint, every fourth
# also interference; the multi-target long run draws draw_multi, and every other seed draw_multi_faults
QUERY_EVERY, INTERFERE_EVERY, MULTI_FAULTS_EVERY = 5, 4, 2
# the long runs' seeds split into this many tests, run side by side by ``-n K --dist load`` (each xdist worker a
# session of its own: its own private PostgreSQL, MariaDB database and decision log), docs/testing.md
SHARDS = env_int("XASINK_SCENARIO_SHARDS", 1)

# kept schedules that show a bug of issue 37 still open on main: strict xfails, each removed once its fix merged
# (a strict xfail that passes fails the run: XPASS(strict)).  Such a test "fails as expected" only with the
# violation its entry's "on_main" names (KnownOnMain); any other violation fails it outright.  name -> the item
# and the branch that fixes it
OPEN: dict[str, str] = {}


class KnownOnMain(AssertionError):
    """A kept schedule of :data:`OPEN` broke its promise the way its entry's ``on_main`` says it does on main."""


def open_mark(name: str) -> list[Any]:
    """The strict xfail of a kept schedule still open on main (none once its fix merged)."""
    if name not in OPEN:
        return []
    return [pytest.mark.xfail(reason=f"open on main: {OPEN[name]}", raises=KnownOnMain, strict=True)]


def judge_kept(entry: dict[str, Any], failed: list[Outcome] | list[MultiOutcome], where: str) -> None:
    """A kept schedule passes; one of OPEN may instead fail with the violation it shows on main (KnownOnMain)."""
    known = entry.get("on_main")
    if entry["name"] in OPEN and known and any(known in v for o in failed for v in o.violations):
        raise KnownOnMain("\n\n".join(o.report() for o in failed))
    fail_on(failed, 1, where)


def seeds(count_env: str, default: int | None, ci: tuple[int, ...] = CI_SEEDS) -> list[int]:
    one = os.environ.get("XASINK_SCENARIO_SEED")
    if one:
        return [int(one)]
    base = env_int("XASINK_SCENARIO_BASE", 0)
    count = env_int(count_env, 0) or default
    return list(range(base, base + count)) if count else list(ci)


FOUND = Path(__file__).parent / "scenarios" / "found.json"
FOUND_MULTI = Path(__file__).parent / "scenarios" / "found_multi.json"


def kept(path: Path) -> list[dict[str, Any]]:
    """The kept schedules of a file, or the one XASINK_SCENARIO_FOUND names."""
    one = os.environ.get("XASINK_SCENARIO_FOUND")
    return [k for k in json.loads(path.read_text()) if not one or k["name"] == one]


def kept_cases() -> list[Any]:
    """(database, name) of each kept single-target schedule, on the databases it names (default both)."""
    cases = []
    for k in kept(FOUND):
        for kind in (POSTGRESQL, MARIADB):
            if IDS[kind] in k.get("dbs", list(IDS.values())):
                marks = [pytest.mark.mariadb] if kind == MARIADB else []
                marks += open_mark(k["name"])
                cases.append(pytest.param(kind, k["name"], id=f"{IDS[kind]}-{k['name']}", marks=marks))
    return cases


def kept_entry(path: Path, name: str) -> dict[str, Any]:
    (found,) = [k for k in json.loads(path.read_text()) if k["name"] == name]
    return dict(found)


def record(db: str, schedule: model.Schedule | MultiSchedule, outcome: Outcome | MultiOutcome) -> None:
    """Append one JSON line per schedule run to ``XASINK_SCENARIO_REPORT``, if set: the long runs' tally
    (``violations`` empty when every promise held; for a violation the schedule itself, to run it again
    whatever the drawing code became, the report and the tails of the writers' and recover runs' logs)."""
    report = os.environ.get("XASINK_SCENARIO_REPORT")
    if not report:
        return
    entry = {
        "db": db,
        "seed": schedule.seed,
        "kind": schedule.kind,
        "name": getattr(schedule, "name", ""),
        "seconds": round(outcome.seconds, 1),
        "violations": outcome.violations,
        "schedule": json.loads(schedule.to_json()) if outcome.violations else None,
        "report": outcome.report() if outcome.violations else "",
        "logs": outcome.logs if outcome.violations else {},
    }
    with open(report, "a") as out:
        out.write(json.dumps(entry) + "\n")


# --------------------------------------------------------------------------- servers the schedules may kill


@pytest.fixture(scope="module")
def private_mariadb() -> Iterator[tuple[PrivateMariaDB, str]]:
    """A MariaDB server of this module's own, for schedules that kill the server (never the shared one): the
    server and the URL of a database on it.  Started on first use, stopped (its directory removed) at the end."""
    server = PrivateMariaDB()
    with harness.private_mariadb(f"xasink_scen_{uuid.uuid4().hex[:10]}", server=server) as (_, url):
        yield server, url


class Runners:
    """The runner of each schedule on one database: the test's own, or for a schedule that kills the server, one
    on a server of the test's own (the session's private PostgreSQL; on MariaDB :func:`private_mariadb`)."""

    def __init__(self, db: Target, tmp_path: Path, request: pytest.FixtureRequest) -> None:
        self.db, self.tmp_path, self.request = db, tmp_path, request
        self.plain = Runner(db, tmp_path)
        self.killer: Runner | None = None
        self.private: Target | None = None

    def __call__(self, schedule: model.Schedule) -> Runner:
        if not restarts(schedule):
            return self.plain
        if self.killer is None:
            if self.db.kind == POSTGRESQL:
                server: EmbeddedPostgres | None = self.request.getfixturevalue("pg_server")
                # an external server (XASINK_TEST_PG_URL) is never killed: its restart events are skipped (noted)
                self.killer = Runner(self.db, self.tmp_path, PostgresRestarts(server) if server else None)
            else:
                private, url = self.request.getfixturevalue("private_mariadb")
                self.private = make_target(MARIADB, url)
                self.killer = Runner(self.private, self.tmp_path, private)
        return self.killer

    def revive(self) -> None:
        """After a schedule whose runner failed: a server it killed and could not start again is started now, so the
        next schedules run (an unattended long run goes on)."""
        server = self.killer.server if self.killer is not None else None
        if server is not None and not server.alive():
            server.start_again()

    def close(self) -> None:
        if self.private is not None:
            left = self.private.prepared()
            for gid in left:
                self.private.rollback_ours(gid)
            self.private.cleanup()
            assert not left, f"left prepared on the private MariaDB: {left}"


def run_schedules(
    runners: Runners,
    chosen: list[int] | list[model.Schedule],
    draw: Callable[[int], model.Schedule] = model.draw,
) -> list[Outcome]:
    """Run each schedule and record it; the outcomes that broke a promise.  A schedule whose runner itself
    failed (a server that would not start again...) is recorded as a violation and the run goes on."""
    failed: list[Outcome] = []
    for item in chosen:
        schedule = item if isinstance(item, model.Schedule) else draw(item)
        try:
            outcome = runners(schedule).run(schedule)
        except Exception:  # noqa: BLE001 - an unattended long run records it and goes on
            outcome = Outcome(schedule, {}, [], [f"the runner failed: {traceback.format_exc()[-3000:]}"], 0.0)
            runners.revive()
        if os.environ.get("XASINK_SCENARIO_SHOW") == "1":  # with -s: every schedule's report
            print(f"\n{outcome.report()}\n  {outcome.seconds:.1f}s")
        if outcome.violations:
            failed.append(outcome)
        record(runners.db.id, schedule, outcome)
    return failed


def fail_on(failed: list[Outcome] | list[MultiOutcome], total: int, where: str) -> None:
    if failed:
        details = "\n\n".join(o.report() for o in failed)
        pytest.fail(f"{len(failed)} of {total} schedules on {where} broke a promise:\n\n{details}", pytrace=False)


@pytest.fixture
def runners(db: Target, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Runners]:
    r = Runners(db, tmp_path, request)
    try:
        yield r
    finally:
        r.close()


def test_scenarios(runners: Runners) -> None:
    """A short fixed set of schedules (every write mode), as CI runs it."""
    chosen = seeds("XASINK_SCENARIO_COUNT", None)
    fail_on(run_schedules(runners, chosen), len(chosen), runners.db.id)


@pytest.mark.parametrize(("db", "name"), kept_cases(), indirect=["db"])
def test_scenarios_found(runners: Runners, name: str) -> None:
    """A schedule kept because it found a bug (tests/scenarios/found.json), exactly as written there."""
    entry = kept_entry(FOUND, name)
    schedule = model.Schedule.from_dict({**entry["schedule"], "name": name})
    judge_kept(entry, run_schedules(runners, [schedule]), runners.db.id)


def test_scenarios_query(runners: Runners) -> None:
    """Restarts from a new checkpoint (issue 28): a writer of a decided (sink, batch) for another streaming
    query is refused, never told "skipped" (model.draw_query)."""
    chosen = seeds("XASINK_SCENARIO_COUNT", None, QUERY_CI_SEEDS)
    fail_on(run_schedules(runners, chosen, model.draw_query), len(chosen), runners.db.id)


def test_scenarios_interfere(runners: Runners) -> None:
    """Interference from outside xasink (issue 37, interference.draw_interfere): a reader's locks over the apply,
    timeouts, a column added between decision and apply, trims with journalRetention=1, a server killed."""
    chosen = seeds("XASINK_SCENARIO_COUNT", None, INTERFERE_CI_SEEDS)
    fail_on(run_schedules(runners, chosen, draw_interfere), len(chosen), runners.db.id)


def test_scenarios_swap(runners: Runners) -> None:
    """Overwrites of a table nothing refers to (issue 40, model.draw_swap): swapped (PostgreSQL) or renamed in
    (MariaDB), with kills and pauses at the swap's own points, between the rename and the mark above all."""
    chosen = seeds("XASINK_SCENARIO_COUNT", None, SWAP_CI_SEEDS)
    fail_on(run_schedules(runners, chosen, model.draw_swap), len(chosen), runners.db.id)


@pytest.mark.soak
@pytest.mark.parametrize("shard", range(SHARDS))
def test_scenarios_long(runners: Runners, shard: int) -> None:
    """At least 1,000 schedules per database (``XASINK_SCENARIO_LONG`` seeds of the core kind), outside CI;
    every fifth seed also draws a restart from a new checkpoint (model.draw_query), every fourth interference
    from outside xasink (interference.draw_interfere), every overwrite seed a swapped one (model.draw_swap).
    Every schedule runs before the test fails.  ``shard``:
    this test's share of the seeds (every ``XASINK_SCENARIO_SHARDS``-th)."""
    chosen = seeds("XASINK_SCENARIO_LONG", 1000)[shard::SHARDS]
    query = [s for s in chosen if s % QUERY_EVERY == 0]
    interfere = [s for s in chosen if s % INTERFERE_EVERY == 0]
    swap = [s for s in chosen if s % len(model.MODES) == model.MODES.index("overwrite")]
    failed = run_schedules(runners, chosen)
    failed += run_schedules(runners, query, model.draw_query)
    failed += run_schedules(runners, interfere, draw_interfere)
    failed += run_schedules(runners, swap, model.draw_swap)
    fail_on(failed, len(chosen) + len(query) + len(interfere) + len(swap), runners.db.id)


# --------------------------------------------------------------------------- the oracle itself (no database)

INIT = model.initial_rows("upsert")
CHILD = model.child_rows()


def upsert_schedule(*writers: tuple[str, int, list[int]]) -> model.Schedule:
    return model.Schedule(
        0,
        "upsert",
        [model.Writer(label, batch, [[(k, label) for k in keys]], None, 0.0) for label, batch, keys in writers],
    )


def with_keys(base: list[tuple], **names: str) -> list[tuple]:
    rows = {r[0]: r for r in base}
    for key, name in names.items():
        rows[int(key[1:])] = (int(key[1:]), name)
    return sorted(rows.values())


def test_oracle_accepts_a_serial_history() -> None:
    s = upsert_schedule(("w0", 1, [1]), ("w1", 2, [1]))
    told = {"w0": oracle.Told("written", 0, 1), "w1": oracle.Told("written", 2, 3)}
    assert oracle.check(s, told, with_keys(INIT, k1="w1"), [], True, CHILD, 0) == []


def test_oracle_rejects_an_order_the_answers_forbid() -> None:
    """w0 answered 'written' before w1 started, so w1's row must be the one left."""
    s = upsert_schedule(("w0", 1, [1]), ("w1", 2, [1]))
    told = {"w0": oracle.Told("written", 0, 1), "w1": oracle.Told("written", 2, 3)}
    assert oracle.check(s, told, with_keys(INIT, k1="w0"), [], True, CHILD, 0)


def test_oracle_rejects_two_written_runs_of_one_batch_and_a_half_batch() -> None:
    s = upsert_schedule(("w0", 1, [1, 7]), ("w1", 1, [2]))
    told = {"w0": oracle.Told("written", 0, 1), "w1": oracle.Told("written", 0, 1)}
    assert any("2 runs told 'written'" in v for v in oracle.check(s, told, INIT, [], True, CHILD, 0))
    killed = {"w0": oracle.Told("killed", 0, 1), "w1": oracle.Told("error", 0, 1, phase="tasks")}
    assert oracle.check(s, killed, with_keys(INIT, k7="w0"), [], True, CHILD, 0)  # w0's key 1 missing


def test_oracle_rejects_a_skipped_batch_without_rows_and_a_taken_over_writer() -> None:
    s = upsert_schedule(("w0", 1, [7]), ("w1", 1, [8]))
    told = {"w0": oracle.Told("skipped", 0, 1), "w1": oracle.Told("error", 0, 1, error="BatchAbortedError XasinkError")}
    assert oracle.check(s, told, INIT, [], True, CHILD, 0)
    taken = {
        "w0": oracle.Told("written", 0, 3, claimed_at=0.5, committing_at=2.0),
        "w1": oracle.Told("error", 0, 3, error="ConcurrentWriterError BatchAbortedError XasinkError", claimed_at=1.0),
    }
    assert any("took batch 1 over" in v for v in oracle.check(s, taken, with_keys(INIT, k7="w0"), [], True, CHILD, 0))
    # w1 began its claim before w0's had ended: the journal may have ordered w1's first, so w0 rightly won
    overlapping = {
        "w0": oracle.Told("written", 0, 3, claiming_at=0.1, claimed_at=0.5, committing_at=2.0),
        "w1": oracle.Told(
            "error", 0, 3, error="ConcurrentWriterError BatchAbortedError XasinkError", claiming_at=0.4, claimed_at=1.0
        ),
    }
    assert oracle.check(s, overlapping, with_keys(INIT, k7="w0"), [], True, CHILD, 0) == []
    taken["w1"].claiming_at = 0.6  # began after w0's claim had ended: surely after it
    assert any("took batch 1 over" in v for v in oracle.check(s, taken, with_keys(INIT, k7="w0"), [], True, CHILD, 0))


def test_oracle_rejects_a_deleted_key_back_with_an_older_sequence() -> None:
    s = model.Schedule(
        0,
        "changes",
        [
            model.Writer("w0", 1, [[(1, "w0", 50, True)]], None, 0.0),
            model.Writer("w1", 2, [[(1, "w1", 40, False)]], None, 0.0),
        ],
    )
    told = {"w0": oracle.Told("written", 0, 1), "w1": oracle.Told("written", 0, 1)}
    gone = [r for r in model.initial_rows("changes") if r[0] != 1]
    child = [c for c in CHILD if c[1] != 1]
    assert oracle.check(s, told, gone, [], True, child, 0) == []
    assert oracle.check(s, told, sorted([*gone, (1, "w1", 40)]), [], True, child, 0)


def test_oracle_rejects_lost_child_rows_of_kept_keys() -> None:
    s = model.Schedule(0, "overwrite", [model.Writer("w0", 1, [[(1, "w0"), (3, "w0"), (5, "w0")]], None, 0.0)])
    told = {"w0": oracle.Told("written", 0, 1)}
    table = [(1, "w0"), (3, "w0"), (5, "w0")]
    assert oracle.check(s, told, table, [], True, CHILD, 0) == []
    assert any("child table" in v for v in oracle.check(s, told, table, [], True, [], 0))


INCOMPLETE = "CommitIncompleteError XasinkError"


def test_oracle_orders_a_run_told_decided_before_a_run_started_after_it() -> None:
    """Issue 37, item 1: w0 (batch 5) was told "decided, recovery will finish it" before w1 (batch 6) started, so
    w0 takes effect before w1, exactly as if it had been told "written": the table keeps w1's row of key 1."""
    s = upsert_schedule(("w0", 5, [1]), ("w1", 6, [1]))
    told = {"w0": oracle.Told("error", 0, 10, INCOMPLETE, phase="commit"), "w1": oracle.Told("written", 11, 20)}
    assert oracle.check(s, told, with_keys(INIT, k1="w1"), [], True, CHILD, 0) == []
    found = oracle.check(s, told, with_keys(INIT, k1="w0"), [], True, CHILD, 0)  # w0's older row applied last
    assert any("takes effect before one decided before it started" in v for v in found), found
    # w1 started before w0 answered: either may have decided first, either order explains the table
    overlapping = {"w0": told["w0"], "w1": oracle.Told("written", 9, 20)}
    assert oracle.check(s, overlapping, with_keys(INIT, k1="w0"), [], True, CHILD, 0) == []
    assert oracle.check(s, overlapping, with_keys(INIT, k1="w1"), [], True, CHILD, 0) == []


def test_oracle_orders_a_run_killed_after_its_decision_and_a_replayed_batch() -> None:
    """A run killed after its decision was decided before it died; the run of a batch another run was told
    "decided by another run" for was decided before that answer: both come before runs that started later."""
    s = upsert_schedule(("w0", 5, [1]), ("w1", 6, [1]))
    s.writers[0].fault = "driver.after_decide:kill"
    killed = {"w0": oracle.Told("killed", 0, 2), "w1": oracle.Told("written", 3, 9)}
    assert oracle.check(s, killed, with_keys(INIT, k1="w1"), [], True, CHILD, 0) == []
    assert oracle.check(s, killed, with_keys(INIT, k1="w0"), [], True, CHILD, 0)
    s = upsert_schedule(("w0", 5, [1]), ("r0", 5, [2]), ("w1", 6, [1]))
    s.writers[0].fault = "driver.before_decide:sleep=9"
    replayed = {
        "w0": oracle.Told("error", 0, 30, INCOMPLETE, phase="commit"),  # answered late, after w1
        "r0": oracle.Told("error", 1, 4, "ReplayIncompleteError " + INCOMPLETE, phase="commit"),
        "w1": oracle.Told("written", 5, 9),
    }
    assert oracle.check(s, replayed, with_keys(INIT, k1="w1"), [], True, CHILD, 0) == []
    assert oracle.check(s, replayed, with_keys(INIT, k1="w0"), [], True, CHILD, 0)


def test_oracle_rejects_a_raw_error_and_branches_left_by_a_failed_run() -> None:
    """Invariant 13: an error is an xasink error with its cause, and a run told one that promises a clean end
    (not "decided, recovery will finish it") left nothing prepared outside a decision."""
    s = upsert_schedule(("w0", 1, [1]))
    raw = {"w0": oracle.Told("error", 0, 1, "OperationalError DBAPIError SQLAlchemyError Exception", phase="commit")}
    assert any("raw OperationalError" in v for v in oracle.check(s, raw, INIT, [], True, CHILD, 0))
    raw["w0"].phase = "plan"  # nothing of the run exists yet: a poor message, not a broken promise
    assert oracle.check(s, raw, INIT, [], True, CHILD, 0) == []
    injected = {"w0": oracle.Told("error", 0, 1, "InjectedFault RuntimeError Exception", phase="tasks")}
    assert oracle.check(s, injected, INIT, [], True, CHILD, 0) == []
    left = {"w0": oracle.Told("error", 0, 1, "BatchAbortedError XasinkError", phase="commit", leftover=["xasink:x"])}
    assert any("left 1 branch(es) prepared" in v for v in oracle.check(s, left, INIT, [], True, CHILD, 0))
    assert left["w0"].must_leave_nothing() and not oracle.Told("error", 0, 1, INCOMPLETE).must_leave_nothing()


def test_oracle_rejects_an_answer_whose_rows_were_not_there() -> None:
    """Append mode: "written" means the run's rows were in the table when it answered, "skipped" a run's of its
    batch (a look right after the answer: appended rows never go away, so a later look proves nothing false)."""
    s = model.Schedule(0, "append", [model.Writer("w0", 1, [[(1000, "w0")]], None, 0.0)])
    s.writers.append(model.Writer("w1", 1, [[(2000, "w1")]], None, 0.0))
    table = sorted([*model.initial_rows("append"), (1000, "w0")])
    ok = {
        "w0": oracle.Told("written", 0, 1, seen={"table": [0, 1, 2, 1000]}),
        "w1": oracle.Told("skipped", 2, 3, seen={"table": [0, 1, 2, 1000]}),
    }
    assert oracle.check(s, ok, table, [], True, [], 0) == []
    early = {**ok, "w1": oracle.Told("skipped", 2, 3, seen={"table": [0, 1, 2]})}
    assert any("w1 told 'skipped'" in v for v in oracle.check(s, early, table, [], True, [], 0))


def test_oracle_lets_a_required_column_withdraw_only_a_batch_that_inserts_rows() -> None:
    """A column made NOT NULL without a default while a decided batch is applied: a batch inserting rows may rightly
    be withdrawn (its rows break the table), one that inserts none (empty, or only deletions) never."""
    inserts = model.Writer("w0", 1, [[(7, "w0", 50, False)]], "driver.after_decide:kill", 0.0)
    s = model.Schedule(
        0, "changes", [inserts], events=[model.Event("require_column", 0.0, 5.0, "w0:driver.after_decide")]
    )
    killed = {"w0": oracle.Told("killed", 0, 1)}
    initial = model.initial_rows("changes")
    assert oracle.check(s, killed, initial, [], True, CHILD, 0) == []  # withdrawn: nothing of it visible
    assert oracle.check(s, killed, sorted([*initial, (7, "w0", 50)]), [], True, CHILD, 0) == []  # or applied
    s.writers[0].partitions = [[(1, "w0", 50, True)]]  # only a deletion: nothing of it can break the table
    found = oracle.check(s, killed, initial, [], True, CHILD, 0)
    assert any("no set and order of runs explains the table" in v for v in found), found


# --------------------------------------------------------------------------- multi-target schedules


def run_multi(
    pg_url: str,
    mariadb_url: str,
    tmp_path: Path,
    chosen: list[int] | list[MultiSchedule],
    draw: Callable[[int], MultiSchedule] = draw_multi,
    pg_server: EmbeddedPostgres | None = None,
) -> list[MultiOutcome]:
    """Run each multi-target schedule and record it; the outcomes that broke a promise (see run_schedules).
    ``pg_server``: the session's PostgreSQL, which restart events kill (never the shared MariaDB)."""
    pg, maria = make_target(POSTGRESQL, pg_url), make_target(MARIADB, mariadb_url)
    try:
        runner = MultiRunner(pg, maria, tmp_path, PostgresRestarts(pg_server) if pg_server else None)
        failed: list[MultiOutcome] = []
        for item in chosen:
            schedule = item if isinstance(item, MultiSchedule) else draw(item)
            try:
                outcome = runner.run(schedule)
            except Exception:  # noqa: BLE001 - an unattended long run records it and goes on
                outcome = MultiOutcome(schedule, {}, {}, [f"the runner failed: {traceback.format_exc()[-3000:]}"], 0)
                if runner.servers["pg"] is not None and not runner.servers["pg"].alive():
                    runner.servers["pg"].start_again()
            if os.environ.get("XASINK_SCENARIO_SHOW") == "1":  # with -s: every schedule's report
                print(f"\n{outcome.report()}\n  {outcome.seconds:.1f}s")
            if outcome.violations:
                failed.append(outcome)
            record("pg+mariadb", schedule, outcome)
        return failed
    finally:
        pg.cleanup()
        maria.cleanup()


def test_scenarios_multi(pg_url: str, mariadb_url: str, tmp_path: Path) -> None:
    """Multi-target transactions (one table on PostgreSQL, one on MariaDB), replays with the writes reordered
    with and without journal_url, restarts of foreach_batch_multi from a new checkpoint (issues 27, 28)."""
    chosen = seeds("XASINK_SCENARIO_COUNT", None, MULTI_CI_SEEDS)
    fail_on(run_multi(pg_url, mariadb_url, tmp_path, chosen), len(chosen), "pg+mariadb")


def test_scenarios_multi_interfere(
    pg_url: str, mariadb_url: str, tmp_path: Path, pg_server: EmbeddedPostgres | None
) -> None:
    """Issue 37's multi-target schedules (multi.draw_multi_faults): a fault at any point of the decision,
    replays that write a subset of the targets, the log's sink row held when a run decides, a PostgreSQL
    restart."""
    chosen = seeds("XASINK_SCENARIO_COUNT", None, MULTI_FAULTS_CI_SEEDS)
    failed = run_multi(pg_url, mariadb_url, tmp_path, chosen, draw_multi_faults, pg_server)
    fail_on(failed, len(chosen), "pg+mariadb")


def kept_multi_cases() -> list[Any]:
    return [pytest.param(k["name"], id=k["name"], marks=open_mark(k["name"])) for k in kept(FOUND_MULTI)]


@pytest.mark.parametrize("name", kept_multi_cases())
def test_scenarios_found_multi(
    pg_url: str, mariadb_url: str, tmp_path: Path, pg_server: EmbeddedPostgres | None, name: str
) -> None:
    """A multi-target schedule kept because it found a bug (tests/scenarios/found_multi.json), exactly as written."""
    entry = kept_entry(FOUND_MULTI, name)
    schedule = MultiSchedule.from_dict({**entry["schedule"], "name": name})
    judge_kept(entry, run_multi(pg_url, mariadb_url, tmp_path, [schedule], pg_server=pg_server), "pg+mariadb")


@pytest.mark.soak
@pytest.mark.parametrize("shard", range(SHARDS))
def test_scenarios_multi_long(
    pg_url: str, mariadb_url: str, tmp_path: Path, pg_server: EmbeddedPostgres | None, shard: int
) -> None:
    """``XASINK_SCENARIO_LONG`` (default 1000) multi-target schedules (draw_multi), outside CI; every other seed
    also draws issue 37's kind (draw_multi_faults).  Every schedule runs before the test fails.  ``shard``: as
    in :func:`test_scenarios_long`."""
    chosen = seeds("XASINK_SCENARIO_LONG", 1000)[shard::SHARDS]
    failed = run_multi(pg_url, mariadb_url, tmp_path, chosen)
    faults = [s for s in chosen if s % MULTI_FAULTS_EVERY == 0]
    failed += run_multi(pg_url, mariadb_url, tmp_path, faults, draw_multi_faults, pg_server)
    fail_on(failed, len(chosen) + len(faults), "pg+mariadb")


def test_oracle_accepts_exit_2_only_for_a_withdrawn_batch_of_a_killed_writer() -> None:
    """PostgreSQL seed 1708: w0 (a row outside replaceWhere) killed after its decision; the final recover
    withdraws the batch and exits 2, as docs/operations.md says.  Exit 2 without such a batch is a violation."""
    outside = model.Writer("w0", 1, [[(1, "w0"), (5, "w0")]], "driver.after_first_commit:kill", 0.0)
    s = model.Schedule(0, "replaceWhere", [outside])
    killed = {"w0": oracle.Told("killed", 0, 1)}
    table = model.initial_rows("replaceWhere")
    assert oracle.check(s, killed, table, [], True, CHILD, 2) == []
    s.writers[0].partitions = [[(4, "w0"), (5, "w0")]]  # rows that fit: its batch is finished, never withdrawn
    assert any("exited 2" in v for v in oracle.check(s, killed, table, [], True, CHILD, 2))


def test_oracle_judges_a_batch_told_commit_incomplete_after_its_rows_failed_the_apply() -> None:
    """Interference seed 10568 (both databases): w0's replaceWhere batch has a row outside the condition, so
    its apply fails for the rows, and withdrawing the decision times out on the log's sink row, locked by
    another session: w0 is told CommitIncompleteError, whose message (and docs/errors.md) says recovery
    withdraws the batch unless the table takes its rows then.  Such a batch is withdrawn: the table keeps
    its rows, and a recover that withdrew it may exit 2.  The same answer for rows that fit means the rows."""
    error = "CommitIncompleteError BatchAbortedError XasinkError"
    outside = model.Writer("w0", 2, [[(9, "w0")], [(5, "w0"), (3, "w0")]], None, 0.0)
    s = model.Schedule(10568, "replaceWhere", [outside])
    told = {"w0": oracle.Told("error", 0, 1, error=error, phase="commit")}
    table = model.initial_rows("replaceWhere")
    assert oracle.check(s, told, table, [], True, CHILD, 2) == []
    s.writers[0].partitions = [[(9, "w0")], [(5, "w0"), (4, "w0")]]  # rows that fit: the batch is applied
    found = oracle.check(s, told, table, [], True, CHILD, 2)
    assert any("no set and order of runs explains the table" in v for v in found), found
    assert any("exited 2" in v for v in found), found


def test_oracle_accepts_exit_2_of_a_sink_no_run_recorded() -> None:
    """PostgreSQL interference seed 4048: the server restarted while every writer planned, so each was told
    ConnectError and none recorded the sink; the final ``recover --sink-id`` exits 2 (``recover/no-sink``)."""
    s = model.Schedule(0, "replaceWhere", [model.Writer("w0", 1, [[(4, "w0")]], None, 0.0)])
    refused = {"w0": oracle.Told("error", 0, 1, "ConnectError XasinkError", phase="plan")}
    table = model.initial_rows("replaceWhere")
    assert oracle.check(s, refused, table, [], True, CHILD, 2, sink_in_log=False) == []
    assert any("exited 2" in v for v in oracle.check(s, refused, table, [], True, CHILD, 2, sink_in_log=True))


def test_oracle_rejects_a_skip_for_another_query() -> None:
    """A restart from a new checkpoint (query qB) must be refused, never told 'skipped' for qA's batch."""
    s = upsert_schedule(("w0", 1, [1]), ("w1", 1, [2]))
    s.writers[0].query, s.writers[1].query = "qA", "qB"
    refused = {
        "w0": oracle.Told("written", 0, 1),
        "w1": oracle.Told("error", 2, 3, error="BatchIdentityError XasinkError", phase="plan"),
    }
    assert oracle.check(s, refused, with_keys(INIT, k1="w0"), [], True, CHILD, 0) == []
    skipped = {"w0": oracle.Told("written", 0, 1), "w1": oracle.Told("skipped", 2, 3)}
    assert oracle.check(s, skipped, with_keys(INIT, k1="w0"), [], True, CHILD, 0)
    s.writers[1].query = "qA"  # the same query's replay: skipped is right
    assert oracle.check(s, skipped, with_keys(INIT, k1="w0"), [], True, CHILD, 0) == []


def test_oracle_rejects_a_skip_for_a_write_whose_query_cannot_be_known() -> None:
    """Issue 37 item 7: a micro-batch written where its query cannot be known is recorded as unknown and replays
    nothing: qA's own later run from such a thread must be refused, never told 'skipped'."""
    s = upsert_schedule(("w0", 1, [1]), ("w1", 1, [2]))
    s.writers[0].query, s.writers[1].query = "qA", model.UNKNOWN_QUERY
    refused = {"w0": oracle.Told("written", 0, 1), "w1": oracle.Told("error", 2, 3, "BatchIdentityError XasinkError")}
    assert oracle.check(s, refused, with_keys(INIT, k1="w0"), [], True, CHILD, 0) == []
    skipped = {"w0": oracle.Told("written", 0, 1), "w1": oracle.Told("skipped", 2, 3)}
    found = oracle.check(s, skipped, with_keys(INIT, k1="w0"), [], True, CHILD, 0)
    assert any("its query cannot be known" in v for v in found), found


def test_oracle_reads_a_replay_whose_finish_failed_as_a_skip_not_yet_finished() -> None:
    """MariaDB seed 1008: w0 (taken over) found batch 1 decided by w1, and finishing w1's decision failed; both
    are told an incomplete commit.  Only w1's rows may be committed (w0's are not part of the decision), and
    some run of the batch must be: the same as a "skipped", except that the batch was not finished yet."""
    s = upsert_schedule(("w0", 1, [1]), ("w1", 1, [2]))
    incomplete = "CommitIncompleteError XasinkError"
    told = {
        "w0": oracle.Told("error", 0, 3, error="ReplayIncompleteError " + incomplete, phase="commit"),
        "w1": oracle.Told("error", 1, 2, error=incomplete, phase="commit"),
    }
    assert oracle.check(s, told, with_keys(INIT, k2="w1"), [], True, CHILD, 0) == []
    assert oracle.check(s, told, with_keys(INIT, k1="w0"), [], True, CHILD, 0)  # w0's rows: never its own decision
    alone = {"w0": told["w0"], "w1": oracle.Told("error", 1, 2, error="BatchAbortedError XasinkError", phase="commit")}
    assert oracle.check(s, alone, INIT, [], True, CHILD, 0)  # told "decided by another run": some run of it is in


DONE = [FinalRecover(0)]


def multi_schedule(*writers: tuple[str, int, str | None], log: str = "pg") -> MultiSchedule:
    return MultiSchedule(
        0,
        log,
        [
            MultiWriter(label, batch, {"pg": [[(i, label)]], "maria": [[(100 + i, label)]]}, ["pg", "maria"], None, 0.0)
            for i, (label, batch, _) in enumerate(writers)
        ],
    )


def test_multi_oracle() -> None:
    """Both targets or neither, one committed run per batch, a skip only for the batch's own query."""
    s = multi_schedule(("w0", 1, None), ("w1", 1, None))
    s.writers[1].order = ["maria", "pg"]
    ok = {"w0": oracle.Told("written", 0, 1), "w1": oracle.Told("skipped", 2, 3)}
    both = {"pg": [(0, "w0")], "maria": [(100, "w0")]}
    assert check_multi(s, ok, both, [], DONE) == []
    assert any("on every target" in v for v in check_multi(s, ok, {"pg": [(0, "w0")], "maria": []}, [], DONE))
    doubled = {"pg": [(0, "w0"), (1, "w1")], "maria": [(100, "w0"), (101, "w1")]}
    twice = {"w0": oracle.Told("written", 0, 1), "w1": oracle.Told("written", 2, 3)}
    found = check_multi(s, twice, doubled, [], DONE)
    assert any("2 runs committed" in v for v in found) and any("2 runs told" in v for v in found)
    s.writers[0].query, s.writers[1].query = "qA", "qB"
    assert any("new checkpoint" in v for v in check_multi(s, ok, both, [], DONE))
    assert any("left prepared" in v for v in check_multi(s, ok, both, ["xasink:x"], DONE))
    # without journal_url every run is refused (FOUND.md 5): told OptionError, nothing of it on the targets
    none = multi_schedule(("w0", 1, None), ("w1", 1, None), log="none")
    none.writers[1].order = ["maria", "pg"]
    refused = {w: oracle.Told("error", 0, 1, "OptionError XasinkError", phase="tasks") for w in ("w0", "w1")}
    assert check_multi(none, refused, {"pg": [], "maria": []}, [], DONE) == []
    assert any("must be refused" in v for v in check_multi(none, ok, both, [], DONE))
    other = {**refused, "w1": oracle.Told("error", 0, 1, "RuntimeError", phase="tasks")}
    assert any("must be refused" in v for v in check_multi(none, other, {"pg": [], "maria": []}, [], DONE))
    lost = {**refused, "w1": oracle.Told("error", 0, 1, "LateBranchError XasinkError", phase="tasks")}
    assert check_multi(none, lost, {"pg": [], "maria": []}, [], DONE) == []  # taken over before its 2nd database


def test_multi_oracle_accepts_exit_2_only_from_a_log_that_never_saw_the_sink() -> None:
    """Seed 3029: every writer refused before deciding (no journal_url), so the final ``recover --sink-id`` on
    each database's own log finds no such sink and exits 2 (``recover/no-sink``); from a log that knows the sink,
    2 is a failure."""
    none = multi_schedule(("w0", 1, None), log="none")
    refused = {"w0": oracle.Told("error", 0, 1, "OptionError XasinkError", phase="tasks")}
    empty: dict[str, list[Row]] = {"pg": [], "maria": []}
    assert check_multi(none, refused, empty, [], [FinalRecover(2, sink_in_log=False)] * 2) == []
    found = check_multi(none, refused, empty, [], [FinalRecover(2, sink_in_log=False), FinalRecover(2)])
    assert any("final `xasink recover` exited" in v for v in found), found
    assert check_multi(none, refused, empty, [], [FinalRecover(1, sink_in_log=False)])


def test_multi_oracle_judges_a_replay_of_a_subset_by_what_it_saw() -> None:
    """Issue 37, item 5: a replay writing only PostgreSQL was told "skipped" while the decided batch's MariaDB part
    was still prepared (its look right after the answer saw w0's rows on PostgreSQL only)."""
    s = multi_schedule(("w0", 1, None), ("w1", 1, None))
    s.writers[1].order = ["pg"]
    both = {"pg": [(0, "w0")], "maria": [(100, "w0")]}
    seen_both = {"pg": [0], "maria": [100]}
    ok = {"w0": oracle.Told("killed", 0, 1), "w1": oracle.Told("skipped", 2, 3, seen=seen_both)}
    s.writers[0].fault = "driver.after_decide:kill"
    assert check_multi(s, ok, both, [], DONE) == []
    early = {**ok, "w1": oracle.Told("skipped", 2, 3, seen={"pg": [0], "maria": []})}
    found = check_multi(s, early, both, [], DONE)
    assert any("w1 told 'skipped'" in v and "w0's {'maria': [100]}" in v for v in found), found


def test_oracle_requires_an_xasink_error_from_the_claim_on() -> None:
    """Interference seed 10568, w1: the log's sink row was locked past controlLockTimeout while its claim waited.
    The claim (and the batch's check and recovery of earlier runs before the tasks) raise xasink errors only,
    as the data source's writer() wraps them: a raw lock timeout there is a broken promise; while the table is
    planned (phase plan: nothing of the batch is in the log yet) it is still only a poor message."""
    s = upsert_schedule(("w0", 1, [1]))
    timeout = "OperationalError DBAPIError SQLAlchemyError Exception"
    for phase, flagged in (("plan", False), ("claim", True)):
        told = {"w0": oracle.Told("error", 0, 1, error=timeout, phase=phase)}
        found = oracle.check(s, told, INIT, [], True, CHILD, 0)
        assert any("raw OperationalError (claim)" in v for v in found) == flagged, (phase, found)
    aborted = {"w0": oracle.Told("error", 0, 1, error="BatchAbortedError XasinkError", phase="claim")}
    assert oracle.check(s, aborted, INIT, [], True, CHILD, 0) == []
