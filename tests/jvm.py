"""The tests' Spark sessions (:func:`local_spark`, the one builder: the test process's classic and Connect
sessions, and every test driver's), the JVM options of the Spark drivers the crash tests start and kill,
and the class-data archive they share.

Every killed driver is a fresh JVM (tests/crash_driver.py, stream_driver.py, modes_driver.py,
tx_crash_driver.py), and most of its time is the JVM loading and verifying Spark's classes.  So:

* ``FAST_START``: the C1 compiler alone and the serial collector, for a JVM doing little work (the drivers,
  and each worker's own session: tests run small jobs, and the C2 compiler's work never pays back);
* a dynamic class-data-sharing archive (``-XX:SharedArchiveFile``, JDK 13+): made once per test session
  by a warm-up driver run with ``-XX:ArchiveClassesAtExit`` (``python tests/jvm.py ARCHIVE WORKDIR``: a
  batch write and a complete-mode streaming aggregation into Spark's ``noop`` sink), then mapped by every
  driver, which loads those classes already parsed and verified.  The ``driver_cds`` fixture in
  tests/conftest.py makes it and puts its path in :data:`CDS_ENV`, which the drivers inherit.

The archive changes how classes are loaded, not what runs: a driver without it (no archive, or one the JVM
refuses, which it then ignores) does exactly the same, only slower.  docs/testing.md has the figures.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

CDS_ENV = "XASINK_TEST_CDS_ARCHIVE"
PRELOAD_ENV = "XASINK_TEST_PRELOAD"  # "0": Spark's own Python daemon, without tests/spark_daemon.py
FAST_START = ["-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC"]
ROOT = Path(__file__).resolve().parent.parent


def driver_java_options() -> str:
    """``spark.driver.extraJavaOptions`` for a test's Spark driver: FAST_START, and the archive if made."""
    options = list(FAST_START)
    archive = os.environ.get(CDS_ENV)
    if archive and os.path.isfile(archive):
        options.append(f"-XX:SharedArchiveFile={archive}")
    return " ".join(options)


def start_killable_driver() -> None:
    """What a test driver that a fault point may kill does first, before its JVM and Python workers start:
    its process group becomes the one a kill takes down (``XASINK_FAULT_PGID``), Spark's Python workers run
    on this interpreter, and xasink logs at INFO (anything else at WARNING) into the log the test reads."""
    os.environ["XASINK_FAULT_PGID"] = str(os.getpgid(0))
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("xasink").setLevel(logging.INFO)


def local_spark(
    app: str | None,
    *,
    master: str = "local[2]",
    remote: bool = False,
    java_options: str | None = None,
    conf: dict[str, str] | None = None,
    log_level: str | None = "ERROR",
) -> Any:
    """The local SparkSession of a test process or a test driver: on 127.0.0.1, without the UI, in UTC, with
    ``conf`` on top; ``java_options`` for the driver's JVM (a driver's: :func:`driver_java_options`).  One
    builder for them all; a session of this process already running is returned as it is (getOrCreate).
    ``remote``: a Spark Connect session on a local server started for it (``remote(master)``)."""
    from pyspark.sql import SparkSession

    settings = {
        "spark.ui.enabled": "false",
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.sql.session.timeZone": "UTC",
    }
    if java_options is not None:
        settings["spark.driver.extraJavaOptions"] = java_options
    if os.environ.get(PRELOAD_ENV, "1") != "0":  # tests/spark_daemon.py; the JVM inherits PYTHONPATH
        settings["spark.python.daemon.module"] = "tests.spark_daemon"
        path = os.environ.get("PYTHONPATH", "")
        if str(ROOT) not in path.split(os.pathsep):
            os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), path) if p)
    builder = SparkSession.builder.remote(master) if remote else SparkSession.builder.master(master)
    if app is not None:
        builder = builder.appName(app)
    for key, value in {**settings, **(conf or {})}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    if log_level is not None:
        spark.sparkContext.setLogLevel(log_level)
    return spark


# Spark Connect's local mode (``remote("local[2]")``, tests/test_connect.py) starts its server on a classic
# SparkContext in this process's JVM, and PySpark refuses it while a classic session runs (and the other way
# round: classic calls dispatch to Connect while it is on).  So the two take turns: asking for one stops the
# other, and the classic session is started again (the JVM stays up: about a second) when it was stopped.

_classic: list[Any] = []  # the classic session the ``spark`` fixture handed out, if it is still running


def classic_spark() -> Any:
    """The local classic SparkSession (2 cores; a failed task is retried, up to 3 attempts) with xasink registered."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable

    if _classic and _classic[0]._sc._jsc is not None:
        return _classic[0]
    stop_connect_spark()
    session = local_spark(
        "xasink-tests",
        master="local[2,3]",
        # C1 only and the serial collector: half the JVM's CPU over a module (21 -> 10 s for
        # test_spark_writer.py, the same wall time); the machine's two cores are the suite's limit
        java_options=" ".join(FAST_START),
        conf={"spark.sql.shuffle.partitions": "4"},
        log_level=None,
    )
    import xasink
    from xasink.spark.versions import HAS_DATA_SOURCE

    if HAS_DATA_SOURCE:  # format("xasink"); Spark 3.5 has xasink.write and foreach_batch only
        xasink.register(session)
    _classic[:] = [session]
    return session


def abandon_classic_spark() -> str:
    """After a test timed out inside a call into the JVM: the JVM's thread stacks and its Python processes
    (for the report), then the JVM killed and PySpark's globals cleared, so the next test starts a new one.

    pytest-timeout interrupts the test with an exception wherever it is; inside a py4j call that leaves the
    call's answer unread on the connection, and every later call of the session reads the answer of the one
    before (a CI run's 4.0 suite: one hung streaming test, then 21 failures with None for a JVM object and
    "PythonUtils does not exist in the JVM").  A new JVM costs seconds; a poisoned one costs the suite.
    """
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    from tests.cluster import descendants, proc_table, sigkill

    table = proc_table()
    proc = getattr(SparkContext._gateway, "proc", None)
    if proc is None:  # timed out while PySpark was launching it: the half-started JVM is a child of this process
        sigkill(p for p, (parent, _, cmd) in table.items() if parent == os.getpid() and "pyspark-shell" in cmd)
        return "(no JVM of this process yet: a launching one was killed)"
    try:
        dump = subprocess.run(
            ["jcmd", str(proc.pid), "Thread.print"], capture_output=True, text=True, timeout=60
        ).stdout
    except (OSError, subprocess.TimeoutExpired) as e:
        dump = f"(no thread dump: {e})"
    below = descendants(proc.pid, table)  # the JVM's Python daemon and workers
    listed = "\n".join(f"{p} {table[p][1]} {table[p][2][:200]}" for p in below)
    proc.kill()
    proc.wait()
    sigkill(below)
    SparkContext._gateway = None
    SparkContext._jvm = None
    SparkContext._active_spark_context = None
    SparkSession._instantiatedSession = None
    SparkSession._activeSession = None
    _classic.clear()
    for var in ("SPARK_CONNECT_MODE_ENABLED", "SPARK_LOCAL_REMOTE", "SPARK_REMOTE"):  # a Connect server died with it
        os.environ.pop(var, None)
    connect = sys.modules.get("pyspark.sql.connect.session")
    if connect is not None:  # its session, whose server was in that JVM, must not be handed out again
        connect.SparkSession._default_session = None
        connect.SparkSession._active_session.session = None
    return f"{dump}\n-- the JVM's processes (pid, state, command):\n{listed}"


def stop_classic_spark() -> None:
    """Stop the classic session (before a Connect session starts in this process)."""
    from pyspark.sql import SparkSession

    session = SparkSession._instantiatedSession
    if session is not None and session._sc._jsc is not None:
        session.stop()
    _classic.clear()


def stop_connect_spark() -> None:
    """Stop a local Spark Connect session of this process, if one runs (it stops its server too)."""
    if "SPARK_CONNECT_MODE_ENABLED" not in os.environ:
        return
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    session = ConnectSession.getActiveSession() or ConnectSession._default_session
    if session is not None:
        session.stop()
    for var in ("SPARK_CONNECT_MODE_ENABLED", "SPARK_LOCAL_REMOTE", "SPARK_REMOTE"):
        os.environ.pop(var, None)


def build_archive(archive: Path, workdir: Path, timeout_s: float = 600) -> str | None:
    """Run the warm-up driver to make ``archive``; None when made, else why not (the tests run without it)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("XASINK_FAULT") and k != CDS_ENV}
    env.update({"PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable})
    try:
        proc = subprocess.run(
            [sys.executable, __file__, str(archive), str(workdir)],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired:
        return f"the warm-up driver took over {timeout_s:.0f} s"
    if proc.returncode != 0 or not archive.is_file():
        return f"the warm-up driver exited {proc.returncode}: {(proc.stdout + proc.stderr)[-2000:]}"
    return None


def warm_up(archive: str, workdir: str) -> int:
    """A batch job and a streaming aggregation, then a normal exit: the JVM writes the classes it loaded."""

    java_options = " ".join([*FAST_START, f"-XX:ArchiveClassesAtExit={archive}"])
    spark = local_spark("xasink-cds-warm-up", java_options=java_options, conf={"spark.sql.shuffle.partitions": "2"})
    try:
        spark.range(0, 40, 1, 4).selectExpr("cast(id as int) as id", "concat('n', id) as name").write.format(
            "noop"
        ).mode("overwrite").save()
        src = Path(workdir) / "in"
        src.mkdir(parents=True, exist_ok=True)
        (src / "0.json").write_text('{"k": "a"}\n{"k": "b"}\n')
        counts = spark.readStream.schema("k string").option("maxFilesPerTrigger", 1).json(str(src)).groupBy("k").count()
        query = (
            counts.writeStream.outputMode("complete")
            .format("noop")
            .option("checkpointLocation", str(Path(workdir) / "chk"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(warm_up(sys.argv[1], sys.argv[2]))
