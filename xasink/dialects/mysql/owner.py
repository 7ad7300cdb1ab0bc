"""Waiting for a branch's owner session to finish disconnecting, before anyone else finishes the branch.

A prepared branch can be finished by another session only after its owner disconnected; a verb that races
with the disconnect can answer OK (or XAER_NOTA) while the transaction stays prepared, unlisted and holding
its locks until the server restarts (see the package doc and tests/test_dialect_edges.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from xasink.dialects.mysql.errors import PRIVILEGE_CODES
from xasink.dialects.mysql.sql import errno_of
from xasink.dialects.mysql.xa import owner_lock
from xasink.errors import BranchError
from xasink.protocol.xid import Xid

log = logging.getLogger("xasink.dialects.mysql")

DETACH_TIMEOUT_S = 30.0
# InnoDB refreshes the cache behind INNODB_TRX only when nobody has read it for 0.1 s (trx_i_s_cache's
# CACHE_MIN_IDLE_TIME_US): sessions that read it more often, together, freeze it server-wide and every reader
# sees stale rows.  So it is read at most this often here, and only by whoever finishes a branch.
TRX_POLL_S = 0.15
OWNER_WAIT_S = 5.0  # longest wait for a branch's owner to finish disconnecting before XA COMMIT / ROLLBACK

# Sessions still disconnecting while InnoDB holds their transaction attached: the branch's owner (named by its
# owner lock), whether it is still listed or already gone from PROCESSLIST, and any transaction of a session
# that is gone or being killed or quitting (an owner past releasing its locks but not yet detached).
# A transaction whose session is gone and that INNODB_TRX still shows in LOCK WAIT is not disconnecting: MariaDB
# 10.11 leaves that state (and the thread id) on a branch that waited for a row lock before it prepared, long
# after its owner left (tests/test_late_branch.py, the blocked upsert copy); a live waiter is in PROCESSLIST.
# Each row names the session and what it is disconnecting with: the branch's owner lock, or its InnoDB
# transaction id (never reused, not even across a restart, unlike the session id).
_DISCONNECTING_SQL = (
    "SELECT ID, %(lock)s FROM information_schema.PROCESSLIST WHERE ID = IS_USED_LOCK(%(lock)s) UNION "
    "SELECT t.trx_mysql_thread_id, CAST(t.trx_id AS CHAR) FROM information_schema.INNODB_TRX t "
    "WHERE t.trx_mysql_thread_id <> 0 "
    "AND t.trx_state NOT IN ('ROLLING BACK', 'LOCK WAIT') "
    "AND (t.trx_mysql_thread_id = IS_USED_LOCK(%(lock)s) OR NOT EXISTS "
    "(SELECT 1 FROM information_schema.PROCESSLIST p WHERE p.ID = t.trx_mysql_thread_id "
    "AND p.COMMAND NOT IN ('Killed', 'Quit')))"
)
_DISCONNECTING_SQL_NO_TRX = (  # without the PROCESS privilege (INNODB_TRX is not readable)
    "SELECT ID, %(lock)s FROM information_schema.PROCESSLIST WHERE ID = IS_USED_LOCK(%(lock)s)"
)


class OwnerWatch:
    """The waits, with what they learnt about this server (INNODB_TRX readable, sessions given up on)."""

    def __init__(self, raw_connect: Callable[[], Any]) -> None:
        self._raw_connect = raw_connect
        self._trx_visible = True  # whether this user may read INNODB_TRX (the PROCESS privilege)
        # (session, owner lock or InnoDB transaction id) await_owner gave up on: never the session id alone,
        # which a server restart hands out again from 1 (a new branch's live owner must not be skipped)
        self._stuck: frozenset[tuple[int, str]] = frozenset()

    def wait_detached(self, connection_id: int, timeout_s: float = DETACH_TIMEOUT_S) -> None:
        """Return once session ``connection_id`` (a branch's, after PREPARE and disconnect) has left PROCESSLIST.

        InnoDB detaches the session's prepared transaction moments after that (``THD::free_connection`` runs
        after ``server_threads.erase``), and that last step is not waited for here: every XA COMMIT and XA
        ROLLBACK xasink sends first waits in :meth:`await_owner` until no transaction of a session that is
        gone, killed or quitting is attached (the same INNODB_TRX condition, for any owner).  Reading
        INNODB_TRX here cost a branch a TRX_POLL_S sleep whenever its cache was not refreshed yet (it is only
        refreshed after 0.1 s without readers), while by the time the driver commits the detach is long done.
        PROCESSLIST is read live, so it is polled fast.
        """
        conn = self._raw_connect()
        try:
            cur = conn.cursor()
            deadline = time.monotonic() + timeout_s
            delay = 0.001
            while self._listed(cur, connection_id):
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
    def _listed(cur: Any, connection_id: int) -> bool:
        cur.execute("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = %s", (connection_id,))
        row = cur.fetchone()
        return row is not None and int(row[0]) > 0

    def await_owner(self, conn: Connection, xid: Xid | None, timeout_s: float = OWNER_WAIT_S) -> None:
        """Wait until no session that may own the branch is still disconnecting: then XA COMMIT / ROLLBACK is safe.

        A verb that lands while the owner's disconnect is in flight can answer OK (or XAER_NOTA) while the
        transaction stays prepared, unlisted and holding its row locks until the server restarts (measured on
        MariaDB 10.11 for COMMIT and ROLLBACK: tests/test_dialect_edges.py).  A branch's session holds its
        owner lock, so the owner is known while it lives; an owner already past releasing it shows as an
        InnoDB transaction of a session that is gone, killed or quitting.  Bounded: a hung owner is left to
        the verb's XAER_NOTA handling.
        """
        lock = owner_lock(xid) if xid is not None else "xasink-owner:-"  # foreign: no owner lock
        deadline = time.monotonic() + timeout_s
        delay = 0.001
        while True:
            query = _DISCONNECTING_SQL if self._trx_visible else _DISCONNECTING_SQL_NO_TRX
            try:
                found = {(int(r[0]), str(r[1])) for r in conn.exec_driver_sql(query, {"lock": lock})}
                pending = found - self._stuck
            except sa.exc.DBAPIError as exc:
                if not self._trx_visible or errno_of(exc) not in PRIVILEGE_CODES:
                    raise
                self._trx_visible = False
                continue
            if not pending:
                return
            if time.monotonic() > deadline:
                # a session that takes this long (a hung writer, another application's huge disconnect) is
                # not waited for again: the next branches would each wait as long for nothing
                self._stuck = self._stuck | pending
                log.debug(
                    "%s: sessions %s still disconnecting after %.0fs; going on",
                    xid,
                    sorted({session for session, _ in pending}),
                    timeout_s,
                )
                return
            time.sleep(max(delay, TRX_POLL_S) if self._trx_visible else delay)  # INNODB_TRX: see TRX_POLL_S
            delay = min(delay * 2, 0.05)
