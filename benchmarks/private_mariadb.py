"""A private MariaDB server for one benchmark run (``--mariadb private``): its CPU seconds are the run's alone.

The machine's server at 127.0.0.1:3306 is shared (other jobs load it while a benchmark runs), so the CPU that
:mod:`benchmarks.cpu` reads for it mixes their work into ours.  This one has its own data directory and port,
and the machine server's settings that matter for a durable write: InnoDB's defaults
(innodb_flush_log_at_trx_commit=1, doublewrite on, a 128 MiB buffer pool, O_DIRECT), utf8mb4, local_infile on.
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

log = logging.getLogger("benchmarks")

SERVER = "mariadbd"
INSTALL = "mariadb-install-db"
# the machine's /etc/mysql/my.cnf, less its paths; the rest are MariaDB 10.11's defaults, stated to be sure
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


class PrivateMariaDB:
    """``start()`` installs and starts the server (root without password); ``stop()`` ends it and removes it."""

    def __init__(self, overrides: dict[str, str] | None = None) -> None:
        """``overrides``: server options that replace or add to :data:`SETTINGS` (``innodb-buffer-pool-size``)."""
        self.settings = with_overrides(SETTINGS, overrides or {})
        self.dir = Path(tempfile.mkdtemp(prefix="xasink-mdb-"))
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def _user(self) -> list[str]:
        """As root the server runs as mysql (it refuses root), owning its directory."""
        if os.geteuid() != 0:
            return []
        shutil.chown(self.dir, "mysql", "mysql")
        return ["--user=mysql"]

    def start(self, timeout: float = 60.0) -> str:
        """host:port once the server answers."""
        if shutil.which(SERVER) is None and not Path(f"/usr/sbin/{SERVER}").exists():
            raise RuntimeError(f"{SERVER} not installed")
        user = self._user()
        data = self.dir / "data"
        subprocess.run(
            [INSTALL, "--no-defaults", f"--datadir={data}", "--auth-root-authentication-method=normal"]
            + ["--skip-test-db", *user],
            check=True,
            capture_output=True,
        )
        binary = shutil.which(SERVER) or f"/usr/sbin/{SERVER}"
        self.proc = subprocess.Popen(
            [binary, "--no-defaults", f"--datadir={data}", f"--port={self.port}", f"--socket={self.dir / 'sock'}"]
            + [f"--pid-file={self.dir / 'pid'}", f"--log-error={self.dir / 'error.log'}", *user, *self.settings],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + timeout
        while True:
            try:
                pymysql.connect(host="127.0.0.1", port=self.port, user="root", password="").close()
                break
            except pymysql.MySQLError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"private MariaDB did not start (see {self.dir / 'error.log'})") from None
                time.sleep(0.2)
        log.info("private MariaDB at 127.0.0.1:%s (pid %s, %s)", self.port, self.pid, self.dir)
        return f"127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()  # a clean shutdown: prepared XA branches would survive it, none are left
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


def parse_private(spec: str) -> dict[str, str] | None:
    """``private`` or ``private:name=value,...`` (``--mariadb``): the server's overrides; None if not private."""
    head, _, rest = spec.partition(":")
    if head != "private":
        return None
    return dict(item.split("=", 1) for item in rest.split(",") if item)


def server_pids(pg_data: Path | None, maria: PrivateMariaDB | None) -> set[int]:
    """The private servers' pids: this MariaDB's and PostgreSQL's postmaster (from its pid file)."""
    pids = {maria.pid} if maria is not None and maria.pid else set()
    if pg_data is not None:
        pids.add(int((pg_data / "postmaster.pid").read_text().split()[0]))
    return pids
