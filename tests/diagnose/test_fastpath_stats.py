"""vLLM's stats lines read by the fast path (`fastpath.stats`): the common forms are read there (hot), every line
read there has exactly the fields `parse_fields` gives it, and a log whose year-less clock wraps reads as the
per-line parser reads it, whichever lines around the wrap are hot. The equality of whole reads on every stamp and
body (stats bodies among them) is `test_fastpath.py`'s."""
from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from toolkit.diagnose.read.fastpath.scan import scan_chunk
from toolkit.diagnose.read.fields import parse_fields
from toolkit.diagnose.read.source import PAD
from tests.diagnose.test_fastpath import STATS_BODIES, _read, _same, _table_rows, export_against_per_line

V1 = "(APIServer pid=1) INFO {date} [loggers.py:123] "


def _scanned(lines: list[str]):
    data = bytearray("\n".join(lines).encode()) + bytearray(PAD)
    return scan_chunk(data, len(data) - PAD)


def test_the_common_forms_are_read_by_the_fast_path() -> None:
    lines = [V1.format(date="11-11 04:06:27") + body for body in STATS_BODIES[:4]]
    lines += ["(EngineCore_DP3 pid=9) INFO 11-11 04:06:28.5 [loggers.py:123] " + STATS_BODIES[0],
              "INFO 11-11 04:06:29 metrics.py:345] " + STATS_BODIES[1]]
    scanned = _scanned(lines)
    assert not scanned.slow.any()
    stats = scanned.stats
    assert [stats.ranks[r] for r in stats.rank.tolist()] == ["DP0", "", "DP*", "", "DP3", ""]
    assert stats.fields["engine"][0] == 0 and stats.fields["engines"][2] == 4
    assert stats.fields["token_usage"].tolist()[:4] == [0.797, 0.991, 0.12, 0.05]
    assert stats.fields["running_req"][3] == 3, "a later piece of the same name wins, as in parse_fields"


def test_other_forms_stay_with_the_per_line_parser() -> None:
    lines = [V1.format(date="11-11 04:06:27") + body for body in STATS_BODIES[4:]]
    lines += [V1.format(date="13-11 04:06:27") + STATS_BODIES[0], '("x pid=1) INFO 11-11 04:06:27 [a.py:1] '
              + STATS_BODIES[0], "[2025-11-11 04:06:27] " + V1.format(date="11-11 04:06:27") + STATS_BODIES[0],
              V1.format(date="11-11 04:06:27") + STATS_BODIES[0] + " " + V1.format(date="11-11 04:06:28")
              + STATS_BODIES[0]]
    assert _scanned(lines).slow.all()


KEYS = st.sampled_from(["Avg prompt throughput", "Running", "Waiting", "GPU KV cache usage", "CPU KV cache usage",
                        "Prefix cache hit rate", "Swapped", "mystery Key", "Engine", "token usage"])
NUMBERS = st.one_of(st.integers(0, 10**15).map(str), st.floats(0, 1e9, allow_nan=False).map(lambda x: f"{x:.3f}"),
                    st.sampled_from(["0", "007", "1.5", "99.99", "1" * 15 + ".5", "1" * 16, "1e5", "-1", "1.", ".5"]))
UNITS = st.sampled_from([" tokens/s", " reqs", "%", "", " GB"])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(KEYS, NUMBERS, UNITS), min_size=1, max_size=8), st.sampled_from(["", "Engine 002: ",
                                                                                         "2 Engines Aggregated: "]),
       st.sampled_from(["", "."]))
def test_fields_read_by_the_fast_path_equal_parse_fields(pieces, tag, end) -> None:
    message = tag + "Avg prompt throughput: 1.0 tokens/s" + "".join(f", {k}: {n}{u}" for k, n, u in pieces) + end
    scanned = _scanned([V1.format(date="11-11 04:06:27") + message])
    if scanned.slow[0]:
        return
    want = {k: float(v) for k, v in parse_fields("stats", message).items()}
    got = {name: values[0] for name, values in scanned.stats.fields.items() if not math.isnan(values[0])}
    assert got == want, message


def _year_end_log() -> list[str]:
    """A vLLM log across the new year: hot stats lines and loud lines (an error, a preemption) on both sides of the
    wrap, then a clock that jumps back by more than half a year (read as another wrap) among stats lines alone."""
    error = "ERROR {date} [core.py:1] EngineCore encountered an issue. See stack trace (above) for the root cause."
    preempt = "(EngineCore_DP0 pid=9) WARNING {date} [scheduler.py:1] Preempted request cmpl-1-0 has been resumed!"
    dates = ["12-31 23:59:5" + str(s) for s in range(10)] + ["01-01 00:00:0" + str(s) for s in range(10)]
    lines = []
    for i, date in enumerate(dates):
        lines.append(V1.format(date=date) + STATS_BODIES[i % 2])
        if i % 7 == 3:
            lines.append((error if i % 2 else preempt).format(date=date))
    lines += [V1.format(date=date) + STATS_BODIES[0] for date in ("06-01 00:00:00", "01-01 00:00:00", "12-31 00:00:00",
                                                                   "06-30 00:00:00", "01-02 00:00:00")]
    return lines


@pytest.mark.parametrize("processes", [False, True], ids=["threads", "processes"])
@pytest.mark.parametrize("chunk", [300, 1024, 1 << 20])
def test_a_year_less_clock_that_wraps_reads_as_the_per_line_parser_reads_it(tmp_path, monkeypatch, processes,
                                                                            chunk: int) -> None:
    data = ("\n".join(_year_end_log()) + "\n").encode()
    _same(tmp_path, monkeypatch, data, chunk=chunk, processes=processes)
    got, _ = _read(tmp_path, monkeypatch, data, chunk, 1 << 20, fast=True, processes=processes)
    times = _table_rows(got)["stats"]["time"]
    assert times[:20] == sorted(times[:20]) and times[19] - times[0] == 19, "the new year follows the old one"
    assert times[23] - times[0] > 366 * 86400, "a jump back by more than half a year reads as one more wrap"


@pytest.mark.parametrize("processes", [False, True], ids=["threads", "processes"])
def test_the_export_puts_stats_rows_on_the_clock_the_analysis_reads(tmp_path, monkeypatch, processes) -> None:
    """The export's workers write the stats rows with the scan (times before any wrap); each row's time is the
    one the reader gave it, as the per-line parser's events have it, across the new year."""
    got, want = export_against_per_line(tmp_path, monkeypatch, _year_end_log(), 300, processes)
    stats = got[got["kind"] == "stats"]
    assert len(stats) == 25 and stats["running_req"].notna().all()
    assert stats["timestamp"].is_monotonic_increasing is False, "the clock's jump back is kept, as read"


STATS = V1.format(date="11-11 04:06:0{s}") + "Engine 000: Avg prompt throughput: 1.0 tokens/s, Running: 2 reqs"


@pytest.mark.parametrize("extra", [", Line: 3", ", Time: 7", ", Source: 1", ", Rank: 1",
                                   ", Foo: 123456789012345.123456789012345", ", Foo: 123456789012345.12345678901234"])
@pytest.mark.parametrize("processes", [False, True], ids=["threads", "processes"])
def test_pieces_named_like_a_table_s_columns_or_too_long_read_as_the_per_line_parser_reads_them(
        tmp_path, monkeypatch, extra: str, processes: bool) -> None:
    """A piece named like a table's own column (`line`, `time`, `source`, `rank`) is no field on either path (the
    prefix says those; the fast path once let it replace the column); a number of 31 characters is text to
    `parse_fields`, so the line is the per-line parser's."""
    data = ("\n".join([STATS.format(s=1), STATS.format(s=2) + extra, STATS.format(s=3)]) + "\n").encode()
    _same(tmp_path, monkeypatch, data, chunk=1 << 20, processes=processes)
    got, _ = _read(tmp_path, monkeypatch, data, 1 << 20, 1 << 20, fast=True, processes=processes)
    rows = _table_rows(got)["stats"]
    assert rows["line"] == [1, 2, 3] and rows["time"] == sorted(rows["time"]) and len(set(rows["rank"])) == 1


def test_the_first_and_last_stats_message_are_in_line_order_across_hot_and_per_line_lines(tmp_path,
                                                                                         monkeypatch) -> None:
    """The first stats message tells vLLM's version: a V1 line read hot before a V0 line the per-line parser reads (a
    trailing blank keeps it off the fast path) stays the first (`_same` compares what the reads tell)."""
    v1 = "INFO 11-11 04:06:01 [metrics.py:345] " + STATS_BODIES[0]
    v0 = "INFO 11-11 04:06:02 [metrics.py:345] " + STATS_BODIES[1] + " "
    data = ("\n".join([v1, v0]) + "\n").encode()
    _same(tmp_path, monkeypatch, data, chunk=1 << 20)
    got, _ = _read(tmp_path, monkeypatch, data, 1 << 20, 1 << 20, fast=True)
    assert got.vllm_generation == "V1"
