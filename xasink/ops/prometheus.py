"""``xasink status --prometheus``: the status report as metrics in Prometheus' text exposition format.

Written for node-exporter's textfile collector (write to a temporary file, then rename it into the collector's
directory).  Every metric is a gauge named ``xasink_...``; labels are the server (host:port), the database name
and, per sink, the sink id: never the URL, the user or a password.  A figure the server does not give (an age
MySQL does not know, PostgreSQL's limit on MySQL) is left out, not written as 0.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from xasink.ops import alerts as health

if TYPE_CHECKING:
    from xasink.ops.status import StatusReport

Sample = tuple[dict[str, str], float]


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    return repr(float(value)) if value != int(value) else str(int(value))


def _metric(name: str, help_text: str, samples: Iterable[Sample]) -> list[str]:
    lines = [f"# HELP xasink_{name} {help_text}", f"# TYPE xasink_{name} gauge"]
    for labels, value in samples:
        text = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
        lines.append(f"xasink_{name}{{{text}}} {_number(value)}")
    return lines


def render(report: StatusReport) -> str:
    """Every figure of ``report`` as metrics; ``xasink_up`` 1 and the health state as ``xasink_status_code``."""
    base = {"server": report.server, "database": report.database}
    state = report.state
    out: list[str] = []
    out += _metric("up", "1: xasink status connected and read the server; 0: it could not (see stderr).", [(base, 1)])
    out += _status_code(base, health.EXIT_CODES[state])
    out += _metric(
        "writable",
        "1: nothing server-wide stops xasink's writes; 0: they all fail (max_prepared_transactions = 0, read-only).",
        [(base, 0 if report.write_blockers else 1)],
    )
    by_owner = [
        ({**base, "owner": "this_log"}, report.prepared_branches),
        ({**base, "owner": "other_log"}, report.other_log_prepared),
        ({**base, "owner": "foreign"}, report.foreign_prepared),
    ]
    out += _metric("prepared_branches", "Prepared transactions seen from this database, by whose they are.", by_owner)
    if report.oldest_prepared_age_s is not None:
        out += _metric(
            "prepared_oldest_age_seconds",
            "Age of the oldest prepared branch of this decision log whose age is known (server clock).",
            [(base, report.oldest_prepared_age_s)],
        )
    out += _metric(
        "prepared_age_unknown_branches",
        "Prepared branches of this decision log whose age the server does not give (MySQL, no claim).",
        [(base, report.prepared_age_unknown)],
    )
    if report.foreign_oldest_age_s is not None:
        out += _metric(
            "prepared_foreign_oldest_age_seconds",
            "Age of the oldest prepared transaction that is not xasink's (PostgreSQL).",
            [(base, report.foreign_oldest_age_s)],
        )
    out += _metric(
        "prepared_transactions",
        "Prepared transactions on the whole server (PostgreSQL: the cluster; MySQL: XA RECOVER).",
        [(base, report.prepared_on_server)],
    )
    if report.max_prepared_transactions is not None and report.prepared_ratio is not None:
        out += _metric(
            "max_prepared_transactions",
            "PostgreSQL's max_prepared_transactions.",
            [(base, report.max_prepared_transactions)],
        )
        out += _metric(
            "prepared_transactions_ratio",
            "Prepared transactions over max_prepared_transactions (PostgreSQL).",
            [(base, report.prepared_ratio)],
        )
    if report.blocked_sessions is not None:
        blocked = report.blocked_sessions
        out += _metric(
            "blocked_sessions", "Sessions waiting for a lock a prepared transaction holds.", [(base, len(blocked))]
        )
        ages = [b["query_age_s"] for b in blocked if b["query_age_s"] is not None]
        if ages:
            out += _metric(
                "blocked_oldest_query_age_seconds",
                "Age of the oldest statement blocked by a prepared transaction (server clock).",
                [(base, max(ages))],
            )
    out += _metric("in_doubt_batches", "Decided batches not yet all committed.", [(base, report.in_doubt_batches)])
    sinks = [({**base, "sink": s.sink_id}, s) for s in report.sinks]
    out += _metric(
        "sink_prepared_branches",
        "Prepared branches of the sink.",
        [(lbl, s.prepared_branches) for lbl, s in sinks],
    )
    out += _metric(
        "sink_in_doubt_batches",
        "Decided batches of the sink not yet all committed.",
        [(lbl, len(s.in_doubt_batches)) for lbl, s in sinks],
    )
    out += _metric(
        "sink_in_doubt_oldest_age_seconds",
        "Age of the sink's oldest decided batch not yet all committed (server clock).",
        [(lbl, max(d["age_s"] for d in s.in_doubt)) for lbl, s in sinks if s.in_doubt and _dated(s.in_doubt)],
    )
    out += _metric(
        "sink_last_committed_batch",
        "Highest committed batch id of the sink.",
        [(lbl, s.last_committed_batch) for lbl, s in sinks if s.last_committed_batch is not None],
    )
    out += _metric(
        "sink_last_committed_age_seconds",
        "Seconds since the sink's last commit (server clock).",
        [(lbl, s.last_committed_age_s) for lbl, s in sinks if s.last_committed_age_s is not None],
    )
    return "\n".join(out) + "\n"


def _dated(in_doubt: list[dict[str, object]]) -> bool:
    return all(d["age_s"] is not None for d in in_doubt)


def _status_code(base: dict[str, str], code: int) -> list[str]:
    return _metric("status_code", "Health as an exit code: 0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN.", [(base, code)])


def render_down(server: str, database: str) -> str:
    """What is written when the server could not be read: ``xasink_up`` 0 and UNKNOWN, no other figure."""
    base = {"server": server, "database": database}
    out = _metric("up", "1: xasink status connected and read the server; 0: it could not (see stderr).", [(base, 0)])
    out += _status_code(base, health.EXIT_CODES[health.UNKNOWN])
    return "\n".join(out) + "\n"
