"""``xasink status``: per-sink state of the decision log, prepared branches, and what on-call alerts on.

Reads only.  Every age is the server's clock in UTC (the clock that stamped the decision log), never the
client's.  Health figures: the oldest prepared branch of this decision log (foreign ones and other logs'
counted apart), prepared transactions against PostgreSQL's ``max_prepared_transactions``, sessions blocked by a
prepared transaction, each sink's last commit and its age, and decided batches not yet all committed.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa

from xasink.database_url import parse_url
from xasink.dialects import Dialect
from xasink.journal.log import Journal
from xasink.journal.parts import recorded_targets
from xasink.ops import alerts as health
from xasink.ops.common import (
    base_options,
    check_threshold,
    dialect_of,
    journal_of,
    known_sinks,
    masked_url,
    missing_log,
    missing_sink,
    on_server,
    server_error,
)
from xasink.ops.survey import DEFAULT_OLDER_THAN_S, PreparedEntry, survey_prepared
from xasink.protocol.judgement import WAIT


@dataclass
class SinkStatus:
    sink_id: str
    last_committed_batch: int | None
    in_doubt_batches: list[int]  # decided, not yet all committed
    prepared_branches: int
    oldest_prepared_age_s: float | None  # None: nothing prepared, or the server gives no age (MySQL)
    stale: int  # in-doubt batches and prepared branches older than the threshold (unknown age counts as old)
    recent: list[dict[str, Any]]
    last_committed_at: str | None = None  # the latest commit of the sink (UTC, ISO 8601)
    last_committed_age_s: float | None = None
    in_doubt: list[dict[str, Any]] = field(default_factory=list)  # batch_id, decided_at, age_s


@dataclass
class StatusReport:
    url: str  # password masked
    sinks: list[SinkStatus]
    foreign_prepared: int
    older_than_s: float
    errors: list[str] = field(default_factory=list)
    other_log_prepared: int = 0  # xasink branches of other decision logs on this server: never touched from here
    server: str = ""  # host:port, for labels
    database: str = ""
    server_time_utc: str | None = None
    prepared_branches: int = 0  # of this decision log
    oldest_prepared_age_s: float | None = None  # of this decision log's branches whose age is known
    prepared_age_unknown: int = 0  # of this decision log's branches: MySQL gives no age and no claim dates them
    foreign_oldest_age_s: float | None = None
    prepared_on_server: int = 0  # every prepared transaction the limit counts (PostgreSQL: the whole cluster)
    max_prepared_transactions: int | None = None  # None: the server has no such limit (MySQL, MariaDB)
    blocked_sessions: list[dict[str, Any]] | None = None  # None: the lock waits could not be read
    in_doubt_batches: int = 0
    notes: list[str] = field(default_factory=list)
    thresholds: health.Thresholds = field(default_factory=health.Thresholds)
    # why xasink cannot write on this server at all (max_prepared_transactions = 0, a read-only server): CRITICAL
    write_blockers: list[str] = field(default_factory=list)

    @property
    def prepared_ratio(self) -> float | None:
        if not self.max_prepared_transactions:
            return None
        return self.prepared_on_server / self.max_prepared_transactions

    def checks(self) -> list[health.Check]:
        return health.evaluate(self)

    @property
    def state(self) -> str:
        return health.state_of(self.checks())

    @property
    def exit_code(self) -> int:
        """0 OK, 1 WARNING (a warn threshold, or anything in doubt or prepared for ``older_than_s``), 2 CRITICAL,
        3 UNKNOWN (something could not be read)."""
        return health.EXIT_CODES[self.state]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        checks = self.checks()
        d["prepared_ratio"] = self.prepared_ratio
        d["checks"] = health.to_dicts(checks)
        d["state"] = health.state_of(checks)
        d["exit_code"] = health.EXIT_CODES[d["state"]]
        return d


def _seconds(delta: timedelta) -> float:
    return max(0.0, delta.total_seconds())


def _iso(value: datetime | None) -> str | None:
    """A time of the log in whole seconds on every database (MariaDB's DATETIME keeps no more; ages stay exact)."""
    return value.isoformat(timespec="seconds") if value is not None else None


def status(
    url: str,
    *,
    sink_id: str | None = None,
    journal_schema: str | None = None,
    journal_prefix: str = "xasink_",
    older_than_s: float = DEFAULT_OLDER_THAN_S,
    recent: int = 5,
    thresholds: health.Thresholds | None = None,
    journal_url: str | None = None,
) -> StatusReport:
    """Per sink: last committed batch, batches in doubt, prepared branches, recent figures; and the server's
    health figures (see the module doc).  Reads only."""
    check_threshold(older_than_s)
    base = base_options(url, journal_schema, journal_prefix)
    dialect = dialect_of(base)
    journal: Journal = journal_of(dialect, journal_url, journal_schema, journal_prefix)  # elsewhere: a transaction's
    with on_server(dialect, journal):
        entries, pending, has_journal = survey_prepared(dialect, journal, sink_id, older_than_s, set())
        report = StatusReport(
            masked_url(base),
            [],
            sum(1 for e in entries if e.decision == "foreign"),
            older_than_s,
            other_log_prepared=sum(1 for e in entries if e.decision == "other-log"),
            server=f"{base.url.host or 'localhost'}:{base.url.port or dialect.default_port}",
            database=base.url.database or "",
            thresholds=thresholds or health.Thresholds(),
        )
        report.errors += _log_errors(journal, journal_url or url, sink_id)
        ours = [e for e in entries if e.ours]
        ages = [e.age_s for e in ours if e.age_s is not None]
        foreign_ages = [e.age_s for e in entries if e.decision == "foreign" and e.age_s is not None]
        report.prepared_branches = len(ours)
        report.oldest_prepared_age_s = max(ages) if ages else None
        report.prepared_age_unknown = len(ours) - len(ages)
        report.foreign_oldest_age_s = max(foreign_ages) if foreign_ages else None
        sinks: set[str] = {e.sink_id for e in ours if e.sink_id} | set(pending)
        with dialect.connect() as conn:
            report.prepared_on_server, report.max_prepared_transactions = dialect.prepared_capacity(conn)
            report.write_blockers = dialect.write_blockers(conn)
        with journal.dialect.connect() as conn:
            now = journal.dialect.server_now(conn)  # decided_at and committed_at are stamped by this clock, in UTC
            report.server_time_utc = _iso(now)
            if has_journal:
                registered = set(journal.sink_ids(conn))
                sinks |= registered if sink_id is None else {sink_id} & registered
            for sink in sorted(sinks):
                records = journal.recent(conn, sink, 1000) if has_journal else []
                shown = sorted(records, key=lambda r: r.batch_id, reverse=True)[:recent]
                targets = {r.batch_id: recorded_targets(journal.target_of(conn, sink, r.batch_id)[1]) for r in shown}
                report.sinks.append(
                    _sink_status(sink, records, ours, pending.get(sink, []), now, older_than_s, recent, targets)
                )
        report.in_doubt_batches = sum(len(s.in_doubt_batches) for s in report.sinks)
        report.blocked_sessions = _blocked(dialect, entries, report)
        return report


def _log_errors(journal: Journal, log_url: str, sink_id: str | None) -> list[str]:
    """What a status check cannot read, so it must say UNKNOWN: no decision log (a typo in the prefix or
    schema, the wrong database), or a ``--sink-id`` the log does not hold."""
    sinks = known_sinks(journal)
    if sinks is None:
        return [missing_log(journal, parse_url(log_url).database)]
    if sink_id is not None and sink_id not in sinks:
        return [missing_sink(journal, sink_id, sinks)]
    return []


def _sink_status(
    sink: str,
    records: list[Any],
    ours: list[PreparedEntry],
    doubt: list[Any],
    now: Any,
    older_than_s: float,
    recent: int,
    targets: dict[int, Any],
) -> SinkStatus:
    committed = [r for r in records if r.committed]
    mine = [e for e in ours if e.sink_id == sink]
    ages = [e.age_s for e in mine if e.age_s is not None]
    stale = sum(1 for e in mine if e.action != WAIT and (e.age_s is None or e.age_s >= older_than_s))
    stale += sum(1 for r in doubt if r.decided_at is None or _seconds(now - r.decided_at) >= older_than_s)
    stamped = [r.committed_at for r in committed if r.committed_at is not None]
    last_at = max(stamped) if stamped else None
    return SinkStatus(
        sink_id=sink,
        last_committed_batch=max(r.batch_id for r in committed) if committed else None,
        in_doubt_batches=sorted(r.batch_id for r in doubt),
        prepared_branches=len(mine),
        oldest_prepared_age_s=max(ages) if ages else None,
        stale=stale,
        recent=[
            {
                "batch_id": r.batch_id,
                "state": r.state,
                "rows": r.rows,
                "branches": r.branches,
                "prepare_ms": r.prepare_ms,
                "commit_ms": r.commit_ms,
                "decided_at": _iso(r.decided_at),
                "targets": targets.get(r.batch_id),  # a multi-target transaction's databases and tables (None: one)
            }
            for r in sorted(records, key=lambda r: r.batch_id, reverse=True)[:recent]
        ],
        last_committed_at=_iso(last_at),
        last_committed_age_s=_seconds(now - last_at) if last_at is not None else None,
        in_doubt=[
            {
                "batch_id": r.batch_id,
                "decided_at": _iso(r.decided_at),
                "age_s": _seconds(now - r.decided_at) if r.decided_at is not None else None,
            }
            for r in sorted(doubt, key=lambda r: r.batch_id)
        ],
    )


def _blocked(dialect: Dialect, entries: list[PreparedEntry], report: StatusReport) -> list[dict[str, Any]] | None:
    """Sessions blocked by a prepared transaction, with whose it is where the server says (PostgreSQL's gid).

    Read on its own connection: a user without the rights (MySQL: PROCESS for INNODB_TRX) still gets the rest
    of the report, with a note; a threshold on blocked sessions then gives UNKNOWN.
    """
    ours = {e.gid: e for e in entries if e.ours}
    try:
        with dialect.connect() as conn:
            sessions = dialect.blocked_by_prepared(conn)
    except sa.exc.DBAPIError as exc:
        report.notes.append(f"sessions blocked by prepared transactions not readable: {server_error(exc, dialect)}")
        return None
    out = []
    for b in sessions:
        row = asdict(b)
        row["blockers"] = list(b.blockers)
        # PostgreSQL names the gid, so whose it is is known; InnoDB names only its transaction id (None: unknown)
        by_gid = bool(b.blockers) and not any(g.startswith("innodb-trx:") for g in b.blockers)
        row["blocker_ours"] = any(g in ours for g in b.blockers) if by_gid else None
        row["sinks"] = sorted({ours[g].sink_id or "" for g in b.blockers if g in ours})
        out.append(row)
    return out
