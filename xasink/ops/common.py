"""What ``xasink recover`` and ``xasink status`` share: a URL's options, dialect and decision log; safe errors."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import sqlalchemy as sa

from xasink.database_url import parse_url
from xasink.dialects import Dialect, dialect_for
from xasink.errors import OptionError, XasinkError
from xasink.journal.log import Journal
from xasink.options import TableName, WriteOptions
from xasink.support.masking import display_url, redact, url_secrets


def base_options(url: str, journal_schema: str | None, journal_prefix: str) -> WriteOptions:
    parsed = parse_url(url)
    return WriteOptions(
        url=parsed,
        table=TableName("-"),
        sink_id="admin",
        sink_id_given=True,
        batch_id=0,
        journal_schema=journal_schema,
        journal_prefix=journal_prefix,
    )


def dialect_of(options: WriteOptions) -> Dialect:
    try:
        return dialect_for(options.url)
    except ValueError as exc:  # an unsupported backend: an option error, said without the URL
        raise OptionError(f"--url: {exc}; use postgresql://... or mysql://...") from None


def journal_of(dialect: Dialect, journal_url: str | None, journal_schema: str | None, journal_prefix: str) -> Journal:
    """The decision log: in the database itself, or (``journal_url``) in the database holding the log of a
    multi-target transaction whose branches are in this one."""
    if journal_url is None:
        return Journal(dialect, journal_schema, journal_prefix)
    return Journal(
        dialect_of(base_options(journal_url, journal_schema, journal_prefix)), journal_schema, journal_prefix
    )


def known_sinks(journal: Journal) -> list[str] | None:
    """The sinks of the decision log; None when there is no log at its schema and prefix."""
    with journal.dialect.connect() as conn:
        if not journal.exists(conn):
            return None
        return journal.sink_ids(conn)


def missing_log(journal: Journal, database: str | None) -> str:
    """Why an operator's command found no decision log, and what to check (a typo must never look green)."""
    where = f" in database {database}" if database else ""
    return (
        f"decision log {journal.batches.fullname} not found{where}: no xasink writer used this schema and "
        "prefix here, or this user may not see it (MySQL/MariaDB hide a table the user has no right on). Check "
        "that --url names the writers' database, pass --journal-schema / --journal-prefix as the writers set "
        "journalSchema / journalTablePrefix, and grant SELECT on the log's tables"
    )


def missing_sink(journal: Journal, sink_id: str, sinks: list[str]) -> str:
    """Why ``--sink-id`` found nothing: the sinks the log does hold (a few), so a typo shows."""
    shown = ", ".join(sinks[:10]) + (f" and {len(sinks) - 10} more" if len(sinks) > 10 else "")
    return (
        f"sink {sink_id} is not in the decision log {journal.batches.fullname} "
        f"({f'its sinks: {shown}' if sinks else 'it has no sinks yet'}); check --sink-id (the writers' sinkId)"
    )


def masked_url(options: WriteOptions) -> str:
    return display_url(options.url)


def check_threshold(older_than_s: float) -> None:
    if not older_than_s >= 0:  # also NaN
        raise OptionError(f"older-than must be 0 or more seconds, not {older_than_s!r}")


def _first_line(exc: BaseException) -> str:
    """The server's message without SQLAlchemy's statement dump and link."""
    text = str(getattr(exc, "orig", None) or exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def redacted_error(exc: BaseException, options: WriteOptions) -> str:
    return redact(_first_line(exc), url_secrets(options.url))


def server_error(exc: sa.exc.DBAPIError, dialect: Dialect) -> XasinkError:
    return XasinkError(
        f"{dialect.name} at {dialect.where()}: {redact(_first_line(exc), url_secrets(dialect.url))}. Reading needs the "
        "list of prepared transactions (MySQL: XA_RECOVER_ADMIN) and SELECT on the decision log tables; acting "
        "needs the writers' rights (PostgreSQL: the same user or a superuser finishes a prepared transaction)"
    )


@contextmanager
def on_server(dialect: Dialect, journal: Journal) -> Iterator[None]:
    """Run an operator's command on a server: its errors are told without the password, and every connection
    (of the database and of the decision log, wherever that is) is closed at the end."""
    try:
        yield
    except sa.exc.DBAPIError as exc:
        raise server_error(exc, dialect) from None
    finally:
        dialect.dispose()
        journal.dialect.dispose()
