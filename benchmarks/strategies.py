"""How to merge inside a prepared PostgreSQL branch: the measurement behind xasink's choice (no Spark).

Temporary tables cannot be PREPAREd, so the two candidates are:

* ``staging``: CREATE UNLOGGED TABLE, binary COPY (ADBC ingest) into it, one
  INSERT .. SELECT DISTINCT ON (key) .. ON CONFLICT DO UPDATE, DROP, all inside the transaction;
* ``unnest``: per chunk of 10,000 rows one INSERT .. SELECT DISTINCT ON (key) .. FROM unnest($1..$n)
  .. ON CONFLICT DO UPDATE with the columns bound as Arrow list arrays (what xasink does).

Both start from a table holding every other key, so half the rows update and half insert, and both commit
plainly (PREPARE costs the same for both).
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from benchmarks.env import Database
from xasink.dialects.base import TargetPlan
from xasink.dialects.postgres import upsert_sql

CHUNK = 10_000


def _batches(rows: int) -> list[pa.RecordBatch]:
    out = []
    for lo in range(0, rows, CHUNK):
        ids = np.arange(lo, min(rows, lo + CHUNK), dtype=np.int64)
        out.append(
            pa.RecordBatch.from_arrays(
                [
                    pa.array(ids),
                    pa.array((ids % 1000).astype(np.int32)),
                    pa.array(ids * 0.5),
                    pa.array(np.char.add("L", (ids % 100000).astype(str)).astype(object)),
                    pa.array((1_700_000_000_000_000 + ids * 1_000_000), pa.timestamp("us", tz="UTC")),
                ],
                names=["id", "grp", "amount", "label", "ts"],
            )
        )
    return out


DDL = "(id bigint PRIMARY KEY, grp integer, amount double precision, label text, ts timestamptz)"


def run_strategies(db: Database, rows: int, runs: int) -> list[dict[str, Any]]:
    import adbc_driver_postgresql.dbapi as adbc

    uri = f"postgresql://{db.user}@{db.host}:{db.port}/{db.database}"
    batches = _batches(rows)
    schema = batches[0].schema
    seed = [b.filter(pc.equal(pc.bit_wise_and(b.column(0), 1), 0)) for b in batches]
    plan = TargetPlan(None, "strat", schema, tuple(schema.names), ("id",))
    unnest = upsert_sql(plan)
    cols = ", ".join(f'"{n}"' for n in schema.names)
    updates = ", ".join(f'"{n}" = EXCLUDED."{n}"' for n in schema.names if n != "id")
    staging = (
        f'INSERT INTO "strat" ({cols}) SELECT DISTINCT ON ("id") {cols} FROM "strat_stage" '
        f'ORDER BY "id", ctid DESC ON CONFLICT ("id") DO UPDATE SET {updates}'
    )
    times: dict[str, list[float]] = {"staging": [], "unnest": []}
    for _ in range(runs):
        for method in ("staging", "unnest"):
            db.execute('DROP TABLE IF EXISTS "strat"', f'CREATE TABLE "strat" {DDL}')
            with adbc.connect(uri, autocommit=True) as setup, setup.cursor() as cur:
                cur.adbc_ingest("strat", pa.RecordBatchReader.from_batches(schema, iter(seed)), mode="append")
            db.execute('VACUUM ANALYZE "strat"', "CHECKPOINT")
            with adbc.connect(uri, autocommit=False) as conn, conn.cursor() as cur:
                t0 = time.perf_counter()
                if method == "staging":
                    cur.execute(f'CREATE UNLOGGED TABLE "strat_stage" AS SELECT {cols} FROM "strat" WITH NO DATA')
                    cur.adbc_ingest(
                        "strat_stage", pa.RecordBatchReader.from_batches(schema, iter(batches)), mode="append"
                    )
                    cur.execute(staging)
                    cur.execute('DROP TABLE "strat_stage"')
                else:
                    for b in batches:
                        offsets = pa.array([0, b.num_rows], type=pa.int32())
                        params = pa.RecordBatch.from_arrays(
                            [pa.ListArray.from_arrays(offsets, col) for col in b.columns],
                            names=[f"p{i}" for i in range(b.num_columns)],
                        )
                        cur.execute(unnest, parameters=params)
                conn.commit()
                times[method].append(time.perf_counter() - t0)
            got = db.count("strat")
            if got != rows:
                raise RuntimeError(f"{method}: expected {rows} rows, found {got}")
    db.drop("strat")
    return [
        {
            "method": m,
            "rows": rows,
            "median_s": round(statistics.median(t), 3),
            "runs_s": [round(x, 3) for x in t],
            "rows_per_s": round(rows / statistics.median(t)),
        }
        for m, t in times.items()
    ]
