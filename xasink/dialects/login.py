"""What a refused connection means, told so that the user knows what to fix: the server is not reachable, the
login is wrong, the login is right but has no rights on the database, or the database does not exist."""

from __future__ import annotations

from xasink.errors import ConnectError


def connect_error(dialect: str, where: str, user: str | None, database: str | None, text: str) -> ConnectError:
    """The :class:`ConnectError` for the server's first line ``text`` (its secrets removed already)."""
    low = text.lower()
    first = text.splitlines()[0]
    # MySQL 1044 "Access denied for user .. to database ..", PostgreSQL "permission denied for database ..":
    # the password was right, so saying "authentication failed" would send the user after the wrong thing
    if ("to database" in low and "denied" in low) or "permission denied for database" in low:
        return ConnectError(
            f"user '{user}' may not use the database {database} at {where}: the login is right, the rights are "
            "missing: grant what the writer needs (`xasink ddl postgres` or `xasink ddl mysql` prints the GRANTs; "
            f"PostgreSQL: CONNECT on the database too) ({first})"
        )
    if "password" in low or "access denied" in low or "authentication" in low:
        return ConnectError(
            f"authentication failed for user '{user}' at {where}: check the 'user' and 'password' options ({first})"
        )
    if "does not exist" in low or "unknown database" in low:
        return ConnectError(f"{where}: {first}; create it or fix the database in 'url'")
    return ConnectError(
        f"cannot connect to {dialect} at {where}: is the server running and reachable from here? ({first})"
    )
