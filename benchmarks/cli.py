"""What every benchmark command shares on its command line: the common arguments, logging, a progress bar.

Every command takes ``--db``, ``--mariadb``, ``--name`` and ``--out`` the same way, so that ``benchmarks.headline``
can hand them on and a report's recorded command runs again as it was.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
DATABASES = ("postgresql", "mariadb")
MARIADB = "127.0.0.1:3306"  # the machine's server, root without password
NOISY = ("py4j", "xasink", "urllib3")  # a line per batch or per call otherwise


def parser(module: str, doc: str, name_default: str) -> argparse.ArgumentParser:
    """``python -m <module>``'s parser with the common arguments; the module adds its own."""
    p = argparse.ArgumentParser(prog=f"python -m {module}", description=doc.split("\n\n")[0])
    p.add_argument("--db", default=",".join(DATABASES), help=",".join(DATABASES))
    p.add_argument(
        "--mariadb",
        default=MARIADB,
        help="host:port of the MariaDB server, or 'private': a server of the run's own (InnoDB's defaults; "
        "'private:innodb-buffer-pool-size=1G' changes a setting)",
    )
    p.add_argument("--name", help=f"results file name (default {name_default})")
    p.add_argument("--out", default=str(RESULTS), help="results directory")
    return p


def parse(p: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """Parse, split ``--db`` into ``args.dbs`` and keep the command line as ``args.command`` (for the report)."""
    args = p.parse_args(argv)
    args.dbs = split(args.db)
    for bad in set(args.dbs) - set(DATABASES):
        p.error(f"unknown database {bad!r}")
    args.command = f"{p.prog} " + " ".join(sys.argv[1:] if argv is None else argv)
    return args


def split(text: str) -> list[str]:
    """A comma-separated list, blanks dropped."""
    return [s.strip() for s in text.split(",") if s.strip()]


def ints(text: str) -> list[int]:
    return [int(s) for s in split(text)]


def logs(verbose: bool = False) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    for noisy in NOISY:
        logging.getLogger(noisy).setLevel(logging.WARNING)


@contextlib.contextmanager
def progress(total: int, what: str, unit: str = "run") -> Iterator[Any]:
    """A progress bar on a terminal (tqdm; log lines print above it), nothing otherwise or without tqdm."""
    try:
        from tqdm import tqdm
        from tqdm.contrib.logging import logging_redirect_tqdm
    except ImportError:  # the bench extra brings tqdm; without it the log lines still tell the progress
        yield NoBar()
        return
    with logging_redirect_tqdm(), tqdm(total=total, desc=what, unit=unit, disable=not sys.stderr.isatty()) as bar:
        yield bar


class NoBar:
    def update(self, n: int = 1) -> None:
        pass

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        pass
