"""The decision log: which batches of which sinks are decided, with their branch lists.

Five small tables in the target database (``<prefix>parts``, for multi-target transactions, is
:mod:`xasink.journal.parts`), written on the driver in short
ordinary transactions, never inside a branch:

* ``<prefix>log``: one row, the log's identity (a random id drawn when the
  log is created).  Every branch carries it in its xid, and this log commits
  or rolls back only branches that carry it: another log on the same server
  (another schema, prefix or database; XA on MySQL is server-wide) never
  touches them.

* ``<prefix>sinks``: one row per sink.  Its row lock serializes deciding a
  batch against rolling back undecided branches (DESIGN invariant 4).
* ``<prefix>batches``: one row per decided (sink, batch), kept forever:
  state ``committing`` (decided) or ``committed``, the exact xid list,
  figures, and what the batch wrote (``target``).  Its primary key makes a
  second decision for the same batch impossible (invariant 3).  Retention
  only *compacts* old committed rows (empties their xid list, drops their
  claims): the fact that (sink, batch) was committed is never forgotten, so
  a rerun of any committed batch id, in any order, writes nothing.
* ``<prefix>claims``: which writer runs took part in an undecided (sink,
  batch), and which one holds it now.  A run's first task takes the batch
  over (rolling back what other runs prepared); a run that was taken over
  can never come back, so two writers of one batch cannot both lose.

The tables' layout, creation, upgrade, identity and trim are :mod:`xasink.journal.tables`; what a batch
writes, as recorded with it, is :mod:`xasink.journal.targets`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import cast

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from xasink.dialects.base import Dialect
from xasink.errors import ConcurrentWriterError, JournalError, PreflightError
from xasink.journal.claims import JournalClaims
from xasink.journal.records import COMMITTED, COMMITTING, BatchRecord, ClaimState, DecisionState
from xasink.journal.targets import deciding_run, taken_over_message
from xasink.protocol.xid import Xid, valid_log_id


class Journal(JournalClaims):
    """The protocol's reads and writes in the decision log; the runs' claims come from
    :class:`~xasink.journal.claims.JournalClaims`, set-up, identity and trim from
    :class:`~xasink.journal.tables.JournalTables`."""

    def __init__(
        self,
        dialect: Dialect,
        schema: str | None = None,
        prefix: str = "xasink_",
        known_sinks: set[str] | None = None,
    ) -> None:
        """``known_sinks``: the sinks registered already, shared by the journals of one long-lived dialect (a
        sink row that vanished since, with a log made anew, is registered again by :meth:`locked_sink`)."""
        super().__init__(dialect, schema, prefix)
        self._known_sinks: set[str] = known_sinks if known_sinks is not None else set()

    # -- reads ------------------------------------------------------------------
    def _select(self) -> sa.Select[tuple[object, ...]]:
        """The batch columns every layout has: readers (``xasink status``) may meet a log not upgraded yet."""
        return sa.select(*(c for c in self.batches.c if c.name not in ("compacted", "target")))

    def _record(self, row: sa.Row[tuple[object, ...]]) -> BatchRecord:
        m = row._mapping
        xids = tuple(x for x in (Xid.parse(g) for g in json.loads(m["xids"])) if x is not None)
        return BatchRecord(
            m["sink_id"],
            int(m["batch_id"]),
            m["state"],
            xids,
            int(m["rows"]),
            int(m["branches"]),
            int(m["prepare_ms"]),
            m["commit_ms"],
            m["decided_at"],
            m["committed_at"],
        )

    def get(self, conn: Connection, sink_id: str, batch_id: int, lock: bool = False) -> BatchRecord | None:
        """The batch's decision; ``lock``: a locking read, which waits for a concurrent apply's mark and sees it
        (a plain read inside a transaction may see an older snapshot on InnoDB)."""
        b = self.batches.c
        q = self._select().where(b.sink_id == sink_id, b.batch_id == batch_id)
        row = conn.execute(q.with_for_update() if lock else q).first()
        return self._record(row) if row is not None else None

    def get_many(self, conn: Connection, sink_id: str, batch_ids: set[int]) -> dict[int, BatchRecord]:
        if not batch_ids:
            return {}
        b = self.batches.c
        rows = conn.execute(self._select().where(b.sink_id == sink_id, b.batch_id.in_(sorted(batch_ids))))
        return {int(r._mapping["batch_id"]): self._record(r) for r in rows}

    def last_batch_id(self, conn: Connection, sink_id: str) -> int | None:
        """The sink's highest decided batch: in a stream every batch below it is settled."""
        b = self.batches.c
        value = conn.execute(sa.select(sa.func.max(b.batch_id)).where(b.sink_id == sink_id)).scalar()
        return int(value) if value is not None else None

    def pending(self, conn: Connection, sink_id: str | None = None) -> list[BatchRecord]:
        """Decided batches not yet marked committed, in the order they were decided (batch ids come in any
        order): recovery applies them so (DESIGN invariant 12)."""
        b = self.batches.c
        q = self._select().where(b.state == COMMITTING)
        if sink_id is not None:
            q = q.where(b.sink_id == sink_id)
        return [self._record(r) for r in conn.execute(q.order_by(b.sink_id, b.decided_at, b.batch_id))]

    def pending_targets(self, conn: Connection) -> list[tuple[str, int, str | None]]:
        """(sink, batch, recorded target) of every decided batch of the log not yet marked committed: what a
        decision checks for older batches of its table still to take effect."""
        b = self.batches.c
        q = sa.select(b.sink_id, b.batch_id, b.target).where(b.state == COMMITTING)
        return [(str(r[0]), int(r[1]), r[2]) for r in conn.execute(q.order_by(b.decided_at, b.batch_id))]

    def recent(self, conn: Connection, sink_id: str | None = None, limit: int = 20) -> list[BatchRecord]:
        b = self.batches.c
        q = self._select()
        if sink_id is not None:
            q = q.where(b.sink_id == sink_id)
        q = q.order_by(b.decided_at.desc(), b.batch_id.desc()).limit(limit)
        return [self._record(r) for r in conn.execute(q)]

    def sink_ids(self, conn: Connection) -> list[str]:
        return [r[0] for r in conn.execute(sa.select(self.sinks.c.sink_id).order_by(self.sinks.c.sink_id))]

    # -- the serialization point --------------------------------------------------
    def _ensure_sink(self, conn: Connection, sink_id: str) -> None:
        if sink_id in self._known_sinks:
            return
        found = conn.execute(sa.select(self.sinks.c.sink_id).where(self.sinks.c.sink_id == sink_id)).first()
        conn.rollback()
        if found is None:
            try:
                with conn.begin():
                    conn.execute(self.sinks.insert().values(sink_id=sink_id, created_at=self.dialect.utc_now()))
            except sa.exc.IntegrityError:
                pass  # inserted concurrently
        self._known_sinks.add(sink_id)

    @contextmanager
    def locked(self, sink_id: str) -> Iterator[Connection]:
        """A transaction holding the sink's row lock: decide and abort-undecided both run inside one."""
        with self.locked_sink(sink_id) as (conn, _):
            yield conn

    @contextmanager
    def locked_sink(self, sink_id: str) -> Iterator[tuple[Connection, int | None]]:
        """:meth:`locked`, with the sink's ``horizon`` read by the statement that takes the lock (the newest
        value: a locking read sees the latest committed row, on PostgreSQL and InnoDB alike)."""
        s = self.sinks.c
        lock = sa.select(s.sink_id, s.horizon).where(s.sink_id == sink_id).with_for_update()
        with self.dialect.connect() as conn:
            self._ensure_sink(conn, sink_id)
            with conn.begin():
                row = conn.execute(lock).first()
                if row is None:  # registered earlier in this process, but the log was made anew since
                    try:
                        with conn.begin_nested():
                            conn.execute(self.sinks.insert().values(sink_id=sink_id, created_at=self.dialect.utc_now()))
                    except sa.exc.IntegrityError:
                        pass  # inserted concurrently
                    row = conn.execute(lock).first()
                    if row is None:
                        raise JournalError(f"cannot register sink {sink_id} in {self.sinks.fullname}")
                yield conn, (int(row[1]) if row[1] is not None else None)

    def run_superseded(self, sink_id: str, batch_id: int, run: str) -> bool | None:
        """:meth:`superseded`, read now on a connection of its own (a fresh snapshot: an abort committed
        before this call is seen)."""
        with self.dialect.connect(autocommit=True) as conn:
            return self.superseded(conn, sink_id, batch_id, run)

    def batch_view(self, conn: Connection, sink_id: str, batch_id: int) -> tuple[bool, str | None, int | None]:
        """In one round trip: whether (sink, batch) is decided, its recorded target, and the sink's horizon."""
        b, s = self.batches.c, self.sinks.c
        batch = b.sink_id == sink_id, b.batch_id == batch_id
        decided = sa.exists().where(*batch)
        target = sa.select(b.target).where(*batch).scalar_subquery()
        horizon = sa.select(s.horizon).where(s.sink_id == sink_id).scalar_subquery()
        row = conn.execute(sa.select(decided, target, horizon)).one()
        return bool(row[0]), row[1], (int(row[2]) if row[2] is not None else None)

    def claim_view(
        self, conn: Connection, sink_id: str, batch_id: int, run: str
    ) -> tuple[bool, str | None, bool | None]:
        """In one round trip, under the sink lock: whether (sink, batch) is decided, its recorded target (as
        :meth:`target_of`), and whether ``run``'s claim of it is superseded (None: the run has no claim yet)."""
        b, c = self.batches.c, self.claims.c
        batch = b.sink_id == sink_id, b.batch_id == batch_id
        decided = sa.exists().where(*batch)
        target = sa.select(b.target).where(*batch).scalar_subquery()
        superseded = (
            sa.select(c.superseded).where(c.sink_id == sink_id, c.batch_id == batch_id, c.run == run).scalar_subquery()
        )
        row = conn.execute(sa.select(decided, target, superseded)).one()
        return bool(row[0]), row[1], (bool(row[2]) if row[2] is not None else None)

    def settle_view(
        self, conn: Connection, sink_id: str, batch_id: int, run: str
    ) -> tuple[BatchRecord | None, ClaimState | None] | None:
        """In one round trip, under the sink lock: the batch's decision and ``run``'s claim of it (what
        :meth:`get` and :meth:`claim_states` read for a task's late check); None if the log has no identity row."""
        b, c, lg = self.batches.c, self.claims.c, self.logs.c
        cols = [col for col in self.batches.c if col.name not in ("compacted", "target")]
        # the claim's columns as scalar subqueries on its key, not a second outer join: SQLAlchemy's MySQL
        # compiler lints a nested join as a cartesian product and prints an SAWarning on every late check
        mine = c.sink_id == sink_id, c.batch_id == batch_id, c.run == run
        claim_cols = [sa.select(col).where(*mine).scalar_subquery() for col in (c.superseded, c.guard, c.claimed_at)]
        joined = self.logs.outerjoin(self.batches, sa.and_(b.sink_id == sink_id, b.batch_id == batch_id))
        q = sa.select(*cols, *claim_cols).select_from(joined).where(lg.slot == 1)
        row = cast("sa.Row[tuple[object, ...]] | None", conn.execute(q).first())
        if row is None:
            return None
        record = self._record(row) if row._mapping["sink_id"] is not None else None
        superseded, guard, claimed_at = row[len(cols)], row[len(cols) + 1], row[len(cols) + 2]
        claim = None
        if superseded is not None:
            assert isinstance(claimed_at, datetime)
            claim = ClaimState(bool(superseded), str(guard) if guard is not None else None, claimed_at)
        return record, claim

    def target_of(self, conn: Connection, sink_id: str, batch_id: int) -> tuple[bool, str | None]:
        """(decided, what it wrote): whether the log holds (sink, batch), and its recorded target (None when
        a log made by an older xasink did not record it)."""
        b = self.batches.c
        row = conn.execute(sa.select(b.target).where(b.sink_id == sink_id, b.batch_id == batch_id)).first()
        return (False, None) if row is None else (True, row[0])

    def decision_state(self, conn: Connection, sink_id: str, batch_id: int, run: str | None = None) -> DecisionState:
        """In one round trip, under the sink lock: the log's identity, the batch's decision with its recorded
        target, the run holding the batch, and ``run``'s own claim (what :meth:`log_id`, :meth:`get`,
        :meth:`target_of`, :meth:`holder` and :meth:`claim_view` read)."""
        b, c, lg = self.batches.c, self.claims.c, self.logs.c
        holder = (
            sa.select(c.run)
            .where(c.sink_id == sink_id, c.batch_id == batch_id, c.superseded.is_(False))
            .limit(1)
            .scalar_subquery()
        )
        mine = (
            sa.select(c.superseded)
            .where(c.sink_id == sink_id, c.batch_id == batch_id, c.run == (run or ""))
            .scalar_subquery()
        )
        q = (
            sa.select(lg.log_id, holder.label("xasink_holder"), mine.label("xasink_mine"), *self.batches.c)
            .select_from(self.logs.outerjoin(self.batches, sa.and_(b.sink_id == sink_id, b.batch_id == batch_id)))
            .where(lg.slot == 1)
        )
        row = conn.execute(q).first()
        if row is None or row[0] is None or not valid_log_id(str(row[0])):
            raise PreflightError(
                f"the decision log's identity in {self.logs.fullname} is missing or malformed "
                f"({row[0] if row is not None else None!r}); it must hold one row with a 10-hex-digit log_id. "
                "Restore it: every prepared branch of this log carries it."
            )
        m = row._mapping
        record = self._record(row) if m["sink_id"] is not None else None
        target = m["target"] if record is not None else None
        superseded = m["xasink_mine"]
        return DecisionState(
            str(row[0]), record, target, m["xasink_holder"], bool(superseded) if superseded is not None else None
        )

    def record_decision(
        self, conn: Connection, state: DecisionState, record: BatchRecord, run: str, target: str | None
    ) -> None:
        """The one place a decision is recorded, for a single table and a multi-target transaction alike.

        ``conn`` holds the sink lock (:meth:`locked_sink`) and ``state`` was read in its transaction by
        :meth:`decision_state` for ``run``.  Only the run holding the batch's claim decides (DESIGN invariant
        8): the xid list is what is committed, never evidence of who may commit.  A run with no claim (its
        tasks were all empty) takes the batch over in the same transaction.  Raises
        :class:`ConcurrentWriterError` and changes nothing when ``run`` may not decide.  The caller sends the
        COMMIT (leaving the lock); a failure there is settled by :meth:`decided_by`.
        """
        if state.decision is not None:
            raise ConcurrentWriterError(
                f"sink {record.sink_id} batch {record.batch_id} was decided by another writer first; this "
                "attempt decided nothing"
            )
        if not state.holds():
            raise ConcurrentWriterError(taken_over_message(record.sink_id, record.batch_id, run))
        if state.mine is None:
            self.take_over(conn, record.sink_id, record.batch_id, run)
        self.dialect.durable_commit(conn)
        self.insert_decision(conn, record, target)

    def decided_by(self, conn: Connection, sink_id: str, batch_id: int, run: str) -> BatchRecord | None:
        """Under the sink lock, after a decision's COMMIT failed: the batch's decision if ``run`` recorded it,
        else None.  Nobody takes a decided batch over, so the run still holds its claim exactly when its
        own decision went through; a decision whose runs merely include ``run``'s (an empty one) is not it."""
        state = self.decision_state(conn, sink_id, batch_id, run)
        if state.decision is not None and state.mine is False:
            return state.decision
        if state.decision is not None and state.mine is None and deciding_run(state.target) == run:
            return state.decision  # compacted since (its claims dropped): the run recorded with it tells
        return None

    def horizon(self, conn: Connection, sink_id: str) -> int | None:
        """Batch ids up to this one that the log does not hold may have been committed (an old log's trim)."""
        value = conn.execute(sa.select(self.sinks.c.horizon).where(self.sinks.c.sink_id == sink_id)).scalar()
        return int(value) if value is not None else None

    def insert_decision(self, conn: Connection, record: BatchRecord, target: str | None = None) -> None:
        conn.execute(
            self.batches.insert().values(
                sink_id=record.sink_id,
                batch_id=record.batch_id,
                state=COMMITTING,
                xids=json.dumps([x.gid for x in record.xids]),
                rows=record.rows,
                branches=record.branches,
                prepare_ms=record.prepare_ms,
                decided_at=self.dialect.utc_now(),
                compacted=False,
                target=target,
            )
        )

    def mark_committed(self, conn: Connection, sink_id: str, batch_id: int, commit_ms: int | None) -> bool:
        """Mark a decided batch committed; False when it already was (a concurrent recovery, or a retry of a
        mark whose COMMIT went through but whose reply was lost).

        Raises :class:`JournalError` when the log holds no decided batch to mark: the decision being finished
        was deleted or changed behind xasink's back, and saying nothing would hide it.
        """
        b = self.batches.c
        res = conn.execute(
            self.batches.update()
            .where(b.sink_id == sink_id, b.batch_id == batch_id, b.state == COMMITTING)
            .values(state=COMMITTED, commit_ms=commit_ms, committed_at=self.dialect.utc_now())
        )
        conn.commit()
        if res.rowcount == 1:
            return True
        found = self.get(conn, sink_id, batch_id)  # a new transaction: sees what committed meanwhile
        conn.rollback()
        if found is not None and found.committed:
            return False
        what = "no row for it" if found is None else f"it in state {found.state!r}"
        raise JournalError(
            f"marking sink {sink_id} batch {batch_id} committed changed {res.rowcount} rows of "
            f"{self.batches.fullname}: the log holds {what}. Its decided branches were committed, but the "
            "decision was deleted or changed by something other than xasink (by hand, or a trim by another "
            "writer of the same sinkId): a rerun of this batch would write its rows again. Check the table "
            "and run one writer per sinkId."
        )

    def recorded_target(self, conn: Connection, sink_id: str, batch_id: int) -> str | None:
        """What a decided batch wrote, as recorded (for an overwrite or change-data batch: its apply step)."""
        b = self.batches.c
        value = conn.execute(sa.select(b.target).where(b.sink_id == sink_id, b.batch_id == batch_id)).scalar()
        return str(value) if value is not None else None

    def mark_within(self, conn: Connection, sink_id: str, batch_id: int, commit_ms: int | None) -> bool:
        """Mark a decided batch committed inside the caller's transaction (which also applies the batch's rows);
        False when it is not decided-and-uncommitted any more.  The row lock this takes makes a concurrent
        applier wait, then find nothing to do.  The apply step recorded with the target is dropped: the log
        keeps one row per batch forever, and only a pending batch needs it."""
        b = self.batches.c
        locked = sa.select(b.target).where(b.sink_id == sink_id, b.batch_id == batch_id, b.state == COMMITTING)
        target = conn.execute(locked.with_for_update()).first()
        if target is None:
            return False
        kept = target[0]
        if kept:
            try:
                ident = json.loads(kept)
                ident.pop("apply", None)
                kept = json.dumps(ident, sort_keys=True)
            except (ValueError, AttributeError):
                pass
        res = conn.execute(
            self.batches.update()
            .where(b.sink_id == sink_id, b.batch_id == batch_id, b.state == COMMITTING)
            .values(state=COMMITTED, commit_ms=commit_ms, committed_at=self.dialect.utc_now(), target=kept)
        )
        return res.rowcount == 1

    def withdraw(self, conn: Connection, sink_id: str, batch_id: int) -> bool:
        """Delete a decision whose apply can never succeed (the batch changed nothing): under the sink lock."""
        b = self.batches.c
        res = conn.execute(
            self.batches.delete().where(b.sink_id == sink_id, b.batch_id == batch_id, b.state == COMMITTING)
        )
        return res.rowcount == 1
