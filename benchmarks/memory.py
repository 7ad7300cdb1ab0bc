"""Python worker memory as partitions grow: the peak RSS of the writing worker, measured inside each task.

Each task resets its process's peak-RSS mark (``/proc/self/clear_refs``) before it starts writing and reads
``VmHWM`` when done, so a reused Python worker reports its own task's peak.  A streaming writer's peak stays
flat as the partition grows; one that materializes the partition grows with it.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from benchmarks import data
from benchmarks.env import Database
from benchmarks.sources import STATS_OPTION


def run_memory(spark: Any, db: Database, per_partition: list[int]) -> list[dict[str, Any]]:
    out = []
    table = "mem_probe"
    writers: list[tuple[str, dict[str, str]]] = [("arrow-noop", {})]
    if db.xasink_ok:
        writers += [
            ("xasink", {"url": db.xasink_url, "dbtable": table, "createTable": "false"}),
            (
                "xasink-upsert",
                {"url": db.xasink_url, "dbtable": table, "createTable": "false", "upsertKeyColumns": "id"},
            ),
        ]
    warm = data.frame(spark, "narrow", 1000 * data.PARTITIONS)
    for writer, opts in writers:  # the workers import their modules first, so that is not counted as growth
        data.create_table(db, table, "narrow")
        fmt = "bench_noop" if writer == "arrow-noop" else "bench_rss"
        warm.write.format(fmt).options(**opts).mode("append").save()
    for per in per_partition:
        total = per * data.PARTITIONS
        df = data.frame(spark, "narrow", total).cache()
        df.count()
        try:
            for writer, opts in writers:
                data.create_table(db, table, "narrow")
                with tempfile.TemporaryDirectory(prefix="bench-rss-") as stats:
                    fmt = "bench_noop" if writer == "arrow-noop" else "bench_rss"
                    df.write.format(fmt).options(**opts).option(STATS_OPTION, stats).mode("append").save()
                    tasks = [json.loads(p.read_text()) for p in Path(stats).glob("*.json")]
                out.append(
                    {
                        "db": db.kind,
                        "writer": writer,
                        "rows_per_partition": per,
                        "tasks": len(tasks),
                        "peak_rss_mb": round(max(t["peak_rss_kb"] for t in tasks) / 1024, 1),
                        "rss_at_task_start_mb": round(max(t["rss_start_kb"] for t in tasks) / 1024, 1),
                        "peak_over_start_mb": round(max(t["peak_rss_kb"] - t["rss_start_kb"] for t in tasks) / 1024, 1),
                        "peak_reset": all(t["peak_reset"] for t in tasks),
                    }
                )
        finally:
            df.unpersist()
            db.drop(table)
    return out
