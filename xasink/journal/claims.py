"""The claims of writer runs on a batch: which runs took part in an undecided (sink, batch), and which holds it.

A run's first task takes the batch over (superseding every other run's claim, so their branches are dead to
recovery); a run that was taken over (or aborted: :meth:`JournalClaims.end_run`) can never decide.  Claims are
written under the sink lock of :class:`~xasink.journal.log.Journal`.
"""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from xasink.journal.records import ClaimState
from xasink.journal.tables import JournalTables


class JournalClaims(JournalTables):
    """The claims table's reads and writes."""

    def claim(self, conn: Connection, sink_id: str, batch_id: int, run: str, guard: str | None = None) -> bool:
        """Make ``run`` the holder of an undecided batch, under the sink lock; False if it was taken over.

        A run new to the batch supersedes every earlier one (a crashed run's replay, or a concurrent
        writer: the later one wins).  A superseded run stays superseded, so its tasks and its decision fail.
        """
        c = self.claims.c
        mine = c.sink_id == sink_id, c.batch_id == batch_id
        superseded = conn.execute(sa.select(c.superseded).where(*mine, c.run == run)).scalar()
        if superseded is not None:
            return not superseded
        self.take_over(conn, sink_id, batch_id, run, guard)
        return True

    def take_over(self, conn: Connection, sink_id: str, batch_id: int, run: str, guard: str | None = None) -> None:
        """:meth:`claim` for a run that has no claim of the batch yet (as :meth:`claim_view` read it).

        The runs holding the batch are read plainly, then superseded one by one by their whole key: a search
        of the (sink, batch) range (``run != me``) locks on InnoDB the gap where the next sink's claims go, and
        claims of sinks side by side waited for, or deadlocked on, each other.  The read must see every claim:
        a caller's transaction reads plainly only after the sink lock was granted (InnoDB takes its snapshot
        at the first plain read), and under the sink lock no claim of the batch can appear."""
        c = self.claims.c
        mine = c.sink_id == sink_id, c.batch_id == batch_id
        holders = conn.execute(sa.select(c.run).where(*mine, c.run != run, c.superseded.is_(False))).scalars()
        for other in sorted(holders):
            conn.execute(self.claims.update().where(*mine, c.run == other).values(superseded=True))
        conn.execute(
            self.claims.insert().values(
                sink_id=sink_id,
                batch_id=batch_id,
                run=run,
                superseded=False,
                claimed_at=self.dialect.utc_now(),
                guard=guard,
            )
        )

    def claimed_at(self, conn: Connection, sink_id: str, batch_ids: set[int]) -> dict[tuple[int, str], datetime]:
        """When each run claimed each batch, by the server's clock: the age of branches XA RECOVER does not date.

        A run claims its batch before any of its branches opens, so this is an upper bound of their age.
        """
        if not batch_ids or not sa.inspect(conn).has_table(self.claims.name, schema=self.claims.schema):
            return {}
        c = self.claims.c
        q = sa.select(c.batch_id, c.run, c.claimed_at).where(c.sink_id == sink_id, c.batch_id.in_(sorted(batch_ids)))
        return {(int(b), str(r)): t for b, r, t in conn.execute(q)}

    def claim_states(self, conn: Connection, sink_id: str, batch_ids: set[int]) -> dict[tuple[int, str], ClaimState]:
        """The claim of every run of these batches: what its liveness is judged by."""
        if not batch_ids:
            return {}
        c = self.claims.c
        q = sa.select(c.batch_id, c.run, c.superseded, c.guard, c.claimed_at).where(
            c.sink_id == sink_id, c.batch_id.in_(sorted(batch_ids))
        )
        return {(int(b), str(r)): ClaimState(bool(s), g, t) for b, r, s, g, t in conn.execute(q)}

    def end_run(self, conn: Connection, sink_id: str, batch_id: int, run: str) -> bool:
        """An aborted run can never decide: mark it superseded, so its late branches roll themselves back.

        False: the run has no claim to end (a log made anew, or its claims trimmed), so a task of it cannot
        tell that it ended (xasink.protocol.prepare_lock)."""
        c = self.claims.c
        ended = conn.execute(
            self.claims.update()
            .where(c.sink_id == sink_id, c.batch_id == batch_id, c.run == run)
            .values(superseded=True)
        )
        return bool(ended.rowcount)

    def superseded(self, conn: Connection, sink_id: str, batch_id: int, run: str) -> bool | None:
        """Whether ``run``'s claim of the batch is superseded (taken over, or its run ended); None: no claim."""
        c = self.claims.c
        q = sa.select(c.superseded).where(c.sink_id == sink_id, c.batch_id == batch_id, c.run == run)
        found = conn.execute(q).scalar()
        return None if found is None else bool(found)

    def holder(self, conn: Connection, sink_id: str, batch_id: int) -> str | None:
        """The run holding a batch now, or None when no run claimed it (or its claims were trimmed)."""
        c = self.claims.c
        q = sa.select(c.run).where(c.sink_id == sink_id, c.batch_id == batch_id, c.superseded.is_(False))
        return conn.execute(q).scalar()
