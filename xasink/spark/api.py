"""Python entry points over the data source: register, write, foreach_batch."""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Callable
from typing import Any, Literal

from pyspark.sql import DataFrame, SparkSession

from xasink import errors
from xasink.journal.log import Journal
from xasink.journal.targets import UNKNOWN_QUERY
from xasink.options import parse_options
from xasink.protocol.coordinator import Coordinator
from xasink.protocol.xid import new_run_nonce
from xasink.results import WriteResult
from xasink.spark.datasource import BRANCHES_OPTION, QUERY_OPTION, RUN_OPTION
from xasink.spark.frames import shape
from xasink.spark.job_errors import error_summary, told_by_the_log, unwrap_error
from xasink.spark.partition_job import save
from xasink.spark.planning import preflight_failed
from xasink.spark.stream_writer import check_batch_order
from xasink.spark.streams import mark_running_queries, micro_batch_query, unknown_query_message
from xasink.spark.versions import HAS_DATA_SOURCE, java_session_class, require_data_source
from xasink.spark.write_task import pin_time_zone
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

    Spark 3.5 has no Python data source API: there this raises :class:`~xasink.errors.XasinkError` naming
    ``xasink.write`` and ``foreach_batch``, which work on every supported Spark (docs/spark-versions.md).
    """
    require_data_source()
    ready_session(spark)


def ready_session(spark: SparkSession) -> None:
    """:func:`register` where the data source API exists; on every Spark, the thread's active session and the
    running queries' marks (xasink.spark.streams) that every xasink write needs."""
    if HAS_DATA_SOURCE and spark not in _registered:
        from xasink.spark.datasource import XasinkDataSource

        spark.dataSource.register(XasinkDataSource)
        _registered.add(spark)
    pin_time_zone(spark)
    jvm, jsession = getattr(spark, "_jvm", None), getattr(spark, "_jsparkSession", None)
    if jvm is not None and jsession is not None:  # classic Spark; Spark Connect has no thread-local session here
        java_session_class(spark).setActiveSession(jsession)
        mark_running_queries(spark)


def write(
    df: DataFrame,
    url: str,
    table: str,
    sink_id: str | None = None,
    batch_id: int | None = None,
    mode: Literal["append", "overwrite"] = "append",
    *,
    user: str | None = None,
    password: str | None = None,
    numPartitions: int | None = None,
    createTable: bool | None = None,
    createTableColumnTypes: str | None = None,
    batchsize: int | None = None,
    upsertKeyColumns: str | None = None,
    replaceWhere: str | None = None,
    replaceWhereCheck: bool | None = None,
    deleteFlagColumn: str | None = None,
    sequenceColumn: str | None = None,
    localInfile: bool | None = None,
    lockTimeout: int | None = None,
    journalSchema: str | None = None,
    journalTablePrefix: str | None = None,
    journalRetention: int | None = None,
    commitParallelism: int | None = None,
    commitTimeout: int | None = None,
    commitRetries: int | None = None,
    controlLockTimeout: int | None = None,
    visibility: Literal["branch", "batch"] | None = None,
    **options: Any,
) -> WriteResult:
    """Write ``df`` into ``table`` atomically: every partition's rows commit, or none do.

    With ``sink_id`` and ``batch_id``, a rerun of a committed batch writes nothing and starts no Spark job: it
    returns at once with ``result.skipped`` and ``result.earlier`` (what the earlier run committed, when and by
    which run).  ``mode="overwrite"`` replaces the table's rows (those matching ``replaceWhere`` if given) in
    one transaction at commit.  Every option is described in docs/options.md; option names are Spark's JDBC
    writer's (any case).

    Args:
        df: the rows; its columns are matched to the table's by name.
        url: ``jdbc:postgresql://host/db``, ``postgresql://...``, ``jdbc:mysql|mariadb://...``, ``mysql://...``.
        table: ``table`` or ``schema.table``; created from ``df``'s schema if missing (``createTable``).
        sink_id: a stable name of this writer (1-32 of ``A-Za-z0-9_.-``); default: a fresh random one.
        batch_id: the batch number, 0 to 2**63-1 (default 0); a committed (sink, batch) is never written again.
        mode: ``"append"`` or ``"overwrite"``.
        user, password: the login, if not in ``url``.
        numPartitions: at most this many branches (XA transactions): the rows are coalesced to it.
        createTable, createTableColumnTypes: create a missing table, with these column types.
        batchsize: rows per INSERT where the database loads with INSERT (MySQL family without LOAD DATA).
        upsertKeyColumns: comma-separated key columns: merge by key instead of appending.
        replaceWhere, replaceWhereCheck: with ``mode="overwrite"``, replace only the rows matching this SQL
            condition; refuse batch rows outside it (default true).
        deleteFlagColumn, sequenceColumn: change-data apply, with ``upsertKeyColumns``.
        localInfile: MySQL/MariaDB: load with LOAD DATA LOCAL when the server allows it (default true).
        lockTimeout, controlLockTimeout: seconds a branch / a control connection waits for a lock.
        journalSchema, journalTablePrefix, journalRetention: where the decision log lives, how much it keeps.
        commitParallelism, commitTimeout, commitRetries: the commit phase (``commitRetries`` is deprecated).
        visibility: ``"branch"`` (default): each branch's rows are visible as its COMMIT lands; ``"batch"``:
            readers see none or all of the batch (an append or upsert goes through the shadow table).
        **options: any other option of docs/options.md (and Spark JDBC options xasink accepts and ignores).

    Returns:
        WriteResult: ``rows``, ``branches`` and ``timings`` of this run; ``skipped`` and ``earlier`` for a
        batch committed before; ``warnings`` the user must know (also shown as :class:`XasinkWarning`).

    Raises:
        OptionError: an unknown, missing or invalid option (before any work).
        PreflightError: the server or table cannot take the write (``ConnectError``: cannot connect); nothing
            was written.
        BranchError, BatchAbortedError (``ApplyError``, ``ConcurrentWriterError``): the batch was not
            decided: nothing of it is visible or left prepared; run it again with the same sink and batch.
        BatchIdentityError (``ForgottenBatchError``): the (sink, batch) was committed to another target, or
            the log cannot tell; nothing was written.
        CommitIncompleteError (``DecisionUnknownError``, ``ReplayIncompleteError``): the batch is (or may be)
            decided; ``xasink recover`` or the next write of the sink finishes it. Never rerun it under
            another sink id.
        JournalError: the decision log was changed behind xasink's back; the batch's rows are committed.
        LateBranchError: see docs/errors.md.

    Warns:
        XasinkWarning: the write succeeded, but the server can lose prepared rows on a crash, commits were
            retried, a sweep failed...
    """
    named = {
        "user": user,
        "password": password,
        "numPartitions": numPartitions,
        "createTable": createTable,
        "createTableColumnTypes": createTableColumnTypes,
        "batchsize": batchsize,
        "upsertKeyColumns": upsertKeyColumns,
        "replaceWhere": replaceWhere,
        "replaceWhereCheck": replaceWhereCheck,
        "deleteFlagColumn": deleteFlagColumn,
        "sequenceColumn": sequenceColumn,
        "localInfile": localInfile,
        "lockTimeout": lockTimeout,
        "journalSchema": journalSchema,
        "journalTablePrefix": journalTablePrefix,
        "journalRetention": journalRetention,
        "commitParallelism": commitParallelism,
        "commitTimeout": commitTimeout,
        "commitRetries": commitRetries,
        "controlLockTimeout": controlLockTimeout,
        "visibility": visibility,
    }
    raw: dict[str, Any] = {"url": url, "dbtable": table, **merged_options(named, options)}
    if sink_id is not None:
        raw["sinkId"] = sink_id
    if batch_id is not None:
        raw["batchId"] = batch_id
    return _write(df, raw, mode, None)


def merged_options(named: dict[str, Any], options: dict[str, Any]) -> dict[str, Any]:
    """The keyword options given (``None``: not given) with the rest of ``**options``; an option given twice
    (``numPartitions=4`` and ``numpartitions=8``: names are case-insensitive) is refused."""
    given = {k: v for k, v in named.items() if v is not None}
    twice = sorted(k for k in given if k.lower() in {o.lower() for o in options})
    if twice:
        raise errors.OptionError(f"option '{twice[0]}' is given twice (option names are case-insensitive)")
    return {**given, **options}


def _write(df: DataFrame, raw: dict[str, Any], mode: str, query: str | None) -> WriteResult:
    """:func:`write`; ``query``: the streaming query foreach_batch writes for, recorded with the batch."""
    t0 = time.perf_counter()
    parsed = parse_options(raw).with_mode(mode)
    raw["sinkId"] = parsed.sink_id  # a generated id must be the same for the write and the result look-up
    # the process's long-lived dialect (its pooled connections serve every write of this URL from here on)
    coordinator = Coordinator(parsed, shared=True)
    journal = coordinator.journal
    run = new_run_nonce()
    with coordinator.policy.never_raw(preflight_failed(parsed), lasting=errors.PreflightError):
        before = _record(journal, parsed.sink_id, parsed.batch_id)
        with journal.dialect.connect(autocommit=True) as conn:  # said with every write's result
            warned = journal.dialect.durability_warnings(conn)
        replay = before is not None and before.committed and coordinator.check_batch(parsed.batch_id, query)
    if replay:
        # a rerun of a committed batch (of the same target and query; another's is refused just above): a log
        # read, no Spark job
        notices.tell(warned)
        skipped = WriteResult(
            parsed.sink_id,
            parsed.batch_id,
            0,
            0,
            True,
            {"total": time.perf_counter() - t0},
            tuple(warned),
            before.earlier(),
        )
        log.info("%s", skipped)
        return skipped
    ready_session(df.sparkSession)
    df, branches = shape(df, parsed)
    path = notices.new_file()  # the workers' warnings (notices)
    try:
        opts = {k: str(v) for k, v in raw.items()}
        internal = {RUN_OPTION: run, notices.NOTICES_OPTION: path}
        if branches is not None:  # checked against the free prepared-transaction slots before any task runs
            internal[BRANCHES_OPTION] = str(branches)
        if query is not None:
            internal[QUERY_OPTION] = query
        save(df, {**opts, **internal}, mode)  # format("xasink"), or the partition function (Spark 3.5)
    except errors.XasinkError as exc:  # the driver's own steps, run in this process by the partition function
        if not isinstance(exc, errors.BatchCommittedError):  # (else: the abort found the batch committed)
            notices.tell(dict.fromkeys(warned + notices.load(path)))
            raise
    except Exception as exc:
        inner = unwrap_error(exc)
        if inner is None or isinstance(inner, errors.BatchCommittedError):
            # not an xasink error (a failing UDF, a lost executor, the commit's Python worker gone...): what
            # the log holds for the batch is what happened; committed, the result below stands
            summary = redact(error_summary(exc), url_secrets(parsed.url))
            inner = told_by_the_log(
                parsed.sink_id, parsed.batch_id, _record(journal, parsed.sink_id, parsed.batch_id), summary
            )
        if inner is not None:
            notices.tell(dict.fromkeys(warned + notices.load(path)))
            raise inner from exc
    finally:
        told = list(dict.fromkeys(warned + notices.load(path)))
        figures = notices.load_figures(path)  # the commit's, as its INFO line gave them
        notices.discard(path)
    notices.tell(told)
    total = time.perf_counter() - t0
    after = _record(journal, parsed.sink_id, parsed.batch_id)
    if after is None:  # an empty DataFrame decides nothing... unless it had partitions: then it decided []
        return WriteResult(parsed.sink_id, parsed.batch_id, 0, 0, False, {"total": total}, tuple(told))
    # another writer of the same (sink, batch) may have decided it while we ran: then we wrote nothing either
    theirs = before is not None or any(x.run != run for x in after.xids)
    if theirs:
        result = WriteResult(
            parsed.sink_id, parsed.batch_id, 0, 0, True, {"total": total}, tuple(told), after.earlier()
        )
    else:
        # the commit's figures (as format's INFO line gives them), the total of this whole call
        timings = {k: v for k, v in figures.items() if k != "total"} or {"prepare": after.prepare_ms / 1000}
        if "commit" not in timings and after.commit_ms is not None:
            timings["commit"] = after.commit_ms / 1000
        timings["total"] = total
        result = WriteResult(parsed.sink_id, parsed.batch_id, after.rows, after.branches, False, timings, tuple(told))
    log.info("%s", result)
    return result


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
    mode: Literal["append", "overwrite"] = "append",
    checkpoint_location: str | None = None,
    *,
    user: str | None = None,
    password: str | None = None,
    numPartitions: int | None = None,
    createTable: bool | None = None,
    createTableColumnTypes: str | None = None,
    batchsize: int | None = None,
    upsertKeyColumns: str | None = None,
    replaceWhere: str | None = None,
    replaceWhereCheck: bool | None = None,
    deleteFlagColumn: str | None = None,
    sequenceColumn: str | None = None,
    localInfile: bool | None = None,
    lockTimeout: int | None = None,
    journalSchema: str | None = None,
    journalTablePrefix: str | None = None,
    journalRetention: int | None = None,
    commitParallelism: int | None = None,
    commitTimeout: int | None = None,
    commitRetries: int | None = None,
    controlLockTimeout: int | None = None,
    visibility: Literal["branch", "batch"] | None = None,
    **options: Any,
) -> Callable[[DataFrame, int], WriteResult]:
    """A function for ``writeStream.foreachBatch``: each micro-batch written once, keyed by Spark's batch id
    and the streaming query's id (a batch of another query under the same sink_id is refused).

    A replayed micro-batch that was committed before writes nothing and starts no Spark job.  The function may
    be called in the query's thread or any other (``pool.submit(fn, df, batch_id)``): in classic Spark the query
    is found from ``df``'s session (the micro-batch DataFrame Spark passed, or one derived from it).  The options
    are :func:`write`'s (checked now, not at batch 0); ``mode="overwrite"`` makes each micro-batch replace the
    table's rows (a streaming aggregation's result).  ``checkpoint_location``: the query's, where Spark Connect
    gives the function no other way to learn the query's id; without it a Connect replay cannot be told from
    another query's batch and is refused.

    Returns:
        a function of ``(df, batch_id)`` returning each micro-batch's :class:`WriteResult`.

    Raises:
        OptionError: now, for an invalid option; in a micro-batch, for a batch id below the sink's last decided
            one (a new or reset checkpoint: give the query its own ``sink_id``).
        the errors of :func:`write`, in the micro-batch that meets them (Spark then stops the query).
    """
    named = {
        "user": user,
        "password": password,
        "numPartitions": numPartitions,
        "createTable": createTable,
        "createTableColumnTypes": createTableColumnTypes,
        "batchsize": batchsize,
        "upsertKeyColumns": upsertKeyColumns,
        "replaceWhere": replaceWhere,
        "replaceWhereCheck": replaceWhereCheck,
        "deleteFlagColumn": deleteFlagColumn,
        "sequenceColumn": sequenceColumn,
        "localInfile": localInfile,
        "lockTimeout": lockTimeout,
        "journalSchema": journalSchema,
        "journalTablePrefix": journalTablePrefix,
        "journalRetention": journalRetention,
        "commitParallelism": commitParallelism,
        "commitTimeout": commitTimeout,
        "commitRetries": commitRetries,
        "controlLockTimeout": controlLockTimeout,
        "visibility": visibility,
    }
    options = merged_options(named, options)
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
