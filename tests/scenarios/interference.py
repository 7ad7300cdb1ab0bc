"""Interference from outside xasink (issue 37): what a reader, a DBA or a crash does to the target while writers
run, drawn into schedules (:func:`draw_interfere`) and run here (:class:`Interference`).

Each :class:`tests.scenarios.model.Event` runs in a thread of the runner's process with a plain connection of
its own (tests/targets.py, never xasink code):

- ``lock_table``: a reader's transaction holds a table lock on the target (PostgreSQL ``LOCK TABLE .. IN SHARE
  MODE``, MariaDB ``LOCK TABLES .. READ``) for ``hold`` seconds: writes of the table (the apply of a write mode,
  a branch's load) wait or time out;
- ``lock_rows``: a reader's ``SELECT .. FOR UPDATE`` of every row of the target, held as long;
- ``lock_sink``: a session holds the decision log's row of the sink (``SELECT .. FOR UPDATE``), which every
  claim, decision, withdrawal and sweep takes: held past ``controlLockTimeout`` it fails a decision;
- ``add_column``: a nullable column is added to the target (a DBA's migration, between decision and apply);
- ``require_column``: a NOT NULL column without default is added (its default dropped after filling the
  existing rows, a common migration): every insert of the target fails as a property of its rows (a
  constraint) for ``hold`` seconds, then the column gets a default again;
- ``restart``: the database server is killed (SIGKILL, a crash) and started again ``hold`` seconds later:
  the session's private PostgreSQL cluster, or a private MariaDB server (tests/scenarios/servers.py), never
  the shared MariaDB at 3306.  The final recover waits out xasink's grace after a restart (RESTART_GRACE_S: a
  run that claimed before the restart counts as alive that long, to take its guard again).

An event starts at a time of the schedule, or ``start`` seconds after a writer reached a fault point (its
``anchor``, e.g. ``w0:driver.after_commits``: the writer reports the points it reaches, tests/scenarios/driver.py),
so it lands where it matters: between decision and apply, while branches' owners disconnect; its hold ends
after ``hold`` seconds, or once a writer reached the point ``until`` names (a lock held until the user's next
run has decided).  The interfering
sessions wait at most :data:`OWN_LOCK_WAIT_S` for their own locks.  :meth:`Interference.finish` ends every event
(locks released, defaults restored, the server up again) before the final recover.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Protocol

from tests.scenarios.model import (
    AFTER_DECISION,
    MODES,
    Event,
    Recover,
    Schedule,
    Writer,
    anchor_of,
    batch_rows,
    split_rows,
)
from tests.targets import MARIADB, Target
from xasink.protocol.liveness import RESTART_GRACE_S

KINDS = ("lock_table", "lock_rows", "lock_sink", "add_column", "require_column", "restart")
OWN_LOCK_WAIT_S = 5  # how long an interfering session waits for its own lock or DDL before giving up
SINKS_TABLE = "xasink_sinks"  # the decision log's sink table (the default journalPrefix)


class Restartable(Protocol):
    """A database server the schedule may kill and start again."""

    def alive(self) -> bool: ...

    def kill(self) -> None: ...

    def start_again(self) -> None: ...


@dataclass
class Place:
    """Where an event acts: the database, the sink's table there, and the server when it may be restarted."""

    target: Target
    table: str
    server: Restartable | None = None


@dataclass
class Interference:
    """Runs a schedule's events, each in a thread with its own connection; :meth:`finish` ends them all."""

    places: dict[str, Place]  # by Event.db ("" for a single-target schedule)
    sink: str
    notes: list[str] = field(default_factory=list)  # what each event did, for the report
    threads: list[threading.Thread] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    releases: list[tuple[Event, threading.Event]] = field(default_factory=list)  # each event's early end
    down: set[str] = field(default_factory=set)  # the databases killed and not started again yet
    outages: list[tuple[str, float, float | None]] = field(default_factory=list)  # (db, killed at, up again at)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self, event: Event) -> None:
        release = threading.Event()
        self.releases.append((event, release))
        thread = threading.Thread(target=self._run, args=(event, release), daemon=True, name=f"interfere-{event.kind}")
        thread.start()
        self.threads.append(thread)

    def reached(self, reached: dict[str, dict[str, float]]) -> None:
        """End the holds whose ``until`` point a writer reached (``reached``: each writer's points so far)."""
        for event, release in self.releases:
            if event.until is not None and not release.is_set():
                label, point = anchor_of(event.until)
                if point in reached.get(label, {}):
                    release.set()

    def busy(self) -> bool:
        return any(t.is_alive() for t in self.threads)

    def up(self) -> bool:
        """Every server is up (the runner's own reads wait for it)."""
        return not self.down

    def was_down(self, db: str, start: float, end: float) -> bool:
        """Whether ``db``'s server was down at some time between ``start`` and ``end`` (monotonic)."""
        return any(d == db and down <= end and (up is None or up >= start) for d, down, up in self.outages)

    def after_restarts(self) -> None:
        """Wait out xasink's grace after a server restart (a run that claimed before it counts as alive for
        RESTART_GRACE_S, to take its guard again): only then may the final recover judge every run dead."""
        ups = [up for _, _, up in self.outages if up is not None]
        if ups:
            time.sleep(max(0.0, max(ups) + RESTART_GRACE_S + 1.0 - time.monotonic()))

    def finish(self, timeout: float = 120.0) -> None:
        """End every event now: cut the holds short, wait for the threads (a restart starts its server again)."""
        self.stop.set()
        for _, release in self.releases:
            release.set()
        deadline = time.monotonic() + timeout
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        for db in sorted(self.down):  # a thread that could not start its server again: try once more here
            server = self.places[db].server
            if server is not None:
                server.start_again()
                self.down.discard(db)
                self.outages.append((db, time.monotonic(), time.monotonic()))
        if any(t.is_alive() for t in self.threads):
            raise RuntimeError(f"interference threads still running after {timeout:.0f}s: {self.notes}")

    def note(self, event: Event, what: str) -> None:
        with self._lock:
            self.notes.append(f"{event.kind}{' on ' + event.db if event.db else ''}: {what}"[:400])

    # -- the events -------------------------------------------------------------------------------
    def _run(self, event: Event, release: threading.Event) -> None:
        place = self.places[event.db]
        t0 = time.monotonic()
        try:
            getattr(self, f"_{event.kind}")(event, place, release)
            self.note(event, f"done ({time.monotonic() - t0:.1f}s)")
        except Exception as exc:  # noqa: BLE001 - an interference that could not act is reported, not judged
            self.note(event, f"{type(exc).__name__}: {exc}".replace("\n", " "))

    def _session(self, place: Place, cur: Any) -> None:
        """The interfering session's own lock waits, bounded."""
        if place.target.kind == MARIADB:
            cur.execute(
                f"SET SESSION innodb_lock_wait_timeout = {OWN_LOCK_WAIT_S}, lock_wait_timeout = {OWN_LOCK_WAIT_S}"
            )
        else:
            cur.execute(f"SET lock_timeout = '{OWN_LOCK_WAIT_S}s'")

    def _hold(
        self, event: Event, place: Place, release: threading.Event, statements: list[str], end: str, *params: Any
    ) -> None:
        with place.target.connect() as conn, conn.cursor() as cur:
            self._session(place, cur)
            for statement in statements:
                cur.execute(statement, params if "%s" in statement else None)
            release.wait(event.hold)
            cur.execute(end)

    def _lock_table(self, event: Event, place: Place, release: threading.Event) -> None:
        q = place.target.q(place.table)
        if place.target.kind == MARIADB:
            self._hold(event, place, release, [f"LOCK TABLES {q} READ"], "UNLOCK TABLES")
        else:
            self._hold(event, place, release, ["BEGIN", f"LOCK TABLE {q} IN SHARE MODE"], "ROLLBACK")

    def _lock_rows(self, event: Event, place: Place, release: threading.Event) -> None:
        lock = f"SELECT id FROM {place.target.q(place.table)} FOR UPDATE"
        self._hold(event, place, release, ["BEGIN", lock], "ROLLBACK")

    def _lock_sink(self, event: Event, place: Place, release: threading.Event) -> None:
        lock = f"SELECT sink_id FROM {place.target.q(SINKS_TABLE)} WHERE sink_id = %s FOR UPDATE"
        self._hold(event, place, release, ["BEGIN", lock], "ROLLBACK", self.sink)

    def _add_column(self, event: Event, place: Place, release: threading.Event) -> None:
        with place.target.connect() as conn, conn.cursor() as cur:
            self._session(place, cur)
            cur.execute(f"ALTER TABLE {place.target.q(place.table)} ADD COLUMN x{uuid.uuid4().hex[:6]} int NULL")

    def _require_column(self, event: Event, place: Place, release: threading.Event) -> None:
        q, column = place.target.q(place.table), f"r{uuid.uuid4().hex[:6]}"
        with place.target.connect() as conn, conn.cursor() as cur:
            self._session(place, cur)
            cur.execute(f"ALTER TABLE {q} ADD COLUMN {column} int NOT NULL DEFAULT 0")
            cur.execute(f"ALTER TABLE {q} ALTER COLUMN {column} DROP DEFAULT")
        release.wait(event.hold)
        deadline = time.monotonic() + 60
        while True:  # the table must take rows again: retried past other sessions' locks
            try:
                with place.target.connect() as conn, conn.cursor() as cur:
                    self._session(place, cur)
                    cur.execute(f"ALTER TABLE {q} ALTER COLUMN {column} SET DEFAULT 0")
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def _restart(self, event: Event, place: Place, release: threading.Event) -> None:
        server = place.server
        if server is None:
            self.note(event, "skipped: no server of the test's own to restart")
            return
        self.down.add(event.db)
        outage = len(self.outages)
        self.outages.append((event.db, time.monotonic(), None))
        try:
            server.kill()
            release.wait(event.hold)
        finally:
            server.start_again()
            self.outages[outage] = (event.db, self.outages[outage][1], time.monotonic())
            self.down.discard(event.db)


@dataclass
class Anchored:
    """What starts once a writer reaches a fault point (or at a time of the schedule): an event or a recover."""

    item: Any  # an Event, a Recover or a multi-target schedule's MultiRecover (``start``, ``anchor``)
    due: float | None = None  # monotonic, once known


def due_items(
    items: list[Anchored], t0: float, reached: dict[str, dict[str, float]], ended: set[str], dropped: list[str]
) -> list[Any]:
    """The items due now, removed from ``items``: ``reached`` is each writer's fault points and when it reached
    them; an item whose writer ended without reaching its point is removed too, and noted in ``dropped``."""
    now, due = time.monotonic(), []
    for a in list(items):
        if a.due is None:
            if a.item.anchor is None:
                a.due = t0 + a.item.start
            else:
                label, point = anchor_of(a.item.anchor)
                if point in reached.get(label, {}):
                    a.due = reached[label][point] + a.item.start
                elif label in ended:
                    what = a.item.kind if isinstance(a.item, Event) else "recover"
                    dropped.append(f"{what} not started: {a.item.anchor} never reached")
                    items.remove(a)
                    continue
        if a.due is not None and a.due <= now:
            items.remove(a)
            due.append(a.item)
    return due


# --------------------------------------------------------------------------- the schedules


def _anchor(rng: random.Random, writers: list[Writer], among: tuple[str, ...] = ()) -> str:
    """A fault point of a writer to start from (one of ``among``, if given), added to its spec as a pause of 0 s
    if it names none."""
    w = rng.choice(writers)
    named = [item.split(":")[0] for item in (w.fault or "").split(",") if item]
    points = [p for p in named if p.startswith("driver.")]
    if among or not points or rng.random() < 0.3:
        full = [p for p, rows in enumerate(w.partitions) if rows]
        choices = among or ("task.after_prepare", "driver.before_decide", *AFTER_DECISION)
        choices = tuple(p for p in choices if full or not p.startswith("task.")) or ("driver.before_decide",)
        point = rng.choice(choices)
        if point not in named:  # a pause of 0 s: the writer reports the point and goes on
            item = f"{point}:sleep=0" + (f":p={full[0]}" if point.startswith("task.") else "")
            w.fault = f"{w.fault},{item}" if w.fault else item
        points = [point]
    return f"{w.label}:{rng.choice(points)}"


def _writer_fault(rng: random.Random) -> str | None:
    """Mostly a pause between decision and apply (where a lock, a migration or a trim hurts most), some kills
    after the decision, some none."""
    roll = rng.random()
    if roll < 0.3:
        return None
    if roll < 0.75:
        point = rng.choice(
            ("driver.before_decide", "driver.after_decide", "driver.after_commits", "driver.after_commits")
        )
        return f"{point}:sleep={rng.choice((0.5, 1.5, 3.0, 6.0))}"
    return f"{rng.choice(AFTER_DECISION)}:kill"


def draw_interfere(seed: int, mode: str | None = None) -> Schedule:
    """Two or three runs of one sink (most the user's runs one after another, some at once), the writers'
    timeouts and ``journalRetention`` drawn, a statement timeout the target imposes on some, and one to three
    events of interference, most anchored at a writer's pause between its decision and its apply."""
    rng = random.Random(seed ^ 0x37)
    mode = mode or MODES[seed % len(MODES)]
    seqs = rng.sample(range(1, 10_000), 40)
    options: dict[str, Any] = {"commitTimeout": rng.choice((4, 8))}
    options["lockTimeout"] = options["controlLockTimeout"] = rng.choice((1, 4))
    if rng.random() < 0.4:
        options["journalRetention"] = 1  # every committed batch trims the log: compaction during runs
    if rng.random() < 0.25:
        options["statementTimeoutMs"] = rng.choice((300, 1500))
    writers: list[Writer] = []
    batch = rng.randint(1, 3)
    for i in range(rng.randint(2, 3)):
        label = f"w{i}"
        if i and rng.random() < 0.8:
            batch += 1  # the user's next batch
        elif i and rng.random() < 0.5:
            batch = max(1, batch - 1)  # an older id after a newer one: batch ids in any order
        w = Writer(label, batch, split_rows(rng, batch_rows(rng, mode, i, label, seqs)), _writer_fault(rng), 0.0)
        if i and rng.random() < 0.6:
            w.after, w.start = f"w{i - 1}", rng.choice((0.0, 0.5, 2.0))
        elif i:
            w.start = round(rng.uniform(0.0, 3.0), 2)
        writers.append(w)
    events = []
    for _ in range(rng.choice((1, 1, 2, 3))):
        kind = rng.choice(KINDS + ("lock_table", "lock_rows", "lock_sink", "require_column"))
        hold = {"add_column": 0.0, "restart": rng.choice((0.5, 1.5, 3.0))}.get(kind, rng.choice((1.5, 4.0, 7.0, 12.0)))
        if kind == "restart" and rng.random() < 0.6:  # while branches' owners disconnect, or XA COMMIT waits on them
            events.append(Event(kind, 0.0, hold, _anchor(rng, writers, ("task.after_prepare", "driver.after_decide"))))
        elif rng.random() < 0.7:
            events.append(Event(kind, rng.choice((0.0, 0.2, 1.0)), hold, _anchor(rng, writers)))
        else:
            events.append(Event(kind, round(rng.uniform(0.0, 4.0), 2), hold))
    recovers = []
    for _ in range(rng.choice((0, 1, 1, 2))):
        r = Recover(round(rng.uniform(0.5, 8.0), 2), rng.choice((None, None, 100, 1000)))
        if rng.random() < 0.3:
            r.fault = f"driver.apply_statements:sleep={rng.choice((0.5, 2.0))}"
        if rng.random() < 0.4:
            r.anchor, r.start = _anchor(rng, writers), rng.choice((0.0, 0.5, 2.0))
        recovers.append(r)
    return Schedule(seed, mode, writers, recovers, kind="interfere", events=events, options=options)


def restarts(schedule: Schedule | Any) -> bool:
    """Whether the schedule kills a database server (MariaDB: it must run on a private server)."""
    return any(e.kind == "restart" for e in schedule.events)
