"""The ``xasink`` command: recover, status, demo.

Exit codes fit cron and Nagios-style checks: 0 nothing of ours older than
the threshold is prepared (or in doubt), 1 something is, 2 error.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from typing import Any

from . import admin
from .errors import XasinkError
from .masking import RedactingFormatter, redact, url_secrets
from .options import parse_url

_LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def _secrets(url: str | None) -> tuple[str, ...]:
    """The secrets the ``--url`` holds, wherever in it they were written; none if it does not parse."""
    if not url:
        return ()
    try:
        return url_secrets(parse_url(url))
    except Exception:  # noqa: BLE001 - an unparsable URL: redact's patterns still apply
        return ()


def _mask(text: str, url: str | None) -> str:
    """The message without the password of ``url``, and without anything that looks like one."""
    return redact(text, _secrets(url))


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


def _print_recover(report: admin.RecoverReport) -> None:
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
    for err in report.errors:
        print(f"error: {err}", file=sys.stderr)
    ours = [e for e in report.entries if e.ours]
    if report.acted:
        done = [e for e in report.entries if e.outcome == "done"]
        verb, left = "did", "left prepared"
    else:
        done, verb, left = report.entries, "would", "prepared"
    rollbacks = (admin.ROLLBACK_UNDECIDED, admin.ROLLBACK_ORPHAN)
    foreign = sum(e.action == admin.ROLLBACK_FOREIGN for e in done)
    print(
        f"{len(report.entries)} prepared: {len(ours)} of this xasink log, "
        f"{sum(e.decision == 'other-log' for e in report.entries)} of other xasink logs, "
        f"{sum(e.decision == 'foreign' for e in report.entries)} foreign; "
        f"{verb} commit {sum(e.action == admin.COMMIT for e in done)}, "
        f"roll back {sum(e.action in rollbacks for e in done)}"
        + (f" and {foreign} foreign" if foreign else "")
        + f", leave {sum(e.action == admin.WAIT for e in ours)} young undecided to a live batch; "
        f"{len(report.stale())} of xasink older than {_age(report.older_than_s)} {left}"
    )


def _targets(targets: list[dict[str, str]] | None) -> str:
    """A multi-target batch's tables and databases; '-' for a single table's batch."""
    if not targets:
        return "-"
    return ", ".join(f"{t.get('schema')}.{t.get('table')}@{t.get('server') or t.get('db')}" for t in targets)


def _print_status(report: admin.StatusReport) -> None:
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
    print(
        f"\n{len(report.sinks)} sinks; {sum(s.prepared_branches for s in report.sinks)} prepared branches of xasink; "
        f"{report.foreign_prepared} foreign prepared transactions, "
        f"{report.other_log_prepared} of other xasink logs; {sum(s.stale for s in report.sinks)} in doubt "
        f"or prepared for {_age(report.older_than_s)} or longer"
    )


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="xasink", description="exactly-once Spark writes by XA two-phase commit")
    p.add_argument("-v", "--verbose", action="store_true", help="log at INFO")
    sub = p.add_subparsers(dest="command", required=True)

    def common(sp: argparse.ArgumentParser) -> None:
        sp.add_argument(
            "--url",
            required=True,
            help="database URL (jdbc:postgresql://..., postgresql://..., "
            "mysql://...); the password may be given in it, it is never printed",
        )
        sp.add_argument("--sink-id", help="only this sink")
        sp.add_argument("--journal-schema", help="schema of the decision log tables, if the writers set journalSchema")
        sp.add_argument("--journal-prefix", default="xasink_", help="table prefix of the decision log")
        sp.add_argument(
            "--journal-url",
            help="database holding the decision log, when it is not --url's: the log of a multi-target "
            "transaction (xasink.transaction) whose branches are in --url's database; never printed",
        )
        sp.add_argument(
            "--older-than",
            default="10m",
            help="age threshold (e.g. 90s, 10m, 2h; default 10m): "
            "undecided branches younger than this are left for a live batch",
        )
        sp.add_argument("--json", action="store_true", help="machine-readable output")

    r = sub.add_parser("recover", help="finish or roll back what xasink left prepared")
    common(r)
    r.add_argument("--dry-run", action="store_true", help="list and plan, change nothing")
    r.add_argument(
        "--rollback-foreign",
        action="append",
        default=[],
        metavar="GID",
        help="also roll back this exact foreign prepared transaction (not xasink's); repeatable",
    )
    s = sub.add_parser("status", help="per-sink state of the decision log and prepared branches")
    common(s)
    d = sub.add_parser("demo", help="run the demo on a throwaway PostgreSQL")
    d.add_argument("--rows", type=int, default=100_000)
    d.add_argument("--partitions", type=int, default=4)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format=_LOG_FORMAT)
    for handler in logging.getLogger().handlers:  # log lines and -v tracebacks pass through redact too
        secrets = _secrets(getattr(args, "url", None)) + _secrets(getattr(args, "journal_url", None))
        handler.setFormatter(RedactingFormatter(_LOG_FORMAT, secrets))
    try:
        if args.command == "demo":
            from .spark.demo import run_demo

            return run_demo(rows=args.rows, partitions=args.partitions)
        older = admin.parse_duration(args.older_than)
        if args.command == "recover":
            if args.rollback_foreign:
                print("warning: --rollback-foreign rolls back another application's transaction", file=sys.stderr)
            report = admin.recover(
                args.url,
                sink_id=args.sink_id,
                older_than_s=older,
                dry_run=args.dry_run,
                journal_schema=args.journal_schema,
                journal_prefix=args.journal_prefix,
                rollback_foreign=tuple(args.rollback_foreign),
                journal_url=args.journal_url,
            )
            print(json.dumps(report.to_dict(), indent=2, default=str)) if args.json else _print_recover(report)
            return report.exit_code
        status = admin.status(
            args.url,
            sink_id=args.sink_id,
            journal_schema=args.journal_schema,
            journal_prefix=args.journal_prefix,
            older_than_s=older,
            journal_url=args.journal_url,
        )
        print(json.dumps(status.to_dict(), indent=2, default=str)) if args.json else _print_status(status)
        return status.exit_code
    except Exception as exc:  # noqa: BLE001 - every failure is exit code 2 with a message, never a traceback
        text = str(exc) if isinstance(exc, XasinkError) else f"{type(exc).__name__}: {exc}"
        text = _mask(_mask(text, getattr(args, "url", None)), getattr(args, "journal_url", None))
        if getattr(args, "json", False):
            print(json.dumps({"error": text, "exit_code": 2}))
        else:
            print(f"error: {text}", file=sys.stderr)
        if args.verbose:
            logging.getLogger("xasink").info("failure", exc_info=True)
        return 2


if __name__ == "__main__":
    sys.exit(main())
