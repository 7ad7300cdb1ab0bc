"""Spark's session time zone (a Java zone id) in the one form both Arrow and PostgreSQL read with Java's meaning.

Java takes offsets in many spellings (``GMT+08:00``, ``UTC+8``, ``UT-05:30``, ``+0530``, ``Z``), and Spark Java's
short ids (``IST``, ``PST``).  Arrow reads none of the prefixed offsets and most short ids ("Cannot locate or parse
timezone"); PostgreSQL reads ``GMT+08:00`` POSIX's way, eight hours west, and ``CST`` as a fixed offset.  An offset
as ISO 8601 writes it (``+08:00``), or the short id's region, means the same to all three.
"""

from __future__ import annotations

import re

_OFFSET = re.compile(r"(?:UTC|GMT|UT)?([+-])(\d{1,2})(?::?(\d{2}))?(?::?(\d{2}))?")
_ZERO = frozenset({"Z", "UTC", "GMT", "UT", "GMT0", "UCT", "Zulu", "Universal", "Greenwich"})
# Java's ZoneId.SHORT_IDS, which Spark reads a session zone with (DateTimeUtils.getZoneId): neither Arrow nor
# PostgreSQL knows most of them, and PostgreSQL's abbreviation CST is not Chicago's zone (it has no DST)
SHORT_IDS = {
    "EST": "-05:00",
    "MST": "-07:00",
    "HST": "-10:00",
    "ACT": "Australia/Darwin",
    "AET": "Australia/Sydney",
    "AGT": "America/Argentina/Buenos_Aires",
    "ART": "Africa/Cairo",
    "AST": "America/Anchorage",
    "BET": "America/Sao_Paulo",
    "BST": "Asia/Dhaka",
    "CAT": "Africa/Harare",
    "CNT": "America/St_Johns",
    "CST": "America/Chicago",
    "CTT": "Asia/Shanghai",
    "EAT": "Africa/Addis_Ababa",
    "ECT": "Europe/Paris",
    "IET": "America/Indiana/Indianapolis",
    "IST": "Asia/Kolkata",
    "JST": "Asia/Tokyo",
    "MIT": "Pacific/Apia",
    "NET": "Asia/Yerevan",
    "NST": "Pacific/Auckland",
    "PLT": "Asia/Karachi",
    "PNT": "America/Phoenix",
    "PRT": "America/Puerto_Rico",
    "PST": "America/Los_Angeles",
    "SST": "Pacific/Guadalcanal",
    "VST": "Asia/Ho_Chi_Minh",
}


def iso_zone(zone: str) -> str:
    """``zone`` with a fixed offset written ``+HH:MM`` (``UTC`` for zero), a short id as Java's region (``IST``:
    ``Asia/Kolkata``), a region id (``Asia/Kolkata``, ``Etc/GMT+8``) as it is.  An offset with seconds is left as it
    is: neither reader takes one."""
    if zone in _ZERO:
        return "UTC"
    if zone in SHORT_IDS:
        return SHORT_IDS[zone]
    found = _OFFSET.fullmatch(zone)
    if found is None:
        return zone
    sign, hours, minutes, seconds = found.groups()
    if int(hours) > 18 or int(minutes or 0) > 59 or (seconds and seconds != "00"):
        return zone
    return f"{sign}{int(hours):02d}:{minutes or '00'}"
