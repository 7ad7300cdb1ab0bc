"""The package's layout rules, read from its source with ``ast`` (nothing is imported or run).

SQL in its place: only the dialects (``xasink/dialects/``) and the decision log (``xasink/journal/``) speak SQL.
Elsewhere a module asks a dialect or the journal; it never runs SQL text itself (``exec_driver_sql``,
SQLAlchemy's ``text()``), never decides by the database's name (``conn.dialect.name``), and holds no SQL
statement as a string.  Two kinds of string may still read like SQL, because they are words for people, not
statements a server runs: docstrings, and the arguments of a ``raise`` or of a logging call (an error message
that tells the operator ``SET GLOBAL local_infile = 1`` is advice, not a statement).

The import graph (module-level, ``TYPE_CHECKING`` and function-local imports alike): no import circle among
xasink's modules, no private (underscore) name imported from another module, and no module over 400 lines.
A package's ``__init__`` re-exporting its own children is not a circle.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "xasink"
SQL_SPEAKERS = ("dialects", "journal")  # the folders of xasink/ that may speak SQL
MAX_LINES = 400
SQL_VERB = re.compile(
    r"^\s*(SELECT|INSERT|UPDATE|DELETE|CREATE|DROP|ALTER|TRUNCATE|XA|LOCK|SET|COMMIT|ROLLBACK|PREPARE|SHOW)\s"
)
LOG_CALLS = {"debug", "info", "warning", "warn", "error", "exception", "critical", "log"}


def modules() -> dict[str, Path]:
    """Every module of the package by its dotted name (a package by its own name)."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> Iterator[tuple[str, str | None]]:
    """(module imported, name imported from it or None) for every import of xasink's modules in ``path``."""
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in known:
                    yield alias.name, None
        elif isinstance(node, ast.ImportFrom):
            source = node.module or ""
            if node.level:  # relative: from the package (a module's parent) up
                base = name.split(".")
                base = base if is_package else base[:-1]
                base = base[: len(base) - (node.level - 1)]
                source = ".".join([*base, *([node.module] if node.module else [])])
            for alias in node.names:
                child = f"{source}.{alias.name}"
                if child in known:  # ``from package import module``
                    yield child, None
                elif source in known:
                    yield source, alias.name


def is_docstring(parent: ast.AST | None, node: ast.AST) -> bool:
    body = getattr(parent, "body", None)
    return (
        isinstance(parent, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and isinstance(body, list)
        and bool(body)
        and isinstance(body[0], ast.Expr)
        and body[0].value is node
    )


def is_log_call(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in LOG_CALLS
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id in ("log", "logger", "logging", "_log")
    )


def messages(tree: ast.AST) -> set[int]:
    """ids of the nodes that are words for people: inside a ``raise`` or a logging call."""
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Raise) or is_log_call(node):
            inside.update(id(sub) for sub in ast.walk(node))
    return inside


def text_of(node: ast.AST) -> str | None:
    """A string constant's text, or an f-string's text with each placeholder as ``?``."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(
            v.value if isinstance(v, ast.Constant) and isinstance(v.value, str) else "?" for v in node.values
        )
    return None


def sql_spoken(path: Path) -> list[str]:
    """Where a module outside the dialects and the journal speaks SQL itself."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    text_names = (
        {"text"}
        if any(
            isinstance(n, ast.ImportFrom)
            and (n.module or "").split(".")[0] == "sqlalchemy"
            and any(a.name == "text" for a in n.names)
            for n in ast.walk(tree)
        )
        else set()
    )
    sqlalchemy_names = {"sqlalchemy"} | {
        a.asname
        for n in ast.walk(tree)
        if isinstance(n, ast.Import)
        for a in n.names
        if a.name == "sqlalchemy" and a.asname
    }
    for_people = messages(tree)
    parents = {id(child): parent for parent in ast.walk(tree) for child in ast.iter_child_nodes(parent)}
    where = str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else path.name
    found = []
    for node in ast.walk(tree):
        line = f"{where}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr == "exec_driver_sql":
                found.append(f"{line}: exec_driver_sql")
            elif (
                isinstance(func, ast.Attribute)
                and func.attr == "text"
                and (isinstance(func.value, ast.Name) and func.value.id in sqlalchemy_names)
            ):
                found.append(f"{line}: sqlalchemy's text()")
            elif isinstance(func, ast.Name) and func.id in text_names:
                found.append(f"{line}: sqlalchemy's text()")
        elif (
            isinstance(node, ast.Attribute)
            and node.attr == "name"
            and isinstance(node.value, ast.Attribute)
            and node.value.attr == "dialect"
        ):
            found.append(f"{line}: .dialect.name (ask the dialect instead of switching on the database)")
        else:
            text = text_of(node)
            if text is None or id(node) in for_people:
                continue
            parent = parents.get(id(node))
            if isinstance(parent, ast.JoinedStr):  # its f-string is judged whole
                continue
            if parent is not None and isinstance(parent, ast.Expr) and is_docstring(parents.get(id(parent)), node):
                continue
            if SQL_VERB.match(text):
                found.append(f"{line}: SQL text {text[:60]!r}")
    return found


def test_only_the_dialects_and_the_journal_speak_sql() -> None:
    outside = [path for path in sorted(PACKAGE.rglob("*.py")) if path.relative_to(PACKAGE).parts[0] not in SQL_SPEAKERS]
    assert len(outside) > 20  # the package was found
    assert [spot for path in outside for spot in sql_spoken(path)] == []


def test_the_sql_check_sees_sql(tmp_path: Path) -> None:
    """The check above is not blind: each kind of SQL it looks for is found, and words for people are not."""
    code = '''
"""SELECT 1 in a docstring is prose."""
import sqlalchemy as sa
from sqlalchemy import text

def f(conn, log):
    """UPDATE in a docstring: prose."""
    conn.exec_driver_sql("SELECT 1")
    conn.execute(sa.text("SELECT 2"))
    conn.execute(text("DELETE FROM t"))
    if conn.dialect.name == "postgresql":
        stmt = f"LOCK TABLE {name} IN SHARE MODE"
    log.warning("SET GLOBAL local_infile = 1 to load faster")
    raise ValueError(f"SET GLOBAL x = {1}: advice")
'''
    path = tmp_path / "m.py"
    path.write_text(code)
    found = [spot.split(": ", 1)[1] for spot in sql_spoken(path)]
    assert sorted(found) == sorted(
        [
            "exec_driver_sql",
            "sqlalchemy's text()",
            "sqlalchemy's text()",
            ".dialect.name (ask the dialect instead of switching on the database)",
            "SQL text 'SELECT 1'",
            "SQL text 'SELECT 2'",
            "SQL text 'DELETE FROM t'",
            "SQL text 'LOCK TABLE ? IN SHARE MODE'",
        ]
    )


def circles() -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), but a package with its children."""
    known = modules()
    edges = {name: {dep for dep, _ in imports(name, path, known) if dep != name} for name, path in known.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for name in sorted(edges):
        if name not in index:
            visit(name)

    def family(component: list[str]) -> bool:  # a package and its own modules only
        return all(any(o.startswith(m + ".") or m.startswith(o + ".") for o in component if o != m) for m in component)

    return [c for c in found if not family(c)]


def test_no_import_circles() -> None:
    assert circles() == []


def test_no_private_name_is_imported_from_another_module() -> None:
    known = modules()
    private = [
        f"{name} imports {imported} from {source}"
        for name, path in known.items()
        for source, imported in imports(name, path, known)
        if imported and imported.startswith("_") and not imported.startswith("__") and source != name
    ]
    assert private == []


def test_no_module_is_over_400_lines() -> None:
    long = [
        f"{path.relative_to(ROOT)} ({lines} lines)"
        for path in modules().values()
        if (lines := path.read_text(encoding="utf-8").count("\n")) > MAX_LINES
    ]
    assert long == []
