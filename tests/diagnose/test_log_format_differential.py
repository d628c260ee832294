"""Both readers of `diagnose.read` give the same events: the fast path (`diagnose.read.fastpath`) and the per-line
parser (`diagnose.read.lines`) read every sample line of docs/log-formats.md (and the one-per-form samples of
`test_formats.py`) and every file of the real-log corpus to the same kind, line, time, rank and fields, with the
same counts of other and unread lines. Lines that neither reads are fine; a line either reads must read the same
in both."""
from __future__ import annotations

import random
import re
from pathlib import Path

import numpy as np
import pytest

from toolkit.diagnose.read.fastpath.scan import scan_chunk
from toolkit.diagnose.read.prefix import read_prefix
from toolkit.diagnose.read.source import PAD
from tests.diagnose.test_fastpath import _read, _same, _table_rows, export_against_per_line
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


# What collectors write before SGLang's stamp (`read.prefix.OUTER_PREFIXES`), in the forms the fast path
# strips and in forms near them that it leaves to the per-line parser.
OUTERS = {
    "compose": "sglang-1  | ",
    "cri": "2025-11-11T04:06:27.12345Z stdout F ",
    "cri-offset": "2025-11-11T04:06:27+01:00 stderr P ",
    "ray": "(SGLangEngine pid=4242) ",
    "ray-ip": "(SGLangEngine pid=4242, ip=10.0.0.7) ",
    "journald": "Nov  1 04:06:27 gpu-node-1 python[4242]: ",
    "journald-precise": "Nov 11 04:06:27.123456 gpu-node-1 python3: ",
    "quoted": '"sglang-1"  | ',
    "stamp-in-prefix": "[2025-11-10 01:02:03] sglang-1  | ",
    "unknown": "sglang-1 >> ",
}


@pytest.mark.parametrize("outer", ["", None, *OUTERS], ids=["as-printed", "sglang-stamp", *OUTERS])
@pytest.mark.parametrize("samples", [doc_sample_lines, format_table_lines], ids=["docs", "format-table"])
def test_every_sample_line_reads_the_same_in_both_paths(tmp_path, monkeypatch, samples, outer: str | None) -> None:
    lines = samples()
    if outer != "":
        lines = [OUTERS.get(outer or "", "") + STAMP + line[read_prefix(line).start:] for line in lines]
    data = ("\n".join(lines) + "\n").encode()
    if outer is None or outer in ("compose", "cri", "cri-offset", "ray", "ray-ip", "journald", "journald-precise"):
        assert _hot_lines(data) >= 4  # the fast path reads the docs' decode and prefill lines itself
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


@pytest.mark.parametrize("processes", [False, True], ids=["threads", "processes"])
@pytest.mark.parametrize("chunk", [4096, 64 * 1024, 8 << 20])
def test_the_benchmarks_realistic_log_reads_the_same_in_both_paths(tmp_path, monkeypatch, chunk: int,
                                                                    processes: bool) -> None:
    from benchmarks.diagnose_parse import write_log

    path = tmp_path / "realistic.log"
    write_log(str(path), 12000, seed=chunk, mix="realistic")
    _same(tmp_path, monkeypatch, path.read_bytes(), chunk=chunk, processes=processes)


def test_the_fast_path_reads_sglang_lines_behind_every_outer_prefix(tmp_path) -> None:
    from benchmarks.diagnose_parse import write_log

    path = tmp_path / "realistic.log"
    write_log(str(path), 12000, mix="realistic")
    lines = path.read_bytes().split(b"\n")
    for outer in (b"sglang-1  | ", b"Z stdout F ", b"(SGLangEngine pid=4242) ", b" gpu-node-1 python[4242]: "):
        prefixed = [line for line in lines if outer in line and b"] Decode batch" in line]
        data = b"\n".join(prefixed)
        assert prefixed and _hot_lines(data) == len(prefixed), outer


ACCESS_LINE = ' - "POST /v1/chat/completions HTTP/1.1" 200 OK'
TIMELESS = [  # vLLM's API server's access lines: a process prefix, no time (the first two are the fast path's)
    "(APIServer pid=1) INFO:     10.0.0.7:5000" + ACCESS_LINE,
    "(APIServer pid=1, ip=10.0.0.7) INFO:     127.0.0.1:1" + ACCESS_LINE,
    "(APIServer pid=1) INFO:     [::1]:8000" + ACCESS_LINE,
    "(APIServer pid=1) INFO:     [12:34:56]" + ACCESS_LINE,
    "(EngineCore_DP1 pid=7) INFO:     10.0.0.7:5000" + ACCESS_LINE,
    "(APIServer pid=1) INFO:     " + "x" * 40 + ACCESS_LINE,
    "vllm-1  | (APIServer pid=1) INFO:     10.0.0.7:5000" + ACCESS_LINE,
]
# NOTE: before the first stamped line, a line that does not look like a continuation ends a record
RECORD = ["Traceback (most recent call last):", '  File "x.py", line 1, in <module>', "plain words", TIMELESS[0],
          '  File "y.py", line 2, in f', TIMELESS[0], "RuntimeError: boom", TIMELESS[1],
          "[2025-11-11 04:06:27 TP0] Scheduler hit an exception: Traceback (most recent call last):", TIMELESS[0],
          "ValueError: x", TIMELESS[1]]


@pytest.mark.parametrize("chunk", [64, 256, 8 << 20])
def test_timeless_access_lines_read_the_same_in_both_paths(tmp_path, monkeypatch, chunk: int) -> None:
    data = ("\n".join(TIMELESS[:2] + RECORD + TIMELESS) + "\n").encode()
    assert _hot_lines(("\n".join(TIMELESS) + "\n").encode()) == 2
    _assert_same_events(tmp_path, monkeypatch, data, chunk)


@pytest.mark.parametrize("processes", [False, True], ids=["threads", "processes"])
def test_export_of_the_realistic_log_equals_the_per_line_events(tmp_path, monkeypatch, processes: bool) -> None:
    from benchmarks.diagnose_parse import write_log

    path = tmp_path / "realistic.log"
    write_log(str(path), 6000, mix="realistic")
    lines = TIMELESS[:2] + RECORD + path.read_text().splitlines() + TIMELESS
    got, want = export_against_per_line(tmp_path, monkeypatch, lines, 64 * 1024, processes)
    for column in ("running_req", "queue_req", "gen_throughput", "status", "client", "path"):
        expected = [e.fields.get(column) for e in want]
        assert [None if v != v else v for v in got[column].tolist()] == expected, column


def test_the_one_match_stamp_reader_agrees_with_read_prefix_on_every_sample_and_real_line() -> None:
    """`stamped_message_start` (the workers' quick read of the commonest prefix) answers only where `read_prefix`
    finds a time, and then with the same message start; it answers for most stamped lines (else it saves nothing)."""
    from benchmarks.diagnose_parse import RAY_PREFIX
    from toolkit.diagnose.read.prefix import stamped_message_start

    lines = doc_sample_lines() + format_table_lines()
    lines += [line for path in REAL_LOGS for line in path.read_text(errors="replace").splitlines()]
    lines += [STAMP + line for line in lines[:400]] + [RAY_PREFIX + STAMP + "x", "'quoted' " + STAMP + "x",
                                                       "[2025-02-30 04:06:27] x", STAMP + STAMP + "x",
                                                       STAMP + "[gpu=1] x", STAMP + "INFO 03-10 08:07:20 [a.py:1] x"]
    answered = 0
    for line in lines:
        start = stamped_message_start(line)
        if start is not None:
            prefix = read_prefix(line)
            assert prefix.time is not None and prefix.start == start, line
            answered += 1
    stamped = sum(read_prefix(line).time is not None and "[" in line for line in lines)
    assert answered > 0.5 * stamped, (answered, stamped)


def test_a_message_start_is_read_as_the_whole_alternation_reads_it() -> None:
    """`kind_of` tries at a message start only the starts that can begin with its first character (derived from
    each pattern of `read.messages.STARTS`): the same kind as `_MESSAGE`, the alternation of all of them, on
    every sample and real line, at every position of its first 80 characters and at its message start."""
    from toolkit.diagnose.read.messages import _MESSAGE, _first_characters, kind_of

    lines = doc_sample_lines() + format_table_lines()
    lines += [line for path in REAL_LOGS for line in path.read_text(errors="replace").splitlines()]
    checked = found = 0
    for line in lines:
        for start in {*range(min(len(line), 80)), read_prefix(line).start}:
            m = _MESSAGE.match(line, start)
            want = m.lastgroup if m is not None else None
            assert kind_of(line, start) == want, (line, start)
            checked, found = checked + 1, found + (want is not None)
    assert checked > 50_000 and found > 500
    first = _first_characters()
    narrowed = [kind for kind, chars in first.items() if chars is not None]
    assert len(narrowed) >= 30, "most starts begin with a literal: each is tried only at its own characters"
    assert first["decode"] == frozenset("#D") and first["stats"] is None  # `(?:Engine \d+: )?Avg`: any digit


def test_the_quick_stamp_test_never_hides_a_stamp() -> None:
    """`_closest_stamp` first looks for `[` and a digit (how every SGLang stamp begins) and reads no further where
    there is none: the same stamps as without that test, on every sample and real line and on stamp-like text."""
    from toolkit.diagnose.read import prefix

    lines = doc_sample_lines() + format_table_lines()
    lines += [line for path in REAL_LOGS for line in path.read_text(errors="replace").splitlines()]
    lines += [STAMP + line for line in lines[:400]] + ["[12:34:56 TP0] x", "[\u0663\u0663:00:00] x", "x [2025-11-11"]
    stamped = 0
    for line in lines:
        m = prefix._FIRST_SGLANG.match(line)
        if m is not None:
            while (nxt := prefix._SGLANG.match(line, m.end())) is not None:
                m = nxt
        got = prefix._closest_stamp(line)
        assert (got and got.span()) == (m and m.span()), line
        stamped += m is not None
    assert stamped > 500


def _mutations(lines: list[bytes], count: int, seed: int) -> list[bytes]:
    """`count` lines each changed at 1 to 4 places (a byte replaced, dropped or put in) with the bytes prefixes,
    stamps and messages are made of, quotes, CR, escape, NUL and non-ASCII among them."""
    rng = random.Random(seed)
    alphabet = b" []:-.,0123456789TPDAgpu\"'`\\|\t\r\x1b\x00\xc3\xa9\xffEeorxaINFO()="
    out = []
    for _ in range(count):
        line = bytearray(rng.choice(lines)[:200])
        for _ in range(rng.randint(1, 4)):
            if not line:
                break
            i, op = rng.randrange(len(line)), rng.random()
            if op < 0.4:
                line[i] = rng.choice(alphabet)
            elif op < 0.7:
                del line[i]
            else:
                line.insert(i, rng.choice(alphabet))
        out.append(bytes(line))
    return out


def _plain_cases(tmp_path) -> tuple[list[bytes], list[bytes]]:
    """(every sample and real line, the benchmark's realistic log, stamp-like cases; 60,000 of those lines changed
    at random, seeded)."""
    from benchmarks.diagnose_parse import write_log

    path = tmp_path / "realistic.log"
    write_log(str(path), 12000, mix="realistic")
    texts = doc_sample_lines() + format_table_lines() + [STAMP + line for line in doc_sample_lines()[:400]]
    lines = [text.encode() for text in texts] + path.read_bytes().split(b"\n")
    lines += [line for log in REAL_LOGS for line in log.read_bytes().split(b"\n")]
    lines += [b"[2025-02-30 04:06:27] x", b"[2025-13-01 04:06:27] x", b"[0000-01-01 04:06:27] x", b"[12:34:56] x",
              b"(APIServer pid=1) INFO 02-31 04:06:27 [a.py:1] x", b"\"quoted\" [2025-11-11 04:06:27] x",
              b"[2025-11-11 04:06:27 TP0]\r x", b"[2025-11-11 04:06:27] \x1b[31mx",
              b"[2025-11-11 04:06:27] caf\xc3\xa9", (STAMP + STAMP + "x").encode(), (STAMP + "[gpu=1] x").encode(),
              b"INFO 03-10 08:07:20 [a.py:1] [12:00:00] x",
              b"[2025-11-11 04:06:27.250 TP0 ] x" + b"y" * 40, b"[2025-11-11 04:06:27.250123 TP0] " + b"y" * 40,
              b"[2025-11-11 04:06:27Z TP0] " + b"y" * 40, b"[2025-11-11 04:06:27 " + b"TP0 " * 8 + b"] " + b"y" * 40,
              b"sglang-1  | [2025-11-11 04:06:27 TP0]  ValueError: x" + b"y" * 40,
              b"Nov 11 04:06:27 node python[42]: [2025-11-11 04:06:27 TP0] Traceback (most recent call last):"]
    return lines, _mutations(lines, 60_000, seed=0)


def test_a_line_told_plain_from_its_bytes_is_plain_once_decoded(tmp_path) -> None:
    """`surely_plain` (the workers' read of a slow line's bytes) says True only where `is_plain` of the decoded
    line does: on every sample and real line, the benchmark's realistic log, stamp-like cases, and 60,000 of those
    lines changed at random (seeded); and it says True for most plain lines (else it saves nothing)."""
    from toolkit.diagnose.read.fastpath.plain import surely_plain
    from toolkit.diagnose.read.lines import is_plain
    from toolkit.diagnose.read.source import decode_line

    lines, mutated = _plain_cases(tmp_path)
    for line in lines + mutated:
        if surely_plain(line):
            assert is_plain(decode_line(line)), line
    plain = sum(is_plain(decode_line(line)) for line in lines)
    told = sum(surely_plain(line) for line in lines)
    assert told > 0.9 * plain, (told, plain)
    assert sum(map(surely_plain, mutated)) > 5_000, "the changed lines include plain ones"


def test_a_chunk_tells_its_stamped_lines_plain_as_surely_plain_does(tmp_path) -> None:
    """The workers' classification of a chunk's slow lines: `stamped_plain` (the lines behind a stamp the scanner
    read, told in word operations and one match at the message) says what `surely_plain` says of each of them, and
    `ahead._plain` is `is_plain` of every slow line; on the cases above, in chunks of 3,000 lines, the lines in
    order and shuffled (seeded)."""
    from toolkit.diagnose.read.fastpath.ahead import _LineTexts, _plain
    from toolkit.diagnose.read.fastpath.plain import stamped_plain, surely_plain
    from toolkit.diagnose.read.lines import is_plain
    from toolkit.diagnose.read.source import decode_line

    lines, mutated = _plain_cases(tmp_path)
    shuffled = lines + mutated
    random.Random(1).shuffle(shuffled)
    stamped = plain = 0
    for every in (lines, mutated, shuffled):
        for at in range(0, len(every), 3000):
            part = every[at: at + 3000]
            data = b"\n".join(part)
            buf = bytearray(data + bytes(PAD))
            scanned = scan_chunk(buf, len(data))
            assert scanned.lines == len(part)
            told = stamped_plain(buf, scanned.starts, scanned.ends, scanned.stamped)
            assert told.tolist() == [surely_plain(part[i]) for i in scanned.stamped.index.tolist()]
            stamped, plain = stamped + len(told), plain + int(told.sum())
            found = _plain(buf, scanned, scanned.slow, _LineTexts(buf, scanned.starts, scanned.ends))
            slow = np.flatnonzero(scanned.slow).tolist()
            assert found[slow].tolist() == [is_plain(decode_line(part[i])) for i in slow]
            assert not found[~scanned.slow].any()
    assert stamped > 20_000 and plain > 10_000, (stamped, plain)


def test_a_chunk_tells_its_vllm_lines_plain_only_where_surely_plain_does(tmp_path) -> None:
    """`vllm_plain` (the slow lines behind a vLLM prefix, read by layouts) says True only where `surely_plain` does,
    on the cases above in chunks of 3,000 lines, in order and shuffled (seeded), and on lines with a vLLM prefix
    and each kind of message it must leave to `surely_plain`; and it tells most of the benchmark's vLLM plain lines
    (else it saves nothing)."""
    from benchmarks.diagnose_parse import write_log
    from toolkit.diagnose.read.fastpath.plain import surely_plain, vllm_plain

    lines, mutated = _plain_cases(tmp_path)
    prefix = b"(APIServer pid=1) INFO 11-11 09:34:39 [async_llm.py:318] "
    edges = [prefix + b"Added request x.", prefix + b"[2025-11-11 04:06:27] x", prefix + b"a INFO 11-11 09:34:39 [b.py:2] c",
             prefix + b"Engine 000: Avg prompt throughput: 1.0 tokens/s", prefix + b"caf\xc3\xa9", prefix + b"x\x1b[0m",
             prefix.replace(b"11-11", b"13-11") + b"x", prefix.replace(b"11-11", b"02-31") + b"x",
             prefix.replace(b"11-11", b"00-11") + b"x", prefix.replace(b"[async", b"[0async") + b"x",
             prefix.replace(b"(APIServer", b"(API[0m") + b"x", b"INFO 11-11 09:34:39 [a.py:1] x", prefix, prefix[:-1],
             # a layout learned without the optional space after `]` must not start the next line's message at it
             b"INFO 04-14 08:14:07 [launcher.py:34]o Route: /v1/rerank",
             b"INFO 01-19 13:55:01 [launcher.py:80] Shutting down FastAPI HTTP server."]
    shuffled = lines + mutated + edges * 50
    random.Random(2).shuffle(shuffled)
    told = 0
    for every in (lines, mutated, edges, shuffled):
        for at in range(0, len(every), 3000):
            part = every[at: at + 3000]
            data = b"\n".join(part)
            buf = bytearray(data + bytes(PAD))
            scanned = scan_chunk(buf, len(data))
            rows = np.flatnonzero(scanned.slow)
            found = vllm_plain(buf, scanned.starts, scanned.ends, rows)
            for i, plain in zip(rows.tolist(), found.tolist()):
                if plain:
                    assert surely_plain(part[i]), part[i]
            told += int(found.sum())
    assert told > 200, told
    path = tmp_path / "vllm.log"
    write_log(str(path), 120_000, mix="realistic")
    vllm = [line for line in path.read_bytes().split(b"\n") if line.startswith(b"(") and b"] Added request" in line]
    data = b"\n".join(vllm)
    buf = bytearray(data + bytes(PAD))
    scanned = scan_chunk(buf, len(data))
    assert len(vllm) > 1_000 and vllm_plain(buf, scanned.starts, scanned.ends, np.flatnonzero(scanned.slow)).all()


GRAMMAR_QUEUE = ("[2025-11-11 04:06:27 TP0] Decode batch, #running-req: 12, #token: 9000, token usage: 0.30, "
                 "cuda graph: True, gen throughput (token/s): 812.55, #queue-req: 3, #grammar-queue-req: 2")


def test_the_requests_waiting_for_their_grammar_are_a_declared_key_read_on_the_fast_path(tmp_path,
                                                                                          monkeypatch) -> None:
    """SGLang's batch lines print the requests waiting for their grammar to compile (structured output) as
    `#grammar-queue-req`: a key of the batch lines' declaration, so the fast path reads those lines itself, and both
    paths give its count."""
    data = ((GRAMMAR_QUEUE + "\n") * 40).encode()
    assert _hot_lines(data) == 40
    _same(tmp_path, monkeypatch, data)
    got, _ = _read(tmp_path, monkeypatch, data, 8 << 20, 1 << 20, fast=True, processes=False)
    assert _table_rows(got)["decode"]["grammar_queue_req"] == [2.0] * 40
