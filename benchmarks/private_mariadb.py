"""A private MariaDB server for one benchmark run (``--mariadb private``): its CPU seconds are the run's alone.

The machine's server at 127.0.0.1:3306 is shared (other jobs load it while a benchmark runs), so the CPU that
:mod:`benchmarks.cpu` reads for it mixes their work into ours.  The server is
:class:`xasink.support.embedded_mariadb.EmbeddedMariaDB`: its own data directory and port, and the settings
that matter for a durable write as the machine's server has them.
"""

from __future__ import annotations

from pathlib import Path

from xasink.support.embedded_mariadb import EmbeddedMariaDB


def parse_private(spec: str) -> dict[str, str] | None:
    """``private`` or ``private:name=value,...`` (``--mariadb``): the server's overrides; None if not private."""
    head, _, rest = spec.partition(":")
    if head != "private":
        return None
    return dict(item.split("=", 1) for item in rest.split(",") if item)


def server_pids(pg_data: Path | None, maria: EmbeddedMariaDB | None) -> set[int]:
    """The private servers' pids: this MariaDB's and PostgreSQL's postmaster (from its pid file)."""
    pids = {maria.pid} if maria is not None and maria.pid else set()
    if pg_data is not None:
        pids.add(int((pg_data / "postmaster.pid").read_text().split()[0]))
    return pids
