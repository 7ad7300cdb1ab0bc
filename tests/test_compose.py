"""docker-compose.yml starts the servers docs/operations.md's "Database set-up" describes; no Docker needed.

Every value is read from the compose file and the files it mounts: PostgreSQL with
``max_prepared_transactions`` > 0 (and the docs naming the same value), MySQL 8 whose init SQL creates the
application user and grants it ``XA_RECOVER_ADMIN``, MariaDB 10.5+, ``local_infile`` on both, and distinct
host ports.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "docker-compose.yml"


def _docs() -> str:
    """README.md and docs/*.md: the set-up the compose file must agree with."""
    return "\n".join(p.read_text() for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))])


@pytest.fixture(scope="module")
def services() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE.read_text())
    assert {"postgres", "mysql", "mariadb"} <= set(data["services"])
    return data["services"]  # type: ignore[no-any-return]


def _args(service: dict[str, Any]) -> list[str]:
    command = service.get("command", [])
    return command.split() if isinstance(command, str) else [str(c) for c in command]


def _setting(args: list[str], name: str) -> str | None:
    """The value of ``-c name=value`` (PostgreSQL) or ``--name=value`` (MySQL, MariaDB; - and _ alike)."""
    want = name.replace("-", "_")
    for arg in args:
        key, sep, value = arg.lstrip("-").partition("=")
        if sep and key.replace("-", "_") == want:
            return value
    return None


def _major_minor(image: str) -> tuple[int, ...]:
    return tuple(int(x) for x in image.rpartition(":")[2].split(".")[:2])


def test_postgres_enables_prepared_transactions(services: dict[str, Any]) -> None:
    pg = services["postgres"]
    assert pg["image"].startswith("postgres:")
    value = _setting(_args(pg), "max_prepared_transactions")
    assert value is not None and int(value) > 0
    assert f"max_prepared_transactions={value}" in _docs().replace("`", "")


def test_mysql_init_grants_xa_recover_admin_to_the_app_user(services: dict[str, Any]) -> None:
    my = services["mysql"]
    assert my["image"].startswith("mysql:") and _major_minor(my["image"])[0] >= 8
    assert _setting(_args(my), "local_infile") == "1"
    mounts = [v.split(":") for v in my["volumes"] if "/docker-entrypoint-initdb.d/" in v]
    assert len(mounts) == 1
    host = (COMPOSE.parent / mounts[0][0]).resolve()
    assert host.is_file(), f"{mounts[0][0]} is mounted but missing"
    sql = re.sub(r"--[^\n]*", "", host.read_text())
    users = re.findall(r"CREATE USER (?:IF NOT EXISTS )?'(\w+)'@'([^']*)'", sql)
    assert len(users) == 1
    user, hostmask = users[0]
    assert re.search(rf"GRANT XA_RECOVER_ADMIN ON \*\.\* TO '{user}'@'{re.escape(hostmask)}'", sql)
    database = my["environment"]["MYSQL_DATABASE"]
    assert re.search(rf"GRANT ALL PRIVILEGES ON {database}\.\* TO '{user}'@'{re.escape(hostmask)}'", sql)
    assert host.relative_to(ROOT).as_posix() in _docs()  # the docs name the file


def test_mariadb_service(services: dict[str, Any]) -> None:
    maria = services["mariadb"]
    assert maria["image"].startswith("mariadb:") and _major_minor(maria["image"]) >= (10, 5)
    assert _setting(_args(maria), "local_infile") == "1"
    env = maria["environment"]
    assert env["MARIADB_USER"] and env["MARIADB_PASSWORD"] and env["MARIADB_DATABASE"]


def test_host_ports_are_distinct(services: dict[str, Any]) -> None:
    host_ports = [str(p).split(":")[-2] for s in ("postgres", "mysql", "mariadb") for p in services[s]["ports"]]
    assert len(host_ports) == len(set(host_ports)) == 3
