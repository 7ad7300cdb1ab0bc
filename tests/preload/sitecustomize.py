"""Preloads for Spark's Python daemons in the tests (tests/jvm.py puts this folder on their ``PYTHONPATH``).

Python imports ``sitecustomize`` at the start of every interpreter.  In a ``python -m pyspark.daemon
<worker module>`` process, the daemon Spark forks each Python worker from, it imports first what every fork
would import again: the worker module (PySpark's task worker, or a data source planner's: lookup, create,
write, commit), psycopg2, PyMySQL and xasink's Spark adapter and dialects (SQLAlchemy with them).  Spark names
no daemon of ours for the planners (``spark.python.daemon.module`` is for task workers only), so this hook is
the one way into both.

PySpark imports after the fork on purpose: a fork after threads started can deadlock the child, and pyarrow
starts threads when imported.  So only modules that start none are imported, and the daemon checks in
``/proc/self/task`` that it still has one thread; else it starts again without the preload.  What runs in the
workers is unchanged: the same modules, imported earlier.  ``XASINK_TEST_PRELOAD=0`` turns it off.
"""

from __future__ import annotations

import importlib
import os
import sys

OFF = "XASINK_TEST_PRELOAD"
THREAD_FREE = ("psycopg2", "pymysql", "xasink.spark.datasource", "xasink.dialects.postgres", "xasink.dialects.mysql")


def daemon_worker_module(argv: list[str]) -> str | None:
    """The worker module of a ``-m pyspark.daemon`` command line (PySpark's task worker when it names none);
    None for any other process."""
    try:
        at = argv.index("-m")
    except ValueError:
        return None
    if argv[at + 1 : at + 2] != ["pyspark.daemon"]:
        return None
    return argv[at + 2] if len(argv) > at + 2 else "pyspark.worker"


def threads() -> int:
    return len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else 0


def preload() -> None:
    module = daemon_worker_module(list(getattr(sys, "orig_argv", [])))
    if module is None or os.environ.get(OFF, "1") == "0":
        return
    for name in (module, *THREAD_FREE):
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001,S110 - the fork imports it again and says what is wrong
            pass
    if threads() != 1:  # never fork after threads: PySpark's daemon as it is, in a fresh interpreter
        os.environ[OFF] = "0"
        os.execv(sys.executable, sys.orig_argv)


preload()
