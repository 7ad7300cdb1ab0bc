"""The wheel and sdist: ``python -m build`` makes both, and an installed wheel carries what xasink reads at
run time (the decision log DDL in ``xasink/journal/sql``, ``py.typed``, the demo's log4j2 configuration), answers
``xasink --version``, and runs the README's demo (``xasink demo``: its own PostgreSQL and local Spark) to its
"proved" lines with nothing on stderr.

The build runs without isolation (``--no-isolation``: setuptools and wheel come from the test extra, nothing is
downloaded). The wheel is installed with ``--no-deps`` into a fresh venv made without pip; a ``.pth`` file
points it at this interpreter's site-packages for pyspark and the other dependencies, so nothing is downloaded
and xasink itself comes only from the wheel (never from this source tree: no PYTHONPATH, another cwd).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tarfile
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from xasink.ops.cli import main
from xasink.ops.ddl import DIALECTS, ddl

ROOT = Path(__file__).resolve().parent.parent
VERSION = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M)[1]  # type: ignore[index]
# every file of the package that is not Python source: what xasink reads at run time (a new one must be listed in
# pyproject.toml's package-data, or the installed package lacks it)
PACKAGE_DATA = tuple(
    sorted(
        p.relative_to(ROOT).as_posix()
        for p in (ROOT / "xasink").rglob("*")
        if p.is_file() and p.suffix not in (".py", ".pyc") and "__pycache__" not in p.parts
    )
)


@dataclass(frozen=True)
class Installed:
    wheel: Path
    sdist: Path
    python: Path
    bin: Path
    env: dict[str, str]
    cwd: Path


def _run(cmd: list[str | Path], **kw: object) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=300, **kw)  # type: ignore[call-overload]
    assert proc.returncode == 0, f"{cmd} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    tmp = tmp_path_factory.mktemp("wheel")
    dist = tmp / "dist"
    # sdist first, then the wheel built from that sdist: a file the sdist forgets is missing from the wheel too
    _run([sys.executable, "-m", "build", "--no-isolation", "--outdir", dist, ROOT], cwd=ROOT)
    (wheel,) = dist.glob("xasink-*.whl")
    (sdist,) = dist.glob("xasink-*.tar.gz")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    venv = tmp / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv])
    python = venv / "bin" / "python"
    # this interpreter's pip installs into the new venv; no PYTHONPATH and another cwd, so pip never mistakes a
    # source tree's xasink.egg-info for an installed xasink
    pip: list[str | Path] = [sys.executable, "-m", "pip", "--python", python]
    pip += ["install", "--no-deps", "--no-index", "--force-reinstall"]
    _run([*pip, "-q", wheel], env=env, cwd=tmp)
    site = Path(_run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())
    # the dependencies (pyspark, sqlalchemy, ...) from this interpreter's site-packages, appended after the
    # venv's own: the xasink the venv imports is the wheel's
    deps = [p for p in sys.path if ("site-packages" in p or "dist-packages" in p) and Path(p).is_dir()]
    (site / "_xasink_test_deps.pth").write_text("\n".join(deps) + "\n")
    env.update(PYSPARK_PYTHON=str(python), PYSPARK_DRIVER_PYTHON=str(python))
    yield Installed(wheel, sdist, python, venv / "bin", env, tmp)


def test_wheel_and_sdist_hold_the_package_data(installed: Installed) -> None:
    assert {"xasink/py.typed", "xasink/journal/sql/postgres.sql", "xasink/journal/sql/mysql.sql"} <= set(PACKAGE_DATA)
    names = set(zipfile.ZipFile(installed.wheel).namelist())
    assert set(PACKAGE_DATA) <= names
    assert not any(n.startswith(("tests/", "benchmarks/", "sql/")) for n in names)
    with tarfile.open(installed.sdist) as tar:
        members = {m.name.split("/", 1)[1] for m in tar.getmembers() if "/" in m.name}
    assert set(PACKAGE_DATA) <= members


def test_installed_version_and_ddl(installed: Installed) -> None:
    out = _run([installed.bin / "xasink", "--version"], env=installed.env, cwd=installed.cwd).stdout
    assert out == f"xasink {VERSION}\n"
    for dialect in DIALECTS:
        out = _run([installed.bin / "xasink", "ddl", dialect], env=installed.env, cwd=installed.cwd).stdout
        assert out == (ROOT / "xasink" / "journal" / "sql" / f"{dialect}.sql").read_text()
        assert "CREATE TABLE IF NOT EXISTS xasink_batches" in out


def test_installed_package_reads_its_data(installed: Installed) -> None:
    probe = (
        "import json, xasink, importlib.resources as r, importlib.metadata as m\n"
        "root = r.files('xasink')\n"
        "print(json.dumps({'file': xasink.__file__, 'version': m.version('xasink'),\n"
        "  'typed': root.joinpath('py.typed').is_file(),\n"
        "  'log4j': root.joinpath('spark').joinpath('log4j2-demo.properties').read_text(),\n"
        "  'sql': {d: root.joinpath('journal').joinpath('sql').joinpath(d + '.sql').read_text()\n"
        "          for d in ('postgres', 'mysql')}}))\n"
    )
    got = json.loads(_run([installed.python, "-c", probe], env=installed.env, cwd=installed.cwd).stdout)
    assert Path(got["file"]).is_relative_to(installed.python.parent.parent)  # the wheel's, not this tree's
    assert got["version"] == VERSION
    assert got["typed"] is True
    assert "rootLogger.level = error" in got["log4j"]
    for dialect in DIALECTS:
        assert got["sql"][dialect] == (ROOT / "xasink" / "journal" / "sql" / f"{dialect}.sql").read_text()


def test_cli_version_and_ddl_in_process(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert re.fullmatch(r"xasink (\S+)\n", capsys.readouterr().out)
    assert main(["ddl", "mysql"]) == 0
    assert capsys.readouterr().out == ddl("mysql")
    with pytest.raises(ValueError, match="no DDL for 'oracle'"):
        ddl("oracle")


# `xasink demo` as a user runs it from the wheel: every line it prints, in order (a regular expression each; only
# the port and the timings vary). A line added, lost or changed fails, so does anything on stderr.
DEMO_ROWS = 100_000
_TIMES = (
    r"\(" + ", ".join(rf"{k} \d+\.\d{{3}}s" for k in ("prepare", "decide", "commit", "mark", "sweep", "total")) + r"\)"
)
DEMO_TRANSCRIPT = (
    r"xasink demo: exactly-once writes from Spark into PostgreSQL by two-phase commit",
    r"",
    r"1\. started a throwaway PostgreSQL on port \d+ with max_prepared_transactions=64",
    rf"2\. a DataFrame of {DEMO_ROWS} orders in 4 partitions",
    r"3\. first try: partition 2 fails after the other partitions have loaded their rows \.\.\.",
    r"   the write failed as planned \(BatchAbortedError\) after \d+\.\ds",
    r"   rows visible in demo_orders: 0; prepared transactions left: 0",
    r"4\. retry the same batch \(sinkId demo-orders, batchId 1\) \.\.\.",
    rf"   sink demo-orders batch 1: committed {DEMO_ROWS} rows in 4 branches {_TIMES}",
    r"5\. run it once more: a committed batch is never written twice \.\.\.",
    r"   sink demo-orders batch 1: skipped, nothing written \(committed earlier at \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d UTC "
    rf"by run [0-9a-f]{{8}}: {DEMO_ROWS} rows in 4 branches, prepare \d+\.\d{{3}}s, commit \d+\.\d{{3}}s\) "
    r"\(total \d+\.\d{3}s\)",
    r"",
    # what was proved, counted in the database: the demo's last lines, exactly
    r"proved, counted in the database:",
    r"   rows visible after the failed write: 0 \(expected 0\)",
    rf"   rows after the retry: {DEMO_ROWS}, {DEMO_ROWS} distinct order ids \(expected {DEMO_ROWS}, each once\)",
    r"   rows the rerun of the committed batch wrote: 0 \(expected 0\)",
    r"   prepared transactions left: 0 \(expected 0\)",
    r"OK: all or nothing, exactly once",
)
# what a user would take for something gone wrong (case matters: the demo's "failed as planned" is the story)
ALARMING = re.compile(r"WARN|Warning|warning|Traceback|ERROR|Exception|exception|FAILED|error:|Error:")


@pytest.mark.spark
def test_installed_demo_proves_exactly_once_quietly(installed: Installed) -> None:
    """The README's demo, run from the installed wheel (its ``xasink`` script, another cwd, no PYTHONPATH): it
    starts its own PostgreSQL, ends saying what it proved in numbers, and prints nothing alarming."""
    t0 = time.monotonic()
    proc = _run([installed.bin / "xasink", "demo"], env=installed.env, cwd=installed.cwd)
    took = time.monotonic() - t0
    lines = proc.stdout.splitlines()
    assert not ALARMING.search(proc.stdout + proc.stderr), f"alarming output:\n{proc.stdout}\n{proc.stderr}"
    assert proc.stderr == "", proc.stderr
    assert len(lines) == len(DEMO_TRANSCRIPT), proc.stdout
    for pattern, line in zip(DEMO_TRANSCRIPT, lines, strict=True):
        assert re.fullmatch(pattern, line), f"{line!r} does not match {pattern!r}\n{proc.stdout}"
    print(f"xasink demo from the wheel took {took:.1f} s")
