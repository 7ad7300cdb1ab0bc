"""Adversarial checks of ``visibility="batch"`` (issue 40) and of an unqualified table recorded in the schema the
writer's session finds it in (PostgreSQL search_path), against the real servers: each test is a way tried to make
a reader see part of a batch, a batch applied twice or never, or decision order broken; ``xfail(strict=True)``
while open."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.harness import assert_settled, expected, fill, run_driver, shadow_rows
from tests.leaks import run_cli
from tests.modes_driver import batch_direct, overwrite_direct, split
from tests.procs import ROOT, tail
from tests.targets import POSTGRESQL, Target, case
from xasink.errors import ApplyError, BatchBlockedError, CommitIncompleteError
from xasink.ops import survey as admin

COLUMNS = {"id": "int", "name": "string"}
OLD = expected(range(100), tag="o")
DRIVER = ROOT / "tests" / "modes_driver.py"


def sink() -> str:
    return f"adv2-{uuid.uuid4().hex[:8]}"


def killed_at(
    db: Target, tmp_path: Path, point: str, table: str, sink_id: str, batch: int, parts: Any, mode: str, **options: Any
) -> None:
    """One batch of tests/modes_driver.py ``batch``, kill -9 at ``point``."""
    spec = {
        "url": db.url,
        "table": table,
        "sink_id": sink_id,
        "batch_id": batch,
        "columns": COLUMNS,
        "partitions": parts,
        "mode": mode,
        "options": options,
    }
    log = tmp_path / f"driver-{sink_id}-{batch}.log"
    returncode = run_driver(DRIVER, ["batch", json.dumps(spec)], f"{point}:kill", log)
    assert returncode == -signal.SIGKILL, f"driver exited {returncode}, not killed at {point}:\n{tail(log)}"


@pytest.mark.parametrize(
    ("first", "then", "point"),
    [
        ("batch", "branch", "driver.after_decide"),
        ("batch", "branch", "driver.after_commits"),
        ("branch", "batch", "driver.after_first_commit"),
    ],
)
def test_a_replay_with_the_other_visibility_finishes_the_batch_as_it_was_decided(
    db: Target, tmp_path: Path, first: str, then: str, point: str
) -> None:
    """A batch decided with one visibility, its driver killed, run again with the other: the rerun finishes
    the decided batch (once, all of it) and writes nothing of its own."""
    table = db.new_table()
    db.keyed_table(table)
    fill(db, table, OLD)
    s = sink()
    killed_at(db, tmp_path, point, table, s, 4, split(1000, 300, 3), "append", visibility=first)
    result = batch_direct(db.url, table, s, 4, COLUMNS, split(1000, 300, 3), "append", visibility=then)
    assert result.skipped
    assert db.rows(table) == sorted(OLD + expected(range(1000, 1300)))
    assert_settled(db, s)
    nxt = batch_direct(db.url, table, s, 5, COLUMNS, split(2000, 20, 2), "append", visibility=first)
    assert nxt.rows == 20 and not nxt.skipped
    assert db.rows(table) == sorted(OLD + expected(range(1000, 1300), range(2000, 2020)))
    assert_settled(db, s)


def test_a_sink_switching_visibility_between_batches_writes_each_once(db: Target) -> None:
    table = db.new_table()
    db.keyed_table(table)
    s = sink()
    for batch, vis in enumerate(["branch", "batch", "branch", "batch", "batch"]):
        r = batch_direct(db.url, table, s, batch, COLUMNS, split(batch * 100, 30, 3), "append", visibility=vis)
        assert r.rows == 30 and not r.skipped
    again = batch_direct(db.url, table, s, 1, COLUMNS, split(100, 30, 3), "append", visibility="branch")
    assert again.skipped
    assert db.rows(table) == expected(*(range(b * 100, b * 100 + 30) for b in range(5)))
    assert_settled(db, s)


@pytest.mark.parametrize("where", ["across branches", "in one branch"])
def test_an_upsert_seen_whole_with_a_key_twice_shows_nothing(db: Target, where: str) -> None:
    """``upsertKeyColumns`` + ``visibility="batch"``, a key twice in the batch: refused (ApplyError), the table
    as it was, nothing prepared, the shadow empty, no decision left; the next batch goes through."""
    table = db.new_table()
    db.keyed_table(table)
    fill(db, table, OLD)
    s = sink()
    parts = split(50, 100, 2)
    if where == "across branches":
        parts[1].append((60, "dup"))
    else:
        parts[0].append((60, "dup"))
    with pytest.raises(ApplyError, match="more than once"):
        batch_direct(db.url, table, s, 0, COLUMNS, parts, "append", visibility="batch", upsertKeyColumns="id")
    assert db.rows(table) == OLD
    assert db.prepared(s) == [] and shadow_rows(db) == 0 and db.decision(s, 0) is None
    ok = batch_direct(
        db.url, table, s, 0, COLUMNS, split(50, 100, 2), "append", visibility="batch", upsertKeyColumns="id"
    )
    assert ok.rows == 100 and not ok.skipped
    assert db.rows(table) == sorted(expected(range(50), tag="o") + expected(range(50, 150)))


@pytest.mark.parametrize("point", ["driver.after_decide", "driver.after_commits"])
def test_an_overwrite_after_a_killed_batch_visible_append_of_another_sink_keeps_decision_order(
    db: Target, tmp_path: Path, point: str
) -> None:
    """Sink A's batch-visible append is decided, its driver killed; sink B then overwrites the table: B finishes
    A's batch first, or is refused (BatchBlockedError). After recover, the newest decision wins: B's rows only."""
    table = db.new_table()
    db.keyed_table(table)
    fill(db, table, OLD)
    a, b = sink(), sink()
    killed_at(db, tmp_path, point, table, a, 0, split(1000, 300, 3), "append", visibility="batch")
    try:
        result = overwrite_direct(db.url, table, b, 0, split(5000, 20, 2))
        assert result.rows == 20
    except BatchBlockedError:
        cli = run_cli("recover", "--url", db.url)
        assert cli.returncode == 0, cli.stdout + cli.stderr
        overwrite_direct(db.url, table, b, 0, split(5000, 20, 2))
    cli = run_cli("recover", "--url", db.url)
    assert cli.returncode == 0, cli.stdout + cli.stderr
    assert db.rows(table) == expected(range(5000, 5020))
    assert db.prepared(a) == [] and db.prepared(b) == [] and shadow_rows(db) == 0


@pytest.mark.parametrize("point", ["driver.after_decide", "driver.after_commits"])
def test_a_batch_visible_append_after_a_killed_overwrite_of_another_sink_keeps_decision_order(
    db: Target, tmp_path: Path, point: str
) -> None:
    """Sink A's overwrite is decided, its driver killed; sink B then appends with visibility="batch": after
    recover the table holds A's rows and B's (never B's rows wiped by A's older overwrite)."""
    table = db.new_table()
    db.keyed_table(table)
    fill(db, table, OLD)
    a, b = sink(), sink()
    killed_at(db, tmp_path, point, table, a, 0, split(1000, 30, 3), "overwrite")
    try:
        result = batch_direct(db.url, table, b, 0, COLUMNS, split(5000, 20, 2), "append", visibility="batch")
        assert result.rows == 20
    except BatchBlockedError:
        cli = run_cli("recover", "--url", db.url)
        assert cli.returncode == 0, cli.stdout + cli.stderr
        batch_direct(db.url, table, b, 0, COLUMNS, split(5000, 20, 2), "append", visibility="batch")
    cli = run_cli("recover", "--url", db.url)
    assert cli.returncode == 0, cli.stdout + cli.stderr
    assert db.rows(table) == expected(range(1000, 1030), range(5000, 5020))
    assert db.prepared(a) == [] and db.prepared(b) == [] and shadow_rows(db) == 0


def with_search_path(url: str, *schemas: str) -> str:
    sep = "&" if "?" in url else "?"
    return f"{url}{sep}options=-csearch_path%3D{'%2C'.join(schemas)}"


@contextmanager
def schema_before_public(db: Target) -> Iterator[tuple[str, str]]:
    """A new schema X (dropped at the end, with what it holds) and a URL whose search_path is ``X, public``."""
    other = f"adv2_{uuid.uuid4().hex[:8]}"
    db.execute(f"CREATE SCHEMA {other}")
    try:
        yield other, with_search_path(db.url, other, "public")
    finally:
        db.execute(f"DROP SCHEMA {other} CASCADE")


@pytest.mark.parametrize("db", [case(POSTGRESQL)], indirect=True)
@pytest.mark.parametrize("mode", ["append", "overwrite"])
def test_a_table_found_through_search_path_is_finished_there_by_a_recover_of_another_search_path(
    db: Target, tmp_path: Path, mode: str
) -> None:
    """``t`` in schema X, found through search_path ``X, public``; a ``public.t`` exists too.  The batch is
    decided, its driver killed; ``xasink recover`` with the default search_path (public) applies it to X.t,
    never to public.t."""
    table = db.new_table()
    db.keyed_table(table)
    fill(db, table, OLD)  # public.t: must never change
    with schema_before_public(db) as (other, url):
        db.execute(f"CREATE TABLE {other}.{db.q(table)} (id int PRIMARY KEY, name text)")
        db.execute(f"INSERT INTO {other}.{db.q(table)} VALUES (1, 'x1'), (2, 'x2')")
        s = sink()
        spec = {
            "url": url,
            "table": table,
            "sink_id": s,
            "batch_id": 0,
            "columns": COLUMNS,
            "partitions": split(1000, 30, 3),
            "mode": mode,
            "options": {"visibility": "batch", "journalSchema": "public"},
        }
        log = tmp_path / "driver.log"
        rc = run_driver(DRIVER, ["batch", json.dumps(spec)], "driver.after_decide:kill", log)
        assert rc == -signal.SIGKILL, tail(log)
        cli = run_cli("recover", "--url", db.url)
        assert cli.returncode == 0, cli.stdout + cli.stderr
        report = admin.recover(db.url, older_than_s=0)
        assert not report.errors, report.errors
        assert db.rows(table) == OLD
        found = db.execute(f"SELECT id, name FROM {other}.{db.q(table)} ORDER BY 1")
        base = [] if mode == "overwrite" else [(1, "x1"), (2, "x2")]
        assert [tuple(r) for r in found] == base + expected(range(1000, 1030))
        assert db.prepared(s) == []
        left = db.execute(f"SELECT count(*) FROM information_schema.tables WHERE table_schema = '{other}'")
        assert left[0][0] >= 1


@pytest.mark.parametrize(
    "point",
    [
        "driver.before_decide",
        "driver.after_decide",
        "driver.after_first_commit",
        "driver.after_commits",
        "driver.apply_statements",
        "driver.after_mark",
    ],
)
@pytest.mark.parametrize("how", ["recover", "rerun"])
def test_a_batch_visible_append_killed_at_each_driver_point_is_written_once(
    db: Target, tmp_path: Path, point: str, how: str
) -> None:
    """kill -9 at each driver point of a batch-visible append, then ``xasink recover`` (and a rerun) or the
    rerun alone: the table holds the batch once or (killed before the decision, recovered) not at all until the
    rerun writes it; nothing prepared, the shadow empty."""
    table = db.new_table()
    db.keyed_table(table)
    fill(db, table, OLD)
    s = sink()
    killed_at(db, tmp_path, point, table, s, 2, split(1000, 300, 3), "append", visibility="batch")
    decided = db.decision(s, 2) is not None
    assert db.rows(table) in (OLD, sorted(OLD + expected(range(1000, 1300))))
    if how == "recover":
        cli = run_cli("recover", "--url", db.url)
        assert cli.returncode == 0, cli.stdout + cli.stderr
        assert db.rows(table) == (sorted(OLD + expected(range(1000, 1300))) if decided else OLD)
        assert_settled(db, s)
    result = batch_direct(db.url, table, s, 2, COLUMNS, split(1000, 300, 3), "append", visibility="batch")
    assert result.skipped == decided
    assert db.rows(table) == sorted(OLD + expected(range(1000, 1300)))
    assert_settled(db, s)


def test_batch_visible_appenders_of_one_table_side_by_side_are_never_refused(db: Target) -> None:
    """Three sinks append to one table with visibility="batch", each 10 batches, side by side, none killed: a
    decision that finds another sink's batch decided and not applied yet finishes it and decides; under this
    load a second sink's batch was often decided meanwhile, and the batch was refused with BatchBlockedError
    ("it could not be finished first", "run 'xasink recover'"), though nothing blocked it."""
    table = db.new_table()
    db.keyed_table(table)
    sinks = [sink() for _ in range(3)]
    procs = []
    for n, s in enumerate(sinks):
        batches = [[b, split(n * 100_000 + b * 100, 40, 4)] for b in range(10)]
        spec: dict[str, Any] = {"url": db.url, "table": table, "sink_id": s, "columns": COLUMNS, "mode": "append"}
        spec.update(batches=batches, options={"visibility": "batch"})
        args = [sys.executable, str(DRIVER), "batches", json.dumps(spec)]
        procs.append(subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    lines = []
    for proc in procs:
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-3000:]
        lines += [json.loads(line) for line in out.splitlines()]
    assert [x for x in lines if "error" in x] == []
    assert len(lines) == 30
    ids = [n * 100_000 + b * 100 + i for n in range(3) for b in range(10) for i in range(40)]
    assert db.rows(table) == sorted(expected(ids))
    assert all(db.prepared(s) == [] for s in sinks) and shadow_rows(db) == 0


@pytest.mark.parametrize("point", ["driver.after_decide", "driver.after_commits"])
def test_a_cron_recover_beside_a_live_batch_visible_append_finishes_it_once(db: Target, point: str) -> None:
    """``xasink recover`` (cron, default threshold) runs while a live driver sits between its decision and its
    apply: the batch is applied once, the driver is told written (its rows are), nothing is left."""
    table = db.new_table()
    db.keyed_table(table)
    fill(db, table, OLD)
    s = sink()
    spec: dict[str, Any] = {"url": db.url, "table": table, "sink_id": s, "columns": COLUMNS, "mode": "append"}
    spec.update(batches=[[0, split(1000, 300, 3)], [1, split(2000, 30, 3)]], options={"visibility": "batch"})
    env = {k: v for k, v in os.environ.items() if not k.startswith("XASINK_FAULT")}
    env["XASINK_FAULT"] = f"{point}:sleep=4"
    proc = subprocess.Popen(
        [sys.executable, str(DRIVER), "batches", json.dumps(spec)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        while db.decision(s, 0) is None:
            assert proc.poll() is None, proc.communicate()
        cli = run_cli("recover", "--url", db.url)
        assert cli.returncode == 0, cli.stdout + cli.stderr
        # batch 0 whole, finished by the cron; a driver whose pause ran out under load may be past batch 1 already
        rows, later = db.rows(table), expected(range(2000, 2030))
        assert [r for r in rows if r not in later] == sorted(OLD + expected(range(1000, 1300)))
        assert [r for r in rows if r in later] in ([], later)
    finally:
        out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    lines = [json.loads(line) for line in out.splitlines()]
    assert [x.get("error") for x in lines] == [None, None], lines
    assert db.rows(table) == sorted(OLD + expected(range(1000, 1300), range(2000, 2030)))
    assert_settled(db, s)


@pytest.mark.parametrize("name", ['we"ird T', "we`ird;x", "Mixed Case"])
@pytest.mark.parametrize("upsert", [False, True], ids=["append", "upsert"])
def test_a_table_with_an_odd_name_takes_batch_visible_writes(db: Target, name: str, upsert: bool) -> None:
    table = f"{db.new_table()}_{name}"
    db.tables.append(table)
    db.keyed_table(table)
    fill(db, table, OLD)
    s = sink()
    quoted = '"' + table.replace('"', '""') + '"' if db.kind == POSTGRESQL else "`" + table.replace("`", "``") + "`"
    opts: dict[str, Any] = {"visibility": "batch", **({"upsertKeyColumns": "id"} if upsert else {})}
    r = batch_direct(db.url, quoted, s, 0, COLUMNS, split(50, 100, 2), "append", **opts) if upsert else None
    if not upsert:
        r = batch_direct(db.url, quoted, s, 0, COLUMNS, split(1000, 100, 2), "append", **opts)
    assert r is not None and r.rows == 100
    want = expected(range(50), tag="o") + expected(range(50, 150)) if upsert else OLD + expected(range(1000, 1100))
    assert db.rows(table) == sorted(want)
    assert_settled(db, s)


def test_batch_visible_appends_with_journal_retention_one(db: Target, tmp_path: Path) -> None:
    """journalRetention=1 compacts the log after each batch: replays of the last batch write nothing, a killed
    batch is finished once by the rerun."""
    table = db.new_table()
    db.keyed_table(table)
    s = sink()
    opts = {"visibility": "batch", "journalRetention": 1}
    for b in range(4):
        batch_direct(db.url, table, s, b, COLUMNS, split(b * 100, 20, 2), "append", **opts)
    assert batch_direct(db.url, table, s, 3, COLUMNS, split(300, 20, 2), "append", **opts).skipped
    killed_at(db, tmp_path, "driver.after_commits", table, s, 4, split(400, 20, 2), "append", **opts)
    assert batch_direct(db.url, table, s, 4, COLUMNS, split(400, 20, 2), "append", **opts).skipped
    assert batch_direct(db.url, table, s, 5, COLUMNS, split(500, 20, 2), "append", **opts).rows == 20
    assert db.rows(table) == expected(*(range(b * 100, b * 100 + 20) for b in range(6)))
    assert_settled(db, s)


def test_batch_visible_appends_with_batch_ids_out_of_order_are_each_written_once(db: Target) -> None:
    table = db.new_table()
    db.keyed_table(table)
    s = sink()
    for b in (5, 3, 7, 4):
        assert (
            batch_direct(db.url, table, s, b, COLUMNS, split(b * 100, 20, 2), "append", visibility="batch").rows == 20
        )
    for b in (3, 5):
        assert batch_direct(db.url, table, s, b, COLUMNS, split(b * 100, 20, 2), "append", visibility="batch").skipped
    assert db.rows(table) == expected(*(range(b * 100, b * 100 + 20) for b in (3, 4, 5, 7)))
    assert_settled(db, s)


def test_a_batch_visible_append_held_back_by_a_blocked_overwrite_is_told_the_truth(db: Target) -> None:
    """Sink A's overwrite is decided, its apply blocked by a session's uncommitted row (CommitIncompleteError).
    Sink B's batch-visible append cannot finish A first: BatchBlockedError naming A and ``xasink recover``,
    nothing of B visible or prepared.  Once the session ends, recover then B's rerun: A's rows and B's."""
    table = db.new_table()
    db.keyed_table(table)
    fill(db, table, OLD)
    a, b = sink(), sink()
    opts: dict[str, Any] = {"controlLockTimeout": 1, "commitTimeout": 2, "lockTimeout": 1}
    with db.connect() as holder, holder.cursor() as cur:
        cur.execute("BEGIN")
        cur.execute(f"INSERT INTO {db.q(table)} (id, name) VALUES (5000, 'other')")
        with pytest.raises(CommitIncompleteError):
            overwrite_direct(db.url, table, a, 0, split(1000, 30, 3), **opts)
        with pytest.raises(BatchBlockedError) as blocked:
            batch_direct(db.url, table, b, 0, COLUMNS, split(2000, 20, 2), "append", visibility="batch", **opts)
        assert f"sink {a} batch 0" in str(blocked.value) and "xasink recover" in str(blocked.value)
        assert db.prepared(b) == [] and db.decision(b, 0) is None
        cur.execute("ROLLBACK")
    assert db.rows(table) == OLD
    cli = run_cli("recover", "--url", db.url, "--sink-id", a)
    assert cli.returncode == 0, cli.stdout + cli.stderr
    assert db.rows(table) == expected(range(1000, 1030))
    batch_direct(db.url, table, b, 0, COLUMNS, split(2000, 20, 2), "append", visibility="batch", **opts)
    assert db.rows(table) == expected(range(1000, 1030), range(2000, 2020))
    assert db.prepared(a) == [] and db.prepared(b) == [] and shadow_rows(db) == 0


@pytest.mark.parametrize("clash", ["with a stored row", "within the batch"])
def test_a_batch_visible_append_breaking_the_primary_key_shows_nothing(db: Target, clash: str) -> None:
    """A batch-visible append whose rows break the table's primary key is refused after its decision
    (ApplyError, the decision withdrawn): the table as it was, nothing prepared, the shadow empty; the batch id
    can be written again with good rows."""
    table = db.new_table()
    db.keyed_table(table)
    fill(db, table, OLD)
    s = sink()
    parts = split(1000, 100, 2)
    parts[1].append((5, "dup") if clash == "with a stored row" else (1010, "dup"))
    with pytest.raises(ApplyError):
        batch_direct(db.url, table, s, 0, COLUMNS, parts, "append", visibility="batch")
    assert db.rows(table) == OLD
    assert db.prepared(s) == [] and shadow_rows(db) == 0 and db.decision(s, 0) is None
    assert batch_direct(db.url, table, s, 0, COLUMNS, split(1000, 100, 2), "append", visibility="batch").rows == 100
    assert db.rows(table) == sorted(OLD + expected(range(1000, 1100)))


@pytest.mark.parametrize("upsert", [False, True], ids=["append", "upsert"])
def test_an_empty_batch_visible_batch_and_a_new_table(db: Target, upsert: bool) -> None:
    """A table xasink creates on the first batch-visible write, an empty batch after it: each decided once."""
    table = db.new_table()
    s = sink()
    opts: dict[str, Any] = {"visibility": "batch", **({"upsertKeyColumns": "id"} if upsert else {})}
    assert batch_direct(db.url, table, s, 0, COLUMNS, split(0, 30, 3), "append", **opts).rows == 30
    empty = batch_direct(db.url, table, s, 1, COLUMNS, [[], []], "append", **opts)
    assert empty.rows == 0 and not empty.skipped
    assert batch_direct(db.url, table, s, 1, COLUMNS, [[], []], "append", **opts).skipped
    assert batch_direct(db.url, table, s, 2, COLUMNS, split(30, 10, 2), "append", **opts).rows == 10
    assert db.rows(table) == expected(range(40))
    assert_settled(db, s)


def test_a_branch_visible_append_beside_a_pending_overwrite_is_removed_by_it_as_documented(
    db: Target, tmp_path: Path
) -> None:
    """docs/write-modes.md, Limits: an append with the default visibility is not held back by a pending
    overwrite of its table; the overwrite applied later removes its rows."""
    table = db.new_table()
    db.keyed_table(table)
    fill(db, table, OLD)
    a, b = sink(), sink()
    killed_at(db, tmp_path, "driver.after_decide", table, a, 0, split(1000, 30, 3), "overwrite")
    assert batch_direct(db.url, table, b, 0, COLUMNS, split(2000, 20, 2), "append").rows == 20
    assert db.rows(table) == sorted(OLD + expected(range(2000, 2020)))
    cli = run_cli("recover", "--url", db.url)
    assert cli.returncode == 0, cli.stdout + cli.stderr
    assert db.rows(table) == expected(range(1000, 1030))
    assert db.prepared(a) == [] and db.prepared(b) == [] and shadow_rows(db) == 0


@pytest.mark.parametrize("visibility", ["branch", "batch"])
def test_an_upsert_creating_its_table_keeps_the_key_zero(db: Target, visibility: str) -> None:
    """The table an upsert creates has its key as primary key: on MariaDB SQLAlchemy made an integer one
    AUTO_INCREMENT, so the row of key 0 took the next number and was merged into the row of key 1 (29 rows of 30,
    silently)."""
    table = db.new_table()
    s = sink()
    opts = {"visibility": visibility, "upsertKeyColumns": "id"}
    assert batch_direct(db.url, table, s, 0, COLUMNS, split(0, 30, 3), "append", **opts).rows == 30
    assert db.rows(table) == expected(range(30))
    batch_direct(db.url, table, s, 1, COLUMNS, split(0, 2, 1), "append", **opts)
    assert db.rows(table) == expected(range(30))


@pytest.mark.parametrize("db", [case(POSTGRESQL)], indirect=True)
@pytest.mark.xfail(
    strict=True,
    reason="open: the identity of an unqualified table changed from the session's default schema to the one it "
    "is found in; a replay of a batch the previous release recorded is refused (BatchIdentityError)",
)
def test_a_replay_of_a_batch_recorded_before_the_search_path_change_is_a_replay(db: Target) -> None:
    """search_path ``X, public`` with X empty, ``t`` in public: the previous release recorded the batch's target
    in X (the session's default schema), this one in public.  A stream killed after its decision and restarted on
    the new release replays the batch: it must be skipped, not refused as another table's."""
    table = db.new_table()
    db.keyed_table(table)
    with schema_before_public(db) as (other, url):
        s = sink()
        opts = {"journalSchema": "public", "upsertKeyColumns": "id"}  # a plain append through COPY failed there
        assert batch_direct(url, table, s, 0, COLUMNS, split(0, 20, 2), "append", **opts).rows == 20
        was = db.execute("SELECT target FROM xasink_batches WHERE sink_id = %s AND batch_id = 0", s)[0][0]
        old = json.dumps({**json.loads(was), "schema": other}, sort_keys=True)  # as the previous release had it
        db.execute("UPDATE xasink_batches SET target = %s WHERE sink_id = %s AND batch_id = 0", old, s)
        assert batch_direct(url, table, s, 0, COLUMNS, split(0, 20, 2), "append", **opts).skipped
        assert db.rows(table) == expected(range(20))


@pytest.mark.parametrize("db", [case(POSTGRESQL)], indirect=True)
@pytest.mark.parametrize("visibility", ["branch", "batch"])
@pytest.mark.parametrize("upsert", [False, True], ids=["append", "upsert"])
def test_a_table_found_past_an_empty_schema_of_search_path_is_written_there(
    db: Target, visibility: str, upsert: bool
) -> None:
    """search_path ``X, public``, X existing without the table, ``t`` in public (docs/write-modes.md: the table is
    the one the session finds).  A default append failed every batch: ADBC's COPY named the table in X (the
    session's default schema), "relation X.t does not exist"."""
    table = db.new_table()
    db.keyed_table(table)
    with schema_before_public(db) as (_, url):
        s = sink()
        opts: dict[str, Any] = {"visibility": visibility, "journalSchema": "public"}
        if upsert:
            opts["upsertKeyColumns"] = "id"
        for b in range(2):
            assert batch_direct(url, table, s, b, COLUMNS, split(b * 100, 20, 2), "append", **opts).rows == 20
        assert batch_direct(url, table, s, 1, COLUMNS, split(100, 20, 2), "append", **opts).skipped
        assert batch_direct(db.url, f"public.{table}", s, 1, COLUMNS, split(100, 20, 2), "append", **opts).skipped
        assert db.rows(table) == expected(range(20), range(100, 120))
        assert_settled(db, s)


@pytest.mark.parametrize("db", [case(POSTGRESQL)], indirect=True)
def test_a_table_made_earlier_in_search_path_during_the_job_does_not_split_the_batchs_identity(
    db: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    """adversary3: sink A overwrites ``t`` (found in ``public``) through search_path ``X, public``; during its
    job someone creates ``X.t``.  A's decision recorded ``X.t`` (the table looked up again) while its apply,
    planned on ``public.t``, was blocked by an open insert (CommitIncompleteError); sink B's overwrite of
    ``public.t`` did not see A's pending batch, and ``xasink recover`` applied A's older rows over B's.  The
    decision now records the planned table: B finishes A's batch first, and B's rows are the table's."""
    table = db.new_table()
    db.keyed_table(table)
    fill(db, table, expected(range(10), tag="o"))
    with schema_before_public(db) as (other, a_url):
        a, b = sink(), sink()
        opts: dict[str, Any] = {"controlLockTimeout": 1, "commitTimeout": 2, "journalSchema": "public"}
        monkeypatch.setenv("XASINK_FAULT", "driver.before_decide:sleep=3:b=5")
        with db.connect() as holder, holder.cursor() as cur, ThreadPoolExecutor(1) as pool:
            cur.execute("BEGIN")
            cur.execute(f"INSERT INTO {db.q(table)} (id, name) VALUES (5000, 'other')")
            job = pool.submit(overwrite_direct, a_url, table, a, 5, split(100, 10, 2), **opts)
            deadline = time.monotonic() + 180  # (a hang, not a timing: a loaded CI is slow)
            while len(db.prepared(a)) < 2:
                assert time.monotonic() < deadline, "A never prepared its branches"
                time.sleep(0.05)
            db.execute(f"CREATE TABLE {other}.{db.q(table)} (id int PRIMARY KEY, name text)")  # during A's job
            with pytest.raises(CommitIncompleteError):
                job.result(timeout=60)
            cur.execute("ROLLBACK")
        monkeypatch.delenv("XASINK_FAULT")
        recorded = json.loads(db.execute("SELECT target FROM xasink_batches WHERE sink_id = %s", a)[0][0])
        assert recorded["schema"] == "public", recorded
        assert db.rows(table) == expected(range(10), tag="o")  # A is decided, not applied
        result = overwrite_direct(db.url, f"public.{table}", b, 6, split(200, 10, 2), **opts)
        assert result.rows == 10 and not result.skipped
        report = admin.recover(a_url, older_than_s=0, journal_schema="public")  # A's cron
        assert not report.errors, report.errors
        assert db.rows(table) == expected(range(200, 210)), "A's older batch was applied over B's"
        assert db.prepared(a) == [] and db.prepared(b) == [] and shadow_rows(db) == 0
