"""TCP keepalives of every connection, control and branch alike: a dead peer is noticed in a minute, not hours."""

from __future__ import annotations

import logging
import socket
from typing import Any

log = logging.getLogger(__name__)

# TCP keepalives of every connection: a peer that died without closing (a server host lost, a cut network)
# is noticed after about IDLE + INTERVAL * COUNT seconds instead of the system default of hours
KEEPALIVE_IDLE_S = 30
KEEPALIVE_INTERVAL_S = 10
KEEPALIVE_COUNT = 3


def set_keepalive(sock: Any) -> None:
    """Turn on TCP keepalives with xasink's timings on a connected socket (a no-op for a Unix socket)."""
    if sock is None or getattr(sock, "family", None) not in (socket.AF_INET, socket.AF_INET6):
        return
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for name, value in (
            ("TCP_KEEPIDLE", KEEPALIVE_IDLE_S),
            ("TCP_KEEPINTVL", KEEPALIVE_INTERVAL_S),
            ("TCP_KEEPCNT", KEEPALIVE_COUNT),
        ):
            opt = getattr(socket, name, None)
            if opt is not None:
                sock.setsockopt(socket.IPPROTO_TCP, opt, value)
    except OSError as exc:  # a platform without these options: the connection works, only less watched
        log.debug("TCP keepalive not set: %s", exc)
