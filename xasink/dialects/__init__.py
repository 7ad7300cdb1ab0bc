"""One module per database; :func:`dialect_for` picks one from a URL."""

from __future__ import annotations

from sqlalchemy.engine import URL

from .base import BranchSession, BranchSettings, Dialect, ErrorKind, PreparedTxn, TargetPlan


def dialect_for(url: URL, settings: BranchSettings | None = None) -> Dialect:
    backend = url.get_backend_name()
    if backend == "postgresql":
        from .postgres import PostgresDialect

        return PostgresDialect(url, settings)
    if backend == "mysql":
        from .mysql import MySQLDialect  # type: ignore[import-not-found,unused-ignore]

        return MySQLDialect(url, settings)  # type: ignore[no-any-return,unused-ignore]
    raise ValueError(f"unsupported database {backend!r}")


__all__ = ["BranchSession", "BranchSettings", "Dialect", "ErrorKind", "PreparedTxn", "TargetPlan", "dialect_for"]
