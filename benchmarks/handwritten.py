"""Idempotent upserts as users write them by hand: foreachPartition, a DB-API driver, a commit per partition.

This is the usual answer to "exactly once" without XA: replays are harmless because each row is merged on its
key, but a failed job leaves the partitions that finished committed (a partial batch is visible until the
retry), and every row crosses into Python as a ``Row`` and back out as SQL parameters.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

CHUNK = 10_000  # rows handed to the driver per call
PAGE = 1_000  # rows per statement (psycopg2 execute_values page_size; pymysql multi-row INSERT)


def _quote_pg(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _quote_my(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def pg_upsert_sql(table: str, columns: Sequence[str], keys: Sequence[str]) -> str:
    cols = ", ".join(_quote_pg(c) for c in columns)
    updates = ", ".join(f"{_quote_pg(c)} = EXCLUDED.{_quote_pg(c)}" for c in columns if c not in keys)
    return (
        f"INSERT INTO {_quote_pg(table)} ({cols}) VALUES %s "
        f"ON CONFLICT ({', '.join(_quote_pg(k) for k in keys)}) DO UPDATE SET {updates}"
    )


def mysql_upsert_sql(table: str, columns: Sequence[str], keys: Sequence[str]) -> str:
    cols = ", ".join(_quote_my(c) for c in columns)
    marks = ", ".join(["%s"] * len(columns))
    updates = ", ".join(f"{_quote_my(c)} = VALUES({_quote_my(c)})" for c in columns if c not in keys)
    return f"INSERT INTO {_quote_my(table)} ({cols}) VALUES ({marks}) ON DUPLICATE KEY UPDATE {updates}"


def pg_partition(rows: Iterable[Any], conninfo: dict[str, Any], statement: str) -> None:
    import psycopg2
    from psycopg2.extras import execute_values

    conn = psycopg2.connect(**conninfo)
    try:
        with conn.cursor() as cur:
            buf: list[tuple[Any, ...]] = []
            for row in rows:
                buf.append(tuple(row))
                if len(buf) >= CHUNK:
                    execute_values(cur, statement, buf, page_size=PAGE)
                    buf = []
            if buf:
                execute_values(cur, statement, buf, page_size=PAGE)
        conn.commit()
    finally:
        conn.close()


def mysql_partition(rows: Iterable[Any], conninfo: dict[str, Any], statement: str) -> None:
    import pymysql

    conn = pymysql.connect(**conninfo, autocommit=False)
    try:
        with conn.cursor() as cur:
            buf: list[tuple[Any, ...]] = []
            for row in rows:
                buf.append(tuple(row))
                if len(buf) >= PAGE:  # pymysql rewrites executemany into one multi-row INSERT
                    cur.executemany(statement, buf)
                    buf = []
            if buf:
                cur.executemany(statement, buf)
        conn.commit()
    finally:
        conn.close()
