"""What a fresh Python worker imports to commit a batch.

Spark starts a new Python process for every batch's commit (and a streaming query's commit calls
``streamWriter()`` there again).  Its imports are paid once per micro-batch, so the commit path keeps
the row side (pyarrow, numpy, the branch loaders) out: they are imported where rows are handled.
"""

from __future__ import annotations

import json
import subprocess
import sys

PROBE = """
import json, sys
import pyspark.sql.worker.python_streaming_sink_runner  # what Spark's commit worker runs
from sqlalchemy.engine import make_url
from xasink.spark.datasource import XasinkDataSource
from xasink.spark.stream_writer import XasinkStreamWriter  # unpickled there
from xasink.spark.write_task import XasinkCommitMessage  # unpickled there
from xasink.protocol.coordinator import Coordinator
from xasink.dialects import dialect_for
from xasink.options import parse_options

for url in ("postgresql+psycopg2://u:secret@127.0.0.1:1/db", "mysql+pymysql://u:secret@127.0.0.1:1/db"):
    options = parse_options({"url": url, "dbtable": "t", "sinkId": "s1"}, streaming=True)
    Coordinator(options, shared=True).close()
    dialect_for(make_url(url)).dispose()
heavy = ("pyarrow", "numpy", "pandas", "adbc_driver_manager", "adbc_driver_postgresql")
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in heavy or m.endswith((".branch", ".encoding")))))
"""


def test_the_commit_path_imports_no_row_side_modules() -> None:
    proc = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.splitlines()[-1]) == []


def test_the_row_side_is_there_when_asked_for() -> None:
    """The lazy names still resolve (the MySQL package re-exports its loader and encoder)."""
    from xasink.dialects import mysql

    assert mysql.MySQLBranch.__name__ == "MySQLBranch"
    assert callable(mysql.encode_tsv)
    try:
        mysql.no_such_name  # noqa: B018
    except AttributeError as exc:
        assert "no_such_name" in str(exc)
    else:
        raise AssertionError("a missing name must raise AttributeError")


def test_every_benchmark_module_imports() -> None:
    """benchmarks/ is run by hand, so nothing else notices when a module it uses moves (benchmarks/sources.py
    imported ``conform`` from its old module, and every throughput run failed at its Spark session)."""
    probe = (
        "import importlib, pkgutil, benchmarks\n"
        "for m in pkgutil.iter_modules(benchmarks.__path__):\n"
        "    importlib.import_module('benchmarks.' + m.name)\n"
    )
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
