"""Python entry points over the data source: register, write, foreach_batch."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from .. import errors
from ..dialects import dialect_for
from ..dialects.base import redact
from ..journal import Journal
from ..options import parse_options
from ..results import WriteResult
from .datasource import XasinkDataSource

log = logging.getLogger("xasink")

_registered: set[int] = set()


def register(spark: SparkSession) -> None:
    """Register the "xasink" data source with this session (idempotent)."""
    if id(spark) not in _registered:
        spark.dataSource.register(XasinkDataSource)
        _registered.add(id(spark))


_ERROR_RE = re.compile(r"xasink\.errors\.(\w+): (.+?)(?:\n\s*\n|\n\s+at |\n\tat |\Z)", re.S)


def _unwrap(exc: BaseException) -> BaseException | None:
    """The xasink error inside a Spark exception, rebuilt with its own class."""
    text = str(exc)
    found = _ERROR_RE.findall(text)
    if not found:
        return None
    name, message = found[-1]
    cls = getattr(errors, name, errors.XasinkError)
    return cls(message.strip())  # type: ignore[no-any-return]


def _summary(exc: BaseException) -> str:
    """The Python error line of a Spark exception (e.g. ``ValueError: bad row``), else its first line."""
    text = str(exc)
    tail = text.rsplit("Traceback (most recent call last):", 1)
    if len(tail) == 2:
        for line in tail[1].splitlines():
            if line.strip() and not line[0].isspace():
                return line.strip()[:300]
    first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    return first[:300]


def write(
    df: DataFrame, url: str, table: str, sink_id: str | None = None, batch_id: int | None = None, **options: Any
) -> WriteResult:
    """Write ``df`` atomically: every partition's rows commit, or none do.

    With ``sink_id`` and ``batch_id``, a rerun of a committed batch writes
    nothing (``result.skipped``).  ``numPartitions`` coalesces first.
    """
    raw: dict[str, Any] = {"url": url, "dbtable": table, **options}
    if sink_id is not None:
        raw["sinkId"] = sink_id
    if batch_id is not None:
        raw["batchId"] = batch_id
    parsed = parse_options(raw)
    raw["sinkId"] = parsed.sink_id  # a generated id must be the same for the write and the result look-up
    register(df.sparkSession)
    if parsed.upsert_key_columns:  # equal keys in two branches: the second waits on the first, prepared, until timeout
        df = df.repartition(parsed.num_partitions or df.rdd.getNumPartitions(), *parsed.upsert_key_columns)
    elif parsed.num_partitions is not None and df.rdd.getNumPartitions() > parsed.num_partitions:
        df = df.coalesce(parsed.num_partitions)
    dialect = dialect_for(parsed.url)
    journal = Journal(dialect, parsed.journal_schema, parsed.journal_prefix)
    try:
        before = _record(journal, parsed.sink_id, parsed.batch_id)
        t0 = time.perf_counter()
        try:
            df.write.format("xasink").options(**{k: str(v) for k, v in raw.items()}).mode("append").save()
        except Exception as exc:
            inner = _unwrap(exc)
            if inner is None and _record(journal, parsed.sink_id, parsed.batch_id) is None:
                # not ours (a failing UDF, a lost executor...) and the batch is undecided: nothing of it is visible
                inner = errors.BatchAbortedError(
                    f"sink {parsed.sink_id} batch {parsed.batch_id} was rolled back, no row of it is visible: "
                    f"the Spark job failed ({redact(_summary(exc), parsed.url.password)})"
                )
            if inner is None:
                raise
            raise inner from exc
        total = time.perf_counter() - t0
        after = _record(journal, parsed.sink_id, parsed.batch_id)
    finally:
        dialect.dispose()
    if after is None:  # an empty DataFrame decides nothing... unless it had partitions: then it decided []
        return WriteResult(parsed.sink_id, parsed.batch_id, 0, 0, False, {"total": total})
    timings = {"prepare": after.prepare_ms / 1000, "total": total}
    if after.commit_ms is not None:
        timings["commit"] = after.commit_ms / 1000
    result = WriteResult(parsed.sink_id, parsed.batch_id, after.rows, after.branches, before is not None, timings)
    log.info("%s", result)
    return result


def _record(journal: Journal, sink_id: str, batch_id: int) -> Any:
    with journal.dialect.connect() as conn:
        if not journal.exists(conn):
            return None
        return journal.get(conn, sink_id, batch_id)


def foreach_batch(url: str, table: str, sink_id: str, **options: Any) -> Callable[[DataFrame, int], WriteResult]:
    """A function for ``writeStream.foreachBatch``: each micro-batch written once, keyed by Spark's batch id."""
    parse_options({"url": url, "dbtable": table, "sinkId": sink_id, **options})  # fail at set-up, not at batch 0

    def write_batch(df: DataFrame, batch_id: int) -> WriteResult:
        return write(df, url, table, sink_id=sink_id, batch_id=batch_id, **options)

    return write_batch
