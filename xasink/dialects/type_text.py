"""Column types as text: createTableColumnTypes entries, read alike for every database (a type name, up to two
numbers, UNSIGNED), and a type SQLAlchemy does not reflect, by the server's own name for it."""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa

from xasink.errors import PreflightError

_TYPE = r"\s*([A-Za-z][A-Za-z0-9 ]*?)\s*(?:\(\s*(\d+)\s*(?:,\s*(\d+)\s*)?\))?\s*"
_PLAIN = re.compile(_TYPE)
_UNSIGNED = re.compile(_TYPE + r"(unsigned)?\s*", re.I)

# a type's class, its name (aliases resolved), its numbers and whether UNSIGNED was asked: the type
Build = Callable[[Any, str, list[int], bool], "sa.types.TypeEngine[Any]"]


@contextmanager
def reflecting() -> Iterator[None]:
    """SQLAlchemy's reflection without its warning for a column type it does not know ("Did not recognize type
    'inet6'"): the dialect names each such column by the server's type (``name_unknown_types``), and the user
    saw the warning for every batch, with nothing to do about it."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Did not recognize type", category=sa.exc.SAWarning)
        yield


def reflected_columns(insp: sa.Inspector, table: str, schema: str | None) -> list[Any]:
    with reflecting():
        return list(insp.get_columns(table, schema=schema))


def reflected_table(conn: sa.Connection, table: str, schema: str | None) -> sa.Table:
    with reflecting():
        return sa.Table(table, sa.MetaData(schema=schema), autoload_with=conn)


class ServerType(sa.types.UserDefinedType):  # type: ignore[type-arg]
    """A column type SQLAlchemy does not reflect (PostgreSQL's point, xml, an extension's; MariaDB's inet6,
    inet4, uuid), by the name the server gives it: a shadow's column is made of it, a string cast to it."""

    cache_ok = True

    def __init__(self, name: str) -> None:
        self.name = name

    def get_col_spec(self, **kw: Any) -> str:
        return self.name


def parse_type_text(
    text: str,
    database: str,
    names: Mapping[str, Any],
    aliases: Mapping[str, str],
    build: Build,
    unsigned: tuple[type, ...] = (),
) -> sa.types.TypeEngine[Any]:
    """The type an entry names, among a SQLAlchemy dialect's ``names`` (after ``aliases``), UNSIGNED allowed for
    subclasses of ``unsigned``; a PreflightError that quotes the entry when it cannot be read, names no type of
    ``database``, or takes no such numbers."""
    m = (_UNSIGNED if unsigned else _PLAIN).fullmatch(text)
    if m is None:
        raise PreflightError(f"createTableColumnTypes: cannot parse type {text!r}")
    name = " ".join(m.group(1).lower().split())
    is_unsigned = bool(unsigned) and m.group(4) is not None
    if unsigned and name.endswith(" unsigned"):
        name, is_unsigned = name[: -len(" unsigned")], True
    name = aliases.get(name, name)
    cls = names.get(name)
    if cls is None:
        raise PreflightError(f"createTableColumnTypes: unknown {database} type {text!r}")
    if is_unsigned and not issubclass(cls, unsigned):
        raise PreflightError(f"createTableColumnTypes: type {text!r} cannot be UNSIGNED")
    args = [int(a) for a in m.groups()[1:3] if a is not None]
    try:
        return build(cls, name, args, is_unsigned)
    except TypeError:
        raise PreflightError(f"createTableColumnTypes: type {text!r} takes no such arguments") from None
