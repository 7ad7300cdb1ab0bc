"""The cases the docs promise, and the tests that declare them.

docs/monitoring.md and docs/operations.md list every exit code of ``xasink status`` and ``xasink recover`` as
tables of cases (``| case | exit | when | databases |``, a case named like ``status/no-log``); docs/errors.md
names every error class in a heading (``## `BranchError```, the case ``error/BranchError``).  A test declares
what it covers with ``@pytest.mark.doc_case("status/no-log", ...)`` (on the function, or on one
``pytest.param`` of its parametrization).  Two checks keep a declaration honest:

- when the test runs, the autouse fixture ``documented_cases_witnessed`` (tests/conftest.py) fails it unless
  it witnessed each declared case: a run of that command that exited with the documented code (through
  :func:`tests.harness.cli`, :func:`tests.leaks.run_cli` or ``xasink.ops.cli.main``), or an error of exactly
  that class, caught by :func:`raises` / warned under :func:`warns`, or named as ``error_class`` by the CLI's
  ``--json`` error document;
- tests/test_docs.py reads every test module: each documented case is declared by some test, each declared
  case is documented, and a case of both databases is declared by a test that takes the ``db`` fixture (run on
  PostgreSQL and MariaDB).
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
CASE_DOCS = ("monitoring.md", "operations.md")
CLI_COMMANDS = ("status", "recover")
ERROR_PREFIX = "error/"
_HEADER = re.compile(r"^\|\s*case\s*\|\s*exit\s*\|\s*when\s*\|\s*databases\s*\|\s*$")
# the fixtures that run a test on both databases, and on MariaDB (tests/harness.py cli_db, tests/conftest.py)
BOTH_FIXTURES = {"db"}
MARIADB_FIXTURES = {"db", "maria", "mariadb_url"}


@dataclass(frozen=True)
class Case:
    name: str  # status/no-log, error/BranchError
    exit_code: int | None  # the documented exit code of a CLI case; None for an error class
    databases: str  # both, MariaDB, PostgreSQL, or any (an error class: wherever it can arise)
    where: str  # the doc that lists it

    @property
    def command(self) -> str | None:
        head = self.name.split("/", 1)[0]
        return head if head in CLI_COMMANDS else None


def documented_cases(root: Path = ROOT) -> dict[str, Case]:
    """Every case of docs/monitoring.md, docs/operations.md (their case tables) and docs/errors.md (its classes)."""
    found: dict[str, Case] = {}
    for doc in CASE_DOCS:
        for case in case_table(root / "docs" / doc):
            assert case.name not in found, f"case {case.name} listed twice ({found[case.name].where}, {doc})"
            found[case.name] = case
    text = (root / "docs" / "errors.md").read_text(encoding="utf-8")
    for name in re.findall(r"^## `(\w+)`", text, flags=re.M):
        found[ERROR_PREFIX + name] = Case(ERROR_PREFIX + name, None, "any", "errors.md")
    return found


def case_table(path: Path) -> list[Case]:
    """The rows of every ``| case | exit | when | databases |`` table of one doc."""
    out: list[Case] = []
    inside = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if _HEADER.match(line):
            inside = True
            continue
        if not inside:
            continue
        if not line.startswith("|"):
            inside = False
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if set(cells[0]) <= {"-", " ", ":"}:
            continue  # the header's rule
        name = re.fullmatch(r"`([a-z]+/[a-z-]+)`", cells[0])
        assert name is not None, f"{path.name}: a case must be named like `status/no-log`: {line}"
        out.append(Case(name.group(1), int(cells[1]), cells[-1], path.name))
    return out


# --------------------------------------------------------------------------- what a test declares


@dataclass(frozen=True)
class Declaration:
    case: str
    test: str  # module::function
    fixtures: frozenset[str]  # the declaring function's parameters
    one_database: bool = False  # its module is marked one_database: a ``db`` case runs on one database in CI


def declarations(tests_dir: Path = ROOT / "tests") -> list[Declaration]:
    """Every ``pytest.mark.doc_case(...)`` of the test modules, with the function that carries it (in its
    decorators, or in a ``pytest.param`` of its parametrization)."""
    out: list[Declaration] = []
    for path in sorted(tests_dir.glob("test_*.py")):
        source = path.read_text(encoding="utf-8")
        tree = ast.parse(source)
        one_database = bool(re.search(r"^pytestmark = .*pytest\.mark\.one_database", source, re.MULTILINE))
        functions = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        # the module's own fixtures and what they take: a test of ``scene`` runs where ``scene(db)`` does
        local = {
            n.name: {a.arg for a in n.args.args} for n in functions if any(_is_fixture(d) for d in n.decorator_list)
        }
        for node in functions:
            fixtures = _closure({a.arg for a in node.args.args}, local)
            for decorator in node.decorator_list:
                for case in _declared(decorator):
                    out.append(Declaration(case, f"{path.name}::{node.name}", fixtures, one_database))
    return out


def _is_fixture(decorator: ast.AST) -> bool:
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    return isinstance(target, ast.Attribute) and target.attr == "fixture"


def _closure(names: set[str], local: dict[str, set[str]]) -> frozenset[str]:
    todo, found = list(names), set(names)
    while todo:
        for needed in local.get(todo.pop(), set()) - found:
            found.add(needed)
            todo.append(needed)
    return frozenset(found)


def _declared(node: ast.AST) -> Iterator[str]:
    for sub in ast.walk(node):
        if (
            isinstance(sub, ast.Call)
            and isinstance(sub.func, ast.Attribute)
            and sub.func.attr == "doc_case"
            and isinstance(sub.func.value, ast.Attribute)
            and sub.func.value.attr == "mark"
        ):
            for arg in sub.args:
                assert isinstance(arg, ast.Constant) and isinstance(arg.value, str), ast.dump(arg)
                yield arg.value


# --------------------------------------------------------------------------- what a test witnessed


@dataclass(frozen=True)
class Seen:
    command: str | None  # the CLI command run, or None for an error caught in Python
    exit_code: int | None
    error: str | None  # an error class's name


_seen: list[Seen] | None = None  # the current test's, while it declares cases


@contextmanager
def witnessing() -> Iterator[list[Seen]]:
    global _seen
    seen: list[Seen] = []
    _seen = seen
    try:
        yield seen
    finally:
        _seen = None


def record_cli(args: Sequence[str], exit_code: int, stdout: str) -> None:
    """A CLI run: its command, exit code, and the error class of a ``--json`` error document."""
    if _seen is None:
        return
    command = next((a for a in args if not a.startswith("-")), None)
    error = None
    try:
        doc: Any = json.loads(stdout)
    except ValueError:
        doc = None
    if isinstance(doc, dict) and isinstance(doc.get("error_class"), str):
        error = doc["error_class"]
    _seen.append(Seen(command, exit_code, error))


def record_error(cls: type[BaseException]) -> None:
    if _seen is not None:
        _seen.append(Seen(None, None, cls.__name__))


@contextmanager
def raises(expected: type[BaseException], *, match: str | None = None) -> Iterator[pytest.ExceptionInfo[Any]]:
    """``pytest.raises``, and the class of what was raised is witnessed for :func:`missing`."""
    with pytest.raises(expected, match=match) as info:
        yield info
    record_error(type(info.value))


@contextmanager
def warns(expected: type[Warning], *, match: str | None = None) -> Iterator[Any]:
    """``pytest.warns``, and the class of each warning caught is witnessed for :func:`missing`."""
    with pytest.warns(expected, match=match) as caught:
        yield caught
    for w in caught:
        record_error(w.category)


def missing(declared: Sequence[str], seen: Sequence[Seen], cases: dict[str, Case]) -> list[str]:
    """The declared cases this test did not witness, each saying what was expected."""
    out = []
    for name in declared:
        case = cases.get(name)
        if case is None:
            out.append(f"{name}: no such case in docs/ ({', '.join(CASE_DOCS)}, errors.md)")
        elif case.command is not None:
            if not any(s.command == case.command and s.exit_code == case.exit_code for s in seen):
                runs = [(s.command, s.exit_code) for s in seen if s.command]
                out.append(f"{name}: no `xasink {case.command}` run exited {case.exit_code} (runs: {runs})")
        elif not any(s.error == name.removeprefix(ERROR_PREFIX) for s in seen):
            out.append(f"{name}: no {name.removeprefix(ERROR_PREFIX)} was caught (seen: {[s.error for s in seen]})")
    return out
