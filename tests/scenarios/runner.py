"""Runs a scenario schedule (tests/scenarios/model.py) against a real database and judges it.

Each writer is a process of its own (tests/scenarios/driver.py), forked by a ``multiprocessing`` fork
server that imported xasink once, so a schedule of four writers starts in milliseconds rather than
seconds; it can be SIGKILLed by its fault point and is killed here if it outlives its time limit.
Recovery runs as the real ``xasink recover`` command (the console script's entry point, ``xasink.ops.cli:main``,
in a forked process; ``XASINK_SCENARIO_CLI=1``: the installed script itself), some runs under a short
statement timeout; a final one runs after every writer is gone.  Then the
table, its child table, a sibling table and the prepared branches are read with the plain driver
(tests/targets.py) and handed to the oracle.
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

from tests.scenarios import model
from tests.scenarios.driver import recover_main, writer_main
from tests.scenarios.model import Recover, Schedule, Told, Writer
from tests.targets import MARIADB, MariaDBTarget, Target

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

    def report(self) -> str:
        lines = [self.schedule.describe()]
        for label, t in self.told.items():
            error = t.error.split(" ")[0] if t.error else ""
            lines.append(f"  {label}: {t.outcome} {t.phase} {error} {t.message[:300]}")
        lines.append(f"  final table: {self.table}")
        lines += [f"  VIOLATION: {v}" for v in self.violations]
        lines.append(f"  replay: {self.schedule.replay()}")
        return "\n".join(lines)


class Runner:
    """Runs schedules against one database (a :class:`tests.targets.Target`)."""

    def __init__(self, db: Target, workdir: Path) -> None:
        self.db = db
        self.workdir = workdir

    # -- the tables ---------------------------------------------------------------------------------
    def _tables(self, mode: str) -> tuple[str, str | None, str]:
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
        if mode != "append":
            child = db.new_table()
            db.create_table(
                child, f"cid int PRIMARY KEY, pid int, FOREIGN KEY (pid) REFERENCES {q(table)} (id) ON DELETE CASCADE"
            )
            db.execute(f"INSERT INTO {q(child)} VALUES " + ", ".join(f"({c}, {p})" for c, p in model.child_rows()))
        return table, child, sibling

    def _options(self, schedule: Schedule, w: Writer, table: str, sink: str) -> tuple[str, dict[str, Any]]:
        options: dict[str, Any] = {
            "url": self.db.url,
            "dbtable": table,
            "sinkId": sink,
            "batchId": w.batch,
            "commitTimeout": model.COMMIT_TIMEOUT_S,
            "lockTimeout": model.LOCK_TIMEOUT_S,
            "controlLockTimeout": model.LOCK_TIMEOUT_S,
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
        table, child, sibling = self._tables(schedule.mode)
        sink = f"sc{uuid.uuid4().hex[:10]}"
        here = Path(tempfile.mkdtemp(prefix=f"seed{schedule.seed}-", dir=self.workdir))
        ctx = fork_server()
        pending: list[tuple[float, Writer | Recover]] = sorted(
            [(w.start, w) for w in schedule.writers] + [(r.start, r) for r in schedule.recovers], key=lambda x: x[0]
        )
        watch = Watch()
        t0 = time.monotonic()
        try:
            while pending or watch.writers_alive() or watch.recovering():
                now = time.monotonic()
                while pending and pending[0][0] <= now - t0:
                    _, item = pending.pop(0)
                    if isinstance(item, Writer):
                        save_mode, options = self._options(schedule, item, table, sink)
                        spec = {
                            "options": options,
                            "save_mode": save_mode,
                            "fault": item.fault,
                            "partitions": [[list(r) for r in p] for p in item.partitions],
                            "query": item.query,
                        }
                        proc = ctx.Process(
                            target=writer_main,
                            args=(spec, str(here / f"{item.label}.jsonl"), str(here / f"{item.label}.log")),
                            daemon=True,
                        )
                        limit = model.COMMIT_TIMEOUT_S + 3 * model.LOCK_TIMEOUT_S + item.pause() + model.MARGIN_S
                        watch.start_writer(item.label, proc, limit)
                    else:
                        watch.start_recover(self._recover(item.statement_timeout_ms, sink, here))
                watch.check()
                time.sleep(0.02)
        except BaseException:  # the runner itself failed (or was interrupted): stop what it started
            watch.kill_all()
            raise
        watch.join_writers()
        final = self._recover(None, sink, here, name="final")
        final_rc = final.wait(RECOVER_LIMIT_S)
        told = {w.label: watch.told(w.label, here) for w in schedule.writers}
        q = self.db.q
        rows = [tuple(_plain(v) for v in r) for r in self.db.rows(table, "id, name")]
        child_rows = [tuple(int(v) for v in r) for r in self.db.rows(child)] if child is not None else []
        sibling_ok = [tuple(r) for r in self.db.rows(sibling)] == SIBLING_ROWS
        prepared = self.db.prepared(sink)
        violations = model.check(schedule, told, rows, prepared, sibling_ok, child_rows, final_rc)
        if final_rc is None:
            violations.append(f"the final `xasink recover` ran past {RECOVER_LIMIT_S}s and was killed")
        if watch.stuck:
            violations.append(f"{watch.stuck} `xasink recover` run(s) during the schedule ran past {RECOVER_LIMIT_S}s")
        for gid in prepared:  # reported above; rolled back so later schedules do not wait on their locks
            try:
                self.db.rollback_ours(gid)
            except Exception:  # finished concurrently
                pass
        logs = {}
        if violations:
            for f in sorted(here.glob("*.log")):
                logs[f.stem] = f.read_text(errors="replace")[-4000:]
        for name in (table, sibling, *((child,) if child else ())):
            self.db.tables.remove(name)
        self.db.drop_table(*((child,) if child else ()), table, sibling)
        del q
        return Outcome(schedule, told, rows, violations, time.monotonic() - t_begin, logs)

    def _recover(self, statement_timeout_ms: int | None, sink: str, here: Path, name: str = "") -> RecoverRun:
        argv = ["recover", "--url", self.recover_url(statement_timeout_ms), "--sink-id", sink]
        if statement_timeout_ms is not None:
            # a step its own statement timeout keeps blocking is retried for --retry-for (default 5 minutes, for a
            # server down that long), then reported unfinished (exit 1): bounded here so the run ends well within
            # RECOVER_LIMIT_S on a loaded machine (MariaDB seed 1042: 5 ms never fit the apply's DELETE)
            argv += ["--retry-for", f"{RECOVER_RETRY_S:g}s"]
        return RecoverRun(argv, here / f"recover-{name or uuid.uuid4().hex[:6]}.log")


class RecoverRun:
    """One ``xasink recover``: the CLI's entry point (``xasink.ops.cli:main``, what the console script runs) in a
    process forked by the fork server, or with ``XASINK_SCENARIO_CLI=1`` the installed console script itself
    (an interpreter start per run: about a second on a busy machine)."""

    def __init__(self, argv: list[str], log: Path) -> None:
        self.proc: Any
        if os.environ.get("XASINK_SCENARIO_CLI") == "1":
            with log.open("wb") as out:
                self.proc = subprocess.Popen(
                    [XASINK_CLI, *argv], stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT
                )
        else:
            self.proc = fork_server().Process(target=recover_main, args=(argv, str(log)), daemon=True)
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
            if line.get("event") == "started":
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
        if label in self.hung:
            told.outcome = "hung"
        return told


def _literal(v: Any) -> str:
    return f"'{v}'" if isinstance(v, str) else str(int(v))


def _plain(v: Any) -> Any:
    return v if isinstance(v, str) else int(v)


def env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    return int(raw) if raw else default
