"""Retrying the steps of a decided batch: which errors are worth another try, and for how long.

Every step after a decision (a branch's COMMIT, the mark, the apply, re-reading the log) only goes forward: a
transient error is retried with capped exponential backoff and jitter until the step succeeds or its deadline
passes.  One policy per sink, shared by the group operations, the apply step and recovery, so a finish by
recovery behaves like one by the driver.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from xasink.dialects.base import Dialect
from xasink.dialects.values import ErrorKind
from xasink.errors import BatchAbortedError, ConnectError, XasinkError
from xasink.options import WriteOptions
from xasink.support.masking import redact, url_secrets

log = logging.getLogger("xasink.protocol.coordinator")  # the coordinator's steps: logged under its name

T = TypeVar("T")
BACKOFF_FIRST_S = 0.1  # the first retry's delay after the decision; doubled per retry ...
BACKOFF_CAP_S = 5.0  # ... up to this: an outage of minutes is noticed within seconds of its end


DEADLOCK_TRIES = 6  # a transaction the server rolled back as a deadlock's victim is run up to this many times


def again_if_deadlocked(
    dialect: Dialect,
    what: str,
    step: Callable[[], T],
    unwrap: Callable[[Exception], BaseException | None] | None = None,
) -> T:
    """Run one whole transaction of the decision log, again when the server rolled it back as a deadlock's
    victim.  InnoDB's gap locks make sinks that claim their first batches at the same moment deadlock on
    the claims table (seen with three sinks side by side on MariaDB): nothing was written, and another try,
    after a short random pause, succeeds.  A lock wait past controlLockTimeout is no deadlock: it fails.

    ``unwrap`` picks the database error out of what the step raises (None: not one to run again).  The
    errors raised while the deadlock was handled count too: InnoDB's rollback of the whole transaction
    drops its savepoints, so SQLAlchemy's ROLLBACK TO SAVEPOINT fails with 1305 over the 1213."""
    for attempt in range(DEADLOCK_TRIES):
        try:
            return step()
        except Exception as exc:
            if attempt == DEADLOCK_TRIES - 1 or not _deadlock_in(dialect, unwrap(exc) if unwrap else exc):
                raise
            delay = random.uniform(0.02, 0.1) * 2**attempt
            log.info("%s: the server rolled it back as a deadlock's victim; again in %.2f s", what, delay)
            time.sleep(delay)
    raise AssertionError("unreachable")


def _deadlock_in(dialect: Dialect, exc: BaseException | None) -> bool:
    """Whether ``exc``, or an error it was raised while handling, is a deadlock's (a few links deep)."""
    for _ in range(4):
        if exc is None:
            return False
        if dialect.deadlocked(exc):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


class RetryPolicy:
    """The dialect's judgement of an error, and the sink's commitTimeout / commitRetries budget.

    Messages it writes lose the secrets of the sink's URL and of the dialect's own (a transaction's decision
    log may be on another database than the write's target, with other credentials)."""

    def __init__(self, dialect: Dialect, options: WriteOptions) -> None:
        self.dialect = dialect
        self.sink_id = options.sink_id
        self.timeout_s = options.commit_timeout
        self.retries = options.commit_retries
        self._secrets = url_secrets(options.url) + url_secrets(dialect.url)

    def deadline(self) -> float:
        """commitTimeout from now, on the time.monotonic clock."""
        return time.monotonic() + self.timeout_s

    def transient(self, exc: BaseException) -> bool:
        """Worth retrying: the server unreachable or restarting, a connection cut, a lock or deadlock timeout."""
        return isinstance(exc, ConnectError) or self.dialect.classify(exc) == ErrorKind.TRANSIENT

    def describe(self, exc: BaseException) -> str:
        """An exception in one short line for a log or message, without the password: its first line, and the
        server's DETAIL where it gave one (PostgreSQL's: the key a unique index found twice)."""
        lines = str(exc).strip().splitlines()
        text = lines[0] if lines else ""
        detail = next((line.strip() for line in lines[1:] if line.startswith("DETAIL:")), "")
        text = f"{text[:300]} ({detail[:200]})" if detail else text[:300]
        return redact(f"{type(exc).__name__}: {text}", self._secrets)

    @contextmanager
    def never_raw(self, told: Callable[[str], str], lasting: type[XasinkError] | None = None) -> Iterator[None]:
        """Steps before anything is decided raise xasink errors only: any other (a lock wait past
        controlLockTimeout, a lost connection) is :class:`BatchAbortedError`, ``told(cause)`` saying what was
        not written and what to do.  With ``lasting``, an error not worth a retry (a missing privilege) is that
        class instead: running again cannot cure it."""
        try:
            yield
        except XasinkError:
            raise
        except Exception as exc:
            kind = lasting if lasting is not None and not self.transient(exc) else BatchAbortedError
            raise kind(told(self.describe(exc))) from exc

    def forward(self, what: str, step: Callable[[], T], deadline: float, retries: int | None = None) -> T:
        """Run a step of a decided batch, retrying transient errors until it succeeds, ``deadline``
        (time.monotonic) passes, or ``retries`` retries were made."""
        attempt = 0
        while True:
            try:
                return step()
            except Exception as exc:
                left = deadline - time.monotonic()
                if not self.transient(exc) or left <= 0 or (retries is not None and attempt >= retries):
                    raise
                delay = min(left, min(BACKOFF_CAP_S, BACKOFF_FIRST_S * 2**attempt) * random.uniform(0.5, 1.0))
                attempt += 1
                log.warning("%s failed (%s), retry %d in %.1f s", what, self.describe(exc), attempt, delay)
                time.sleep(delay)
