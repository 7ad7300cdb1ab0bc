"""Values handed between the executors, the driver and the user."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime

from xasink.protocol.xid import Xid


@dataclass(frozen=True)
class BranchOutcome:
    """What one task attempt reports to the driver: its prepared branch, or why it has none."""

    partition: int
    gid: str | None  # the prepared branch; None when the partition was empty or the batch already decided
    rows: int = 0
    skipped: bool = False  # the batch was already decided: nothing written
    seconds: float = 0.0  # load + prepare time in the task
    query: str | None = None  # the streaming query's id, when the task runs in one (recorded with the batch)
    run: str | None = None  # the writer run of the task: the one that may decide the batch, even with no branch
    warnings: tuple[str, ...] = ()  # what the task logged at WARNING or above: the driver reports it (notices)

    @property
    def xid(self) -> Xid | None:
        return Xid.parse(self.gid) if self.gid else None


@dataclass(frozen=True)
class EarlierCommit:
    """What an earlier run committed of a batch that this run skipped (a rerun of a committed batch writes
    nothing): its figures as the decision log recorded them; its times by the server's clock, aware UTC datetimes
    in whole seconds on every database."""

    rows: int
    branches: int
    decided_at: datetime | None = None
    committed_at: datetime | None = None
    run: str | None = None  # the writer run that decided it (its branches' run nonce); None: no branch, or trimmed
    timings: dict[str, float] = field(default_factory=dict)  # prepare, commit: seconds, as recorded

    def __str__(self) -> str:
        when = f" at {self.committed_at.strftime('%Y-%m-%dT%H:%M:%S')} UTC" if self.committed_at else ""
        by = f" by run {self.run}" if self.run else ""
        times = "".join(f", {k} {v:.3f}s" for k, v in self.timings.items())
        return f"committed earlier{when}{by}: {self.rows} rows in {self.branches} branches{times}"


@dataclass(frozen=True)
class WriteResult:
    """The outcome of one batch, as ``xasink.write`` returns it and the log reports it.

    ``rows``, ``branches`` and ``timings`` are this run's: for a skipped batch (``skipped``: committed before,
    this run wrote nothing) ``rows`` and ``branches`` are 0 and ``earlier`` says what the earlier run
    committed, when and by which run."""

    sink_id: str
    batch_id: int
    rows: int
    branches: int
    skipped: bool = False
    timings: dict[str, float] = field(default_factory=dict)
    # what the user must know though the batch committed (a durability risk of the server, retries after the
    # decision, a sweep that failed): also shown as XasinkWarning and logged in the caller's process
    warnings: tuple[str, ...] = ()
    earlier: EarlierCommit | None = None  # a skipped batch: what the run that committed it wrote

    def __str__(self) -> str:
        if self.skipped:
            what = "skipped, nothing written" + (f" ({self.earlier})" if self.earlier else " (committed earlier)")
        else:
            what = f"committed {self.rows} rows in {self.branches} branches"
        times = ", ".join(f"{k} {v:.3f}s" for k, v in self.timings.items())
        warned = f"; {len(self.warnings)} warnings" if self.warnings else ""
        return f"sink {self.sink_id} batch {self.batch_id}: {what}" + (f" ({times})" if times else "") + warned


@dataclass(frozen=True)
class TargetResult:
    """One write of a multi-target transaction: where it went and what it prepared."""

    part: int
    server: str  # the database, as its server names itself
    table: str  # schema.table
    rows: int
    branches: int
    timings: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class TransactionResult:
    """The outcome of one multi-target transaction (``xasink.transaction``): all its writes, or none."""

    sink_id: str
    batch_id: int
    skipped: bool  # a replay of a committed transaction: nothing written
    targets: tuple[TargetResult, ...] = ()
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def rows(self) -> int:
        return sum(t.rows for t in self.targets)

    @property
    def branches(self) -> int:
        return sum(t.branches for t in self.targets)

    def __str__(self) -> str:
        what = (
            "skipped (already committed)" if self.skipped else f"committed {self.rows} rows in {self.branches} branches"
        )
        where = "; ".join(f"{t.table}@{t.server}: {t.rows} rows" for t in self.targets)
        return f"sink {self.sink_id} transaction {self.batch_id}: {what}" + (f" ({where})" if where else "")


def total_since(started: float | None) -> dict[str, float]:
    """A write's total so far, from when it began (wall clock: it began in another process); none unknown."""
    return {"total": max(0.0, time.time() - started)} if started is not None else {}
