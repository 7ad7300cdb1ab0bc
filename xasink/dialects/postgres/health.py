"""PostgreSQL's side of ``xasink status`` health: prepared-transaction slots, and sessions blocked by a prepared one.

A prepared transaction has no backend, so ``pg_blocking_pids`` names it as pid 0.  Its locks are listed in
``pg_locks`` with no pid, under one virtual transaction that also holds the lock on its own transaction id
(``pg_prepared_xacts.transaction``): that is how a waiting lock is traced back to the gid that holds it.
"""

from __future__ import annotations

from sqlalchemy.engine import Connection

from xasink.dialects.values import BlockedSession

_TARGET = (
    "locktype",
    "database",
    "relation",
    "page",
    "tuple",
    "virtualxid",
    "transactionid",
    "classid",
    "objid",
    "objsubid",
)

_BLOCKED_SQL = f"""
WITH prep AS (
    SELECT p.gid, l.virtualtransaction AS vxid
    FROM pg_prepared_xacts p
    JOIN pg_locks l ON l.locktype = 'transactionid' AND l.transactionid = p.transaction AND l.pid IS NULL
), held AS (
    SELECT prep.gid, l.* FROM pg_locks l JOIN prep ON l.virtualtransaction = prep.vxid AND l.pid IS NULL
)
SELECT a.pid, a.datname, a.usename,
       EXTRACT(EPOCH FROM now() - a.query_start)::float8,
       (SELECT EXTRACT(EPOCH FROM now() - min(w.waitstart))::float8 FROM pg_locks w
         WHERE w.pid = a.pid AND NOT w.granted),
       ARRAY(SELECT DISTINCT h.gid FROM pg_locks w JOIN held h ON {
    " AND ".join(f"h.{c} IS NOT DISTINCT FROM w.{c}" for c in _TARGET)
}
             WHERE w.pid = a.pid AND NOT w.granted ORDER BY 1)
FROM pg_stat_activity a
WHERE 0 = ANY(pg_blocking_pids(a.pid))
ORDER BY a.pid
"""


def prepared_capacity(conn: Connection) -> tuple[int, int]:
    """Prepared transactions of the whole cluster (every database uses the same slots), and the limit."""
    in_use = int(conn.exec_driver_sql("SELECT count(*) FROM pg_prepared_xacts").scalar_one())
    limit = int(conn.exec_driver_sql("SHOW max_prepared_transactions").scalar_one())
    return in_use, limit


def blocked_by_prepared(conn: Connection) -> list[BlockedSession]:
    """Every session of the cluster waiting for a lock that a prepared transaction holds (or queued behind one)."""
    return [
        BlockedSession(int(r[0]), r[1], r[2], _age(r[3]), _age(r[4]), tuple(r[5] or ()))
        for r in conn.exec_driver_sql(_BLOCKED_SQL).fetchall()
    ]


def _age(value: object) -> float | None:
    return None if value is None else max(0.0, float(value))  # type: ignore[arg-type]
