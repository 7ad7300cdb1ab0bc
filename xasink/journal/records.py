"""The values the decision log hands the protocol: a batch's decision, and the claims of the runs of a batch."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

from xasink.protocol.xid import Xid
from xasink.results import EarlierCommit

COMMITTING = "committing"
COMMITTED = "committed"


@dataclass(frozen=True)
class BatchRecord:
    sink_id: str
    batch_id: int
    state: str
    xids: tuple[Xid, ...]
    rows: int = 0
    branches: int = 0
    prepare_ms: int = 0
    commit_ms: int | None = None
    decided_at: datetime | None = None
    committed_at: datetime | None = None

    @property
    def committed(self) -> bool:
        return self.state == COMMITTED

    def earlier(self) -> EarlierCommit:
        """What this decided batch wrote, as a rerun that skips it reports it (labelled as earlier)."""
        runs = sorted({x.run for x in self.xids})
        timings = {"prepare": self.prepare_ms / 1000}
        if self.commit_ms is not None:
            timings["commit"] = self.commit_ms / 1000
        return EarlierCommit(
            self.rows,
            self.branches,
            utc_second(self.decided_at),
            utc_second(self.committed_at),
            ",".join(runs) or None,
            timings,
        )


def utc_second(at: datetime | None) -> datetime | None:
    """A log's timestamp as the user is shown it, alike on both databases: aware UTC, in whole seconds (the log
    stamps UTC; PostgreSQL keeps microseconds and MariaDB hands it back without a zone)."""
    if at is None:
        return None
    aware = at.replace(tzinfo=timezone.utc) if at.utcoffset() is None else at.astimezone(timezone.utc)
    return aware.replace(microsecond=0)


@dataclass(frozen=True)
class DecisionState:
    """What deciding a batch reads under the sink lock (:meth:`Journal.decision_state`)."""

    log_id: str  # the log's identity
    decision: BatchRecord | None  # the batch's decision, if any
    target: str | None  # what the decided batch wrote, as recorded (None: not decided, or an older log)
    holder: str | None  # the run holding the batch (None: no claim, or trimmed)
    mine: bool | None = None  # the asking run's claim: True superseded, False held, None no claim

    def holds(self) -> bool:
        """Whether the run it was read for may decide the undecided batch: it holds the claim, or it has none
        and takes the batch over as it decides, as its first task would have (a run whose tasks were all empty
        never claimed; a run new to a batch supersedes the others).  A run that was taken over (or aborted)
        never may, whatever its xid list holds: an empty list proves nothing."""
        return self.decision is None and self.mine is not True


@dataclass(frozen=True)
class ClaimState:
    superseded: bool  # taken over, or aborted: the run can never decide
    guard: str | None  # the session lock its driver holds while it lives
    claimed_at: datetime  # server clock, UTC
