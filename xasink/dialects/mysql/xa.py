"""How an xid is spelled for the XA verbs and read back from XA RECOVER (one encoding, like psycopg's _tpc)."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from typing import Any

from sqlalchemy.engine import Connection

from xasink.protocol.xid import FORMAT_ID, Xid

ER_XAER_NOTA = 1397  # the server knows no (finishable) branch of this xid


def xa_literal(format_id: int, gtrid: bytes, bqual: bytes) -> str:
    """The xid as XA verbs take it: hex literals, so no byte of it needs quoting."""
    return f"X'{gtrid.hex()}',X'{bqual.hex()}',{int(format_id)}"


def xid_literal(xid: Xid) -> str:
    return xa_literal(FORMAT_ID, xid.gtrid.encode("ascii"), xid.bqual.encode("ascii"))


def owner_lock(xid: Xid) -> str:
    """The user lock a branch's session holds while it owns the branch: ``IS_USED_LOCK`` names that session.

    A lock name is at most 64 characters, so the gid is hashed; the lock is released only when the session
    ends, so whoever finishes the branch can wait for exactly that session's disconnect.
    """
    return "xasink-owner:" + hashlib.blake2b(xid.gid.encode(), digest_size=16).hexdigest()


def foreign_gid(format_id: int, gtrid: bytes, bqual: bytes) -> str:
    """How a transaction that is not ours is named in listings: ``xa:<formatID>:<gtrid hex>:<bqual hex>``."""
    return f"xa:{format_id}:{gtrid.hex()}:{bqual.hex()}"


def parse_foreign_gid(gid: str) -> tuple[int, bytes, bytes] | None:
    m = re.fullmatch(r"xa:(-?\d+):((?:[0-9a-f]{2})*):((?:[0-9a-f]{2})*)", gid)
    if m is None:
        return None
    return int(m[1]), bytes.fromhex(m[2]), bytes.fromhex(m[3])


def parse_recover_row(row: Sequence[Any], hex_data: bool) -> tuple[int, bytes, bytes] | None:
    """(formatID, gtrid, bqual) from an XA RECOVER row; ``hex_data`` for ``XA RECOVER CONVERT XID``."""
    try:
        format_id, glen, blen, data = int(row[0]), int(row[1]), int(row[2]), row[3]
        if isinstance(data, str):
            raw = bytes.fromhex(data[2:]) if hex_data and data[:2].lower() == "0x" else data.encode("utf-8")
        else:
            raw = bytes(data)
    except (ValueError, TypeError, IndexError):
        return None
    if glen < 0 or blen < 0 or len(raw) != glen + blen:
        return None
    return format_id, raw[:glen], raw[glen:]


def recover_statement(is_mariadb: bool) -> tuple[str, bool]:
    """MySQL 8 can return the xid as hex (CONVERT XID); MariaDB returns raw bytes with their lengths."""
    return ("XA RECOVER", False) if is_mariadb else ("XA RECOVER CONVERT XID", True)


def recovered(conn: Connection) -> list[tuple[int, bytes, bytes]]:
    """Every prepared XA transaction of the server, as (formatID, gtrid, bqual)."""
    stmt, hex_data = recover_statement(bool(getattr(conn.dialect, "is_mariadb", False)))
    rows = conn.exec_driver_sql(stmt).fetchall()
    return [p for p in (parse_recover_row(r, hex_data) for r in rows) if p is not None]
