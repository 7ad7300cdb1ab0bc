"""Control-connection pools whose checkout costs no round trip while the connection is known healthy.

SQLAlchemy's ``pool_pre_ping`` sends ``SELECT 1`` on every checkout.  A micro-batch checks a control
connection out a dozen times, and on a machine whose cores Spark keeps busy each round trip waits for
the scheduler twice (the server's backend, then the client): the pings alone cost milliseconds a batch.
A server that restarts, kills the session or times it out closes the socket, and a closed socket is
readable; so a checkout pings only when the socket has something to read (a close, or a message the
server sent unasked), or when the connection sat idle long enough that a silent network failure could
have broken it.  A failed ping discards the connection and the pool opens a fresh one, as pre-ping did.

Connections that run in autocommit (COMMIT PREPARED, XA COMMIT, rollbacks of stale branches) come from a
pool of their own: switching a pooled connection in and out of autocommit costs statements on both
drivers (``SET default_transaction_isolation``, ``SET AUTOCOMMIT``) at every checkout and checkin.
"""

from __future__ import annotations

import logging
import select
import time
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

log = logging.getLogger(__name__)

IDLE_PING_S = 30.0  # idle longer than this: ping even a quiet socket (a peer gone without a word)
_CHECKED_IN = "xasink_checked_in"


def socket_readable(fd: int) -> bool:
    """Whether ``fd`` has data or an end-of-file waiting, without blocking."""
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLPRI)
    return any(ev & (select.POLLIN | select.POLLPRI | select.POLLHUP | select.POLLERR) for _, ev in poller.poll(0))


def watch_checkouts(engine: Engine, socket_fd: Callable[[Any], int | None]) -> None:
    """Ping a pooled connection at checkout only when it may be broken (see the module's docstring).

    ``socket_fd`` gives the DBAPI connection's socket descriptor, or None when the driver does not say:
    then every checkout pings.
    """

    def on_checkin(dbapi_conn: Any, record: Any) -> None:
        record.info[_CHECKED_IN] = time.monotonic()

    def on_checkout(dbapi_conn: Any, record: Any, proxy: Any) -> None:
        since = record.info.get(_CHECKED_IN)
        if since is None:  # just opened
            return
        try:
            fd = socket_fd(dbapi_conn)
            suspect = fd is None or fd < 0 or socket_readable(fd) or time.monotonic() - since > IDLE_PING_S
        except (OSError, ValueError):  # a closed socket object
            suspect = True
        if not suspect:
            return
        try:
            engine.dialect.do_ping(dbapi_conn)
        except Exception as exc:  # noqa: BLE001 - any failure means this connection is not usable
            log.info("pooled control connection is broken (%s): opening a new one", type(exc).__name__)
            raise sa.exc.DisconnectionError() from exc

    sa.event.listen(engine, "checkin", on_checkin)
    sa.event.listen(engine, "checkout", on_checkout)
