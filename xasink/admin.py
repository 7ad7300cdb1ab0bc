"""The operator's view: what is prepared on a server, what xasink will do with it, and per-sink status.

Used by ``xasink recover`` / ``xasink status`` and importable as
``xasink.recover(...)`` / ``xasink.status(...)``.  Acting always goes through
:meth:`Coordinator.recover`, so the serialization of DESIGN invariant 4
holds here too.  A branch is acted on only when its sink is registered in
this decision log: a sink whose log lives elsewhere (another schema or
database) is reported and left alone, like a foreign transaction.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from .coordinator import (  # noqa: F401 - re-exported for the CLI
    COMMIT,
    ROLLBACK_ORPHAN,
    ROLLBACK_UNDECIDED,
    WAIT,
    Coordinator,
    age_seconds,
    branch_action,
)
from .dialects import Dialect, PreparedTxn, dialect_for
from .errors import OptionError
from .journal import BatchRecord, Journal
from .options import TableName, WriteOptions, parse_url

log = logging.getLogger(__name__)

IGNORE_FOREIGN = "ignore"  # not ours: never touched
IGNORE_UNKNOWN_SINK = "ignore-unknown-sink"  # ours, but its sink is not in this decision log
ROLLBACK_FOREIGN = "rollback-foreign"  # named explicitly by the operator
DEFAULT_OLDER_THAN_S = 600.0


@dataclass
class PreparedEntry:
    gid: str
    ours: bool
    sink_id: str | None
    batch_id: int | None
    partition: int | None
    attempt: str | None
    age_s: float | None
    database: str | None
    owner: str | None
    decision: str  # decided / undecided / orphan / foreign / unknown-sink
    action: str
    outcome: str = "planned"  # planned / done / still-prepared / failed: <why>


@dataclass
class RecoverReport:
    url: str  # password masked
    dry_run: bool
    older_than_s: float
    entries: list[PreparedEntry] = field(default_factory=list)
    finished_batches: dict[str, list[int]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    def stale(self) -> list[PreparedEntry]:
        """Ours, older than the threshold (or of unknown age), and still prepared."""
        return [
            e
            for e in self.entries
            if e.ours and e.outcome != "done" and e.action != WAIT and (e.age_s is None or e.age_s >= self.older_than_s)
        ]

    @property
    def exit_code(self) -> int:
        if self.errors:
            return 2
        return 1 if self.stale() else 0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["exit_code"] = self.exit_code
        return d


@dataclass
class SinkStatus:
    sink_id: str
    last_committed_batch: int | None
    in_doubt_batches: list[int]
    prepared_branches: int
    oldest_prepared_age_s: float | None
    recent: list[dict[str, Any]]


@dataclass
class StatusReport:
    url: str
    sinks: list[SinkStatus]
    foreign_prepared: int
    older_than_s: float

    @property
    def exit_code(self) -> int:
        for s in self.sinks:
            if s.in_doubt_batches or (s.prepared_branches and (s.oldest_prepared_age_s or 0) >= self.older_than_s):
                return 1
        return 0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["exit_code"] = self.exit_code
        return d


def _coordinator(dialect: Dialect, url_options: WriteOptions, sink_id: str) -> Coordinator:
    return Coordinator(replace(url_options, sink_id=sink_id, sink_id_given=True), dialect)


def _base_options(url: str, journal_schema: str | None, journal_prefix: str) -> WriteOptions:
    parsed = parse_url(url)
    return WriteOptions(
        url=parsed,
        table=TableName("-"),
        sink_id="admin",
        sink_id_given=True,
        batch_id=0,
        journal_schema=journal_schema,
        journal_prefix=journal_prefix,
    )


def _masked(options: WriteOptions) -> str:
    return options.url.render_as_string(hide_password=True)


def _survey(
    dialect: Dialect, journal: Journal, sink_filter: str | None, older_than_s: float, rollback_foreign: set[str]
) -> tuple[list[PreparedEntry], dict[str, list[BatchRecord]], bool]:
    with dialect.connect() as conn:
        has_journal = journal.exists(conn)
        prepared: list[PreparedTxn] = dialect.list_prepared(conn)
        now: Any = conn.exec_driver_sql("SELECT CURRENT_TIMESTAMP").scalar()
        known_sinks = set(journal.sink_ids(conn)) if has_journal else set()
        pending: dict[str, list[BatchRecord]] = {}
        decisions: dict[tuple[str, int], BatchRecord] = {}
        if has_journal:
            for rec in journal.pending(conn, sink_filter):
                pending.setdefault(rec.sink_id, []).append(rec)
            by_sink: dict[str, set[int]] = {}
            for p in prepared:
                if p.xid is not None:
                    by_sink.setdefault(p.xid.sink_id, set()).add(p.xid.batch_id)
            for sink, batches in by_sink.items():
                for b, rec in journal.get_many(conn, sink, batches).items():
                    decisions[(sink, b)] = rec
    entries = []
    for p in prepared:
        age = age_seconds(now, p.prepared_at)
        x = p.xid
        if x is None:
            action = ROLLBACK_FOREIGN if p.gid in rollback_foreign else IGNORE_FOREIGN
            entries.append(
                PreparedEntry(p.gid, False, None, None, None, None, age, p.database, p.owner, "foreign", action)
            )
            continue
        if sink_filter is not None and x.sink_id != sink_filter:
            continue
        decision = decisions.get((x.sink_id, x.batch_id))
        if x.sink_id not in known_sinks:
            state, action = "unknown-sink", IGNORE_UNKNOWN_SINK
        else:
            action = branch_action(x, decision, age, older_than_s)
            state = "undecided" if decision is None else ("decided" if action == COMMIT else "orphan")
        entries.append(
            PreparedEntry(
                p.gid, True, x.sink_id, x.batch_id, x.partition, x.attempt, age, p.database, p.owner, state, action
            )
        )
    return entries, pending, has_journal


def recover(
    url: str,
    *,
    sink_id: str | None = None,
    older_than_s: float = DEFAULT_OLDER_THAN_S,
    dry_run: bool = False,
    journal_schema: str | None = None,
    journal_prefix: str = "xasink_",
    rollback_foreign: tuple[str, ...] = (),
) -> RecoverReport:
    """List every prepared transaction, plan what recovery does with each, and (unless ``dry_run``) do it."""
    base = _base_options(url, journal_schema, journal_prefix)
    report = RecoverReport(_masked(base), dry_run, older_than_s)
    dialect = dialect_for(base.url)
    journal = Journal(dialect, journal_schema, journal_prefix)
    try:
        entries, pending, has_journal = _survey(dialect, journal, sink_id, older_than_s, set(rollback_foreign))
        report.entries = entries
        missing = set(rollback_foreign) - {e.gid for e in entries if not e.ours}
        if missing:
            report.errors.append(f"--rollback-foreign: no foreign prepared transaction named {sorted(missing)}")
        if not has_journal and any(e.ours for e in entries):
            report.errors.append(
                f"decision log {journal.batches.fullname} not found: xasink branches are prepared but their decisions "
                "cannot be read, so nothing of ours is touched; pass --journal-schema / --journal-prefix as the "
                "writers used them"
            )
            for e in entries:
                if e.ours:
                    e.action = IGNORE_UNKNOWN_SINK
        if dry_run:
            return report
        sinks = {e.sink_id for e in entries if e.ours and e.action in (COMMIT, ROLLBACK_ORPHAN, ROLLBACK_UNDECIDED)}
        sinks |= set(pending)
        for sink in sorted(s for s in sinks if s is not None):
            coordinator = _coordinator(dialect, base, sink)
            try:
                result = coordinator.recover(min_age_s=older_than_s)
                if result.finished_batches:
                    report.finished_batches[sink] = result.finished_batches
            except Exception as exc:  # noqa: BLE001 - reported per sink; the others still run
                report.errors.append(f"sink {sink}: {exc}")
        for e in entries:
            if e.action == ROLLBACK_FOREIGN:
                log.warning("rolling back FOREIGN prepared transaction %s on explicit request", e.gid)
                try:
                    with dialect.connect(autocommit=True) as xa:
                        dialect.rollback_foreign(xa, e.gid)
                except Exception as exc:  # noqa: BLE001
                    report.errors.append(f"rollback of foreign {e.gid}: {exc}")
        with dialect.connect() as conn:
            still = {p.gid for p in dialect.list_prepared(conn)}
        for e in entries:
            if e.action in (COMMIT, ROLLBACK_ORPHAN, ROLLBACK_UNDECIDED, ROLLBACK_FOREIGN):
                e.outcome = "still-prepared" if e.gid in still else "done"
            elif e.action == WAIT:
                e.outcome = "waiting"
            else:
                e.outcome = "untouched"
        return report
    finally:
        dialect.dispose()


def status(
    url: str,
    *,
    sink_id: str | None = None,
    journal_schema: str | None = None,
    journal_prefix: str = "xasink_",
    older_than_s: float = DEFAULT_OLDER_THAN_S,
    recent: int = 5,
) -> StatusReport:
    """Per sink: last committed batch, batches in doubt, prepared branches, recent figures."""
    base = _base_options(url, journal_schema, journal_prefix)
    dialect = dialect_for(base.url)
    journal = Journal(dialect, journal_schema, journal_prefix)
    try:
        entries, pending, has_journal = _survey(dialect, journal, sink_id, older_than_s, set())
        sinks: set[str] = {e.sink_id for e in entries if e.ours and e.sink_id} | set(pending)
        out = []
        with dialect.connect() as conn:
            if has_journal:
                sinks |= set(journal.sink_ids(conn)) if sink_id is None else {sink_id}
            for sink in sorted(sinks):
                records = journal.recent(conn, sink, 1000) if has_journal else []
                committed = [r.batch_id for r in records if r.committed]
                mine = [e for e in entries if e.ours and e.sink_id == sink]
                ages = [e.age_s for e in mine if e.age_s is not None]
                out.append(
                    SinkStatus(
                        sink_id=sink,
                        last_committed_batch=max(committed) if committed else None,
                        in_doubt_batches=sorted(r.batch_id for r in pending.get(sink, [])),
                        prepared_branches=len(mine),
                        oldest_prepared_age_s=max(ages) if ages else None,
                        recent=[
                            {
                                "batch_id": r.batch_id,
                                "state": r.state,
                                "rows": r.rows,
                                "branches": r.branches,
                                "prepare_ms": r.prepare_ms,
                                "commit_ms": r.commit_ms,
                                "decided_at": r.decided_at.isoformat() if r.decided_at else None,
                            }
                            for r in sorted(records, key=lambda r: r.batch_id, reverse=True)[:recent]
                        ],
                    )
                )
        return StatusReport(_masked(base), out, sum(1 for e in entries if not e.ours), older_than_s)
    finally:
        dialect.dispose()


def parse_duration(text: str) -> float:
    """'90s', '10m', '2h', '1d' or plain seconds."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    t = text.strip().lower()
    try:
        if t and t[-1] in units:
            return float(t[:-1]) * units[t[-1]]
        return float(t)
    except ValueError:
        raise OptionError(f"invalid duration {text!r}; use e.g. 90s, 10m, 2h") from None
