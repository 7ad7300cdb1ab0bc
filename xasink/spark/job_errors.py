"""A failed Spark job read back: the xasink error inside it (rebuilt with its class), or its Python error line."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from xasink import errors

if TYPE_CHECKING:
    from xasink.journal.records import BatchRecord

log = logging.getLogger("xasink")


def unwrap_error(exc: BaseException) -> BaseException | None:
    """The xasink error inside a Spark exception, rebuilt with its own class (:func:`xasink.errors.from_spark`)."""
    return errors.from_spark(exc)


def error_summary(exc: BaseException) -> str:
    """The Python error line of a Spark exception (e.g. ``ValueError: bad row``), else its first line."""
    text = str(exc)
    tail = text.rsplit("Traceback (most recent call last):", 1)
    if len(tail) == 2:
        for line in tail[1].splitlines():
            if line.strip() and not line[0].isspace():
                return line.strip()[:300]
    first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    return first[:300]


def told_by_the_log(sink: str, batch: int, record: BatchRecord | None, summary: str) -> errors.XasinkError | None:
    """What to tell of a write whose Spark job or commit step failed without an xasink error of its own
    (``summary``), from the log's record of its batch: None when it is committed (the write's result
    stands, and a warning says Spark failed it), else the error.

    ``record`` None: the batch is undecided, and the abort rolled back the run's branches."""
    if record is None:
        return errors.BatchAbortedError(
            f"sink {sink} batch {batch} was rolled back, no row of it is visible: the Spark job failed ({summary})"
        )
    if record.committed:
        log.warning(
            "sink %s batch %s: Spark failed the write (%s), but the decision log holds the batch committed: every "
            "row of it is visible",
            sink,
            batch,
            summary,
        )
        return None
    return errors.CommitIncompleteError(
        f"sink {sink} batch {batch} is decided, but Spark's commit step failed ({summary}) before every branch "
        f"was committed: the next run of this sink (sinkId '{sink}') or 'xasink recover' finishes it; no row "
        "is lost or doubled. Do not rerun this batch under another sink id: its rows would be written twice"
    )
