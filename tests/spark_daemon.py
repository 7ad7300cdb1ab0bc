"""Spark's Python daemon for the tests' sessions (``spark.python.daemon.module``): PySpark's own daemon, after
importing the modules every forked worker imports again, so each fork has them already.

A run of the suite forks some 2,000 Python workers (a failed task's worker exits, an idle one is stopped
after a minute), and each spent about 0.65 s of CPU importing PySpark's worker and SQLAlchemy: most of the
suite's Python CPU on a 2-core machine.  PySpark imports after the fork on purpose, because a fork after
threads started can deadlock the child (pyarrow starts threads when imported), so only modules that start
none are imported here, and the daemon checks that it still has one thread; else it runs PySpark's daemon
as it is.  What runs in the workers is unchanged: the same modules, imported earlier.
"""

from __future__ import annotations

import os
import sys

THREAD_FREE = ("pyspark.worker", "psycopg2", "pymysql", "xasink", "xasink.dialects.postgres", "xasink.dialects.mysql")


def threads() -> int:
    return len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else 0


def main() -> None:
    import importlib

    import pyspark.daemon

    for name in THREAD_FREE:
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    if threads() != 1:  # never fork after threads: PySpark's daemon as it is, in a fresh interpreter
        os.execv(sys.executable, [sys.executable, "-m", "pyspark.daemon", *sys.argv[1:]])
    pyspark.daemon.manager()


if __name__ == "__main__":
    main()
