"""One module per database; :func:`dialect_for` picks one from a URL."""

from __future__ import annotations

from sqlalchemy.engine import URL

from .base import BranchSession, Dialect, ErrorKind, PreparedTxn, TargetPlan


def dialect_for(url: URL) -> Dialect:
    backend = url.get_backend_name()
    if backend == "postgresql":
        from .postgres import PostgresDialect

        return PostgresDialect(url)
    if backend == "mysql":
        from .mysql import MySQLDialect  # type: ignore[import-not-found,unused-ignore]

        return MySQLDialect(url)  # type: ignore[no-any-return,unused-ignore]
    raise ValueError(f"unsupported database {backend!r}")


__all__ = ["BranchSession", "Dialect", "ErrorKind", "PreparedTxn", "TargetPlan", "dialect_for"]
