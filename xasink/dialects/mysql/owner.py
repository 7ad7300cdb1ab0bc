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
* then a view of InnoDB's transactions taken after that (:mod:`.innodb`: live from SHOW ENGINE INNODB STATUS,
  else INNODB_TRX proven fresh) shows no transaction the owner may still hold: any attached to the session
  that held the lock (when it was seen), else any prepared, idle one attached to a session that is gone from
  PROCESSLIST, killed or quitting, among those seen first once the lock was free (a later one cannot be the
  owner's).

A wait that runs out sends no verb: :class:`BranchBusyError` (a commit is retried with backoff, a roll-back is
left for the next sweep).  A session that has been disconnecting longer than a wait is checked again at every
verb but not waited for in full again.  When the owner's InnoDB transaction was seen, the verb is verified
afterwards: that transaction must be gone (:class:`HiddenBranchError` otherwise).

Without the PROCESS privilege InnoDB's transactions cannot be seen and the detach cannot be proven: the wait
ends once the lock is free, no session of the user is killed or quitting, and :data:`SETTLE_S` more have passed
(the detach follows the session's exit from PROCESSLIST within microseconds).  docs/operations.md says to
grant PROCESS.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import pymysql
from sqlalchemy.engine import Connection

from xasink.dialects.mysql.errors import PRIVILEGE_CODES, BranchBusyError, HiddenBranchError
from xasink.dialects.mysql.innodb import DISCONNECTING, Blocker, TrxReader
from xasink.dialects.mysql.sql import errno_of
from xasink.dialects.mysql.xa import owner_lock
from xasink.errors import BranchError
from xasink.protocol.xid import Xid

log = logging.getLogger("xasink.dialects.mysql")

DETACH_TIMEOUT_S = 30.0
OWNER_WAIT_S = 5.0  # longest wait for a branch's owner to let go before XA COMMIT / ROLLBACK is given up for now
PROVE_S = 1.0  # how long the look at many owners at once waits for them (each verb then waits for its own)
SETTLE_S = 0.05  # without PROCESS: the pause after the owner's lock and session are gone, for its InnoDB detach
_LOCKS_PER_QUERY = 200


@dataclass
class Owner:
    """What a wait learnt about one branch's owner."""

    lock: str | None  # the owner lock (None: a foreign branch, no lock)
    session: int | None = None  # the session seen holding the lock
    transactions: set[str] = field(default_factory=set)  # its InnoDB transactions, seen attached to it
    suspects: set[Blocker] | None = None  # lock free, session unknown: the disconnecting transactions seen then
    clear_since: float | None = None  # without PROCESS: when the lock and the sessions were first seen clear


class OwnerWatch:
    """The owner waits of one server: a reader of InnoDB's transactions, owners proven detached, slow sessions."""

    def __init__(self, raw_connect: Callable[[], Any]) -> None:
        self._raw_connect = raw_connect
        self._trx_visible = True  # whether this user may see InnoDB's transactions (the PROCESS privilege)
        self._trx = TrxReader(raw_connect)
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
    def prove(self, conn: Connection, xids: Iterable[Xid], timeout_s: float = PROVE_S) -> list[Xid]:
        """Wait (at most ``timeout_s``) until the owners of these branches are proven detached; those not proven.

        For many branches at once: one look at their locks and one view of InnoDB prove all whose owners are
        gone, so their verbs need not wait one by one (an owner still there is waited for by its own verb).
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
        view = self._trx.view(time.monotonic(), OWNER_WAIT_S)
        if view is None:
            log.warning("XA %s %s: InnoDB's transactions could not be read; its effect is not verified", verb, literal)
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
                view = self._trx.view(after, max(0.0, deadline - time.monotonic())) if free or out else None
            except pymysql.err.MySQLError as exc:
                if errno_of(exc) not in PRIVILEGE_CODES:
                    raise
                log.info("InnoDB's transactions are not readable (no PROCESS privilege): owner detaches not proven")
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
            leaving = {(session, "session") for session, command in _sessions(conn) if command in DISCONNECTING}
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

    def close(self) -> None:
        self._trx.close()


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
