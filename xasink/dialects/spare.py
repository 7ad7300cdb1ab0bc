"""A branch connection made ahead of time, so the next branch of this worker does not wait for one.

A new PostgreSQL session costs a TCP and authentication handshake and a backend start: tens of
milliseconds, on the critical path of every task of every micro-batch.  A Spark Python worker runs its
tasks one after another, so while a task finishes (and between batches) the next task's connection is
made in the background.  The spare is a fresh session that has run nothing, never a branch's used one:
a branch always starts on a connection no earlier branch touched.  A spare the server dropped meanwhile
fails its first statement, before anything is written, and the branch connects anew.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

C = TypeVar("C")


class Spare(Generic[C]):
    def __init__(self, make: Callable[[], C]) -> None:
        self._make = make
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._next: Future[C] | None = None

    def take(self) -> C | None:
        """The spare connection, or None when there is none (or making it failed: connect anew)."""
        with self._lock:
            pending, self._next = self._next, None
        if pending is None:
            return None
        try:
            return pending.result()
        except Exception as exc:  # noqa: BLE001 - the caller connects itself and reports that error
            log.debug("spare branch connection failed: %s", exc)
            return None

    def refill(self) -> None:
        """Start making the next spare (in the background) unless one is there or on its way."""
        with self._lock:
            if self._next is not None:
                return
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix="xasink-spare")
            self._next = self._pool.submit(self._make)
