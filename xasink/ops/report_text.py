"""How ``xasink recover`` and ``xasink status`` show their reports to a person: tables and summary lines."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from xasink.ops import alerts as health
from xasink.ops import survey as admin
from xasink.ops.status import StatusReport
from xasink.protocol import judgement


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    s = int(seconds)
    if s < 120:
        return f"{s}s"
    if s < 7200:
        return f"{s // 60}m"
    if s < 172800:
        return f"{s // 3600}h"
    return f"{s // 86400}d"


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[("" if v is None else str(v)) for v in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    return "\n".join(lines)


def _app(e: admin.PreparedEntry) -> str:
    if e.ours:
        return "xasink"
    return f"xasink log {e.log_id}" if e.decision == "other-log" else "foreign"


def print_recover(report: admin.RecoverReport) -> None:
    print(f"server: {report.url}")
    if report.entries:
        rows = [
            (
                e.gid,
                _app(e),
                e.sink_id,
                e.batch_id,
                e.partition,
                _age(e.age_s),
                e.database,
                e.owner,
                e.decision,
                e.action,
                e.outcome,
            )
            for e in report.entries
        ]
        print(
            _table(
                [
                    "gid",
                    "app",
                    "sink",
                    "batch",
                    "part",
                    "age",
                    "database",
                    "user",
                    "decision",
                    "action",
                    "outcome",
                ],
                rows,
            )
        )
        print()
    for sink, batches in report.finished_batches.items():
        print(f"finished decided batches of sink {sink}: {batches}")
    for sink, names in report.dropped.items():
        print(
            f"dropped the old tables of sink {sink}'s renamed overwrites, left after their batches committed: {names}"
        )
    for sink, blocked in report.unfinished.items():
        for batch, why in blocked.items():
            print(
                f"not finished: sink {sink} batch {batch} is decided but could not be finished yet ({why}); it "
                "stays decided: run recover again once that is fixed",
                file=sys.stderr,
            )
    for err in report.errors:
        print(f"error: {err}", file=sys.stderr)
    for why in report.warnings:
        print(f"warning: {why}", file=sys.stderr)
    ours = [e for e in report.entries if e.ours]
    if report.acted:
        done = [e for e in report.entries if e.outcome == "done"]
        verb, left = "did", "left prepared"
    else:
        done, verb, left = report.entries, "would", "prepared"
    rollbacks = (judgement.ROLLBACK_UNDECIDED, judgement.ROLLBACK_ORPHAN)
    foreign = sum(e.action == admin.ROLLBACK_FOREIGN for e in done)
    print(
        f"{len(report.entries)} prepared: {len(ours)} of this xasink log, "
        f"{sum(e.decision == 'other-log' for e in report.entries)} of other xasink logs, "
        f"{sum(e.decision == 'foreign' for e in report.entries)} foreign; "
        f"{verb} commit {sum(e.action == judgement.COMMIT for e in done)}, "
        f"roll back {sum(e.action in rollbacks for e in done)}"
        + (f" and {foreign} foreign" if foreign else "")
        + f", leave {sum(e.action == judgement.WAIT for e in ours)} young undecided to a live batch; "
        f"{len(report.stale())} of xasink older than {_age(report.older_than_s)} {left}"
    )


def _targets(targets: list[dict[str, str]] | None) -> str:
    """A multi-target batch's tables and databases; '-' for a single table's batch."""
    if not targets:
        return "-"
    return ", ".join(f"{t.get('schema')}.{t.get('table')}@{t.get('server') or t.get('db')}" for t in targets)


def print_status(report: StatusReport) -> None:
    print(f"server: {report.url}")
    rows = [
        (
            s.sink_id,
            s.last_committed_batch,
            ",".join(map(str, s.in_doubt_batches)) or "-",
            s.prepared_branches,
            _age(s.oldest_prepared_age_s) if s.prepared_branches else "-",
            s.stale,
        )
        for s in report.sinks
    ]
    print(_table(["sink", "last committed", "in doubt", "prepared", "oldest", "stale"], rows))
    for s in report.sinks:
        if s.recent:
            print(f"\nrecent batches of {s.sink_id}:")
            print(
                _table(
                    ["batch", "state", "rows", "branches", "prepare ms", "commit ms", "decided (UTC)", "targets"],
                    [
                        (
                            r["batch_id"],
                            r["state"],
                            r["rows"],
                            r["branches"],
                            r["prepare_ms"],
                            r["commit_ms"],
                            r["decided_at"],
                            _targets(r.get("targets")),
                        )
                        for r in s.recent
                    ],
                )
            )
    for err in report.errors:
        print(f"error: {err}", file=sys.stderr)
    for why in report.write_blockers:
        print(f"error: xasink cannot write here: {why}", file=sys.stderr)
    print(
        f"\n{len(report.sinks)} sinks; {sum(s.prepared_branches for s in report.sinks)} prepared branches of xasink; "
        f"{report.foreign_prepared} foreign prepared transactions, "
        f"{report.other_log_prepared} of other xasink logs; {sum(s.stale for s in report.sinks)} in doubt "
        f"or prepared for {_age(report.older_than_s)} or longer"
    )
    limit = report.max_prepared_transactions
    print(
        f"prepared transactions on the server: {report.prepared_on_server}"
        + (f" of max_prepared_transactions {limit}" if limit is not None else " (no limit on this server)")
        + f"; oldest of this log: {_age(report.oldest_prepared_age_s) if report.prepared_branches else '-'}"
        + (f" ({report.prepared_age_unknown} of unknown age)" if report.prepared_age_unknown else "")
    )
    if report.blocked_sessions is None:
        print("sessions blocked by prepared transactions: not readable")
    else:
        print(f"sessions blocked by prepared transactions: {len(report.blocked_sessions)}")
        if report.blocked_sessions:
            blocked = [
                (b["session"], b["database"], b["user"], _age(b["query_age_s"]), ",".join(b["blockers"]) or "?")
                for b in report.blocked_sessions
            ]
            print(_table(["session", "database", "user", "query age", "blocked by"], blocked))
    for note in report.notes:
        print(f"note: {note}", file=sys.stderr)
    print(health.summary(report.checks()))
