"""Spark's session time zone (a Java zone id) in the one form both Arrow and PostgreSQL read with Java's meaning.

Java takes offsets in many spellings (``GMT+08:00``, ``UTC+8``, ``UT-05:30``, ``+0530``, ``Z``); Arrow reads
none of the prefixed ones ("Cannot locate or parse timezone") and PostgreSQL reads ``GMT+08:00`` POSIX's way,
eight hours west.  An offset as ISO 8601 writes it (``+08:00``) means the same to all three.
"""

from __future__ import annotations

import re

_OFFSET = re.compile(r"(?:UTC|GMT|UT)?([+-])(\d{1,2})(?::?(\d{2}))?(?::?(\d{2}))?")
_ZERO = frozenset({"Z", "UTC", "GMT", "UT", "GMT0", "UCT", "Zulu", "Universal", "Greenwich"})


def iso_zone(zone: str) -> str:
    """``zone`` with a fixed offset written ``+HH:MM`` (``UTC`` for zero), a region id (``Asia/Kolkata``,
    ``Etc/GMT+8``) as it is.  An offset with seconds is left as it is: neither reader takes one."""
    if zone in _ZERO:
        return "UTC"
    found = _OFFSET.fullmatch(zone)
    if found is None:
        return zone
    sign, hours, minutes, seconds = found.groups()
    if int(hours) > 18 or int(minutes or 0) > 59 or (seconds and seconds != "00"):
        return zone
    return f"{sign}{int(hours):02d}:{minutes or '00'}"
