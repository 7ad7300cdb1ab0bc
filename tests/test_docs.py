"""The docs stand alone: no link leaves the repository or points nowhere, and every error and option is documented.

Names are read from the code (xasink/errors.py, xasink/options.py), so a new error class or option fails here
until docs/errors.md or docs/options.md mentions it.  No database, no Spark.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests import doc_cases
from xasink.options import IGNORED, KNOWN, REJECTED

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# [text](target) and ![alt](target); the target ends at whitespace or ')'
_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def _links(path: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S)  # code blocks hold no links
    return _LINK.findall(text)


def _anchors(path: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to dashes."""
    out = set()
    text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S)
    for line in text.splitlines():
        m = re.match(r"#{1,6}\s+(.*)", line)
        if m:
            title = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower().replace("`", ""))
            out.add(title.replace(" ", "-"))
    return out


def test_docs_exist() -> None:
    names = {p.name for p in DOCS}
    assert {"README.md", "protocol.md", "options.md", "operations.md", "errors.md", "migration.md"} <= names


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_stay_inside_the_repository_and_resolve(doc: Path) -> None:
    bad = []
    for target in _links(doc):
        if _SCHEME.match(target) or target.startswith("//"):
            continue  # an external link (https:, mailto:): allowed, not followed
        path, _, anchor = target.partition("#")
        dest = (doc.parent / path).resolve() if path else doc
        if path.startswith("/") or not dest.is_relative_to(ROOT):
            bad.append(f"{target}: leaves the repository")
        elif not dest.exists():
            bad.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            bad.append(f"{target}: no heading #{anchor} in {dest.relative_to(ROOT)}")
    assert bad == [], f"{doc.relative_to(ROOT)}: {bad}"


def _error_classes() -> list[str]:
    tree = ast.parse((ROOT / "xasink" / "errors.py").read_text(encoding="utf-8"))
    return [node.name for node in tree.body if isinstance(node, ast.ClassDef)]


def test_every_error_class_is_documented() -> None:
    classes = _error_classes()
    assert "OptionError" in classes  # the parse found the module's classes
    text = (ROOT / "docs" / "errors.md").read_text(encoding="utf-8")
    headings = set(re.findall(r"^## `(\w+)`", text, flags=re.M))
    assert [c for c in classes if c not in headings] == []


def test_every_option_is_documented() -> None:
    text = (ROOT / "docs" / "options.md").read_text(encoding="utf-8")
    missing = [name for name in KNOWN.values() if f"`{name}`" not in text]
    # accepted-and-ignored and refused options are named too (any case: the code keeps them lower-cased)
    lower = text.lower()
    missing += [name for name in sorted(IGNORED | set(REJECTED)) if f"`{name}`" not in lower]
    assert missing == []


def _python_blocks(text: str) -> list[str]:
    """The ```python blocks; a fragment that starts with ``.option(...)`` is read as a writer's call chain."""
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    return ["w" + b if b.lstrip().startswith(".") else b for b in blocks]


def _example_problems(text: str) -> list[str]:
    """What is wrong with a page's Python examples: a syntax error, a private or missing ``xasink.`` name,
    an ``.option(...)`` xasink does not know (Spark's own streaming options aside)."""
    import xasink

    accepted = {name.lower() for name in KNOWN.values()} | set(IGNORED) | set(REJECTED)
    accepted |= {"checkpointlocation", "queryname"}  # Spark's own, read by Spark beside xasink's
    bad = []
    for block in _python_blocks(text):
        try:
            tree = ast.parse(block)
        except SyntaxError as e:
            bad.append(f"does not parse ({e.msg}, line {e.lineno}): {block.splitlines()[0]!r}")
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "xasink":
                if node.attr not in xasink.__all__:
                    bad.append(f"xasink.{node.attr} is not public")
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "option"
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
                and node.args[0].value.lower() not in accepted
            ):
                bad.append(f"option {node.args[0].value!r} is unknown")
    return bad


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_python_examples_parse_and_name_real_options_and_functions(doc: Path) -> None:
    assert _example_problems(doc.read_text(encoding="utf-8")) == [], doc.relative_to(ROOT)


def test_the_example_check_catches_what_it_should() -> None:
    text = "```python\nf(x))\n```\n```python\n.option('sinkID', 1).option('sinkName', 2)\nxasink._x\n```"
    assert sorted(_example_problems(text)) == [
        "does not parse (unmatched ')', line 1): 'f(x))'",
        "option 'sinkName' is unknown",
        "xasink._x is not public",
    ]


def test_the_link_check_catches_what_it_should(tmp_path: Path) -> None:
    doc = tmp_path / "x.md"
    doc.write_text("[a](../shared/DESIGN.md) [b](https://spark.apache.org) ```\n[c](nowhere.md)\n```")
    assert _links(doc) == ["../shared/DESIGN.md", "https://spark.apache.org"]


def test_the_code_layout_lists_every_module() -> None:
    """docs/protocol.md's code layout names every module of the package (a dialect's modules may share a line,
    as ``dialects/mysql/__init__.py, dialect.py, ...``, continued on a deeper-indented line; a folder's
    own line, ``  protocol/``, holds the deeper-indented modules below it)."""
    text = (ROOT / "docs" / "protocol.md").read_text(encoding="utf-8")
    layout = text[text.index("## Code layout") :].split("```")[1]
    named: set[str] = set()
    folder = ""
    for line in layout.splitlines():
        heading = re.match(r"  (\w+)/\s", line)  # a folder's own line: the modules below it are in it
        if heading:
            folder = heading.group(1) + "/"
            continue
        head = re.match(r"(\s*)((?:[\w/]+/)?)([\w.]+\.py)", line)
        if not head:
            continue
        if head.group(2) or len(head.group(1)) <= 2:  # else the folder above, or the continued line above
            folder = head.group(2)
        for name in re.findall(r"([\w/]+\.py)", line):
            named.add(name if "/" in name else folder + name)
    modules = {str(p.relative_to(ROOT / "xasink")) for p in (ROOT / "xasink").rglob("*.py")}
    assert len(modules) > 40  # the package was found
    assert sorted(modules - named) == []


# --------------------------------------------------------------------------- every documented case has a test


def _coverage_problems(cases: dict[str, doc_cases.Case], declared: list[doc_cases.Declaration]) -> list[str]:
    """What is wrong between the docs' cases and the tests' declarations (tests/doc_cases.py)."""
    problems = [f"{d.case} ({d.test}): declared, but no doc lists it" for d in declared if d.case not in cases]
    for case in cases.values():
        by = [d for d in declared if d.case == case.name]
        if not by:
            problems.append(f"{case.name} ({case.where}): no test declares it")
            continue
        need = {"both": doc_cases.BOTH_FIXTURES, "MariaDB": doc_cases.MARIADB_FIXTURES}.get(case.databases)
        # a module marked one_database runs each ``db`` case on one database in CI: it does not count as both
        if need is not None and not any((d.fixtures - {"db"} if d.one_database else d.fixtures) & need for d in by):
            problems.append(
                f"{case.name} ({case.where}): on {case.databases}, but no declaring test takes {sorted(need)}: "
                f"{[d.test for d in by]}"
            )
    return problems


def test_every_documented_case_has_a_test_that_declares_it() -> None:
    """docs/monitoring.md, docs/operations.md and docs/errors.md: each exit-code case and error class is declared
    by a test (``@pytest.mark.doc_case``), which fails at run time unless it witnessed it (tests/conftest.py)."""
    cases = doc_cases.documented_cases()
    # the parse found the tables and the headings (a renamed column would make every list empty)
    assert {"status/no-log", "status/cannot-write", "recover/no-log", "recover/no-sink"} <= set(cases)
    assert {"error/XasinkError", "error/PreflightError", "error/XasinkWarning"} <= set(cases)
    assert {c.exit_code for c in cases.values() if c.command == "status"} == {0, 1, 2, 3}
    assert {c.exit_code for c in cases.values() if c.command == "recover"} == {0, 1, 2}
    assert {f"error/{c}" for c in _error_classes()} <= set(cases)
    assert _coverage_problems(cases, doc_cases.declarations()) == []


def test_the_case_check_catches_what_it_should(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    table = "| case | exit | when | databases |\n| --- | --- | --- | --- |\n"
    (docs / "monitoring.md").write_text(table + "| `status/one` | 3 | a | both |\n| `status/two` | 2 | b | MariaDB |\n")
    (docs / "operations.md").write_text("no table here\n")
    (docs / "errors.md").write_text("## `OptionError`\n\ntext\n")
    cases = doc_cases.documented_cases(tmp_path)
    assert [(c.name, c.exit_code, c.databases) for c in cases.values()] == [
        ("status/one", 3, "both"),
        ("status/two", 2, "MariaDB"),
        ("error/OptionError", None, "any"),
    ]
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "test_x.py").write_text(
        "import pytest\n"
        "@pytest.mark.doc_case('status/one')\n"
        "def test_a(pg_url): ...\n"
        "@pytest.mark.parametrize('x', [pytest.param(1, marks=pytest.mark.doc_case('status/two', 'status/gone'))])\n"
        "def test_b(x, mariadb_url): ...\n"
    )
    found = doc_cases.declarations(tests)
    assert [(d.case, d.test) for d in found] == [
        ("status/one", "test_x.py::test_a"),
        ("status/two", "test_x.py::test_b"),
        ("status/gone", "test_x.py::test_b"),
    ]
    assert _coverage_problems(cases, found) == [
        "status/gone (test_x.py::test_b): declared, but no doc lists it",
        "status/one (monitoring.md): on both, but no declaring test takes ['db']: ['test_x.py::test_a']",
        "error/OptionError (errors.md): no test declares it",
    ]
    # a db test in a module marked one_database runs on one database in CI: it does not cover a case of both
    (tests / "test_x.py").write_text(
        "import pytest\n"
        "pytestmark = [pytest.mark.spark, pytest.mark.one_database]\n"
        "@pytest.mark.doc_case('status/one')\n"
        "def test_a(db): ...\n"
    )
    found = doc_cases.declarations(tests)
    assert [d.one_database for d in found] == [True]
    assert "status/one (monitoring.md): on both, but no declaring test takes ['db']: ['test_x.py::test_a']" in (
        _coverage_problems(cases, found)
    )
    seen = [doc_cases.Seen("status", 3, None), doc_cases.Seen(None, None, "PreflightError")]
    assert doc_cases.missing(["status/one", "status/two", "error/OptionError", "status/nope"], seen, cases) == [
        "status/two: no `xasink status` run exited 2 (runs: [('status', 3)])",
        "error/OptionError: no OptionError was caught (seen: [None, 'PreflightError'])",
        "status/nope: no such case in docs/ (monitoring.md, operations.md, errors.md)",
    ]


def _table_problems(text: str) -> list[str]:
    """Rows of a Markdown table with another number of cells than its header (a stray row of another table)."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    problems, width = [], None
    for line in text.splitlines():
        if not line.startswith("|"):
            width = None
            continue
        cells = len(re.sub(r"`[^`]*`", "code", line.strip().strip("|")).split("|"))  # a `|` in code is no border
        if width is None:
            width = cells
        elif cells != width:
            problems.append(f"{cells} cells under a header of {width}: {line[:80]}")
    return problems


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_table_row_has_its_headers_cells(doc: Path) -> None:
    assert _table_problems(doc.read_text(encoding="utf-8")) == []


def test_the_table_check_catches_what_it_should() -> None:
    text = "| a | b |\n|---|---|\n| 1 | `x|y` |\n| 1 | 2 | 3 |\n\n| c |\n|---|\n| 4 |\n"
    assert _table_problems(text) == ["3 cells under a header of 2: | 1 | 2 | 3 |"]
