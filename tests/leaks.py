"""The password must never show: helpers and an autouse fixture that check every text a test produced.

Import ``no_secret_in_output`` into a test module to make it autouse there.
"""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote, quote_plus

import pytest

from tests import doc_cases

# The suite's PostgreSQL password: the private server's superuser proves it over TCP (tests/conftest.py), the
# tests pass it as the ``password`` option, and their own roles get it too.  It must never show; the '#' in it
# is percent-encoded (%23) in a URL, so a leak of either form is caught.
SECRET = "Fa7ts-pw#s3cr3t-q9Zx"
ROOT = Path(__file__).resolve().parents[1]


def texts(exc: BaseException) -> Iterator[str]:
    """Every text an exception shows: str, repr, Spark's description and JVM trace, of it and its causes."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        yield str(e)
        yield repr(e)
        for attr in ("_desc", "_stackTrace"):
            value = getattr(e, attr, None)
            if value:
                yield str(value)
        todo += [e.__cause__, e.__context__, getattr(e, "_cause", None)]


def assert_no_secret(*items: BaseException | str | None, secret: str = SECRET) -> None:
    """The password appears in none of these texts or exceptions, as it is or percent-encoded as in a URL."""
    forms = {secret, quote(secret, safe=""), quote_plus(secret)}
    for item in items:
        if item is None:
            continue
        for text in texts(item) if isinstance(item, BaseException) else [item]:
            for form in forms:
                if form in text:
                    at = text.index(form)
                    raise AssertionError(f"the password leaked: ...{text[max(0, at - 300) : at + 100]}...")


@pytest.fixture(autouse=True)
def no_secret_in_output(caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]) -> Iterator[None]:
    """Every log record (xasink at DEBUG), and all output of the test, is free of the password."""
    caplog.set_level(logging.DEBUG, logger="xasink")
    yield
    out, err = capfd.readouterr()
    sys.stdout.write(out)
    sys.stderr.write(err)
    fmt = logging.Formatter("%(message)s")
    records = caplog.get_records("setup") + caplog.get_records("call")
    assert_no_secret(out, err, *(fmt.format(r) for r in records))


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """``python -m xasink.ops.cli ARGS`` in a subprocess, as an operator runs it; it must not show the password."""
    cli = subprocess.run(
        [sys.executable, "-m", "xasink.ops.cli", *args], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert_no_secret(cli.stdout, cli.stderr)
    doc_cases.record_cli(args, cli.returncode, cli.stdout)
    return cli
