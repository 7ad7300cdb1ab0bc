"""Database servers a scenario may kill (SIGKILL, like a crash of the machine) and start again.

- :class:`PostgresRestarts`: the test session's private cluster (xasink.support.embedded.EmbeddedPostgres, the
  ``pg_server`` fixture): its postmaster and every backend are killed, and the cluster started again on the
  same data directory and port (crash recovery; prepared transactions survive).
- :class:`PrivateMariaDB`: a MariaDB server of the test's own (xasink.support.embedded_mariadb), killed and
  started again on the same data directory and port (InnoDB crash recovery; prepared XA branches come back in
  ``XA RECOVER``).  Never the shared server at 127.0.0.1:3306, which other sessions use.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pymysql

from tests.cluster import descendants, proc_table, sigkill, wait_gone
from xasink.support.embedded import EmbeddedPostgres, EmbeddedPostgresError
from xasink.support.embedded_mariadb import EmbeddedMariaDB, EmbeddedMariaDBError, find_server


class PostgresRestarts:
    """Kill -9 and start again the session's private PostgreSQL cluster."""

    def __init__(self, server: EmbeddedPostgres) -> None:
        self.server = server
        self.kills = 0

    def kill(self) -> None:
        pid = int((self.server.data_dir / "postmaster.pid").read_text().split()[0])
        os.kill(pid, signal.SIGSTOP)  # no backend forked from here on
        doomed = [pid, *descendants(pid, proc_table()), *self._in_data_dir()]
        os.kill(pid, signal.SIGKILL)  # the postmaster first: that is the crash
        sigkill(doomed)  # then every backend, as the machine's crash takes them too
        wait_gone(doomed)
        self.kills += 1

    def _in_data_dir(self) -> list[int]:
        """Every process working in the cluster's data directory (the postmaster and its backends)."""
        found = []
        data = str(self.server.data_dir.resolve())
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    if os.readlink(entry / "cwd") == data:
                        found.append(int(entry.name))
                except OSError:
                    continue
        return found

    def alive(self) -> bool:
        """Whether the cluster's postmaster runs."""
        try:
            os.kill(int((self.server.data_dir / "postmaster.pid").read_text().split()[0]), 0)
            return True
        except (OSError, ValueError, IndexError):
            return False

    def start_again(self, tries: int = 5) -> None:
        """Start the cluster again; a backend of the killed one still exiting is killed and waited for first."""
        for attempt in range(tries):
            left = self._in_data_dir()
            sigkill(left)
            wait_gone(left)
            try:
                self.server.start()
                return
            except EmbeddedPostgresError:
                if attempt == tries - 1:
                    log = self.server.base_dir / "server.log"
                    tail = log.read_text(errors="replace")[-1500:] if log.exists() else ""
                    raise EmbeddedPostgresError(f"PostgreSQL did not start again: {tail}") from None
                time.sleep(1.0)


class PrivateMariaDB(EmbeddedMariaDB):
    """A private MariaDB server (see :class:`EmbeddedMariaDB`) that can be killed and started again."""

    def __init__(self) -> None:
        super().__init__()
        self.kills = 0
        self.command: list[str] = []

    def start(self, timeout: float = 60.0) -> str:
        where = super().start(timeout)
        assert self.proc is not None
        self.command = list(self.proc.args)  # type: ignore[arg-type]
        return where

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self.kills += 1

    def start_again(self, timeout: float = 120.0) -> None:
        """The same server on the same data directory and port, after a crash (InnoDB recovers)."""
        if find_server() is None or not self.command:
            raise EmbeddedMariaDBError("the private MariaDB was never started")
        self.proc = subprocess.Popen(self.command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while True:
            try:
                pymysql.connect(host="127.0.0.1", port=self.port, user="root", password="").close()
                return
            except pymysql.MySQLError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    errors = Path(self.dir / "error.log").read_text(errors="replace")[-800:]
                    raise EmbeddedMariaDBError(f"the private MariaDB did not start again: {errors}") from None
                time.sleep(0.2)
