"""The benchmark's own Python data sources (workers import them from this package).

* ``bench_plain``: xasink's data path (plan, conform, the dialect's bulk load) ending in a plain COMMIT per
  partition instead of PREPARE + journal + COMMIT PREPARED: the price of XA is the difference.
* ``bench_noop``: an Arrow writer that only counts rows: the cost of handing the rows to Python as Arrow.
* ``bench_rss``: xasink itself, with the writing worker's peak RSS recorded per task.

``bench_noop`` and ``bench_rss`` accept ``xasink.benchStatsDir``: each task appends its figures there as JSON
(xasink's data source leaves ``xasink.*`` options out of its own).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from xasink.dialects import dialect_for
from xasink.dialects.values import TargetPlan
from xasink.options import WriteOptions, parse_options
from xasink.protocol.xid import Xid, attempt_token, new_run_nonce
from xasink.spark.batch_writer import XasinkBatchWriter
from xasink.spark.datasource import XasinkDataSource
from xasink.spark.planning import arrow_schema
from xasink.spark.write_task import XasinkCommitMessage
from xasink.write_modes.conform import conform
from xasink.write_modes.schema import plan_target

STATS_OPTION = "xasink.benchStatsDir"  # in xasink's internal namespace: its data source does not parse it


# --------------------------------------------------------------------------- memory probes


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        m = re.search(rf"^{field}:\s+(\d+) kB", f.read(), re.M)
    return int(m.group(1)) if m else 0


def reset_peak_rss() -> bool:
    """Reset this process's peak RSS (VmHWM) so a task's peak is its own, even in a reused worker."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def record(stats_dir: str | None, payload: dict[str, Any]) -> None:
    if stats_dir:
        path = Path(stats_dir) / f"{payload.get('partition', 'x')}-{os.getpid()}-{uuid.uuid4().hex[:6]}.json"
        path.write_text(json.dumps(payload))


@contextlib.contextmanager
def probe(stats_dir: str | None, writer: str) -> Iterator[dict[str, Any]]:
    """One task's figures: the caller sets ``rows`` in the yielded dict; peak RSS and time are measured here."""
    ctx = TaskContext.get()
    reset = reset_peak_rss()
    rss0 = _status_kb("VmRSS")
    t0 = time.perf_counter()
    figures: dict[str, Any] = {"writer": writer, "partition": ctx.partitionId() if ctx else 0, "rows": 0}
    yield figures
    figures |= {
        "seconds": time.perf_counter() - t0,
        "rss_start_kb": rss0,
        "peak_rss_kb": _status_kb("VmHWM"),
        "peak_reset": reset,
        "pid": os.getpid(),
    }
    record(stats_dir, figures)


def stats_dir(options: Any) -> str | None:
    return next((v for k, v in options.items() if k.lower() == STATS_OPTION.lower()), None)


# --------------------------------------------------------------------------- plain COMMIT (no XA)


def commit_plain(session: Any) -> None:
    """End a dialect's branch session with a plain one-phase COMMIT instead of PREPARE (benchmark only)."""
    kind = type(session).__name__
    if kind == "PostgresBranch":  # BEGIN .. COPY .. COMMIT
        session.conn.commit()
        session._close()
    elif kind == "MySQLBranch":  # XA START .. rows .. XA END, XA COMMIT ONE PHASE: no prepare, no XA log
        session.cursor.execute(f"XA END {session._xa}")
        session.cursor.execute(f"XA COMMIT {session._xa} ONE PHASE")
        session._close()
    else:
        raise RuntimeError(f"bench_plain does not know how to commit a {kind}")


def plan_table(options: WriteOptions, schema: StructType) -> TargetPlan:
    """xasink's table plan (the table reflected, every column mapped); no journal, no XA checks: none are used."""
    dialect = dialect_for(options.url, options.branch_settings)
    try:
        with dialect.connect() as conn:
            return plan_target(dialect, conn, options, arrow_schema(schema))
    finally:
        dialect.dispose()


def write_plain(options: WriteOptions, plan: TargetPlan, partition: int, batches: Iterator[pa.RecordBatch]) -> int:
    """xasink's branch data path, minus the decision log and two-phase commit."""
    rest = (b for b in batches if b.num_rows)
    first = next(rest, None)
    if first is None:
        return 0
    dialect = dialect_for(options.url, options.branch_settings)
    xid = Xid("0000000000", options.sink_id, options.batch_id, partition, attempt_token(partition, new_run_nonce()))
    session = dialect.open_branch(xid, plan)
    try:
        import itertools

        rows = session.load(conform(b, plan, partition) for b in itertools.chain([first], rest))
    except BaseException:
        session.rollback()
        raise
    try:
        commit_plain(session)
    finally:
        dialect.dispose()
    return rows


@dataclass
class CountMessage(WriterCommitMessage):
    rows: int


class PlainWriter(DataSourceArrowWriter):
    def __init__(self, options: WriteOptions, plan: TargetPlan) -> None:
        self.options = options
        self.plan = plan

    def write(self, iterator: Iterator[pa.RecordBatch]) -> CountMessage:
        ctx = TaskContext.get()
        partition = ctx.partitionId() if ctx is not None else 0
        return CountMessage(write_plain(self.options, self.plan, partition, iterator))

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        pass  # every partition committed on its own: that is the point of the comparison

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        pass  # what the finished partitions committed stays


class PlainDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "bench_plain"

    def writer(self, schema: StructType, overwrite: bool) -> PlainWriter:
        options = parse_options(dict(self.options))
        return PlainWriter(options, plan_table(options, schema))


# --------------------------------------------------------------------------- no-op Arrow writer


class NoopWriter(DataSourceArrowWriter):
    def __init__(self, stats_dir: str | None) -> None:
        self.stats_dir = stats_dir

    def write(self, iterator: Iterator[pa.RecordBatch]) -> CountMessage:
        with probe(self.stats_dir, "noop") as figures:
            figures["rows"] = sum(batch.num_rows for batch in iterator)
        return CountMessage(figures["rows"])

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        pass

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        pass


class NoopDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "bench_noop"

    def writer(self, schema: StructType, overwrite: bool) -> NoopWriter:
        return NoopWriter(stats_dir(self.options))


# --------------------------------------------------------------------------- xasink with an RSS probe


class RssWriter(XasinkBatchWriter):
    def __init__(self, inner: XasinkBatchWriter, stats_dir: str | None) -> None:
        super().__init__(inner.options, inner.plan)
        self.run = inner.run
        self.stats_dir = stats_dir

    def write(self, iterator: Iterator[pa.RecordBatch]) -> XasinkCommitMessage:
        with probe(self.stats_dir, "xasink-upsert" if self.plan.target.upsert_keys else "xasink") as figures:
            message = super().write(iterator)
            figures["rows"] = message.outcome.rows
        return message


class RssDataSource(XasinkDataSource):
    @classmethod
    def name(cls) -> str:
        return "bench_rss"

    def writer(self, schema: StructType, overwrite: bool) -> RssWriter:
        return RssWriter(super().writer(schema, overwrite), stats_dir(self.options))


def register_sources(spark: Any) -> None:
    for source in (PlainDataSource, NoopDataSource, RssDataSource):
        spark.dataSource.register(source)
