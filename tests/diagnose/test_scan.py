"""The scanner's shortcuts give what its general path (and the per-line parser) gives: line bounds from packed
newline bits, layout templates per (stamp form, rank tag, label) with more layouts than templates, the pieces
walk in groups of one key sequence with more forms than groups, the short-number steps at their limits, and
ranges read from a file whose lines run past a range's end."""
from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from toolkit.diagnose.read.fastpath import fields, scan
from toolkit.diagnose.read.fastpath.ahead import _read_lines
from toolkit.diagnose.read.fastpath.scan import line_bounds, scan_chunk
from toolkit.diagnose.read.fastpath.words import Words
from toolkit.diagnose.read.source import PAD
from tests.diagnose import logfactory as lf
from tests.diagnose.test_fastpath import _same

SETTINGS = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                           HealthCheck.function_scoped_fixture])
STAMP = "[2025-11-11 04:06:27{ms}{tag}] "
DECODE = ("Decode batch. #running-req: {r}, #token: {t}, token usage: {u}, gen throughput (token/s): {g}, "
          "#queue-req: {q}")


def _chunk(text: str) -> tuple[bytearray, int]:
    data = text.encode("utf-8", "surrogateescape")
    return bytearray(data) + bytearray(PAD), len(data)


@SETTINGS
@given(st.binary(max_size=600).map(lambda b: b.replace(b"a", b"\n")), st.sampled_from([b"", b"\n", b"\n\n\n"]))
def test_line_bounds_equal_splitting_on_newlines(body: bytes, tail: bytes) -> None:
    data = body + tail  # many newlines to a 64-byte word, blank lines, none at all
    starts, ends = line_bounds(Words(bytearray(data) + bytearray(PAD)), len(data))
    pieces = [bytes(data[a:b]) for a, b in zip(starts.tolist(), ends.tolist())]
    assert pieces == data.split(b"\n")


def _decode_line(rng: random.Random, tag: str, ms: str = "") -> str:
    body = DECODE.format(r=rng.randint(1, 300), t=rng.randint(0, 10**6), u=f"{rng.random():.2f}",
                         g=f"{rng.random() * 5000:.2f}", q=rng.randint(0, 500))
    return STAMP.format(ms=ms, tag=tag) + body


def test_more_layouts_than_templates_are_read_line_by_line(tmp_path, monkeypatch) -> None:
    rng = random.Random(1)
    tags = [f" TP{k}" for k in range(scan.MAX_LAYOUTS + 8)] + [" DP1 TP3", "", "  TP0 ", " tp0", " TP0 EP7"]
    lines = [_decode_line(rng, rng.choice(tags), rng.choice(["", ".125"])) for _ in range(600)]
    lines += [STAMP.format(ms="", tag=rng.choice(tags)) + lf.access() for _ in range(50)]
    data, size = _chunk("\n".join(lines))
    scanned = scan_chunk(data, size)
    named = [line for line in lines if " tp0]" not in line]
    assert len(scanned.batch.index) + scanned.access == len(named)
    assert sorted(set(scanned.batch.ranks)) == sorted({" ".join(t.split()) for t in tags if t != " tp0"})
    _same(tmp_path, monkeypatch, ("\n".join(lines) + "\n").encode())


def test_a_template_never_stands_for_a_line_that_differs_outside_the_stamp_digits(tmp_path, monkeypatch) -> None:
    base = STAMP.format(ms="", tag=" TP1") + "Decode batch. #running-req: 5, #token: 6, token usage: 0.10, " \
                                             "gen throughput (token/s): 1.00, #queue-req: 0"
    variants = [base, base.replace(" TP1]", " TP2]"), base.replace(" TP1]", " TP1 ]"), base.replace("27 TP1", "27.5 TP1"),
                base.replace(":27 ", ":2x "), base.replace("Decode batch.", "Decode batch,"),
                base.replace("Decode batch.", "Decode batch:"), base.replace(" TP1]", "]"),
                base.replace("[2025", "[0000"), base.replace("-11-11", "-13-11"), base.replace(" TP1]", " TPX]"),
                base.replace(" TP1]", " " + "TP1 " * 7 + "]")]
    lines = [variants[i % len(variants)] for i in range(10 * len(variants))]
    _same(tmp_path, monkeypatch, ("\n".join(lines) + "\n").encode())


NUMERIC_KEYS = [k for k in fields.KEYS if fields.canonical(k) not in fields.BOOLEAN and k != "#running-req"]


def _form(keys: list[str], values: list[str]) -> str:
    body = ", ".join(f"{key}: {value}" for key, value in zip(["#running-req", *keys], ["3", *values]))
    return STAMP.format(ms="", tag=" TP0") + "Decode batch. " + body


def test_the_walk_keeps_the_largest_groups_and_leaves_the_rest_to_the_per_line_parser(tmp_path,
                                                                                     monkeypatch) -> None:
    keys = [key for key in NUMERIC_KEYS if key != "#new-token"]
    pairs = [(a, b) for a in keys for b in keys if a != b][: fields.MAX_GROUPS + 1]
    # NOTE: the groups part at the third piece and all go on to a fourth: one too many.
    lines = [_form([a, b, "#new-token"], ["1", "2", "3"]) for a, b in pairs[:-1] for _ in range(3)]
    lines.append(_form([*pairs[-1], "#new-token"], ["1", "2", "3"]))  # alone in the smallest group
    data, size = _chunk("\n".join(lines))
    read = scan_chunk(data, size).batch.index
    assert read.tolist() == list(range(len(lines) - 1))
    _same(tmp_path, monkeypatch, ("\n".join(lines) + "\n").encode())


NUMBERS = ["0", "7", "123456", "1234567", "12345678", "0.5", "1234567.1", "1.234567", "1234567.12", "123.123456",
           "12.5%", "7%", "0.01%", "12345.6%", "1234.5678", "-3", "-0.5", "00012", "1.", ".5", "1e5", "12 GB", "True"]


@pytest.mark.parametrize("ending", ["", ", ", ",", " ", ", #queue-req: 1", ",x"])
def test_each_value_form_in_a_group_of_its_own_and_in_a_mixed_group(tmp_path, monkeypatch, ending: str) -> None:
    lines = []
    for key, value in zip(NUMERIC_KEYS, NUMBERS):
        # NOTE: a key of its own makes a group of one value form: the short-number steps read it at once.
        lines += [_form([key, "#token"], ["1", value]) + ending] * 3
    rng = random.Random(3)
    for _ in range(40):  # one group of mixed forms: the general step
        lines.append(_form(["token usage", "#queue-req"], [rng.choice(NUMBERS), rng.choice(NUMBERS)]) + ending)
    _same(tmp_path, monkeypatch, ("\n".join(lines) + "\n").encode())


@pytest.mark.parametrize("junk", ["\r", "\x1b[0m", "\xff", "\u00e9"])
def test_crlf_ansi_and_non_ascii_lines_in_a_hot_chunk(tmp_path, monkeypatch, junk: str) -> None:
    rng = random.Random(5)
    lines = [_decode_line(rng, " TP0") for _ in range(200)]
    for i in range(0, 200, 7):
        cut = rng.randint(0, len(lines[i]))
        lines[i] = lines[i][:cut] + junk + lines[i][cut:]
    lines += [lf.vllm_prefix(lf.T0) + lf.vllm_stats(running=3, waiting=0, usage=0.1, gen=10.0)] * 3
    _same(tmp_path, monkeypatch, "\n".join(lines).encode("utf-8", "surrogateescape") + b"\n")


@pytest.mark.parametrize("long_line", [100, 70_000, 200_000])
def test_a_range_reads_its_last_line_past_its_end(tmp_path, long_line: int) -> None:
    lines = [b"a" * 50, b"b" * long_line, b"c" * 30, b"d" * 10]
    data = b"\n".join(lines) + b"\n"
    path = tmp_path / "x.log"
    path.write_bytes(data)
    cuts = sorted({0, 20, 51, 60, 51 + long_line // 2, len(data) - 5, len(data)})
    got = []
    for start, stop in zip(cuts[:-1], cuts[1:]):
        begin, buf = _read_lines(str(path), start, stop, len(data), 1 << 20)
        assert buf is not None and bytes(buf[len(buf) - PAD:]) == bytes(PAD)
        if begin < stop:
            got += bytes(buf[: len(buf) - PAD]).split(b"\n")
    assert got == lines


def test_a_range_whose_last_line_is_too_long_says_so(tmp_path) -> None:
    data = b"x" * 10 + b"\n" + b"y" * 300_000 + b"\n"
    path = tmp_path / "x.log"
    path.write_bytes(data)
    assert _read_lines(str(path), 0, 20, len(data), 100_000)[1] is None
    assert np.array_equal(np.frombuffer(_read_lines(str(path), 0, 5, len(data), 1 << 20)[1][:10], np.uint8),
                          np.frombuffer(b"x" * 10, np.uint8))
