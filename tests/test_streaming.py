"""Structured Streaming into PostgreSQL through xasink, in the test process's local Spark session.

A file source (one JSON file per micro-batch, ``maxFilesPerTrigger=1``) is the replayable input.  A
replay is made the way a crash makes it: Spark's ``commits/N`` is missing while our decision for N is
durable.  Each test checks the exact ids (each once), the decision log, and that nothing of the sink is
left prepared.  The kill-at-every-point tests are in ``test_stream_crash.py``.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg2
import pyarrow as pa
import pytest
from pyspark.sql import DataFrame

import xasink
from tests.cluster import wait_for
from tests.harness import ROWS, Stream, failure_text, log_table_locked, needs_data_source, no_branch_opened
from tests.targets import Target, connect, prepared_gids, rollback_prepared
from xasink.dialects import dialect_for
from xasink.options import parse_options
from xasink.protocol.coordinator import Coordinator
from xasink.protocol.partition_writer import write_partition
from xasink.protocol.xid import Xid, attempt_token, new_run_nonce
from xasink.support.faults import LOCAL_PROPERTY
from xasink.write_modes.schema import plan_target


def hold_partition(flag: Path, partition: int) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """A mapInArrow function that keeps one partition's task waiting until ``flag`` exists."""
    path = str(flag)

    def hold(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        if ctx is not None and ctx.partitionId() == partition:
            deadline = time.monotonic() + 300
            while not os.path.exists(path) and time.monotonic() < deadline:
                time.sleep(0.05)
        yield from batches

    return hold


# --------------------------------------------------------------------------- the happy path and options


@pytest.mark.core
def test_each_batch_once_with_its_figures_in_the_decision_log(stream: Stream) -> None:
    needs_data_source()
    stream.add_files(3)
    stream.run()
    stream.assert_exactly_once()
    for batch, rec in stream.decisions().items():
        assert (rec["rows"], rec["branches"], len(rec["xids"])) == (ROWS, 3, 3), (batch, rec)
        assert rec["prepare_ms"] >= 0 and rec["commit_ms"] is not None and rec["commit_ms"] >= 0
        assert all(x.startswith(f"xasink:{stream.sink_id}:{batch}/") for x in rec["xids"])
    # each batch's tasks share one run nonce; every batch has its own (streamWriter() plans each batch)
    runs = [{x.rsplit("-", 1)[1] for x in rec["xids"]} for rec in stream.decisions().values()]
    assert all(len(r) == 1 for r in runs) and len(set.union(*runs)) == 3


def test_sink_id_is_required_for_streaming(stream: Stream) -> None:
    stream.add_files(1)
    df = stream.frame()
    query = (
        df.writeStream.format("xasink")
        .option("url", stream.url)
        .option("dbtable", stream.table)
        .option("checkpointLocation", str(stream.checkpoint))
        .trigger(availableNow=True)
    )
    with pytest.raises(Exception, match="option 'sinkId' is required for streaming"):  # noqa: PT011
        query.start().awaitTermination()
    assert stream.ids() == []


def test_batch_id_option_is_refused_for_streaming(stream: Stream) -> None:
    stream.add_files(1)
    with pytest.raises(Exception, match="option 'batchId' cannot be set for streaming"):  # noqa: PT011
        stream.run(batchId="7")
    assert stream.ids() == []


# --------------------------------------------------------------------------- replays


@pytest.mark.core
def test_replayed_batch_writes_nothing_even_partitioned_differently(stream: Stream) -> None:
    needs_data_source()
    stream.add_files(2)
    stream.run(partitions=3)
    before = stream.decisions()
    stream.forget_spark_commit(1)
    with no_branch_opened(stream, 1):  # Spark re-runs batch 1 with two partitions: its tasks see the decision
        stream.run(partitions=2)
    assert stream.decisions() == before  # no new decision, the record is the first run's
    stream.add_files(1)
    stream.run(partitions=2)
    stream.assert_exactly_once()
    assert stream.decisions()[2]["branches"] == 2


def test_replay_of_a_decided_but_unfinished_batch_is_finished_not_rewritten(stream: Stream) -> None:
    """A crash after the decision: the restart commits the decided branches; the replay adds nothing."""
    stream.add_files(1)
    stream.run(partitions=3)
    # batch 1 as a crashed run left it: its three branches prepared and decided, none committed
    options = parse_options({"url": stream.url, "dbtable": stream.table, "sinkId": stream.sink_id})
    coordinator = Coordinator(options)
    try:
        with coordinator.dialect.connect() as conn:
            plan = plan_target(coordinator.dialect, conn, options, pa.schema([("id", pa.int64())]))
        run = new_run_nonce()
        outcomes = [
            write_partition(
                options,
                plan,
                batch_id=1,
                partition=p,
                task_attempt_id=1000 + p,
                run=run,
                batches=iter([pa.record_batch([pa.array(list(range(ROWS + p, 2 * ROWS, 3)), pa.int64())], ["id"])]),
            )
            for p in range(3)
        ]
        os.environ["XASINK_FAULT"] = "driver.after_decide:raise:b=1"
        try:
            with pytest.raises(Exception, match="injected fault at driver.after_decide"):  # noqa: PT011
                coordinator.commit(1, outcomes)
        finally:
            del os.environ["XASINK_FAULT"]
    finally:
        coordinator.close()
    assert stream.decisions()[1]["state"] == "committing" and len(stream.prepared()) == 3
    assert stream.ids() == list(range(ROWS))
    stream.add_files(1)  # Spark's batch 1: the same ids the crashed run had prepared
    with no_branch_opened(stream, 1):
        stream.run(partitions=2)
    stream.assert_exactly_once()
    assert stream.decisions()[1]["branches"] == 3  # finished as decided, not rewritten by the replay


def test_a_reset_checkpoint_is_refused_not_silently_skipped(stream: Stream, tmp_path: Path) -> None:
    stream.add_files(2)
    stream.run()
    stream.checkpoint = tmp_path / "new-checkpoint"  # same sinkId, fresh checkpoint: Spark starts at batch 0
    # batch 0's tasks already see that the log holds batch 0 for another query (the old checkpoint's)
    refused = "already decided batch 1, but Spark is committing batch 0|BatchIdentityError: .* batch 0 was committed"
    with pytest.raises(Exception, match=refused):  # noqa: PT011
        stream.run()
    assert stream.ids() == list(range(2 * ROWS))
    assert stream.prepared() == []


def test_another_query_with_the_same_sink_id_is_refused_not_skipped(stream: Stream, tmp_path: Path) -> None:
    """Batch 0 of query A is committed; query B (another checkpoint, other input) with the same sinkId and
    its own batch 0 is not a replay: refused, nothing of it written, nothing prepared."""
    stream.add_files(1)
    stream.run()
    with connect(stream.url) as conn, conn.cursor() as cur:
        cur.execute("SELECT target FROM xasink_batches WHERE sink_id = %s AND batch_id = 0", (stream.sink_id,))
        target = json.loads(cur.fetchone()[0])
    assert target["table"] == stream.table and target["schema"] == "public"
    query_a = target["query"]  # the query's id, as Spark keeps it in the checkpoint
    stream.checkpoint = tmp_path / "other-checkpoint"
    stream.input = tmp_path / "other-input"
    stream.input.mkdir()
    (stream.input / "part-0000.json").write_text("".join(json.dumps({"id": i}) + "\n" for i in range(1000, 1010)))
    with pytest.raises(Exception, match=f"BatchIdentityError.*streaming query {query_a}"):  # noqa: PT011
        stream.run()
    assert stream.ids() == list(range(ROWS))
    assert stream.prepared() == []


# --------------------------------------------------------------------------- failures and stops


def test_failed_task_rolls_back_the_batch_and_a_restart_writes_it_once(stream: Stream) -> None:
    stream.add_files(2)
    # every attempt of partition 1 of batch 1 prepares its branch, then fails: Spark gives up and aborts
    stream.spark.sparkContext.setLocalProperty(LOCAL_PROPERTY, "task.after_prepare:raise:p=1:b=1")
    query = stream.writer(stream.frame()).trigger(availableNow=True).start()
    assert "injected fault at task.after_prepare" in failure_text(query)
    stream.spark.sparkContext.setLocalProperty(LOCAL_PROPERTY, None)  # type: ignore[arg-type]
    assert stream.ids() == list(range(ROWS))
    assert stream.prepared() == []
    assert sorted(stream.decisions()) == [0]
    stream.run()
    stream.assert_exactly_once()


@pytest.mark.core
def test_retried_task_replaces_its_prepared_branch(stream: Stream) -> None:
    needs_data_source()
    stream.add_files(1)
    stream.spark.sparkContext.setLocalProperty(LOCAL_PROPERTY, "task.after_prepare:raise:p=1:a=0")
    try:
        stream.run()
    finally:
        stream.spark.sparkContext.setLocalProperty(LOCAL_PROPERTY, None)  # type: ignore[arg-type]
    stream.assert_exactly_once()
    assert sorted(Xid.parse(x).partition for x in stream.decisions()[0]["xids"]) == [0, 1, 2]  # type: ignore[union-attr]


def test_clean_stop_leaves_nothing_prepared(stream: Stream, tmp_path: Path) -> None:
    """Stop while one partition's branch is prepared and another task still runs: the batch is rolled back.

    Spark runs the writer's abort in the query's thread, which ``query.stop()`` interrupts: when the
    interrupt lands in the abort itself (Spark logs "... failed to abort"; seen once in a CI rehearsal
    under heavy load), the branch stays prepared until the query's next start, as docs/operations.md says.
    Then the one branch left must be partition 0's of batch 0, and the next start must roll it back."""
    stream.add_files(1)
    flag = tmp_path / "release"
    df = stream.frame(2, lambda d: d.mapInArrow(hold_partition(flag, 1), d.schema))
    query = stream.writer(df).trigger(availableNow=True).start()
    wait_for(lambda: len(stream.prepared()) == 1, 180, "partition 0's branch to be prepared")
    held = stream.prepared()
    query.stop()
    left = stream.prepared()
    assert left in ([], held), f"a stop left {left}; before it, {held} was prepared"
    xids = [Xid.parse(g) for g in held]
    assert all(xids) and [(x.batch_id, x.partition) for x in xids if x is not None] == [(0, 0)], held
    assert stream.ids() == []
    assert stream.decisions() == {}
    flag.touch()
    stream.run()
    stream.assert_exactly_once()  # nothing prepared either


def test_stale_branches_of_a_crashed_run_are_rolled_back(stream: Stream) -> None:
    """Branches no decision lists (a crashed run's, a zombie task's) never commit; the next batch clears them."""
    stream.add_files(1)
    stream.run()
    options = parse_options({"url": stream.url, "dbtable": stream.table, "sinkId": stream.sink_id})
    coordinator = Coordinator(options)
    try:
        with coordinator.dialect.connect() as conn:
            plan = plan_target(coordinator.dialect, conn, options, pa.schema([("id", pa.int64())]))
            log_id = coordinator.journal.log_id(conn)
    finally:
        coordinator.close()
    stale = range(10_000, 10_010)  # ids no input file has: any of them in the table would be a leak

    def leave_branch(batch: int, partition: int) -> None:
        """Prepare a branch the way a task does, without its check of the decision log (a zombie would not)."""
        dialect = dialect_for(options.url)
        try:
            session = dialect.open_branch(
                Xid(log_id, stream.sink_id, batch, partition, attempt_token(99, new_run_nonce())), plan
            )
            session.load(iter([pa.record_batch([pa.array(list(stale), pa.int64())], ["id"])]))
            session.prepare()
        finally:
            dialect.dispose()

    leave_branch(0, 1)  # a zombie task of the committed batch 0, prepared after its decision
    leave_branch(1, 0)  # the crashed run's branch of batch 1, which the restart replays
    assert len(stream.prepared()) == 2
    stream.add_files(1)
    stream.run(partitions=2)
    stream.assert_exactly_once()


# --------------------------------------------------------------------------- invariant 4 through Spark


RECOVERY_APP = "xasink-test-recovery"


def test_recovery_racing_a_live_commit_leaves_the_live_batch_alone(stream: Stream, pg: Target, pg_url: str) -> None:
    """``xasink recover`` while a batch is prepared and its commit is deciding: the run is alive, so it waits.

    Batch 1's last task stalls after its prepare (a fault point), so every branch of the batch is prepared and
    the decision cannot have been made yet: the test holds the sink lock then and queues a full recovery (no
    age threshold) on it beside the stream's commit.  Whichever takes the lock first, the recovery rolls back
    nothing: the stream's driver holds its run guard, so its undecided branches belong to a live run (before
    run guards, the recovery rolled them back and the batch failed).  Every batch commits, exactly once.
    """
    raced_batch = 1
    recovery_url = f"{pg_url}{'&' if '?' in pg_url else '?'}application_name={RECOVERY_APP}"
    options = parse_options({"url": recovery_url, "dbtable": stream.table, "sinkId": stream.sink_id})
    context = stream.spark.sparkContext
    context.setLocalProperty(LOCAL_PROPERTY, f"task.after_prepare:sleep=15:p=2:b={raced_batch}")
    try:
        query = stream.writer(stream.frame()).trigger(processingTime="200 milliseconds").start()
    finally:
        context.setLocalProperty(LOCAL_PROPERTY, None)  # type: ignore[arg-type]
    try:
        for batch in range(3):
            stream.add_files(1)
            if batch != raced_batch:
                wait_for(lambda b=batch: (stream.checkpoint / "commits" / str(b)).exists(), 180, "Spark's commit")
                continue
            gid_prefix = f"xasink:{stream.sink_id}:{batch}/"
            wait_for(lambda p=gid_prefix: len(prepared_gids(pg_url, prefix=p)) == 3, 180, f"batch {batch} prepared")
            assert batch not in stream.decisions(), "the stalled batch was decided before its last task returned"
            report: dict[str, Any] = {}
            lock = psycopg2.connect(pg_url)
            thread: threading.Thread | None = None
            try:
                with lock.cursor() as cur:
                    cur.execute("SELECT sink_id FROM xasink_sinks WHERE sink_id = %s FOR UPDATE", (stream.sink_id,))

                def recover(out: dict[str, Any] = report) -> None:
                    coordinator = Coordinator(options)
                    try:
                        out["report"] = coordinator.recover()
                    finally:
                        coordinator.close()

                thread = threading.Thread(target=recover)
                thread.start()
                wait_for(
                    lambda: RECOVERY_APP in pg.lock_waiters("%FOR UPDATE%"),
                    180,
                    "the recovery to wait for the sink lock",
                )
            finally:
                lock.rollback()
                lock.close()
            thread.join(120)
            assert not thread.is_alive(), "the recovery did not finish"
            assert report["report"].rolled_back == [], "a recovery rolled back a live run's branches"
            wait_for(lambda b=batch: (stream.checkpoint / "commits" / str(b)).exists(), 180, "Spark's commit")
    finally:
        query.stop()
    assert stream.prepared() == []
    assert sorted(stream.decisions()) == [0, 1, 2]
    stream.assert_exactly_once()


# --------------------------------------------------------------------------- foreachBatch


@pytest.mark.core
def test_foreach_batch_writes_each_batch_once_and_skips_replays(stream: Stream) -> None:
    stream.add_files(2)
    fn = xasink.foreach_batch(url=stream.url, table=stream.table, sink_id=stream.sink_id)

    def run() -> None:
        stream.foreach_batch(fn).awaitTermination()

    run()
    before = stream.decisions()
    stream.forget_spark_commit(1)
    with no_branch_opened(stream, 1):  # Spark calls the function again with batch 1: it writes nothing
        run()
    assert stream.decisions() == before
    stream.assert_exactly_once()
    stream.checkpoint = stream.checkpoint.parent / "new-checkpoint"
    with pytest.raises(Exception, match="has already decided batch 1, but Spark is committing batch 0"):  # noqa: PT011
        run()
    stream.assert_exactly_once()


def test_format_in_the_users_own_foreach_batch_without_batch_id_is_refused(stream: Stream) -> None:
    """The move from format("jdbc") by one word and a sinkId: every micro-batch would be batch 0 (batchId's
    default), and each after the first skipped as its replay.  Refused at the first micro-batch instead."""
    stream.add_files(3)
    url, table, sink = stream.url, stream.table, stream.sink_id

    def users_own(df: DataFrame, epoch_id: int) -> None:
        df.write.format("xasink").option("url", url).option("dbtable", table).option("sinkId", sink).mode(
            "append"
        ).save()

    assert "xasink.foreach_batch" in failure_text(stream.foreach_batch(users_own))
    assert stream.ids() == [] and stream.prepared() == []


def test_foreach_batch_multi_of_another_query_with_the_same_sink_id_is_refused(stream: Stream, tmp_path: Path) -> None:
    """Query A commits batch 0; query B (another checkpoint, other input, the same sink_id) is no replay."""
    stream.add_files(1)
    url, table = stream.url, stream.table

    def one(df: DataFrame, epoch_id: int, tx: Any) -> None:
        tx.write(df, url, table)

    fn = xasink.foreach_batch_multi(one, sink_id=stream.sink_id)

    stream.foreach_batch(fn).awaitTermination()
    assert stream.ids() == list(range(ROWS))
    stream.checkpoint = tmp_path / "other-checkpoint"
    stream.input = tmp_path / "other-input"
    stream.input.mkdir()
    (stream.input / "part-0000.json").write_text("".join(json.dumps({"id": i}) + "\n" for i in range(1000, 1010)))
    assert "BatchIdentityError" in failure_text(stream.foreach_batch(fn))
    assert stream.ids() == list(range(ROWS)) and stream.prepared() == []


def test_an_abort_rolls_back_even_where_planning_again_would_fail(stream: Stream) -> None:
    """The abort plans nothing (no server checks, table plan or recovery): here planning again would fail,
    since numPartitions asks for every prepared-transaction slot of the server and the failed batch holds
    some, yet the batch's branches are rolled back at once, not left held until the driver exits."""
    stream.add_files(1)
    with connect(stream.url) as conn, conn.cursor() as cur:
        cur.execute("SHOW max_prepared_transactions")
        limit = int(cur.fetchone()[0])
    stream.spark.sparkContext.setLocalProperty(LOCAL_PROPERTY, "task.after_prepare:raise:p=1")
    try:
        query = stream.writer(stream.frame(), numPartitions=str(limit)).trigger(availableNow=True).start()
        assert "injected fault at task.after_prepare" in failure_text(query)
    finally:
        stream.spark.sparkContext.setLocalProperty(LOCAL_PROPERTY, None)  # type: ignore[arg-type]
    left = stream.prepared()
    for gid in left:  # held branches would block the fixture's DROP TABLE: a failing run must not hang
        rollback_prepared(stream.url, gid)
    assert left == []
    assert stream.ids() == [] and stream.decisions() == {}


def test_a_database_error_while_checking_before_a_micro_batch_says_restart_the_query(
    stream: Stream, pg: Target
) -> None:
    """Another session holds the decision log's identity table while a micro-batch plans (its read waits past
    controlLockTimeout): the query stops with the stream's text of BatchAbortedError, saying this run wrote
    nothing and to restart the query, never the server's raw error.  Restarted once the lock is gone, it
    writes every row once."""
    needs_data_source()
    stream.add_files(1)
    stream.run()  # batch 0, and the log
    stream.add_files(1)
    with log_table_locked(pg, "xasink_log"):  # (the stream's database is the pg fixture's)
        query = stream.writer(stream.frame(), controlLockTimeout="1").trigger(availableNow=True).start()
        text = failure_text(query)
    assert "before a micro-batch's tasks failed" in text and "Restart it once that is fixed" in text, text
    assert stream.ids() == list(range(ROWS)) and stream.prepared() == []
    stream.run()
    stream.assert_exactly_once()
