"""A throwaway MariaDB server of the caller's own: its own data directory, port and process.

The benchmarks start one so that the server's CPU seconds are the run's alone; the test suite starts one
when the machine's server does not answer (a service still starting, or none installed).  Its settings are
the ones that matter for a durable write, as a stock Debian server has them: InnoDB's defaults
(innodb_flush_log_at_trx_commit=1, doublewrite on, a 128 MiB buffer pool, O_DIRECT), utf8mb4 and
local_infile on.  Root logs in without a password over TCP on 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pymysql

from xasink.support.embedded import free_port

log = logging.getLogger(__name__)

SERVER = "mariadbd"
INSTALL = "mariadb-install-db"
# a stock /etc/mysql/my.cnf, less its paths; the rest are MariaDB 10.11's defaults, stated to be sure
SETTINGS = (
    "--bind-address=127.0.0.1",
    "--skip-name-resolve",
    "--character-set-server=utf8mb4",
    "--collation-server=utf8mb4_general_ci",
    "--innodb-flush-log-at-trx-commit=1",
    "--innodb-buffer-pool-size=128M",
    "--innodb-log-file-size=96M",
    "--innodb-doublewrite=1",
    "--innodb-flush-method=O_DIRECT",
    "--local-infile=1",
    "--max-allowed-packet=16M",
    "--skip-log-bin",
)


class EmbeddedMariaDBError(RuntimeError):
    """The server is not installed or did not start."""


def find_server() -> str | None:
    """The ``mariadbd`` binary: on PATH, else where Debian puts it; None when not installed."""
    found = shutil.which(SERVER)
    if found:
        return found
    return f"/usr/sbin/{SERVER}" if Path(f"/usr/sbin/{SERVER}").exists() else None


class EmbeddedMariaDB:
    """``start()`` installs and starts the server; ``stop()`` ends it and removes its directory."""

    def __init__(self, overrides: dict[str, str] | None = None) -> None:
        """``overrides``: server options that replace or add to :data:`SETTINGS` (``innodb-buffer-pool-size``)."""
        self.settings = with_overrides(SETTINGS, overrides or {})
        self.dir = Path(tempfile.mkdtemp(prefix="xasink-mdb-"))
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def url(self) -> str:
        """The server's SQLAlchemy URL (no database)."""
        return f"mysql+pymysql://root@127.0.0.1:{self.port}/"

    @property
    def tmpdir(self) -> Path:
        """The server's own: one that starts deletes every ``#sql*`` file in its tmpdir, so in /tmp it deleted
        the temporary tables another MariaDB on this machine was using ("Error on delete of '/tmp/#sql-…'")."""
        return self.dir / "tmp"

    def _user(self) -> list[str]:
        """As root the server runs as mysql (it refuses root), owning its directory."""
        self.tmpdir.mkdir(exist_ok=True)
        if os.geteuid() != 0:
            return []
        for path in (self.dir, self.tmpdir):
            shutil.chown(path, "mysql", "mysql")
        return ["--user=mysql"]

    def start(self, timeout: float = 60.0) -> str:
        """host:port once the server answers."""
        binary = find_server()
        if binary is None:
            raise EmbeddedMariaDBError(f"{SERVER} not installed (apt-get install mariadb-server)")
        user = self._user()
        data = self.dir / "data"
        installed = subprocess.run(
            [INSTALL, "--no-defaults", f"--datadir={data}", f"--tmpdir={self.tmpdir}"]
            + ["--auth-root-authentication-method=normal", "--skip-test-db", *user],
            capture_output=True,
            text=True,
        )
        if installed.returncode != 0:
            self.stop()
            raise EmbeddedMariaDBError(f"{INSTALL} failed: {installed.stderr.strip()[-500:]}")
        self._launch(binary, timeout)
        return f"127.0.0.1:{self.port}"

    def _launch(self, binary: str, timeout: float) -> None:
        data = self.dir / "data"
        self.proc = subprocess.Popen(
            [binary, "--no-defaults", f"--datadir={data}", f"--tmpdir={self.tmpdir}", f"--port={self.port}"]
            + [f"--socket={self.dir / 'sock'}"]
            + [f"--pid-file={self.dir / 'pid'}", f"--log-error={self.dir / 'error.log'}", *self._user()]
            + list(self.settings),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(pymysql.MySQLError):
                if self._answers():
                    break
            if self.proc.poll() is not None or time.monotonic() > deadline:
                errors = (self.dir / "error.log").read_text(errors="replace")[-800:] if self.dir.exists() else ""
                self.stop()
                raise EmbeddedMariaDBError(f"the private MariaDB did not start: {errors}")
            time.sleep(0.2)
        log.info("private MariaDB at 127.0.0.1:%s (pid %s, %s)", self.port, self.pid, self.dir)

    def _answers(self) -> bool:
        """Whether this very server answers: through the socket in its own directory, which only it makes.  The
        server binds its TCP port before it makes the socket, and exits when the port is taken, so an answer
        here also means the port is its own (a free port is only free until someone binds it)."""
        if self.proc is None or self.proc.poll() is not None or not (self.dir / "sock").exists():
            return False
        conn = pymysql.connect(unix_socket=str(self.dir / "sock"), user="root", password="")
        try:
            conn.ping(reconnect=False)
        finally:
            conn.close()
        return True

    def crash(self) -> None:
        """SIGKILL the server, as a crash of its machine would end it; its data directory stays."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def restart(self, timeout: float = 60.0) -> None:
        """Start the server again on its data directory and port (after :meth:`crash`, or a clean stop of it).

        Returns once it answers: InnoDB has recovered, prepared XA branches are listed again.
        """
        binary = find_server()
        if binary is None:
            raise EmbeddedMariaDBError(f"{SERVER} not installed")
        self.crash()
        self._launch(binary, timeout)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()  # a clean shutdown
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(60)
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def with_overrides(settings: tuple[str, ...], overrides: dict[str, str]) -> tuple[str, ...]:
    """``settings`` (``--name=value``) with each of ``overrides`` (name: value) in its place, or added."""
    out = {item.partition("=")[0]: item for item in settings}
    for name, value in overrides.items():
        flag = "--" + name.lstrip("-").replace("_", "-")
        out[flag] = f"{flag}={value}"
    return tuple(out.values())
