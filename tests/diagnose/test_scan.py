"""The vectorized block scanner gives exactly what the per-line parser gives: same rows (kind, line, time, rank,
text, source), same counts of other and unread lines, on every era, every prefix and garbled input."""
from __future__ import annotations

import io

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.diagnose_parse import write_log
from toolkit.diagnose.parser import ParseStats, Parser, row_batches
from toolkit.diagnose.reader import LineReader
from toolkit.diagnose.scan import scan
from tests.diagnose import logfactory as lf
from tests.diagnose.test_eras import _era_log

STAMPS = ["[2025-11-11 04:06:27] ", "[2025-11-11 04:06:27 TP3] ", "[2025-11-11 04:06:27 DP1 TP1] ",
          "[2025-11-11 04:06:27.250 TP0] ", "[2025-11-11 04:06:27,999] ", "[2025-11-11 04:06:27.1234 TP0] ",
          "[2025-11-11 04:06:27  TP0 ] ", "[2025-13-11 04:06:27] ", "[2025-02-31 04:06:27] ",
          "[2025-11-11 04:06:27 tp0] ", "[2025-11-11 04:06:27 DP0 PP1 ATTN_CP0 MOE_DP0 TP2 EP2] ",
          "sglang-1  | [2025-11-11 04:06:27 TP0] ", "[12:34:56 TP0] ", "[0000-01-01 00:00:00] ", ""]
BODIES = [
    lf.decode("0.4.9", running=233, token=370959, usage=0.82, throughput=4594.01, queue=317),
    lf.decode("0.5.5", running=3, token=9, usage=0.0, throughput=1.0, queue=0, it=51341),
    lf.decode("0.5.23", running=3, token=9, usage=0.0, throughput=1.0, queue=0),
    lf.prefill("0.4.9", new_seq=4, new_token=8192, cached=512, running=229, queue=313, usage=0.41, token=1),
    lf.prefill("0.5.23", new_seq=4, new_token=8192, cached=512, running=229, queue=313, usage=0.41, token=1),
    lf.prefill("0.3.0", new_seq=1, new_token=5, cached=0, running=2, queue=0, mixed=3),
    'INFO:     127.0.0.1:54321 - "POST /v1/chat/completions HTTP/1.1" 200 OK',
    'INFO:     [::1]:54321 - "GET /health HTTP/1.1" 200 OK',
    'INFO:     127.0.0.1 54321 - "GET /health HTTP/1.1" 200 OK',
    'INFO:     127.0.0.1:5 - "GET /Decode batch HTTP/1.1" 200 OK',
    "Prefill batch. #new-seq: 4, #new-token: 8192",
    "Prefill batch. #new-seq: 4, Decode batch #running-req: 1",
    "Decode batch. #running-req: 1",
    "Decode batch, #running_req: 1",
    lf.retract("0.4.9", k=1, old=0.5, new=1.0),
    "Scheduler hit an exception: Traceback (most recent call last):",
    '  File "scheduler.py", line 10, in run',
    "RuntimeError: Decode out of memory. Try to lower your batch size.",
    "max_total_num_tokens=665690, chunked_prefill_size=8192, max_prefill_tokens=16384, max_running_requests=4096, "
    "context_len=65536, available_gpu_mem=13.50 GB",
    "some other line",
]
LINES = [stamp + body for stamp in STAMPS for body in BODIES]
LINES += ["", "\x00\x01", "caf\u00e9 Decode batch. #running-req: 1"]


def _reference(data: bytes, block: int, max_line: int) -> tuple[list, ParseStats]:
    """The per-line path over decoded blocks, as row_batches read files before the scanner."""
    stats = ParseStats()
    parser = Parser(0, stats)
    reader = LineReader(io.BytesIO(data), max_line=max_line, block=block)
    rows, no = [], 1
    for lines in reader.blocks():
        rows += parser.feed(lines, no)
        no += len(lines)
    for cut in reader.cut:
        stats.note_unread(cut, f"<line longer than {reader.max_line} bytes, cut>")
    stats.unread += reader.num_cut - len(reader.cut)
    rows += parser.finish()
    return rows, stats


def _scanned(tmp_path, data: bytes, block: int, max_line: int, monkeypatch) -> tuple[list, ParseStats]:
    monkeypatch.setattr("toolkit.diagnose.reader.BLOCK", block)
    monkeypatch.setattr("toolkit.diagnose.reader.MAX_LINE", max_line)
    path = tmp_path / "x.log"
    path.write_bytes(data)
    stats = ParseStats()
    rows = [row for batch in row_batches(path, 0, stats) for row in batch]
    return rows, stats


def _same(tmp_path, monkeypatch, data: bytes, block: int = 4 << 20, max_line: int = 1 << 20) -> None:
    got, got_stats = _scanned(tmp_path, data, block, max_line, monkeypatch)
    want, want_stats = _reference(data, block, max_line)
    assert got == want
    for name in ("lines", "other", "unread", "kinds", "unread_examples"):
        assert getattr(got_stats, name) == getattr(want_stats, name), name


def test_scanner_classifies_the_benchmark_log_hot_lines(tmp_path, monkeypatch) -> None:
    path = tmp_path / "mixed.log"
    write_log(str(path), 3000)
    data = path.read_bytes()
    fast = scan(data[:-1])
    assert fast is not None and not fast.slow.any()
    _same(tmp_path, monkeypatch, data, block=64 * 1024)


def test_scanner_equals_the_per_line_parser_on_every_era(tmp_path, monkeypatch) -> None:
    lines = [line for era in lf.ERAS for line in _era_log(era).lines]
    _same(tmp_path, monkeypatch, ("\n".join(lines * 3) + "\n").encode())


def test_scanner_equals_the_per_line_parser_on_every_stamp_and_body(tmp_path, monkeypatch) -> None:
    _same(tmp_path, monkeypatch, ("\n".join(LINES) + "\n").encode(), block=2048)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.sampled_from(LINES), st.integers(0, 200), st.sampled_from(["", "\r", "\x1b[0m", "\xff",
                                                                                          "]", " ", "x"])),
                max_size=60),
       st.sampled_from([64, 256, 4096]), st.sampled_from([80, 1 << 20]), st.booleans())
def test_scanner_equals_the_per_line_parser_on_cut_and_garbled_lines(tmp_path, monkeypatch, cuts, block: int,
                                                                      max_line: int, newline: bool) -> None:
    text = "\n".join(line[:cut] + junk + line[cut:] if cut % 3 == 0 else line[:cut] + junk
                     for line, cut, junk in cuts)
    _same(tmp_path, monkeypatch, text.encode("utf-8", "surrogateescape") + (b"\n" if newline else b""),
          block, max_line)


def _frames_equal(a, b) -> None:
    assert sorted(a.timeline.frames) == sorted(b.timeline.frames)
    for rank, left in a.timeline.frames.items():
        right = b.timeline.frames[rank]
        assert sorted(left.columns) == sorted(right.columns)
        left, right = left[sorted(left.columns)], right[sorted(left.columns)]
        for col in left.columns:
            x, y = left[col].tolist(), right[col].tolist()
            assert [None if v != v else v for v in x] == [None if v != v else v for v in y], col


def _analyses(tmp_path, lines: list[str]):
    from toolkit.diagnose import analyze

    path = tmp_path / "server.log"
    path.write_text("\n".join(lines) + "\n")
    return analyze([path]), analyze(lines=lines)


def test_block_read_fields_equal_parse_fields_in_the_timeline(tmp_path) -> None:
    path = tmp_path / "mixed.log"
    write_log(str(path), 5000)
    lines = path.read_text().splitlines()
    for era in lf.ERAS:
        lines += _era_log(era).lines
    lines += LINES + [s + b for s in STAMPS[:4] for b in (
        "Decode batch. #running-req: 3, #token: 9, token usage: 0.10, accept len: 1.50, cuda graph: False, "
        "gen throughput (token/s): 12.00, #queue-req: 0, ",
        "Decode batch, #running-req: 3, #full token: 9, full token usage: 0.10, #swa token: 5, swa token usage: 0.70, "
        "mystery: 5, gen throughput (token/s): 12.5, #queue-req: 1",
        "Decode batch, #running-req: -3, #token: 12345678, token usage: 1.5%, gen throughput (token/s): 0.001, "
        "#queue-req: 1 ",
        "Prefill batch, #new-seq: 1, #new-token: 64, #cached-token: 0, cache hit rate: 12.50%, token usage: 0.01, "
        "#running-req: 0, #queue-req: 0, #pending-token: 7, cuda graph: True, input throughput (token/s): 5.25",
        "Prefill batch. #new-seq: 1,  #new-token: 64, #running-req: 0, #queue-req: 0.5.1")]
    scanned, per_line = _analyses(tmp_path, lines)
    assert scanned.stats.kinds == per_line.stats.kinds
    _frames_equal(scanned, per_line)
    assert [f.id for f in scanned.findings] == [f.id for f in per_line.findings]
    assert dict(scanned.timeline.events) == dict(per_line.timeline.events)
    assert scanned.config == per_line.config


def test_hot_lines_kept_as_blocks_equal_rows_within_a_window(tmp_path) -> None:
    from toolkit.diagnose import analyze
    from toolkit.diagnose.export import events_frame

    path = tmp_path / "mixed.log"
    write_log(str(path), 3000)
    lines = path.read_text().splitlines() + _era_log("0.4.9").lines
    path.write_text("\n".join(lines) + "\n")
    window = (lf.T0 + 10, lf.T0 + 40)
    scanned, per_line = analyze([path], window=window), analyze(lines=lines, window=window)
    _frames_equal(scanned, per_line)
    assert dict(scanned.timeline.events) == dict(per_line.timeline.events)
    assert events_frame(scanned.timeline).equals(events_frame(per_line.timeline))


def test_scanner_dates_equal_the_per_line_reader_across_the_calendar(tmp_path, monkeypatch) -> None:
    dates = [f"{y:04d}-{m:02d}-{d:02d}" for y in (1, 4, 100, 1600, 1900, 1969, 1970, 2000, 2024, 2025, 9999)
             for m in (1, 2, 3, 12) for d in (1, 28, 29, 30, 31)]
    lines = [f"[{date} 23:59:59{ms} TP0] Decode batch, #running-req: 1, #token: 2, token usage: 0.00, "
             "gen throughput (token/s): 1.00, #queue-req: 0" for date in dates for ms in ("", ".999")]
    assert not scan("\n".join(lines).encode()).slow.any()
    _same(tmp_path, monkeypatch, ("\n".join(lines) + "\n").encode())
