"""LOAD DATA LOCAL vs multi-row INSERT inside one XA branch, on the machine's MariaDB (no Spark).

    python -m benchmarks.mysql_load [--rows 200000] [--repeat 3] [--url mysql+pymysql://root@127.0.0.1:3306/]

Rows (id BIGINT key, INT, DOUBLE, DECIMAL(12,2), a 10-40 character string with the odd tab/backslash,
DATE, DATETIME(6), a 16-byte binary, ~10% NULLs) are generated with pyarrow in 10,000-row batches, as
Spark's Arrow writer hands them over, and loaded by :class:`xasink.dialects.mysql.MySQLBranch` through
XA START .. XA PREPARE; the branch is then rolled back, so every run starts from the same empty table.
The figure is load + prepare, the part of a task that depends on the method.
"""

from __future__ import annotations

import argparse
import datetime as dt
import decimal
import statistics
import time
import uuid
from collections.abc import Iterator

import pyarrow as pa
import pymysql
from sqlalchemy.engine import make_url

from xasink.dialects.base import BranchSettings, TargetPlan
from xasink.dialects.mysql import MySQLBranch, MySQLDialect, xid_literal
from xasink.xid import Xid, new_run_nonce

SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("grp", pa.int32()),
        ("amount", pa.float64()),
        ("price", pa.decimal128(12, 2)),
        ("label", pa.string()),
        ("day", pa.date32()),
        ("ts", pa.timestamp("us")),
        ("tag", pa.binary()),
    ]
)
DDL = (
    "CREATE TABLE {t} (id BIGINT PRIMARY KEY, grp INT, amount DOUBLE, price DECIMAL(12,2), label VARCHAR(64), "
    "day DATE, ts DATETIME(6), tag VARBINARY(16)) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4"
)


def batches(rows: int, size: int = 10_000) -> Iterator[pa.RecordBatch]:
    base = dt.datetime(2024, 1, 1)
    for start in range(0, rows, size):
        ids = range(start, min(rows, start + size))
        yield pa.RecordBatch.from_arrays(
            [
                pa.array(ids, pa.int64()),
                pa.array([i % 1000 for i in ids], pa.int32()),
                pa.array([None if i % 10 == 0 else i * 0.5 for i in ids], pa.float64()),
                pa.array([decimal.Decimal(i % 100000) / 100 for i in ids], pa.decimal128(12, 2)),
                pa.array([f"label {i}" + ("\tx\\y" if i % 97 == 0 else "") + "z" * (i % 30) for i in ids]),
                pa.array([base.date() + dt.timedelta(days=i % 3000) for i in ids], pa.date32()),
                pa.array([base + dt.timedelta(seconds=i, microseconds=i % 999_999) for i in ids], pa.timestamp("us")),
                pa.array([None if i % 11 == 0 else i.to_bytes(8, "little") * 2 for i in ids], pa.binary()),
            ],
            schema=SCHEMA,
        )


def run_once(dialect: MySQLDialect, plan: TargetPlan, rows: int, data: list[pa.RecordBatch]) -> float:
    xid = Xid("0000000000", "bench", 0, 0, f"1-{new_run_nonce()}")
    branch = MySQLBranch(dialect, xid, plan)
    t0 = time.perf_counter()
    loaded = branch.load(iter(data))
    branch.cursor.execute(f"XA END {xid_literal(xid)}")
    branch.cursor.execute(f"XA PREPARE {xid_literal(xid)}")
    seconds = time.perf_counter() - t0
    branch.cursor.execute(f"XA ROLLBACK {xid_literal(xid)}")
    branch.conn.close()
    assert loaded == rows, (loaded, rows)
    return seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--url", default="mysql+pymysql://root@127.0.0.1:3306/")
    args = ap.parse_args()
    server = make_url(args.url)
    db = f"xasink_bench_{uuid.uuid4().hex[:8]}"
    admin = pymysql.connect(
        host=server.host,
        port=server.port or 3306,
        user=server.username,
        password=server.password or "",
        autocommit=True,
    )
    admin.cursor().execute(f"CREATE DATABASE {db}")
    try:
        admin.cursor().execute(DDL.format(t=f"{db}.bench"))
        dialect = MySQLDialect(server.set(database=db))
        plan = TargetPlan(None, "bench", SCHEMA, tuple(SCHEMA.names))
        data = list(batches(args.rows))
        print(f"{args.rows} rows, {len(data)} batches of 10,000; best and median of {args.repeat} runs (load+prepare)")
        for method, chunk in (("LOAD DATA", 10_000), ("LOAD DATA", 50_000), ("INSERT", 10_000), ("INSERT", 50_000)):
            dialect.settings = BranchSettings(local_infile=method == "LOAD DATA", batch_size=chunk)
            times = [run_once(dialect, plan, args.rows, data) for _ in range(args.repeat)]
            best, med = min(times), statistics.median(times)
            rate = args.rows / best
            print(f"{method:10} batch_size={chunk:>6}: best {best:6.2f}s  median {med:6.2f}s  {rate:>9,.0f} rows/s")
    finally:
        admin.cursor().execute(f"DROP DATABASE {db}")
        admin.close()


if __name__ == "__main__":
    main()
