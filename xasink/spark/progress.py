"""Progress of a long partition: the rows it has loaded so far, in its task's standard error (the executor's
log, the console in local mode), at INFO without any logging set up, and at most one line per partition every
``XASINK_PROGRESS_S`` seconds (default 30; ``off``): a short write says nothing, a long one is never silent."""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow as pa

PROGRESS_ENV = "XASINK_PROGRESS_S"  # seconds between two lines of one partition; "off": none
PROGRESS_PROPERTY = "xasink.progress"  # the same as a Spark local property (tests set it per job)
DEFAULT_S = 30.0

log = logging.getLogger("xasink.progress")


def interval(local_property: str | None) -> float | None:
    """Seconds between two progress lines of a partition (None: off), from the local property or the env."""
    raw = (local_property or os.environ.get(PROGRESS_ENV) or "").strip().lower()
    if not raw:
        return DEFAULT_S
    if raw in ("off", "none", "false"):
        return None
    try:
        value = float(raw)
    except ValueError:
        return DEFAULT_S
    return value if value >= 0 else None


def _handler() -> None:
    """Progress goes to stderr by itself: Spark's Python workers set up no logging (its own, not xasink's)."""
    if log.handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s INFO xasink: %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False


def with_progress(
    batches: Iterator[pa.RecordBatch],
    what: str,
    every_s: float | None,
    clock: Callable[[], float] = time.monotonic,
) -> Iterator[pa.RecordBatch]:
    """``batches`` as they are loaded, with a line ``<what>: N rows loaded so far (R rows/s)`` every ``every_s``
    seconds, and a last one with the total when any was said."""
    if every_s is None:
        yield from batches
        return
    start = clock()
    due, rows, said = start + every_s, 0, False
    for batch in batches:
        yield batch
        rows += batch.num_rows
        now = clock()
        if now >= due:
            _handler()
            rate = f"{rows / max(now - start, 1e-9):,.0f}"
            log.info("%s: %s rows loaded so far (%s rows/s)", what, f"{rows:,}", rate)
            due, said = now + every_s, True
    if said:
        log.info("%s: %s rows loaded in %.1f s", what, f"{rows:,}", clock() - start)
