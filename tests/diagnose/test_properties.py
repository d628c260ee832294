"""Garbage in: random bytes, truncated and huge lines never raise, and the work grows linearly with the input."""
from __future__ import annotations

import io
import sys
import time

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from toolkit.diagnose import analyze
from toolkit.diagnose.read.lines import LineParser, ParseStats, parse_lines
from toolkit.diagnose.read.source import LineReader, decode_lines
from tests.diagnose import logfactory as lf
from tests.diagnose.test_eras import _era_log

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SAMPLE = [line for era in lf.ERAS for line in _era_log(era).lines]


def _parse_bytes(data: bytes, block: int = 64) -> tuple[list, ParseStats]:
    stats = ParseStats()
    parser = LineParser(0, stats)
    events, no = [], 1
    reader = LineReader(io.BytesIO(data), max_line=4096, chunk=block)
    for chunk in reader.chunks():
        lines = decode_lines(chunk.data[: chunk.size])
        events += parser.feed(lines, no)
        no += len(lines)
    events += parser.finish()
    return events, stats


@SETTINGS
@given(st.binary(max_size=4000))
def test_random_bytes_never_raise(data: bytes) -> None:
    events, stats = _parse_bytes(data)
    for e in events:
        e.fields
    assert stats.lines <= data.count(b"\n") + 1


@SETTINGS
@given(st.lists(st.tuples(st.sampled_from(SAMPLE), st.integers(0, 300), st.text(max_size=20)), max_size=30))
def test_truncated_and_spliced_era_lines_never_raise(cuts: list[tuple[str, int, str]]) -> None:
    lines = [line[:cut] + junk for line, cut, junk in cuts]
    d = analyze(lines=lines)
    assert d.stats.lines == len(lines)
    for e in parse_lines(lines):
        e.fields


@settings(max_examples=10, deadline=None)
@given(st.sampled_from(SAMPLE), st.integers(10_000, 200_000), st.sampled_from(["a", " ", "[", "=", ": ", "9"]))
def test_huge_lines_never_raise(line: str, size: int, filler: str) -> None:
    huge = line + filler * (size // len(filler))
    d = analyze(lines=[huge, filler * size + line, "Scheduler hit an exception: " + "Error" * (size // 5)])
    assert d.stats.lines == 3


def _work(lines: list[str]) -> int:
    """Python line events executed while parsing and analysing `lines` (regex internals are C, not counted)."""
    count = 0

    def tracer(frame, event, arg):
        nonlocal count
        if event == "line":
            count += 1
        return tracer

    sys.settrace(tracer)
    try:
        list(parse_lines(lines))
    finally:
        sys.settrace(None)
    return count


def test_parser_work_is_linear_in_lines() -> None:
    garbage = [s[: i % 120] + "\x00\ufffd" for i, s in enumerate(SAMPLE * 5)]
    mixed = SAMPLE * 5 + garbage
    small, large = _work(mixed), _work(mixed * 4)
    assert 3.5 * small <= large <= 4.5 * small


def _cpu(line: str) -> float:
    best = float("inf")
    for _ in range(3):
        t = time.process_time()
        analyze(lines=[line])
        best = min(best, time.process_time() - t)
    return best


def test_regex_work_is_linear_in_line_length() -> None:
    # Inputs that make a backtracking regex quadratic: long word runs before a literal that never comes.
    for unit in ["a", "HTTP/ - \"x", "Capture " + "w" * 50, "[12:00:00 A", "hit an exceptio", "self.x" * 3]:
        short = unit * (20_000 // len(unit))
        long = unit * (80_000 // len(unit))
        assert _cpu(long) <= 12 * max(_cpu(short), 1e-3)
