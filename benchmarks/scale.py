"""Coordinator scale: the time to decide and commit a batch of N prepared branches (no Spark).

Branches are prepared with :func:`xasink.protocol.partition_writer.write_partition` on one-row batches, then
:meth:`xasink.protocol.coordinator.Coordinator.commit` is timed: the decision record (under the sink lock, after
checking every branch is prepared), COMMIT PREPARED of each branch in a small pool, the mark, and the sweep.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import pyarrow as pa

from benchmarks.env import Database
from xasink.options import parse_options
from xasink.protocol.coordinator import Coordinator
from xasink.protocol.partition_writer import write_partition
from xasink.protocol.xid import new_run_nonce
from xasink.write_modes.schema import plan_target


def run_scale(db: Database, counts: list[int], runs: int, parallelism: list[int]) -> list[dict[str, Any]]:
    table = "scale_branches"
    db.execute(f"DROP TABLE IF EXISTS {db.quote(table)}", f"CREATE TABLE {db.quote(table)} (id bigint, v text)")
    out = []
    for n in counts:
        for par in parallelism:
            totals, decide, commit, sweep, prepare = [], [], [], [], []
            sink = f"scale-{n}-{par}-{int(time.time())}"
            for r in range(runs):
                options = parse_options(
                    {
                        "url": db.xasink_url,
                        "dbtable": table,
                        "sinkId": sink,
                        "batchId": r,
                        "commitParallelism": par,
                        "createTable": "false",
                    }
                )
                coordinator = Coordinator(options)
                try:
                    coordinator.preflight(n)
                    schema = pa.schema([("id", pa.int64()), ("v", pa.string())])
                    with coordinator.dialect.connect() as conn:
                        plan = plan_target(coordinator.dialect, conn, options, schema)
                    run = new_run_nonce()
                    t0 = time.perf_counter()
                    outcomes = [
                        write_partition(
                            options,
                            plan,
                            batch_id=r,
                            partition=p,
                            task_attempt_id=p,
                            run=run,
                            batches=[pa.RecordBatch.from_pylist([{"id": p, "v": "x"}], schema=schema)],
                        )
                        for p in range(n)
                    ]
                    prepare.append(time.perf_counter() - t0)
                    t1 = time.perf_counter()
                    result = coordinator.commit(r, outcomes)
                    totals.append(time.perf_counter() - t1)
                    decide.append(result.timings.get("decide", 0.0))
                    commit.append(result.timings.get("commit", 0.0))
                    sweep.append(result.timings.get("sweep", 0.0))
                finally:
                    coordinator.close()
            out.append(
                {
                    "branches": n,
                    "commit_parallelism": par,
                    "runs": runs,
                    "decide_commit_s": round(statistics.median(totals), 4),
                    "decide_s": round(statistics.median(decide), 4),
                    "commit_s": round(statistics.median(commit), 4),
                    "sweep_s": round(statistics.median(sweep), 4),
                    "all_runs_s": [round(t, 4) for t in totals],
                    "prepare_all_branches_s": round(statistics.median(prepare), 3),
                    "prepared_left": db.prepared(),
                }
            )
    db.drop(table)
    return out
