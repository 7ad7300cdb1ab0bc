"""xasink under faults: process kills on a Spark standalone cluster, database restarts, cut connections,
a second writer of the same sink, and concurrent OLTP load.

The cluster (a Master and one Worker started from the pyspark installation, see ``tests/cluster.py``) and
one driver application are started once for the module (the driver again after a test kills it).  Every
test checks the exact row set (each id once, no row of a losing writer), the decision log, and that
nothing of the sink is left prepared; the figures go to ``benchmarks/results/faults.json``.  The
password every test passes must not appear in any log line, exception or output.

Connection cuts and restarts during the commit phase are driven at the coordinator level (branches
written by ``write_partition`` against the database directly, the coordinator talking through
``tests/tcp_proxy.py``): there the moment of the cut is exact.
"""

from __future__ import annotations

import json
import os
import random
import signal
import threading
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import psycopg2
import pyarrow as pa
import pytest

from tests.cluster import (
    ClusterDriver,
    DriverError,
    StandaloneCluster,
    Tally,
    host_port,
    tally_fixture,
    wait_for,
)
from tests.leaks import SECRET, assert_no_secret, no_secret_in_output, run_cli  # noqa: F401 - autouse fixture
from tests.targets import connect, prepared_gids
from tests.tcp_proxy import TcpProxy
from xasink.dialects import dialect_for
from xasink.dialects.base import Dialect
from xasink.dialects.values import TargetPlan
from xasink.errors import (
    BatchAbortedError,
    BranchError,
    CommitIncompleteError,
    ConcurrentWriterError,
    LateBranchError,
)
from xasink.options import WriteOptions, parse_options
from xasink.protocol.coordinator import Coordinator
from xasink.protocol.partition_writer import write_partition
from xasink.protocol.xid import Xid, new_run_nonce
from xasink.results import BranchOutcome
from xasink.support.embedded import EmbeddedPostgres
from xasink.write_modes.schema import plan_target

RUN_TIMEOUT = 600.0  # seconds a cluster job may take on a loaded machine before it counts as hung
KILL_BATCH = {"driver.before_decide": 9001, "driver.after_decide": 9002}  # batch ids whose decision kills the driver
# BranchError, LateBranchError: without Spark a writer's branch is its own call; the other run took the
# partition over between its PREPARE and its check (a Spark task fails the same way, and the job then aborts)
LOSER_ERRORS = {
    ConcurrentWriterError.__name__,
    BatchAbortedError.__name__,
    BranchError.__name__,
    LateBranchError.__name__,
}

# --------------------------------------------------------------------------- module fixtures


tally = tally_fixture("test_faults")


@pytest.fixture(scope="module")
def cluster() -> Iterator[StandaloneCluster]:
    c = StandaloneCluster(cores=2).start()
    try:
        yield c
    finally:
        logs = [c.log("master"), c.log("worker")]
        logs += [p.read_text(errors="replace") for p in (c.dir / "work").rglob("std*") if p.is_file()]
        c.stop()
        assert_no_secret(*logs)


class Drivers:
    """The module's driver application; a test that kills it gets a fresh one on the next request.

    Every driver carries driver-side fault points for two batch ids no other test uses, so a test can
    kill it at the decision without starting a separate application (each costs a JVM and an executor).
    """

    def __init__(self, cluster: StandaloneCluster, logs: Path) -> None:
        self.cluster, self.logs = cluster, logs
        self.all: list[ClusterDriver] = []
        self.spent: set[str] = set()  # points already killed at: a rerun of that batch must not die again

    def get(self) -> ClusterDriver:
        if self.all and self.all[-1].proc.poll() is None:
            return self.all[-1]
        faults = ",".join(f"{point}:b={batch}" for point, batch in KILL_BATCH.items() if point not in self.spent)
        d = ClusterDriver(
            self.cluster.master_url, self.logs / f"driver{len(self.all)}.log", env={"XASINK_FAULT": faults}
        )
        self.all.append(d)
        d.app_id = d.wait_ready(RUN_TIMEOUT)  # type: ignore[attr-defined]
        return d

    def close(self) -> None:
        for d in self.all:
            d.stop()
        assert_no_secret(*(d.log() for d in self.all))


@pytest.fixture(scope="module")
def drivers(cluster: StandaloneCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Drivers]:
    pool = Drivers(cluster, tmp_path_factory.mktemp("drivers"))
    try:
        yield pool
    finally:
        pool.close()


@pytest.fixture
def driver(drivers: Drivers) -> ClusterDriver:
    return drivers.get()


@pytest.fixture
def table(pg_url: str) -> Iterator[str]:
    name = f"f_{uuid.uuid4().hex[:8]}"
    sql(pg_url, f"CREATE TABLE {name} (id int PRIMARY KEY, name text NOT NULL)")
    yield name
    drop(pg_url, name)


def drop(url: str, table: str) -> None:
    """Drop a test's table, unless a branch a failed test left prepared locks it (the leak check reports that)."""
    try:
        with connect(url) as conn, conn.cursor() as cur:
            cur.execute("SET lock_timeout = '5s'")
            cur.execute(f"DROP TABLE IF EXISTS {table}")
    except psycopg2.errors.LockNotAvailable:
        pass


@pytest.fixture
def restartable(pg_server: EmbeddedPostgres | None) -> EmbeddedPostgres:
    if pg_server is None:
        pytest.skip("restarts the database: needs the embedded server, not XASINK_TEST_PG_URL")
    return pg_server


# --------------------------------------------------------------------------- helpers


def sql(url: str, statement: str, *params: Any) -> list[tuple[Any, ...]]:
    with connect(url) as conn, conn.cursor() as cur:
        cur.execute(statement, params or None)
        return list(cur.fetchall()) if cur.description else []


def new_sink() -> str:
    return f"f{uuid.uuid4().hex[:10]}"


def expected(start: int, n: int, label: str = "n") -> list[tuple[int, str]]:
    return [(i, f"{label}{i}") for i in range(start, start + n)]


def table_rows(url: str, table: str) -> list[tuple[int, str]]:
    return [(int(i), str(n)) for i, n in sql(url, f"SELECT id, name FROM {table} ORDER BY id")]


def sink_prepared(url: str, sink: str) -> list[str]:
    return prepared_gids(url, prefix=f"xasink:{sink}:")


def decision(url: str, sink: str, batch: int) -> tuple[str, list[str]] | None:
    found = sql(url, "SELECT state, xids FROM xasink_batches WHERE sink_id = %s AND batch_id = %s", sink, batch)
    return (found[0][0], sorted(json.loads(found[0][1]))) if found else None


def check_exact(url: str, table: str, want: list[tuple[int, str]], tally: Tally, sink: str | None = None) -> None:
    """The table holds exactly ``want`` (each row once) and nothing of the sink is prepared."""
    have = table_rows(url, table)
    tally.rows(have, want)
    left = sink_prepared(url, sink) if sink else prepared_gids(url, prefix="xasink:")
    tally.add(left_prepared=len(left))
    assert sorted(have) == sorted(want), f"{len(have)} rows, expected {len(want)}"
    assert left == []


def ok(answer: dict[str, Any]) -> dict[str, Any]:
    assert_no_secret(answer.get("message"), answer.get("cause"))
    assert answer["ok"], f"{answer.get('type')}: {answer.get('message')}\n{answer.get('cause', '')[:4000]}"
    return answer


def run(driver: ClusterDriver, url: str, table: str, **request: Any) -> dict[str, Any]:
    return driver.write(RUN_TIMEOUT, url=url, table=table, password=SECRET, **request)


def options(url: str, table: str, sink: str, **extra: Any) -> WriteOptions:
    return parse_options({"url": url, "dbtable": table, "sinkId": sink, "password": SECRET, **extra})


def plan_for(opts: WriteOptions) -> TargetPlan:
    coordinator = Coordinator(opts)
    try:
        coordinator.preflight()
        with coordinator.dialect.connect() as conn:
            schema = pa.schema([("id", pa.int64()), ("name", pa.string())])
            return plan_target(coordinator.dialect, conn, opts, schema)
    finally:
        coordinator.close()


def arrow_rows(rows: list[tuple[int, str]]) -> list[pa.RecordBatch]:
    ids, names = [r[0] for r in rows], [r[1] for r in rows]
    return [pa.RecordBatch.from_arrays([pa.array(ids, pa.int64()), pa.array(names)], names=["id", "name"])]


class Writer:
    """Writes branches the way tasks do (``write_partition`` on the direct URL) for one sink."""

    _attempt = 0
    _lock = threading.Lock()

    def __init__(self, url: str, table: str, sink: str, **extra: Any) -> None:
        self.options = options(url, table, sink, **extra)
        self.plan = plan_for(self.options)
        self.run = new_run_nonce()

    def branch(self, batch: int, partition: int, rows: list[tuple[int, str]]) -> BranchOutcome:
        with Writer._lock:
            Writer._attempt += 1
            attempt = Writer._attempt
        return write_partition(
            self.options,
            self.plan,
            batch_id=batch,
            partition=partition,
            task_attempt_id=attempt,
            run=self.run,
            batches=arrow_rows(rows),
        )

    def batch(self, batch: int, parts: list[list[tuple[int, str]]]) -> list[BranchOutcome | None]:
        return [self.branch(batch, p, rows) for p, rows in enumerate(parts)]


def split(rows: list[tuple[int, str]], parts: int) -> list[list[tuple[int, str]]]:
    return [rows[i::parts] for i in range(parts)]


# =========================================================================== the cluster: executor kills


@pytest.mark.crash
@pytest.mark.spark
@pytest.mark.parametrize("point", ["task.before_prepare", "task.after_prepare"])
def test_python_worker_killed_mid_batch_commits_once(
    driver: ClusterDriver, pg_url: str, table: str, tally: Tally, point: str
) -> None:
    """SIGKILL of partition 1's Python worker (its branch loaded / prepared): Spark retries, each row once."""
    sink = new_sink()
    answer = ok(run(driver, pg_url, table, n=90, partitions=3, sink_id=sink, batch_id=1, fault=f"{point}:kill:p=1:a=0"))
    tally.add(python_worker_kills=1)
    assert (answer["rows"], answer["branches"], answer["skipped"]) == (90, 3, False)
    check_exact(pg_url, table, expected(0, 90), tally, sink)
    state, gids = decision(pg_url, sink, 1) or ("", [])
    xids = {x.partition: x for x in (Xid.parse(g) for g in gids) if x is not None}
    assert state == "committed" and sorted(xids) == [0, 1, 2]
    if point == "task.after_prepare":  # the retry adopted the prepared branch of the killed attempt
        assert xids[1].task_attempt_id < xids[2].task_attempt_id, "partition 1's decided branch is not attempt 0's"
    else:
        assert xids[1].task_attempt_id > xids[2].task_attempt_id, "partition 1's decided branch is not the retry"


@pytest.mark.crash
@pytest.mark.spark
@pytest.mark.parametrize("point", ["task.before_prepare", "task.after_prepare"])
def test_executor_jvm_killed_mid_batch_commits_once(
    cluster: StandaloneCluster, driver: ClusterDriver, pg_url: str, table: str, tally: Tally, point: str
) -> None:
    """SIGKILL of the executor JVM while partition 2 holds its branch loaded (or prepared, unreported).

    Partitions 0 and 1 are prepared and reported by then.  The Worker starts a new executor, Spark reruns
    partition 2 only, and the batch commits each row once: the old attempt's branch was rolled back by
    the server (unprepared: its connection died), or, prepared, it was adopted by the new attempt (which
    reports it instead of writing a branch of its own).
    """
    app: str = driver.app_id  # type: ignore[attr-defined]
    sink = new_sink()
    old = cluster.executors(app)
    fut = driver.submit(
        url=pg_url,
        table=table,
        password=SECRET,
        n=90,
        partitions=3,
        sink_id=sink,
        batch_id=4,
        fault=f"{point}:stop:p=2:a=0",
    )
    try:
        wait_for(lambda: cluster.stopped_python_workers(app) or fut.done(), RUN_TIMEOUT, "partition 2 to stop")
        assert not fut.done(), fut.result()
        prepared = {Xid.parse(g).partition for g in sink_prepared(pg_url, sink)}  # type: ignore[union-attr]
        if point == "task.after_prepare":
            assert prepared == {0, 1, 2}
        else:
            assert prepared == {0, 1}
            loading = sql(
                pg_url,
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'xasink' "
                "AND state = 'idle in transaction' AND datname = current_database()",
            )[0][0]
            assert loading >= 1, "partition 2's branch is not open with its rows"
        killed = cluster.kill_executor(app)
        tally.add(executor_jvm_kills=1)
        answer = ok(fut.result(RUN_TIMEOUT))
    finally:
        if not fut.done():  # never leave the stopped worker holding the job
            for pid in cluster.stopped_python_workers(app):
                os.kill(pid, signal.SIGKILL)
    assert killed in old and killed not in cluster.executors(app), "a new executor replaced the killed one"
    assert (answer["rows"], answer["branches"], answer["skipped"]) == (90, 3, False)
    check_exact(pg_url, table, expected(0, 90), tally, sink)
    state, gids = decision(pg_url, sink, 4) or ("", [])
    assert state == "committed" and sorted(Xid.parse(g).partition for g in gids) == [0, 1, 2]  # type: ignore[union-attr]


# =========================================================================== restarts in the commit phase


class RestartingDialect:
    """Wraps the real dialect: restarts the real server just before the n-th COMMIT PREPARED is sent."""

    def __init__(self, server: EmbeddedPostgres, url: Any, at: int) -> None:
        self.inner: Dialect = dialect_for(url)
        self.server, self.at, self.calls, self.restarts = server, at, 0, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def commit_prepared(self, conn: Any, xid: Xid) -> None:
        self.calls += 1
        if self.calls == self.at:
            self.server.restart()  # the pool's connection, opened before, is dead now
            self.restarts += 1
        self.inner.commit_prepared(conn, xid)


@pytest.mark.crash
@pytest.mark.parametrize("at", [1, 2], ids=["before-first-commit", "after-first-commit"])
def test_database_restart_during_commit_phase_is_retried(
    restartable: EmbeddedPostgres, pg_url: str, table: str, tally: Tally, at: int, caplog: pytest.LogCaptureFixture
) -> None:
    """The server restarts while the coordinator commits: the decided branches survive, it reconnects, finishes."""
    sink = new_sink()
    writer = Writer(pg_url, table, sink)
    rows = expected(0, 30)
    outcomes = writer.batch(0, split(rows, 3))
    dialect = RestartingDialect(restartable, writer.options.url, at)
    coordinator = Coordinator(options(pg_url, table, sink, commitParallelism=1), dialect=dialect)  # type: ignore[arg-type]
    try:
        result = coordinator.commit(0, outcomes)
    finally:
        coordinator.close()
    tally.add(db_restarts=dialect.restarts)
    assert dialect.restarts == 1 and (result.rows, result.branches) == (30, 3)
    assert "retry 1" in caplog.text  # the dead connection's commit was retried, not ignored
    check_exact(pg_url, table, rows, tally, sink)
    assert decision(pg_url, sink, 0)[0] == "committed"  # type: ignore[index]


# =========================================================================== cut connections (TCP proxy)


@pytest.fixture
def proxy(pg_url: str) -> Iterator[TcpProxy]:
    with TcpProxy(*host_port(pg_url)) as p:
        yield p


def via(proxy: TcpProxy, url: str) -> str:
    host, port = host_port(url)
    return url.replace(f"@{host}:{port}/", f"@127.0.0.1:{proxy.port}/")


@pytest.mark.parametrize("after_reply", [True, False], ids=["reply-lost", "statement-lost"])
def test_cut_during_commit_prepared_is_retried_once_per_branch(
    proxy: TcpProxy, pg_url: str, table: str, tally: Tally, after_reply: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """Two COMMIT PREPAREDs lose their connection (executed with the reply lost, or never sent): retried, done.

    A retry of a commit that did happen meets "unknown prepared transaction" and counts it as committed.
    """
    sink = new_sink()
    rows = expected(0, 45)
    outcomes = Writer(pg_url, table, sink).batch(0, split(rows, 3))
    proxy.cut_on(b"COMMIT PREPARED", times=2, after_reply=after_reply)
    coordinator = Coordinator(options(via(proxy, pg_url), table, sink, commitRetries=3))
    try:
        result = coordinator.commit(0, outcomes)
    finally:
        coordinator.close()
    tally.add(cut_connections=proxy.cut)
    assert proxy.cut == 2 and result.rows == 45
    if after_reply:
        # each branch whose COMMIT ran with its reply cut is found unknown once, by its next attempt; the two cuts
        # may both hit one branch (its first COMMIT, then the retry's answer), as under CI load
        retried = [r.getMessage() for r in caplog.records if r.msg == "%s failed (%s), retry %d in %.1f s"]
        cut = {message.split(" failed (")[0] for message in retried if message.startswith("commit of ")}
        assert caplog.text.count("unknown to the server: committed by an earlier attempt") == len(cut) >= 1
    check_exact(pg_url, table, rows, tally, sink)
    assert decision(pg_url, sink, 0)[0] == "committed"  # type: ignore[index]


def test_refused_reconnects_during_commit_are_retried(proxy: TcpProxy, pg_url: str, table: str, tally: Tally) -> None:
    """After the first COMMIT PREPARED is cut, the next two connections are refused: still within the retries."""
    sink = new_sink()
    rows = expected(100, 40)
    outcomes = Writer(pg_url, table, sink).batch(3, split(rows, 2))
    proxy.cut_on(b"COMMIT PREPARED", times=1, after_reply=False, then_refuse=2)
    coordinator = Coordinator(options(via(proxy, pg_url), table, sink, commitRetries=4, commitParallelism=1))
    try:
        result = coordinator.commit(3, outcomes)
    finally:
        coordinator.close()
    tally.add(cut_connections=proxy.cut, refused_connections=proxy.refused)
    assert (proxy.cut, proxy.refused, result.rows) == (1, 2, 40)
    check_exact(pg_url, table, rows, tally, sink)


def test_server_unreachable_during_commit_gives_commit_incomplete_then_recovery_finishes(
    proxy: TcpProxy, pg_url: str, table: str, tally: Tally
) -> None:
    """The database becomes unreachable after the first COMMIT PREPARED executed: bounded retries, then a
    clear CommitIncompleteError; the decision stands, and recovery through the proxy finishes the rest."""
    sink, retries = new_sink(), 2
    rows = expected(0, 60)
    parts = split(rows, 3)
    outcomes = Writer(pg_url, table, sink).batch(5, parts)
    proxy.cut_on(b"COMMIT PREPARED", times=1, after_reply=True, then_down=True)
    coordinator = Coordinator(options(via(proxy, pg_url), table, sink, commitRetries=retries, commitParallelism=1))
    try:
        with pytest.raises(CommitIncompleteError) as info:
            coordinator.commit(5, outcomes)
    finally:
        coordinator.close()
    message = str(info.value)
    assert "could not be committed yet" in message and "xasink recover" in message and "no row is lost" in message
    assert_no_secret(info.value)
    assert 0 < proxy.refused < (retries + 1) * len(parts), "retries were not bounded"  # the first try was cut
    tally.add(cut_connections=proxy.cut, refused_connections=proxy.refused)
    # the decision is durable; one branch is committed (its reply was lost), the others wait prepared
    state, gids = decision(pg_url, sink, 5) or ("", [])
    assert state == "committing" and len(gids) == 3
    left = sink_prepared(pg_url, sink)
    assert len(left) == 2 and set(left) < set(gids)
    visible = table_rows(pg_url, table)
    assert len(visible) == 20 and any(sorted(visible) == sorted(p) for p in parts), "not exactly one whole branch"

    proxy.reset()  # the server is reachable again: the operator's tool finishes the batch
    url = via(proxy, pg_url)  # the superuser's password in the URL: the CLI must not show it
    cli = run_cli("recover", "--url", url, "--sink-id", sink, "--older-than", "0s")
    assert cli.returncode == 0, cli.stdout + cli.stderr
    check_exact(pg_url, table, rows, tally, sink)
    assert decision(pg_url, sink, 5) == ("committed", gids)


# =========================================================================== a second writer of the same sink


def _settle(url: str, table: str, sink: str, batch: int, results: dict[str, dict[str, Any]], tally: Tally) -> str:
    """Check one raced batch: exactly one writer won, the other wrote nothing and said why; returns the winner."""
    winners = [label for label, r in results.items() if r["ok"] and not r.get("skipped")]
    for r in results.values():
        assert_no_secret(r.get("message"), r.get("cause"))
        if not r["ok"]:
            assert r["type"] in LOSER_ERRORS, f"{r['type']}: {r['message']}"
            assert "nothing" in r["message"] or "rolled back" in r["message"], r["message"]
    assert len(winners) == 1, results
    tally.add(concurrent_writer_races=1)
    return winners[0]


@pytest.mark.spark
def test_second_writer_with_the_same_sink_id_on_the_cluster(
    driver: ClusterDriver, pg_url: str, table: str, tally: Tally
) -> None:
    """Two jobs of one application write the same (sinkId, batchId) at once, three batches in a row.

    Each batch ends with exactly one writer's rows (the other skipped as a replay, or failed with a
    ConcurrentWriterError and wrote nothing): the later run to start a task takes the batch over.
    """
    sink = new_sink()
    want: list[tuple[int, str]] = []
    for batch in range(3):
        start = batch * 1000
        futs: dict[str, Future[dict[str, Any]]] = {
            label: driver.submit(
                url=pg_url,
                table=table,
                password=SECRET,
                n=40,
                start=start + offset,
                label=label,
                partitions=2,
                sink_id=sink,
                batch_id=batch,
            )
            for label, offset in (("a", 0), ("b", 500))
        }
        results = {label: f.result(RUN_TIMEOUT) for label, f in futs.items()}
        winner = _settle(pg_url, table, sink, batch, results, tally)
        want += expected(start + (0 if winner == "a" else 500), 40, winner)
        check_exact(pg_url, table, want, tally, sink)


def test_second_writer_with_the_same_sink_id_races_the_decision(pg_url: str, table: str, tally: Tally) -> None:
    """Two coordinators (threads, separate runs) prepare and commit the same batches at the same moment."""
    sink = new_sink()
    writers = {label: Writer(pg_url, table, sink) for label in ("a", "b")}
    want: list[tuple[int, str]] = []
    for batch in range(8):
        barrier = threading.Barrier(2)
        results: dict[str, dict[str, Any]] = {}

        def race(
            label: str,
            batch: int = batch,
            barrier: threading.Barrier = barrier,
            results: dict[str, dict[str, Any]] = results,
        ) -> None:
            rows = expected(batch * 1000 + (0 if label == "a" else 500), 20, label)
            barrier.wait()
            coordinator = Coordinator(writers[label].options)
            try:
                outcomes = writers[label].batch(batch, split(rows, 2))
                r = coordinator.commit(batch, outcomes)
                results[label] = {"ok": True, "skipped": r.skipped}
            except (BatchAbortedError, BranchError, LateBranchError) as exc:
                results[label] = {"ok": False, "type": type(exc).__name__, "message": str(exc)}
            finally:
                coordinator.close()

        threads = [threading.Thread(target=race, args=(label,)) for label in writers]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert set(results) == {"a", "b"}, results
        winner = _settle(pg_url, table, sink, batch, results, tally)
        want += expected(batch * 1000 + (0 if winner == "a" else 500), 20, winner)
        check_exact(pg_url, table, want, tally, sink)


# =========================================================================== concurrent OLTP load


class OltpLoad(threading.Thread):
    """Small transactions on the target table (its own rows, negative ids): insert one, update another."""

    def __init__(self, url: str, table: str) -> None:
        super().__init__(daemon=True)
        self.url, self.table = url, table
        self.stop = threading.Event()
        self.committed = 0
        self.errors: list[str] = []
        self.rows: dict[int, str] = {}

    def run(self) -> None:
        rng = random.Random(7)
        conn = psycopg2.connect(self.url)
        try:
            with conn.cursor() as cur:
                cur.execute("SET lock_timeout = '10s'")  # a wait on xasink would show up as an error
            conn.commit()
            k = 0
            while not self.stop.is_set() or k < 20:
                k += 1
                try:
                    with conn.cursor() as cur:
                        cur.execute(f"INSERT INTO {self.table} (id, name) VALUES (%s, %s)", (-k, f"load{k}"))
                        if self.rows:
                            j = rng.choice(sorted(self.rows))
                            cur.execute(f"UPDATE {self.table} SET name = %s WHERE id = %s", (f"upd{k}", j))
                            updated = (j, f"upd{k}")
                        else:
                            updated = None
                        cur.execute(f"SELECT count(*) FROM {self.table} WHERE id >= 0")
                    conn.commit()
                except psycopg2.Error as exc:
                    conn.rollback()
                    self.errors.append(str(exc).strip())
                    continue
                self.committed += 1
                self.rows[-k] = f"load{k}"
                if updated:
                    self.rows[updated[0]] = updated[1]
        finally:
            conn.close()


@pytest.mark.spark
def test_concurrent_oltp_load_on_the_target_table(driver: ClusterDriver, pg_url: str, table: str, tally: Tally) -> None:
    """While xasink writes four batches, a client commits small transactions on the same table: every one
    succeeds (no deadlock, no lock timeout), and both its rows and xasink's are exact afterwards."""
    sink = new_sink()
    load = OltpLoad(pg_url, table)
    load.start()
    try:
        for batch in range(4):
            answer = ok(
                run(driver, pg_url, table, n=100, start=batch * 100, partitions=3, sink_id=sink, batch_id=batch)
            )
            assert (answer["rows"], answer["skipped"]) == (100, False)
    finally:
        load.stop.set()
        load.join(120)
    tally.add(oltp_transactions=load.committed)
    assert not load.is_alive() and load.errors == [], load.errors[:3]
    assert load.committed >= 20
    want = expected(0, 400) + sorted(load.rows.items())
    check_exact(pg_url, table, want, tally, sink)
    states = sql(pg_url, "SELECT batch_id, state FROM xasink_batches WHERE sink_id = %s ORDER BY batch_id", sink)
    assert states == [(b, "committed") for b in range(4)]


# =========================================================================== the cluster: driver kill + restart
# (last: each kill ends the module's driver application; the next request starts a new one)


@pytest.mark.crash
@pytest.mark.spark
@pytest.mark.parametrize("point", ["driver.before_decide", "driver.after_decide"])
def test_driver_killed_then_database_restarted_then_rerun(
    drivers: Drivers, restartable: EmbeddedPostgres, pg_url: str, table: str, tally: Tally, point: str
) -> None:
    """The driver dies at the decision (before / after it is durable); the database restarts; then a rerun.

    Prepared branches and the decision survive the restart.  Before the decision, a rerun of the same
    (sinkId, batchId) on a new driver rolls back the dead run's branches and writes the batch anew; after
    it, the operator's ``xasink recover`` commits exactly the listed branches.
    """
    sink, batch = new_sink(), KILL_BATCH[point]
    doomed = drivers.get()
    fut = doomed.submit(url=pg_url, table=table, password=SECRET, n=60, partitions=3, sink_id=sink, batch_id=batch)
    assert doomed.wait(RUN_TIMEOUT) == -9, "the driver was not killed by its fault point"
    drivers.spent.add(point)
    with pytest.raises(DriverError):
        fut.result(60)
    tally.add(driver_kills=1)
    before = sorted(sink_prepared(pg_url, sink))
    decided = decision(pg_url, sink, batch)
    assert len(before) == 3 and table_rows(pg_url, table) == []
    assert decided == (None if point == "driver.before_decide" else ("committing", before))

    restartable.restart()
    tally.add(db_restarts=1)
    assert sorted(sink_prepared(pg_url, sink)) == before, "prepared branches did not survive the restart"
    assert decision(pg_url, sink, batch) == decided

    if point == "driver.before_decide":
        answer = ok(run(drivers.get(), pg_url, table, n=60, partitions=2, sink_id=sink, batch_id=batch))
        assert (answer["rows"], answer["skipped"]) == (60, False)
    else:
        cli = run_cli("recover", "--url", pg_url, "--sink-id", sink, "--older-than", "0s")
        assert cli.returncode == 0, cli.stdout + cli.stderr
    check_exact(pg_url, table, expected(0, 60), tally, sink)
    state, gids = decision(pg_url, sink, batch) or ("", [])
    assert state == "committed"
    if point == "driver.after_decide":
        assert gids == before  # the dead run's decision was finished, not replaced


# =========================================================================== soak


def soak(test: Callable[..., None]) -> Callable[..., None]:
    """A soak test: deselected unless asked for (``-m soak``), crash-marked, with no time limit."""
    for mark in (pytest.mark.soak, pytest.mark.crash, pytest.mark.timeout(0)):
        test = mark(test)
    return test


def soak_plan(rounds_per_run: int) -> tuple[int, random.Random]:
    """A soak's rounds (``XASINK_SOAK_RUNS``, default 5, times ``rounds_per_run``) and its random choices
    (seeded by ``XASINK_CRASH_SEED`` when set, to replay a run)."""
    rounds = int(os.environ.get("XASINK_SOAK_RUNS", "5")) * rounds_per_run
    return rounds, random.Random(int(os.environ.get("XASINK_CRASH_SEED", random.randrange(2**32))))


@soak
@pytest.mark.spark
def test_soak_random_executor_and_worker_kills(
    cluster: StandaloneCluster, driver: ClusterDriver, pg_url: str, table: str, tally: Tally
) -> None:
    """Many batches, each with a kill of the executor JVM or a Python worker at a random point and partition."""
    rounds, rng = soak_plan(4)
    app: str = driver.app_id  # type: ignore[attr-defined]
    sink, want = new_sink(), []
    for batch in range(rounds):
        point = rng.choice(["task.before_load", "task.before_prepare", "task.after_prepare"])
        part, parts = rng.randrange(3), 3
        jvm = rng.random() < 0.5
        fault = f"{point}:{'stop' if jvm else 'kill'}:p={part}:a=0"
        fut = driver.submit(
            url=pg_url, table=table, password=SECRET, n=60, start=batch * 100, partitions=parts, sink_id=sink,
            batch_id=batch, fault=fault,
        )  # fmt: skip
        if jvm:
            wait_for(lambda f=fut: cluster.stopped_python_workers(app) or f.done(), RUN_TIMEOUT, "a stopped worker")
            cluster.kill_executor(app)
            tally.add(executor_jvm_kills=1)
        else:
            tally.add(python_worker_kills=1)
        assert ok(fut.result(RUN_TIMEOUT))["rows"] == 60
        want += expected(batch * 100, 60)
        check_exact(pg_url, table, want, tally, sink)


@soak
def test_soak_random_cuts_and_restarts_during_commit(
    proxy: TcpProxy, restartable: EmbeddedPostgres, pg_url: str, table: str, tally: Tally
) -> None:
    """Many batches, each committed through the proxy with a random cut, refusal, outage or server restart."""
    rounds, rng = soak_plan(20)
    sink, want = new_sink(), []
    writer = Writer(pg_url, table, sink)
    for batch in range(rounds):
        rows = expected(batch * 100, rng.randint(3, 40))
        outcomes = writer.batch(batch, split(rows, rng.randint(1, 4)))
        proxy.reset()
        kind = rng.choice(["reply-lost", "statement-lost", "refused", "outage", "restart"])
        if kind == "outage":
            proxy.cut_on(b"COMMIT PREPARED", times=1, after_reply=rng.random() < 0.5, then_down=True)
        elif kind == "refused":
            proxy.cut_on(b"COMMIT PREPARED", times=1, after_reply=False, then_refuse=rng.randint(1, 3))
        elif kind != "restart":
            proxy.cut_on(b"COMMIT PREPARED", times=rng.randint(1, 3), after_reply=kind == "reply-lost")
        dialect = RestartingDialect(restartable, writer.options.url, rng.randint(1, 3) if kind == "restart" else 0)
        if kind == "restart":
            coordinator = Coordinator(options(pg_url, table, sink, commitRetries=5), dialect=dialect)  # type: ignore[arg-type]
        else:
            coordinator = Coordinator(options(via(proxy, pg_url), table, sink, commitRetries=5))
        try:
            coordinator.commit(batch, outcomes)
        except CommitIncompleteError as exc:
            assert kind == "outage", exc
            assert_no_secret(exc)
            proxy.reset()
            recovery = Coordinator(options(via(proxy, pg_url), table, sink))
            recovery.recover()
            recovery.close()
        finally:
            coordinator.close()
        tally.add(cut_connections=proxy.cut, refused_connections=proxy.refused, db_restarts=dialect.restarts)
        proxy.cut = proxy.refused = 0
        want += rows
        check_exact(pg_url, table, want, tally, sink)
