"""Write modes with their driver SIGKILLed at the steps of the protocol, then finished by recovery or a rerun.

An overwrite's branches load a shadow table; after the decision the driver commits them, then one local
transaction replaces the target's rows and marks the batch.  A driver killed at any step must leave,
after ``xasink recover`` (the CLI, as an operator runs it) or the next run of the sink, exactly the old rows
or exactly the new ones, and nothing prepared.  Each kill is checked first to have landed where it was
meant to (decision, prepared branches, visible rows), and a foreign prepared transaction must survive it all.

Which points, where (CI time): tests/modes_driver.py runs the overwrite without Spark (the data source's own
planning, ``write_partition`` per branch, ``Coordinator.commit``), so a kill costs a Python start, not a JVM.
each of the five driver points runs on both databases (before_decide: undecided, rolled back; after_decide:
decided, nothing committed; after_first_commit: some branches committed into the shadow; after_commits:
every branch committed into the shadow, the table not yet replaced; after_mark: applied), each finished one
way (``xasink recover`` CLI or the rerun; every case then reruns), the two ways alternating so each
database gets both.  A real Spark driver is killed once, in the complete-mode streaming test (PostgreSQL
only: a JVM start and two micro-batches cost most of this file's time, and the apply step it exercises is
the one the direct kills cover on MariaDB): its micro-batch dies between the commits and the apply, and the
query restarted from its checkpoint keeps the table equal to the aggregate.
"""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from tests.harness import assert_settled, expected, fill, own_mariadb, run_driver, shadow_rows, storage_of, swap_tables
from tests.leaks import run_cli
from tests.modes_driver import complete_query, overwrite_direct, split
from tests.procs import ROOT, tail
from tests.targets import MARIADB, POSTGRESQL, Target, case

pytestmark = pytest.mark.crash

DRIVER = ROOT / "tests" / "modes_driver.py"
N, FIRST, PARTITIONS, BATCH = 300, 150, 3, 4  # old ids 0..299, new ids 150..449: half the keys kept
OLD, NEW = expected(range(N), tag="o"), expected(range(FIRST, FIRST + N))


@pytest.fixture(scope="module")
def mariadb_url() -> Iterator[str]:
    """A server of this module's own (:func:`tests.harness.own_mariadb`): the rename must not meet other files'
    snapshots."""
    yield from own_mariadb("crash")


@pytest.fixture
def foreign(db: Target) -> Iterator[str]:
    """A prepared transaction that is not xasink's: it must outlive the kill and the recovery."""
    scratch = f"scr_{uuid.uuid4().hex[:8]}"
    name = db.make_foreign_prepared(f"foreign-etl-{uuid.uuid4().hex[:6]}", scratch)
    yield name
    db.clear_foreign(name)
    assert db.rows(scratch) == []


@pytest.mark.parametrize(
    ("db", "point", "finish"),
    [
        case(POSTGRESQL, "driver.before_decide", "cli"),  # undecided: rolled back, the old rows stay
        case(POSTGRESQL, "driver.after_decide", "rerun"),  # decided, nothing committed
        case(POSTGRESQL, "driver.after_first_commit", "rerun"),  # some branches committed into the shadow
        case(POSTGRESQL, "driver.after_commits", "cli"),  # all committed into the shadow, the table untouched
        case(POSTGRESQL, "driver.after_mark", "rerun"),  # applied and marked
        # the swap (tests/test_overwrite_swap.py): the new storage loaded; the target swapped, not committed
        case(POSTGRESQL, "driver.swap_loaded", "cli"),
        case(POSTGRESQL, "driver.apply_statements", "rerun"),
        case(MARIADB, "driver.before_decide", "rerun"),
        case(MARIADB, "driver.after_decide", "cli"),
        case(MARIADB, "driver.after_first_commit", "cli"),
        case(MARIADB, "driver.after_commits", "rerun"),
        case(MARIADB, "driver.after_mark", "cli"),
        # the renamed swap: the new table loaded; renamed in, the batch not marked; marked, its witness left
        case(MARIADB, "driver.swap_built", "rerun"),
        case(MARIADB, "driver.swap_renamed", "cli"),
        case(MARIADB, "driver.swap_marked", "rerun"),
        case(MARIADB, "driver.swap_marked", "cli"),  # marked: recover alone drops the witness (adversary)
    ],
    indirect=["db"],
)
def test_an_overwrite_killed_at_each_step_ends_with_the_old_or_the_new_rows(
    db: Target, foreign: str, tmp_path: Path, point: str, finish: str
) -> None:
    table = db.new_table()
    db.keyed_table(table)
    fill(db, table, OLD)
    storage = storage_of(db, table)
    s = f"wmc-{uuid.uuid4().hex[:8]}"
    log = tmp_path / "driver.log"
    args = ["direct", db.url, table, s, str(BATCH), str(FIRST), str(N), str(PARTITIONS)]
    returncode = run_driver(DRIVER, args, f"{point}:kill", log)
    assert returncode == -signal.SIGKILL, f"driver exited {returncode}, not killed at {point}:\n{tail(log)}"

    # the kill landed where it was meant to
    decision, prepared, visible = db.decision(s, BATCH), db.prepared(s), db.rows(table)
    if point == "driver.before_decide":
        assert decision is None and len(prepared) == PARTITIONS and visible == OLD
    else:
        assert decision is not None and len(decision.xids) == PARTITIONS
        marked = point in ("driver.after_mark", "driver.swap_marked")
        assert decision.state == ("committed" if marked else "committing"), decision
        if point == "driver.after_decide":
            assert prepared == sorted(decision.xids)
        elif point == "driver.after_first_commit":
            assert prepared and set(prepared) < set(decision.xids)
            assert 0 < shadow_rows(db) < N  # the committed branches' rows wait in the shadow
        else:
            assert prepared == []
        # until the apply step, the table holds exactly its old rows, even with every branch committed; from a
        # rename on (MariaDB's swap commits step by step), the new ones, the old storage kept as its witness
        swapped = point in ("driver.after_mark", "driver.swap_renamed", "driver.swap_marked")
        assert visible == (NEW if swapped else OLD)
        if not swapped:  # a swap killed before its rename changed nothing the table's users see
            assert storage_of(db, table) == storage
        if db.kind == POSTGRESQL and point != "driver.after_mark":  # (its transaction left nothing)
            assert swap_tables(db) == []
        if point == "driver.swap_built":
            assert [n for n in swap_tables(db) if "_sw_" in n] != []  # the new table, built and not renamed
        if point in ("driver.swap_renamed", "driver.swap_marked"):
            assert [n for n in swap_tables(db) if "_so_" in n] != []  # the old storage, under its witness name
        if point == "driver.after_commits":
            assert shadow_rows(db) == N  # the whole batch waits in the shadow
    assert foreign in db.listed()

    if finish == "cli":
        # as an operator runs it: the URL alone finishes a decided batch; an undecided one needs --older-than
        # (its branches might belong to a live run)
        age = ["--older-than", "0s"] if point == "driver.before_decide" else []
        cli = run_cli("recover", "--url", db.url, *age)
        assert cli.returncode == 0, cli.stdout + cli.stderr
        assert db.rows(table) == (OLD if point == "driver.before_decide" else NEW)
        assert_settled(db, s)
        assert foreign in db.listed()
        assert swap_tables(db) == []  # no copy of the table outlives recover (a half-built one, an old one)
        if point == "driver.swap_marked":  # what docs/operations.md says recover prints then
            assert f"dropped the old tables of sink {s}'s renamed overwrites" in cli.stdout, cli.stdout
    # the next run of the sink: a decided batch is finished and not written again, an undecided one is written
    result = overwrite_direct(db.url, table, s, BATCH, split(FIRST, N, PARTITIONS))
    assert result.skipped is (point != "driver.before_decide")
    assert db.rows(table) == NEW
    assert_settled(db, s)
    assert db.decision(s, BATCH).state == "committed"  # type: ignore[union-attr]
    assert foreign in db.listed()
    # the batch was applied by a swap (by the recovery or the rerun), which left no table behind
    assert storage_of(db, table) != storage and swap_tables(db) == []


# --------------------------------------------------------------------------- complete output mode

FILES = [["a", "b", "a"]]  # one micro-batch: each costs seconds of Spark (several batches: test_write_modes.py)


def aggregate(files: list[list[str]]) -> list[tuple[str, int]]:
    counts: dict[str, int] = {}
    for keys in files:
        for k in keys:
            counts[k] = counts.get(k, 0) + 1
    return sorted(counts.items())


@pytest.mark.spark
@pytest.mark.parametrize("db", [case(POSTGRESQL)], indirect=True)
def test_complete_mode_survives_a_driver_kill_between_commits_and_apply(
    db: Target, spark: SparkSession, tmp_path: Path, driver_cds: str | None
) -> None:
    """A streaming aggregation in complete mode, its Spark driver SIGKILLed after micro-batch 0's branches
    committed into the shadow: the table keeps its old rows exactly; restarted from the checkpoint, the query
    finishes batch 0 (its replay writes nothing new) and the table equals the aggregate (the old row gone)."""
    table = db.new_table()
    db.create_table(table, "k varchar(10) PRIMARY KEY, n bigint")
    db.execute(f"INSERT INTO {db.q(table)} VALUES ('stale', 99)")
    src, chk = tmp_path / "in", tmp_path / "chk"
    src.mkdir()
    base = time.time() - 100
    for i, keys in enumerate(FILES):  # file i is micro-batch i (maxFilesPerTrigger=1, ordered times)
        path = src / f"part-{i}.json"
        path.write_text("".join(json.dumps({"k": k}) + "\n" for k in keys))
        os.utime(path, (base + i, base + i))
    s = f"wmc-{uuid.uuid4().hex[:8]}"
    log = tmp_path / "stream.log"
    returncode = run_driver(
        DRIVER, ["stream", db.url, table, s, str(src), str(chk)], "driver.after_commits:kill:b=0", log
    )
    assert returncode == -signal.SIGKILL, f"stream driver exited {returncode}:\n{tail(log)}"
    assert db.rows(table) == [("stale", 99)]  # batch 0 is in the shadow, not applied
    assert db.decision(s, 0).state == "committing"  # type: ignore[union-attr]
    assert db.prepared(s) == []

    query = complete_query(spark, db.url, table, s, str(src), str(chk))
    query.awaitTermination(180)
    assert query.exception() is None, query.exception()
    assert db.rows(table) == aggregate(FILES)
    assert {b: d.state for b, d in db.decisions(s).items()} == {0: "committed"}
    assert_settled(db, s)
