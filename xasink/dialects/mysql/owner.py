"""Proving a branch's owner session has let go of it, before anyone else sends XA COMMIT or XA ROLLBACK.

MariaDB (10.11) answers an XA COMMIT or XA ROLLBACK from another session with OK although InnoDB did nothing
when the verb lands while the branch's owner is disconnecting.  The owner's disconnect first hands the xid
to the server (``THD::cleanup`` → ``trans_xa_detach``: from then on the verb finds it), then releases its
user locks, leaves PROCESSLIST, and only then detaches the InnoDB transaction (``THD::free_connection``).
In between, InnoDB's ``commit_by_xid`` does not find the transaction (it is not "recovered" yet) and the
server ignores that answer: it drops the xid and says OK.  The transaction stays prepared, its rows
invisible, unlisted by XA RECOVER and holding its row locks until the server restarts; then it is listed
again (tests/test_owner_race.py counts it).

So a verb is sent only once the owner is **proven** detached, never after a timeout:

* the branch's owner lock (held by its session from XA START to its end, :func:`.xa.owner_lock`) is free:
  the session is past handing over the xid;
* then a view of INNODB_TRX taken after that shows no transaction the owner may still hold: any attached to
  the session that held the lock (when it was seen), else any idle one (no statement running) attached to a
  session that is gone from PROCESSLIST, killed or quitting, among those seen first once the lock was free (a
  later one cannot be the owner's).  INNODB_TRX is a cache InnoDB refreshes only when nobody read it for
  0.1 s; a view counts only when it lists the reader's own transaction, begun just before it (a witness), so
  a cache kept frozen by other readers is never taken for the present.

A wait that runs out sends no verb: :class:`BranchBusyError` (a commit is retried with backoff, a roll-back is
left for the next sweep).  A session that has been disconnecting longer than a wait is checked again at every
verb but not waited for in full again.  When the owner's InnoDB transaction was seen, the verb is verified
afterwards: that transaction must be gone (:class:`HiddenBranchError` otherwise).

Without the PROCESS privilege INNODB_TRX cannot be read and the detach cannot be proven: the wait ends once the
lock is free, no session of the user is killed or quitting, and :data:`SETTLE_S` more have passed (the detach
follows the session's exit from PROCESSLIST within microseconds).  docs/mysql.md says to grant PROCESS.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import pymysql
from sqlalchemy.engine import Connection

from xasink.dialects.mysql.errors import PRIVILEGE_CODES, BranchBusyError, HiddenBranchError
from xasink.dialects.mysql.sql import errno_of
from xasink.dialects.mysql.xa import owner_lock
from xasink.errors import BranchError
from xasink.protocol.xid import Xid

log = logging.getLogger("xasink.dialects.mysql")

DETACH_TIMEOUT_S = 30.0
# InnoDB refreshes the cache behind INNODB_TRX only when nobody has read it for 0.1 s (trx_i_s_cache's
# CACHE_MIN_IDLE_TIME_NS): readers that come more often, together, freeze it server-wide.  This process reads
# it at most this often, whatever the number of threads finishing branches.
TRX_POLL_S = 0.12
OWNER_WAIT_S = 5.0  # longest wait for a branch's owner to let go before XA COMMIT / ROLLBACK is given up for now
SETTLE_S = 0.05  # without PROCESS: the pause after the owner's lock and session are gone, for its InnoDB detach
_LOCKS_PER_QUERY = 200
_DISCONNECTING = ("Killed", "Quit")
# a transaction in these states is no disconnecting owner's: rolling back, or waiting for a row lock (a prepared
# branch waits for nothing; a view frozen by readers once showed a branch that had waited before it prepared so)
_NOT_OWNERS = ("ROLLING BACK", "LOCK WAIT")
_VIEW_SQL = (
    "SELECT t.trx_mysql_thread_id, CAST(t.trx_id AS CHAR), t.trx_state, t.trx_tables_in_use, p.COMMAND "
    "FROM information_schema.INNODB_TRX t LEFT JOIN information_schema.PROCESSLIST p "
    "ON p.ID = t.trx_mysql_thread_id AND t.trx_mysql_thread_id <> 0"
)
_LAST_READ = [0.0]  # when this process last read INNODB_TRX (time.monotonic): see TRX_POLL_S
_READ_GATE = threading.Lock()

Blocker = tuple[int, str]  # (session, owner lock or InnoDB transaction id): what a wait is waiting for


@dataclass(frozen=True)
class _View:
    """INNODB_TRX as it was at some moment after ``after`` (proven by the witness)."""

    after: float  # time.monotonic() before the witness transaction began
    me: int  # the witness session
    # session, transaction id, state, tables in use (by a statement), the session's COMMAND (None: not listed)
    rows: tuple[tuple[int, str, str, int, str | None], ...]

    def disconnecting(self) -> set[Blocker]:
        """Idle transactions attached to a session that is gone from PROCESSLIST, killed or quitting.

        A prepared branch's session runs no statement on InnoDB tables (XA allows none after PREPARE), so a
        transaction with tables in use (a killed session's statement winding down) is no owner's."""
        return {
            (session, trx)
            for session, trx, state, tables, command in self.rows
            if session not in (0, self.me)
            and state not in _NOT_OWNERS
            and tables == 0
            and (command is None or command in _DISCONNECTING)
        }

    def of_session(self, session: int) -> set[str]:
        return {trx for s, trx, _, _, _ in self.rows if s == session}

    def transactions(self) -> set[str]:
        return {row[1] for row in self.rows}


@dataclass
class Owner:
    """What a wait learnt about one branch's owner."""

    lock: str | None  # the owner lock (None: a foreign branch, no lock)
    session: int | None = None  # the session seen holding the lock
    transactions: set[str] = field(default_factory=set)  # its InnoDB transactions, seen attached to it
    suspects: set[Blocker] | None = None  # lock free, session unknown: the disconnecting transactions seen then
    clear_since: float | None = None  # without PROCESS: when the lock and the sessions were first seen clear


class OwnerWatch:
    """The owner waits of one server: a witness connection for INNODB_TRX, owners proven detached, slow sessions."""

    def __init__(self, raw_connect: Callable[[], Any]) -> None:
        self._raw_connect = raw_connect
        self._trx_visible = True  # whether this user may read INNODB_TRX (the PROCESS privilege)
        self._gate = threading.Lock()  # the witness connection and the latest view
        self._witness: Any = None
        self._witness_id = 0
        self._view: _View | None = None
        self._lock = threading.Lock()  # the two sets below
        self._detached: set[str] = set()  # gids whose owner was proven detached (until their verb is done)
        self._slow: dict[Blocker, float] = {}  # what waits gave up on, and since when it has been seen

    # -- the executor's branch: its own session leaving PROCESSLIST --------------------------
    def wait_detached(self, connection_id: int, lock: str, timeout_s: float = DETACH_TIMEOUT_S) -> None:
        """Return once the branch's own session (``connection_id``, after PREPARE and disconnect) has left.

        The session counts as there while it holds the branch's owner lock or shows as killed or quitting:
        an unrelated session given the same id after a server restart (ids start again from 1) is not the
        branch's.  InnoDB's detach comes moments later; whoever finishes the branch proves it
        (:meth:`await_owner`).  PROCESSLIST is read live, so it is polled fast.
        """
        conn = self._raw_connect()
        try:
            cur = conn.cursor()
            deadline = time.monotonic() + timeout_s
            delay = 0.001
            while self._listed(cur, connection_id, lock):
                if time.monotonic() > deadline:
                    raise BranchError(
                        f"the server did not release session {connection_id} within {timeout_s:.0f}s after it "
                        "prepared its branch; the branch is rolled back by the batch's abort"
                    )
                time.sleep(delay)
                delay = min(delay * 2, 0.05)
        finally:
            conn.close()

    @staticmethod
    def _listed(cur: Any, connection_id: int, lock: str) -> bool:
        cur.execute(
            "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = %s "
            "AND (IS_USED_LOCK(%s) = ID OR COMMAND IN ('Killed', 'Quit'))",
            (connection_id, lock),
        )
        row = cur.fetchone()
        return row is not None and int(row[0]) > 0

    # -- the driver: before XA COMMIT / ROLLBACK ---------------------------------------------
    def prove(self, conn: Connection, xids: Iterable[Xid], timeout_s: float = OWNER_WAIT_S) -> list[Xid]:
        """Wait (at most ``timeout_s``) until the owners of these branches are proven detached; those not proven.

        For many branches at once: one look at their locks and one view of InnoDB prove all whose owners are
        gone, so their verbs need not wait one by one.
        """
        owners = {x.gid: Owner(owner_lock(x)) for x in xids if x.gid not in self._detached}
        if not owners:
            return []
        waiting = set(self._wait(conn, owners, timeout_s))
        with self._lock:
            self._detached |= set(owners) - waiting
            if len(self._detached) > 100_000:  # proofs of branches whose verb never came (a failed batch)
                self._detached = set(owners) - waiting
        return [x for x in xids if x.gid in waiting]

    def await_owner(self, conn: Connection, xid: Xid | None, timeout_s: float = OWNER_WAIT_S) -> Owner | None:
        """Return once the branch's owner is proven detached (then the verb is safe); what was learnt of it.

        Raises :class:`BranchBusyError` when it is not proven within ``timeout_s`` (the owner still connected,
        hung, or a disconnecting session that may be it): no verb may be sent yet.
        """
        if xid is not None and xid.gid in self._detached:
            return None
        key = xid.gid if xid is not None else "-"
        owner = Owner(owner_lock(xid) if xid is not None else None)
        blockers = self._wait(conn, {key: owner}, timeout_s).get(key)
        if blockers is not None:
            who = "its owner, session" if owner.session is not None else "sessions that may own it:"
            raise BranchBusyError(
                f"branch {xid if xid is not None else '(foreign)'}: {who} {_describe(blockers)} still attached to "
                f"it after {timeout_s:.0f}s; finishing the branch now could leave it prepared and invisible until "
                "the server restarts, so it is left for a later attempt"
            )
        return owner

    def finished(self, xid: Xid | None, owner: Owner | None, verb: str, literal: str) -> None:
        """After the verb answered OK: forget the proof; where the owner's transaction was seen, check it is gone."""
        if xid is not None:
            with self._lock:
                self._detached.discard(xid.gid)
        if owner is None or not owner.transactions or not self._trx_visible:
            return
        view = self._fresh_view(time.monotonic(), OWNER_WAIT_S)
        if view is None:
            log.warning("XA %s %s: INNODB_TRX stayed frozen; its effect is not verified", verb, literal)
            return
        left = owner.transactions & view.transactions()
        if left:
            raise HiddenBranchError(
                f"XA {verb} {literal} answered OK, but InnoDB still holds the branch's transaction "
                f"{sorted(left)[0]} prepared: it is invisible and keeps its row locks until the server restarts. "
                "Restart the MariaDB server, then run 'xasink recover'"
            )

    def _wait(self, conn: Connection, owners: dict[str, Owner], timeout_s: float) -> dict[str, set[Blocker]]:
        """The keys of ``owners`` still not proven detached after at most ``timeout_s``, with what they wait for."""
        deadline = time.monotonic() + timeout_s
        pending = set(owners)
        delay = 0.001
        while True:
            blockers = self._look(conn, {k: owners[k] for k in pending}, deadline)
            pending = set(blockers)
            if not pending:
                return blockers
            now = time.monotonic()
            seen = {b for found in blockers.values() for b in found}
            with self._lock:
                for b in seen:
                    self._slow.setdefault(b, now)
                # a wait gives up at once on what an earlier one waited for in full, still checked every time
                given_up = bool(seen) and all(now - self._slow[b] >= timeout_s for b in seen)
                self._slow = {b: t for b, t in self._slow.items() if b in seen or now - t < 600}
            if now >= deadline or given_up:
                log.debug("owners of %s still not proven detached: %s", sorted(pending), _describe(seen))
                return blockers
            time.sleep(delay)
            delay = min(delay * 2, 0.05)

    def _look(self, conn: Connection, owners: dict[str, Owner], deadline: float) -> dict[str, set[Blocker]]:
        """One look: for each owner not proven detached, what it may still be (its session or transactions)."""
        holders = self._holders(conn, {o.lock for o in owners.values() if o.lock is not None})
        after = time.monotonic()  # the locks were read before this: a view proves only what it shows after it
        out: dict[str, set[Blocker]] = {}
        free: dict[str, Owner] = {}
        for key, owner in owners.items():
            holder = holders.get(owner.lock) if owner.lock is not None else None
            if holder is not None:
                owner.session = holder
                out[key] = {(holder, owner.lock or "")}
            else:
                free[key] = owner
        if self._trx_visible:
            try:
                view = self._fresh_view(after, max(0.0, deadline - time.monotonic())) if free or out else None
            except pymysql.err.MySQLError as exc:
                if errno_of(exc) not in PRIVILEGE_CODES:
                    raise
                log.info("INNODB_TRX is not readable (no PROCESS privilege): owner detaches cannot be proven")
                self._trx_visible = False
                return self._look(conn, owners, deadline)
            if view is None:  # frozen by other readers all along: nothing proven
                return {**out, **{key: {(0, "INNODB_TRX frozen")} for key in free}}
            for owner in owners.values():
                if owner.session is not None:
                    owner.transactions |= view.of_session(owner.session)
            moving = view.disconnecting()
            for key, owner in free.items():
                if owner.session is not None:  # past its lock: whatever it still holds, it holds while leaving
                    mine = {(owner.session, trx) for trx in view.of_session(owner.session)}
                else:
                    owner.suspects = set(moving) if owner.suspects is None else owner.suspects & moving
                    mine = owner.suspects
                if mine:
                    out[key] = mine
            return out
        if free:
            leaving = {(session, "session") for session, command in _sessions(conn) if command in _DISCONNECTING}
            now = time.monotonic()
            for key, owner in free.items():
                if owner.session is not None:
                    mine = {b for b in leaving if b[0] == owner.session}
                else:
                    owner.suspects = set(leaving) if owner.suspects is None else owner.suspects & leaving
                    mine = owner.suspects
                if mine:
                    owner.clear_since = None
                    out[key] = mine
                elif owner.clear_since is None or now - owner.clear_since < SETTLE_S:
                    owner.clear_since = owner.clear_since or now
                    out[key] = set()  # pending, but for no one: not counted as slow
        return {k: v for k, v in out.items() if v or k in free}

    @staticmethod
    def _holders(conn: Connection, locks: set[str]) -> dict[str, int]:
        """The session holding each of these owner locks now (read live)."""
        names = sorted(locks)
        found: dict[str, int] = {}
        for i in range(0, len(names), _LOCKS_PER_QUERY):
            chunk = names[i : i + _LOCKS_PER_QUERY]
            params = {f"n{j}": n for j, n in enumerate(chunk)}
            probes = ", ".join(f"IS_USED_LOCK(%(n{j})s)" for j in range(len(chunk)))
            row = conn.exec_driver_sql(f"SELECT {probes}", params).one()
            found.update({n: int(h) for n, h in zip(chunk, row, strict=True) if h is not None})
        return found

    def _fresh_view(self, after: float, patience_s: float) -> _View | None:
        """A view of INNODB_TRX taken after ``after``, or None when the cache stayed frozen for ``patience_s``."""
        stop = time.monotonic() + patience_s
        frozen = 0
        with self._gate:
            while True:
                if self._view is not None and self._view.after >= after:
                    return self._view  # taken meanwhile for another branch: it proves this one's too
                with _READ_GATE:
                    pause = TRX_POLL_S - (time.monotonic() - _LAST_READ[0])
                    if pause > 0:
                        time.sleep(pause)
                    view = self._read_view()
                    _LAST_READ[0] = time.monotonic()
                if view is not None:
                    self._view = view
                    continue
                if time.monotonic() >= stop:
                    return None
                # other sessions read INNODB_TRX often enough to keep it frozen (every read, this one too, puts
                # its refresh off by 0.1 s): read less and less often, at random, so that a gap comes
                frozen += 1
                time.sleep(random.uniform(TRX_POLL_S, min(1.0, TRX_POLL_S * 2**frozen)))

    def _read_view(self) -> _View | None:
        """INNODB_TRX with the witness transaction begun just before; None when the cache predates it."""
        for attempt in (1, 2):
            try:
                if self._witness is None:
                    self._witness = self._raw_connect()
                    with self._witness.cursor() as cur:
                        cur.execute("SELECT CONNECTION_ID()")
                        self._witness_id = int(cur.fetchone()[0])
                after = time.monotonic()
                with self._witness.cursor() as cur:
                    cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT")
                    try:
                        cur.execute(_VIEW_SQL)
                        rows = tuple((int(r[0]), str(r[1]), str(r[2]), int(r[3] or 0), r[4]) for r in cur.fetchall())
                    finally:
                        cur.execute("COMMIT")
                break
            except pymysql.err.MySQLError as exc:
                self.close()
                if attempt == 2 or errno_of(exc) in PRIVILEGE_CODES:
                    raise
        if not any(row[0] == self._witness_id for row in rows):
            return None
        return _View(after, self._witness_id, rows)

    def close(self) -> None:
        if self._witness is not None:
            try:
                self._witness.close()
            except Exception:  # noqa: BLE001,S110 - closing a broken connection
                pass
            self._witness = None


def _describe(blockers: Iterable[Blocker]) -> str:
    """Sessions and what holds them, for a message: ``12 (InnoDB transaction 3456)``."""
    parts = []
    for session, what in sorted(blockers):
        if what.startswith("xasink-owner:"):
            parts.append(f"{session} (holding the branch's owner lock)")
        elif what.isdigit():
            parts.append(f"{session} (InnoDB transaction {what})")
        else:
            parts.append(f"{session} (killed or quitting)" if what == "session" else what)
    return ", ".join(parts) or "(settling)"


def _sessions(conn: Connection) -> list[tuple[int, str]]:
    """(id, COMMAND) of the sessions this user may see (its own, without PROCESS)."""
    rows = conn.exec_driver_sql("SELECT ID, COMMAND FROM information_schema.PROCESSLIST")
    return [(int(i), str(c)) for i, c in rows]
