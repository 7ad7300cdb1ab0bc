"""The extra space and log an overwrite costs the server: the shadow table, the target's growth, WAL / redo / undo.

A keyed target (primary key ``id``, an index on ``day``, as ``benchmarks.modes``) of ``--rows`` rows is
overwritten by as many rows, 95% of the keys the same.  Four sessions load the shadow (as four branches do), then
xasink's own apply (:func:`xasink.write_modes.statements.apply_statements`, in one transaction at the dialect's
isolation) replaces the rows and clears the shadow.  Measured around each step:

* PostgreSQL: WAL written (``pg_current_wal_lsn`` difference), ``pg_total_relation_size`` of the shadow after
  the load and of the target before and after (its dead rows and index growth until VACUUM).
* MariaDB / MySQL: redo written (``Innodb_os_log_written``), the shadow's ``data_length + index_length`` after
  the load, the InnoDB history list length (undo not yet purged) right after the commit, and the system
  tablespace's growth (``ibdata1``, where undo lives with ``innodb_undo_tablespaces = 0``) when readable.

``--layout`` picks the MariaDB shadow: ``keyed`` (primary key (batch, tag, row), what xasink makes) or
``indexed`` (no key, a secondary (batch, branch) index: what xasink made before); ``both`` measures them one
after the other.  PostgreSQL's shadow has one layout.

    python -m benchmarks.space --db mariadb --layout both --rows 1000000
    python -m benchmarks.space --db postgresql --url postgresql://postgres@127.0.0.1:5432/postgres
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

from xasink.database_url import parse_url
from xasink.dialects import dialect_for
from xasink.dialects.values import SHADOW_ROW_COLUMN, SHADOW_TAG_COLUMN, branch_tag
from xasink.write_modes.shadow import DecidedRows
from xasink.write_modes.spec import OVERWRITE, ApplySpec
from xasink.write_modes.statements import apply_statements, ensure_shadow

BRANCHES = ("b0", "b1", "b2", "b3")
TARGET, SHADOW = "xasink_space_t", "xasink_space_sh"
COLUMNS = ("id", "day", "grp", "amount", "label", "seq")


def rows_sql(mysql: bool, lo: int, hi: int, rows: int, seq: int) -> str:
    """``SELECT`` of rows [lo, hi) of version ``seq`` (MariaDB: its sequence engine; PostgreSQL: generate_series)."""
    if mysql:
        return (
            f"SELECT seq, date_add('2026-01-01', interval (seq * 10 div {rows}) day), seq % 1000, seq * 0.5 + {seq}, "
            f"concat('v{seq}-', seq % 100000), {seq} FROM seq_{lo}_to_{hi - 1}"
        )
    return (
        f"SELECT g, date '2026-01-01' + (g * 10 / {rows})::int, (g % 1000)::int, g * 0.5 + {seq}, "
        f"'v{seq}-' || (g % 100000), {seq}::bigint FROM generate_series({lo}, {hi - 1}) g"
    )


class Server:
    """One server: admin statements and the figures read from it."""

    def __init__(self, url: str) -> None:
        self.url = parse_url(url)
        self.dialect = dialect_for(self.url)
        self.mysql = self.url.get_backend_name() == "mysql"
        self.engine = sa.create_engine(self.url, isolation_level="AUTOCOMMIT")

    def run(self, *statements: str) -> None:
        with self.engine.connect() as conn:
            for statement in statements:
                conn.exec_driver_sql(statement.replace("%", "%%"))

    def scalar(self, statement: str) -> Any:
        with self.engine.connect() as conn:
            return conn.exec_driver_sql(statement.replace("%", "%%")).scalar()

    def log_position(self) -> int:
        """Bytes of WAL / redo written so far."""
        if self.mysql:
            return int(
                self.scalar(
                    "SELECT variable_value FROM information_schema.global_status "
                    "WHERE variable_name = 'INNODB_OS_LOG_WRITTEN'"
                )
            )
        return int(self.scalar("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')"))

    def size(self, table: str) -> int:
        if self.mysql:
            self.run(f"ANALYZE TABLE {table}")
            return int(
                self.scalar(
                    "SELECT data_length + index_length FROM information_schema.tables "
                    f"WHERE table_schema = DATABASE() AND table_name = '{table}'"
                )
            )
        return int(self.scalar(f"SELECT pg_total_relation_size('{table}')"))

    def history(self) -> int | None:
        if not self.mysql:
            return None
        return int(
            self.scalar("SELECT count FROM information_schema.innodb_metrics WHERE name = 'trx_rseg_history_len'")
        )

    def system_tablespace(self) -> int | None:
        if not self.mysql:
            return None
        path = os.path.join(str(self.scalar("SELECT @@datadir")), "ibdata1")
        return os.path.getsize(path) if os.access(path, os.R_OK) else None


def prepare(server: Server, rows: int, layout: str) -> ApplySpec:
    """A fresh target of ``rows`` rows and an empty shadow of ``layout``; the spec of overwriting the target."""
    q = "`" if server.mysql else '"'
    types = (
        ("BIGINT", "DATE", "INT", "DOUBLE", "VARCHAR(32)", "BIGINT")
        if server.mysql
        else ("bigint", "date", "integer", "double precision", "text", "bigint")
    )
    cols = ", ".join(f"{q}{c}{q} {t}" for c, t in zip(COLUMNS, types, strict=True))
    server.run(
        f"DROP TABLE IF EXISTS {TARGET}",
        f"DROP TABLE IF EXISTS {SHADOW}",
        f"CREATE TABLE {TARGET} ({cols}, PRIMARY KEY (id))",
        f"CREATE INDEX {TARGET}_day ON {TARGET} (day)",
        f"INSERT INTO {TARGET} {rows_sql(server.mysql, 0, rows, rows, 1)}",
    )
    spec = ApplySpec(kind=OVERWRITE, schema=None, table=TARGET, shadow=SHADOW, columns=COLUMNS, keys=("id",))
    if layout == "indexed":  # the shadow as xasink made it before it keyed it by (batch, branch, row)
        server.run(
            f"CREATE TABLE {SHADOW} ({cols}, xasink_batch_ BIGINT NOT NULL, xasink_branch_ VARCHAR(64) "
            f"NOT NULL, KEY {SHADOW}_br (xasink_batch_, xasink_branch_)) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4"
        )
    else:
        with server.dialect.connect() as conn:
            ensure_shadow(server.dialect, conn, spec)
    server.run("ANALYZE TABLE " + TARGET if server.mysql else f"VACUUM ANALYZE {TARGET}")
    server.run("SELECT 1" if server.mysql else "CHECKPOINT")
    return spec


def load(server: Server, rows: int, layout: str) -> None:
    """The batch into the shadow by four concurrent transactions, as four branches load it."""
    lo, hi = rows // 20, rows + rows // 20
    per = -(-(hi - lo) // len(BRANCHES))
    numbered = server.mysql and layout == "keyed"

    def branch(i: int) -> None:
        with server.engine.connect() as conn:
            conn.exec_driver_sql("BEGIN")
            a, b = lo + i * per, min(hi, lo + (i + 1) * per)
            for s in range(a, b, 20_000):
                e = min(b, s + 20_000)
                extra = f", 1, '{BRANCHES[i]}'" + (f", {branch_tag(BRANCHES[i])}, seq - {a} + 1" if numbered else "")
                select = rows_sql(server.mysql, s, e, rows, 2).replace(" FROM ", f"{extra} FROM ", 1)
                conn.exec_driver_sql(f"INSERT INTO {SHADOW} {select}".replace("%", "%%"))
            conn.exec_driver_sql("COMMIT")

    threads = [threading.Thread(target=branch, args=(i,)) for i in range(len(BRANCHES))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def shadow_rows(server: Server, layout: str) -> DecidedRows:
    """The four branches' rows, found as the apply finds them: by the shadow's key when it has one."""
    keyed = server.mysql and layout == "keyed"
    return DecidedRows(BRANCHES, (SHADOW_TAG_COLUMN, SHADOW_ROW_COLUMN) if keyed else ())


def measure(server: Server, rows: int, layout: str) -> dict[str, Any]:
    spec = prepare(server, rows, layout)
    target_before = server.size(TARGET)
    log0, ibdata0 = server.log_position(), server.system_tablespace()
    t0 = time.perf_counter()
    load(server, rows, layout)
    load_s = time.perf_counter() - t0
    log1 = server.log_position()
    shadow = server.size(SHADOW)
    t1 = time.perf_counter()
    with server.dialect.connect() as conn:
        if server.dialect.apply_isolation is not None:
            conn.execution_options(isolation_level=server.dialect.apply_isolation)
        with conn.begin():
            written = apply_statements(server.dialect, conn, spec, 1, shadow_rows(server, layout))
    apply_s = time.perf_counter() - t1
    history = server.history()
    log2, ibdata2 = server.log_position(), server.system_tablespace()
    mb = 1e6
    out: dict[str, Any] = {
        "db": "mariadb" if server.mysql else "postgresql",
        "layout": layout if server.mysql else "heap",
        "rows": rows,
        "written": written,
        "load_s": round(load_s, 2),
        "apply_s": round(apply_s, 2),
        "shadow_after_load_MB": round(shadow / mb, 1),
        "log_load_MB": round((log1 - log0) / mb, 1),
        "log_apply_MB": round((log2 - log1) / mb, 1),
        "target_before_MB": round(target_before / mb, 1),
        "target_after_MB": round(server.size(TARGET) / mb, 1),
        "shadow_after_apply_MB": round(server.size(SHADOW) / mb, 1),
    }
    if history is not None:
        out["history_list_after_apply"] = history
    if ibdata0 is not None and ibdata2 is not None:
        out["system_tablespace_growth_MB"] = round((ibdata2 - ibdata0) / mb, 1)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.space", description=__doc__.split("\n\n")[0])
    ap.add_argument("--db", choices=("postgresql", "mariadb"), required=True)
    ap.add_argument("--url", help="the server (default: 127.0.0.1, root / postgres, database xasink_space)")
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--layout", choices=("keyed", "indexed", "both"), default="keyed", help="MariaDB's shadow")
    ap.add_argument("--keep", action="store_true", help="leave the tables (default: dropped at the end)")
    args = ap.parse_args(argv)
    if args.db == "mariadb":
        url = args.url or "mysql://root@127.0.0.1:3306/xasink_space"
        admin = sa.create_engine(parse_url(url).set(database=""), isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.exec_driver_sql(f"CREATE DATABASE IF NOT EXISTS {parse_url(url).database}")
    else:
        url = args.url or "postgresql://postgres@127.0.0.1:5432/postgres"
    server = Server(url)
    layouts = ("indexed", "keyed") if args.layout == "both" and server.mysql else (args.layout,)
    step: Callable[[str], dict[str, Any]] = lambda layout: measure(server, args.rows, layout)  # noqa: E731
    try:
        for layout in layouts:
            print(json.dumps(step(layout)), flush=True)
    finally:
        if not args.keep:
            server.run(f"DROP TABLE IF EXISTS {TARGET}", f"DROP TABLE IF EXISTS {SHADOW}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
