"""Spark's Python daemon for the tests' sessions (``spark.python.daemon.module``): PySpark's own daemon, after
importing the modules every forked worker imports again, so each fork has them already.

A run of the suite forks some 2,000 Python workers (a failed task's worker exits, an idle one is stopped
after a minute), and each spent about 0.65 s of CPU importing PySpark's worker, SQLAlchemy, pyarrow and
pandas (ADBC's DB-API imports pandas: 0.75 s of CPU alone): most of the suite's Python CPU on a 2-core
machine.  PySpark imports after the fork on purpose, because a fork after threads started can deadlock the
child.  Imported as they are, pyarrow and numpy start threads: jemalloc's background purger and OpenBLAS's
thread server.  Both are switched off here before the imports (``JE_ARROW_MALLOC_CONF``,
``OPENBLAS_NUM_THREADS``; the workers inherit them: jemalloc purges in the allocating thread, and no worker
does linear algebra), and the daemon checks that it still has one thread; else it runs PySpark's daemon as
it is, in a fresh interpreter.  What runs in the workers is unchanged: the same modules, imported earlier.
``XASINK_TEST_PRELOAD=base`` preloads only the modules that start no thread of their own (the daemon before
this change), for a side-by-side measurement.
"""

from __future__ import annotations

import os
import sys

THREAD_FREE = ("pyspark.worker", "psycopg2", "pymysql", "xasink", "xasink.dialects.postgres", "xasink.dialects.mysql")
# imported with the two thread switches below; every PostgreSQL branch imports ADBC's DB-API, every branch pyarrow
DATA = ("pyarrow", "pyarrow.compute", "pyarrow.csv", "pandas", "adbc_driver_postgresql.dbapi")
NO_THREADS = {"JE_ARROW_MALLOC_CONF": "background_thread:false", "OPENBLAS_NUM_THREADS": "1"}


def threads() -> int:
    return len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else 0


def main() -> None:
    import importlib

    import pyspark.daemon

    names: tuple[str, ...] = THREAD_FREE
    if os.environ.get("XASINK_TEST_PRELOAD", "1") != "base":
        for key, value in NO_THREADS.items():
            os.environ[key] = value
        names += DATA
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    if threads() != 1:  # never fork after threads: PySpark's daemon as it is, in a fresh interpreter
        os.execv(sys.executable, [sys.executable, "-m", "pyspark.daemon", *sys.argv[1:]])
    pyspark.daemon.manager()


if __name__ == "__main__":
    main()
