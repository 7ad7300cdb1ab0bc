"""MySQL/MariaDB's side of ``xasink status`` health: prepared XA transactions, and sessions blocked by one.

There is no limit like PostgreSQL's ``max_prepared_transactions``: only the count is reported.  A prepared XA
branch that xasink left has no session (its owner disconnected right after PREPARE), so a lock wait whose
blocking InnoDB transaction has no live session is a wait on a prepared branch.  InnoDB does not say which xid
a transaction carries, so the blocker is named by its InnoDB transaction id (``innodb-trx:<id>``).

INNODB_TRX and INNODB_LOCK_WAITS are a cache that InnoDB refreshes only when it has not been read for 0.1 s;
under a client polling them faster it shows an old state.  A waiter is reported only while its session is
still in PROCESSLIST (which is no cache), so a wait that ended long ago is not reported.
"""

from __future__ import annotations

from sqlalchemy.engine import Connection

from xasink.dialects.mysql.xa import recovered
from xasink.dialects.values import BlockedSession

# the blocking transaction has no session: thread id 0, or a thread that is no longer listed (MariaDB can go on
# showing a gone session's id on a detached branch); a transaction being rolled back is not a prepared one
_DETACHED = (
    "b.trx_state <> 'ROLLING BACK' AND (b.trx_mysql_thread_id = 0 OR NOT EXISTS "
    "(SELECT 1 FROM information_schema.PROCESSLIST q WHERE q.ID = b.trx_mysql_thread_id))"
)

_MARIADB_SQL = (
    "SELECT r.trx_mysql_thread_id, p.DB, p.USER, p.TIME_MS / 1000, "
    "TIMESTAMPDIFF(MICROSECOND, r.trx_wait_started, NOW(6)) / 1000000, "
    "GROUP_CONCAT(DISTINCT b.trx_id ORDER BY b.trx_id) "
    "FROM information_schema.INNODB_LOCK_WAITS w "
    "JOIN information_schema.INNODB_TRX r ON r.trx_id = w.requesting_trx_id "
    "JOIN information_schema.INNODB_TRX b ON b.trx_id = w.blocking_trx_id "
    "JOIN information_schema.PROCESSLIST p ON p.ID = r.trx_mysql_thread_id "
    f"WHERE {_DETACHED} "
    "GROUP BY r.trx_id, r.trx_mysql_thread_id, p.DB, p.USER, p.TIME_MS, r.trx_wait_started "
    "ORDER BY r.trx_mysql_thread_id"
)

_MYSQL8_SQL = (
    "SELECT r.trx_mysql_thread_id, p.DB, p.USER, p.TIME, "
    "TIMESTAMPDIFF(MICROSECOND, r.trx_wait_started, NOW(6)) / 1000000, "
    "GROUP_CONCAT(DISTINCT b.trx_id ORDER BY b.trx_id) "
    "FROM performance_schema.data_lock_waits w "
    "JOIN information_schema.INNODB_TRX r ON r.trx_id = w.REQUESTING_ENGINE_TRANSACTION_ID "
    "JOIN information_schema.INNODB_TRX b ON b.trx_id = w.BLOCKING_ENGINE_TRANSACTION_ID "
    "JOIN information_schema.PROCESSLIST p ON p.ID = r.trx_mysql_thread_id "
    f"WHERE {_DETACHED} "
    "GROUP BY r.trx_id, r.trx_mysql_thread_id, p.DB, p.USER, p.TIME, r.trx_wait_started "
    "ORDER BY r.trx_mysql_thread_id"
)


def prepared_capacity(conn: Connection) -> tuple[int, None]:
    """Prepared XA transactions of the whole server (XA is server-wide); MySQL has no limit on them."""
    return len(recovered(conn)), None


def blocked_by_prepared(conn: Connection) -> list[BlockedSession]:
    """Every session waiting for a row lock that a prepared XA branch (a transaction with no session) holds."""
    sql = _MARIADB_SQL if getattr(conn.dialect, "is_mariadb", False) else _MYSQL8_SQL
    return [
        BlockedSession(
            int(r[0]),
            r[1],
            r[2],
            _age(r[3]),
            _age(r[4]),
            tuple(f"innodb-trx:{t}" for t in str(r[5] or "").split(",") if t),
        )
        for r in conn.exec_driver_sql(sql).fetchall()
    ]


def _age(value: object) -> float | None:
    return None if value is None else max(0.0, float(value))  # type: ignore[arg-type]
