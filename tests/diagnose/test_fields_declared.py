"""Every message kind declares its fields once (`diagnose.read.fields.FIELDS`: reader, keys and types): what its
reader gives on every sample line of the docs and every line of the real logs is what it declares."""
from __future__ import annotations

import pytest

from toolkit.diagnose.read.fields import FIELDS
from toolkit.diagnose.read.lines import LineParser
from toolkit.diagnose.read.messages import FACT_KINDS, KINDS
from tests.diagnose.test_log_format_differential import REAL_LOGS, doc_sample_lines, format_table_lines


def _events():
    sources = [doc_sample_lines(), format_table_lines()]
    sources += [path.read_text(errors="replace").splitlines() for path in REAL_LOGS]
    for source, lines in enumerate(sources):
        parser = LineParser(source)
        yield from parser.feed(lines)
        yield from parser.finish()
        yield from parser.facts


EVENTS = list(_events())


def test_every_kind_and_fact_declares_its_fields() -> None:
    assert set(FIELDS) == set(KINDS) | FACT_KINDS


def test_the_samples_and_real_logs_hold_most_kinds() -> None:
    assert len({e.kind for e in EVENTS}) >= 45 and len(EVENTS) > 1000


@pytest.mark.parametrize("kind", sorted(FIELDS))
def test_every_field_read_is_declared_with_its_type(kind: str) -> None:
    declared = FIELDS[kind]
    for e in (e for e in EVENTS if e.kind == kind):
        for name, value in e.fields.items():
            if name in declared.keys:  # NOTE: an open kind keeps a value as printed where it reads as no number
                typed = isinstance(value, declared.keys[name]) or (declared.open and isinstance(value, str))
                assert typed, (kind, name, value, e.line)
            else:
                assert declared.open, (kind, name, value, e.line)
