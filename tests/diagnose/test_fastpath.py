"""The fast path gives exactly what the per-line parser gives: the same batch lines (kind, line, time, rank and
every field), the same events and the same counts of other and unread lines, on every era, every stamp and
body, cut and garbled lines, random pieces and the whole calendar; and the same timelines and findings."""
from __future__ import annotations

import math
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.diagnose_parse import write_log
from toolkit.diagnose import analyze
from toolkit.diagnose.read.batch import KEYS
from toolkit.diagnose.read.fastpath.scan import scan_chunk
from toolkit.diagnose.read.fields import parse_fields
from toolkit.diagnose.read.lines import ParseStats
from toolkit.diagnose.read.logs import read_logs
from toolkit.diagnose.read.source import PAD
from tests.diagnose import logfactory as lf
from tests.diagnose.test_eras import _era_log

STAMPS = ["[2025-11-11 04:06:27] ", "[2025-11-11 04:06:27 TP3] ", "[2025-11-11 04:06:27 DP1 TP1] ",
          "[2025-11-11 04:06:27.250 TP0] ", "[2025-11-11 04:06:27,999] ", "[2025-11-11 04:06:27.1234 TP0] ",
          "[2025-11-11 04:06:27  TP0 ] ", "[2025-13-11 04:06:27] ", "[2025-02-31 04:06:27] ",
          "[2025-11-11 04:06:27 tp0] ", "[2025-11-11 04:06:27 DP0 PP1 ATTN_CP0 MOE_DP0 TP2 EP2] ",
          "sglang-1  | [2025-11-11 04:06:27 TP0] ", "[12:34:56 TP0] ", "[0000-01-01 00:00:00] ", "",
          "[2025-11-11 04:06:27]", "(APIServer pid=1) INFO 11-11 04:06:27 [loggers.py:335] ",
          "[2025-03-10T15:07:20Z] ERROR 03-10 08:07:20 [core.py:302] ", "> ERROR 04-05 01:12:55 [core.py:390] ",
          "[rank0]: ", "2024-04-27 10:13:05 | ERROR | stderr | ", "**",
          "(EngineCore_DP1 pid=77) INFO 02-29 23:59:59.123 [loggers.py:335] ", "INFO 12-31 23:59:59 metrics.py:345] ",
          "(APIServer pid=1) INFO 02-30 04:06:27 [loggers.py:335] ", '("x pid=1) INFO 11-11 04:06:27 [loggers.py:335] ']
# vLLM's stats lines: V1 and V0 forms, data-parallel engines, other devices, and pieces the fast path leaves
STATS_BODIES = [
    "Engine 000: Avg prompt throughput: 10784.6 tokens/s, Avg generation throughput: 1064.7 tokens/s, Running: 25 "
    "reqs, Waiting: 0 reqs, GPU KV cache usage: 79.7%, Prefix cache hit rate: 9.8%",
    "Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 12.5 tokens/s, Running: 3 reqs, Swapped: 0 "
    "reqs, Pending: 7 reqs, GPU KV cache usage: 99.1%, CPU KV cache usage: 0.0%.",
    "4 Engines Aggregated: Avg prompt throughput: 1.0 tokens/s, Running: 8 reqs, Waiting: 2 reqs, GPU KV cache usage: 12%",
    "Avg prompt throughput: 1 tokens/s, Running: 2 reqs, XPU KV cache usage: 5.0%, CPU KV cache usage: 1.0%, Running: 3",
    "Engine 001: Avg prompt throughput: 1.0 tokens/s, Running: 1234567890123456 reqs, GPU KV cache usage: 1e-05%",
    "Avg prompt throughput: 1.0 tokens/s, Mode: fast",
    "Avg prompt throughput: 1.0 tokens/s, Running: 1 reqs, ",
    "Avg prompt throughput: 1.0 tokens/s. Running: 1 reqs",
]
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
    'INFO:     a\tb - "GET / HTTP/1.1" 200 OK',
    "Prefill batch. #new-seq: 4, #new-token: 8192",
    "Prefill batch. #new-seq: 4, Decode batch #running-req: 1",
    "Decode batch. #running-req: 1",
    "Decode batch, #running_req: 1",
    "Decode batch. #running-req: 1, #token: 123456789, token usage: 1.5%",
    "Decode batch. #running-req: 4, #full token: 9, full token usage: 0.10, #swa token: 5, swa token usage: 0.70, "
    "mamba num: 3, mamba usage: 0.20, accept len: 1.50, accept rate: 0.75, cpu graph: False, "
    "gen throughput (token/s): 12.00, #queue-req: 0",
    "Prefill batch, #new-seq: 1, #new-token: 64, #cached-token: 10048, token usage: 0.00, #running-req: 0, "
    "#queue-req: 0, #pending-token: 0, #bootstrap-req: 0, #inflight-req: 1, cuda graph: False, "
    "input throughput (token/s): 178.18, est. prefill TFLOPS/s (per GPU): 9.90, fwd occupancy: nan%",
    "Prefill batch. #new-seq: 1, #new-token: 1024, #cached-token: 0, token usage: 0.00, #unbootstrapped-req: 0, "
    "#queue-req: 3, #transferring-req: 2, input throughput (token/s): 1234.50, ",
    *STATS_BODIES,
    lf.retract("0.4.9", k=1, old=0.5, new=1.0),
    "Scheduler hit an exception: Traceback (most recent call last):",
    '  File "scheduler.py", line 10, in run',
    "RuntimeError: Decode out of memory. Try to lower your batch size.",
    "ValueError: The model's max seq len (4096) is larger than the maximum number of tokens that can be stored in KV "
    "cache (1792).",
    "`ValueError: No available memory for the cache blocks.`",
    "OutOfMemoryError('CUDA out of memory. Tried to allocate 138.00 MiB.')",
    "Preempted request cmpl-1-0 has been resumed!",
    "Sequence group 7 is preempted in PreemptionMode.RECOMPUTE mode because there is not enough KV cache space.",
    "max_total_num_tokens=665690, chunked_prefill_size=8192, max_prefill_tokens=16384, max_running_requests=4096, "
    "context_len=65536, available_gpu_mem=13.50 GB",
    lf.shed(first=True, queue_full=1),
    lf.shed(queue_full=9, waiting_timeout=3),
    lf.queue_timeout(3, 5.0, 7),
    lf.client_gone(),
    lf.SGLANG_CLIENT_GONE.format(rid="ab12"),
    "some other line",
]
LINES = [stamp + body for stamp in STAMPS for body in BODIES]
LINES += ["", "\x00\x01", "caf\u00e9 Decode batch. #running-req: 1"]


def _read(tmp_path, monkeypatch, data: bytes, chunk: int, max_line: int, fast: bool, processes: bool = False):
    monkeypatch.setattr("toolkit.diagnose.read.source.CHUNK", chunk)
    monkeypatch.setattr("toolkit.diagnose.read.source.MAX_LINE", max_line)
    monkeypatch.setattr("toolkit.diagnose.read.fastpath.ahead.MAX_LINE", max_line)
    monkeypatch.setattr("toolkit.diagnose.read.fastpath.ahead.PROCESS_MIN_BYTES", 0 if processes else 1 << 62)
    path = tmp_path / "x.log"
    path.write_bytes(data)
    stats = ParseStats()
    return read_logs([path], stats=stats, fast=fast), stats


def _table_rows(records) -> dict[str, dict[str, list]]:
    """Every batch table as {kind: {column: values}} with ranks as names and NaN as None."""
    out = {}
    for kind, table in records.batches.items():
        rows = table.rows()
        columns = {name: [None if (isinstance(v, float) and math.isnan(v)) else v for v in rows[name].tolist()]
                   for name in table.columns if name != "rank"}
        columns = {name: values for name, values in columns.items() if any(v is not None for v in values)}
        columns["rank"] = rows["rank"].tolist()
        out[kind] = columns
    return out


def _same(tmp_path, monkeypatch, data: bytes, chunk: int = 8 << 20, max_line: int = 1 << 20,
          processes: bool = False) -> None:
    got, got_stats = _read(tmp_path, monkeypatch, data, chunk, max_line, fast=True, processes=processes)
    want, want_stats = _read(tmp_path, monkeypatch, data, chunk, max_line, fast=False)
    assert _table_rows(got) == _table_rows(want)
    assert got.events == want.events
    assert (got.era, got.vllm_generation, got.batch_kinds) == (want.era, want.vllm_generation, want.batch_kinds), \
        "the first and last message of each batch kind tell its era and version"
    for name in ("lines", "other", "unread", "kinds", "unread_examples"):
        assert getattr(got_stats, name) == getattr(want_stats, name), name


def test_the_benchmark_log_is_all_hot_lines(tmp_path) -> None:
    path = tmp_path / "mixed.log"
    write_log(str(path), 3000)
    data = bytearray(path.read_bytes()[:-1]) + bytearray(PAD)
    scanned = scan_chunk(data, len(data) - PAD)
    assert not scanned.slow.any()
    assert len(scanned.batch.index) + scanned.access == 3000


@pytest.mark.parametrize("processes", [False, True], ids=["threads", "processes"])
def test_fast_path_equals_the_per_line_parser_on_the_benchmark_log(tmp_path, monkeypatch, processes) -> None:
    path = tmp_path / "mixed.log"
    write_log(str(path), 3000)
    _same(tmp_path, monkeypatch, path.read_bytes(), chunk=64 * 1024, processes=processes)


@pytest.mark.parametrize("processes", [False, True], ids=["threads", "processes"])
def test_fast_path_equals_the_per_line_parser_on_every_era(tmp_path, monkeypatch, processes) -> None:
    lines = [line for era in lf.ERAS for line in _era_log(era).lines]
    _same(tmp_path, monkeypatch, ("\n".join(lines * 3) + "\n").encode(), chunk=4096, processes=processes)


@pytest.mark.parametrize("processes", [False, True], ids=["threads", "processes"])
def test_fast_path_equals_the_per_line_parser_on_every_stamp_and_body(tmp_path, monkeypatch, processes) -> None:
    _same(tmp_path, monkeypatch, ("\n".join(LINES) + "\n").encode(), chunk=2048, processes=processes)


@pytest.mark.parametrize("chunk", [61, 97, 2048])
@pytest.mark.parametrize("ending", [b"\n", b"", b"\n\n"])
def test_process_ranges_own_the_lines_that_start_in_them(tmp_path, monkeypatch, chunk: int, ending: bytes) -> None:
    data = "\n".join(LINES[:60]).encode("utf-8", "surrogateescape") + ending
    _same(tmp_path, monkeypatch, data, chunk=chunk, processes=True)


@pytest.mark.parametrize("continued", [3, 198, 199, 200, 450])
def test_records_that_run_across_ranges_read_as_the_per_line_parser_reads_them(tmp_path, monkeypatch,
                                                                            continued: int) -> None:
    """A worker sends only the texts the caller may read: the lines after a record's first, as many as a record
    can hold, and a range's first lines (a record may be open from the range before). Records up to the limit
    and past it, with plain, hot and unstamped lines inside and after them, across ranges of a few lines."""
    stamp = "[2025-11-11 04:06:27 TP0] "
    decode = stamp + BODIES[0]
    plain = stamp + "Cache flushed successfully!"
    traceback = [stamp + "Scheduler hit an exception: Traceback (most recent call last):"]
    # NOTE: a stamped traceback line (vLLM prints each with its prefix) is plain, and continues the record
    traceback += [("" if i % 7 else stamp) + '  File "scheduler.py", line 10, in run' for i in range(continued)]
    lines = [decode, plain] * 30 + traceback + [decode, plain, decode] * 40 + traceback[:5] + [plain] * 300
    lines += ["  unstamped continuation", decode] * 5
    data = ("\n".join(lines) + "\n").encode()
    _same(tmp_path, monkeypatch, data, chunk=1024, processes=True)
    _same(tmp_path, monkeypatch, data, chunk=64 * 1024, processes=True)


@pytest.mark.parametrize("processes", [False, True], ids=["threads", "processes"])
def test_a_terminal_title_left_open_at_a_line_end_never_joins_two_lines(tmp_path, monkeypatch, processes) -> None:
    """An OSC sequence (`ESC ] 0;title BEL`, a terminal title) cut by a newline is no escape code: both lines stay
    lines (the range workers once joined them and stopped on an assertion), read as the per-line parser reads
    them; a whole one on a line is removed."""
    stamp = "[2025-11-11 04:06:27 TP0] "
    lines = [stamp + BODIES[0], "\x1b]0;title cut here", "still the title\x07" + stamp + "Cache flushed successfully!",
             "\x1b]0;whole title\x07" + stamp + BODIES[0]] * 40
    data = ("\n".join(lines) + "\n").encode()
    _same(tmp_path, monkeypatch, data, chunk=1024, processes=processes)
    got, stats = _read(tmp_path, monkeypatch, data, 1024, 1 << 20, fast=True, processes=processes)
    assert stats.lines == len(lines) and stats.kinds["decode"] == 80


def test_a_line_too_long_for_a_range_reads_the_rest_as_a_stream(tmp_path, monkeypatch) -> None:
    lines = LINES[:40] + ["x" * 500] + LINES[:40]
    got, got_stats = _read(tmp_path, monkeypatch, ("\n".join(lines) + "\n").encode(), 1024, 200, True, True)
    want, want_stats = _read(tmp_path, monkeypatch, ("\n".join(lines) + "\n").encode(), 1024, 200, True, False)
    assert _table_rows(got) == _table_rows(want) and got.events == want.events
    assert got_stats.kinds == want_stats.kinds and got_stats.lines == want_stats.lines == len(lines)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.sampled_from(LINES), st.integers(0, 200), st.sampled_from(["", "\r", "\x1b[0m", "\xff",
                                                                                          "]", " ", "x", "\x1b]0;t",
                                                                                          "\x07"])),
                max_size=60),
       st.sampled_from([64, 256, 4096]), st.sampled_from([80, 1 << 20]), st.booleans())
def test_fast_path_equals_the_per_line_parser_on_cut_and_garbled_lines(tmp_path, monkeypatch, cuts, chunk: int,
                                                                        max_line: int, newline: bool) -> None:
    text = "\n".join(line[:cut] + junk + line[cut:] if cut % 3 == 0 else line[:cut] + junk
                     for line, cut, junk in cuts)
    _same(tmp_path, monkeypatch, text.encode("utf-8", "surrogateescape") + (b"\n" if newline else b""), chunk,
          max_line)


def test_fast_path_dates_equal_the_per_line_reader_across_the_calendar(tmp_path, monkeypatch) -> None:
    dates = [f"{y:04d}-{m:02d}-{d:02d}" for y in (1, 4, 100, 1600, 1900, 1969, 1970, 2000, 2024, 2025, 9999)
             for m in (1, 2, 3, 12) for d in (1, 28, 29, 30, 31)]
    lines = [f"[{date} 23:59:59{ms} TP0] Decode batch, #running-req: 1, #token: 2, token usage: 0.00, "
             "gen throughput (token/s): 1.00, #queue-req: 0" for date in dates for ms in ("", ".999", ".001")]
    data = "\n".join(lines).encode()
    assert not scan_chunk(bytearray(data) + bytearray(PAD), len(data)).slow.any()
    _same(tmp_path, monkeypatch, data + b"\n")


SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
NUMBERS = st.one_of(st.integers(-10**9, 10**9).map(str), st.integers(0, 10**7).map(lambda n: f"{n / 100:.2f}"),
                    st.floats(0, 1e6, allow_nan=False).map(lambda x: f"{x:.{int(x) % 9}f}"),
                    st.sampled_from(["12.50%", "7%", "0.5.1", "1.", ".5", "-", "--3", "1e-05", "None", "??", "",
                                     "12 GB", "0012", "3 -> 4", "\u0663", "12345678", "1234567.1234567", "-0.5",
                                     "99999.999", "0.001", "nan%", "1" * 400]))
VALUES = st.one_of(NUMBERS, st.sampled_from(["True", "False", "Truex", "Fals"]))
PIECE_KEYS = st.sampled_from(list(KEYS) + ["mystery key", "#Running-Req", "est. decode TFLOPS/s (per GPU)"])
SEPARATORS = st.sampled_from([", "] * 8 + [",", ",  ", ". ", " , "])
ENDS = st.sampled_from(["", ", ", ",", " ", "  ", ",x"])


@SETTINGS
@given(st.lists(st.tuples(st.sampled_from(["Decode batch", "Prefill batch"]), st.sampled_from([". ", ", ", ".", ","]),
                          st.lists(st.tuples(PIECE_KEYS, VALUES, SEPARATORS), min_size=1, max_size=8), ENDS),
                min_size=1, max_size=20))
def test_fast_path_fields_equal_parse_fields(lines) -> None:
    texts = []
    for label, after, pieces, end in lines:
        body = "".join(f"{key}: {value}{sep}" for key, value, sep in pieces[:-1])
        key, value, _ = pieces[-1]
        running = "#running-req: 1, " if label == "Decode batch" else ""
        texts.append(f"[2025-11-11 04:06:27 TP0] {label}{after}{running}{body}{key}: {value}{end}")
    data = "\n".join(texts).encode("utf-8", "surrogateescape")
    batch = scan_chunk(bytearray(data) + bytearray(PAD), len(data)).batch
    for i, line in enumerate(batch.index.tolist()):
        text = texts[line]
        want = parse_fields("decode" if batch.kind[i] == 0 else "prefill", text[text.index("] ") + 2:])
        got = {name: values[i] for name, values in batch.fields.items() if not math.isnan(values[i])}
        want = {k: (1.0 if v is True else 0.0 if v is False else v) for k, v in want.items()}
        assert got == want, text


def test_every_era_form_of_batch_lines_is_read_by_the_fast_path() -> None:
    lines = []
    for era in ("0.3.6", "0.4.3", "0.4.9", "0.5.3", "0.5.5", "0.5.23"):
        lines.append("[2025-11-11 04:06:27 TP0] " + lf.decode(era, running=233, token=370959, usage=0.82,
                                                             throughput=4594.01, queue=317))
        lines.append("[2025-11-11 04:06:27 TP0] " + lf.prefill(era, new_seq=4, new_token=8192, cached=512,
                                                              running=229, queue=313, usage=0.41, token=272933,
                                                              hit_rate=0.25, pending=777, throughput=1234.5))
    data = "\n".join(lines).encode()
    scanned = scan_chunk(bytearray(data) + bytearray(PAD), len(data))
    assert not scanned.slow.any() and len(scanned.batch.index) == len(lines)


def _analyses(tmp_path, lines: list[str], window=None):
    path = tmp_path / "server.log"
    path.write_text("\n".join(lines) + "\n")
    return analyze([path], window=window), analyze(lines=lines, window=window)


def test_timelines_and_findings_equal_the_per_line_path(tmp_path) -> None:
    path = tmp_path / "mixed.log"
    write_log(str(path), 5000)
    lines = path.read_text().splitlines()
    for era in lf.ERAS:
        lines += _era_log(era).lines
    lines += LINES
    for window in (None, (lf.T0 + 10, lf.T0 + 40)):
        fast, per_line = _analyses(tmp_path, lines, window)
        assert fast.stats.kinds == per_line.stats.kinds
        for kind, table in fast.timeline.batches.items():
            other = per_line.timeline.batches[kind]
            assert sorted(table.columns) == sorted(other.columns), kind
            for name in table.columns:
                a, b = table.rows()[name], other.rows()[name]
                assert np.array_equal(a, b, equal_nan=a.dtype.kind == "f"), (kind, name)
        assert fast.timeline.events == per_line.timeline.events
        assert [f.id for f in fast.findings] == [f.id for f in per_line.findings]
        assert fast.config == per_line.config and fast.timeline.phases == per_line.timeline.phases


def export_against_per_line(tmp_path: Path, monkeypatch, lines: list[str], chunk: int, processes: bool):
    """(the exported events as a DataFrame, the per-line parser's events) for `lines` written as one log; the
    columns every event has (line, kind, text, rank, time) already checked equal."""
    import pandas as pd

    from toolkit.diagnose.read.export import export_events
    from toolkit.diagnose.read.lines import parse_lines

    path = tmp_path / "export-input.log"
    path.write_text("\n".join(lines) + "\n")
    monkeypatch.setattr("toolkit.diagnose.read.source.CHUNK", chunk)
    monkeypatch.setattr("toolkit.diagnose.read.fastpath.ahead.PROCESS_MIN_BYTES", 0 if processes else 1 << 62)
    d, out = export_events([path], tmp_path / "events.csv")
    assert d.stats == analyze([path]).stats, "the analysis of the export's read is the analysis"
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".toolkit-export")], "its stash is gone"
    got = pd.read_csv(out, keep_default_na=False, na_values=[""])
    want = list(parse_lines(lines))
    assert got["line"].tolist() == [e.line for e in want] and got["kind"].tolist() == [e.kind for e in want]
    assert got["text"].tolist() == [e.text for e in want]
    assert got["rank"].fillna("").tolist() == [e.rank for e in want]
    assert [None if t != t else t for t in got["time"].tolist()] == [e.time for e in want]
    return got, want


@pytest.mark.parametrize("processes", [False, True], ids=["threads", "processes"])
def test_export_equals_the_per_line_events(tmp_path, monkeypatch, processes: bool) -> None:
    path = tmp_path / "mixed.log"
    write_log(str(path), 2000)
    lines = path.read_text().splitlines() + LINES + _era_log("0.5.23").lines
    got, want = export_against_per_line(tmp_path, monkeypatch, lines, 16 * 1024, processes)
    for column in ("running_req", "queue_req", "gen_throughput", "new_token", "status"):
        expected = [e.fields.get(column) for e in want]
        values = [None if v != v else v for v in got[column].tolist()]
        assert values == [None if isinstance(v, str) else v for v in expected], column


ACCESS = st.tuples(st.sampled_from(["127.0.0.1:54321", "[::1]:8000", "x" * 40, "10.0.0.7:1"]),
                   st.sampled_from(["POST", "GET", "get", "P0ST", ""]),
                   st.sampled_from(["/v1/chat/completions", "/generate?x=1", "/a b", "/" + "p" * 300, "/x\t",
                                    *("/" + "q" * n for n in (30, 31, 32, 33))]),  # around a 32-byte window
                   st.sampled_from(["1.1", "2", "1.x", ""]), st.sampled_from(["200 OK", "404 Not Found", "20", "2000"]))


@SETTINGS
@given(st.lists(ACCESS, min_size=1, max_size=20))
def test_access_fields_equal_parse_fields(lines) -> None:
    from toolkit.diagnose.read.fastpath.access import access_fields
    from toolkit.diagnose.read.fastpath.words import Words

    texts = [f'[2025-11-11 04:06:27] INFO:     {client} - "{method} {path} HTTP/{version}" {status}'
             for client, method, path, version, status in lines]
    data = bytearray("\n".join(texts).encode()) + bytearray(PAD)
    scanned = scan_chunk(data, len(data) - PAD)
    access = scanned.access_lines
    read, columns = access_fields(data, Words(data), access, scanned.ends[access.index])
    for i, row in enumerate(np.flatnonzero(read).tolist()):
        text = texts[access.index[row]]
        got = {k: (bytes(data[v[0, i]: v[1, i]]).decode() if v.ndim == 2 else int(v[i])) for k, v in columns.items()}
        assert got == parse_fields("access", text[text.index("] ") + 2:]), text
    plain = [t for t in texts if '"POST /v1/chat/completions HTTP/1.1" 200 OK' in t and "127.0.0.1" in t]
    if "\t" not in "".join(texts):  # a tab anywhere in the chunk leaves its access lines to parse_fields
        assert read.sum() >= len(plain)


@pytest.mark.parametrize("last", ['"GET /Decode batch HTTP/1.1" 200 OK',  # no quote where the version ends
                                  '"GET', "x" * 60])  # no space after the method; no dash after the client
def test_an_access_line_whose_pieces_are_missing_is_left_to_the_per_line_parser(last: str) -> None:
    """Each piece is looked for in a window after the one before: one not found reads no byte past the chunk
    (it did: an IndexError on the chunk's last line), and the line is not read here."""
    from toolkit.diagnose.read.fastpath.access import access_fields
    from toolkit.diagnose.read.fastpath.words import Words

    lines = ['[2025-11-11 04:06:27] INFO:     127.0.0.1:5 - "POST /v1 HTTP/1.1" 200 OK'] * 3
    lines.append("[2025-11-11 04:06:28] INFO:     127.0.0.1:5 - " + last if last.startswith('"') else
                 "[2025-11-11 04:06:28] INFO:     " + last)
    data = bytearray("\n".join(lines).encode()) + bytearray(PAD)
    scanned = scan_chunk(data, len(data) - PAD)
    access = scanned.access_lines
    read, _ = access_fields(data, Words(data), access, scanned.ends[access.index])
    assert read[:3].all() and not read[3:].any()


@pytest.mark.parametrize("processes", [False, True], ids=["threads", "processes"])
def test_fast_path_equals_the_per_line_parser_on_the_realistic_log(tmp_path, monkeypatch, processes) -> None:
    """The realistic mix: start-up blocks, tracebacks, other INFO and WARNING lines (slow lines that the workers
    classify plain), six prefixes and a vLLM segment, read in ranges small enough that records cross them."""
    path = tmp_path / "realistic.log"
    write_log(str(path), 6000, mix="realistic")
    _same(tmp_path, monkeypatch, path.read_bytes(), chunk=16 * 1024, processes=processes)


def test_export_of_the_realistic_log_equals_the_per_line_events(tmp_path, monkeypatch) -> None:
    """The export's workers classify slow lines plain too: their events stay those of the per-line parser."""
    path = tmp_path / "realistic.log"
    write_log(str(path), 4000, mix="realistic")
    got, want = export_against_per_line(tmp_path, monkeypatch, path.read_text().splitlines(), 16 * 1024, True)
    assert len(got) == len(want) > 3000


@pytest.mark.parametrize("slow_lines", [[], [0], [5], [99], [0, 1, 2], [3, 4, 50, 51, 52, 98],
                                        list(range(1, 99, 3)), list(range(0, 100, 2))],
                         ids=["none", "first", "one", "last", "a-run", "three-runs", "33-runs", "50-runs"])
def test_hot_and_slow_rows_merge_in_line_order(slow_lines: list[int]) -> None:
    """The export merges a chunk's hot rows (from a worker) and slow rows (the per-line parser's) by line:
    slices of each for a few runs of slow rows, a copy in order for many; both give every row once, in order."""
    import pyarrow as pa

    from toolkit.diagnose.read.export import _MAX_SLICES, _merged

    hot_lines = [i for i in range(100) if i not in slow_lines]
    hot = pa.table({"line": pa.array(hot_lines, pa.int64()), "text": [f"hot {i}" for i in hot_lines]})
    slow = pa.table({"line": pa.array(slow_lines, pa.int64()), "text": [f"slow {i}" for i in slow_lines]})
    merged = _merged(hot, slow)
    assert merged.column("line").to_pylist() == list(range(100))
    assert merged.column("text").to_pylist() == [f"{'slow' if i in slow_lines else 'hot'} {i}" for i in range(100)]
    runs = len({i - k for k, i in enumerate(slow_lines)})
    assert (merged.column("line").num_chunks > 1) == (0 < runs <= _MAX_SLICES and len(hot_lines) > 0)


@contextmanager
def _read_with_export_stash(tmp_path, monkeypatch):
    """The realistic mix (4,000 lines) read by worker processes in 16 KiB ranges, started early to read ahead with
    `--export`'s job, the stash as the read's tap: (the log, the stash, the diagnosis)."""
    from toolkit.diagnose.read.export import EventStash
    from toolkit.diagnose.read.fastpath import ahead

    path = tmp_path / "realistic.log"
    write_log(str(path), 4000, mix="realistic")
    monkeypatch.setattr("toolkit.diagnose.read.source.CHUNK", 16 * 1024)
    monkeypatch.setattr("toolkit.diagnose.read.fastpath.ahead.PROCESS_MIN_BYTES", 0)
    with EventStash(tmp_path / "events.csv") as stash:
        with ahead.range_workers(read_ahead=path, job=stash.job):
            d = analyze([path], tap=stash)
        yield path, stash, d


def test_the_export_reads_each_range_once_with_the_analysis(tmp_path, monkeypatch) -> None:
    """`--export` stashes each range's hot lines where a worker scanned it, during the analysis's own read: one
    stashed part per range, and the events equal the per-line parser's."""
    import pandas as pd

    from toolkit.diagnose.read.export import write_events

    with _read_with_export_stash(tmp_path, monkeypatch) as (path, stash, d):
        ranges = -(-path.stat().st_size // (16 * 1024))
        assert sum(part.hot is not None for part in stash.parts) == ranges
        out = write_events(stash, d)
        got = pd.read_csv(out, keep_default_na=False, na_values=[""])
    want = export_against_per_line(tmp_path, monkeypatch, path.read_text().splitlines(), 16 * 1024, True)[0]
    assert got.equals(want)


@pytest.mark.parametrize("change", ["truncated", "shifted"])
def test_an_export_whose_log_changed_after_its_read_fails_with_a_clear_error(tmp_path, monkeypatch, change) -> None:
    """The stash keeps no text of a log's ranges (the rows' messages are read again from the log when written):
    a log cut short, or one whose lines moved, since its read is an error naming it, never wrong text."""
    from toolkit.diagnose.read.export import write_events

    with _read_with_export_stash(tmp_path, monkeypatch) as (path, stash, d):
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2] if change == "truncated" else b"x" + data[:-1])
        with pytest.raises(ValueError, match="changed while it was read"):
            write_events(stash, d)


def test_the_export_is_written_while_the_analysis_runs_and_a_failed_command_leaves_the_output(tmp_path,
                                                                                            monkeypatch) -> None:
    """The columns are known once every log is read: the write starts then, on a thread, and the rules run beside
    it, into a file of the stash that replaces the output once whole. A command that fails after that (here: in
    the rules) stops the write and leaves the output as it was (none, or the file that was there), no stash and
    no thread."""
    import threading

    from toolkit.diagnose import analysis
    from toolkit.diagnose.read.export import EventStash, export_events, write_events

    path = tmp_path / "realistic.log"
    write_log(str(path), 4000, mix="realistic")
    rules, seen = analysis.run_rules, []

    def watched(ctx):
        seen.append(stash.writing is not None)
        return rules(ctx)

    monkeypatch.setattr(analysis, "run_rules", watched)
    with EventStash(tmp_path / "events.csv") as stash:
        d = analyze([path], tap=stash)
        write_events(stash, d)
    assert seen == [True] and (tmp_path / "events.csv").stat().st_size > 0

    def failing(ctx):
        raise RuntimeError("a rule failed")

    monkeypatch.setattr(analysis, "run_rules", failing)
    with pytest.raises(RuntimeError, match="a rule failed"):
        export_events([path], tmp_path / "failed.csv")
    assert not (tmp_path / "failed.csv").exists()
    (tmp_path / "kept.csv").write_text("an earlier export\n")
    with pytest.raises(RuntimeError, match="a rule failed"):
        export_events([path], tmp_path / "kept.csv")
    assert (tmp_path / "kept.csv").read_text() == "an earlier export\n"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".toolkit-export")]
    assert not [t for t in threading.enumerate() if t.name.startswith("diagnose-export")]


def test_the_exports_job_never_imports_arrow() -> None:
    """The read's workers are forked before Arrow is imported (it imports, and builds its kernels, on a thread of
    the command while the logs are read): the job they run on each chunk is numpy only."""
    import subprocess
    import sys

    code = """
import sys, tempfile
from benchmarks.diagnose_parse import write_log
from toolkit.diagnose.read import export
from toolkit.diagnose.read.fastpath.scan import scan_chunk
from toolkit.diagnose.read.source import Chunk, PAD
assert "pyarrow" not in sys.modules
with tempfile.TemporaryDirectory() as tmp:
    write_log(tmp + "/log", 2000, mix="realistic")
    data = bytearray(open(tmp + "/log", "rb").read().rstrip(b"\\n")) + bytearray(PAD)
    chunk = Chunk(data, len(data) - PAD, False)
    result = export._hot_lines(tmp, chunk, scan_chunk(data, chunk.size))
    assert result.payload is not None
assert "pyarrow" not in sys.modules, "the job imported Arrow"
"""
    done = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr[-2000:]


TRACEBACK_TAIL = ['  File "/x/scheduler.py", line 10, in run', "    self.step()", "RuntimeError: CUDA error: out of memory"]


@pytest.mark.parametrize("processes", [False, True], ids=["threads", "processes"])
@pytest.mark.parametrize("plain_before", [0, 3, 250])
def test_a_log_that_begins_inside_a_traceback_reads_as_the_per_line_parser_reads_it(tmp_path, monkeypatch, processes,
                                                                                   plain_before: int) -> None:
    """Its first frame opens a record (counted by its error line) wherever it falls in a range: after plain lines
    the workers classify, past the lines a range sends for a record open at its start."""
    lines = [f"[2025-11-11 04:06:27 TP0] some other line {i}" for i in range(plain_before)]
    lines += TRACEBACK_TAIL + [f"[2025-11-11 04:06:28 TP0] another line {i}" for i in range(5)]
    _same(tmp_path, monkeypatch, ("\n".join(lines) + "\n").encode(), chunk=4096, processes=processes)


@pytest.mark.parametrize("processes", [False, True], ids=["threads", "processes"])
@pytest.mark.parametrize("prefix", ["", "[2025-11-11 04:06:27 TP0] ", "2025-11-11T04:06:27.123Z stderr F ",
                                    "(APIServer pid=1) INFO 11-11 04:06:27 [loader.py:12] "])
def test_a_traceback_run_on_after_a_progress_bar_reads_as_the_per_line_parser_reads_it(tmp_path, monkeypatch,
                                                                                       processes, prefix: str) -> None:
    bar = prefix + "Loading safetensors checkpoint shards: 100% | 4/4 [00:01<00:00, 2.00it/s]Traceback (most recent call last):"
    lines = [f"[2025-11-11 04:06:2{i} TP0] some other line" for i in range(3)] + [bar] + TRACEBACK_TAIL
    _same(tmp_path, monkeypatch, ("\n".join(lines) + "\n").encode(), chunk=4096, processes=processes)


@pytest.mark.parametrize("processes", [False, True], ids=["threads", "processes"])
def test_an_export_that_fails_mid_read_leaves_no_stash_and_no_scanners(tmp_path, monkeypatch, processes) -> None:
    """The scanners (threads or worker processes) stop before the stash's directory goes, however the read ends
    (here: an error after two chunks); the per-line events of a chunk are spilled to the stash, not kept."""
    import threading

    from toolkit.diagnose.read import logs as reading
    from toolkit.diagnose.read.export import EventStash, export_events

    path = tmp_path / "realistic.log"
    write_log(str(path), 4000, mix="realistic")
    monkeypatch.setattr("toolkit.diagnose.read.source.CHUNK", 16 * 1024)
    monkeypatch.setattr("toolkit.diagnose.read.fastpath.ahead.PROCESS_MIN_BYTES", 0 if processes else 1 << 62)
    read, seen = reading._read_chunk, []

    def failing(chunk, first, parser, sink, tap):
        seen.append(first)
        if len(seen) > 2:
            raise RuntimeError("interrupted")
        return read(chunk, first, parser, sink, tap)

    monkeypatch.setattr(reading, "_read_chunk", failing)
    try:
        export_events([path], tmp_path / "events.csv")
    except RuntimeError:  # NOTE: checked while the error's traceback (and every frame in it) is alive
        left = [p.name for p in tmp_path.iterdir() if p.name.startswith(".toolkit-export")]
        scanning = [t.name for t in threading.enumerate() if t.name.startswith("diagnose-scan")]
    assert seen and not left and not scanning
    monkeypatch.setattr(reading, "_read_chunk", read)
    with EventStash(tmp_path / "events.csv") as stash:
        analyze([path], tap=stash)
        assert all(part.events is None or isinstance(part.events, str) for part in stash.parts)
        assert any(part.events for part in stash.parts)
