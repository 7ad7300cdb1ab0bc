"""Warnings that must reach the user's process, not only the Spark Python worker that met them.

The data source's planning, tasks and commit run in Python workers the JVM starts, whose logging nobody
reads.  What the user must know (a server setting that can lose prepared rows, retries after the decision,
a batch left decided for recovery, a fault point) is captured where it happens: a task returns its
warnings with its commit message, the driver-side worker logs them with its own, and hands them all to the
user's process through a file on the driver's machine named by an internal option (``xasink.write``),
which reports them with Python's ``warnings`` and in :class:`~xasink.results.WriteResult`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import tempfile
import time
import warnings
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from types import FrameType

from xasink.errors import XasinkWarning

log = logging.getLogger("xasink")

NOTICES_OPTION = "xasink.support.notices"  # internal option: the file the driver-side workers append warnings to
PREFIX = "xasink-notices-"
# a younger file may be a live write's whose process this one cannot see (another PID namespace sharing the
# folder, or an earlier release's name without a pid)
ORPHAN_AGE_S = 3600.0


def new_file() -> str:
    """A notices file for one write, named after this process.  First removes this user's files of processes
    that are gone (a driver killed with SIGKILL never removes its own): a year of killed drivers leaves none."""
    _remove_orphans()
    fd, path = tempfile.mkstemp(prefix=f"{PREFIX}{os.getpid()}-", suffix=".jsonl")
    os.close(fd)
    return path


def discard(path: str) -> None:
    """Remove a write's notices file and its figures (a /tmp cleaner may have been first)."""
    for name in (path, path + ".figures"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name)


def _remove_orphans() -> None:
    folder, uid, now = tempfile.gettempdir(), os.getuid(), time.time()
    try:
        names = [n for n in os.listdir(folder) if n.startswith(PREFIX)]
    except OSError:
        return
    for name in names:
        pid = name[len(PREFIX) :].split("-", 1)[0]
        path = os.path.join(folder, name)
        try:
            st = os.stat(path)
            if st.st_uid != uid or now - st.st_mtime < ORPHAN_AGE_S or (pid.isdigit() and _alive(int(pid))):
                continue
            os.unlink(path)
        except OSError:  # another process removed it first, or it is not ours to remove
            continue


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


class _Collector(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.lines.append(record.getMessage())
        except Exception:  # noqa: BLE001 - a bad format string must not fail the write
            self.lines.append(str(record.msg))


@contextmanager
def captured() -> Iterator[list[str]]:
    """The messages of xasink's WARNING and ERROR records while the block runs, in order."""
    xlog = logging.getLogger("xasink")
    collector = _Collector()
    level = xlog.level
    if level == logging.NOTSET or level > logging.WARNING:
        xlog.setLevel(logging.WARNING)
    xlog.addHandler(collector)
    try:
        yield collector.lines
    finally:
        xlog.removeHandler(collector)
        xlog.setLevel(level)


def save(path: str | None, lines: Iterable[str]) -> None:
    """Append ``lines`` to the notices file (one JSON string a line); nothing without a file."""
    lines = list(lines)
    if path is None or not lines:
        return
    try:
        with open(path, "a", encoding="utf-8") as f:
            f.write("".join(json.dumps(line) + "\n" for line in lines))
    except OSError as exc:  # a remote driver (Spark Connect): the worker's own log keeps them
        log.debug("cannot hand warnings to the user's process through %s: %s", path, exc)


def load(path: str) -> list[str]:
    """The warnings the workers saved, each once, in order."""
    try:
        with open(path, encoding="utf-8") as f:
            found = [json.loads(line) for line in f if line.strip()]
    except (OSError, ValueError):
        return []
    return list(dict.fromkeys(str(x) for x in found))


def save_figures(path: str | None, figures: dict[str, float]) -> None:
    """Hand the batch's figures (its WriteResult's timings) to xasink.write, next to the notices file."""
    if path is None:
        return
    try:
        with open(path + ".figures", "w", encoding="utf-8") as f:
            json.dump(figures, f)
    except OSError as exc:  # a remote driver (Spark Connect): xasink.write reports the log's figures only
        log.debug("cannot hand the figures to the user's process through %s: %s", path, exc)


def load_figures(path: str) -> dict[str, float]:
    """The figures :func:`save_figures` handed over (the file is removed); {} when there are none."""
    try:
        with open(path + ".figures", encoding="utf-8") as f:
            found = json.load(f)
        os.unlink(path + ".figures")
    except (OSError, ValueError):
        return {}
    return {str(k): float(v) for k, v in found.items()} if isinstance(found, dict) else {}


def _logging_set_up() -> bool:
    """Whether the user's process set up logging that shows xasink's records (a handler that is not a null one)."""
    loggers = (logging.getLogger("xasink"), logging.getLogger())
    return any(not isinstance(h, logging.NullHandler) for lg in loggers for h in lg.handlers)


def tell(lines: Iterable[str]) -> None:
    """Report warnings in the user's process: in its log when it set logging up, else as :class:`XasinkWarning`
    (Python shows those on standard error, each text once per place, unless the user filters them)."""
    logged = _logging_set_up()
    level = _user_level()
    for line in lines:
        if logged:
            log.warning("%s", line)
        else:
            warnings.warn(line, XasinkWarning, stacklevel=level)


_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # .../xasink


def _user_level() -> int:
    """The ``stacklevel`` that names the caller's own line: the first frame outside the xasink package, however
    deep inside xasink the warning is told (``xasink.write``, ``foreach_batch``, a transaction's exit)."""
    level = 1  # tell(): stacklevel 1 of its warnings.warn
    frame: FrameType | None = sys._getframe(1)
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE + os.sep):
        frame = frame.f_back
        level += 1
    return level
