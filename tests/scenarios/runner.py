"""Runs a scenario schedule (tests/scenarios/model.py) against a real database and judges it.

Each writer is a process of its own (tests/scenarios/driver.py), forked by a ``multiprocessing`` fork
server that imported xasink once, so a schedule of four writers starts in milliseconds rather than
seconds; it can be SIGKILLed by its fault point and is killed here if it outlives its time limit.
Recovery runs as the real ``xasink recover`` command (the console script's entry point, ``xasink.ops.cli:main``,
in a forked process; ``XASINK_SCENARIO_CLI=1``: the installed script itself), some runs under a short
statement timeout, some started once a writer reached a fault point (``anchor``), some with a pause inside their
apply (``fault``); a final one runs after every writer is gone.  Interference from outside xasink (locks, a
column added, a server killed and started again: tests/scenarios/interference.py) runs beside the writers and
is ended before the final recover.  Then the table, its child table, a sibling table and the prepared branches
are read with the plain driver (tests/targets.py) and handed to the oracle (tests/scenarios/oracle.py), with
what each writer saw and left when it answered: the moment a writer's process ends, its branches still
prepared outside any decision are listed (:class:`Exits`).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.scenarios import model, oracle
from tests.scenarios.driver import recover_main, writer_main
from tests.scenarios.interference import Anchored, Interference, Place, Restartable, due_items
from tests.scenarios.model import Recover, Schedule, Writer
from tests.scenarios.oracle import Told
from tests.targets import MARIADB, POSTGRESQL, MariaDBTarget, Target

XASINK_CLI = str(Path(sys.executable).with_name("xasink"))  # the console script (XASINK_SCENARIO_CLI=1)
RECOVER_LIMIT_S = 60.0
RECOVER_RETRY_S = 20.0  # --retry-for of a recover run under a statement timeout
SIBLING_ROWS = [(1,), (2,), (3,)]

_context: Any = None


def fork_server() -> Any:
    """The fork server context (started on first use, once per process), with xasink imported in it."""
    global _context
    if _context is None:
        _context = multiprocessing.get_context("forkserver")
        # the processes' entry points live in the preloaded module: unpickling them imports nothing more
        _context.set_forkserver_preload(["tests.scenarios.driver"])
        # started (and its imports done) now, not inside the first schedule: a writer's start time is kept
        warm = _context.Process(target=time.sleep, args=(0,))
        warm.start()
        warm.join()
    return _context


@dataclass
class Outcome:
    """One schedule's run: what the runs were told, what the oracle found."""

    schedule: Schedule
    told: dict[str, Told]
    table: list[Any]
    violations: list[str]
    seconds: float
    logs: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # what the interference did

    def report(self) -> str:
        lines = [self.schedule.describe()]
        lines += told_lines(self.told)
        lines += [f"  interference: {n}" for n in self.notes]
        lines.append(f"  final table: {self.table}")
        lines += [f"  VIOLATION: {v}" for v in self.violations]
        lines.append(f"  replay: {self.schedule.replay()}")
        return "\n".join(lines)


def told_lines(told: dict[str, Told]) -> list[str]:
    """What each run was told, and what it saw and left then, for a report."""
    lines = []
    for label, t in told.items():
        error = t.error.split(" ")[0] if t.error else ""
        lines.append(f"  {label}: {t.outcome} {t.phase} {error} {t.message[:300]}".rstrip())
        reached = ", ".join(f"{p} +{at - t.started:.2f}s" for p, at in t.faults.items())
        took = f"ran {t.ended - t.started:.2f}s" + (f", run {t.run}" if t.run else "")
        lines.append(f"      {took}{'; reached ' + reached if reached else ''}")
        if t.seen is not None:
            lines.append(f"      saw right after: {t.seen}")
        if t.leftover:
            lines.append(f"      left prepared outside a decision: {t.leftover}")
    return lines


class Runner:
    """Runs schedules against one database (a :class:`tests.targets.Target`); ``server``: its server, when the
    schedules may kill it and start it again (the session's private PostgreSQL, a private MariaDB)."""

    def __init__(self, db: Target, workdir: Path, server: Restartable | None = None) -> None:
        self.db = db
        self.workdir = workdir
        self.server = server

    # -- the tables ---------------------------------------------------------------------------------
    def _tables(self, mode: str, child_table: bool = True) -> tuple[str, str | None, str]:
        db, q = self.db, self.db.q
        table, sibling = db.new_table(), db.new_table()
        key = "" if mode == "append" else " PRIMARY KEY"
        seq = ", seq bigint" if mode == "changes" else ""
        db.create_table(table, f"id int{key}, name varchar(40){seq}")
        db.create_table(sibling, "x int")
        db.execute(f"INSERT INTO {q(sibling)} (x) VALUES " + ", ".join(f"({r[0]})" for r in SIBLING_ROWS))
        initial = model.initial_rows(mode)
        values = ", ".join("(" + ", ".join(_literal(v) for v in r) + ")" for r in initial)
        db.execute(f"INSERT INTO {q(table)} VALUES {values}")
        child = None
        if mode != "append" and child_table:
            child = db.new_table()
            db.create_table(
                child, f"cid int PRIMARY KEY, pid int, FOREIGN KEY (pid) REFERENCES {q(table)} (id) ON DELETE CASCADE"
            )
            db.execute(f"INSERT INTO {q(child)} VALUES " + ", ".join(f"({c}, {p})" for c, p in model.child_rows()))
        if db.kind == POSTGRESQL:  # the test cluster commits with synchronous_commit off: a restart right away
            # (kill -9) lost these tables (seed 8556); a commit with it on flushes everything before it
            db.execute("SET synchronous_commit = on; SELECT txid_current()")
        return table, child, sibling

    def _options(self, schedule: Schedule, w: Writer, table: str, sink: str) -> tuple[str, dict[str, Any]]:
        options: dict[str, Any] = {
            "url": self.writer_url(schedule.options.get("statementTimeoutMs")),
            "dbtable": table,
            "sinkId": sink,
            "batchId": w.batch,
            **{k: v for k, v in {**model.WRITER_OPTIONS, **schedule.options}.items() if k != "statementTimeoutMs"},
        }
        if self.db.password is not None:
            options["password"] = self.db.password
        mode = schedule.mode
        if mode in ("upsert", "changes"):
            options["upsertKeyColumns"] = "id"
        if mode == "changes":
            options["deleteFlagColumn"] = "is_delete"
            options["sequenceColumn"] = "seq"
        if mode == "replaceWhere":
            options["replaceWhere"] = f"id >= {model.REPLACE_FROM}"
        return ("overwrite" if mode in ("overwrite", "replaceWhere") else "append"), options

    def writer_url(self, statement_timeout_ms: int | None) -> str:
        """The URL the writers get: the user's, or with a statement timeout the target imposes on every session
        (as a DBA's role setting would)."""
        return self.db.url if statement_timeout_ms is None else self.recover_url(statement_timeout_ms)

    def recover_url(self, statement_timeout_ms: int | None) -> str:
        """The URL ``xasink recover`` gets, with a statement timeout for every statement it runs."""
        if self.db.kind == MARIADB:
            assert isinstance(self.db, MariaDBTarget)
            base = self.db.admin_url  # mysql+pymysql://root@host:port/db
            if statement_timeout_ms is None:
                return base
            return f"{base}?init_command=SET%20SESSION%20max_statement_time%3D{statement_timeout_ms / 1000}"
        if statement_timeout_ms is None:
            return self.db.url
        sep = "&" if "?" in self.db.url else "?"
        return f"{self.db.url}{sep}options=-c%20statement_timeout%3D{statement_timeout_ms}"

    # -- one schedule -------------------------------------------------------------------------------
    def run(self, schedule: Schedule) -> Outcome:
        t_begin = time.monotonic()
        table, child, sibling = self._tables(schedule.mode, schedule.child)
        sink = f"sc{uuid.uuid4().hex[:10]}"
        here = Path(tempfile.mkdtemp(prefix=f"seed{schedule.seed}-", dir=self.workdir))
        interference = Interference({"": Place(self.db, table, self.server)}, sink)
        try:
            return self._run(schedule, table, child, sibling, sink, here, interference, t_begin)
        finally:  # even when the schedule failed: nothing of it prepared, its tables dropped
            interference.finish()
            for gid in self.db.prepared(sink):
                try:
                    self.db.rollback_ours(gid)
                except Exception:  # finished concurrently
                    pass
            for name in (table, sibling, *((child,) if child else ())):
                if name in self.db.tables:
                    self.db.tables.remove(name)
            self.db.drop_table(*((child,) if child else ()), table, sibling)

    def _run(
        self,
        schedule: Schedule,
        table: str,
        child: str | None,
        sibling: str,
        sink: str,
        here: Path,
        interference: Interference,
        t_begin: float,
    ) -> Outcome:
        ctx = fork_server()
        waiting = list(schedule.writers)
        anchored = [Anchored(e) for e in schedule.events] + [Anchored(r) for r in schedule.recovers]
        watch = Watch()
        exits = Exits({"": self.db}, [self.db], sink, here, interference)
        dropped: list[str] = []
        t0 = time.monotonic()
        try:
            while waiting or anchored or watch.writers_alive() or watch.recovering():
                now = time.monotonic()
                for w in list(waiting):
                    base = t0 if w.after is None else watch.ended.get(w.after)
                    if base is None or now < base + w.start:
                        continue
                    waiting.remove(w)
                    save_mode, options = self._options(schedule, w, table, sink)
                    spec = {
                        "options": options,
                        "save_mode": save_mode,
                        "fault": w.fault,
                        "partitions": [[list(r) for r in p] for p in w.partitions],
                        "query": w.query,
                        "look": {"table": self.look(table)} if schedule.mode == "append" else None,
                    }
                    proc = ctx.Process(
                        target=writer_main,
                        args=(spec, str(here / f"{w.label}.jsonl"), str(here / f"{w.label}.log")),
                        daemon=True,
                    )
                    watch.start_writer(w.label, proc, schedule.limit(w))
                reached = exits.reached(watch)
                interference.reached(reached)
                for item in due_items(anchored, t0, reached, set(watch.ended), dropped):
                    if isinstance(item, Recover):
                        watch.start_recover(self._recover(item.statement_timeout_ms, sink, here, fault=item.fault))
                    else:
                        interference.start(item)
                watch.check()
                if interference.up():
                    exits.look(watch)
                time.sleep(0.02)
        except BaseException:  # the runner itself failed (or was interrupted): stop what it started
            watch.kill_all()
            raise
        watch.join_writers()
        interference.finish()  # every lock released, the server up: the final recover must be able to finish
        exits.look(watch)
        interference.after_restarts()
        final = self._recover(None, sink, here, name="final")
        final_rc = final.wait(RECOVER_LIMIT_S)
        told = {w.label: exits.told(watch, w.label) for w in schedule.writers}
        # the schedule's own columns only: interference may have added others
        columns = "id, name, seq" if schedule.mode == "changes" else "id, name"
        found = self.db.execute(f"SELECT {columns} FROM {self.db.q(table)} ORDER BY id, name")
        rows = [tuple(_plain(v) for v in r) for r in found]
        child_rows = [tuple(int(v) for v in r) for r in self.db.rows(child)] if child is not None else []
        sibling_ok = [tuple(r) for r in self.db.rows(sibling)] == SIBLING_ROWS
        prepared = self.db.prepared(sink)
        known = self.db.knows_sink(sink)
        violations = oracle.check(schedule, told, rows, prepared, sibling_ok, child_rows, final_rc, known)
        if final_rc is None:
            violations.append(f"the final `xasink recover` ran past {RECOVER_LIMIT_S}s and was killed")
        if watch.stuck:
            violations.append(f"{watch.stuck} `xasink recover` run(s) during the schedule ran past {RECOVER_LIMIT_S}s")
        logs = {}
        if violations:
            for f in sorted(here.glob("*.log")):
                logs[f.stem] = f.read_text(errors="replace")[-4000:]
        return Outcome(schedule, told, rows, violations, time.monotonic() - t_begin, logs, interference.notes + dropped)

    def look(self, table: str) -> dict[str, str]:
        """What a writer reads the table with right after its answer (tests/scenarios/driver.py's ``look``)."""
        url = self.db.admin_url if isinstance(self.db, MariaDBTarget) else self.db.url
        return {"kind": self.db.kind, "url": url, "table": table}

    def _recover(
        self, statement_timeout_ms: int | None, sink: str, here: Path, name: str = "", fault: str | None = None
    ) -> RecoverRun:
        argv = ["recover", "--url", self.recover_url(statement_timeout_ms), "--sink-id", sink]
        if statement_timeout_ms is not None:
            # a step its own statement timeout keeps blocking is retried for --retry-for (default 5 minutes, for a
            # server down that long), then reported unfinished (exit 1): bounded here so the run ends well within
            # RECOVER_LIMIT_S on a loaded machine (MariaDB seed 1042: 5 ms never fit the apply's DELETE)
            argv += ["--retry-for", f"{RECOVER_RETRY_S:g}s"]
        return RecoverRun(argv, here / f"recover-{name or uuid.uuid4().hex[:6]}.log", fault)


class RecoverRun:
    """One ``xasink recover``: the CLI's entry point (``xasink.ops.cli:main``, what the console script runs) in a
    process forked by the fork server, or with ``XASINK_SCENARIO_CLI=1`` the installed console script itself
    (an interpreter start per run: about a second on a busy machine)."""

    def __init__(self, argv: list[str], log: Path, fault: str | None = None) -> None:
        self.proc: Any
        if os.environ.get("XASINK_SCENARIO_CLI") == "1":
            env = {k: v for k, v in os.environ.items() if k != "XASINK_FAULT"}
            env.update({"XASINK_FAULT": fault} if fault else {})
            with log.open("wb") as out:
                self.proc = subprocess.Popen(
                    [XASINK_CLI, *argv], stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env
                )
        else:
            self.proc = fork_server().Process(target=recover_main, args=(argv, str(log), fault), daemon=True)
            self.proc.start()

    def poll(self) -> int | None:
        if isinstance(self.proc, subprocess.Popen):
            return self.proc.poll()
        return None if self.proc.is_alive() else self.proc.exitcode

    def kill(self) -> None:
        self.proc.kill()

    def wait(self, timeout: float) -> int | None:
        """Its exit status, or None when it ran past ``timeout`` (then it is killed)."""
        deadline = time.monotonic() + timeout
        while (rc := self.poll()) is None and time.monotonic() < deadline:
            time.sleep(0.02)
        if rc is None:
            self.kill()
        if isinstance(self.proc, subprocess.Popen):
            self.proc.wait()
        else:
            self.proc.join()
        return rc


@dataclass
class Watch:
    """The processes one schedule started, watched until they end: writer processes (killed, and counted
    hung, past their time limit) and ``xasink recover`` runs (killed past RECOVER_LIMIT_S)."""

    writers: dict[str, tuple[Any, float, float]] = field(default_factory=dict)  # label -> (process, started, limit)
    ended: dict[str, float] = field(default_factory=dict)
    hung: set[str] = field(default_factory=set)
    recovers: list[tuple[RecoverRun, float]] = field(default_factory=list)
    stuck: int = 0  # recover runs killed past RECOVER_LIMIT_S

    def start_writer(self, label: str, proc: Any, limit: float) -> None:
        proc.start()
        self.writers[label] = (proc, time.monotonic(), limit)

    def start_recover(self, run: RecoverRun) -> None:
        self.recovers.append((run, time.monotonic()))

    def writers_alive(self) -> bool:
        return any(p.is_alive() for p, _, _ in self.writers.values())

    def recovering(self) -> bool:
        return any(r.poll() is None for r, _ in self.recovers)

    def check(self) -> None:
        """One look: note the writers that ended, kill those past their limit and the overdue recover runs."""
        for label, (proc, started, limit) in self.writers.items():
            if label in self.ended:
                continue
            if not proc.is_alive():
                self.ended[label] = time.monotonic()
            elif time.monotonic() - started > limit:
                self.hung.add(label)
                proc.kill()
        for rproc, started in self.recovers:
            if rproc.poll() is None and time.monotonic() - started > RECOVER_LIMIT_S:
                rproc.kill()
                self.stuck += 1

    def kill_all(self) -> None:
        for proc, _, _ in self.writers.values():
            if proc.is_alive():
                proc.kill()
        for rproc, _ in self.recovers:
            if rproc.poll() is None:
                rproc.kill()

    def join_writers(self) -> None:
        for label, (proc, _, _) in self.writers.items():
            proc.join()
            self.ended.setdefault(label, time.monotonic())

    def told(self, label: str, here: Path) -> Told:
        """What the writer ``label`` was told, from the events it wrote to ``here/<label>.jsonl``."""
        process, started, _ = self.writers[label]
        lines = []
        result = here / f"{label}.jsonl"
        if result.exists():
            lines = [json.loads(line) for line in result.read_text().splitlines() if line.strip()]
        told = Told("killed" if process.exitcode == -9 else "lost", started, self.ended[label])
        for line in lines:
            if line.get("event") == "run":
                told.run = line["run"]
            elif line.get("event") == "fault":
                told.faults.setdefault(line["point"], line["t"])
            elif line.get("event") == "started":
                told.forked_at = line["t"]
            elif line.get("event") == "claiming":
                told.claiming_at = line["t"]
            elif line.get("event") == "claimed":
                told.claimed_at = line["t"]
            elif line.get("event") == "committing":
                told.committing_at = line["t"]
            elif "outcome" in line:
                told.outcome = line["outcome"]
                told.error = line.get("error", "")
                told.message = line.get("message", "")
                told.phase = line.get("phase", "")
                told.told_at = line.get("t")
                told.seen = line["seen"] if isinstance(line.get("seen"), dict) else None
        if label in self.hung:
            told.outcome = "hung"
        return told


class Exits:
    """Each writer's reports as they come (the fault points it reached, which start anchored items) and, the
    moment its process ended, its branches still prepared outside any decision: for a run told an error that
    promises a clean end (``Told.must_leave_nothing``), the oracle's "left prepared" finding.  ``dbs``: where
    the sink's branches may be, by the name interference uses for them; ``logs``: the decision logs that may
    list them.  Branches on a database that was down (killed) while the run ran or ended are excused: nothing
    can roll them back then, recovery does later."""

    def __init__(
        self, dbs: dict[str, Target], logs: list[Target], sink: str, here: Path, interference: Interference
    ) -> None:
        self.dbs, self.logs = dbs, logs
        self.here = here
        self.sink = sink
        self.interference = interference
        self.looked: dict[str, list[str]] = {}

    def reached(self, watch: Watch) -> dict[str, dict[str, float]]:
        """Each started writer's fault points reached so far, and when."""
        out: dict[str, dict[str, float]] = {}
        for label in watch.writers:
            path = self.here / f"{label}.jsonl"
            if path.exists():
                for line in path.read_text().splitlines():
                    if '"fault"' in line:
                        event = json.loads(line)
                        out.setdefault(label, {}).setdefault(event["point"], event["t"])
        return out

    def look(self, watch: Watch) -> None:
        """For each writer whose process ended since the last look: what it left prepared."""
        for label in list(watch.ended):
            if label in self.looked:
                continue
            told = watch.told(label, self.here)
            self.looked[label] = []
            if not (told.must_leave_nothing() and told.run):
                continue
            for name, db in self.dbs.items():
                if self.interference.was_down(name, told.started, told.ended):
                    continue
                try:
                    self.looked[label] += outside_decisions(db, self.logs, self.sink, told.run)
                except Exception:  # noqa: BLE001 - a server down now: this look proves nothing
                    continue

    def told(self, watch: Watch, label: str) -> Told:
        told = watch.told(label, self.here)
        told.leftover = self.looked.get(label, [])
        return told


def outside_decisions(db: Target, logs: list[Target], sink: str, run: str) -> list[str]:
    """The run's branches prepared in ``db`` that no decision of the sink lists in any of ``logs``."""
    mine = [g for g in db.prepared(sink) if g.endswith(f"-{run}")]
    if not mine:
        return []
    decided = {x for log in logs for d in log.decisions(sink).values() for x in d.xids}
    return [g for g in mine if g not in decided]


def _literal(v: Any) -> str:
    return f"'{v}'" if isinstance(v, str) else str(int(v))


def _plain(v: Any) -> Any:
    return v if isinstance(v, str) else int(v)


def env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    return int(raw) if raw else default
