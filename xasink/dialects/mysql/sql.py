"""What every MySQL module shares: SQLAlchemy's pymysql dialect (identifier quoting), the branch session's
settings, error numbers, and one pymysql tweak that makes connecting cheap."""

from __future__ import annotations

import logging
import re
from typing import Any

import pymysql
from sqlalchemy.dialects.mysql import pymysql as sa_pymysql
from sqlalchemy.engine import URL

from xasink.dialects.values import TargetPlan


def _share_preferred_tls_context() -> None:
    """One TLS context per process for pymysql's PREFERRED mode (no ssl options given), not one per connection.

    pymysql >= 1.2 builds ``ssl.create_default_context()`` for every such connection, which loads the
    system CA bundle (~25 ms here) only to set CERT_NONE; a batch opens several connections per branch
    and on the driver, so this was most of a small batch's time (benchmarks: profile of MariaDB writes).
    The context is identical every time, so sharing it changes nothing but the cost.
    """
    original = getattr(pymysql.connections.Connection, "_create_ssl_ctx", None)
    if original is None or getattr(original, "xasink_shared", False):
        return
    shared: list[Any] = []

    def create_ssl_ctx(self: Any, sslp: Any) -> Any:
        if isinstance(sslp, dict) and not sslp:
            if not shared:
                shared.append(original(self, sslp))
            return shared[0]
        return original(self, sslp)

    create_ssl_ctx.xasink_shared = True  # type: ignore[attr-defined]
    pymysql.connections.Connection._create_ssl_ctx = create_ssl_ctx  # type: ignore[method-assign]


_share_preferred_tls_context()

log = logging.getLogger("xasink.dialects.mysql")
SA_DIALECT = sa_pymysql.dialect()
# identifiers for the statements a pymysql cursor runs as they are (the branch's): SQLAlchemy's own preparer
# doubles '%' for the driver's formatting, which a statement run without parameters never undoes
# (a dialect whose paramstyle is not printf-like quotes without doubling)
_PREPARER = sa_pymysql.dialect(paramstyle="named").identifier_preparer

# the sql_mode every session xasink writes with starts from (branches, and control sessions: the decision log,
# the apply step): bad or too long values fail instead of being truncated; no ANSI_QUOTES / NO_BACKSLASH_ESCAPES,
# which would change how our statements parse
BRANCH_SQL_MODE = "STRICT_ALL_TABLES,NO_ENGINE_SUBSTITUTION"
# the server's modes that change what a written value becomes, which Spark's JDBC writer's session keeps (it
# starts from the server's mode): a branch keeps them too (docs/types.md).  A 0 into an AUTO_INCREMENT column
# takes a generated value unless NO_AUTO_VALUE_ON_ZERO; TIME_ROUND_FRACTIONAL rounds extra fractional digits
# where MariaDB's default truncates (MySQL 8's default rounds, and TIME_TRUNCATE_FRACTIONAL truncates: kept
# too, untested here); EMPTY_STRING_IS_NULL stores NULL for ''; the date modes refuse or admit dates.  Only
# modes the session has are set again, so a server that does not know one never sees it
VALUE_MODES = (
    "NO_AUTO_VALUE_ON_ZERO",
    "TIME_ROUND_FRACTIONAL",
    "TIME_TRUNCATE_FRACTIONAL",
    "EMPTY_STRING_IS_NULL",
    "NO_ZERO_DATE",
    "NO_ZERO_IN_DATE",
    "ALLOW_INVALID_DATES",
)
# of those, what a control session keeps: the apply step copies an overwrite's rows from the shadow (where the
# branches stored them, the modes applied) into the table, which generates a value for a 0 again and computes
# its stored generated columns and defaults again (a date one: the date modes); but not EMPTY_STRING_IS_NULL,
# which would make NULL of the decision log's own empty strings (its values are no literal of a copy)
APPLY_VALUE_MODES = tuple(m for m in VALUE_MODES if m != "EMPTY_STRING_IS_NULL")


# a JDBC URL's sessionVariables entry: name=value, the value maybe quoted (commas inside: sql_mode='A,B')
_VARIABLE = re.compile(r"""\s*(?:@@)?(?:session\.)?(\w+)\s*=\s*('(?:[^']|'')*'|"[^"]*"|[^,]*?)\s*(?:,|$)""", re.I)
# the session variables of a JDBC URL a branch takes too, as the values they change are JDBC's: others (a
# lock wait, an isolation level) would change how xasink's own sessions work and are left out (docs/types.md)
SESSION_VARIABLES = ("sql_mode", "time_zone")


def session_variables(text: str | None) -> dict[str, str]:
    """The URL's ``sessionVariables`` (Connector/J's: ``sql_mode='ANSI,STRICT_TRANS_TABLES',time_zone='+00:00'``),
    by lower-case name, unquoted; xasink's sessions take :data:`SESSION_VARIABLES` of them."""
    found: dict[str, str] = {}
    for name, value in _VARIABLE.findall(text or ""):
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1].replace("''", "'")
        found[name.lower()] = value
    return found


def url_session_variables(url: URL) -> tuple[URL, dict[str, str]]:
    """The URL without its ``sessionVariables``, and those of them xasink's sessions set; the others are named
    in a warning (JDBC's session sets them, xasink's do not)."""
    named = [k for k in url.query if k.lower() == "sessionvariables"]
    given = url.query.get(named[0]) if named else None
    found = session_variables(given if isinstance(given, str) else None)
    taken = {k: v for k, v in found.items() if k in SESSION_VARIABLES}
    if set(found) - set(taken):
        log.warning(
            "the URL's sessionVariables %s are not set on xasink's sessions (Spark's JDBC writer sets them): only "
            "%s are",
            ", ".join(sorted(set(found) - set(taken))),
            " and ".join(SESSION_VARIABLES),
        )
    return url.difference_update_query(named), taken


def set_url_session(cursor: Any, session: dict[str, str]) -> None:
    """Set the URL's session variables (:func:`url_session_variables`) first, as JDBC's session has them: the
    modes a session keeps come from that sql_mode, and its zone is that time_zone."""
    for name in SESSION_VARIABLES:
        if name in session:
            cursor.execute(f"SET SESSION {name} = %s", (session[name],))


def session_mode(kept: tuple[str, ...]) -> str:
    """The SQL expression of a session's new sql_mode: :data:`BRANCH_SQL_MODE` (a parameter, ``%s``) and those
    of ``kept`` (mode names of this module, never user text) that the session's present mode has, the server's
    one (each a non-empty literal: EMPTY_STRING_IS_NULL, if on, parses this statement too)."""
    picks = "".join(f", IF(FIND_IN_SET('{m}', @@SESSION.sql_mode), '{m}', NULL)" for m in kept)
    return f"CONCAT_WS(',', %s{picks})"


MAX_LOCK_WAIT = 1_073_741_824  # innodb_lock_wait_timeout's maximum: "no limit"


def driver_sql(statement: str) -> str:
    """A statement for SQLAlchemy's exec_driver_sql: PyMySQL formats it with (empty) parameters, so '%' doubles
    (a table named ``a%s`` would otherwise fail, or worse, be formatted)."""
    return statement.replace("%", "%%")


def quote_ident(name: str) -> str:
    """A quoted identifier for a statement run as written (its '%' signs single); through SQLAlchemy, whose
    driver formats every statement, use the connection's preparer."""
    return str(_PREPARER.quote_identifier(name))


def table_name(plan: TargetPlan) -> str:
    return ".".join(quote_ident(p) for p in (plan.schema, plan.table) if p)


def errno_of(exc: BaseException) -> int | None:
    orig = getattr(exc, "orig", exc)
    args = getattr(orig, "args", ())
    if args and isinstance(args[0], int) and not isinstance(args[0], bool):
        return int(args[0])
    return None
