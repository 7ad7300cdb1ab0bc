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
* ``<prefix>batches``: one row per decided (sink, batch): state
  ``committing`` (decided) or ``committed``, the exact xid list, figures.
  Its primary key makes a second decision for the same batch impossible
  (invariant 3).
* ``<prefix>claims``: which writer runs took part in an undecided (sink,
  batch), and which one holds it now.  A run's first task takes the batch
  over (rolling back what other runs prepared); a run that was taken over
  can never come back, so two writers of one batch cannot both lose.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.dialects import mysql
from sqlalchemy.engine import Connection

from .dialects.base import Dialect
from .errors import JournalError, PreflightError
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
class ClaimState:
    superseded: bool  # taken over, or aborted: the run can never decide
    guard: str | None  # the session lock its driver holds while it lives
    claimed_at: datetime  # server clock, UTC


def journal_metadata(
    schema: str | None = None, prefix: str = "xasink_"
) -> tuple[sa.Table, sa.Table, sa.Table, sa.Table]:
    """The journal tables; ``sql/*.sql`` holds the same DDL for DBAs."""
    md = sa.MetaData(schema=schema)
    sinks = sa.Table(
        f"{prefix}sinks",
        md,
        sa.Column("sink_id", sa.String(32), primary_key=True),
        sa.Column("created_at", sa.DateTime, nullable=False),
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


class Journal:
    def __init__(self, dialect: Dialect, schema: str | None = None, prefix: str = "xasink_") -> None:
        self.dialect = dialect
        self.sinks, self.batches, self.claims, self.logs = journal_metadata(schema, prefix)
        self._known_sinks: set[str] = set()
        self._log_id: str | None = None

    @property
    def tables(self) -> tuple[sa.Table, ...]:
        return (self.logs, self.sinks, self.batches, self.claims)

    # -- set-up ---------------------------------------------------------------
    def exists(self, conn: Connection) -> bool:
        return sa.inspect(conn).has_table(self.batches.name, schema=self.batches.schema)

    def ensure(self) -> None:
        """Create the tables if they are missing (first use); a concurrent creator is fine."""
        with self.dialect.connect() as conn:
            inspector = sa.inspect(conn)
            if not all(inspector.has_table(t.name, schema=t.schema) for t in self.tables):
                conn.rollback()
                try:
                    with conn.begin():
                        self.sinks.metadata.create_all(conn, checkfirst=True)
                except sa.exc.IntegrityError:  # another process created them at the same moment
                    pass
                except sa.exc.DBAPIError as exc:
                    names = ", ".join(t.fullname for t in self.tables)
                    raise PreflightError(
                        f"cannot create the xasink decision log tables {names}: "
                        f"{str(exc.orig).strip().splitlines()[0]}. Create them with sql/postgres.sql or "
                        "sql/mysql.sql, or grant CREATE, or pick a schema with 'journalSchema'."
                    ) from None
            conn.rollback()
            self._log_id = self._read_or_draw_log_id(conn)

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
                    "batch (or with sql/postgres.sql, sql/mysql.sql); pass --journal-schema / --journal-prefix "
                    "as the writers used them"
                )
            self._log_id = found
        return self._log_id

    def owns(self, xid: Xid | None, conn: Connection | None = None) -> bool:
        """A branch this log may commit or roll back: ours, and of this very log."""
        return xid is not None and xid.log_id == self.log_id(conn)

    # -- reads ------------------------------------------------------------------
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
        row = conn.execute(sa.select(self.batches).where(b.sink_id == sink_id, b.batch_id == batch_id)).first()
        return self._record(row) if row is not None else None

    def get_many(self, conn: Connection, sink_id: str, batch_ids: set[int]) -> dict[int, BatchRecord]:
        if not batch_ids:
            return {}
        b = self.batches.c
        rows = conn.execute(sa.select(self.batches).where(b.sink_id == sink_id, b.batch_id.in_(sorted(batch_ids))))
        return {int(r._mapping["batch_id"]): self._record(r) for r in rows}

    def last_batch_id(self, conn: Connection, sink_id: str) -> int | None:
        """The sink's highest decided batch: in a stream every batch below it is settled."""
        b = self.batches.c
        value = conn.execute(sa.select(sa.func.max(b.batch_id)).where(b.sink_id == sink_id)).scalar()
        return int(value) if value is not None else None

    def pending(self, conn: Connection, sink_id: str | None = None) -> list[BatchRecord]:
        """Decided batches not yet marked committed."""
        b = self.batches.c
        q = sa.select(self.batches).where(b.state == COMMITTING)
        if sink_id is not None:
            q = q.where(b.sink_id == sink_id)
        return [self._record(r) for r in conn.execute(q.order_by(b.sink_id, b.batch_id))]

    def recent(self, conn: Connection, sink_id: str | None = None, limit: int = 20) -> list[BatchRecord]:
        b = self.batches.c
        q = sa.select(self.batches)
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
        with self.dialect.connect() as conn:
            self._ensure_sink(conn, sink_id)
            with conn.begin():
                conn.execute(sa.select(self.sinks.c.sink_id).where(self.sinks.c.sink_id == sink_id).with_for_update())
                yield conn

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
        return True

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

    def insert_decision(self, conn: Connection, record: BatchRecord) -> None:
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

    def trim(self, conn: Connection, sink_id: str, keep: int) -> int:
        """Delete committed rows of a sink older than its newest ``keep`` batches."""
        b = self.batches.c
        newest = conn.execute(sa.select(sa.func.max(b.batch_id)).where(b.sink_id == sink_id)).scalar()
        if newest is None or newest - keep < 0:
            conn.rollback()
            return 0
        res = conn.execute(
            self.batches.delete().where(b.sink_id == sink_id, b.state == COMMITTED, b.batch_id <= newest - keep)
        )
        c = self.claims.c
        conn.execute(self.claims.delete().where(c.sink_id == sink_id, c.batch_id <= newest - keep))
        conn.commit()
        return int(res.rowcount or 0)
