"""Where the driver-side steps of a write log, in a Spark Python worker: the user's notices file or stderr."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from xasink.results import BranchOutcome
from xasink.support import notices

log = logging.getLogger("xasink")


@contextmanager
def told(path: str | None) -> Iterator[None]:
    """Run a driver-side step so that its warnings reach the user: into the notices file of ``xasink.write``
    (the user's process reports them), else to this worker's stderr, which Spark copies to the driver's."""
    if path is None:
        worker_logging(logging.WARNING)
    quiet = _worker_handler if path is not None else None  # set up by an earlier write in this reused worker
    level = quiet.level if quiet is not None else logging.NOTSET
    if quiet is not None:
        quiet.setLevel(logging.CRITICAL + 1)  # the user's process reports them: not twice
    with notices.captured() as warned:
        try:
            yield
        finally:
            notices.save(path, warned)
            if quiet is not None:
                quiet.setLevel(level)


def tell_tasks(outcomes: list[BranchOutcome | None]) -> None:
    """Log what the tasks warned about, here on the driver side (inside :func:`told`)."""
    for outcome in outcomes:
        for text in outcome.warnings if outcome is not None else ():
            log.warning("%s", text)


_worker_handler: logging.Handler | None = None


def worker_logging(level: int) -> None:
    """Send xasink's records to stderr (Spark's driver/executor log) in a Spark Python worker nobody configured.

    Spark's workers set up no logging, so without this the per-batch INFO line and the warnings of fault
    points and commit retries would vanish.  A handler configured by the user (or Spark's worker logging)
    is respected: then only the logger's level is lowered.
    """
    global _worker_handler
    xlog = logging.getLogger("xasink")
    if xlog.level == logging.NOTSET or xlog.level > level:
        xlog.setLevel(level)
    if _worker_handler is None:
        if logging.getLogger().handlers or any(not isinstance(h, logging.NullHandler) for h in xlog.handlers):
            return
        _worker_handler = logging.StreamHandler(sys.stderr)
        _worker_handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        xlog.addHandler(_worker_handler)
    _worker_handler.setLevel(level)
