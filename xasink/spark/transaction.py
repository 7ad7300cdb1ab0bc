"""``xasink.transaction()``: one atomic batch across several tables and databases.

    with xasink.transaction(sink_id="nightly", batch_id=20261122, journal_url=pg_url) as tx:
        tx.write(orders, pg_url, "orders")
        tx.write(audit, maria_url, "events")

Each ``tx.write`` prepares its branches (a Spark job, like ``xasink.write``) and records them in the
decision log without deciding; leaving the block decides once over every write (xasink.protocol.multi_target).
Writes may run in several threads; the decision waits for all of them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any

from pyspark.sql import DataFrame

from xasink import errors
from xasink.journal.targets import UNKNOWN_QUERY
from xasink.options import WriteOptions, parse_options
from xasink.protocol.multi_target import MultiCoordinator
from xasink.protocol.xid import MAX_BATCH_ID, valid_sink_id
from xasink.results import TargetResult, TransactionResult, WriteResult
from xasink.spark.api import ready_session
from xasink.spark.datasource import RUN_OPTION
from xasink.spark.frames import shape
from xasink.spark.job_errors import error_summary, unwrap_error
from xasink.spark.partition_job import save
from xasink.spark.streams import micro_batch_query
from xasink.spark.txwrite import TX_GUARD_OPTION, TX_PART_OPTION, TX_URL_OPTION
from xasink.support.faults import fault
from xasink.support.masking import redact, url_secrets

log = logging.getLogger("xasink")

LOG_TABLE_PLACEHOLDER = "xasink_transaction"  # parse_options wants a table; the log's options name none


class Transaction:
    """A context manager: every write in the block commits, or none does (see the module docstring)."""

    def __init__(self, sink_id: str, batch_id: int, journal_url: str | None = None, **options: Any) -> None:
        if not isinstance(sink_id, str) or not valid_sink_id(sink_id):
            raise errors.OptionError(f"sink_id {str(sink_id)[:60]!r} is invalid: 1 to 32 of A-Z a-z 0-9 _ . -")
        if isinstance(batch_id, bool) or not isinstance(batch_id, int) or not 0 <= batch_id <= MAX_BATCH_ID:
            raise errors.OptionError(f"batch_id must be an integer from 0 to {MAX_BATCH_ID}")
        self.sink_id = sink_id
        self.batch_id = batch_id
        self.options = options  # defaults for every write; user/password also reach journal_url
        self.journal_url = journal_url
        self.result: TransactionResult | None = None
        self._stream = False  # set by foreach_batch_multi: batch ids are micro-batch ids
        self._query: str | None = None  # set by foreach_batch_multi: the streaming query's id, when known
        self._blind = False  # set by foreach_batch_multi under Spark Connect: the query's id may be unknowable
        self._cond = threading.Condition()
        self._mc: MultiCoordinator | None = None
        self._next_part = 0
        self._inflight = 0
        self._written: set[int] = set()
        self._targets: list[TargetResult] = []
        self._failed: BaseException | None = None
        self._state = "new"
        self._t0 = 0.0

    def __enter__(self) -> Transaction:
        if self._state != "new":
            raise errors.XasinkError("a transaction object is entered once")
        self._state = "open"
        self._t0 = time.perf_counter()
        return self

    # -- writes ----------------------------------------------------------------------------------------
    def _parse(self, url: str, table: str, options: dict[str, Any]) -> WriteOptions:
        raw = {**self.options, **options, "url": url, "dbtable": table}
        for key in [k for k in raw if k.lower() in ("sinkid", "batchid")]:
            raise errors.OptionError(f"option '{key}': a transaction's writes take its sink_id and batch_id")
        return parse_options({**raw, "sinkId": self.sink_id, "batchId": self.batch_id})

    def _coordinator(self, first: WriteOptions) -> MultiCoordinator:
        """The transaction's log, opened by its first write: journal_url, or that write's database (then every
        write must go to it: MultiCoordinator refuses a second database)."""
        with self._cond:
            if self._mc is None:
                if self.journal_url is not None:
                    log_opts = parse_options(
                        {**self.options, "url": self.journal_url, "dbtable": LOG_TABLE_PLACEHOLDER}
                    )
                else:
                    log_opts = first
                self._mc = MultiCoordinator(
                    self.sink_id,
                    self.batch_id,
                    log_opts,
                    stream=self._stream,
                    fixed=self.journal_url is not None,
                    query=self._query,
                    blind=self._blind,
                )
            return self._mc

    def write(self, df: DataFrame, url: str, table: str, **options: Any) -> WriteResult:
        """Prepare ``df``'s rows for ``table`` in this transaction (same options as ``xasink.write``).

        Its rows become visible only when the block ends without error, together with every other write's.
        """
        with self._cond:
            if self._state != "open":
                raise errors.XasinkError(f"sink {self.sink_id} transaction {self.batch_id} is not open ({self._state})")
            part = self._next_part
            self._next_part += 1
            self._inflight += 1
        t0 = time.perf_counter()
        try:  # every failure from here on fails the block, even one the caller catches (an option error too)
            parsed = self._parse(url, table, options)
            mc = self._coordinator(parsed)
            if mc.replay:
                mc.check_replay(parsed)
                mc.target(parsed)  # finished at the block's end, like the write would have been
                return WriteResult(self.sink_id, self.batch_id, 0, 0, True, {"total": time.perf_counter() - t0})
            ready_session(df.sparkSession)
            # the branches, where Spark counts them without a job (else 0: the slot check counts the other
            # writes only, and each task checks for a free slot before it loads)
            df, branches = shape(df, parsed)
            mc.before_write(parsed, branches or 0)
            raw = {
                **self.options,
                **options,
                "url": url,
                "dbtable": table,
                "sinkId": self.sink_id,
                "batchId": self.batch_id,
            }
            opts = {k: str(v) for k, v in raw.items() if v is not None}
            internal = {
                RUN_OPTION: mc.run,
                TX_URL_OPTION: mc.journal_url,
                TX_PART_OPTION: str(part),
                TX_GUARD_OPTION: mc.guard.name,
            }
            try:
                save(df, {**opts, **internal}, "append")  # format("xasink"), or the partition function (Spark 3.5)
            except errors.XasinkError:  # the driver's own steps, run in this process by the partition function
                raise
            except Exception as exc:
                inner = unwrap_error(exc) or errors.BatchAbortedError(
                    f"sink {self.sink_id} transaction {self.batch_id}: write {part} to {table} failed "
                    f"({redact(error_summary(exc), url_secrets(parsed.url))}); the transaction is rolled back"
                )
                raise inner from exc
            recorded = mc.part(part)
            if recorded is None:
                raise errors.BatchAbortedError(
                    f"sink {self.sink_id} transaction {self.batch_id}: write {part} to {table} recorded no part "
                    "in the decision log; the transaction is rolled back"
                )
            fault("tx.after_write", partition=part, batch=self.batch_id)
            seconds = time.perf_counter() - t0
            name = f"{parsed.table.schema}.{parsed.table.name}" if parsed.table.schema else parsed.table.name
            target = TargetResult(part, recorded.server, name, recorded.rows, len(recorded.xids), {"write": seconds})
            with self._cond:
                self._written.add(part)
                self._targets.append(target)
            return WriteResult(
                self.sink_id, self.batch_id, recorded.rows, len(recorded.xids), False, {"write": seconds}
            )
        except BaseException as exc:
            with self._cond:
                self._failed = self._failed or exc
            raise
        finally:
            with self._cond:
                self._inflight -= 1
                self._cond.notify_all()

    # -- the decision ------------------------------------------------------------------------------------
    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        with self._cond:
            self._state = "closing"
            while self._inflight:  # writes still running in other threads: the decision waits for them
                self._cond.wait()
        mc = self._mc
        try:
            if mc is None:  # no write reached the log: nothing was prepared, nothing to decide
                if exc_type is None and self._failed is None:
                    self._finish(False, {})
                    return
                self._state = "rolled back"
                if exc_type is None:  # a write failed before the log was reached and the block swallowed it
                    raise errors.BatchAbortedError(
                        f"sink {self.sink_id} transaction {self.batch_id}: a write failed "
                        f"({type(self._failed).__name__}) before the decision log was reached, so nothing was "
                        "written"
                    ) from self._failed
                return
            if mc.replay:
                mc.finish_replay()
                if exc_type is None and self._failed is not None:  # e.g. a write refused as not a replay, caught
                    self._state = "refused"
                    raise errors.BatchAbortedError(
                        f"sink {self.sink_id} transaction {self.batch_id} was committed before, but a write of this "
                        f"attempt failed ({type(self._failed).__name__}): it is not a plain replay"
                    ) from self._failed
                self._finish(True, {})
                return
            if exc_type is not None or self._failed is not None:
                left = mc.abort()
                self._state = "rolled back"
                # a write failed and the block swallowed its error: still nothing commits.  The block's own
                # exception goes on as it is, unless a database kept branches of it prepared: then say where
                if exc_type is None or left:
                    failed = type(self._failed).__name__ if exc_type is None else exc_type.__name__
                    why = f"a write failed ({failed})" if exc_type is None else f"the block raised {failed}"
                    raise errors.BatchAbortedError(mc.aborted(f"{why}, so every write is rolled back", left)) from (
                        exc if exc is not None else self._failed
                    )
                return
            _, timings = mc.commit(set(self._written))
            self._finish(False, timings)
            log.info("%s", self.result)
        finally:
            if mc is not None:
                mc.close()

    def _finish(self, skipped: bool, timings: dict[str, float]) -> None:
        self._state = "committed" if not skipped else "skipped"
        targets = tuple(sorted(self._targets, key=lambda t: t.part))
        self.result = TransactionResult(
            self.sink_id, self.batch_id, skipped, targets, {**timings, "total": time.perf_counter() - self._t0}
        )


def transaction(sink_id: str, batch_id: int, journal_url: str | None = None, **options: Any) -> Transaction:
    """One atomic batch across several tables and databases: ``with xasink.transaction(...) as tx:``.

    ``journal_url`` is the database holding the sink's decision log, required when the writes span several
    databases (else the log would be chosen by the order of writes; the write reaching a second database is
    refused); without it the log is the one database written.  ``options`` (user, password, journalSchema,
    ...) apply to every write and to the log.
    """
    return Transaction(sink_id, batch_id, journal_url, **options)


def foreach_batch_multi(
    fn: Callable[[DataFrame, int, Transaction], Any],
    sink_id: str,
    journal_url: str | None = None,
    checkpoint_location: str | None = None,
    **options: Any,
) -> Callable[[DataFrame, int], TransactionResult | None]:
    """A ``foreachBatch`` function running ``fn(df, epoch_id, tx)`` in one transaction per micro-batch.

    The micro-batch id is the transaction's batch id and the streaming query's id is recorded with it: a
    replayed micro-batch of the same query writes nothing anywhere; a micro-batch id below the sink's last
    decided one (a new or reset checkpoint) and a decided batch of another query are refused.  The
    function may be called in any thread (classic Spark finds the query from ``df``'s session).  Under
    Spark Connect the query's id is read from ``checkpoint_location`` (else a decided batch is refused,
    since a replay cannot be told from another query's batch).
    """
    if not valid_sink_id(sink_id):
        raise errors.OptionError(f"sink_id {sink_id[:60]!r} is invalid: 1 to 32 of A-Z a-z 0-9 _ . -")

    def run_batch(df: DataFrame, epoch_id: int) -> TransactionResult | None:
        tx = transaction(sink_id, int(epoch_id), journal_url, **options)
        tx._stream = True
        # whichever thread calls: classic Spark finds the query from the micro-batch DataFrame's session
        query = micro_batch_query(df, checkpoint_location)
        tx._query = None if query == UNKNOWN_QUERY else query
        tx._blind = query == UNKNOWN_QUERY  # a micro-batch whose query cannot be known: a decided one is refused
        with tx:
            fn(df, int(epoch_id), tx)
        return tx.result

    return run_batch
