"""Running a driver the crash tests kill: its own process group, a tag to find every process it started.

A killed Spark driver leaves Python workers that exit only once they notice the JVM is gone; the checks of
what the kill left (and the next run) must not race them.  Every process started here carries
``TAG_ENV=<tag>`` in its environment, inherited by the JVM and its workers, so they can be found and
waited for by tag whatever their parent.  Used by test_crash.py, test_transaction_crash.py,
test_write_modes_crash.py and test_soak_edges.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TAG_ENV = "XASINK_CRASH_TEST_TAG"


def tagged_pids(tag: str) -> list[int]:
    """The processes whose environment holds ``TAG_ENV=tag``."""
    needle = f"{TAG_ENV}={tag}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except OSError:  # gone already, or not readable
            continue
    return found


def reap(tag: str, grace_s: float = 60.0) -> list[int]:
    """Wait for every process of the killed driver to exit (workers do once the JVM is gone); kill stragglers.

    Returns the stragglers: processes still alive after the grace period.
    """
    deadline = time.monotonic() + grace_s
    while (left := tagged_pids(tag)) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return left


def run_until_exit(
    cmd: list[str],
    env: dict[str, str],
    log: Path,
    timeout_s: float = 300,
    stderr: Path | None = None,
    kill_after: float | None = None,
    append: bool = False,
) -> int:
    """Run ``cmd`` in a process group of its own, output to ``log``, until it exits or a fault point kills it.

    With ``stderr``, standard error goes there instead of into ``log`` (what a user reads on a terminal).
    With ``kill_after``, the test kills the group itself if it still runs that many seconds after its start
    (a kill at a random moment). ``append``: add to ``log`` (runs sharing one) instead of starting it anew.

    Returns its exit status (``-SIGKILL`` when killed) once it and every process it started are gone;
    fails if one of them outlives it.  ``XASINK_FAULT_PGID`` is not inherited: the driver sets its own.
    """
    tag = uuid.uuid4().hex
    env = {**env, TAG_ENV: tag}
    env.pop("XASINK_FAULT_PGID", None)
    with log.open("ab" if append else "wb") as out, stderr.open("wb") if stderr is not None else out as err:
        proc = subprocess.Popen(
            cmd,
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err if stderr is not None else subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            if kill_after is not None:
                try:
                    proc.wait(timeout=kill_after)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
            returncode = proc.wait(timeout=timeout_s)
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # whatever is left of its group (Spark's Python workers)
            except ProcessLookupError:
                pass
            proc.wait()
            stragglers = reap(tag)
    assert not stragglers, f"processes of the killed driver outlived it: {stragglers}"
    return returncode


def state(pid: int) -> str:
    """The process's state letter in /proc (``T``: stopped, as by a ``stop`` fault point); ``?`` once gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(") ", 1)[1][0]
    except OSError:
        return "?"


def tail(log: Path, lines: int = 40) -> str:
    """The end of a driver's log, for a failure message."""
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
