"""What InnoDB says about its transactions at a known moment: which session each is attached to, and whether it
is a prepared branch (what :mod:`.owner` proves a branch's owner gone by).

Read live from ``SHOW ENGINE INNODB STATUS`` (its list of transactions, made under InnoDB's lock latch when the
statement runs).  Where that list cannot be read whole (truncated past 1 MiB, or a text this module does not
know), from ``information_schema.INNODB_TRX``: a cache InnoDB refreshes only when nobody read it for 0.1 s
(trx_i_s_cache's CACHE_MIN_IDLE_TIME_NS), so a view of it counts only when it lists the reader's own
transaction, begun just before it (a witness): a cache kept frozen by other readers is never taken for the
present.  Both need the PROCESS privilege (a privilege error is raised to the caller).
"""

from __future__ import annotations

import random
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pymysql

from xasink.dialects.mysql.errors import PRIVILEGE_CODES
from xasink.dialects.mysql.sql import errno_of

# this process reads INNODB_TRX at most this often (readers that come more often, together, freeze it)
TRX_POLL_S = 0.12
_LAST_READ = [0.0]  # when this process last read INNODB_TRX (time.monotonic)
_READ_GATE = threading.Lock()
DISCONNECTING = ("Killed", "Quit")  # PROCESSLIST's COMMAND of a session on its way out

_TRX_SQL = (
    "SELECT t.trx_mysql_thread_id, CAST(t.trx_id AS CHAR), t.trx_state, t.trx_tables_in_use "
    "FROM information_schema.INNODB_TRX t"
)
_SESSIONS_SQL = "SELECT ID, COMMAND FROM information_schema.PROCESSLIST"
_TRANSACTION = re.compile(r"---TRANSACTION (\d+), ([^\n]*)")
_THREAD = re.compile(r"^(?:MariaDB|MySQL) thread id (\d+),", re.M)
_TABLES = re.compile(r"^mysql tables in use (\d+)", re.M)

Blocker = tuple[int, str]  # (session, owner lock or InnoDB transaction id): what a wait is waiting for


@dataclass(frozen=True)
class Trx:
    """One InnoDB transaction as a view shows it."""

    id: str
    session: int  # the session it is attached to (0: none, a detached or recovered prepared branch)
    prepared: bool | None  # None: not known (INNODB_TRX does not say)
    busy: bool  # a statement uses its tables, or it waits for a lock or rolls back: no prepared branch is so
    command: str | None  # its session's COMMAND in PROCESSLIST (None: not listed)


@dataclass(frozen=True)
class TrxView:
    """InnoDB's transactions as they were at some moment after ``after`` (time.monotonic)."""

    after: float
    rows: tuple[Trx, ...]

    def disconnecting(self) -> set[Blocker]:
        """Prepared (or maybe prepared), idle transactions attached to a session that is gone from PROCESSLIST,
        killed or quitting: what a branch's owner is between releasing its locks and InnoDB's detach."""
        return {
            (t.session, t.id)
            for t in self.rows
            if t.session
            and t.prepared is not False
            and not t.busy
            and (t.command is None or t.command in DISCONNECTING)
        }

    def of_session(self, session: int) -> set[str]:
        return {t.id for t in self.rows if t.session == session}

    def transactions(self) -> set[str]:
        return {t.id for t in self.rows}


def _transactions(text: str) -> list[str] | None:
    """Each transaction's block of ``SHOW ENGINE INNODB STATUS``; None when its list is not there whole."""
    start = text.find("\nLIST OF TRANSACTIONS FOR EACH SESSION:\n")
    end = text.find("\nFILE I/O\n", start)
    if start < 0 or end < 0 or "... truncated..." in text:
        return None
    return re.split(r"\n(?=---TRANSACTION )", text[start:end])[1:]


def parse_status(text: str) -> list[tuple[str, int, bool, bool]] | None:
    """(transaction id, session or 0, prepared, busy) of each transaction ``SHOW ENGINE INNODB STATUS`` lists;
    None when its list is not there whole."""
    blocks = _transactions(text)
    if blocks is None:
        return None
    out = []
    for block in blocks:
        head = _TRANSACTION.match(block)
        if head is None:  # "---TRANSACTION (0x...), not started": no id, holds nothing
            continue
        thread, tables = _THREAD.search(block), _TABLES.search(block)
        busy = bool(tables and int(tables.group(1))) or "ROLLING BACK" in block or "LOCK WAIT" in block
        out.append((head.group(1), int(thread.group(1)) if thread else 0, "(PREPARED)" in head.group(2), busy))
    return out


_ACTIVE = re.compile(r"^---TRANSACTION [^\n]*?, ACTIVE (?:\(PREPARED\) )?(\d+) sec", re.M)


def read_views(text: str) -> list[tuple[int, int]] | None:
    """(session or 0, seconds active) of each transaction ``SHOW ENGINE INNODB STATUS`` lists with a read view
    (``Trx read view will not see …``: a snapshot it reads by); None when its list is not there whole."""
    blocks = _transactions(text)
    if blocks is None:
        return None
    out = []
    for block in blocks:
        active, thread = _ACTIVE.match(block), _THREAD.search(block)
        if active is not None and "Trx read view will not see" in block:
            out.append((int(thread.group(1)) if thread else 0, int(active.group(1))))
    return out


class TrxReader:
    """Views of InnoDB's transactions on a connection of its own (one at a time; shared between threads)."""

    def __init__(self, raw_connect: Callable[[], Any], status: bool = True) -> None:
        """``status`` False: INNODB_TRX only (else it is the fallback once the status list cannot be read)."""
        self._raw_connect = raw_connect
        self._gate = threading.Lock()
        self._conn: Any = None
        self._me = 0
        self._status = status  # SHOW ENGINE INNODB STATUS gives a list this module reads
        self._view: TrxView | None = None

    def view(self, after: float, patience_s: float) -> TrxView | None:
        """A view taken after ``after``; None when none could be had within ``patience_s`` (INNODB_TRX frozen)."""
        stop = time.monotonic() + patience_s
        frozen = 0
        with self._gate:
            while True:
                if self._view is not None and self._view.after >= after:
                    return self._view  # taken meanwhile for another branch: it proves this one's too
                view = self._read()
                if view is not None:
                    self._view = view
                    continue
                if time.monotonic() >= stop:
                    return None
                # other sessions read INNODB_TRX often enough to keep it frozen (every read, this one too, puts
                # its refresh off by 0.1 s): read less and less often, at random, so that a gap comes
                frozen += 1
                time.sleep(random.uniform(TRX_POLL_S, min(1.0, TRX_POLL_S * 2**frozen)))

    def _read(self) -> TrxView | None:
        for attempt in (1, 2):
            try:
                if self._conn is None:
                    self._conn = self._raw_connect()
                    with self._conn.cursor() as cur:
                        cur.execute("SELECT CONNECTION_ID()")
                        self._me = int(cur.fetchone()[0])
                with self._conn.cursor() as cur:
                    return self._from_status(cur) if self._status else self._from_trx(cur)
            except pymysql.err.MySQLError as exc:
                self.close()
                if attempt == 2 or errno_of(exc) in PRIVILEGE_CODES:
                    raise
        return None  # (not reached)

    def _from_status(self, cur: Any) -> TrxView | None:
        after = time.monotonic()
        cur.execute("SHOW ENGINE INNODB STATUS")
        row = cur.fetchone()
        found = parse_status(str(row[2])) if row is not None and len(row) > 2 else None
        if found is None:
            self._status = False  # (once unreadable, INNODB_TRX from then on)
            return self._from_trx(cur)
        sessions = _sessions(cur)
        rows = tuple(Trx(trx, s, prepared, busy, sessions.get(s)) for trx, s, prepared, busy in found)
        return TrxView(after, rows)

    def _from_trx(self, cur: Any) -> TrxView | None:
        """INNODB_TRX, read with a witness transaction of this session's begun just before (None: the cache
        predates it)."""
        with _READ_GATE:
            pause = TRX_POLL_S - (time.monotonic() - _LAST_READ[0])
            if pause > 0:
                time.sleep(pause)
            after = time.monotonic()
            cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT")
            try:
                cur.execute(_TRX_SQL)
                found = [(int(r[0]), str(r[1]), str(r[2]), int(r[3] or 0)) for r in cur.fetchall()]
            finally:
                cur.execute("COMMIT")
                _LAST_READ[0] = time.monotonic()
        if not any(session == self._me for session, _, _, _ in found):
            return None
        sessions = _sessions(cur)
        rows = tuple(
            Trx(trx, s, None, tables > 0 or state in ("ROLLING BACK", "LOCK WAIT"), sessions.get(s))
            for s, trx, state, tables in found
            if s != self._me
        )
        return TrxView(after, rows)

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except Exception:  # noqa: BLE001,S110 - closing a broken connection
                pass
            self._conn = None


def _sessions(cur: Any) -> dict[int, str]:
    cur.execute(_SESSIONS_SQL)
    return {int(i): str(c) for i, c in cur.fetchall()}
