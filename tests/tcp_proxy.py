"""A small TCP proxy for fault tests: forwards 127.0.0.1:<random> to a database and cuts connections on command.

The coordinator's URL points at the proxy while the branches are written directly, so a test can cut
exactly the connections that carry ``COMMIT PREPARED``:

* :meth:`TcpProxy.drop_all` closes every open connection now;
* :meth:`TcpProxy.refuse_next` closes the next *n* new connections right after accepting them (a server
  that resets logins), :meth:`TcpProxy.set_down` does so for every connection until turned off;
* :meth:`TcpProxy.cut_on` watches the client's bytes for a pattern (e.g. ``b"COMMIT PREPARED"``): the
  statement is forwarded and executed, and the connection is cut instead of relaying the reply, so the
  client cannot know whether it committed (``after_reply=False`` cuts before forwarding instead,
  ``relay_reply=True`` after relaying the reply, so the client saw it succeed);
  ``then_refuse=n`` refuses the next *n* connections after the cut, ``then_down=True`` every later one,
  ``then_down_for=s`` drops every open connection and refuses new ones for *s* seconds (a server that
  became unreachable for a while); ``armed_by=b"..."`` cuts only a connection that sent that pattern
  before (e.g. the ``COMMIT`` that follows ``INSERT INTO xasink_batches``);
* :meth:`TcpProxy.down_for` drops every connection and refuses new ones for a number of seconds.

The proxy speaks no protocol: it matches raw bytes, which works for PostgreSQL's plain (non-TLS)
simple-query messages the control connections send.  Threads only, no asyncio: tests stay synchronous.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

_CHUNK = 65536


@dataclass
class _Cut:
    pattern: bytes
    times: int
    after_reply: bool
    then_refuse: int
    then_down: bool
    relay_reply: bool = False
    then_down_for: float = 0.0
    armed_by: bytes | None = None


@dataclass
class _Link:
    """One proxied connection: the client's socket and ours to the server."""

    client: socket.socket
    server: socket.socket
    swallow_reply: bool = False
    close_after_reply: bool = False
    sent: bytes = b""  # the client's bytes so far, kept only while a cut is armed by a pattern
    closed: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)

    def close(self) -> None:
        with self.lock:
            if self.closed:
                return
            self.closed = True
        for s in (self.client, self.server):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                s.close()


class TcpProxy:
    """Forward ``127.0.0.1:self.port`` to ``target``; cut, refuse or drop connections when told to."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._links: list[_Link] = []
        self._refuse = 0
        self._down = False
        self._down_until = 0.0  # time.monotonic() until which new connections are refused
        self._cuts: list[_Cut] = []
        self._running = False
        # figures a test reports
        self.accepted = 0
        self.refused = 0
        self.cut = 0
        self.dropped = 0

    # -- life cycle -------------------------------------------------------------------------
    def start(self) -> TcpProxy:
        self._listener.listen(64)
        self._running = True
        threading.Thread(target=self._accept_loop, name=f"proxy-{self.port}", daemon=True).start()
        return self

    def close(self) -> None:
        self._running = False
        with contextlib.suppress(OSError):
            self._listener.close()
        self.drop_all(count=False)

    def __enter__(self) -> TcpProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- commands ---------------------------------------------------------------------------
    def drop_all(self, count: bool = True) -> int:
        """Close every open connection now; returns how many."""
        with self._lock:
            links, self._links = self._links, []
        for link in links:
            link.close()
        if count:
            self.dropped += len(links)
        return len(links)

    def refuse_next(self, n: int) -> None:
        """Close the next ``n`` new connections as soon as they are accepted."""
        with self._lock:
            self._refuse += n

    def set_down(self, down: bool) -> None:
        """While down, every new connection is closed at once (the port stays open, like a dying server)."""
        with self._lock:
            self._down = down

    def down_for(self, seconds: float) -> None:
        """Drop every open connection and refuse new ones for ``seconds`` (then accept again by itself)."""
        with self._lock:
            self._down_until = time.monotonic() + seconds
        self.drop_all()

    def cut_on(
        self,
        pattern: bytes,
        times: int = 1,
        *,
        after_reply: bool = True,
        then_refuse: int = 0,
        then_down: bool = False,
        relay_reply: bool = False,
        then_down_for: float = 0.0,
        armed_by: bytes | None = None,
    ) -> None:
        """Cut the next ``times`` connections whose client sends ``pattern`` (see the module docstring).

        After each cut, refuse the next ``then_refuse`` new connections, or (``then_down``) all of them,
        or (``then_down_for``) drop all and refuse new ones for that many seconds.  With ``armed_by``, only
        a connection whose client sent ``armed_by`` earlier is cut.
        """
        with self._lock:
            self._cuts.append(
                _Cut(pattern, times, after_reply, then_refuse, then_down, relay_reply, then_down_for, armed_by)
            )

    def reset(self) -> None:
        """Forget armed cuts and refusals and come back up."""
        with self._lock:
            self._cuts.clear()
            self._refuse = 0
            self._down = False
            self._down_until = 0.0

    @property
    def open_connections(self) -> int:
        with self._lock:
            return sum(1 for link in self._links if not link.closed)

    # -- internals ----------------------------------------------------------------------------
    def _accept_loop(self) -> None:
        while self._running:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                self.accepted += 1
                refuse = self._down or self._refuse > 0 or time.monotonic() < self._down_until
                if self._refuse > 0:
                    self._refuse -= 1
            if refuse:
                self.refused += 1
                with contextlib.suppress(OSError):
                    client.close()
                continue
            try:
                server = socket.create_connection(self.target, timeout=10)
                server.settimeout(None)
            except OSError as exc:
                log.info("proxy %s: upstream connect failed: %s", self.port, exc)
                with contextlib.suppress(OSError):
                    client.close()
                continue
            link = _Link(client, server)
            with self._lock:
                self._links.append(link)
            threading.Thread(target=self._pump_up, args=(link,), daemon=True).start()
            threading.Thread(target=self._pump_down, args=(link,), daemon=True).start()

    def _armed_cut(self, link: _Link, tail: bytes, data: bytes) -> _Cut | None:
        with self._lock:
            for cut in self._cuts:
                if cut.armed_by is not None and cut.armed_by not in link.sent:
                    continue
                keep = len(cut.pattern) - 1  # a pattern wholly inside the tail was seen with the last chunk
                if cut.times > 0 and cut.pattern in (tail[len(tail) - keep :] if keep else b"") + data:
                    cut.times -= 1
                    self._refuse += cut.then_refuse
                    if cut.then_down:
                        self._down = True
                    if cut.then_down_for:
                        self._down_until = time.monotonic() + cut.then_down_for
                    return cut
            if any(c.times > 0 and c.armed_by is not None for c in self._cuts):
                link.sent = (link.sent + data)[-65536:]
        return None

    def _drop_others(self, keep: _Link) -> None:
        with self._lock:
            others = [link for link in self._links if link is not keep]
            self._links = [keep]
        for link in others:
            link.close()
        self.dropped += len(others)

    def _pump_up(self, link: _Link) -> None:
        """Client to server; watches for armed patterns (keeping a tail so a pattern split in two is seen)."""
        tail = b""
        try:
            while True:
                data = link.client.recv(_CHUNK)
                if not data:
                    break
                cut = self._armed_cut(link, tail, data)
                if cut is not None:
                    self.cut += 1
                    if cut.then_down_for:
                        self._drop_others(link)
                    if cut.relay_reply:
                        link.close_after_reply = True
                    elif not cut.after_reply:
                        break
                    else:
                        link.swallow_reply = True
                link.server.sendall(data)
                tail = (tail + data)[-256:]
        except OSError:
            pass
        if not link.swallow_reply:  # after a relayed reply: the client sent again or hung up
            link.close()

    def _pump_down(self, link: _Link) -> None:
        """Server to client; after a cut statement, the reply is read and thrown away, then both sides close."""
        try:
            while True:
                data = link.server.recv(_CHUNK)
                if not data:
                    break
                if link.swallow_reply:
                    break
                link.client.sendall(data)
                if link.close_after_reply:
                    # half-close: the reply, then FIN; a full close while the client's socket holds unread
                    # bytes would send RST, which may discard the reply before the client reads it
                    with contextlib.suppress(OSError):
                        link.client.shutdown(socket.SHUT_WR)
                    with contextlib.suppress(OSError):
                        link.server.close()
                    return  # _pump_up closes the client's side when the client sends again or hangs up
        except OSError:
            pass
        link.close()
