"""The docs stand alone: no link leaves the repository or points nowhere, and every error and option is documented.

Names are read from the code (xasink/errors.py, xasink/options.py), so a new error class or option fails here
until docs/errors.md or docs/options.md mentions it.  No database, no Spark.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from xasink.options import _IGNORED, _REJECTED, KNOWN

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
    missing += [name for name in sorted(_IGNORED | set(_REJECTED)) if f"`{name}`" not in lower]
    assert missing == []


def test_the_link_check_catches_what_it_should(tmp_path: Path) -> None:
    doc = tmp_path / "x.md"
    doc.write_text("[a](../shared/DESIGN.md) [b](https://spark.apache.org) ```\n[c](nowhere.md)\n```")
    assert _links(doc) == ["../shared/DESIGN.md", "https://spark.apache.org"]
