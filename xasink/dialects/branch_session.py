"""A branch as every dialect opens one: an XA transaction on one connection, loaded, then prepared or rolled back."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import TYPE_CHECKING

from xasink.dialects.values import TargetPlan
from xasink.protocol.xid import Xid

if TYPE_CHECKING:  # rows only: the driver's commit path never loads pyarrow
    import pyarrow as pa


class BranchSession(ABC):
    """One XA branch on its own connection, owned by one task attempt."""

    def __init__(self, xid: Xid, plan: TargetPlan) -> None:
        self.xid = xid
        self.plan = plan

    def reserve_slot(self) -> None:
        """Before any row is loaded: a PreflightError if the server could not prepare this branch for lack of
        a prepared-transaction slot, counting the other open branches.  Servers without such a limit: nothing."""
        return

    @abstractmethod
    def hold_prepare_lock(self, names: list[str]) -> None:
        """Take one of ``names``, the run's prepare lock (xasink.protocol.prepare_lock), in this branch's session,
        kept until the session ends: after PREPARE, or when the server ends a PREPARE its client left running."""

    @abstractmethod
    def load(self, batches: Iterator[pa.RecordBatch]) -> int:
        """Load rows inside the branch; returns the number of rows."""

    @abstractmethod
    def prepare(self) -> None:
        """End and PREPARE the branch, verify it is prepared, and disconnect."""

    @abstractmethod
    def rollback(self) -> None:
        """Roll back an unprepared branch and disconnect; never raises."""
