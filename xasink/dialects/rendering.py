"""A SQLAlchemy statement rendered as SQL text, for the dialects' statements SQLAlchemy cannot express."""

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
