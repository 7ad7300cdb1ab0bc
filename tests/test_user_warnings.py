"""What a user must know reaches the user: a plain PySpark script's standard error, and ``WriteResult``.

The data source's planning, tasks and commit run in Spark's Python workers, where no logging is set up and
nobody reads a log; a durability risk of the server (the private PostgreSQL runs with fsync = off), a fault
point's warning in a task or in the commit, must still reach the script's standard error, and
``xasink.write`` returns them in ``WriteResult.warnings`` (xasink/support/notices.py).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from tests.procs import run_until_exit, tail
from tests.targets import Target

pytestmark = [pytest.mark.spark, pytest.mark.usefixtures("driver_cds")]

DRIVER = Path(__file__).resolve().parent / "plain_driver.py"
FAULTS = "task.before_load:sleep=0:p=0,driver.after_mark:sleep=0"


def test_a_plain_script_is_told_of_durability_risks_and_warnings_of_workers(pg: Target, tmp_path: Path) -> None:
    if pg.execute("SELECT current_setting('fsync')") != [("off",)]:
        pytest.skip("needs a server with fsync = off (the embedded one)")
    by_format, by_write = pg.new_table(), pg.new_table()
    for name in (by_format, by_write):
        pg.keyed_table(name)
    out, err = tmp_path / "stdout.log", tmp_path / "stderr.log"
    env = {**os.environ, "XASINK_FAULT": FAULTS, "PYSPARK_PYTHON": sys.executable}
    code = run_until_exit([sys.executable, str(DRIVER), pg.url, by_format, by_write], env, out, stderr=err)
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
    secret = make_url(pg.url).password
    assert not secret or str(secret) not in stdout + stderr

    expected = [(i, f"n{i}") for i in range(10)]
    assert pg.rows(by_format) == expected and pg.rows(by_write) == expected
    assert "WARNINGS" not in before
