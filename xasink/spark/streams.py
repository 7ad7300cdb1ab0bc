"""Which streaming micro-batch, of which query, a write belongs to, whichever thread writes it.

Spark names a micro-batch and its query (the local properties :data:`STREAM_BATCH_PROPERTY` and
:data:`STREAM_QUERY_PROPERTY`) to the query's own thread alone: a thread of the user's pool inside
``foreachBatch`` carries neither, and neither do the tasks of its jobs.  What every thread shares is the
micro-batch DataFrame's session: a streaming query runs its micro-batches in a session of its own (Spark's
clone of the session that started it), and every job of a session, from any thread, hands the session's
SQL settings to its tasks as local properties.  Hence:

- Classic Spark: :func:`mark_running_queries` writes each running query's id into that query's own
  session (:data:`QUERY_CONF`), from ``xasink.register`` and from every xasink write; the tasks of any
  write of a micro-batch DataFrame (or one derived from it) read it, in whatever thread it was saved.
  :func:`session_query` finds the query of a DataFrame on the driver the same way.  Both read the JVM's
  list of running queries (``SharedState.activeStreamingQueries``) and each query's session
  (``StreamExecution.sparkSessionForStream``): Spark internals, which tests/test_stream_threads.py checks
  on the Spark it runs, and tests/test_spark_versions.py on 3.5 and 4.0 too (Spark 3.5 gives jobs no
  session tags, so there a mark is taken as it is: every xasink write marks each running query first);
  were they renamed, a pool thread's write would be refused as ``UNKNOWN_QUERY`` where it is decided,
  never skipped.
- Spark Connect, and a classic query that no xasink call has marked yet: Spark's own setting
  :data:`STREAM_SESSION_CONF`, which 4.1+ puts in every streaming query's session (3.5 and 4.0: the
  settings :data:`OLDER_STREAM_SESSION_CONFS`), tells a task that it writes a micro-batch, but not which
  query's: such a write is recorded with ``UNKNOWN_QUERY``, which no decided batch accepts as its replay
  (:func:`xasink.journal.targets.same_target`).

A write xasink cannot tie to any micro-batch (a DataFrame of another session, written outside the query's
thread) is a batch job to it: nothing in it names a stream.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from xasink.errors import OptionError
from xasink.journal.targets import UNKNOWN_QUERY

if TYPE_CHECKING:
    from pyspark import TaskContext
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger("xasink")

STREAM_BATCH_PROPERTY = "streaming.sql.batchId"
# the streaming query's id, kept in its checkpoint across restarts: recorded with each batch it writes
STREAM_QUERY_PROPERTY = "sql.streaming.queryId"
# xasink's mark on a streaming query's own session: its id, for the tasks of writes from any thread
QUERY_CONF = "spark.xasink.internal.streamingQueryId"
# Spark's (4.1+) setting in every streaming query's session: a task whose job carries it writes a micro-batch
STREAM_SESSION_CONF = "spark.sql.streaming.internal.stateStore.partitions"
# Spark 3.5 and 4.0 set no such setting in a query's session, only these three, which a batch session holds
# only if its user set all three (then its writes are taken for a micro-batch's: refused where a stream's
# would be, never skipped): StreamExecution's clone switches adaptive execution and cost-based
# optimisation off and sets requireAllClusterKeysForDistribution to its default explicitly
OLDER_STREAM_SESSION_CONFS = {
    "spark.sql.adaptive.enabled": "false",
    "spark.sql.cbo.enabled": "false",
    "spark.sql.requireAllClusterKeysForDistribution": "false",
}
# the tags of a task's job, among them "spark-session-<sessionUUID>" of the session that started it
JOB_TAGS_PROPERTY = "spark.job.tags"
SESSION_TAG = re.compile(r"(?:^|,)spark-session-([0-9a-f-]{36})(?=,|-execution-|$)")


def is_connect(spark: SparkSession) -> bool:
    """Whether ``spark`` is a Spark Connect session: it has no ``df.rdd`` and no JVM in this process."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


# --------------------------------------------------------------------------- the driver (the user's process)


def _running(spark: SparkSession) -> list[tuple[str, Any]]:
    """(id, own session) of every streaming query running in this JVM, whichever session started it;
    none under Spark Connect (no JVM here) or where Spark's internals cannot be read."""
    jsession = getattr(spark, "_jsparkSession", None)
    if is_connect(spark) or jsession is None:
        return []
    from py4j.protocol import Py4JError

    try:
        # a Java ConcurrentHashMap, which Py4J wraps as a dict: its keys' array costs one call, values() many
        active = jsession.sharedState().activeStreamingQueries()
        queries = [active[key] for key in active.keySet().toArray()]
        return [(str(q.id().toString()), q.sparkSessionForStream()) for q in queries if q is not None]
    except Py4JError as exc:  # a stopped context, or internals renamed: the tasks still see STREAM_SESSION_CONF
        log.debug("cannot list the running streaming queries: %s", exc)
        return []


def mark_running_queries(spark: SparkSession) -> list[tuple[str, Any]]:
    """Write each running query's id into its own session (:data:`QUERY_CONF`), for the tasks of writes of
    its micro-batches from other threads; returns what :func:`_running` found.

    The mark names the session too (Spark's ``sessionUUID``, which every job of the session carries in
    its tags): a session cloned from a marked one (a query started from a query's session) inherits the
    mark, and must not pass for that query's until it is marked as its own query's."""
    from py4j.protocol import Py4JError

    running = _running(spark)
    for query, session in running:
        try:
            session.conf().set(QUERY_CONF, f"{query} {session.sessionUUID()}")
        except Py4JError as exc:  # a query ending meanwhile: its tasks still see STREAM_SESSION_CONF
            log.debug("cannot mark streaming query %s: %s", query, exc)
    return running


def _marked(mark: str | None, sessions: set[str]) -> str | None:
    """The query a mark names, if it was made for one of ``sessions`` (none known: taken as it is)."""
    if not mark:
        return None
    query, _, session = str(mark).partition(" ")
    return query if not sessions or session in sessions else None


def session_query(spark: SparkSession) -> str | None:
    """Classic Spark: the id of the streaming query whose own session ``spark`` is (a micro-batch
    DataFrame's ``sparkSession``, in any thread), or the one marked on it before that query ended."""
    if is_connect(spark):
        return None
    jsession = spark._jsparkSession
    for query, session in mark_running_queries(spark):
        if session.equals(jsession):
            return query
    return _marked(spark.conf.get(QUERY_CONF, None), {str(jsession.sessionUUID())})


def in_stream_session(spark: SparkSession) -> bool:
    """Whether ``spark`` is a streaming query's own session (a micro-batch DataFrame's, classic or Connect)."""
    return _stream_settings(lambda key: spark.conf.get(key, None))


def _stream_settings(get: Callable[[str], str | None]) -> bool:
    """Whether the session settings ``get`` reads are a streaming query's own session's (any Spark version)."""
    if any(get(key) for key in (QUERY_CONF, STREAM_SESSION_CONF)):
        return True
    return all(get(key) == value for key, value in OLDER_STREAM_SESSION_CONFS.items())


def micro_batch_query(df: DataFrame, checkpoint_location: str | None = None) -> str | None:
    """The id of the streaming query whose foreachBatch function was given ``df`` (kept in its checkpoint
    across restarts), whichever thread calls; ``UNKNOWN_QUERY`` for a micro-batch whose query cannot be
    known here; None for no micro-batch (a function called directly while no query runs).

    Classic Spark: the query whose own session ``df`` has, else the calling thread's (the query's own, or
    one PySpark's ``InheritableThread`` started from it, writing a DataFrame of another session).  Spark
    Connect calls the function in a server-side Python process whose session knows nothing of the query:
    there only the checkpoint's ``metadata`` file names it (``checkpoint_location``, a local path or
    file: URI).  A classic function given a DataFrame of no query's session, in a thread of none, while
    some query runs: ``UNKNOWN_QUERY`` (it may be a pool thread's copy of a micro-batch)."""
    spark = df.sparkSession
    if not is_connect(spark):
        found = session_query(spark) or spark.sparkContext.getLocalProperty(STREAM_QUERY_PROPERTY)
        if found:
            return str(found)
    if checkpoint_location is not None:
        return _checkpoint_query(checkpoint_location)
    if is_connect(spark) or in_stream_session(spark) or _running(spark):
        return UNKNOWN_QUERY
    return None


def _checkpoint_query(checkpoint_location: str) -> str:
    parts = urlparse(str(checkpoint_location))
    if parts.scheme not in ("", "file"):
        raise OptionError(
            f"checkpoint_location {checkpoint_location!r}: xasink reads the query's id from a local checkpoint only"
        )
    metadata = Path(parts.path if parts.scheme else str(checkpoint_location)) / "metadata"
    try:
        return str(json.loads(metadata.read_text().splitlines()[0])["id"])
    except (OSError, ValueError, KeyError, IndexError) as exc:
        raise OptionError(
            f"checkpoint_location: cannot read the streaming query's id from {metadata} ({type(exc).__name__}); "
            "pass the query's checkpointLocation"
        ) from None


def unknown_query_message(sink_id: str, batch_id: int) -> str:
    return (
        f"sink {sink_id} batch {batch_id} was committed before, and this foreachBatch call cannot tell a replay "
        f"of it (the same query restarting) from batch {batch_id} of another query with the same sink_id (a new "
        "checkpoint): it cannot learn the streaming query's id. Nothing was written. Under Spark Connect, pass "
        "checkpoint_location=<the query's checkpointLocation> to xasink.foreach_batch / foreach_batch_multi, "
        "so the query's id is read from the checkpoint; in classic Spark, pass the function the micro-batch "
        "DataFrame Spark gave (or one derived from it), from any thread."
    )


# --------------------------------------------------------------------------- a task


def in_micro_batch(ctx: TaskContext) -> bool:
    """Whether the task's job was started for a streaming micro-batch, from the query's thread or another."""
    return ctx.getLocalProperty(STREAM_BATCH_PROPERTY) is not None or _stream_settings(ctx.getLocalProperty)


def task_query(ctx: TaskContext, given: str | None = None) -> str | None:
    """The streaming query a task's write belongs to, recorded with its batch.

    The query marked on the micro-batch's session first (a thread's local properties may be another
    query's: a pool thread once given them by PySpark's ``inheritable_thread_target`` keeps them), then the
    one the driver found (``given``: foreach_batch), then the thread's; ``UNKNOWN_QUERY`` for a micro-batch
    none of them names; None for a batch job."""
    marked = _marked(ctx.getLocalProperty(QUERY_CONF), _job_sessions(ctx))
    found = marked or given or ctx.getLocalProperty(STREAM_QUERY_PROPERTY)
    if found:
        return str(found)
    return UNKNOWN_QUERY if in_micro_batch(ctx) else None


def _job_sessions(ctx: TaskContext) -> set[str]:
    """The sessions whose job this task runs (the ``spark-session-<uuid>`` tags Spark gives every job)."""
    return set(SESSION_TAG.findall(ctx.getLocalProperty(JOB_TAGS_PROPERTY) or ""))
