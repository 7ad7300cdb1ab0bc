"""PostgreSQL: the dialect (XA verbs, listings, checks), its executor branch, its SQL text and health queries."""

from .dialect import PostgresDialect
from .sql import advisory_key, upsert_sql

__all__ = ["PostgresDialect", "advisory_key", "upsert_sql"]
