"""Passwords are never shown: how a URL is displayed and how a message is cleaned.

A user may hand the password over as the ``password`` option, in the URL's user-info
(``user:pw@host``) or in its query (``?password=``, ``?PASSWORD=``, ``?passwd=``).
:func:`xasink.options.parse_url` moves all of these into the URL's credentials, so a URL has one
place for its password; a few drivers take other secrets in the query (libpq's ``sslpassword``),
which :func:`display_url` masks too.  Every URL a user sees goes through :func:`display_url`, every
message that may quote a server or driver error through :func:`redact`.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from urllib.parse import quote, quote_plus

from sqlalchemy.engine import URL

MASK = "***"

# query keys that name a secret in some driver: password, PASSWORD, passwd, sslpassword, pwd, ...
_SECRET_KEY = re.compile(r"pass|pwd|secret|token", re.IGNORECASE)

# credentials in free text, whoever wrote them: a URL's user:pw@, and key=value (a JDBC query, a libpq DSN)
_PATTERNS = (
    re.compile(r"(://[^/@\s:]*:)([^@\s]+)(@)"),
    re.compile(r"""(\b[\w.-]*(?:pass|pwd|secret|token)[\w.-]*\s*=\s*)('[^']*'|"[^"]*"|[^&\s;,)'"]+)()""", re.I),
)


def is_secret_key(key: str) -> bool:
    """Whether a URL query key holds a secret (its value is never shown)."""
    return bool(_SECRET_KEY.search(key))


def url_secrets(url: URL | None) -> tuple[str, ...]:
    """The URL's password and every secret of its query: what :func:`redact` must remove."""
    if url is None:
        return ()
    found = [url.password] if isinstance(url.password, str) and url.password else []
    for key, value in url.query.items():
        if is_secret_key(key):
            found += [v for v in ((value,) if isinstance(value, str) else value) if v]
    return tuple(found)


def display_url(url: URL) -> str:
    """The URL as a user may see it: the password, and any secret query value, replaced by ``***``."""
    query = {k: (MASK if is_secret_key(k) else v) for k, v in url.query.items()}
    return url.set(query=query).render_as_string(hide_password=True).replace(quote(MASK, safe=""), MASK)


def redact(text: str, secrets: str | Iterable[str | None] | None = ()) -> str:
    """``text`` without the given secrets (in any quoting they may have gone through) and without
    anything that looks like a credential (``user:pw@``, ``password=...``)."""
    values = [secrets] if isinstance(secrets, str) else list(secrets or ())
    forms: set[str] = set()
    for secret in values:
        if secret:
            forms |= {secret, re.escape(secret), secret.replace("'", "''"), quote(secret, safe=""), quote_plus(secret)}
    for form in sorted(forms, key=len, reverse=True):  # a longer form first: it may contain a shorter one
        text = text.replace(form, MASK)
    for pattern in _PATTERNS:
        text = pattern.sub(rf"\1{MASK}\3", text)
    return text


class RedactingFormatter(logging.Formatter):
    """A log formatter that cleans the whole record, tracebacks included, of the given secrets."""

    def __init__(self, fmt: str, secrets: Iterable[str]) -> None:
        super().__init__(fmt)
        self.secrets = tuple(secrets)

    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record), self.secrets)
