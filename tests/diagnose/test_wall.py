"""The wall between reading and judging: everything that touches a log's text lives in `diagnose/read/`; the judging
room (config, timeline, rules, findings, advice, fleet, the outputs) reads typed events and never a regex or an
event's raw text, and the reading room never imports the judging room."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "diagnose"
READ = ROOT / "read"
JUDGE = sorted(p for p in ROOT.rglob("*.py") if READ not in p.parents)
READER = sorted(READ.rglob("*.py"))


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def _name(path: Path) -> str:
    return str(path.relative_to(ROOT.parent))


@pytest.mark.parametrize("path", JUDGE, ids=_name)
def test_the_judging_room_holds_no_regular_expression(path: Path) -> None:
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.Import):
            assert all(alias.name != "re" for alias in node.names), f"{_name(path)}:{node.lineno} imports re"
        if isinstance(node, ast.ImportFrom):
            assert node.module != "re", f"{_name(path)}:{node.lineno} imports from re"


@pytest.mark.parametrize("path", JUDGE, ids=_name)
def test_the_judging_room_never_reads_an_events_text(path: Path) -> None:
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.Attribute):
            assert node.attr != "text", f"{_name(path)}:{node.lineno} reads .text"


@pytest.mark.parametrize("path", JUDGE, ids=_name)
def test_the_judging_room_reads_only_what_the_reading_room_hands_out(path: Path) -> None:
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("toolkit.diagnose.read"):
            private = [alias.name for alias in node.names if alias.name.startswith("_")]
            assert not private, f"{_name(path)}:{node.lineno} imports {private}"


@pytest.mark.parametrize("path", READER, ids=_name)
def test_the_reading_room_never_imports_the_judging_room(path: Path) -> None:
    for node in _tree(path).body:  # NOTE: module level: `export` runs an analysis from inside a function
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("toolkit.diagnose."):
            assert node.module.startswith("toolkit.diagnose.read"), f"{_name(path)}:{node.lineno} imports {node.module}"


def test_the_rooms_are_where_the_wall_says() -> None:
    assert len(JUDGE) > 30 and len(READER) > 20
    assert {p.name for p in JUDGE} >= {"config.py", "timeline.py", "findings.py", "advice.py", "fleet.py",
                                      "report_json.py", "report_terminal.py", "plots.py"}
