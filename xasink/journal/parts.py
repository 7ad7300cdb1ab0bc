"""The parts of a multi-target transaction in its decision log: what each write prepared, and where.

A write inside :func:`xasink.transaction` prepares its branches and records them here as one part
(target database's server identity, table, xids) without deciding.  The transaction decides once over
every part; recovery of one database finishes that database's parts of a decided transaction against
the log and marks them, and the batch is marked committed when every part is.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from xasink.errors import PreflightError
from xasink.journal.grants import check_grants
from xasink.journal.log import Journal
from xasink.protocol.xid import Xid


@dataclass(frozen=True)
class Part:
    sink_id: str
    batch_id: int
    run: str
    part: int
    server: str
    target: str
    xids: tuple[Xid, ...]
    rows: int
    prepare_ms: int
    committed: bool


def ensure_parts(journal: Journal) -> None:
    """Create the parts table on a transaction's first use of a log (single-table writers never need it)."""
    with journal.dialect.connect() as conn:
        if sa.inspect(conn).has_table(journal.parts.name, schema=journal.parts.schema):
            check_grants(journal.dialect, [("parts", journal.parts)])  # made by a DBA: may the writer use it?
            return
        conn.rollback()
        try:
            with conn.begin():
                journal.parts.create(conn, checkfirst=True)
        except sa.exc.IntegrityError:  # created concurrently
            pass
        except sa.exc.DBAPIError as exc:
            raise PreflightError(
                f"cannot create the xasink decision log table {journal.parts.fullname} for multi-target "
                f"transactions: {str(exc.orig).strip().splitlines()[0]}. Create it with the DDL "
                "that `xasink ddl postgres` (or `xasink ddl mysql`) prints, or grant CREATE."
            ) from None


def record_part(conn: Connection, journal: Journal, part: Part) -> None:
    """Record one write's prepared branches, in the caller's transaction (idempotent: a retried commit of
    the same part replaces it).

    The earlier record is looked for plainly and deleted by its whole key only when there is one: a DELETE
    that finds no row locks, on InnoDB, the gap where other writes' parts go, and two transactions recording
    their parts at once deadlocked on each other's gap (scenario seed 30115).  Only the run itself records
    this key, so the plain read cannot miss a concurrent one."""
    p = journal.parts.c
    key = (p.sink_id == part.sink_id, p.batch_id == part.batch_id, p.run == part.run, p.part == part.part)
    if conn.execute(sa.select(p.part).where(*key)).first() is not None:
        conn.execute(journal.parts.delete().where(*key))
    conn.execute(
        journal.parts.insert().values(
            sink_id=part.sink_id,
            batch_id=part.batch_id,
            run=part.run,
            part=part.part,
            server=part.server,
            target=part.target,
            xids=json.dumps([x.gid for x in part.xids]),
            rows=part.rows,
            prepare_ms=part.prepare_ms,
            committed=False,
        )
    )


def read_parts(conn: Connection, journal: Journal, sink_id: str, batch_id: int, run: str | None = None) -> list[Part]:
    """The recorded parts of (sink, batch), of one run or of all; none when the log has no parts table."""
    if not sa.inspect(conn).has_table(journal.parts.name, schema=journal.parts.schema):
        return []
    p = journal.parts.c
    q = sa.select(journal.parts).where(p.sink_id == sink_id, p.batch_id == batch_id)
    if run is not None:
        q = q.where(p.run == run)
    out = []
    for r in conn.execute(q.order_by(p.run, p.part)):
        m = r._mapping
        xids = tuple(x for x in (Xid.parse(g) for g in json.loads(m["xids"])) if x is not None)
        out.append(
            Part(
                m["sink_id"],
                int(m["batch_id"]),
                m["run"],
                int(m["part"]),
                m["server"],
                m["target"],
                xids,
                int(m["rows"]),
                int(m["prepare_ms"]),
                bool(m["committed"]),
            )
        )
    return out


def decided_parts(conn: Connection, journal: Journal, sink_id: str, batch_id: int, xids: tuple[Xid, ...]) -> list[Part]:
    """The parts a decision covers (those of the decided run); empty for a single-target batch."""
    runs = {x.run for x in xids}
    return [p for p in read_parts(conn, journal, sink_id, batch_id) if p.run in runs]


def mark_parts_committed(conn: Connection, journal: Journal, parts: list[Part]) -> None:
    p = journal.parts.c
    with conn.begin():
        for part in parts:
            conn.execute(
                journal.parts.update()
                .where(p.sink_id == part.sink_id, p.batch_id == part.batch_id, p.run == part.run, p.part == part.part)
                .values(committed=True)
            )


def mark_parts_done(
    conn: Connection, journal: Journal, sink_id: str, batch_id: int, xids: tuple[Xid, ...], done: list[Part]
) -> list[tuple[str, str]]:
    """Mark ``done`` committed, in the caller's transaction; the parts of the decision still not committed
    (their server and target), none once every part is.

    The caller holds the sink's lock (:meth:`Journal.locked`): two recoveries of two databases of one
    transaction then mark one after the other, and the later one reads the earlier one's mark, so whichever
    finishes last learns the batch is done.
    """
    p = journal.parts.c
    for part in done:
        conn.execute(
            journal.parts.update()
            .where(p.sink_id == part.sink_id, p.batch_id == part.batch_id, p.run == part.run, p.part == part.part)
            .values(committed=True)
        )
    runs = {x.run for x in xids}
    # a locking read: the newest committed marks, on PostgreSQL and InnoDB (REPEATABLE READ) alike
    marks = conn.execute(
        sa.select(p.run, p.committed, p.server, p.target)
        .where(p.sink_id == sink_id, p.batch_id == batch_id)
        .order_by(p.part)
        .with_for_update()
    )
    return [(server, target) for run, committed, server, target in marks if run in runs and not committed]


def still_to_recover(left: list[tuple[str, str]], log_server: str) -> str:
    """Where a decided transaction's uncommitted parts are (server identity and tables), with the command that
    finishes each: what the caller is told while the batch is unfinished.  The log can name a database only by
    the identity its server reports (it keeps no URL), so the command is given with placeholders."""
    tables: dict[str, list[str]] = {}
    for server, target in left:
        try:
            t = json.loads(target)
            name = f"{t.get('schema')}.{t.get('table')}"
        except (ValueError, AttributeError):
            name = "?"
        if name not in tables.setdefault(server, []):
            tables[server].append(name)
    said = []
    for server, names in sorted(tables.items()):
        command = "xasink recover --url <that database>"
        if server != log_server:
            command += " --journal-url <the decision log's database>"
        said.append(f"{server} ({', '.join(names)}): run '{command}'")
    return "its writes in these databases are not committed yet: " + "; ".join(said)


def multi_target(parts: list[Part]) -> str:
    """The decision log's record of what a multi-target batch wrote: every part's database and table."""
    targets = []
    for part in parts:
        ident = json.loads(part.target)
        ident["server"] = part.server
        if ident not in targets:
            targets.append(ident)
    return json.dumps({"targets": targets}, sort_keys=True)


def recorded_targets(recorded: str | None) -> list[dict[str, str]] | None:
    """The targets of a multi-target record, or None when the record is a single table's (or unknown)."""
    if recorded is None:
        return None
    try:
        value = json.loads(recorded)
    except ValueError:
        return None
    if isinstance(value, dict) and isinstance(value.get("targets"), list):
        return list(value["targets"])
    return None
