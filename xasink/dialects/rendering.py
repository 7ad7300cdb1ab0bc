"""A SQLAlchemy statement rendered as SQL text, for the dialects' statements SQLAlchemy cannot express; and an
``INSERT .. SELECT`` that is sent only when it selects a row."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection


def statement_text(conn: Connection, stmt: sa.ClauseElement) -> tuple[str, Any]:
    """A statement's SQL text and parameters for ``exec_driver_sql`` (expanded ``IN`` lists rendered), to embed
    a query in a statement SQLAlchemy has no construct for (``CREATE TEMPORARY TABLE .. AS``)."""
    compiled: Any = stmt.compile(dialect=conn.dialect, compile_kwargs={"render_postcompile": True})
    params: Any = compiled.params
    if compiled.positional:
        params = tuple(params[k] for k in compiled.positiontup or ())
    return str(compiled), params


def insert_selected(conn: Connection, target: sa.TableClause, names: list[str], rows: sa.Select[Any]) -> int:
    """``INSERT .. SELECT`` of ``rows`` into ``target``, sent only when it selects any; the rows inserted.

    MariaDB checks an ``INSERT .. SELECT``'s columns when it prepares it: a NOT NULL column without a default
    (added since the write was planned) fails it with 1364 even when no row is selected.  An apply that
    inserts nothing must not fail on it: only a proven property of rows inserted may withdraw a decision.
    """
    if conn.execute(rows.limit(1)).first() is None:
        return 0
    return max(conn.execute(sa.insert(target).from_select(names, rows)).rowcount or 0, 0)
