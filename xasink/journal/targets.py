"""What a batch writes, as the decision log records it with the batch, and the words for a mismatch.

A (sinkId, batchId) names one batch of one target: a rerun of a committed batch id is skipped only when it
writes the same table (and the same streaming query); one that writes another target is refused, never
skipped silently (:func:`same_target`).  The identity is a JSON document, read back by recovery too
(:meth:`xasink.write_modes.statements.ApplySpec.from_target` finds a write mode's apply step in it).
"""

from __future__ import annotations

import json

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from xasink.dialects import dialect_class

# (dialect, URL without its password) -> (database, default schema) of that URL's sessions: the same for
# every session of a URL, so read once per process instead of at every check, decision and task
_SESSION_TARGETS: dict[tuple[str, str], tuple[str, str]] = {}


# the query recorded for a micro-batch whose foreachBatch function could not learn its query's id (Spark
# Connect without checkpoint_location): it matches no query, so a later write of that batch is refused
UNKNOWN_QUERY = "unknown"


def session_target(conn: Connection) -> tuple[str, str]:
    """The database and default schema of this connection's sessions (:meth:`Dialect.session_database` of the
    connection's own database, and the schema SQLAlchemy found at connect), read once per URL and process."""
    key = (conn.dialect.name, conn.engine.url.render_as_string(hide_password=True))
    found = _SESSION_TARGETS.get(key)
    if found is None:
        db = dialect_class(conn.engine.url).session_database(conn)
        found = _SESSION_TARGETS[key] = (db, str(sa.inspect(conn).default_schema_name))
    return found


def target_identity(conn: Connection, schema: str | None, table: str, query: str | None = None) -> str:
    """What a batch writes, as the decision log records it: database, schema (when the table names none, the
    one the session finds it in, else the session's default, where it would be created) and table, and the
    streaming query's id when there is one."""
    db, default_schema = session_target(conn)
    if not schema:
        schema = dialect_class(conn.engine.url).table_schema(conn, table)
    ident: dict[str, str] = {
        "db": db,
        "schema": str(schema or default_schema),
        "table": table,
    }
    if query:
        ident["query"] = query
    return json.dumps(ident, sort_keys=True)


def same_target(recorded: str | None, mine: str) -> bool:
    """A replay: the same table (and the same streaming query, when both name one); an unrecorded target or
    query counts as the same.  A write of a micro-batch whose query it cannot learn (``UNKNOWN_QUERY``)
    replays nothing: it cannot tell the same query restarting from another query with the same sink id."""
    if _query_of(mine) == UNKNOWN_QUERY:
        return False
    if recorded is None:
        return True
    try:
        was, now = json.loads(recorded), json.loads(mine)
    except ValueError:
        return False
    if any(was.get(k) != now.get(k) for k in ("db", "schema", "table")):
        return False
    return not (was.get("query") and now.get("query") and was["query"] != now["query"])


def same_table(recorded: str | None, mine: str) -> bool:
    """Both identities name one table (whatever the sink or query writing it): batches whose order of effect
    matters (DESIGN invariant 12)."""
    try:
        was, now = json.loads(recorded or ""), json.loads(mine)
    except ValueError:
        return False
    return isinstance(was, dict) and all(was.get(k) == now.get(k) for k in ("db", "schema", "table"))


def is_write_mode(recorded: str | None) -> bool:
    """A pending batch whose apply step replaces or changes rows (overwrite, replaceWhere, change data)."""
    try:
        found = json.loads(recorded or "")
    except ValueError:
        return False
    return isinstance(found, dict) and "apply" in found


def deciding_run(recorded: str | None) -> str | None:
    """The run that decided a single-table batch, as recorded with its target: kept through compaction, so the
    run still recognizes its own decision once the trim emptied the xid list (DESIGN invariant 14)."""
    try:
        found = json.loads(recorded or "")
    except ValueError:
        return None
    run = found.get("run") if isinstance(found, dict) else None
    return str(run) if run else None


def blocked_message(sink_id: str, batch_id: int, blockers: list[tuple[str, int]], why: str) -> str:
    """Why a batch was refused before its decision: older decided batches of its table are not applied yet."""
    names = ", ".join(f"sink {s} batch {b}" for s, b in blockers)
    sinks = "".join(sorted({f" --sink-id {s}" for s, _ in blockers}))
    return (
        f"sink {sink_id} batch {batch_id} was not decided: {names} of the same table is decided but not applied "
        f"yet ({why}), and a newer batch never takes effect before an older decided one. This batch was rolled "
        f"back and nothing of it is visible. Run 'xasink recover --url <the table's database>{sinks}' once "
        "what blocks it is gone, then run this batch again."
    )


def _query_of(ident: str) -> str | None:
    try:
        query = json.loads(ident).get("query")
    except (ValueError, AttributeError):
        return None
    return str(query) if query else None


def describe_target(ident: str | None) -> str:
    """A target identity in words, for error messages."""
    if ident is None:
        return "an unrecorded target"
    try:
        d = json.loads(ident)
    except ValueError:
        return repr(ident)
    what = f"table {d.get('schema')}.{d.get('table')} in database {d.get('db')}"
    return what + (f" (streaming query {d['query']})" if d.get("query") else "")


def identity_message(sink_id: str, batch_id: int, recorded: str | None, mine: str) -> str:
    if _query_of(mine) == UNKNOWN_QUERY:
        return (
            f"sink {sink_id} batch {batch_id} was committed to {describe_target(recorded)}, and this write runs "
            "in a streaming micro-batch whose query xasink cannot learn here, so it cannot tell a replay of that "
            "batch (the same query restarting) from another query's batch with the same sinkId. Nothing of this "
            "attempt was written. In classic Spark, call xasink.register(spark) in the writing thread once the "
            "query runs (or write with xasink.write / xasink.foreach_batch, which find the query from the "
            "micro-batch DataFrame); under Spark Connect, write with xasink.foreach_batch(..., "
            "checkpoint_location=<the query's checkpointLocation>)."
        )
    return (
        f"sink {sink_id} batch {batch_id} was committed to {describe_target(recorded)}, and is now being written "
        f"to {describe_target(mine)}: a (sinkId, batchId) names one batch of one target, so this is not a replay "
        "and xasink will not skip it silently. Nothing of this attempt was written. Give this write its own "
        "sinkId (or a batchId the sink never used)."
    )


def taken_over_message(sink_id: str, batch_id: int, run: str) -> str:
    return (
        f"sink {sink_id} batch {batch_id} was taken over by a newer writer with the same sinkId (run {run} lost "
        "it); this writer's branches are rolled back and it wrote nothing. Run one writer per sinkId at a time."
    )


def forgotten_message(sink_id: str, batch_id: int, horizon: int, sinks_table: str) -> str:
    return (
        f"sink {sink_id} batch {batch_id}: the decision log cannot tell whether this batch was committed. The "
        f"log was made by an older xasink whose retention deleted committed batches, and ids up to {horizon} "
        "that it does not hold may be among them; writing could double the batch's rows and skipping could "
        "lose them, so nothing was written. Check the target table: if the batch's rows are absent, write it "
        "under a new sinkId (or a batchId above the horizon); if you know the old log deleted none of this "
        f"sink's batches, clear the horizon (column horizon of {sinks_table}, for sink_id '{sink_id}')."
    )
