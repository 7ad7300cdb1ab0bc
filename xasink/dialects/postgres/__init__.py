"""PostgreSQL: the dialect (XA verbs, listings, checks), its executor branch, its SQL text and health queries."""

from xasink.dialects.postgres.dialect import PostgresDialect
from xasink.dialects.postgres.sql import advisory_key, upsert_sql

__all__ = ["PostgresDialect", "advisory_key", "upsert_sql"]
