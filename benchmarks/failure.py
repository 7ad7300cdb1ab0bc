"""One partition fails after the others have written: what does a concurrent reader see?

For each contender the same job runs twice: first with the last row of the last partition poisoned (a
Python UDF that waits until Spark reports the other three tasks of the stage finished, i.e. their rows are
committed or prepared, then raises), then again clean, as a user reruns a failed job.  A reader thread in
READ COMMITTED polls ``count(*)`` and ``count(DISTINCT id)`` every ~50 ms throughout.  The result says
what the table showed: a partial batch, duplicates after the retry, or nothing until the whole batch was
there.
"""

from __future__ import annotations

import logging
import os
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from benchmarks import contenders as c
from benchmarks import data
from benchmarks.env import Database, Poller

log = logging.getLogger("benchmarks")

SCENARIO_CONTENDERS = ("xasink", "plain-commit", "jdbc-tuned", "upsert-hand", "xasink-upsert")


class Reader(Poller):
    """``count(*)`` and ``count(DISTINCT id)`` every ~50 ms, each sample tagged with the scenario's phase."""

    def __init__(self, db: Database, table: str, interval: float = 0.05) -> None:
        super().__init__(db, table, interval)
        self.phase = "idle"
        self.samples: list[tuple[float, str, int, int]] = []

    def poll(self, cur: Any) -> None:
        cur.execute(f"SELECT count(*), count(DISTINCT id) FROM {self.db.quote(self.table)}")
        n, d = cur.fetchone()
        self.samples.append((time.perf_counter(), self.phase, int(n), int(d)))

    def seen(self, phase: str) -> list[tuple[int, int]]:
        return [(n, d) for _, p, n, d in self.samples if p == phase]


def poisoned_frame(df: Any, last_id: int, barrier: str, delay: float) -> Any:
    from pyspark.sql import functions as F  # noqa: N812
    from pyspark.sql.types import LongType

    def poison(value: int) -> int:  # shipped by value to the workers (local mode: same machine as the driver)
        if value == last_id:
            deadline = time.monotonic() + 600
            while not os.path.exists(barrier) and time.monotonic() < deadline:
                time.sleep(0.05)  # until the other partitions have finished writing
            time.sleep(delay)
            raise RuntimeError(f"injected failure at id {last_id} (last row of the last partition)")
        return value

    return df.withColumn("id", F.udf(poison, LongType())("id"))


class Barrier:
    """Creates ``path`` once a running stage of ``tasks`` tasks has all but one of them completed."""

    def __init__(self, spark: Any, path: str, tasks: int = data.PARTITIONS) -> None:
        self.tracker = spark.sparkContext.statusTracker()
        self.path, self.tasks = path, tasks
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="bench-barrier", daemon=True)

    def __enter__(self) -> Barrier:
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(0.05):
            for stage in self.tracker.getActiveStageIds():
                info = self.tracker.getStageInfo(stage)
                if info is not None and info.numTasks == self.tasks and info.numCompletedTasks >= self.tasks - 1:
                    Path(self.path).touch()
                    return

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        Path(self.path).unlink(missing_ok=True)


def run_scenario(spark: Any, db: Database, size: int, names: list[str], delay: float) -> list[dict[str, Any]]:
    df = data.frame(spark, "narrow", size).cache()
    df.count()
    results = []
    try:
        for name in names:
            contender = c.BY_NAME[name]
            table = f"fail_{name.replace('-', '_')}_{db.kind[:2]}"
            upsert = contender.kind == "upsert"
            data.create_table(db, table, "narrow", primary_key=upsert)  # append: no key, so a retry can duplicate
            ctx = c.Ctx(spark, db, df, "narrow", size, run=int(time.time()) % 1_000_000, table=table, seed_table="")
            barrier = os.path.join(tempfile.gettempdir(), f"xasink-bench-barrier-{uuid.uuid4().hex}")
            bad = c.Ctx(**{**ctx.__dict__, "df": poisoned_frame(df, size - 1, barrier, delay)})
            reader = Reader(db, table)
            reader.start()
            error = None
            try:
                reader.phase = "failed run"
                t0 = time.perf_counter()
                try:
                    with Barrier(spark, barrier):
                        contender.run(bad)
                    error = "the poisoned job did not fail"
                except Exception as exc:  # noqa: BLE001 - the expected failure
                    error = None
                    log.info("%s failed as intended: %s", name, str(exc).splitlines()[0][:200])
                failed_s = time.perf_counter() - t0
                reader.phase = "after failure"
                time.sleep(0.3)
                reader.phase = "retry"
                t1 = time.perf_counter()
                contender.run(ctx)  # the user reruns the same job (same sinkId/batchId for xasink)
                retry_s = time.perf_counter() - t1
                reader.phase = "after retry"
                time.sleep(0.3)
            finally:
                reader.stop()
            results.append(summarize(name, contender.label, db, table, size, reader, error, failed_s, retry_s))
            db.drop(table)
    finally:
        df.unpersist()
    return results


def summarize(
    name: str,
    label: str,
    db: Database,
    table: str,
    size: int,
    reader: Reader,
    error: str | None,
    failed_s: float,
    retry_s: float,
) -> dict[str, Any]:
    during = reader.seen("failed run")
    after = reader.seen("after failure")
    retry = reader.seen("retry")
    final_n, final_d = db.count(table), int(db.scalar(f"SELECT count(DISTINCT id) FROM {db.quote(table)}"))
    max_during = max((n for n, _ in during), default=0)
    after_fail = after[-1][0] if after else max_during
    partial_in_retry = sorted({n for n, _ in retry if 0 < n < size and n != after_fail})
    problems = []
    if max_during or after_fail:
        problems.append(f"partial batch visible ({max(max_during, after_fail)} of {size} rows)")
    if final_n != final_d:
        problems.append(f"{final_n - final_d} duplicate rows after the retry")
    if final_d != size:
        problems.append(f"{final_d} distinct ids after the retry, expected {size}")
    left = db.left_prepared(problems)
    return {
        "db": db.kind,
        "contender": name,
        "label": label,
        "rows": size,
        "max_visible_during_failed_run": max_during,
        "visible_after_failure": after_fail,
        "intermediate_counts_during_retry": partial_in_retry[:10],
        "final_rows": final_n,
        "final_distinct_ids": final_d,
        "duplicates": final_n - final_d,
        "prepared_left": left,
        "samples": len(reader.samples),
        "reader_error": reader.error,
        "failed_run_s": round(failed_s, 3),
        "retry_s": round(retry_s, 3),
        "verdict": "all or nothing, exactly once"
        if not problems and not error
        else "; ".join(problems or [error or ""]),
    }
