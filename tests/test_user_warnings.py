"""What a user must know reaches the user: a plain PySpark script's standard error, and ``WriteResult``.

The data source's planning, tasks and commit run in Spark's Python workers, where no logging is set up and
nobody reads a log; a durability risk of the server (the private PostgreSQL runs with fsync = off), a fault
point's warning in a task or in the commit, must still reach the script's standard error, and
``xasink.write`` returns them in ``WriteResult.warnings`` (xasink/support/notices.py).  The script's standard
error also shows one INFO line per batch of ``format("xasink")`` (sink, batch, rows, branches, timings, or
"skipped"), and each partition's rows loaded so far (``XASINK_PROGRESS_S``); a warning names the user's line.
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import tempfile
import time
import uuid
import venv
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from sqlalchemy.engine import make_url

import xasink
from tests.doc_cases import warns
from tests.harness import expected, frame
from tests.procs import run_until_exit, tail
from tests.targets import Target
from xasink.errors import XasinkWarning

pytestmark = [pytest.mark.spark, pytest.mark.usefixtures("driver_cds")]

DRIVER = Path(__file__).resolve().parent / "plain_driver.py"
BARE_DRIVER = Path(__file__).resolve().parent / "bare_python_driver.py"
FAULTS = "task.before_load:sleep=0:p=0,driver.after_mark:sleep=0"


def test_a_plain_script_is_told_of_durability_risks_and_warnings_of_workers(pg: Target, tmp_path: Path) -> None:
    if pg.execute("SELECT current_setting('fsync')") != [("off",)]:
        pytest.skip("needs a server with fsync = off (the embedded one)")
    by_format, by_write = pg.new_table(), pg.new_table()
    for name in (by_format, by_write):
        pg.keyed_table(name)
    out, err = tmp_path / "stdout.log", tmp_path / "stderr.log"
    sink = f"plain-{uuid.uuid4().hex[:8]}"
    # progress after every Arrow batch: a line per batch a partition loads (the default is one every 30 s)
    env = {**os.environ, "XASINK_FAULT": FAULTS, "PYSPARK_PYTHON": sys.executable, "XASINK_PROGRESS_S": "0"}
    code = run_until_exit([sys.executable, str(DRIVER), pg.url, by_format, by_write, sink], env, out, stderr=err)
    stdout, stderr = out.read_text(errors="replace"), err.read_text(errors="replace")
    before, _, after = stdout.partition("FORMAT DONE")

    # df.write.format("xasink"): the driver-side workers' warnings, and the tasks' (carried by their messages)
    lines = stderr.splitlines()
    logged = [line for line in lines if " WARNING xasink" in line]
    assert any("fsync = off" in line and "rows can be lost" in line for line in logged), stderr[-4000:]
    assert any("fault point driver.after_mark reached" in line for line in logged), stderr[-4000:]
    assert any("partition 0: fault point task.before_load reached" in line for line in logged), stderr[-4000:]

    assert code == 0, tail(out) + tail(err)
    # xasink.write: the same, in its result and as Python warnings in the user's process
    (found,) = [line for line in after.splitlines() if line.startswith("WARNINGS ")]
    warnings = json.loads(found.removeprefix("WARNINGS "))
    assert any("fsync = off" in w for w in warnings), warnings
    assert "fault point driver.after_mark reached: sleep=0.0" in warnings
    assert "partition 0: fault point task.before_load reached: sleep=0.0" in warnings
    assert not any("partition 1" in w for w in warnings), warnings
    shown = [line for line in lines if "XasinkWarning: " in line]
    assert any("fsync = off" in line for line in shown) and any("driver.after_mark" in line for line in shown)
    # each names the user's own line (the script's call of xasink.write), not xasink's
    assert all(line.startswith(f"{DRIVER}:") for line in shown), shown

    # format("xasink"): one INFO line per batch in the driver, the rerun's too
    info = [line for line in lines if " INFO xasink" in line and f"sink {sink} batch 1:" in line]
    assert len(info) == 2, info
    written = re.search(
        r"committed 10 rows in 2 branches \(prepare ([0-9.]+)s, decide ([0-9.]+)s, commit ([0-9.]+)s, "
        r"mark ([0-9.]+)s, sweep ([0-9.]+)s, total ([0-9.]+)s\)",
        info[0],
    )
    assert written, info[0]
    # one consistent set: the total (from planning to the end of the commit) holds every part
    *parts, total = (float(x) for x in written.groups())
    assert total >= sum(parts) - 0.005, info[0]
    again = re.search(
        r"skipped, nothing written \(committed earlier at \S+ UTC by run [0-9a-f]{8}: 10 rows in 2 branches, "
        r"prepare ([0-9.]+)s, commit ([0-9.]+)s\) \(total ([0-9.]+)s\)",
        info[1],
    )
    assert again, info[1]
    # the earlier run's figures as that run's own line gave them
    assert (again.group(1), again.group(2)) == (written.group(1), written.group(3)), info
    # xasink.write's result: the same figures, its total the whole call's
    (found,) = [line for line in after.splitlines() if line.startswith("TIMINGS ")]
    timings = json.loads(found.removeprefix("TIMINGS "))
    assert list(timings) == ["prepare", "decide", "commit", "mark", "sweep", "total"], timings
    assert timings["total"] >= sum(v for k, v in timings.items() if k != "total"), timings
    # progress: each partition's rows loaded so far (5 rows in one Arrow batch each), and its total
    progress = [line for line in lines if f"sink {sink} batch 1 partition " in line]
    assert sorted(
        re.sub(r".*(partition \d): (\d+) rows (loaded so far|loaded in).*", r"\1 \2 \3", ln) for ln in progress
    ) == [
        "partition 0 5 loaded in",
        "partition 0 5 loaded so far",
        "partition 1 5 loaded in",
        "partition 1 5 loaded so far",
    ], progress
    secret = make_url(pg.url).password
    assert not secret or str(secret) not in stdout + stderr

    expected = [(i, f"n{i}") for i in range(10)]
    assert pg.rows(by_format) == expected and pg.rows(by_write) == expected
    assert "WARNINGS" not in before


@pytest.mark.doc_case("error/XasinkWarning")
def test_a_warning_names_the_line_that_called_xasink(
    spark: SparkSession, pg: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In a process that set no logging up, ``xasink.write``'s warnings are Python warnings whose place is the
    caller's line (what ``python -W error`` or a filter by module acts on), not xasink's own."""
    # py4j logs a resent command with the module-level logging.info(), whose implicit basicConfig() sets up
    # logging when the root logger has no handler (under a loaded CI: the warnings went to that handler)
    monkeypatch.setattr(logging, "basicConfig", lambda *args, **kwargs: None)
    if pg.execute("SELECT current_setting('fsync')") != [("off",)]:
        pytest.skip("needs a server with fsync = off (the embedded one)")
    table = pg.new_table()
    pg.keyed_table(table)
    loggers = [logging.getLogger(), logging.getLogger("xasink")]
    saved = {lg.name: lg.handlers[:] for lg in loggers}
    for lg in loggers:  # as a plain script: no handler anywhere (pytest's own are put back below)
        for handler in saved[lg.name]:
            lg.removeHandler(handler)
    try:
        with warns(XasinkWarning, match="fsync = off") as caught:
            xasink.write(frame(spark, range(4), 2), pg.url, table, password=pg.password)
    finally:
        for lg in loggers:
            for handler in saved[lg.name]:
                lg.addHandler(handler)
    assert caught and {w.filename for w in caught} == {__file__}, [(w.filename, w.lineno) for w in caught]
    assert pg.rows(table) == expected(range(4))


def test_workers_running_a_python_without_xasink_are_told_to_set_pyspark_python(pg: Target, tmp_path: Path) -> None:
    """Spark's Python workers run PYSPARK_PYTHON (by default "python3"), not the driver's Python: without xasink's
    packages there, every write failed with BatchAbortedError ("the Spark job failed (ModuleNotFoundError: No
    module named 'sqlalchemy')"), a "run it again" that never succeeds, or Spark's AnalysisException.  Both APIs
    now raise a PreflightError naming PYSPARK_PYTHON; nothing is written."""
    bare = tmp_path / "bare"
    venv.create(bare, with_pip=False)  # this Python's version, none of its packages
    table = pg.new_table()
    out = tmp_path / "stdout.log"
    env = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_PYTHON", "PYTHONPATH")}
    code = run_until_exit([sys.executable, str(BARE_DRIVER), pg.url, table, str(bare / "bin" / "python")], env, out)
    text = out.read_text(errors="replace")
    raised = [json.loads(line.removeprefix("RAISED ")) for line in text.splitlines() if line.startswith("RAISED ")]
    assert code == 0 and [r[0] for r in raised] == ["write", "format"], tail(out)
    for how, name, message in raised:
        assert name == "PreflightError" and "PYSPARK_PYTHON" in message and "No module named" in message, (how, message)
    assert not pg.table_exists(table) or pg.rows(table) == []


def test_notices_files_of_killed_drivers_are_removed_by_the_next_write(spark: SparkSession, pg: Target) -> None:
    """Each xasink.write hands its workers' warnings over through a file in the temporary folder, removed at its
    end; a driver killed with SIGKILL never removes it, so they piled up in /tmp.  A write now
    removes this user's files whose process is gone and that are an hour old; a live process's (another
    driver's) and a fresh one stay, and the write leaves none of its own."""
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = int(gone.stdout)
    folder = Path(tempfile.gettempdir())
    tag = uuid.uuid4().hex[:8]
    orphan = folder / f"xasink-notices-{dead}-{tag}.jsonl"
    figures = folder / f"xasink-notices-{dead}-{tag}.jsonl.figures"
    young = folder / f"xasink-notices-{dead}-{tag}y.jsonl"  # its process gone a moment ago: kept for now
    live = folder / f"xasink-notices-{os.getpid()}-{tag}.jsonl"  # a live driver's, however old
    for path in (orphan, figures, young, live):
        path.write_text('"a warning"\n')
    hours_ago = time.time() - 2 * 3600
    for path in (orphan, figures, live):
        os.utime(path, (hours_ago, hours_ago))
    try:
        table = pg.new_table()
        pg.keyed_table(table)
        xasink.write(frame(spark, range(3), 1), pg.url, table, password=pg.password)
        assert pg.rows(table) == expected(range(3))
        assert not orphan.exists() and not figures.exists()
        assert young.exists() and live.exists()
        own = [p.name for p in folder.glob(f"xasink-notices-{os.getpid()}-*") if p != live]
        assert own == [], own  # the write's own file is removed at its end
    finally:
        for path in (orphan, figures, young, live):
            path.unlink(missing_ok=True)
