"""A failed Spark job read back: the xasink error inside it (rebuilt with its class), or its Python error line."""

from __future__ import annotations

import re

from xasink import errors

# the message ends where Spark's own text resumes: a blank line, a Java frame, the SQLSTATE Spark appends
_ERROR_RE = re.compile(
    r"xasink\.errors\.(\w+): (.+?)(?:\n\s*\n|\n\s+at |\n\tat |\n\s*SQLSTATE: |\n\s*JVM stacktrace:|\Z)", re.S
)


def unwrap_error(exc: BaseException) -> BaseException | None:
    """The xasink error inside a Spark exception, rebuilt with its own class."""
    text = str(exc)
    found = _ERROR_RE.findall(text)
    if not found:
        return None
    name, message = found[-1]
    cls = getattr(errors, name, errors.XasinkError)
    if not (isinstance(cls, type) and issubclass(cls, errors.XasinkError)):
        cls = errors.XasinkError
    return cls(message.strip())


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
