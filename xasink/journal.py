"""The decision log: which batches of which sinks are decided, with their branch lists.

Four small tables in the target database, written on the driver in short
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
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.dialects import mysql
from sqlalchemy.engine import Connection

from .dialects.base import Dialect
from .errors import JournalError, PreflightError
from .targets import (  # noqa: F401 - re-exported: callers name them from here
    describe_target,
    forgotten_message,
    identity_message,
    same_target,
    session_target,
    target_identity,
)
from .xid import Xid, new_log_id, valid_log_id

log = logging.getLogger(__name__)

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


@dataclass(frozen=True)
class DecisionState:
    """What deciding a batch reads under the sink lock (:meth:`Journal.decision_state`)."""

    log_id: str  # the log's identity
    decision: BatchRecord | None  # the batch's decision, if any
    target: str | None  # what the decided batch wrote, as recorded (None: not decided, or an older log)
    holder: str | None  # the run holding the batch (None: no claim, or trimmed)


@dataclass(frozen=True)
class ClaimState:
    superseded: bool  # taken over, or aborted: the run can never decide
    guard: str | None  # the session lock its driver holds while it lives
    claimed_at: datetime  # server clock, UTC


def journal_metadata(
    schema: str | None = None, prefix: str = "xasink_"
) -> tuple[sa.Table, sa.Table, sa.Table, sa.Table]:
    """The journal tables; ``xasink/sql/*.sql`` (``xasink ddl``) holds the same DDL for DBAs."""
    md = sa.MetaData(schema=schema)
    sinks = sa.Table(
        f"{prefix}sinks",
        md,
        sa.Column("sink_id", sa.String(32), primary_key=True),
        sa.Column("created_at", sa.DateTime, nullable=False),
        # batch ids up to this one may have been forgotten by an older xasink's trim (set when such a log
        # is upgraded): one of them not in the log is refused, never guessed.  NULL: nothing forgotten
        sa.Column("horizon", sa.BigInteger),
        mysql_engine="InnoDB",  # row locks and transactions (MySQL/MariaDB); ignored elsewhere
    )
    batches = sa.Table(
        f"{prefix}batches",
        md,
        sa.Column("sink_id", sa.String(32), primary_key=True),
        sa.Column("batch_id", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("state", sa.String(16), nullable=False),
        # MySQL's TEXT holds 64 KiB, a few hundred xids: LONGTEXT there
        sa.Column("xids", sa.Text().with_variant(mysql.LONGTEXT(), "mysql", "mariadb"), nullable=False),
        sa.Column("rows", sa.BigInteger, nullable=False),
        sa.Column("branches", sa.Integer, nullable=False),
        sa.Column("prepare_ms", sa.Integer, nullable=False),
        sa.Column("commit_ms", sa.Integer),
        sa.Column("decided_at", sa.DateTime, nullable=False),
        sa.Column("committed_at", sa.DateTime),
        # the xid list was emptied by retention (the batch is committed; only the fact is kept)
        sa.Column("compacted", sa.Boolean(create_constraint=False), nullable=False, server_default=sa.false()),
        # what the batch wrote: JSON {"db", "schema", "table"[, "query"]}; NULL in rows of older logs
        sa.Column("target", sa.Text),
        mysql_engine="InnoDB",
    )
    claims = sa.Table(
        f"{prefix}claims",
        md,
        sa.Column("sink_id", sa.String(32), primary_key=True),
        sa.Column("batch_id", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("run", sa.String(8), primary_key=True),
        sa.Column("superseded", sa.Boolean(create_constraint=False), nullable=False),
        sa.Column("claimed_at", sa.DateTime, nullable=False),
        # the session lock a live run's driver holds (xasink.liveness); NULL for runs that keep none
        sa.Column("guard", sa.String(64)),
        mysql_engine="InnoDB",
    )
    logs = sa.Table(
        f"{prefix}log",
        md,
        sa.Column("slot", sa.SmallInteger, primary_key=True, autoincrement=False),  # always 1: one row
        sa.Column("log_id", sa.String(10), nullable=False),
        sa.Column("created_at", sa.DateTime, nullable=False),
        mysql_engine="InnoDB",
    )
    return sinks, batches, claims, logs


def parts_table(md: sa.MetaData, prefix: str = "xasink_") -> sa.Table:
    """One row per write of a multi-target transaction (xasink.transaction): its target and prepared xids.

    Recorded by the write's commit without deciding; the transaction decides over all its parts at once,
    and recovery finishes each database's parts (``server``) against this one log.
    """
    return sa.Table(
        f"{prefix}parts",
        md,
        sa.Column("sink_id", sa.String(32), primary_key=True),
        sa.Column("batch_id", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("run", sa.String(8), primary_key=True),
        sa.Column("part", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("server", sa.String(300), nullable=False),  # the target database's server identity
        sa.Column("target", sa.Text, nullable=False),  # JSON {"db", "schema", "table"}
        sa.Column("xids", sa.Text().with_variant(mysql.LONGTEXT(), "mysql", "mariadb"), nullable=False),
        sa.Column("rows", sa.BigInteger, nullable=False),
        sa.Column("prepare_ms", sa.Integer, nullable=False),
        sa.Column("committed", sa.Boolean(create_constraint=False), nullable=False),
        mysql_engine="InnoDB",
    )


class Journal:
    def __init__(
        self,
        dialect: Dialect,
        schema: str | None = None,
        prefix: str = "xasink_",
        known_sinks: set[str] | None = None,
    ) -> None:
        """``known_sinks``: the sinks registered already, shared by the journals of one long-lived dialect (a
        sink row that vanished since, with a log made anew, is registered again by :meth:`locked_sink`)."""
        self.dialect = dialect
        self.sinks, self.batches, self.claims, self.logs = journal_metadata(schema, prefix)
        self.parts = parts_table(self.sinks.metadata, prefix)
        self._known_sinks: set[str] = known_sinks if known_sinks is not None else set()
        self._log_id: str | None = None

    @property
    def tables(self) -> tuple[sa.Table, ...]:
        return (self.logs, self.sinks, self.batches, self.claims)  # parts: made by a transaction (xasink.parts)

    # -- set-up ---------------------------------------------------------------
    def exists(self, conn: Connection) -> bool:
        return sa.inspect(conn).has_table(self.batches.name, schema=self.batches.schema)

    def _ready_log_id(self, conn: Connection) -> str | None:
        """The log's id when every table has every column of this layout, in one round trip; else None.

        What every batch pays: reflecting four tables and their columns costs a dozen catalogue queries.
        A missing table or column fails the statement; then :meth:`ensure` takes the long way.
        """
        empty = [
            sa.select(sa.func.count()).select_from(sa.select(*t.c).where(sa.false()).subquery()).scalar_subquery()
            for t in (self.sinks, self.batches, self.claims)
        ]
        query = sa.select(self.logs.c.log_id).where(self.logs.c.slot == 1, *(e == 0 for e in empty))
        try:
            value = conn.execute(query).scalar()
        except sa.exc.DBAPIError:
            conn.rollback()
            return None
        conn.rollback()
        return str(value) if value is not None and valid_log_id(str(value)) else None

    def ensure(self) -> None:
        """Create the tables if they are missing (first use), and bring a log made by an older xasink up to
        this layout (:meth:`upgrade`); a concurrent creator is fine."""
        with self.dialect.connect() as conn:
            ready = self._ready_log_id(conn)
            if ready is not None:
                self._log_id = ready
                return
            inspector = sa.inspect(conn)
            if not all(inspector.has_table(t.name, schema=t.schema) for t in self.tables):
                conn.rollback()
                try:
                    self._create_tables(conn)
                except sa.exc.IntegrityError:  # another process created them at the same moment
                    pass
                except sa.exc.DBAPIError as exc:
                    names = ", ".join(t.fullname for t in self.tables)
                    raise PreflightError(
                        f"cannot create the xasink decision log tables {names}: "
                        f"{str(exc.orig).strip().splitlines()[0]}. Create them with the DDL "
                        "that `xasink ddl postgres` (or `xasink ddl mysql`) prints, or grant CREATE, or pick a "
                        "schema with 'journalSchema'."
                    ) from None
            conn.rollback()
            self.upgrade(conn)
            self._log_id = self._read_or_draw_log_id(conn)

    def _create_tables(self, conn: Connection, attempts: int = 5) -> None:
        """CREATE the missing tables.  MySQL/MariaDB DDL is not transactional: a concurrent creator's tables
        appear one by one, and ours fails with 1050 "already exists" on the first it made; again, with
        checkfirst, creates the rest (or finds them all made)."""
        for attempt in range(attempts):
            try:
                with conn.begin():
                    self.sinks.metadata.create_all(conn, checkfirst=True)
                return
            except sa.exc.IntegrityError:
                raise
            except sa.exc.DBAPIError:
                conn.rollback()
                inspector = sa.inspect(conn)
                done = all(inspector.has_table(t.name, schema=t.schema) for t in self.tables)
                conn.rollback()
                if done:
                    return
                if attempt == attempts - 1:
                    raise
                time.sleep(0.05 * (attempt + 1))

    def _columns(self, conn: Connection, table: sa.Table) -> set[str]:
        found = {str(c["name"]).lower() for c in sa.inspect(conn).get_columns(table.name, schema=table.schema)}
        conn.rollback()
        return found

    def _add_column(self, conn: Connection, table: sa.Table, name: str) -> None:
        """ALTER TABLE ... ADD COLUMN, identifiers quoted by the dialect; a concurrent adder is fine."""
        if name in self._columns(conn, table):
            return
        column = table.c[name]
        ddl = sa.schema.CreateColumn(column).compile(dialect=conn.dialect)
        prep = conn.dialect.identifier_preparer
        try:
            with conn.begin():
                conn.execute(sa.text(f"ALTER TABLE {prep.format_table(table)} ADD COLUMN {ddl}"))
        except sa.exc.DBAPIError as exc:
            conn.rollback()
            if name in self._columns(conn, table):
                return  # added concurrently
            raise PreflightError(
                f"cannot add column {name} to the xasink decision log table {table.fullname} (made by an older "
                f"xasink): {str(exc.orig).strip().splitlines()[0]}. Add it as `xasink ddl postgres` "
                "(or `xasink ddl mysql`) defines it, or grant ALTER."
            ) from None

    def upgrade(self, conn: Connection) -> None:
        """Add what a log made by an older xasink lacks, and mark what its trims may have forgotten.

        Older versions deleted committed batches whose id was ``journalRetention`` below the sink's highest:
        for a sink with batches, any id below its highest that the log does not hold may have been
        committed.  Its ``horizon`` records that, so such an id is refused instead of written again.
        ``batches.target`` is added last: it marks the upgrade as done.
        """
        if "target" in self._columns(conn, self.batches):
            return
        log.warning("upgrading the xasink decision log %s to this version's layout", self.batches.fullname)
        self._add_column(conn, self.sinks, "horizon")
        s, b = self.sinks.c, self.batches.c
        highest = sa.select(sa.func.max(b.batch_id) - 1).where(b.sink_id == s.sink_id).scalar_subquery()
        with conn.begin():
            conn.execute(self.sinks.update().where(s.horizon.is_(None)).values(horizon=highest))
        self._add_column(conn, self.batches, "compacted")
        self._add_column(conn, self.batches, "target")

    # -- identity ---------------------------------------------------------------
    def _read_log_id(self, conn: Connection) -> str | None:
        value = conn.execute(sa.select(self.logs.c.log_id).where(self.logs.c.slot == 1)).scalar()
        return str(value) if value is not None else None

    def _read_or_draw_log_id(self, conn: Connection) -> str:
        """The log's id; drawn and stored on first use (a concurrent first user's draw wins for both)."""
        found = self._read_log_id(conn)
        conn.rollback()
        if found is None:
            try:
                with conn.begin():
                    conn.execute(
                        self.logs.insert().values(slot=1, log_id=new_log_id(), created_at=self.dialect.utc_now())
                    )
            except sa.exc.IntegrityError:
                pass  # drawn concurrently
            found = self._read_log_id(conn)
            conn.rollback()
        if found is None or not valid_log_id(found):
            raise PreflightError(
                f"the decision log's identity in {self.logs.fullname} is missing or malformed ({found!r}); it must "
                "hold one row with a 10-hex-digit log_id. Restore it: every prepared branch of this log carries it."
            )
        return found

    def find_log_id(self, conn: Connection) -> str | None:
        """This log's identity, or None when the log has none (never written, or made by an older xasink)."""
        if not sa.inspect(conn).has_table(self.logs.name, schema=self.logs.schema):
            return None
        return self._read_log_id(conn)

    def log_id(self, conn: Connection | None = None) -> str:
        """This log's identity (read once, then remembered): branches carrying another one are not ours."""
        if self._log_id is None:
            if conn is not None:
                found = self._read_log_id(conn)
            else:
                with self.dialect.connect() as own:
                    found = self._read_log_id(own)
            if found is None:
                raise PreflightError(
                    f"decision log {self.logs.fullname} has no identity yet: it is created on a writer's first "
                    "batch (or by `xasink ddl postgres` / `xasink ddl mysql`); pass --journal-schema / "
                    "--journal-prefix as the writers used them"
                )
            self._log_id = found
        return self._log_id

    def owns(self, xid: Xid | None, conn: Connection | None = None) -> bool:
        """A branch this log may commit or roll back: ours, and of this very log."""
        return xid is not None and xid.log_id == self.log_id(conn)

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

    def get(self, conn: Connection, sink_id: str, batch_id: int) -> BatchRecord | None:
        b = self.batches.c
        row = conn.execute(self._select().where(b.sink_id == sink_id, b.batch_id == batch_id)).first()
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
        """Decided batches not yet marked committed."""
        b = self.batches.c
        q = self._select().where(b.state == COMMITTING)
        if sink_id is not None:
            q = q.where(b.sink_id == sink_id)
        return [self._record(r) for r in conn.execute(q.order_by(b.sink_id, b.batch_id))]

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
        """:meth:`claim` for a run that has no claim of the batch yet (as :meth:`claim_view` read it)."""
        c = self.claims.c
        mine = c.sink_id == sink_id, c.batch_id == batch_id
        conn.execute(self.claims.update().where(*mine, c.run != run).values(superseded=True))
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

    def end_run(self, conn: Connection, sink_id: str, batch_id: int, run: str) -> None:
        """An aborted run can never decide: mark it superseded, so its late branches roll themselves back."""
        c = self.claims.c
        conn.execute(
            self.claims.update()
            .where(c.sink_id == sink_id, c.batch_id == batch_id, c.run == run)
            .values(superseded=True)
        )

    def holder(self, conn: Connection, sink_id: str, batch_id: int) -> str | None:
        """The run holding a batch now, or None when no run claimed it (or its claims were trimmed)."""
        c = self.claims.c
        q = sa.select(c.run).where(c.sink_id == sink_id, c.batch_id == batch_id, c.superseded.is_(False))
        return conn.execute(q).scalar()

    def target_of(self, conn: Connection, sink_id: str, batch_id: int) -> tuple[bool, str | None]:
        """(decided, what it wrote): whether the log holds (sink, batch), and its recorded target (None when
        a log made by an older xasink did not record it)."""
        b = self.batches.c
        row = conn.execute(sa.select(b.target).where(b.sink_id == sink_id, b.batch_id == batch_id)).first()
        return (False, None) if row is None else (True, row[0])

    def decision_state(self, conn: Connection, sink_id: str, batch_id: int) -> DecisionState:
        """In one round trip, under the sink lock: the log's identity, the batch's decision with its recorded
        target, and the run holding the batch (what :meth:`log_id`, :meth:`get`, :meth:`target_of` and
        :meth:`holder` read)."""
        b, c, lg = self.batches.c, self.claims.c, self.logs.c
        holder = (
            sa.select(c.run)
            .where(c.sink_id == sink_id, c.batch_id == batch_id, c.superseded.is_(False))
            .limit(1)
            .scalar_subquery()
        )
        q = (
            sa.select(lg.log_id, holder.label("xasink_holder"), *self.batches.c)
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
        return DecisionState(str(row[0]), record, target, m["xasink_holder"])

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

    def trim(self, conn: Connection, sink_id: str, keep: int) -> int:
        """Compact the sink's committed batches older than its newest ``keep`` (by decision time, not id).

        Their xid lists are emptied and their claims deleted; their rows stay, one small row per batch, so
        the log still knows every batch it ever committed.  Returns how many batches were compacted.
        """
        b = self.batches.c
        full = conn.execute(
            sa.select(b.batch_id)
            .where(b.sink_id == sink_id, b.state == COMMITTED, b.compacted.is_(False))
            .order_by(b.decided_at.desc(), b.batch_id.desc())
        ).scalars()
        old = [int(x) for x in list(full)[keep:]]
        if not old:
            conn.rollback()
            return 0
        c = self.claims.c
        for i in range(0, len(old), 500):
            chunk = old[i : i + 500]
            conn.execute(
                self.batches.update()
                .where(b.sink_id == sink_id, b.state == COMMITTED, b.batch_id.in_(chunk))
                .values(xids="[]", compacted=True)
            )
            conn.execute(self.claims.delete().where(c.sink_id == sink_id, c.batch_id.in_(chunk)))
            if sa.inspect(conn).has_table(self.parts.name, schema=self.parts.schema):
                p = self.parts.c
                conn.execute(self.parts.delete().where(p.sink_id == sink_id, p.batch_id.in_(chunk)))
        conn.commit()
        return len(old)
