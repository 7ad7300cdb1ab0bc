"""A failed Spark job read back: the xasink error inside it (rebuilt with its class), or its Python error line."""

from __future__ import annotations

from xasink import errors


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
