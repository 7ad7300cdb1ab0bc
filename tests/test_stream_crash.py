"""Crash tests for Structured Streaming: SIGKILL the streaming job at every point of the protocol.

``tests/stream_driver.py`` runs as a subprocess in its own process group: a file source (one JSON file of
:data:`ROWS_PER_FILE` disjoint ids per micro-batch) written into the database, checkpoint on disk,
``trigger(availableNow=True)``.  A chain of runs kills it once per named fault point (each at its own
batch, so every kill meets a fresh batch) and at random moments, then restarts it with the same
checkpoint until all input is consumed, alternating the partition count so that every replay
partitions the data differently from the killed run.  After each named kill the database state shows
the kill landed where it was meant to; at the end every id must be in the table exactly once, nothing of
the sink left prepared, and the decision log must agree with the table.

The same chain run with the usual hand-made ``foreachBatch`` (psycopg2, one commit per partition)
duplicates rows: the test proves the difference, not just our side (with --soak: a control experiment).

The xasink writers' chains run on PostgreSQL and on MariaDB (``db``).  CI runs every named point once
on PostgreSQL; MariaDB's chain kills the task points and one driver point (test_crash.py kills every
driver point on MariaDB), the rest with the soak, as the MariaDB foreachBatch chain.  Random kills (they
test Spark's side, the same for both databases; each run is a fresh JVM) run with the soak only: two
more in the PostgreSQL chain above, and the soak chains below.  The baseline and the soak are
PostgreSQL-only.  ``--soak`` / ``XASINK_SOAK=1`` runs ``XASINK_SOAK_RUNS`` (default 5) whole chains per
writer with random kills and writes the totals to ``benchmarks/results/soak.json``.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.procs import TAG_ENV, reap
from tests.scenarios.model import DRIVER_POINTS
from tests.targets import MARIADB, Target

pytestmark = [pytest.mark.crash, pytest.mark.spark, pytest.mark.usefixtures("driver_cds")]

ROOT = Path(__file__).resolve().parent.parent
DRIVER = ROOT / "tests" / "stream_driver.py"
ROWS_PER_FILE = 100
RUN_TIMEOUT = 900.0  # seconds one driver run may take on a loaded machine before it counts as hung

TASK_POINTS = ("task.before_prepare", "task.after_prepare")
NAMED_POINTS = TASK_POINTS + DRIVER_POINTS
# MariaDB's chain in CI: the database side of every driver point is killed on MariaDB by test_crash.py (each
# followed by a rerun through a real Spark write) and the Spark side of every point by the PostgreSQL chain
# here, so MariaDB's chain kills its tasks (the branch they leave: open, or prepared and undecided) and one
# driver point, a decided batch partly committed (finished forward, the replay writes nothing).  Every named
# point runs on MariaDB with --soak.
MARIADB_CI_POINTS = (*TASK_POINTS, "driver.after_first_commit")
# PostgreSQL's chain in CI: the driver points.  Its task points' Spark side is MariaDB's chain's (the same
# Spark side); their database side: an open branch ends with its connection, a prepared undecided branch of a
# dead run is test_crash.py's blocked-writer case.  Every named point runs on PostgreSQL with --soak.
PG_CI_POINTS = DRIVER_POINTS


@dataclass
class RunResult:
    returncode: int
    log: Path
    fault: str | None
    killed_by_test: bool = False

    @property
    def killed(self) -> bool:
        return self.returncode == -signal.SIGKILL

    @property
    def phases(self) -> list[dict[str, Any]]:
        """The run's phase records (xasink.support.phases), one per timed step of every process it started."""
        path = self.log.with_suffix(".phases.jsonl")
        return [json.loads(ln) for ln in path.read_text().splitlines()] if path.exists() else []

    def tail(self) -> str:
        """The end of the run's log without Java stack frames, for a failure message."""
        text = self.log.read_text(errors="replace").splitlines()
        return "\n".join(ln for ln in text if not ln.lstrip().startswith("at "))[-8000:] or "(empty log)"


@dataclass
class Totals:
    """What a chain of runs left in the table, counted against the input."""

    runs: int = 0
    kills: int = 0
    rows: int = 0  # ids written to the input
    lost: int = 0
    duplicated: int = 0  # rows beyond the first copy of an id
    extra: int = 0  # rows whose id was never in the input
    left_prepared: int = 0

    def add(self, other: Totals) -> None:
        for name in asdict(self):
            setattr(self, name, getattr(self, name) + getattr(other, name))


@dataclass
class StreamJob:
    """One streaming query (table, sink id, input files, checkpoint) and the runs of its driver."""

    root: Path
    db: Target
    mode: str  # source | foreach | plain (PostgreSQL only)
    files: int
    sink_id: str = field(default_factory=lambda: f"st-{uuid.uuid4().hex[:8]}")
    table: str = field(default_factory=lambda: f"st_{uuid.uuid4().hex[:8]}")
    results: list[RunResult] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.input = self.root / "input"
        self.checkpoint = self.root / "checkpoint"
        self.logs = self.root / "logs"
        for d in (self.input, self.logs):
            d.mkdir(parents=True, exist_ok=True)
        self.db.create_table(self.table, "id bigint")
        base = time.time() - 10 * self.files
        for i in range(self.files):  # file i is micro-batch i: disjoint ids, ordered modification times
            path = self.input / f"part-{i:04d}.json"
            path.write_text("".join(f'{{"id": {n}}}\n' for n in range(i * ROWS_PER_FILE, (i + 1) * ROWS_PER_FILE)))
            os.utime(path, (base + i, base + i))

    @property
    def url(self) -> str:
        return self.db.url

    # -- running the driver ----------------------------------------------------------------
    def run(self, fault: str | None = None, kill_after: float | None = None, partitions: int = 3) -> RunResult:
        """Run the driver until it exits; ``kill_after``: SIGKILL its group that long after a new batch starts."""
        tag = uuid.uuid4().hex
        env = {k: v for k, v in os.environ.items() if not k.startswith("XASINK_FAULT")}
        env.update({TAG_ENV: tag, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable})
        if fault:
            env["XASINK_FAULT"] = fault
        log = self.logs / f"run{len(self.results):02d}.log"
        env["XASINK_PHASE_LOG"] = str(log.with_suffix(".phases.jsonl"))
        cmd = [
            sys.executable,
            str(DRIVER),
            f"--mode={self.mode}",
            f"--input={self.input}",
            f"--checkpoint={self.checkpoint}",
            f"--url={self.url}",
            f"--table={self.table}",
            f"--sink-id={self.sink_id}",
            f"--partitions={partitions}",
        ]
        deadline = time.monotonic() + RUN_TIMEOUT
        killed_by_test = False
        with open(log, "wb") as err:
            proc = subprocess.Popen(
                cmd, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=err, stderr=err, start_new_session=True
            )
            try:
                if kill_after is not None:
                    seen = self.batches_started()
                    while proc.poll() is None and self.batches_started() <= seen and time.monotonic() < deadline:
                        time.sleep(0.05)
                    end = time.monotonic() + kill_after
                    while proc.poll() is None and time.monotonic() < end:
                        time.sleep(0.02)
                    if proc.poll() is None:
                        os.killpg(proc.pid, signal.SIGKILL)
                        killed_by_test = True
                proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                pytest.fail(f"stream driver hung for {RUN_TIMEOUT}s; log {log}")
            finally:
                stragglers = reap(tag, grace_s=120.0)  # the next run and the checks must not race its workers
            assert not stragglers, f"processes of a killed stream driver outlived it: {stragglers}"
        result = RunResult(proc.returncode, log, fault, killed_by_test)
        self.results.append(result)
        return result

    def batches_started(self) -> int:
        """How many batches Spark has planned (offsets/N is written before batch N runs)."""
        offsets = self.checkpoint / "offsets"
        return sum(1 for p in offsets.iterdir() if p.name.isdigit()) if offsets.is_dir() else 0

    def spark_committed(self, batch: int) -> bool:
        return (self.checkpoint / "commits" / str(batch)).exists()

    def committed_batches(self) -> list[int]:
        """The batches in Spark's commit log."""
        commits = self.checkpoint / "commits"
        return sorted(int(p.name) for p in commits.iterdir() if p.name.isdigit()) if commits.is_dir() else []

    def next_batch(self) -> int:
        """The batch the next run starts with (a planned but uncommitted batch is re-run under its id)."""
        return max(self.committed_batches(), default=-1) + 1

    def finished(self) -> bool:
        """A run exited by itself: with availableNow that means every input file was consumed.

        (Batch N is file N only while no kill lands between Spark's source log and offset log: then the
        next run's batch takes two files.  So completion is not read off the batch ids.)
        """
        return any(r.returncode == 0 for r in self.results)

    # -- what the database holds ------------------------------------------------------------------
    def prepared(self, batch: int | None = None) -> list[str]:
        return self.db.prepared(self.sink_id, batch)

    def decisions(self) -> dict[int, dict[str, Any]]:
        return {b: asdict(d) for b, d in self.db.decisions(self.sink_id).items()}

    def ids(self) -> list[int]:
        return [int(r[0]) for r in self.db.execute(f"SELECT id FROM {self.db.q(self.table)}")]

    def totals(self) -> Totals:
        expected = set(range(self.files * ROWS_PER_FILE))
        counts = Counter(self.ids())
        return Totals(
            runs=len(self.results),
            kills=sum(1 for r in self.results if r.killed),
            rows=len(expected),
            lost=len(expected - counts.keys()),
            duplicated=sum(c - 1 for c in counts.values()),
            extra=sum(c for i, c in counts.items() if i not in expected),
            left_prepared=len(self.prepared()),
        )

    def drop(self) -> None:
        self.db.drop_table(self.table)


def check_kill_state(job: StreamJob, point: str, batch: int) -> None:
    """The state a kill at ``point`` of ``batch`` leaves: proof the kill landed where it was meant to."""
    assert not job.spark_committed(batch), f"{point}: Spark logged batch {batch} as committed"
    decision = job.decisions().get(batch)
    prepared = set(job.prepared(batch))
    if point in ("task.before_prepare", "task.after_prepare", "driver.before_decide"):
        assert decision is None, f"{point}: batch {batch} was decided"
        if point == "task.after_prepare":
            assert prepared, f"{point}: no branch of batch {batch} is prepared"
        if point == "driver.before_decide":
            assert len(prepared) >= 2, f"{point}: expected every branch of batch {batch} prepared, got {prepared}"
        return
    if job.mode == "plain":
        return
    assert decision is not None, f"{point}: batch {batch} was not decided"
    listed = set(decision["xids"])
    assert len(listed) >= 2, f"{point}: batch {batch} decided with {len(listed)} branches"
    if point == "driver.after_decide":
        assert decision["state"] == "committing" and listed <= prepared, (decision, prepared)
    elif point == "driver.after_first_commit":
        assert decision["state"] == "committing" and listed - prepared, (decision, prepared)
    elif point == "driver.after_commits":
        assert decision["state"] == "committing" and not listed & prepared, (decision, prepared)
    elif point == "driver.after_mark":
        assert decision["state"] == "committed" and not prepared, (decision, prepared)


def partitions_for(step: int) -> int:
    """Partitions of the chain's run ``step``: alternating, so each run replays a batch partitioned differently."""
    return 3 if step % 2 == 0 else 2


def run_chain(job: StreamJob, steps: list[tuple[str, Any]], max_finish_runs: int = 3) -> None:
    """Run ``steps`` (("point", batch) or ("random", delay)), then restart without faults until done."""
    for i, (kind, arg) in enumerate(steps):
        partitions = partitions_for(i)
        if kind == "random":
            result = job.run(kill_after=arg, partitions=partitions)
            assert result.returncode in (0, -signal.SIGKILL), result.tail()
            continue
        result = job.run(fault=f"{kind}:b={arg}", partitions=partitions)
        assert result.killed, f"fault {kind} at batch {arg} never fired (rc {result.returncode}):\n{result.tail()}"
        check_kill_state(job, kind, arg)
    for i in range(max_finish_runs):
        if job.finished():
            break
        result = job.run(partitions=partitions_for(len(steps) + i))
        assert result.returncode == 0, result.tail()
    assert job.finished(), "the stream did not consume all its input"


def check_exactly_once(job: StreamJob) -> None:
    totals = job.totals()
    ids = job.ids()
    assert (totals.lost, totals.duplicated, totals.extra, totals.left_prepared) == (0, 0, 0, 0), asdict(totals)
    assert sorted(ids) == list(range(job.files * ROWS_PER_FILE))
    decisions = job.decisions()
    assert sorted(decisions) == job.committed_batches(), "decision log and Spark's commit log disagree"
    assert all(d["state"] == "committed" for d in decisions.values()), decisions
    assert sum(d["rows"] for d in decisions.values()) == len(ids)
    assert all(d["rows"] % ROWS_PER_FILE == 0 and 2 <= d["branches"] <= 3 for d in decisions.values()), decisions


@pytest.fixture
def seed() -> int:
    value = int(os.environ.get("XASINK_CRASH_SEED", random.randrange(2**32)))
    print(f"crash test seed {value} (XASINK_CRASH_SEED)")
    return value


@pytest.fixture
def rng(seed: int) -> random.Random:
    return random.Random(seed)


@pytest.mark.timeout(3600)
def test_stream_source_survives_a_kill_at_every_point(
    tmp_path: Path, db: Target, rng: random.Random, request: pytest.FixtureRequest
) -> None:
    """writeStream.format("xasink"): a kill at each named point (and, with --soak, two random kills), every id once."""
    soak = is_soak(request)
    points = NAMED_POINTS if soak else MARIADB_CI_POINTS if db.kind == MARIADB else PG_CI_POINTS
    steps: list[tuple[str, Any]] = [(point, batch) for batch, point in enumerate(points)]
    if db.kind == MARIADB or not soak:  # the named points only, and one more file for the run that finishes
        files = len(points) + 1
    else:  # a random kill lands within a second of a batch's start, with enough input left that it always lands
        steps += [("random", rng.uniform(0.0, 1.0)) for _ in range(2)]
        files = len(NAMED_POINTS) + 6
    job = StreamJob(tmp_path, db, "source", files=files)
    try:
        run_chain(job, steps)
        check_exactly_once(job)
        assert sum(r.killed for r in job.results) == len(steps)  # the random kills landed too
        # each batch the last run committed logged its figures at INFO, as the decision log holds them
        logged = re.findall(
            rf"sink {re.escape(job.sink_id)} batch (\d+): committed (\d+) rows in (\d+) branches \(prepare ",
            job.results[-1].log.read_text(errors="replace"),
        )
        assert logged, "the last run logged no batch figures"
        decided = job.decisions()
        assert all((decided[int(b)]["rows"], decided[int(b)]["branches"]) == (int(r), int(n)) for b, r, n in logged)
        # each micro-batch is planned once: Spark's commit worker calls streamWriter() again, and it must not
        # repeat the server checks, the table plan and the recovery pass (an append commits by its xids)
        phases = job.results[-1].phases
        planned = {r["pid"] for r in phases if r["phase"] == "plan.preflight"}
        committed = {r["pid"] for r in phases if r["phase"] == "commit.call"}
        assert len(committed) >= len(logged) and planned, phases
        assert not planned & committed, "a commit worker planned its micro-batch again"
        # a batch killed after its decision was finished by the restart, not rewritten by the replay,
        # although the replay partitioned it differently: its record keeps the killed run's branches
        for point in ("driver.after_decide", "driver.after_first_commit", "driver.after_commits"):
            if point not in points:
                continue
            batch = points.index(point)
            record = job.decisions()[batch]
            assert record["commit_ms"] is None and record["branches"] == partitions_for(batch), (point, record)
    finally:
        job.drop()


def is_soak(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--soak")) or os.environ.get("XASINK_SOAK") == "1"


@pytest.mark.core
@pytest.mark.timeout(3600)
def test_foreach_batch_survives_kills(tmp_path: Path, db: Target, request: pytest.FixtureRequest) -> None:
    """foreachBatch(xasink.foreach_batch(...)): decided-but-unfinished and committed-but-unlogged batches.

    On MariaDB with --soak only: foreach_batch writes each micro-batch with xasink.write, whose database side
    at these two points test_crash.py kills on MariaDB; the streaming side is the same as on PostgreSQL.
    """
    if db.kind == MARIADB and not is_soak(request):
        pytest.skip("soak test: foreachBatch kills on MariaDB (test_crash.py covers the points there)")
    job = StreamJob(tmp_path, db, "foreach", files=3)
    try:
        run_chain(job, [("driver.after_first_commit", 0), ("driver.after_mark", 1)])
        check_exactly_once(job)
    finally:
        job.drop()


@pytest.mark.soak
@pytest.mark.timeout(3600)
def test_plain_foreach_batch_duplicates_after_the_same_kills(tmp_path: Path, pg: Target) -> None:
    """The usual foreachBatch (a psycopg2 commit per partition) killed at the same points writes rows twice.

    A control experiment (soak only): it checks the hand-made writer, not xasink, so no change to xasink can
    make it fail; that each kill lands where meant is checked in CI by every xasink chain (check_kill_state).
    """
    job = StreamJob(tmp_path, pg, "plain", files=3)
    try:
        run_chain(job, [("driver.after_first_commit", 0), ("driver.after_mark", 1)])
        totals = job.totals()
        counts = Counter(job.ids())
        assert totals.lost == 0 and totals.extra == 0
        # killed between its partition commits: the partitions that had committed are written again
        assert any(counts[i] == 2 for i in range(ROWS_PER_FILE)), "no row of batch 0 was duplicated"
        # killed after all its commits, before Spark's commit log: the whole batch is written again
        assert all(counts[i] == 2 for i in range(ROWS_PER_FILE, 2 * ROWS_PER_FILE))
        assert all(counts[i] == 1 for i in range(2 * ROWS_PER_FILE, 3 * ROWS_PER_FILE))
        assert totals.duplicated >= ROWS_PER_FILE
    finally:
        job.drop()


# ------------------------------------------------------------------------------------------------- soak


def soak_chain(job: StreamJob, rng: random.Random, max_runs: int) -> None:
    """Restart until done; each run gets a random kill, or a random named point at its next batch.

    The baseline passes only two of the named points (its moments of "one partition committed" and "all
    committed, Spark's commit log not yet written"), so it draws from those.
    """
    points = NAMED_POINTS if job.mode != "plain" else ("driver.after_first_commit", "driver.after_mark")
    for _ in range(max_runs):
        if job.finished():
            return
        if rng.random() < 0.3:
            point = rng.choice(points)
            result = job.run(fault=f"{point}:b={job.next_batch()}", partitions=rng.choice((2, 3)))
        else:
            result = job.run(kill_after=rng.uniform(0.0, 6.0), partitions=rng.choice((2, 3)))
        assert result.returncode in (0, -signal.SIGKILL), result.tail()
    for _ in range(3):  # the kills used up the budget: finish without faults
        if job.finished():
            return
        assert job.run().returncode == 0, job.results[-1].tail()
    assert job.finished()


@pytest.mark.soak
@pytest.mark.timeout(0)
def test_soak_random_kills(tmp_path: Path, pg: Target, seed: int, rng: random.Random) -> None:
    """Many chains of random kills per writer; totals printed and saved to benchmarks/results/soak.json."""
    runs = int(os.environ.get("XASINK_SOAK_RUNS", "5"))
    files = int(os.environ.get("XASINK_SOAK_FILES", "6"))
    totals: dict[str, Totals] = {}
    for mode in ("source", "foreach", "plain"):
        totals[mode] = Totals()
        for n in range(runs):
            job = StreamJob(tmp_path / f"{mode}-{n}", pg, mode, files=files)
            try:
                soak_chain(job, rng, max_runs=3 * files)
                t = job.totals()
                print(f"soak {mode} #{n}: {asdict(t)}")
                totals[mode].add(t)
                if t.left_prepared:  # counted (and failed) below; cleared so the next chain starts clean
                    for gid in job.prepared():
                        pg.rollback_ours(gid)
            finally:
                job.drop()
    report = {
        "seed": seed,
        "chains_per_writer": runs,
        "files_per_chain": files,
        "rows_per_file": ROWS_PER_FILE,
        "writers": {mode: asdict(t) for mode, t in totals.items()},
    }
    out = ROOT / "benchmarks" / "results" / "soak.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    for mode in ("source", "foreach"):
        t = totals[mode]
        assert (t.lost, t.duplicated, t.extra, t.left_prepared) == (0, 0, 0, 0), (mode, asdict(t))
