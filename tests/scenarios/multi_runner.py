"""Runs a multi-target schedule (tests/scenarios/multi.py) against the session's PostgreSQL and MariaDB databases.

Each writer is a process of its own (tests/scenarios/driver.py's ``multi_write``), as in
tests/scenarios/runner.py; replays start once the run they follow ended; interference (the log's sink row
held, a table locked, the session's PostgreSQL killed and started again: tests/scenarios/interference.py)
and recover runs start at a time or once a writer reached a fault point.  The moment a writer's process
ends, its branches still prepared on either database outside any decision are listed; at the end every
interference is ended, then a final recover runs for both databases against every log the schedule may
have used, and both tables are read with the plain driver.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.scenarios import model
from tests.scenarios.driver import multi_writer_main
from tests.scenarios.interference import Anchored, Interference, Place, Restartable, due_items
from tests.scenarios.multi import DBS, FinalRecover, MultiRecover, MultiSchedule, MultiWriter, Row, check_multi
from tests.scenarios.oracle import Told
from tests.scenarios.runner import (
    RECOVER_LIMIT_S,
    Exits,
    RecoverRun,
    Runner,
    Watch,
    fork_server,
    told_lines,
)
from tests.targets import Target


@dataclass
class MultiOutcome:
    schedule: MultiSchedule
    told: dict[str, Told]
    tables: dict[str, list[Row]]
    violations: list[str]
    seconds: float
    notes: list[str] = field(default_factory=list)  # what the interference did
    logs: dict[str, str] = field(default_factory=dict)  # the tails of the writers' and recover runs' logs

    def report(self) -> str:
        lines = [self.schedule.describe()]
        lines += told_lines(self.told)
        lines += [f"  interference: {n}" for n in self.notes]
        for db, rows in self.tables.items():
            lines.append(f"  final {db} table: {rows}")
        lines += [f"  VIOLATION: {v}" for v in self.violations]
        lines.append(f"  replay: {self.schedule.replay()}")
        return "\n".join(lines)


class MultiRunner:
    """Runs multi-target schedules against the session's PostgreSQL and MariaDB databases; ``pg_server``: the
    session's PostgreSQL when the schedules may kill it and start it again (never the shared MariaDB)."""

    def __init__(self, pg: Target, maria: Target, workdir: Path, pg_server: Restartable | None = None) -> None:
        self.dbs = {"pg": pg, "maria": maria}
        self.runners = {db: Runner(t, workdir) for db, t in self.dbs.items()}
        self.recover_urls = {db: r.recover_url(None) for db, r in self.runners.items()}
        self.workdir = workdir
        self.servers: dict[str, Restartable | None] = {"pg": pg_server, "maria": None}

    def _credentials(self, db: str) -> dict[str, Any]:
        password = self.dbs[db].password
        return {"password": password} if password is not None else {}

    def _spec(self, s: MultiSchedule, w: MultiWriter, tables: dict[str, str], sink: str) -> dict[str, Any]:
        return {
            "multi": True,
            "sink": sink,
            "batch": w.batch,
            "common": {
                "sinkId": sink,
                "batchId": w.batch,
                "commitTimeout": model.COMMIT_TIMEOUT_S,
                "lockTimeout": model.LOCK_TIMEOUT_S,
                "controlLockTimeout": model.LOCK_TIMEOUT_S,
            },
            "credentials": {db: self._credentials(db) for db in DBS},
            "urls": {db: t.url for db, t in self.dbs.items()},
            "tables": tables,
            "journal_url": self.dbs[s.log].url if s.log != "none" else None,
            "log_credentials": self._credentials(s.log) if s.log != "none" else {},
            "order": w.order,
            "partitions": {db: [[list(r) for r in p] for p in parts] for db, parts in w.partitions.items()},
            "query": w.query,
            "fault": w.fault,
            "look": {db: self.runners[db].look(tables[db]) for db in DBS},
        }

    def _recover(self, db: str, log: str, sink: str, here: Path, name: str) -> RecoverRun:
        argv = ["recover", "--url", self.recover_urls[db], "--sink-id", sink]
        if log != db:
            argv += ["--journal-url", self.recover_urls[log]]
        return RecoverRun(argv, here / f"recover-{name}-{db}-{log}.log")

    def _log_knows(self, log: str, sink: str) -> bool:
        """Whether the decision log in ``log``'s database holds any record of ``sink``."""
        return self.dbs[log].knows_sink(sink)

    def run(self, schedule: MultiSchedule) -> MultiOutcome:
        t_begin = time.monotonic()
        tables = {}
        for db, target in self.dbs.items():
            tables[db] = target.new_table()
            target.create_table(tables[db], "id int, name varchar(40)")
        sink = f"mt{uuid.uuid4().hex[:10]}"
        here = Path(self.workdir) / f"multi-seed{schedule.seed}-{uuid.uuid4().hex[:6]}"
        here.mkdir()
        places = {db: Place(t, tables[db], self.servers[db]) for db, t in self.dbs.items()}
        interference = Interference(places, sink)
        try:
            return self._run(schedule, tables, sink, here, interference, t_begin)
        finally:  # even when the schedule failed: nothing of it prepared, its tables dropped
            interference.finish()
            for db, t in self.dbs.items():
                for gid in t.prepared(sink):
                    try:
                        t.rollback_ours(gid)
                    except Exception:
                        pass
                if tables[db] in t.tables:
                    t.tables.remove(tables[db])
                t.drop_table(tables[db])

    def _run(
        self,
        schedule: MultiSchedule,
        tables: dict[str, str],
        sink: str,
        here: Path,
        interference: Interference,
        t_begin: float,
    ) -> MultiOutcome:
        ctx = fork_server()
        waiting: list[MultiWriter] = list(schedule.writers)
        anchored = [Anchored(e) for e in schedule.events] + [Anchored(r) for r in schedule.recovers]
        watch = Watch()
        log_dbs = [self.dbs[db] for db in (DBS if schedule.log == "none" else (schedule.log,))]
        exits = Exits(self.dbs, log_dbs, sink, here, interference)
        dropped: list[str] = []
        t0 = time.monotonic()
        try:
            while waiting or anchored or watch.writers_alive():
                now = time.monotonic()
                for w in list(waiting):
                    base = t0 if w.after is None else watch.ended.get(w.after)
                    if base is None or now < base + w.start:
                        continue
                    waiting.remove(w)
                    proc = ctx.Process(
                        target=multi_writer_main,
                        args=(
                            self._spec(schedule, w, tables, sink),
                            str(here / f"{w.label}.jsonl"),
                            str(here / f"{w.label}.log"),
                        ),
                        daemon=True,
                    )
                    watch.start_writer(w.label, proc, schedule.limit(w))
                reached = exits.reached(watch)
                interference.reached(reached)
                for item in due_items(anchored, t0, reached, set(watch.ended), dropped):
                    if isinstance(item, MultiRecover):
                        watch.start_recover(self._recover(item.db, item.log, sink, here, uuid.uuid4().hex[:4]))
                    else:
                        interference.start(item)
                watch.check()
                if interference.up():
                    exits.look(watch)
                time.sleep(0.02)
            for rproc, _ in watch.recovers:
                rproc.wait(RECOVER_LIMIT_S)
        except BaseException:
            watch.kill_all()
            raise
        watch.join_writers()
        interference.finish()  # every lock released, the server up: the final recovers must be able to finish
        exits.look(watch)
        interference.after_restarts()
        logs = DBS if schedule.log == "none" else (schedule.log,)
        rcs = []
        for log in logs:  # the log first, then the other database: each finishes what the log decided there
            order = sorted(DBS, key=lambda d: d != log)
            first = {db: self._recover(db, log, sink, here, "final").wait(RECOVER_LIMIT_S) for db in order}
            # a database recovered while a decided batch still had parts prepared in the other one exits 1,
            # naming it: once every database was recovered, recovering it again must exit 0
            for db in order:
                rc = first[db]
                rc = rc if rc != 1 else self._recover(db, log, sink, here, "again").wait(RECOVER_LIMIT_S)
                rcs.append(FinalRecover(rc, self._log_knows(log, sink)))
        told = {w.label: exits.told(watch, w.label) for w in schedule.writers}
        rows = {db: [(int(r[0]), str(r[1])) for r in t.rows(tables[db], "id, name")] for db, t in self.dbs.items()}
        prepared = [g for t in self.dbs.values() for g in t.prepared(sink)]
        violations = check_multi(schedule, told, rows, prepared, rcs)
        tails = (
            {f.stem: f.read_text(errors="replace")[-4000:] for f in sorted(here.glob("*.log"))} if violations else {}
        )
        seconds = time.monotonic() - t_begin
        return MultiOutcome(schedule, told, rows, violations, seconds, interference.notes + dropped, tails)
