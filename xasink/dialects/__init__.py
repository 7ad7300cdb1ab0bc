"""One module per database; :func:`dialect_for` picks one from a URL."""

from __future__ import annotations

from sqlalchemy.engine import URL

from xasink.dialects.base import BranchSession, Dialect
from xasink.dialects.values import BranchSettings, ErrorKind, PreparedTxn, TargetPlan


def dialect_class(url: URL) -> type[Dialect]:
    """The dialect class of a URL's database, imported on first use (the driver's side never loads the other)."""
    backend = url.get_backend_name()
    if backend == "postgresql":
        from xasink.dialects.postgres import PostgresDialect

        return PostgresDialect
    if backend == "mysql":
        from xasink.dialects.mysql import MySQLDialect  # type: ignore[import-not-found,unused-ignore]

        return MySQLDialect  # type: ignore[no-any-return,unused-ignore]
    raise ValueError(f"unsupported database {backend!r}")


def dialect_for(url: URL, settings: BranchSettings | None = None, pool_size: int = 0) -> Dialect:
    """The dialect of a URL.  ``pool_size`` > 0 keeps that many control connections open until ``dispose()``
    (the coordinator: a commit runs a dozen short transactions); 0 opens one per use (executors, tools)."""
    return dialect_class(url)(url, settings, pool_size)


_SHARED: dict[tuple[str, BranchSettings, int], Dialect] = {}


def shared_dialect(url: URL, settings: BranchSettings | None = None, pool_size: int = 1) -> Dialect:
    """One dialect per URL, settings and pool size for the life of this process: what calls in a reused
    Spark Python worker share.

    A Spark Python worker runs many tasks one after the other (and the driver's planning and commit
    calls of one batch after another); a dialect kept between them keeps its engine's initialized
    SQLAlchemy dialect, compiled statements and a few open control connections (a checkout pings one only
    when its socket says the server closed it, or after a long idle: see :mod:`.pooling`; a server restart
    costs one reconnect).  A new control connection costs a TCP and
    authentication handshake, several milliseconds on every step of every batch.  Never disposed: the
    connections close with the worker, which Spark stops when it has been idle for a minute.
    """
    key = (url.render_as_string(hide_password=False), settings or BranchSettings(), pool_size)
    dialect = _SHARED.get(key)
    if dialect is None:
        dialect = _SHARED[key] = dialect_for(url, settings, pool_size)
    return dialect


__all__ = [
    "BranchSession",
    "BranchSettings",
    "Dialect",
    "ErrorKind",
    "PreparedTxn",
    "TargetPlan",
    "dialect_class",
    "dialect_for",
    "shared_dialect",
]
