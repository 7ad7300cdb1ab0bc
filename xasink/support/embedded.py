"""A throwaway PostgreSQL server with prepared transactions enabled.

The demo and the test suite need a server whose ``max_prepared_transactions``
is above zero, and most installed servers leave it at the default 0.  This
module runs a private cluster from the local PostgreSQL binaries in a
temporary directory on a free port.  ``pg_ctl`` refuses to run as root, so
under root the server runs as an unprivileged account (``postgres`` when it
exists, else ``nobody``).

Authentication: without ``password`` every login is trusted (the demo and the
benchmarks).  With ``password`` (the test suite) the cluster is initialised with
``--auth-host=scram-sha-256`` and that password for the ``postgres`` superuser,
so every TCP login - the superuser's included - must prove its password, as
against a production server; :attr:`EmbeddedPostgres.url` then carries it.
Only the Unix socket in the cluster's directory stays ``trust``, so the server
can be administered locally (``pg_ctl`` needs no password).
"""

from __future__ import annotations

import glob
import logging
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from urllib.parse import quote

log = logging.getLogger(__name__)


class EmbeddedPostgresError(RuntimeError):
    """The embedded server could not be found or started."""


def find_pg_bin() -> Path:
    """Locate the directory holding ``initdb`` and ``pg_ctl``."""
    explicit = os.environ.get("XASINK_PG_BIN")
    candidates: list[str] = [explicit] if explicit else []
    on_path = shutil.which("pg_ctl")
    if on_path:
        candidates.append(str(Path(on_path).parent))
    versions = sorted(
        glob.glob("/usr/lib/postgresql/*/bin"),
        key=lambda p: int(Path(p).parent.name) if Path(p).parent.name.isdigit() else 0,
        reverse=True,
    )
    candidates += versions + ["/usr/local/pgsql/bin", "/opt/homebrew/bin", "/usr/local/bin"]
    for cand in candidates:
        if (Path(cand) / "initdb").exists() and (Path(cand) / "pg_ctl").exists():
            return Path(cand)
    raise EmbeddedPostgresError(
        "no PostgreSQL server binaries (initdb, pg_ctl) found; install PostgreSQL "
        "(e.g. 'apt-get install postgresql') or set XASINK_PG_BIN to the folder holding them"
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class EmbeddedPostgres:
    """A private PostgreSQL cluster; use as a context manager or call start/stop."""

    def __init__(
        self,
        *,
        max_prepared_transactions: int = 100,
        port: int | None = None,
        base_dir: str | None = None,
        extra_settings: dict[str, str] | None = None,
        password: str | None = None,
    ) -> None:
        self.password = password
        self.max_prepared_transactions = max_prepared_transactions
        self.port = port or free_port()
        self.extra_settings = extra_settings or {}
        self._own_dir = base_dir is None
        self.base_dir = Path(base_dir or tempfile.mkdtemp(prefix="xasink-pg-"))
        self.data_dir = self.base_dir / "data"
        self.bin_dir = find_pg_bin()
        self._run_as = self._unprivileged_user() if os.geteuid() == 0 else None

    @property
    def url(self) -> str:
        """The superuser's URL, with its password when it has one (never log it: xasink/support/masking.py)."""
        if self.password is None:
            return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        secret = quote(self.password, safe="")
        return f"postgresql://postgres:{secret}@127.0.0.1:{self.port}/postgres"

    @staticmethod
    def _unprivileged_user() -> str:
        for name in (os.environ.get("XASINK_PG_USER"), "postgres", "nobody"):
            if not name:
                continue
            try:
                pwd.getpwnam(name)
                return name
            except KeyError:
                continue
        raise EmbeddedPostgresError("running as root and no unprivileged user (postgres, nobody) to run PostgreSQL as")

    def _cmd(self, tool: str, *args: str) -> list[str]:
        cmd = [str(self.bin_dir / tool), *args]
        if self._run_as:
            cmd = ["runuser", "-u", self._run_as, "--", *cmd]
        return cmd

    def _run(self, tool: str, *args: str) -> None:
        proc = subprocess.run(self._cmd(tool, *args), capture_output=True, text=True, cwd=str(self.base_dir))
        if proc.returncode != 0:
            raise EmbeddedPostgresError(
                f"{tool} failed ({proc.returncode}): {proc.stderr.strip() or proc.stdout.strip()}"
            )

    def start(self) -> str:
        """Initialise the cluster if needed, start it and return its URL."""
        self.base_dir.mkdir(parents=True, exist_ok=True)
        if self._run_as:
            pw = pwd.getpwnam(self._run_as)
            os.chown(self.base_dir, pw.pw_uid, pw.pw_gid)
        if not (self.data_dir / "PG_VERSION").exists():
            self._initdb()
        settings = {
            "listen_addresses": "127.0.0.1",
            "port": str(self.port),
            "unix_socket_directories": str(self.base_dir),
            "max_prepared_transactions": str(self.max_prepared_transactions),
            "max_connections": str(max(100, self.max_prepared_transactions + 20)),
            "shared_buffers": "256MB",
            "max_wal_size": "4GB",
            "log_min_messages": "warning",
        }
        # speed over durability, in postgresql.conf rather than on the command line so that ALTER SYSTEM can
        # still change them (tests check the warning about them: tests/test_dialect_edges.py)
        speed = {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"}
        speed.update({k: v for k, v in self.extra_settings.items() if k in speed})
        conf = self.data_dir / "postgresql.conf"
        text = conf.read_text()
        marker = "# xasink embedded: speed over durability\n"
        text = text.split(marker)[0] + marker + "".join(f"{k} = {v}\n" for k, v in speed.items())
        conf.write_text(text)
        settings.update({k: v for k, v in self.extra_settings.items() if k not in speed})
        opts = " ".join(f"-c {k}={v}" for k, v in settings.items())
        self._run(
            "pg_ctl",
            "-D",
            str(self.data_dir),
            "-l",
            str(self.base_dir / "server.log"),
            "-o",
            opts,
            "-w",
            "-t",
            "60",
            "start",
        )
        self._wait_ready()
        log.info("embedded PostgreSQL on port %s (data in %s)", self.port, self.data_dir)
        return self.url

    def _initdb(self) -> None:
        args = ["-D", str(self.data_dir), "-U", "postgres", "-E", "UTF8", "--locale=C"]
        if self.password is None:
            self._run("initdb", *args, "--auth=trust")
            return
        pwfile = self.base_dir / "pwfile"
        pwfile.write_text(self.password + "\n")
        pwfile.chmod(0o600)
        if self._run_as:
            pw = pwd.getpwnam(self._run_as)
            os.chown(pwfile, pw.pw_uid, pw.pw_gid)
        try:
            self._run("initdb", *args, "--auth-local=trust", "--auth-host=scram-sha-256", f"--pwfile={pwfile}")
        finally:
            pwfile.unlink()

    def _wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            time.sleep(0.1)
        raise EmbeddedPostgresError(f"PostgreSQL did not accept connections on port {self.port}")

    def restart(self) -> None:
        """Stop (immediately, like a crash) and start again: prepared transactions survive."""
        self._run("pg_ctl", "-D", str(self.data_dir), "-m", "immediate", "-w", "stop")
        self.start()

    def stop(self, remove: bool = True) -> None:
        if (self.data_dir / "postmaster.pid").exists():
            try:
                self._run("pg_ctl", "-D", str(self.data_dir), "-m", "immediate", "-w", "stop")
            except EmbeddedPostgresError as exc:  # already gone
                log.warning("stopping embedded PostgreSQL: %s", exc)
        if remove and self._own_dir:
            shutil.rmtree(self.base_dir, ignore_errors=True)

    def __enter__(self) -> EmbeddedPostgres:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
