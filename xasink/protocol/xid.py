"""The xid of one branch: one value, one encoding, parsed to decide ownership.

gtrid names the batch (``xasink:<sink>:<batch>``), shared by all its
branches as XA intends; bqual names the decision log that owns the branch and
the partition attempt (``<log>:<partition>:<attempt>``).  PostgreSQL gets
``gtrid/bqual`` as its gid; MySQL gets the two parts with :data:`FORMAT_ID`.
Anything that does not parse exactly is foreign and is never touched; a branch
of another decision log parses, and is left to that log (its ``log_id``
differs).

The log id sits in bqual, not gtrid, because MySQL caps each part at 64 bytes
and the gtrid is already 59 at the longest sink id and batch id.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass

FORMAT_ID = 0x78617331  # "xas1"
PREFIX = "xasink"
MAX_SINK_ID = 32
SINK_ID_RE = re.compile(r"[A-Za-z0-9_.\-]{1,32}")
ATTEMPT_RE = re.compile(r"[0-9]{1,19}-[0-9a-f]{8}")
LOG_ID_RE = re.compile(r"[0-9a-f]{10}")
_GTRID_RE = re.compile(r"xasink:(?P<sink>[A-Za-z0-9_.\-]{1,32}):(?P<batch>0|[1-9][0-9]{0,18})")
_BQUAL_RE = re.compile(r"(?P<log>[0-9a-f]{10}):(?P<part>0|[1-9][0-9]{0,9}):(?P<attempt>[0-9]{1,19}-[0-9a-f]{8})")
_GID_RE = re.compile(_GTRID_RE.pattern + "/" + _BQUAL_RE.pattern)
MAX_BATCH_ID = 2**63 - 1


def valid_sink_id(value: str) -> bool:
    return SINK_ID_RE.fullmatch(value) is not None


def valid_log_id(value: str) -> bool:
    return LOG_ID_RE.fullmatch(value) is not None


def new_log_id() -> str:
    """A decision log's identity, drawn once when the log is created (40 random bits)."""
    return secrets.token_hex(5)


def new_run_nonce() -> str:
    """A nonce per writer run (one per batch write or micro-batch plan), shared by its tasks."""
    return secrets.token_hex(4)


def attempt_token(task_attempt_id: int, run: str) -> str:
    """Spark's task attempt id (unique in an application) plus the run nonce (unique per run)."""
    return f"{task_attempt_id}-{run}"


@dataclass(frozen=True, order=True)
class Xid:
    log_id: str
    sink_id: str
    batch_id: int
    partition: int
    attempt: str

    def __post_init__(self) -> None:
        if not valid_log_id(self.log_id):
            raise ValueError(f"invalid log id {self.log_id!r}")
        if not valid_sink_id(self.sink_id):
            raise ValueError(f"invalid sink id {self.sink_id!r}")
        if not 0 <= self.batch_id <= MAX_BATCH_ID:
            raise ValueError(f"batch id out of range: {self.batch_id}")
        if not 0 <= self.partition < 10**10:
            raise ValueError(f"partition out of range: {self.partition}")
        if ATTEMPT_RE.fullmatch(self.attempt) is None:
            raise ValueError(f"invalid attempt token {self.attempt!r}")

    @property
    def task_attempt_id(self) -> int:
        return int(self.attempt.split("-", 1)[0])

    @property
    def run(self) -> str:
        return self.attempt.split("-", 1)[1]

    @property
    def gtrid(self) -> str:
        return f"{PREFIX}:{self.sink_id}:{self.batch_id}"

    @property
    def bqual(self) -> str:
        return f"{self.log_id}:{self.partition}:{self.attempt}"

    @property
    def gid(self) -> str:
        """PostgreSQL's single transaction identifier."""
        return f"{self.gtrid}/{self.bqual}"

    def __str__(self) -> str:
        return self.gid

    @classmethod
    def parse(cls, gid: str) -> Xid | None:
        """The xid a PostgreSQL gid encodes, or None when it is not ours."""
        m = _GID_RE.fullmatch(gid)
        if m is None:
            return None
        try:  # the pattern admits a 19-digit batch above 2**63-1: foreign too, never an exception
            return cls(m["log"], m["sink"], int(m["batch"]), int(m["part"]), m["attempt"])
        except ValueError:
            return None

    @classmethod
    def from_xa(cls, format_id: int, gtrid: bytes, bqual: bytes) -> Xid | None:
        """The xid an XA RECOVER row encodes, or None when it is not ours."""
        if format_id != FORMAT_ID:
            return None
        try:
            return cls.parse(gtrid.decode("ascii") + "/" + bqual.decode("ascii"))
        except UnicodeDecodeError:
            return None
