"""The decision log's DDL, shipped inside the package for DBAs (``xasink ddl postgres``).

The same tables xasink creates on first use; a DBA runs this where the writing
user may not CREATE. Read with importlib.resources so it works from a wheel.
"""

from __future__ import annotations

from importlib import resources

DIALECTS = ("postgres", "mysql")


def ddl(dialect: str) -> str:
    """The text of ``xasink/journal/sql/<dialect>.sql``; ``mysql`` serves MySQL 8 and MariaDB."""
    if dialect not in DIALECTS:
        raise ValueError(f"no DDL for {dialect!r}; one of {', '.join(DIALECTS)}")
    return resources.files("xasink.journal").joinpath("sql").joinpath(f"{dialect}.sql").read_text(encoding="utf-8")
