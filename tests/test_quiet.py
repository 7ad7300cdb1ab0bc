"""Quiet by default: a clean run prints no warning into the user's output, from xasink or its libraries.

tests/quiet_driver.py runs a batch write (``format("xasink")`` and ``xasink.write``) and two micro-batches
(the streaming source and ``foreach_batch``) in a Spark driver of its own, with every Python warning shown
(``-W default``, and ``PYTHONWARNINGS=default``, which the Python workers inherit).  The workers' stderr is
the driver's, as in a user's terminal, so a warning raised in a task (a branch's late check) shows there
as well as one raised in the driver.  Any line naming a warning fails the test, but for the
ResourceWarnings of PySpark's own worker daemon (:data:`EXPECTED`), which only ``-W default`` shows.
On MariaDB every task's late check printed SQLAlchemy's ``SAWarning: SELECT statement has a cartesian
product`` (journal.py's ``settle_view``) until it read the claim by scalar subqueries.
"""

from __future__ import annotations

import gc
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from tests.crash_driver import direct
from tests.targets import Target

ROOT = Path(__file__).resolve().parent.parent
DRIVER = ROOT / "tests" / "quiet_driver.py"
ROWS = 40  # tests/quiet_driver.py's ROWS
# Python's warning line: "<file>:<line>: <Category>Warning: <message>", as -W default prints it
WARNING_LINE = re.compile(r"\b\w*Warning\b")
# What PySpark 4.3's own worker daemon leaves unclosed, shown only because the test turns ResourceWarning on
# (Python ignores it by default): the socket files of each forked worker (pyspark/daemon.py ``worker``),
# and at the daemon's exit its stdin/stdout files and its listening socket (one with no peer).  No xasink
# frame is involved; an unclosed connection of xasink's names its own file, or has a peer (raddr).
EXPECTED = re.compile(
    r"pyspark/daemon\.py:\d+: ResourceWarning: unclosed file"
    r"|^sys:1: ResourceWarning: unclosed file <_io\.Buffered(Reader|Writer) name=[01]>"
    r"|^sys:1: ResourceWarning: unclosed <socket\.socket [^>]*laddr=\('[^']*', \d+\)>$"
    r"|^ResourceWarning: Enable tracemalloc to get the object allocation traceback$"
    # the test cluster runs with fsync off on purpose: xasink rightly warns about it (checked in
    # tests/test_user_warnings.py); a durable server, as users run, prints none of these
    r"|XasinkWarning: PostgreSQL at [^ ]+ has (fsync|full_page_writes) = off: "
)


@pytest.mark.spark
@pytest.mark.usefixtures("driver_cds")  # its driver maps the crash drivers' class-data archive (tests/jvm.py)
def test_a_clean_run_prints_no_warning(db: Target, tmp_path: Path) -> None:
    """A batch and a micro-batch of each writer, exact rows; stderr names no warning but PySpark's own."""
    tables = [db.new_table() for _ in range(4)]  # batch save, xasink.write, stream source, foreach_batch
    for table in tables:
        db.keyed_table(table)
    env = {k: v for k, v in os.environ.items() if not k.startswith("XASINK_FAULT")}
    env.update({"PYTHONWARNINGS": "default", "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable})
    proc = subprocess.run(
        [sys.executable, "-W", "default", str(DRIVER), db.url, str(tmp_path), *tables],
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    expected = [(i, f"n{i}") for i in range(ROWS)]
    for table in tables:
        assert db.rows(table) == expected, table
    shown = [line for line in proc.stderr.splitlines() if WARNING_LINE.search(line) and not EXPECTED.search(line)]
    assert shown == [], "\n".join(shown) + "\n--- stderr ---\n" + proc.stderr[-4000:]


def test_a_spark_free_write_warns_nothing(db: Target) -> None:
    """The same check in this process, in seconds: a batch's tasks and its driver side, each warning recorded."""
    table = db.new_table()
    db.keyed_table(table)
    gc.collect()  # what earlier tests in this worker left (a driver's pipe) is finalized before the recording
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert direct(db.url, table, f"quiet-{table}", 1, ROWS, 2) == 0
    assert db.rows(table) == [(i, f"n{i}") for i in range(ROWS)]
    assert [f"{w.filename}:{w.lineno}: {w.category.__name__}: {w.message}" for w in caught] == []
