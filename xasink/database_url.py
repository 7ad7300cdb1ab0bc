"""Database URLs: JDBC and SQLAlchemy forms parsed into one URL whose credentials alone hold the password."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

from xasink.errors import OptionError

# backend name -> SQLAlchemy driver we use for the control connections
DRIVERS = {"postgresql": "postgresql+psycopg2", "mysql": "mysql+pymysql"}
_JDBC_SCHEMES = {"postgresql": "postgresql", "mysql": "mysql", "mariadb": "mysql"}
_URL_SCHEMES = {
    "postgresql": "postgresql",
    "postgres": "postgresql",
    "mysql": "mysql",
    "mariadb": "mysql",
}

_PG_JDBC_PARAMS = {"sslmode", "sslrootcert", "sslcert", "sslkey", "options", "application_name"}
_PG_JDBC_ALIASES = {"applicationname": "application_name"}  # pgjdbc's name -> libpq's

_USER_KEYS = {"user", "username"}
_PASSWORD_KEYS = {"password", "passwd"}


def _credentials_from_query(query: Mapping[str, Any]) -> tuple[dict[str, Any], str | None, str | None]:
    """Take user and password out of a URL's query (keys in any case): the rest, the user, the password.

    They go into the URL's credentials, the one place a password is kept and masked
    (:func:`xasink.support.masking.display_url`).
    """
    rest: dict[str, Any] = {}
    user = password = None
    for key, value in query.items():
        text = value if isinstance(value, str) else (value[-1] if value else "")
        if key.lower() in _USER_KEYS:
            user = text
        elif key.lower() in _PASSWORD_KEYS:
            password = text
        else:
            rest[key] = value
    return rest, user, password


def parse_url(raw: str, user: str | None = None, password: str | None = None) -> URL:
    """Accept ``jdbc:postgresql://...``, ``jdbc:mysql://...`` and SQLAlchemy URLs.

    The user and password may be given as options (they win), in the URL's user-info or in its
    query; wherever they were, they end up in the URL's credentials only.
    """
    text = raw.strip()
    if text.lower().startswith("jdbc:"):
        parts = urlsplit(text[5:], allow_fragments=False)  # JDBC has no fragment: '#' may be in a password
        backend = _JDBC_SCHEMES.get(parts.scheme.lower())
        if backend is None:
            raise OptionError(
                f"option 'url': unsupported JDBC scheme 'jdbc:{parts.scheme}:'; "
                "use jdbc:postgresql://, jdbc:mysql:// or jdbc:mariadb://"
            )
        query, query_user, query_password = _credentials_from_query(
            {_PG_JDBC_ALIASES.get(k.lower(), k): v for k, v in parse_qsl(parts.query)}
        )
        url_user = unquote(parts.username) if parts.username else query_user
        url_password = unquote(parts.password) if parts.password is not None else query_password
        try:
            port = parts.port
        except ValueError as exc:
            raise OptionError(f"option 'url': invalid port ({exc})") from None
        # libpq understands these under the same names; dropping sslmode=require silently would weaken TLS
        kept = {k: v for k, v in query.items() if backend == "postgresql" and k in _PG_JDBC_PARAMS}
        # Connector/J's session variables: the MySQL dialect takes sql_mode and time_zone from them, as JDBC does
        kept |= {k: v for k, v in query.items() if backend == "mysql" and k.lower() == "sessionvariables"}
        dropped_tls = sorted(k for k in query if "ssl" in k.lower() and k not in kept)
        if dropped_tls:
            raise OptionError(
                f"option 'url': JDBC parameter(s) {', '.join(dropped_tls)} cannot be carried over; "
                "give a SQLAlchemy URL (e.g. mysql://host/db?ssl_ca=...) to configure TLS"
            )
        url = URL.create(
            DRIVERS[backend],
            username=url_user or None,
            password=url_password,
            host=parts.hostname or "localhost",
            port=port,
            database=parts.path.lstrip("/") or None,
            query=kept,
        )
    else:
        try:
            url = make_url(text)
        except (ArgumentError, ValueError):  # ValueError: a bad port; its text may hold the password
            raise OptionError(
                "option 'url': not a database URL; expected e.g. "
                "jdbc:postgresql://host:5432/db or postgresql://user@host/db"
            ) from None
        backend = _URL_SCHEMES.get(url.get_backend_name())
        if backend is None:
            raise OptionError(
                f"option 'url': unsupported database '{url.get_backend_name()}'; "
                "xasink writes to PostgreSQL and MySQL/MariaDB"
            )
        query, query_user, query_password = _credentials_from_query(url.query)
        if backend == "postgresql":  # pgjdbc's, which libpq refuses: strings go to any column type without it
            query = {k: v for k, v in query.items() if k.lower() != "stringtype"}
        url = url.set(
            drivername=DRIVERS[backend],
            username=url.username or query_user or None,
            password=url.password if url.password is not None else query_password,
            query=query,
        )
    if user:
        url = url.set(username=user)
    if password is not None:
        url = url.set(password=password)
    if not url.database:
        raise OptionError("option 'url': no database name; add it to the URL path, e.g. .../mydb")
    return url
