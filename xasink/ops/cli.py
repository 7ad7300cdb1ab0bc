"""The ``xasink`` command: recover, status, ddl, demo.

``recover`` exits 0 when nothing of ours older than the threshold is left prepared (or in doubt), 1 when
something is or a decided batch could not be finished yet (named, with what blocked it), 2 on an error.
``status`` exits as a Nagios plugin (see docs/monitoring.md): 0 OK, 1 WARNING
(a warn threshold, or anything in doubt or prepared for ``--older-than``), 2 CRITICAL, 3 UNKNOWN (cannot
connect, cannot read, bad arguments).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import warnings
from collections.abc import Callable, Sequence
from importlib import metadata
from typing import Any

from xasink.database_url import parse_url
from xasink.errors import OptionError, XasinkError
from xasink.ops import alerts as health
from xasink.ops import prometheus
from xasink.ops import survey as admin
from xasink.ops.ddl import DIALECTS, ddl
from xasink.ops.report_text import print_recover, print_status
from xasink.ops.status import status
from xasink.support.masking import RedactingFormatter, redact, url_secrets

_LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def _version() -> str:
    """The installed distribution's version; 'unknown' when run from a source tree that was never installed."""
    try:
        return metadata.version("xasink")
    except metadata.PackageNotFoundError:
        return "unknown"


def _quiet_warnings() -> None:
    """Our own entry points only: Spark's and pandas' warnings (e.g. pandas >= 3 not fully supported) are noise
    to someone running ``xasink``; a library user's session keeps its own warning filters."""
    warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas")
    warnings.filterwarnings("ignore", module=r"(pyspark|pandas|pyarrow|py4j)(\.|$)")


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


def _health_flags(s: argparse.ArgumentParser) -> None:
    s.add_argument("--prometheus", action="store_true", help="print metrics in the Prometheus text format instead")
    g = s.add_argument_group("thresholds (Nagios-style; unset: reported, never alerted on)")
    thresholds: list[tuple[str, Callable[[str], Any], str, str]] = [
        (
            "prepared-age",
            admin.parse_duration,
            "AGE",
            "the oldest prepared branch of this decision log is AGE old or older (e.g. 60, 90s, 10m; a MySQL "
            "branch of unknown age counts as old)",
        ),
        ("blocked", _count, "N", "more than N sessions wait for a lock a prepared transaction holds (0: any)"),
        ("batch-age", admin.parse_duration, "AGE", "a sink's last committed batch is AGE old or older"),
        (
            "prepared-ratio",
            _ratio,
            "R",
            "prepared transactions / max_prepared_transactions is R or more (0..1; PostgreSQL only)",
        ),
    ]
    for name, kind, metavar, what in thresholds:
        for level in ("warn", "crit"):
            g.add_argument(f"--{level}-{name}", type=kind, metavar=metavar, help=f"{level}: {what}")


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more: {text!r}")
    return value


def _ratio(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1: {text!r}")
    return value


def _unknown_on_usage_error(parser: argparse.ArgumentParser) -> Any:
    """``status`` is a monitoring check: a wrong argument is UNKNOWN (3), not argparse's 2 (CRITICAL to Nagios)."""

    def error(message: str) -> None:
        parser.print_usage(sys.stderr)
        parser.exit(health.EXIT_CODES[health.UNKNOWN], f"{parser.prog}: error: {message}\n")

    return error


def _thresholds(args: argparse.Namespace) -> health.Thresholds:
    names = [
        f"{lv}_{what}" for what in ("prepared_age", "blocked", "batch_age", "prepared_ratio") for lv in ("warn", "crit")
    ]
    try:
        return health.Thresholds(**{n: getattr(args, n) for n in names})
    except ValueError as exc:
        raise OptionError(str(exc)) from None


def _labels(url: str | None) -> tuple[str, str]:
    """server (host:port) and database of ``url`` for ``xasink_up 0``; empty when it does not parse."""
    try:
        parsed = parse_url(url or "")
    except Exception:  # noqa: BLE001 - an unparsable URL still gets its metrics
        return "", ""
    port = parsed.port or (5432 if parsed.get_backend_name() == "postgresql" else 3306)
    return f"{parsed.host or 'localhost'}:{port}", parsed.database or ""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="xasink", description="exactly-once Spark writes by XA two-phase commit")
    p.add_argument("-v", "--verbose", action="store_true", help="log at INFO")
    p.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
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
        "--retry-for",
        default=None,
        help="retry a step that is blocked (a lock, a timeout) for this long (e.g. 30s; default 5m), then "
        "report its decided batch as not finished (exit 1)",
    )
    r.add_argument(
        "--rollback-foreign",
        action="append",
        default=[],
        metavar="GID",
        help="also roll back this exact foreign prepared transaction (not xasink's); repeatable",
    )
    s = sub.add_parser(
        "status",
        help="per-sink state, prepared branches and health thresholds (exit 0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN)",
        description="Per-sink state of the decision log, prepared branches, and the figures on-call alerts on. "
        "Exit codes as a Nagios plugin: 0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN (cannot connect or read, bad "
        "arguments). Ages and ratios alert at or above their threshold, counts above it (0: any). "
        "Anything in doubt or prepared for --older-than or longer is a WARNING, as before.",
    )
    common(s)
    _health_flags(s)
    s.error = _unknown_on_usage_error(s)  # type: ignore[method-assign]
    ddl = sub.add_parser("ddl", help="print the decision log's DDL, for a DBA to run where writers may not CREATE")
    ddl.add_argument("dialect", choices=DIALECTS, help="postgres, or mysql (MySQL 8 and MariaDB)")
    d = sub.add_parser("demo", help="run the demo on a throwaway PostgreSQL")
    d.add_argument("--rows", type=int, default=100_000)
    d.add_argument("--partitions", type=int, default=4)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    _quiet_warnings()
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format=_LOG_FORMAT)
    for handler in logging.getLogger().handlers:  # log lines and -v tracebacks pass through redact too
        secrets = _secrets(getattr(args, "url", None)) + _secrets(getattr(args, "journal_url", None))
        handler.setFormatter(RedactingFormatter(_LOG_FORMAT, secrets))
    code: int | None = None  # known before anything is printed: a reader that stops early changes no exit code
    try:
        if args.command == "ddl":
            code = 0
            print(ddl(args.dialect), end="")
            return code
        if args.command == "demo":
            from xasink.spark.demo import run_demo

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
                retry_s=admin.parse_duration(args.retry_for) if args.retry_for is not None else None,
            )
            code = report.exit_code
            print(json.dumps(report.to_dict(), indent=2, default=str)) if args.json else print_recover(report)
            return code
        st = status(
            args.url,
            sink_id=args.sink_id,
            journal_schema=args.journal_schema,
            journal_prefix=args.journal_prefix,
            older_than_s=older,
            journal_url=args.journal_url,
            thresholds=_thresholds(args),
        )
        code = st.exit_code
        if args.prometheus:
            print(prometheus.render(st), end="")
            for text in st.errors + st.write_blockers + st.notes:
                print(f"error: {text}", file=sys.stderr)
        elif args.json:
            print(json.dumps(st.to_dict(), indent=2, default=str))
        else:
            print_status(st)
        return code
    except BrokenPipeError:  # `xasink status | head`: the reader has what it wanted
        _stdout_gone()
        return code if code is not None else 2
    except Exception as exc:  # noqa: BLE001 - every failure is an exit code with a message, never a traceback
        code = health.EXIT_CODES[health.UNKNOWN] if args.command == "status" else 2
        text = str(exc) if isinstance(exc, XasinkError) else f"{type(exc).__name__}: {exc}"
        text = _mask(_mask(text, getattr(args, "url", None)), getattr(args, "journal_url", None))
        if getattr(args, "prometheus", False):
            print(prometheus.render_down(*_labels(args.url)), end="")
            print(f"error: {text}", file=sys.stderr)
        elif getattr(args, "json", False):
            doc: dict[str, Any] = {"error": text, "error_class": type(exc).__name__, "exit_code": code}
            if args.command == "status":
                doc["state"] = health.UNKNOWN
            print(json.dumps(doc))
        else:
            print(f"error: {text}", file=sys.stderr)
        if args.verbose:
            logging.getLogger("xasink").info("failure", exc_info=True)
        return code


def _stdout_gone() -> None:
    """Point standard output at /dev/null, so the interpreter's last flush does not fail on the closed pipe."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # not a file (a test's buffer): nothing to flush at exit
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)


if __name__ == "__main__":
    sys.exit(main())
