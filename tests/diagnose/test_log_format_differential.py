"""Both readers of `diagnose.log_format` give the same events: the fast path (`diagnose.fastpath`) and the per-line
parser (`diagnose.lines`) read every sample line of docs/log-formats.md (and the one-per-form samples of
`test_formats.py`) and every file of the real-log corpus to the same kind, line, time, rank and fields, with the
same counts of other and unread lines. Lines that neither reads are fine; a line either reads must read the same
in both."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from toolkit.diagnose.fastpath.scan import scan_chunk
from toolkit.diagnose.prefix import read_prefix
from toolkit.diagnose.source import PAD
from tests.diagnose.test_fastpath import _read, _table_rows
from tests.diagnose.test_formats import FORMATS, QUOTES, VLLM_ERRORS

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "log-formats.md"
REAL_LOGS = sorted((Path(__file__).parent / "real_logs").rglob("*.log"))
STAMP = "[2025-11-11 04:06:27.250 DP1 TP0] "  # SGLang's stamp since 0.3.6 (the fast path's layout), put in
# place of each sample's own prefix so that the fast path meets every sample message
_FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.M | re.S)
_SPAN = re.compile(r"`([^`\n]{8,})`")


def doc_sample_lines() -> list[str]:
    """The lines of every code block of docs/log-formats.md, then its inline code spans (`...`)."""
    text = DOC.read_text(encoding="utf-8")
    blocks = [line for block in _FENCE.findall(text) for line in block.splitlines() if line.strip()]
    spans = _SPAN.findall(_FENCE.sub("", text))
    return blocks + spans


def format_table_lines() -> list[str]:
    """Every sample of tests/diagnose/test_formats.py: one per documented form, multi-line records, quotes."""
    lines = [line for _, text, *_ in FORMATS for line in text.split("\n")]
    return lines + [line for _, record, _ in VLLM_ERRORS for line in record] + [line for _, line in QUOTES]


def _assert_same_events(tmp_path, monkeypatch, data: bytes, chunk: int) -> None:
    """The approach of tests/diagnose/test_fastpath.py: one file read with `fast=True` and with `fast=False`."""
    got, got_stats = _read(tmp_path, monkeypatch, data, chunk, 1 << 20, fast=True)
    want, want_stats = _read(tmp_path, monkeypatch, data, chunk, 1 << 20, fast=False)
    assert _table_rows(got) == _table_rows(want)
    assert got.events == want.events
    for name in ("lines", "other", "unread", "kinds", "unread_examples"):
        assert getattr(got_stats, name) == getattr(want_stats, name), name


def _hot_lines(data: bytes) -> int:
    """How many lines of `data` the fast path reads itself (the rest go to the per-line parser)."""
    chunk = bytearray(data) + bytearray(PAD)
    return int((~scan_chunk(chunk, len(data)).slow).sum())


def test_the_docs_have_sample_lines_of_batch_stats_and_startup_messages() -> None:
    lines = doc_sample_lines()
    for start in ("Decode batch", "Prefill batch", "Avg prompt throughput", "Load weight begin"):
        assert any(start in line for line in lines), start


@pytest.mark.parametrize("stamped", [False, True], ids=["as-printed", "sglang-stamp"])
@pytest.mark.parametrize("samples", [doc_sample_lines, format_table_lines], ids=["docs", "format-table"])
def test_every_sample_line_reads_the_same_in_both_paths(tmp_path, monkeypatch, samples, stamped: bool) -> None:
    lines = samples()
    if stamped:
        lines = [STAMP + line[read_prefix(line).start:] for line in lines]
    data = ("\n".join(lines) + "\n").encode()
    if stamped:
        assert _hot_lines(data) >= 4  # the fast path reads the docs' plain decode and prefill lines itself
    for chunk in (256, 8 << 20):
        _assert_same_events(tmp_path, monkeypatch, data, chunk)


@pytest.mark.parametrize("path", REAL_LOGS, ids=[p.stem for p in REAL_LOGS])
def test_every_real_log_reads_the_same_in_both_paths(tmp_path, monkeypatch, path: Path) -> None:
    data = path.read_bytes()
    for chunk in (4096, 8 << 20):
        _assert_same_events(tmp_path, monkeypatch, data, chunk)


def test_the_fast_path_reads_part_of_the_real_log_corpus() -> None:
    assert len(REAL_LOGS) >= 40
    assert sum(_hot_lines(path.read_bytes()) for path in REAL_LOGS) > 0
