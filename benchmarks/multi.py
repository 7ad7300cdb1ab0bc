"""Three tables across two databases: one ``xasink.transaction`` against three separate writes.

    python -m benchmarks.multi --rows 20000 --runs 1            # harness check (small)
    python -m benchmarks.multi --rows 1000000,2000000 --runs 3  # real sizes, on a quiet machine

Contenders, each writing the same cached narrow DataFrame (``--rows`` rows, 4 partitions) into two
PostgreSQL tables (the benchmark's private cluster) and one MariaDB table (a scratch database):

* ``transaction``: one ``xasink.transaction`` with three ``tx.write`` (all commit or none);
* ``xasink-x3``: three separate ``xasink.write`` (each atomic alone);
* ``jdbc-x3``: three separate Spark JDBC writes, tuned (batchsize 10000, batched-insert rewrite).

Each run starts from freshly created tables (not timed) and is checked (row counts, nothing left
prepared). Results: ``benchmarks/results/<name>.json`` and a markdown table on standard output.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.contenders import jdbc_write
from benchmarks.data import create_table, frame
from benchmarks.env import Database, drop_scratch, jars, machine, mariadb, spark_session, start_postgres

log = logging.getLogger("benchmarks")
RESULTS = Path(__file__).resolve().parent / "results"
Targets = list[tuple[Database, str]]


def run_transaction(df: Any, targets: Targets, batch: int) -> None:
    import xasink

    with xasink.transaction(sink_id=f"b-tx-{uuid.uuid4().hex[:8]}", batch_id=batch) as tx:
        for db, table in targets:
            tx.write(df, db.xasink_url, table)


def run_xasink_x3(df: Any, targets: Targets, batch: int) -> None:
    import xasink

    for db, table in targets:
        xasink.write(df, db.xasink_url, table, sink_id=f"b-x3-{uuid.uuid4().hex[:8]}", batch_id=batch)


def run_jdbc_x3(df: Any, targets: Targets, batch: int) -> None:
    for db, table in targets:
        jdbc_write(df, db, tuned=True, table=table)


CONTENDERS: dict[str, Callable[[Any, Targets, int], None]] = {
    "transaction": run_transaction,
    "xasink-x3": run_xasink_x3,
    "jdbc-x3": run_jdbc_x3,
}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.multi", description=__doc__.splitlines()[0])
    p.add_argument("--rows", default="20000", help="comma-separated sizes (rows per table)")
    p.add_argument("--runs", type=int, default=3, help="measured rounds per size (median reported)")
    p.add_argument("--warmup", type=int, default=1, help="unmeasured rounds first")
    p.add_argument("--contenders", default=",".join(CONTENDERS))
    p.add_argument("--name", default=None)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    sizes = [int(s) for s in args.rows.split(",")]
    names = [c for c in args.contenders.split(",") if c]
    server, pg = start_postgres(durable=True)
    maria = mariadb()
    if maria is None:
        server.stop()
        raise SystemExit("MariaDB is required (two databases)")
    jar_paths, notes = jars()
    if notes and "jdbc-x3" in names:
        names.remove("jdbc-x3")
        log.warning("jdbc-x3 skipped: %s", "; ".join(notes))
    spark = spark_session("local[4]", 10_000, jar_paths)
    results: dict[str, Any] = {"machine": machine(), "sizes": {}, "runs": args.runs}
    try:
        for size in sizes:
            df = frame(spark, "narrow", size).cache()
            df.count()
            times: dict[str, list[float]] = {n: [] for n in names}
            for rnd in range(args.warmup + args.runs):
                for name in names:
                    targets = [(pg, "bench_orders"), (pg, "bench_lines"), (maria, "bench_events")]
                    for db, table in targets:
                        create_table(db, table, "narrow")
                    pg.settle()
                    t0 = time.perf_counter()
                    CONTENDERS[name](df, targets, rnd)
                    seconds = time.perf_counter() - t0
                    counts = [db.count(table) for db, table in targets]
                    assert counts == [size] * 3, (name, counts)
                    assert pg.leftover_prepared() == 0 and maria.leftover_prepared() == 0, name
                    if rnd >= args.warmup:
                        times[name].append(seconds)
                    log.info("%s rows=%d round=%d: %.2f s", name, size, rnd, seconds)
            df.unpersist()
            results["sizes"][str(size)] = {n: {"median_s": statistics.median(t), "runs_s": t} for n, t in times.items()}
    finally:
        spark.stop()
        for db, table in ((pg, "bench_orders"), (pg, "bench_lines"), (maria, "bench_events")):
            db.drop(table)
        drop_scratch(maria)
        server.stop()
    name = args.name or f"multi-{time.strftime('%Y%m%d-%H%M%S')}"
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(results, indent=2))
    print(f"\n| rows per table | {' | '.join(names)} |\n|---|{'---|' * len(names)}")
    for size, row in results["sizes"].items():
        print(f"| {size} | " + " | ".join(f"{row[n]['median_s']:.2f} s" for n in names) + " |")
    print(f"\nresults: {RESULTS / (name + '.json')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
