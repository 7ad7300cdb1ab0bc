"""The scenario checker (issue 27): seeded concurrent schedules against both databases, judged by an oracle.

Each schedule (tests/scenarios/model.py) runs two to four writers of one sink at once, without Spark
(tests/scenarios/driver.py), with pauses and SIGKILLs at protocol points and ``xasink recover`` runs,
then a final recover; the oracle checks that what every run was told is true of the table.

- CI: the fixed seeds :data:`CI_SEEDS` per database (every write mode; ``XASINK_SCENARIO_COUNT=N`` runs
  seeds ``XASINK_SCENARIO_BASE`` (default 0) .. +N instead), and the schedules kept in
  tests/scenarios/found.json because they found the bugs of tests/scenarios/FOUND.md
  (``XASINK_SCENARIO_FOUND=<name>`` runs one).
- ``soak``: ``XASINK_SCENARIO_LONG`` (default 1000) schedules per database from ``XASINK_SCENARIO_BASE``.
- Replay: ``XASINK_SCENARIO_SEED=<seed>`` runs that one schedule (each database).  The schedule is the
  same; the interleaving of real processes is not, so a race may need a few runs to show again.

A violation fails the test with each failing schedule, what its runs were told, what the oracle saw and
the seed to replay it; ``XASINK_SCENARIO_REPORT=<file>`` also appends them there as JSON lines.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.scenarios import model
from tests.scenarios.multi import MultiOutcome, MultiRunner, MultiSchedule, MultiWriter, check_multi, draw_multi
from tests.scenarios.runner import Outcome, Runner, env_int
from tests.targets import MARIADB, POSTGRESQL, Target, make_target

# seed % 5 picks the mode (append, upsert, overwrite, replaceWhere, changes); 2 and 13 showed bug 1 of
# FOUND.md (child rows cascaded by an overwrite / replaceWhere) on both databases; about 5-10 s each
CI_SEEDS = (0, 1, 2, 4, 9, 13)


# restarts from a new checkpoint (draw_query: another streaming query's writer of a decided batch); a few s each
QUERY_CI_SEEDS = (0, 1, 3)
# multi-target transactions over PostgreSQL and MariaDB (tests/scenarios/multi.py): seed % 3 picks where the
# log is (journal_url on PostgreSQL, on MariaDB, none); replays with the writes reordered, other queries' runs.
# None of them runs two writers of a batch at once in two logs (FOUND.md 5, kept in found_multi.json); ~5 s each
MULTI_CI_SEEDS = (0, 4, 8, 14, 18, 29, 32, 36)


def seeds(count_env: str, default: int | None, ci: tuple[int, ...] = CI_SEEDS) -> list[int]:
    one = os.environ.get("XASINK_SCENARIO_SEED")
    if one:
        return [int(one)]
    base = env_int("XASINK_SCENARIO_BASE", 0)
    count = env_int(count_env, 0) or default
    return list(range(base, base + count)) if count else list(ci)


FOUND = Path(__file__).parent / "scenarios" / "found.json"


def found_schedules() -> list[model.Schedule]:
    """The kept schedules that found bugs (tests/scenarios/FOUND.md), or the one XASINK_SCENARIO_FOUND names."""
    kept = [model.Schedule.from_dict({**k["schedule"], "name": k["name"]}) for k in json.loads(FOUND.read_text())]
    one = os.environ.get("XASINK_SCENARIO_FOUND")
    return [s for s in kept if s.name == one] if one else kept


def record(db: str, schedule: model.Schedule | MultiSchedule, outcome: Outcome | MultiOutcome) -> None:
    """Append one JSON line per schedule run to ``XASINK_SCENARIO_REPORT``, if set: the long runs' tally
    (``violations`` empty when every promise held)."""
    report = os.environ.get("XASINK_SCENARIO_REPORT")
    if not report:
        return
    entry = {
        "db": db,
        "seed": schedule.seed,
        "name": getattr(schedule, "name", ""),
        "seconds": round(outcome.seconds, 1),
        "violations": outcome.violations,
        "schedule": schedule.describe() if outcome.violations else "",
        "report": outcome.report() if outcome.violations else "",
    }
    with open(report, "a") as out:
        out.write(json.dumps(entry) + "\n")


def run_schedules(
    db: Target,
    tmp_path: Path,
    chosen: list[int] | list[model.Schedule],
    draw: Callable[[int], model.Schedule] = model.draw,
) -> None:
    runner = Runner(db, tmp_path)
    failed: list[Outcome] = []
    for item in chosen:
        schedule = item if isinstance(item, model.Schedule) else draw(item)
        outcome = runner.run(schedule)
        if os.environ.get("XASINK_SCENARIO_SHOW") == "1":  # with -s: every schedule's report
            print(f"\n{outcome.report()}\n  {outcome.seconds:.1f}s")
        if outcome.violations:
            failed.append(outcome)
        record(db.id, schedule, outcome)
    if failed:
        details = "\n\n".join(o.report() for o in failed)
        pytest.fail(f"{len(failed)} of {len(chosen)} schedules on {db.id} broke a promise:\n\n{details}", pytrace=False)


def test_scenarios(db: Target, tmp_path: Path) -> None:
    """A short fixed set of schedules (every write mode), as CI runs it."""
    run_schedules(db, tmp_path, seeds("XASINK_SCENARIO_COUNT", None))


def test_scenarios_found(db: Target, tmp_path: Path) -> None:
    """The schedules kept because they found bugs (tests/scenarios/found.json), exactly as drawn then."""
    run_schedules(db, tmp_path, found_schedules())


def test_scenarios_query(db: Target, tmp_path: Path) -> None:
    """Restarts from a new checkpoint (issue 28): a writer of a decided (sink, batch) for another streaming
    query is refused, never told "skipped" (model.draw_query)."""
    run_schedules(db, tmp_path, seeds("XASINK_SCENARIO_COUNT", None, QUERY_CI_SEEDS), model.draw_query)


@pytest.mark.soak
def test_scenarios_long(db: Target, tmp_path: Path) -> None:
    """At least 1,000 schedules per database (``XASINK_SCENARIO_LONG``), outside CI; every fifth seed also
    draws a restart from a new checkpoint (model.draw_query)."""
    chosen = seeds("XASINK_SCENARIO_LONG", 1000)
    run_schedules(db, tmp_path, chosen)
    run_schedules(db, tmp_path, [s for s in chosen if s % 5 == 0], model.draw_query)


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
    told = {"w0": model.Told("written", 0, 1), "w1": model.Told("written", 2, 3)}
    assert model.check(s, told, with_keys(INIT, k1="w1"), [], True, CHILD, 0) == []


def test_oracle_rejects_an_order_the_answers_forbid() -> None:
    """w0 answered 'written' before w1 started, so w1's row must be the one left."""
    s = upsert_schedule(("w0", 1, [1]), ("w1", 2, [1]))
    told = {"w0": model.Told("written", 0, 1), "w1": model.Told("written", 2, 3)}
    assert model.check(s, told, with_keys(INIT, k1="w0"), [], True, CHILD, 0)


def test_oracle_rejects_two_written_runs_of_one_batch_and_a_half_batch() -> None:
    s = upsert_schedule(("w0", 1, [1, 7]), ("w1", 1, [2]))
    told = {"w0": model.Told("written", 0, 1), "w1": model.Told("written", 0, 1)}
    assert any("2 runs told 'written'" in v for v in model.check(s, told, INIT, [], True, CHILD, 0))
    killed = {"w0": model.Told("killed", 0, 1), "w1": model.Told("error", 0, 1, phase="tasks")}
    assert model.check(s, killed, with_keys(INIT, k7="w0"), [], True, CHILD, 0)  # w0's key 1 missing


def test_oracle_rejects_a_skipped_batch_without_rows_and_a_taken_over_writer() -> None:
    s = upsert_schedule(("w0", 1, [7]), ("w1", 1, [8]))
    told = {"w0": model.Told("skipped", 0, 1), "w1": model.Told("error", 0, 1, error="BatchAbortedError")}
    assert model.check(s, told, INIT, [], True, CHILD, 0)
    taken = {
        "w0": model.Told("written", 0, 3, claimed_at=0.5, committing_at=2.0),
        "w1": model.Told("error", 0, 3, error="ConcurrentWriterError BatchAbortedError", claimed_at=1.0),
    }
    assert any("took batch 1 over" in v for v in model.check(s, taken, with_keys(INIT, k7="w0"), [], True, CHILD, 0))
    # w1 began its claim before w0's had ended: the journal may have ordered w1's first, so w0 rightly won
    overlapping = {
        "w0": model.Told("written", 0, 3, claiming_at=0.1, claimed_at=0.5, committing_at=2.0),
        "w1": model.Told(
            "error", 0, 3, error="ConcurrentWriterError BatchAbortedError", claiming_at=0.4, claimed_at=1.0
        ),
    }
    assert model.check(s, overlapping, with_keys(INIT, k7="w0"), [], True, CHILD, 0) == []
    taken["w1"].claiming_at = 0.6  # began after w0's claim had ended: surely after it
    assert any("took batch 1 over" in v for v in model.check(s, taken, with_keys(INIT, k7="w0"), [], True, CHILD, 0))


def test_oracle_rejects_a_deleted_key_back_with_an_older_sequence() -> None:
    s = model.Schedule(
        0,
        "changes",
        [
            model.Writer("w0", 1, [[(1, "w0", 50, True)]], None, 0.0),
            model.Writer("w1", 2, [[(1, "w1", 40, False)]], None, 0.0),
        ],
    )
    told = {"w0": model.Told("written", 0, 1), "w1": model.Told("written", 0, 1)}
    gone = [r for r in model.initial_rows("changes") if r[0] != 1]
    child = [c for c in CHILD if c[1] != 1]
    assert model.check(s, told, gone, [], True, child, 0) == []
    assert model.check(s, told, sorted([*gone, (1, "w1", 40)]), [], True, child, 0)


def test_oracle_rejects_lost_child_rows_of_kept_keys() -> None:
    s = model.Schedule(0, "overwrite", [model.Writer("w0", 1, [[(1, "w0"), (3, "w0"), (5, "w0")]], None, 0.0)])
    told = {"w0": model.Told("written", 0, 1)}
    table = [(1, "w0"), (3, "w0"), (5, "w0")]
    assert model.check(s, told, table, [], True, CHILD, 0) == []
    assert any("child table" in v for v in model.check(s, told, table, [], True, [], 0))


# --------------------------------------------------------------------------- multi-target schedules


def run_multi(pg_url: str, mariadb_url: str, tmp_path: Path, chosen: list[int] | list[MultiSchedule]) -> None:
    pg, maria = make_target(POSTGRESQL, pg_url), make_target(MARIADB, mariadb_url)
    try:
        runner = MultiRunner(pg, maria, tmp_path)
        failed: list[MultiOutcome] = []
        for item in chosen:
            schedule = item if isinstance(item, MultiSchedule) else draw_multi(item)
            outcome = runner.run(schedule)
            if os.environ.get("XASINK_SCENARIO_SHOW") == "1":  # with -s: every schedule's report
                print(f"\n{outcome.report()}\n  {outcome.seconds:.1f}s")
            if outcome.violations:
                failed.append(outcome)
            record("pg+mariadb", schedule, outcome)
        if failed:
            details = "\n\n".join(o.report() for o in failed)
            pytest.fail(
                f"{len(failed)} of {len(chosen)} multi-target schedules broke a promise:\n\n{details}", pytrace=False
            )
    finally:
        pg.cleanup()
        maria.cleanup()


def test_scenarios_multi(pg_url: str, mariadb_url: str, tmp_path: Path) -> None:
    """Multi-target transactions (one table on PostgreSQL, one on MariaDB), replays with the writes reordered
    with and without journal_url, restarts of foreach_batch_multi from a new checkpoint (issues 27, 28)."""
    run_multi(pg_url, mariadb_url, tmp_path, seeds("XASINK_SCENARIO_COUNT", None, MULTI_CI_SEEDS))


FOUND_MULTI = Path(__file__).parent / "scenarios" / "found_multi.json"


def found_multi() -> list[MultiSchedule]:
    """The kept multi-target schedules (tests/scenarios/found_multi.json), or the one XASINK_SCENARIO_FOUND names."""
    kept = [MultiSchedule.from_dict({**k["schedule"], "name": k["name"]}) for k in json.loads(FOUND_MULTI.read_text())]
    one = os.environ.get("XASINK_SCENARIO_FOUND")
    return [s for s in kept if s.name == one] if one else kept


def test_scenarios_found_multi(pg_url: str, mariadb_url: str, tmp_path: Path) -> None:
    """The multi-target schedules kept because they found bugs, exactly as written there."""
    chosen = found_multi()
    if not chosen:
        pytest.skip("no kept multi-target schedule by that name")
    run_multi(pg_url, mariadb_url, tmp_path, chosen)


@pytest.mark.soak
def test_scenarios_multi_long(pg_url: str, mariadb_url: str, tmp_path: Path) -> None:
    """``XASINK_SCENARIO_LONG`` (default 1000) multi-target schedules, outside CI."""
    run_multi(pg_url, mariadb_url, tmp_path, seeds("XASINK_SCENARIO_LONG", 1000))


def test_oracle_accepts_exit_2_only_for_a_withdrawn_batch_of_a_killed_writer() -> None:
    """PostgreSQL seed 1708: w0 (a row outside replaceWhere) killed after its decision; the final recover
    withdraws the batch and exits 2, as docs/operations.md says.  Exit 2 without such a batch is a violation."""
    outside = model.Writer("w0", 1, [[(1, "w0"), (5, "w0")]], "driver.after_first_commit:kill", 0.0)
    s = model.Schedule(0, "replaceWhere", [outside])
    killed = {"w0": model.Told("killed", 0, 1)}
    table = model.initial_rows("replaceWhere")
    assert model.check(s, killed, table, [], True, CHILD, 2) == []
    s.writers[0].partitions = [[(4, "w0"), (5, "w0")]]  # rows that fit: its batch is finished, never withdrawn
    assert any("exited 2" in v for v in model.check(s, killed, table, [], True, CHILD, 2))


def test_oracle_rejects_a_skip_for_another_query() -> None:
    """A restart from a new checkpoint (query qB) must be refused, never told 'skipped' for qA's batch."""
    s = upsert_schedule(("w0", 1, [1]), ("w1", 1, [2]))
    s.writers[0].query, s.writers[1].query = "qA", "qB"
    refused = {
        "w0": model.Told("written", 0, 1),
        "w1": model.Told("error", 2, 3, error="BatchIdentityError", phase="plan"),
    }
    assert model.check(s, refused, with_keys(INIT, k1="w0"), [], True, CHILD, 0) == []
    skipped = {"w0": model.Told("written", 0, 1), "w1": model.Told("skipped", 2, 3)}
    assert model.check(s, skipped, with_keys(INIT, k1="w0"), [], True, CHILD, 0)
    s.writers[1].query = "qA"  # the same query's replay: skipped is right
    assert model.check(s, skipped, with_keys(INIT, k1="w0"), [], True, CHILD, 0) == []


def test_oracle_reads_a_replay_whose_finish_failed_as_a_skip_not_yet_finished() -> None:
    """MariaDB seed 1008: w0 (taken over) found batch 1 decided by w1, and finishing w1's decision failed; both
    are told an incomplete commit.  Only w1's rows may be committed (w0's are not part of the decision), and
    some run of the batch must be: the same as a "skipped", except that the batch was not finished yet."""
    s = upsert_schedule(("w0", 1, [1]), ("w1", 1, [2]))
    incomplete = "CommitIncompleteError XasinkError"
    told = {
        "w0": model.Told("error", 0, 3, error="ReplayIncompleteError " + incomplete, phase="commit"),
        "w1": model.Told("error", 1, 2, error=incomplete, phase="commit"),
    }
    assert model.check(s, told, with_keys(INIT, k2="w1"), [], True, CHILD, 0) == []
    assert model.check(s, told, with_keys(INIT, k1="w0"), [], True, CHILD, 0)  # w0's rows: never its own decision
    alone = {"w0": told["w0"], "w1": model.Told("error", 1, 2, error="BatchAbortedError", phase="commit")}
    assert model.check(s, alone, INIT, [], True, CHILD, 0)  # told "decided by another run": some run of it is in


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
    ok = {"w0": model.Told("written", 0, 1), "w1": model.Told("skipped", 2, 3)}
    both = {"pg": [(0, "w0")], "maria": [(100, "w0")]}
    assert check_multi(s, ok, both, [], [0]) == []
    assert any("on both targets" in v for v in check_multi(s, ok, {"pg": [(0, "w0")], "maria": []}, [], [0]))
    doubled = {"pg": [(0, "w0"), (1, "w1")], "maria": [(100, "w0"), (101, "w1")]}
    twice = {"w0": model.Told("written", 0, 1), "w1": model.Told("written", 2, 3)}
    found = check_multi(s, twice, doubled, [], [0])
    assert any("2 runs committed" in v for v in found) and any("2 runs told" in v for v in found)
    s.writers[0].query, s.writers[1].query = "qA", "qB"
    assert any("new checkpoint" in v for v in check_multi(s, ok, both, [], [0]))
    assert any("left prepared" in v for v in check_multi(s, ok, both, ["xasink:x"], [0]))
    # without journal_url every run is refused (FOUND.md 5): told OptionError, nothing of it on the targets
    none = multi_schedule(("w0", 1, None), ("w1", 1, None), log="none")
    none.writers[1].order = ["maria", "pg"]
    refused = {w: model.Told("error", 0, 1, "OptionError XasinkError", phase="tasks") for w in ("w0", "w1")}
    assert check_multi(none, refused, {"pg": [], "maria": []}, [], [0]) == []
    assert any("must be refused" in v for v in check_multi(none, ok, both, [], [0]))
    other = {**refused, "w1": model.Told("error", 0, 1, "RuntimeError", phase="tasks")}
    assert any("must be refused" in v for v in check_multi(none, other, {"pg": [], "maria": []}, [], [0]))
    lost = {**refused, "w1": model.Told("error", 0, 1, "LateBranchError XasinkError", phase="tasks")}
    assert check_multi(none, lost, {"pg": [], "maria": []}, [], [0]) == []  # taken over before its 2nd database
