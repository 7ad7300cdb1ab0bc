"""Helpers for the fault tests: a Spark standalone cluster, a driver process it runs jobs for, and the tally.

* :class:`StandaloneCluster` starts a Master and one Worker (2 cores, so the long-lived driver's app and a
  driver a test kills can each hold one) from the pyspark installation as plain ``java`` processes in
  their own process groups, finds an application's executor JVM and kills it.
* :class:`ClusterDriver` runs this file as a subprocess: a SparkSession on the cluster that performs
  ``xasink.write`` jobs sent as JSON lines on stdin (each in its own thread, so two can race) and answers
  on stdout.  A test can kill it, or start one with ``XASINK_FAULT`` set: a driver-side fault point then
  SIGKILLs its whole process group (``XASINK_FAULT_PGID``), like a crashed driver machine.
* :class:`Tally` counts what the fault tests did (kills, restarts, cut connections, bad inputs, rows
  checked, lost, doubled, left prepared) and appends it to ``benchmarks/results/faults.json``.

Only the standard library is imported at module level: the driver subprocess imports pyspark itself.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterable, Iterator
from concurrent.futures import Future
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script (the cluster's driver): tests/ is on the path, not the repo
    sys.path.insert(0, str(ROOT))

from tests.jvm import FAST_START  # noqa: E402 - after the path above

RESULTS = ROOT / "benchmarks" / "results" / "faults.json"

JAVA_MODULE_OPTIONS = [
    "-XX:+IgnoreUnrecognizedVMOptions",
    *(
        f"--add-opens={m}=ALL-UNNAMED"
        for m in (
            "java.base/java.lang",
            "java.base/java.lang.invoke",
            "java.base/java.lang.reflect",
            "java.base/java.io",
            "java.base/java.net",
            "java.base/java.nio",
            "java.base/java.util",
            "java.base/java.util.concurrent",
            "java.base/java.util.concurrent.atomic",
            "java.base/jdk.internal.ref",
            "java.base/sun.nio.ch",
            "java.base/sun.nio.cs",
            "java.base/sun.security.action",
            "java.base/sun.util.calendar",
        )
    ),
    "-Dio.netty.tryReflectionSetAccessible=true",
]


# ------------------------------------------------------------------------------------------- processes


def proc_table() -> dict[int, tuple[int, str, str]]:
    """pid -> (parent pid, state letter, command line) of every process we can see."""
    table: dict[int, tuple[int, str, str]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        rest = stat[stat.rfind(")") + 2 :].split()  # the command name in parentheses may hold spaces
        table[int(entry.name)] = (int(rest[1]), rest[0], cmd)
    return table


def descendants(pid: int, table: dict[int, tuple[int, str, str]] | None = None) -> list[int]:
    table = table if table is not None else proc_table()
    children: dict[int, list[int]] = {}
    for child, (parent, _, _) in table.items():
        children.setdefault(parent, []).append(child)
    out: list[int] = []
    todo = list(children.get(pid, []))
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


def sigkill(pids: Iterable[int]) -> int:
    n = 0
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
            n += 1
    return n


def wait_gone(pids: Iterable[int], timeout: float = 30.0) -> None:
    pending = set(pids)
    deadline = time.monotonic() + timeout
    while pending and time.monotonic() < deadline:
        table = proc_table()
        pending = {p for p in pending if p in table and table[p][1] != "Z"}
        if pending:
            time.sleep(0.05)


def wait_for(predicate: Any, timeout: float, what: str, interval: float = 0.05) -> Any:
    """Poll until ``predicate()`` is truthy; raise with ``what`` after ``timeout`` seconds (a hang, not a timing)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"gave up after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL it when the test process dies, so a killed test run leaks no cluster."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def spark_home() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("pyspark")
    assert spec is not None and spec.origin is not None, "pyspark is not installed"
    return Path(spec.origin).parent


# ------------------------------------------------------------------------------------------- the cluster


class StandaloneCluster:
    """A Spark standalone Master and one Worker on 127.0.0.1, as subprocesses in their own process groups."""

    def __init__(self, cores: int = 2, memory: str = "2g") -> None:
        self.home = spark_home()
        self.dir = Path(tempfile.mkdtemp(prefix="xasink-cluster-"))
        self.port = free_port()
        self.master_url = f"spark://127.0.0.1:{self.port}"
        self.cores = cores
        self.memory = memory
        self.master: subprocess.Popen[bytes] | None = None
        self.worker: subprocess.Popen[bytes] | None = None
        self.extra_workers: list[subprocess.Popen[bytes]] = []
        self.executor_kills = 0

    def _java(self, log: Path, cls: str, *args: str, host: str = "127.0.0.1") -> subprocess.Popen[bytes]:
        java = shutil.which("java", path=os.path.join(os.environ.get("JAVA_HOME", ""), "bin")) or "java"
        cmd = [java, "-Xmx256m", *FAST_START, *JAVA_MODULE_OPTIONS, "-cp", f"{self.home}/jars/*", cls, *args]
        env = {
            **os.environ,
            "SPARK_HOME": str(self.home),
            "SPARK_SCALA_VERSION": "2.13",  # the launcher looks for build directories without it
            "SPARK_LOCAL_IP": host,
        }
        env.pop("XASINK_FAULT", None)
        with open(log, "wb") as out:
            return subprocess.Popen(
                cmd,
                cwd=self.dir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                start_new_session=True,
                preexec_fn=_die_with_parent,  # Popen runs in the main thread only
            )

    def log(self, name: str) -> str:
        path = self.dir / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def start(self, timeout: float = 180.0) -> StandaloneCluster:
        self.master = self._java(
            self.dir / "master.log",
            "org.apache.spark.deploy.master.Master",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--webui-port",
            "0",
        )
        try:
            wait_for(
                lambda: "I have been elected leader" in self.log("master") or self.master.poll() is not None,
                timeout,
                "the Spark master",
            )  # type: ignore[union-attr]
            if self.master.poll() is not None:
                raise RuntimeError(f"the Spark master exited:\n{self.log('master')[-3000:]}")
            self.worker = self._worker("worker", self.dir / "work", "127.0.0.1", self.cores)
            self._registered(self.worker, "worker", "the Spark worker", timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def add_worker(self, host: str, cores: int = 1, timeout: float = 180.0) -> None:
        """Another Worker on another loopback address (127.0.0.2, ...): Spark sees a second host.

        Spark never launches a speculative copy on a host that runs an attempt of the same task, so a
        speculation test needs two hosts; Linux routes all of 127/8 to the loopback device.
        """
        name = f"worker-{host}"
        proc = self._worker(name, self.dir / f"work-{host}", host, cores)
        self.extra_workers.append(proc)
        self._registered(proc, name, f"the Spark worker on {host}", timeout)

    def _worker(self, name: str, work: Path, host: str, cores: int) -> subprocess.Popen[bytes]:
        """A Worker JVM on ``host`` for this cluster's master, its log ``<name>.log``, its work directory ``work``."""
        work.mkdir()
        return self._java(
            self.dir / f"{name}.log",
            "org.apache.spark.deploy.worker.Worker",
            self.master_url,
            "--host",
            host,
            "--cores",
            str(cores),
            "--memory",
            self.memory,
            "--webui-port",
            "0",
            "--work-dir",
            str(work),
            host=host,
        )

    def _registered(self, proc: subprocess.Popen[bytes], name: str, what: str, timeout: float) -> None:
        """Wait for the worker ``proc`` (its log ``<name>.log``) to register with the master; fail if it exits."""
        wait_for(
            lambda: "Successfully registered with master" in self.log(name) or proc.poll() is not None,
            timeout,
            f"{what} to register",
        )
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited:\n{self.log(name)[-3000:]}")

    def stop(self) -> None:
        table = proc_table()
        doomed: list[int] = []
        for proc in (*self.extra_workers, self.worker, self.master):
            if proc is not None and proc.poll() is None:
                doomed += [proc.pid, *descendants(proc.pid, table)]
        sigkill(doomed)
        for proc in (*self.extra_workers, self.worker, self.master):
            if proc is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=30)
        wait_gone(doomed)
        shutil.rmtree(self.dir, ignore_errors=True)

    # -- executors --------------------------------------------------------------------------
    def executors(self, app_id: str) -> list[int]:
        """Pids of the live executor JVMs of an application (children of our Worker)."""
        assert self.worker is not None
        table = proc_table()
        return [
            p
            for p in descendants(self.worker.pid, table)
            if "CoarseGrainedExecutorBackend" in table[p][2] and app_id in table[p][2] and table[p][1] != "Z"
        ]

    def stopped_python_workers(self, app_id: str) -> list[int]:
        """Python processes under the app's executors held by a ``stop`` fault point (state T)."""
        table = proc_table()
        return [
            p
            for e in self.executors(app_id)
            for p in descendants(e, table)
            if table[p][1] == "T" and "python" in table[p][2]
        ]

    def kill_executor(self, app_id: str) -> int:
        """SIGKILL the app's executor JVM (and then the Python processes it started); returns the JVM's pid."""
        (pid,) = self.executors(app_id)
        table = proc_table()
        below = descendants(pid, table)
        os.kill(pid, signal.SIGKILL)  # first the JVM: that is the crash under test
        sigkill(below)  # then its Python daemon and workers, which would linger when a stop point holds one
        wait_gone([pid, *below])
        self.executor_kills += 1
        return pid


# ------------------------------------------------------------------------------------------- the driver


class DriverError(RuntimeError):
    """The driver process died or answered nonsense."""


class ClusterDriver:
    """A SparkSession on the cluster in a subprocess, running xasink writes sent as JSON requests."""

    def __init__(self, master_url: str, log: Path, env: dict[str, str] | None = None) -> None:
        self.log_path = log
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("XASINK_FAULT")}
        full_env.update({"PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable, **(env or {})})
        self._log = open(log, "wb")  # noqa: SIM115 - kept open for the process's life
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--master", master_url],
            cwd=ROOT,
            env=full_env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        self._pending: dict[str, Future[dict[str, Any]]] = {}
        self._lock = threading.Lock()
        self._ready: Future[dict[str, Any]] = Future()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if msg.get("id") == "ready":
                self._ready.set_result(msg)
                continue
            with self._lock:
                fut = self._pending.pop(msg.get("id"), None)
            if fut is not None:
                fut.set_result(msg)
        self.proc.stdout.close()
        err = DriverError(f"the driver exited (code {self.proc.wait()}); log {self.log_path}")
        with self._lock:
            pending, self._pending = list(self._pending.values()), {}
        for fut in [self._ready, *pending]:
            if not fut.done():
                fut.set_exception(err)

    def wait_ready(self, timeout: float = 300.0) -> str:
        """Block until the SparkSession is up; returns the application id."""
        return str(self._ready.result(timeout)["app_id"])

    def submit(self, **request: Any) -> Future[dict[str, Any]]:
        """Send a write request; the future resolves to {"ok": bool, ...} (see :func:`_serve`)."""
        rid = uuid.uuid4().hex
        fut: Future[dict[str, Any]] = Future()
        with self._lock:
            self._pending[rid] = fut
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write((json.dumps({"id": rid, **request}) + "\n").encode())
            self.proc.stdin.flush()
        except OSError as exc:
            with self._lock:
                self._pending.pop(rid, None)
            fut.set_exception(DriverError(f"the driver is gone: {exc}"))
        return fut

    def write(self, timeout: float = 300.0, **request: Any) -> dict[str, Any]:
        return self.submit(**request).result(timeout)

    def log(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")

    def wait(self, timeout: float = 300.0) -> int:
        return self.proc.wait(timeout)

    def stop(self) -> None:
        """End the driver: close its stdin (it stops Spark and exits), then make sure its group is gone."""
        with contextlib.suppress(OSError):
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pass
        table = proc_table()
        group = [p for p in table if _pgid(p) == self.proc.pid]
        sigkill([self.proc.pid, *group])
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=30)
        wait_gone(group)
        self._log.close()


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def _serve(master: str) -> None:
    """The driver process: a SparkSession on ``master``; one JSON request per stdin line, each in a thread.

    Request: url, table, n, start, partitions, sink_id, batch_id, options, path ("api" | "format"),
    fault (the task fault spec, a Spark local property).  Answer: {"id", "ok", "rows", "branches",
    "skipped"} or {"id", "ok": false, "type", "message"}.
    """
    protocol = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # anything else printed (Spark, Py4J) goes to the log, not into the protocol
    if os.environ.get("XASINK_FAULT"):
        os.environ["XASINK_FAULT_PGID"] = str(os.getpgid(0))  # a driver fault point takes the driver down
    from pyspark.sql import SparkSession

    import xasink
    from xasink.support.faults import LOCAL_PROPERTY

    builder = (
        SparkSession.builder.master(master)
        .appName(f"xasink-faults-{os.getpid()}")
        .config("spark.cores.max", "1")
        .config("spark.executor.cores", "1")
        .config("spark.executor.memory", "512m")
        .config("spark.driver.memory", "512m")
        .config("spark.pyspark.python", sys.executable)
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.task.maxFailures", "4")
        .config("spark.driver.extraJavaOptions", " ".join(FAST_START))
        .config("spark.executor.extraJavaOptions", " ".join(FAST_START))
    )
    for key, value in json.loads(os.environ.get("XASINK_TEST_SPARK_CONF", "{}")).items():
        builder = builder.config(key, str(value))  # a test's own settings (speculation), over the defaults
    spark = builder.getOrCreate()
    from xasink.spark.versions import HAS_DATA_SOURCE

    if HAS_DATA_SOURCE:  # format("xasink"): Spark 4.0+; xasink.write needs no registration
        xasink.register(spark)
    out_lock = threading.Lock()

    def answer(msg: dict[str, Any]) -> None:
        with out_lock:
            protocol.write(json.dumps(msg, default=str) + "\n")

    def handle(req: dict[str, Any]) -> None:
        rid = req["id"]
        sc = spark.sparkContext
        try:
            sc.setLocalProperty(LOCAL_PROPERTY, req.get("fault"))  # type: ignore[arg-type]
            start, n, parts = int(req.get("start", 0)), int(req["n"]), int(req.get("partitions", 3))
            df = spark.range(start, start + n, 1, parts).selectExpr(
                "cast(id as int) as id", f"concat('{req.get('label', 'n')}', id) as name"
            )
            opts = {"password": req.get("password"), **req.get("options", {})}
            opts = {k: v for k, v in opts.items() if v is not None}
            if req.get("path", "api") == "api":
                result = xasink.write(
                    df, req["url"], req["table"], sink_id=req.get("sink_id"), batch_id=req.get("batch_id"), **opts
                )
                answer(
                    {"id": rid, "ok": True, "rows": result.rows, "branches": result.branches, "skipped": result.skipped}
                )
            else:
                w = df.write.format("xasink").option("url", req["url"]).option("dbtable", req["table"])
                for key, value in {"sinkId": req.get("sink_id"), "batchId": req.get("batch_id"), **opts}.items():
                    if value is not None:
                        w = w.option(key, str(value))
                w.mode("append").save()
                answer({"id": rid, "ok": True})
        except Exception as exc:  # noqa: BLE001 - everything goes back to the test
            cause = "\n".join(str(e) for e in (exc.__cause__, exc.__context__) if e is not None)
            answer({"id": rid, "ok": False, "type": type(exc).__name__, "message": str(exc), "cause": cause[:50000]})
        finally:
            sc.setLocalProperty(LOCAL_PROPERTY, None)  # type: ignore[arg-type]

    answer({"id": "ready", "app_id": spark.sparkContext.applicationId})
    threads = []
    for line in sys.stdin:
        if line.strip():
            t = threading.Thread(target=handle, args=(json.loads(line),), daemon=True)
            t.start()
            threads.append(t)
    for t in threads:
        t.join()
    spark.stop()


# ------------------------------------------------------------------------------------------- checks


def host_port(url: str) -> tuple[str, int]:
    m = re.search(r"@([^:/@]+):(\d+)/", url)
    assert m, "no @host:port/ in the URL"  # not the URL itself: it holds the password
    return m.group(1), int(m.group(2))


# ------------------------------------------------------------------------------------------- the tally

KEYS = (
    "executor_jvm_kills",
    "python_worker_kills",
    "driver_kills",
    "db_restarts",
    "cut_connections",
    "refused_connections",
    "bad_inputs",
    "hostile_names",
    "concurrent_writer_races",
    "oltp_transactions",
    "property_steps",
    "batches_checked",
    "rows_checked",
    "rows_lost",
    "rows_doubled",
    "rows_unexpected",
    "left_prepared",
)


class Tally:
    """What one test module did and found; :meth:`save` merges it into benchmarks/results/faults.json."""

    def __init__(self, module: str) -> None:
        self.module = module
        self.counts: Counter[str] = Counter({k: 0 for k in KEYS})

    def add(self, **counts: int) -> None:
        for key, value in counts.items():
            assert key in KEYS, key
            self.counts[key] += value

    def rows(self, found: Iterable[Any], expected: Iterable[Any]) -> None:
        """Count lost, doubled and unexpected rows of one check (the caller asserts the exact set)."""
        have, want = Counter(found), Counter(expected)
        self.add(
            batches_checked=1,
            rows_checked=sum(want.values()),
            rows_lost=sum((want - have).values()),
            rows_doubled=sum(c - 1 for r, c in have.items() if c > 1 and r in want),
            rows_unexpected=sum(c for r, c in have.items() if r not in want),
        )

    def save(self, path: Path = RESULTS, keep: int = 500) -> dict[str, Any]:
        """Append this module's run (when it did anything) and recompute the totals over the recorded runs."""
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            data = {}
        runs = data.get("runs", [])
        if any(self.counts.values()):
            runs = [*runs, {"module": self.module, "run_at": _now(), **{k: self.counts[k] for k in KEYS}}][-keep:]
        data = {
            "about": "xasink fault tests: what each test-module run did to xasink and what it left; totals over runs",
            "totals": {k: sum(int(r.get(k, 0)) for r in runs) for k in KEYS},
            "runs": runs,
        }
        path.write_text(json.dumps(data, indent=1) + "\n")
        return data


def tally_fixture(module: str) -> Any:
    """A module-scoped ``tally`` fixture that records the module's counts in faults.json when it ends."""

    @pytest.fixture(scope="module", name="tally")
    def tally() -> Iterator[Tally]:
        t = Tally(module)
        yield t
        data = t.save()
        print(f"\nfault totals (benchmarks/results/faults.json): {json.dumps(data['totals'])}")

    return tally


def _now() -> str:
    return datetime.now(timezone.utc).replace(microsecond=0).isoformat()


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--master", required=True)
    _serve(parser.parse_args().master)
