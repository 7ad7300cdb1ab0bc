"""Soak of the edges (issue 15): SIGKILLed drivers mixed with the situations operators create.

Each round runs two write chains at once, both against the same sinkId, in one of two shapes:

* ``two-logs``: a staging and a production log (two journal prefixes) on one server, the same batch id,
  each into its own table;
* ``backfill``: one log, two batch ids (random, in any order) written in parallel, each into its own table.

A chain reruns its write until one run ends cleanly; each run but the last is SIGKILLed, either at a named
protocol point (``XASINK_FAULT=<point>:kill``) or at a random moment.  Meanwhile an operator's cron runs
``xasink recover --older-than 1s`` for both logs in a loop: it must never break a live run (a run that is
not killed must succeed) and never undo a decided batch.  Drivers are Spark-free (``crash_driver.py
--direct``): the process is the driver and holds its run guard itself, so a kill looks to the databases
exactly like a dead Spark driver's, at a second per run instead of ten.

After every round each table holds its ids exactly once; at the end, after a last recover of each log,
nothing of the soak's sinks is prepared.  Totals go to ``benchmarks/results/soak-edges.json`` (added to
earlier runs) and are printed.  ``XASINK_SOAK_KILLS`` (default 200) is the number of kills per database.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import uuid
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pytest

from tests.harness import CRASH_DRIVER, PARTITIONS, N
from tests.procs import ROOT, run_until_exit
from tests.targets import Target
from xasink.dialects import dialect_for
from xasink.journal.layout import journal_metadata
from xasink.journal.log import Journal
from xasink.options import parse_url

# 200 kills take ~7 min per database on a quiet machine, several times that beside other work
pytestmark = [pytest.mark.soak, pytest.mark.crash, pytest.mark.timeout(3600)]

RESULTS = ROOT / "benchmarks" / "results" / "soak-edges.json"
POINTS = [
    "task.before_load",
    "task.after_prepare",
    "driver.before_decide",
    "driver.after_decide",
    "driver.after_first_commit",
    "driver.after_commits",
    "driver.after_mark",
]
MAX_RUNS = 5  # per chain; the last run is never killed
RECOVER_ERRORS: list[str] = []


@dataclass
class Totals:
    rounds: int = 0
    runs: int = 0
    kills: int = 0
    kills_at_points: int = 0
    kills_at_random: int = 0
    rows: int = 0
    lost: int = 0
    duplicated: int = 0
    left_prepared: int = 0
    recover_runs: int = 0
    recover_failures: int = 0
    live_run_failures: int = 0
    shapes: dict[str, int] = field(default_factory=dict)


@dataclass
class Chain:
    table: str
    sink: str
    batch: int
    prefix: str


def _run(db: Target, chain: Chain, kill: str | None, rng: random.Random, log: Path) -> tuple[int, bool]:
    """One driver run; ``kill`` is a fault point, "random" or None.  Returns (exit status, killed)."""
    point = kill if kill not in (None, "random") else "none"
    env = {**os.environ, "XASINK_FAULT": f"{point}:kill"}
    env["XASINK_TEST_WRITE_OPTIONS"] = json.dumps({"journalTablePrefix": chain.prefix})
    args = [db.url, chain.table, chain.sink, str(chain.batch), str(N), str(PARTITIONS), "--direct"]
    kill_after = rng.uniform(0.3, 2.5) if kill == "random" else None
    code = run_until_exit([sys.executable, str(CRASH_DRIVER), *args], env, log, kill_after=kill_after, append=True)
    return code, code == -signal.SIGKILL


def _chain(db: Target, chain: Chain, rng: random.Random, totals: Totals, lock: threading.Lock, log: Path) -> None:
    for attempt in range(MAX_RUNS):
        last = attempt == MAX_RUNS - 1
        kill = None if last or rng.random() < 0.25 else rng.choice([*POINTS, "random", "random"])
        code, killed = _run(db, chain, kill, rng, log)
        with lock:
            totals.runs += 1
            if killed:
                totals.kills += 1
                totals.kills_at_random += kill == "random"
                totals.kills_at_points += kill != "random"
            elif code != 0:
                totals.live_run_failures += 1
        if not killed:
            assert code == 0, f"a run that was not killed failed ({code}); see {log}"
            return


def _recover(db: Target, prefix: str) -> subprocess.CompletedProcess[str]:
    """``xasink recover --older-than 1s`` of one log, the CLI in a process of its own (as cron runs it)."""
    cli = [sys.executable, "-m", "xasink.ops.cli", "recover", "--url", db.url, "--journal-prefix", prefix]
    return subprocess.run([*cli, "--older-than", "1s", "--json"], capture_output=True, text=True, cwd=ROOT, timeout=120)


def _cron(db: Target, prefixes: list[str], stop: threading.Event, totals: Totals, lock: threading.Lock) -> None:
    """An operator's cron beside the live jobs: recover every log, over and over."""
    while not stop.is_set():
        for prefix in prefixes:
            cli = _recover(db, prefix)
            with lock:
                totals.recover_runs += 1
                if cli.returncode not in (0, 1):
                    totals.recover_failures += 1
                    RECOVER_ERRORS.append(cli.stdout[-2000:] + cli.stderr[-2000:])
                    print(f"recover failed ({cli.returncode}): {RECOVER_ERRORS[-1]}", flush=True)
        stop.wait(0.5)


def _record(kind: str, totals: Totals) -> None:
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    data = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    before = data.get(kind, {})
    now = asdict(totals)
    merged = {k: before.get(k, 0) + v for k, v in now.items() if k != "shapes"}
    merged["shapes"] = dict(Counter(before.get("shapes", {})) + Counter(now["shapes"]))
    merged["soaks"] = before.get("soaks", 0) + 1
    data[kind] = merged
    RESULTS.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def test_soak_kills_with_two_logs_cron_recover_and_backfills(db: Target, tmp_path: Path) -> None:
    kills_wanted = int(os.environ.get("XASINK_SOAK_KILLS", "200"))
    seed = int(os.environ.get("XASINK_SOAK_SEED", str(random.randrange(1 << 30))))
    rng = random.Random(seed)
    print(f"soak-edges seed {seed} on {db.kind}")
    tag = uuid.uuid4().hex[:6]
    prefixes = [f"xa_st_{tag}_", f"xa_pr_{tag}_"]  # staging and production logs on one server
    sinks = [f"edge-{tag}-{i}" for i in range(3)]  # names reused round after round
    used: set[tuple[str, str, int]] = set()
    totals, lock, stop = Totals(), threading.Lock(), threading.Event()
    dialect = dialect_for(parse_url(db.url))
    try:  # both logs exist before cron first runs (recover refuses a prefix that names no log: a typo)
        for prefix in prefixes:
            Journal(dialect, None, prefix).ensure()
    finally:
        dialect.dispose()
    cron = threading.Thread(target=_cron, args=(db, prefixes, stop, totals, lock), daemon=True)
    cron.start()
    try:
        while totals.kills < kills_wanted:
            shape = rng.choice(["two-logs", "backfill"])
            sink = rng.choice(sinks)

            def batch_id(prefix: str, sink: str = sink) -> int:
                while (key := (prefix, sink, rng.randrange(1, 10**9))) in used:
                    pass
                used.add(key)
                return key[2]

            if shape == "two-logs":
                b = batch_id(prefixes[0])
                used.add((prefixes[1], sink, b))
                chains = [Chain(db.new_table(), sink, b, p) for p in prefixes]
            else:
                p = rng.choice(prefixes)
                chains = [Chain(db.new_table(), sink, batch_id(p), p) for _ in range(2)]
            seeds = [rng.randrange(1 << 30) for _ in chains]
            threads = [
                threading.Thread(
                    target=_chain, args=(db, c, random.Random(s), totals, lock, tmp_path / f"r{totals.rounds}.log")
                )
                for c, s in zip(chains, seeds, strict=True)
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            totals.rounds += 1
            totals.shapes[shape] = totals.shapes.get(shape, 0) + 1
            for c in chains:
                ids = [r[0] for r in db.rows(c.table)]
                totals.rows += len(ids)
                totals.lost += len(set(range(N)) - set(ids))
                totals.duplicated += len(ids) - len(set(ids))
                assert sorted(ids) == list(range(N)), (
                    f"round {totals.rounds} {shape} {c}: {sorted(Counter(ids).items())}"
                )
            for c in chains:
                db.execute(f"DROP TABLE {db.q(c.table)}")
                db.tables.remove(c.table)
            print(f"round {totals.rounds} {shape}: kills {totals.kills} runs {totals.runs}")
    finally:
        stop.set()
        cron.join()
        for prefix in prefixes:
            _recover(db, prefix)
        left = [g for s in sinks for g in db.prepared(s)]
        totals.left_prepared = len(left)
        print(f"soak-edges {db.kind}: {json.dumps(asdict(totals))}")
        _record(db.kind, totals)
        for prefix in prefixes:
            for table in journal_metadata(prefix=prefix):
                db.execute(f"DROP TABLE IF EXISTS {db.q(table.name)}")
    assert left == [], left
    assert totals.live_run_failures == 0, asdict(totals)
    assert totals.recover_failures == 0, RECOVER_ERRORS[:3]
