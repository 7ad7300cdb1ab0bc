"""The write modes' reader section: what a reader polling every 20 ms sees during an overwrite that fails and
one that succeeds, and whether either leaves a prepared branch behind."""

from __future__ import annotations

import logging
import os
import statistics
import tempfile
import time
import uuid
from typing import Any

from benchmarks import env as benv
from benchmarks.contenders import jdbc_writer
from benchmarks.failure import Barrier, poisoned_frame
from benchmarks.modes_data import NEW_SEQ, PARTITIONS, Shape, frame, load_seed, reset_target, xasink_writer

log = logging.getLogger("benchmarks.modes")


class Reader(benv.Poller):
    """``count(*)`` and the count of new rows (seq = NEW_SEQ) every 20 ms."""

    def __init__(self, db: benv.Database, table: str) -> None:
        super().__init__(db, table, 0.02)
        self.samples: list[tuple[int, int]] = []
        self.statement = (
            f"SELECT count(*), coalesce(sum(CASE WHEN seq = {NEW_SEQ} THEN 1 ELSE 0 END), 0) FROM {db.quote(table)}"
        )

    def poll(self, cur: Any) -> None:
        cur.execute(self.statement)
        total, new = cur.fetchone()
        self.samples.append((int(total), int(new)))

    def __enter__(self) -> Reader:
        self.start()
        time.sleep(0.2)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop(linger=0.3)  # a few samples of the end state


def reader_view(spark: Any, db: benv.Database, shape: Shape, delay: float) -> list[dict[str, Any]]:
    """A failed and a successful overwrite per contender, a reader polling throughout."""
    from xasink.support.faults import LOCAL_PROPERTY

    n = shape.rows
    seed = f"seed_rd_{db.kind[:2]}"
    load_seed(spark, db, seed, n)
    df = frame(spark, *shape.overwrite_range, n, NEW_SEQ).cache()
    df.count()
    sc = spark.sparkContext
    batch = int(time.time()) % 1_000_000 + 500_000
    out = []
    contenders = ["xasink", "xasink-truncate", "jdbc"] if db.kind == "postgresql" else ["xasink", "jdbc"]
    for contender in contenders:
        table = f"rd_{contender.replace('-', '_')}_{db.kind[:2]}"
        sink = f"b-rd-{contender[-2:]}-{db.kind[:2]}"
        for outcome in ("fails", "succeeds"):
            reset_target(db, table, seed)
            error = None
            barrier = os.path.join(tempfile.gettempdir(), f"xasink-modes-barrier-{uuid.uuid4().hex}")
            with Reader(db, table) as reader:
                t0 = time.perf_counter()
                try:
                    if contender.startswith("xasink"):
                        if outcome == "fails":  # the last partition: rows loaded, then raises before PREPARE
                            spec = f"task.before_prepare:sleep={delay}:p={PARTITIONS - 1},"
                            spec += f"task.before_prepare:raise:p={PARTITIONS - 1}"
                            sc.setLocalProperty(LOCAL_PROPERTY, spec)
                        try:
                            w = xasink_writer(df, db, table, sink, batch)
                            w.option("truncate", str(contender == "xasink-truncate").lower()).mode("overwrite").save()
                        finally:
                            sc.setLocalProperty(LOCAL_PROPERTY, None)  # type: ignore[arg-type]
                    elif outcome == "fails":  # the last row of the last partition raises once the others finished
                        bad = poisoned_frame(df, shape.overwrite_range[1] - 1, barrier, delay)
                        with Barrier(spark, barrier, PARTITIONS):
                            jdbc_writer(bad, db, table).option("truncate", "true").mode("overwrite").save()
                    else:
                        jdbc_writer(df, db, table).option("truncate", "true").mode("overwrite").save()
                except Exception as exc:  # noqa: BLE001 - expected when it fails
                    error = str(exc).splitlines()[0][:160]
                seconds = time.perf_counter() - t0
            batch += 1
            out.append(view(db, sink, table, contender, outcome, n, reader, error, seconds))
            log.info("%s reader, %s %s: %s", db.kind, contender, outcome, out[-1]["verdict"])
        db.drop(table)
    df.unpersist()
    db.drop(seed)
    return out


def view(
    db: benv.Database,
    sink: str,
    table: str,
    contender: str,
    outcome: str,
    n: int,
    reader: Reader,
    error: str | None,
    seconds: float,
) -> dict[str, Any]:
    s = reader.samples
    totals = [t for t, _ in s] or [0]
    news = [w for _, w in s] or [0]
    final_total = db.count(table)
    final_new = int(db.scalar(f"SELECT count(*) FROM {db.quote(table)} WHERE seq = {NEW_SEQ}"))
    empty = sum(1 for t, _ in s if t == 0)
    old_only = sum(1 for t, w in s if t == n and w == 0)
    new_only = sum(1 for t, w in s if t == n and w == n)
    partial = len(s) - empty - old_only - new_only  # a mix of old and new, or a part of either
    failed_ok = outcome == "fails" and error is not None
    problems = []
    if outcome == "fails" and error is None:
        problems.append("did not fail")
    if outcome == "succeeds" and error is not None:
        problems.append(f"failed: {error}")
    if empty:
        problems.append(f"empty table in {empty} reads")
    if partial:
        problems.append(f"partial or mixed table in {partial} reads")
    end_want = (n, 0) if outcome == "fails" else (n, n)
    if (final_total, final_new) != end_want:
        problems.append(f"left {final_total} rows ({final_new} new)")
    left = db.left_prepared(problems, sink)
    return {
        "db": db.kind,
        "contender": contender,
        "outcome": outcome,
        "rows": n,
        "samples": len(s),
        "min_count": min(totals),
        "max_count": max(totals),
        "min_new": min(news),
        "max_new": max(news),
        "reads_empty": empty,
        "reads_old_only": old_only,
        "reads_new_only": new_only,
        "reads_partial_or_mixed": partial,
        "final_rows": final_total,
        "final_new_rows": final_new,
        "prepared_left": left,
        "error": error if failed_ok or error else None,
        "reader_error": reader.error,
        "seconds": round(seconds, 2),
        "median_read_ms": round(1000 * statistics.median(reader.read_s), 1) if reader.read_s else None,
        "longest_read_ms": round(1000 * max(reader.read_s), 1) if reader.read_s else None,
        "verdict": "; ".join(problems)
        if problems
        else ("old rows throughout" if outcome == "fails" else "old rows, then all new rows at once"),
    }
