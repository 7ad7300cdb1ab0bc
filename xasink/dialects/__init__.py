"""One module per database; :func:`dialect_for` picks one from a URL."""

from __future__ import annotations

from sqlalchemy.engine import URL

from .base import BranchSession, BranchSettings, Dialect, ErrorKind, PreparedTxn, TargetPlan


def dialect_for(url: URL, settings: BranchSettings | None = None, pool_size: int = 0) -> Dialect:
    """The dialect of a URL.  ``pool_size`` > 0 keeps that many control connections open until ``dispose()``
    (the coordinator: a commit runs a dozen short transactions); 0 opens one per use (executors, tools)."""
    backend = url.get_backend_name()
    if backend == "postgresql":
        from .postgres import PostgresDialect

        return PostgresDialect(url, settings, pool_size)
    if backend == "mysql":
        from .mysql import MySQLDialect  # type: ignore[import-not-found,unused-ignore]

        return MySQLDialect(url, settings, pool_size)  # type: ignore[no-any-return,unused-ignore]
    raise ValueError(f"unsupported database {backend!r}")


_SHARED: dict[tuple[str, BranchSettings], Dialect] = {}


def shared_dialect(url: URL, settings: BranchSettings | None = None) -> Dialect:
    """One dialect per URL and settings for the life of this process: what an executor's tasks reuse.

    A Spark Python worker runs many tasks one after the other; a dialect kept between them keeps its
    engine's initialized SQLAlchemy dialect and compiled statements (connections are never pooled: the
    engine uses NullPool), which saves several round trips and much CPU per task on a busy executor.
    """
    key = (url.render_as_string(hide_password=False), settings or BranchSettings())
    dialect = _SHARED.get(key)
    if dialect is None:
        dialect = _SHARED[key] = dialect_for(url, settings)
    return dialect


__all__ = [
    "BranchSession",
    "BranchSettings",
    "Dialect",
    "ErrorKind",
    "PreparedTxn",
    "TargetPlan",
    "dialect_for",
    "shared_dialect",
]
