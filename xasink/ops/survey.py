"""The operator's view: what is prepared on a server, what xasink will do with it, and per-sink status.

Used by ``xasink recover`` (and ``xasink status``, in :mod:`xasink.ops.status`) and importable as
``xasink.recover(...)``.  Acting always goes through
:meth:`Coordinator.recover`, so the serialization of DESIGN invariant 4
holds here too.  A branch is acted on only when its sink is registered in
this decision log: a sink whose log lives elsewhere (another schema or
database) is reported and left alone, like a foreign transaction.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from xasink.database_url import parse_url
from xasink.dialects import Dialect, PreparedTxn
from xasink.errors import OptionError
from xasink.journal.log import Journal
from xasink.journal.records import BatchRecord
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
    redacted_error,
)
from xasink.options import WriteOptions
from xasink.protocol.coordinator import Coordinator
from xasink.protocol.judgement import (
    COMMIT,
    IGNORE_FOREIGN,
    IGNORE_OTHER_LOG,
    IGNORE_UNKNOWN_SINK,
    ROLLBACK_ORPHAN,
    ROLLBACK_UNDECIDED,
    WAIT,
    judge,
)
from xasink.protocol.renamed_overwrite import sweep_witnesses
from xasink.protocol.xid import Xid
from xasink.support.masking import redact, url_secrets

log = logging.getLogger(__name__)

ROLLBACK_FOREIGN = "rollback-foreign"  # named explicitly by the operator
DEFAULT_OLDER_THAN_S = 600.0


@dataclass
class PreparedEntry:
    gid: str
    ours: bool  # a branch of this decision log (another log's has decision "other-log" and is not ours)
    sink_id: str | None
    batch_id: int | None
    partition: int | None
    attempt: str | None
    age_s: float | None
    database: str | None
    owner: str | None
    decision: str  # decided / undecided / orphan / foreign / unknown-sink / other-log
    action: str
    outcome: str = "planned"  # planned / done / still-prepared / failed: <why>
    log_id: str | None = None  # the decision log the branch belongs to (from its xid)


@dataclass
class RecoverReport:
    url: str  # password masked
    dry_run: bool
    older_than_s: float
    entries: list[PreparedEntry] = field(default_factory=list)
    finished_batches: dict[str, list[int]] = field(default_factory=dict)
    # decided batches that could not be finished yet, per sink: batch -> what blocked it (they stay decided)
    unfinished: dict[str, dict[int, str]] = field(default_factory=dict)
    # per sink, the old tables of renamed overwrites dropped (left by a run killed after the batch's mark)
    dropped: dict[str, list[str]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    acted: bool = False  # False for a dry run, and when planning found errors (then nothing was changed)
    warnings: list[str] = field(default_factory=list)  # why xasink cannot write on this server (nothing to recover)

    def stale(self) -> list[PreparedEntry]:
        """Ours, older than the threshold (or of unknown age), and still prepared."""
        return [
            e
            for e in self.entries
            if e.ours
            and e.outcome not in ("done", "gone")
            and e.action != WAIT
            and (e.age_s is None or e.age_s >= self.older_than_s)
        ]

    @property
    def exit_code(self) -> int:
        if self.errors:
            return 2
        return 1 if self.stale() or self.unfinished else 0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["exit_code"] = self.exit_code
        return d


def _coordinator(dialect: Dialect, url_options: WriteOptions, sink_id: str, journal: Journal) -> Coordinator:
    return Coordinator(replace(url_options, sink_id=sink_id, sink_id_given=True), dialect, journal)


def survey_prepared(
    dialect: Dialect, journal: Journal, sink_filter: str | None, older_than_s: float, rollback_foreign: set[str]
) -> tuple[list[PreparedEntry], dict[str, list[BatchRecord]], bool]:
    """Every prepared transaction with its judgement, the sinks' batches in doubt, and whether the log exists."""
    with dialect.connect() as tconn:
        prepared: list[PreparedTxn] = dialect.list_prepared(tconn)
        now: Any = dialect.server_now(tconn)
    with journal.dialect.connect() as conn:  # the log may live in another database (--journal-url)
        has_journal = journal.exists(conn)
        known_sinks = set(journal.sink_ids(conn)) if has_journal else set()
        log_id = journal.find_log_id(conn) if has_journal else None
        pending: dict[str, list[BatchRecord]] = {}
        if has_journal:
            for rec in journal.pending(conn, sink_filter):
                pending.setdefault(rec.sink_id, []).append(rec)
        # the one judgement recovery acts on (xasink.protocol.judgement): what is shown is what is done
        verdicts = judge(
            journal, conn, prepared, now, log_id, sinks=known_sinks, sink_id=sink_filter, min_age_s=older_than_s
        )
    entries = []
    for v in verdicts:
        p, x = v.txn, v.txn.xid
        if x is None:
            action = ROLLBACK_FOREIGN if p.gid in rollback_foreign else IGNORE_FOREIGN
            entries.append(
                PreparedEntry(p.gid, False, None, None, None, None, v.age_s, p.database, p.owner, v.state, action)
            )
            continue
        entries.append(
            PreparedEntry(
                p.gid,
                v.action != IGNORE_OTHER_LOG,
                x.sink_id,
                x.batch_id,
                x.partition,
                x.attempt,
                v.age_s,
                p.database,
                p.owner,
                v.state,
                v.action,
                log_id=x.log_id,
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
    rollback_foreign: tuple[str, ...] | list[str] = (),
    journal_url: str | None = None,
    retry_s: float | None = None,
) -> RecoverReport:
    """List every prepared transaction, plan what recovery does with each, and (unless ``dry_run``) do it.

    Problems found while planning (a missing decision log, a ``rollback_foreign`` name that is not a
    foreign prepared transaction) are reported in ``errors`` and nothing at all is changed: an operator's
    mistake must not half-run.  Problems while acting are reported per sink; the other sinks still run.
    With ``journal_url``, the branches in ``url``'s database are judged by the decision log in that other
    database (a multi-target transaction's): only branches carrying that log's id are touched.
    ``retry_s`` bounds how long a step that is not finished yet (a lock, a timeout) is retried (default
    commitTimeout's, 300 s); a decided batch still not finished then is reported in ``unfinished`` (exit 1).
    """
    check_threshold(older_than_s)
    base = base_options(url, journal_schema, journal_prefix)
    if retry_s is not None:
        check_threshold(retry_s)
        base = replace(base, commit_timeout=int(retry_s))
    report = RecoverReport(masked_url(base), dry_run, older_than_s)
    dialect = dialect_of(base)
    journal = journal_of(dialect, journal_url, journal_schema, journal_prefix)
    with on_server(dialect, journal):
        entries, pending, has_journal = survey_prepared(dialect, journal, sink_id, older_than_s, set(rollback_foreign))
        report.entries = entries
        report.errors += _check_foreign_names(entries, rollback_foreign)
        report.errors += _log_errors(journal, journal_url or url, sink_id, entries)
        with dialect.connect() as conn:
            report.warnings = [f"xasink cannot write here: {why}" for why in dialect.write_blockers(conn)]
        if dry_run:
            return report
        if report.errors:
            report.errors.append("nothing was changed")
            return report
        report.acted = True
        _act(dialect, base, report, pending, older_than_s, journal)
        _sweep_witnesses(dialect, base, report, journal, sink_id, journal_url is None)
        with dialect.connect() as conn:
            still = {p.gid for p in dialect.list_prepared(conn)}
        for e in report.entries:
            acted = e.action in (COMMIT, ROLLBACK_ORPHAN, ROLLBACK_UNDECIDED, ROLLBACK_FOREIGN)
            if e.gid not in still:
                e.outcome = "done" if acted else "gone"  # gone: finished meanwhile by its owner or a live batch
            elif acted:
                e.outcome = "still-prepared"
            else:
                e.outcome = "waiting" if e.action == WAIT else "untouched"
        return report


def _log_errors(journal: Journal, log_url: str, sink_id: str | None, entries: list[PreparedEntry]) -> list[str]:
    """Planning errors about the log itself: none at this schema and prefix (a typo, the wrong database: even
    with nothing prepared, a cron line that recovers nothing must not exit 0 forever), or a ``--sink-id`` it
    does not hold.  Without a log, xasink's branches are left alone: their decisions cannot be read."""
    sinks = known_sinks(journal)
    if sinks is None:
        why = missing_log(journal, parse_url(log_url).database)
        if any(e.ours for e in entries):
            why += (
                ". xasink branches are prepared but their decisions cannot be read, so none of them is touched (a "
                "decided branch must be committed, never rolled back); pass --journal-url when they belong to a "
                "multi-target transaction whose decision log is in another database (the log's id is in each "
                "branch's xid)"
            )
            for e in entries:
                if e.ours:
                    e.action = IGNORE_UNKNOWN_SINK
        return [why]
    if sink_id is not None and sink_id not in sinks:
        return [missing_sink(journal, sink_id, sinks)]
    return []


def _check_foreign_names(entries: list[PreparedEntry], names: tuple[str, ...] | list[str]) -> list[str]:
    errors = []
    ours = {e.gid for e in entries if e.decision != "foreign"}  # this log's or another xasink log's
    foreign = {e.gid for e in entries if e.decision == "foreign"}
    for gid in sorted(set(names) - foreign):
        if gid in ours or Xid.parse(gid) is not None:
            errors.append(
                f"--rollback-foreign {gid}: this is an xasink branch, not a foreign transaction; xasink's own "
                "branches are finished only by the decision log (a decided one must be committed)"
            )
        else:
            errors.append(f"--rollback-foreign {gid}: no foreign prepared transaction has this name")
    return errors


def _act(
    dialect: Dialect,
    base: WriteOptions,
    report: RecoverReport,
    pending: dict[str, list[BatchRecord]],
    older_than_s: float,
    journal: Journal,
) -> None:
    """Each sink through :meth:`Coordinator.recover` (its rule, under its sink lock), then the named foreign ones."""
    acting = (COMMIT, ROLLBACK_ORPHAN, ROLLBACK_UNDECIDED)
    sinks = {e.sink_id for e in report.entries if e.ours and e.sink_id and e.action in acting} | set(pending)
    for sink in sorted(sinks):
        try:
            result = _coordinator(dialect, base, sink, journal).recover(min_age_s=older_than_s)
            if result.finished_batches:
                report.finished_batches[sink] = result.finished_batches
            if result.unfinished:
                secrets = url_secrets(base.url)
                report.unfinished[sink] = {b: redact(why, secrets) for b, why in result.unfinished.items()}
        except Exception as exc:  # noqa: BLE001 - reported per sink; the others still run
            report.errors.append(f"sink {sink}: {redacted_error(exc, base)}")
    for e in report.entries:
        if e.action == ROLLBACK_FOREIGN:
            log.warning("rolling back FOREIGN prepared transaction %s on explicit request", e.gid)
            try:
                with dialect.connect(autocommit=True) as xa:
                    dialect.rollback_foreign(xa, e.gid)
            except Exception as exc:  # noqa: BLE001 - reported; the rest is done
                report.errors.append(f"rollback of foreign {e.gid}: {redacted_error(exc, base)}")


def _sweep_witnesses(
    dialect: Dialect, base: WriteOptions, report: RecoverReport, journal: Journal, sink_id: str | None, here: bool
) -> None:
    """Drop the old tables renamed overwrites left after their mark (a run killed there; MariaDB/MySQL), of every
    sink of the log (or ``sink_id``): a sink that never runs again must not keep a copy of what it overwrote."""
    swap = dialect.rename_swap()
    if swap is None or not here:
        return
    for sink in [sink_id] if sink_id else known_sinks(journal) or []:
        try:
            with dialect.connect() as conn:
                dropped = sweep_witnesses(journal, swap, conn, sink)
            if dropped:
                report.dropped[sink] = dropped
        except Exception as exc:  # noqa: BLE001 - reported per sink; the others still run
            report.errors.append(
                f"sink {sink}: an overwritten table's old copy not dropped: {redacted_error(exc, base)}"
            )


def parse_duration(text: str) -> float:
    """'90s', '10m', '2h', '1d' or plain seconds; 0 or more."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    t = text.strip().lower()
    try:
        value = float(t[:-1]) * units[t[-1]] if t and t[-1] in units else float(t)
    except ValueError:
        raise OptionError(f"invalid duration {text!r}; use e.g. 90s, 10m, 2h") from None
    if not value >= 0:
        raise OptionError(f"invalid duration {text!r}: must be 0 or more; use e.g. 0s, 90s, 10m, 2h")
    return value
