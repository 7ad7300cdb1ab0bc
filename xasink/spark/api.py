"""Python entry points over the data source: register, write, foreach_batch."""

from __future__ import annotations

import logging
import os
import tempfile
import time
import weakref
from collections.abc import Callable
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from xasink import errors
from xasink.journal.log import Journal
from xasink.journal.targets import UNKNOWN_QUERY
from xasink.options import WriteOptions, parse_options
from xasink.protocol.coordinator import Coordinator
from xasink.protocol.xid import new_run_nonce
from xasink.results import WriteResult
from xasink.spark.datasource import QUERY_OPTION, RUN_OPTION, XasinkDataSource
from xasink.spark.job_errors import error_summary, unwrap_error
from xasink.spark.stream_writer import check_batch_order
from xasink.spark.streams import is_connect, mark_running_queries, micro_batch_query, unknown_query_message
from xasink.support import notices
from xasink.support.masking import redact, url_secrets

log = logging.getLogger("xasink")

# the sessions the data source was registered with: weak, so a new session that happens to get a stopped
# one's id() is registered too (tests and notebooks stop and start sessions, classic and Connect)
_registered: weakref.WeakSet[SparkSession] = weakref.WeakSet()


def register(spark: SparkSession) -> None:
    """Register the "xasink" data source with this session (idempotent); call it in each writing thread.

    Spark looks a Python data source up in the calling thread's *active* session, which a new thread
    (e.g. a thread pool's) does not have: its write would fail with DATA_SOURCE_NOT_FOUND.  So this
    also makes ``spark`` the thread's active session.  A Spark Connect session needs no such step: the
    server looks the source up in the session the client names.

    Writing a micro-batch from a thread of your own inside ``foreachBatch`` (several tables at once): call
    this in that thread before its write, once the query runs.  Spark tells the micro-batch and its query
    to the query's own thread only; this ties every running query to its own session, so the tasks of a
    ``format("xasink")`` write of the micro-batch DataFrame (or one derived from it) learn the query
    whichever thread saves it.  ``xasink.write``, ``foreach_batch`` and ``foreach_batch_multi`` do it
    themselves.  What works from which thread: docs/protocol.md, "From which thread".
    """
    if spark not in _registered:
        spark.dataSource.register(XasinkDataSource)
        _registered.add(spark)
    jvm, jsession = getattr(spark, "_jvm", None), getattr(spark, "_jsparkSession", None)
    if jvm is not None and jsession is not None:  # classic Spark; Spark Connect has no thread-local session here
        SparkSession._get_j_spark_session_class(jvm).setActiveSession(jsession)
        mark_running_queries(spark)


def write(
    df: DataFrame,
    url: str,
    table: str,
    sink_id: str | None = None,
    batch_id: int | None = None,
    mode: str = "append",
    **options: Any,
) -> WriteResult:
    """Write ``df`` atomically: every partition's rows commit, or none do.

    With ``sink_id`` and ``batch_id``, a rerun of a committed batch writes
    nothing (``result.skipped``).  ``numPartitions`` coalesces first.
    ``mode="overwrite"`` replaces the table's rows (those matching ``replaceWhere`` if given) in one
    transaction at commit.
    """
    raw: dict[str, Any] = {"url": url, "dbtable": table, **options}
    if sink_id is not None:
        raw["sinkId"] = sink_id
    if batch_id is not None:
        raw["batchId"] = batch_id
    return _write(df, raw, mode, None)


def _write(df: DataFrame, raw: dict[str, Any], mode: str, query: str | None) -> WriteResult:
    """:func:`write`; ``query``: the streaming query foreach_batch writes for, recorded with the batch."""
    parsed = parse_options(raw).with_mode(mode)
    raw["sinkId"] = parsed.sink_id  # a generated id must be the same for the write and the result look-up
    register(df.sparkSession)
    df = shape(df, parsed)
    # the process's long-lived dialect (its pooled connections serve every write of this URL from here on)
    journal = Coordinator(parsed, shared=True).journal
    run = new_run_nonce()
    before = _record(journal, parsed.sink_id, parsed.batch_id)
    with journal.dialect.connect(autocommit=True) as conn:  # said with every write's result, not once a process
        warned = journal.dialect.durability_warnings(conn)
    fd, path = tempfile.mkstemp(prefix="xasink-notices-", suffix=".jsonl")  # the workers' warnings (notices)
    os.close(fd)
    t0 = time.perf_counter()
    try:
        opts = {k: str(v) for k, v in raw.items()}
        internal = {RUN_OPTION: run, notices.NOTICES_OPTION: path}
        if query is not None:
            internal[QUERY_OPTION] = query
        df.write.format("xasink").options(**opts, **internal).mode(mode).save()
    except Exception as exc:
        notices.tell(dict.fromkeys(warned + notices.load(path)))
        inner = unwrap_error(exc)
        if inner is None and _record(journal, parsed.sink_id, parsed.batch_id) is None:
            # not ours (a failing UDF, a lost executor...) and the batch is undecided: nothing of it is visible
            inner = errors.BatchAbortedError(
                f"sink {parsed.sink_id} batch {parsed.batch_id} was rolled back, no row of it is visible: "
                f"the Spark job failed ({redact(error_summary(exc), url_secrets(parsed.url))})"
            )
        if inner is None:
            raise
        raise inner from exc
    finally:
        told = list(dict.fromkeys(warned + notices.load(path)))
        os.unlink(path)
    notices.tell(told)
    total = time.perf_counter() - t0
    after = _record(journal, parsed.sink_id, parsed.batch_id)
    if after is None:  # an empty DataFrame decides nothing... unless it had partitions: then it decided []
        return WriteResult(parsed.sink_id, parsed.batch_id, 0, 0, False, {"total": total}, tuple(told))
    timings = {"prepare": after.prepare_ms / 1000, "total": total}
    if after.commit_ms is not None:
        timings["commit"] = after.commit_ms / 1000
    # another writer of the same (sink, batch) may have decided it while we ran: then we wrote nothing either
    theirs = any(x.run != run for x in after.xids)
    result = WriteResult(
        parsed.sink_id, parsed.batch_id, after.rows, after.branches, before is not None or theirs, timings, tuple(told)
    )
    log.info("%s", result)
    return result


def shape(df: DataFrame, parsed: WriteOptions) -> DataFrame:
    """``df`` laid out for the write, with DataFrame calls only (Spark Connect has no ``df.rdd``).

    Upsert keys: equal keys in two branches would make the second wait on the first, prepared, until a
    lock timeout, so rows are hash-partitioned by key, into ``numPartitions`` partitions if given (else
    as many as the DataFrame has in classic Spark, ``spark.sql.shuffle.partitions`` under Connect).
    Otherwise ``numPartitions`` coalesces: a coalesce never adds partitions, so no count is needed.
    """
    unknown = [k for k in parsed.upsert_key_columns if k.lower() not in {c.lower() for c in df.columns}]
    if unknown:  # say it in our words before Spark's repartition fails on it
        raise errors.PreflightError(f"option 'upsertKeyColumns': '{unknown[0]}' is not a column of the DataFrame")
    keys, num_partitions = parsed.upsert_key_columns, parsed.num_partitions
    if keys:
        n = num_partitions
        if n is None and not is_connect(df.sparkSession):
            n = df.rdd.getNumPartitions()  # classic: keep the DataFrame's parallelism, as before
        return df.repartition(n, *keys) if n is not None else df.repartition(*keys)
    if num_partitions is not None:
        return df.coalesce(num_partitions)
    return df


def _record(journal: Journal, sink_id: str, batch_id: int) -> Any:
    with journal.dialect.connect(autocommit=True) as conn:  # reads only
        if not journal.exists(conn):
            return None
        return journal.get(conn, sink_id, batch_id)


def _decided(coordinator: Coordinator, batch_id: int) -> bool:
    """Whether the log holds (sink, batch) as decided (refused if for another target); no log: False."""
    with coordinator.dialect.connect(autocommit=True) as conn:
        if not coordinator.journal.exists(conn):
            return False
    return coordinator.check_batch(batch_id)


def foreach_batch(
    url: str,
    table: str,
    sink_id: str,
    mode: str = "append",
    checkpoint_location: str | None = None,
    **options: Any,
) -> Callable[[DataFrame, int], WriteResult]:
    """A function for ``writeStream.foreachBatch``: each micro-batch written once, keyed by Spark's batch id
    and the streaming query's id (a batch of another query under the same sink_id is refused).

    The function may be called in the query's thread or any other (``pool.submit(fn, df, batch_id)``):
    in classic Spark the query is found from ``df``'s session (the micro-batch DataFrame Spark passed, or
    one derived from it).  ``mode="overwrite"`` makes each micro-batch replace the table's rows (a
    streaming aggregation's result).  ``checkpoint_location``: the query's, where Spark Connect gives the
    function no other way to learn the query's id; without it a Connect replay cannot be told from another
    query's batch and is refused."""
    raw = {"url": url, "dbtable": table, "sinkId": sink_id, **options}
    parsed = parse_options(raw).with_mode(mode)  # fail now, not at batch 0

    def write_batch(df: DataFrame, batch_id: int) -> WriteResult:
        # the process's long-lived dialect: a micro-batch does not pay for new connections and their set-up
        coordinator = Coordinator(parsed, shared=True)
        # a new or reset checkpoint would have its batches skipped as replays of the old ones
        check_batch_order(coordinator, batch_id)
        # whichever thread calls: the query whose own session the micro-batch DataFrame has (classic)
        query = micro_batch_query(df, checkpoint_location)
        # a decided batch whose query cannot be known: a replay or another query's, refused (an unknown
        # query is recorded so: no later write of this batch passes for its replay)
        if query == UNKNOWN_QUERY and _decided(coordinator, batch_id):
            raise errors.BatchIdentityError(unknown_query_message(sink_id, batch_id))
        batch = {"url": url, "dbtable": table, "sinkId": sink_id, "batchId": batch_id, **options}
        return _write(df, batch, mode, query)

    return write_batch
