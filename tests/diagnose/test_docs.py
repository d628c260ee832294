"""Every `§` the diagnose code and its tests cite is a section of docs/log-formats.md, the only document they
cite; the formats it lists as read are read."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "log-formats.md"
_REF = re.compile(r"§(\d+(?:\.\d+)?)(?:-§(\d+(?:\.\d+)?))?")


def _sections() -> set[str]:
    return set(re.findall(r"^#{2,3} §(\d+(?:\.\d+)?) ", DOC.read_text(), re.M))


def _sources() -> list[Path]:
    return sorted((ROOT / "diagnose").rglob("*.py")) + sorted((ROOT / "tests" / "diagnose").rglob("*.py"))


def test_every_section_cited_in_diagnose_is_in_docs_log_formats() -> None:
    sections = _sections()
    cited = set()
    for path in _sources():
        for first, last in _REF.findall(path.read_text()):
            cited |= {first, last} - {""}
    assert cited and cited <= sections, sorted(cited - sections)


def test_diagnose_cites_no_document_outside_the_repository() -> None:
    outside = ("LOG_" + "FORMATS", "SPEC" + " §", "SPEC" + ".md")  # the team's notes, not in the repository
    for path in _sources():
        text = path.read_text()
        assert not [name for name in outside if name in text], path
