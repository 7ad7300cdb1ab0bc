"""Results as JSON, a markdown page and PNG charts (matplotlib, headless).

:func:`write` saves every benchmark's report the same way; :func:`start` and :func:`finish` give every report its
first and last fields.  ``benchmarks.run``'s own tables and charts are in :mod:`benchmarks.run_report`.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from benchmarks.env import machine

log = logging.getLogger("benchmarks.report")


def write(
    res: dict[str, Any],
    out: str | Path,
    name: str,
    markdown: Callable[[dict[str, Any]], str],
    charts: Callable[[dict[str, Any], Path, str], list[str]] | None = None,
) -> Path:
    """``<name>.json`` (every key but the ``_`` ones), the charts, then ``<name>.md``; the markdown's path.

    The charts' file names are kept in ``res["charts"]`` before the markdown is written, so it can show them.
    Called again after each part of a long run, so an interrupted run still leaves a report.
    """
    outdir = Path(out)
    outdir.mkdir(parents=True, exist_ok=True)
    if charts is not None:
        try:
            res["charts"] = [Path(c).name for c in charts(res, outdir, name)]
        except ImportError as exc:  # the bench extra brings matplotlib; the tables do without it
            log.warning("no charts: %s", exc)
    clean = {k: v for k, v in res.items() if not k.startswith("_")}
    (outdir / f"{name}.json").write_text(json.dumps(clean, indent=1, default=str))
    md = outdir / f"{name}.md"
    md.write_text(markdown(res))
    return md


def start(args: Any, **fields: Any) -> dict[str, Any]:
    """A run's results as they begin: its name and command line, the machine, notes on what makes it noisy.

    ``setup.databases`` and ``notes`` fill in as the servers start; ``_t0`` (not saved) times the run.
    """
    res: dict[str, Any] = {
        "name": args.name,
        "command": args.command,
        "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "setup": {"machine": machine(), "databases": {}},
        **fields,
        "notes": [],
        "errors": [],
        "_t0": time.perf_counter(),
    }
    if getattr(args, "quick", False):
        res["notes"].append("--quick: small sizes and one run, to check the harness; do not quote these figures")
    if os.getloadavg()[0] > (os.cpu_count() or 1):
        res["notes"].append(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs at start: noisy timings")
    return res


def finish(res: dict[str, Any]) -> None:
    """The load average at the end and the time taken so far (a partial save calls it too)."""
    res["setup"]["load_average_at_end"] = load_average()
    res["elapsed_s"] = round(time.perf_counter() - res["_t0"], 1)


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def settings_lines(databases: dict[str, dict[str, Any]]) -> list[str]:
    """One markdown line per database with the server settings it ran with."""
    return [f"- {db}: " + ", ".join(f"{k}={v}" for k, v in settings.items()) for db, settings in databases.items()]


def pyplot() -> Any:
    """matplotlib's pyplot, headless."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_fig(fig: Any, path: Path) -> str:
    """A finished matplotlib figure as a PNG; its path."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)


def main(argv: list[str] | None = None) -> int:
    """``python -m benchmarks.report results/NAME.json``: write NAME's tables and charts again from its
    measurements (after a change to the report, without measuring again)."""
    import argparse

    from benchmarks import modes_report, run_report

    p = argparse.ArgumentParser(prog="python -m benchmarks.report", description="write a report again from its JSON")
    p.add_argument("json", nargs="+", type=Path, help="a results file of python -m benchmarks.run or benchmarks.modes")
    for path in p.parse_args(argv).json:
        res = json.loads(path.read_text())
        if "timed" in res:  # benchmarks.modes
            print(write(res, path.parent, path.stem, modes_report.markdown, modes_report.chart))
            continue
        res = run_report.derive(res)
        print(write(res, path.parent, path.stem, run_report.markdown, run_report.charts))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
