"""docs/design.md is the index of the NOTE blocks (issue 9: NOTEs state the rules in the code,
the docs link to them instead of copying them): every NOTE the package defines has a row,
every row names a NOTE that exists, and no page of docs/ holds a copy of a NOTE."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_DEFINED = re.compile(r"^\s*# NOTE \[ ([^\]]+) \](?:\s*\(.*\))?\s*$", re.M)
_ROW = re.compile(r"^\| ([^|]+?) \| `(tritondtr|kernels)/", re.M)


def _defined() -> dict[str, Path]:
    """NOTE name -> the file that defines it (a ``# NOTE [ name ]`` line)."""
    out: dict[str, Path] = {}
    for top in ("tritondtr", "kernels"):
        for path in sorted((ROOT / top).rglob("*.py")):
            for name in _DEFINED.findall(path.read_text()):
                assert name not in out, f"NOTE [ {name} ] defined twice: {out[name]}, {path}"
                out[name] = path
    return out


def _indexed() -> set[str]:
    text = (ROOT / "docs" / "design.md").read_text()
    rows = _ROW.findall(text[text.index("## Every NOTE") :])
    return {name.strip() for row, _ in rows for name in row.split(" / ")}


def test_every_note_of_the_package_is_in_the_index():
    missing = sorted(set(_defined()) - _indexed())
    assert not missing, f"NOTEs without a row in docs/design.md: {missing}"


def test_every_row_of_the_index_names_a_note_of_the_package():
    unknown = sorted(_indexed() - set(_defined()))
    assert not unknown, f"docs/design.md rows naming no NOTE in the code: {unknown}"


def test_no_page_of_the_docs_copies_a_note():
    """A NOTE's rules are numbered lines under its title; a page that repeats the title as a
    heading or a quote and numbers rules under it is a copy that will drift."""
    for page in sorted((ROOT / "docs").glob("*.md")):
        text = page.read_text()
        for name in _defined():
            heading = re.search(
                rf"^(?:#+|\s*>)\s*NOTE \[ {re.escape(name)} \][^\n]*\n(?:\s*>?\s*\n)*\s*>?\s*1\. ",
                text,
                re.M,
            )
            assert heading is None, f"{page.name} copies NOTE [ {name} ]: link to it instead"
