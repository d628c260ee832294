"""The block reader's fields equal `parse_fields` for every line it reads, and it reads SGLang's own forms."""
from __future__ import annotations

import math

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from toolkit.diagnose.columns import _KEYS, access_fields, batch_fields
from toolkit.diagnose.fields import parse_fields
from toolkit.diagnose.scan import scan
from tests.diagnose import logfactory as lf

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
STAMP = "[2025-11-11 04:06:27 TP0] "
NUMBERS = st.one_of(st.integers(-10**9, 10**9).map(str), st.integers(0, 10**7).map(lambda n: f"{n / 100:.2f}"),
                    st.floats(0, 1e6, allow_nan=False).map(lambda x: f"{x:.{int(x) % 9}f}"),
                    st.sampled_from(["12.50%", "7%", "0.5.1", "1.", ".5", "-", "--3", "1e-05", "None", "??", "",
                                     "12 GB", "0012", "3 -> 4", "\u0663", "12345678", "1234567.1234567"]))
VALUES = st.one_of(NUMBERS, st.sampled_from(["True", "False"]))
KEYS = st.sampled_from(list(_KEYS) + ["mystery key", "#Running-Req", "est. decode TFLOPS/s (per GPU)"])
SEPARATORS = st.sampled_from([", "] * 8 + [",", ",  ", ". ", " , "])
ENDS = st.sampled_from(["", ", ", ",", " ", "  ", ",x"])


def _read(lines: list[str]) -> tuple[list[dict], list[str]]:
    """Fields the block reader gives for the lines it reads (NaN dropped), and those lines."""
    data = "\n".join(lines).encode()
    fast = scan(data)
    if fast is None:  # not ASCII: the per-line path reads it
        return [], []
    rows, columns = batch_fields(fast)
    text = data.decode()
    out = []
    for i, row in enumerate(rows.tolist()):
        fields = {k: v[i] for k, v in columns.items() if not (isinstance(v[i], float) and math.isnan(v[i]))}
        out.append(fields)
    return out, [text[b:e] for b, e in zip(fast.start[rows].tolist(), fast.end[rows].tolist())]


@SETTINGS
@given(st.lists(st.tuples(st.sampled_from(["Decode batch", "Prefill batch"]), st.sampled_from([". ", ", ", ".", ","]),
                          st.lists(st.tuples(KEYS, VALUES, SEPARATORS), min_size=1, max_size=8), ENDS),
                min_size=1, max_size=20))
def test_batch_fields_equal_parse_fields(lines) -> None:
    texts = []
    for label, after, pieces, end in lines:
        body = "".join(f"{key}: {value}{sep}" for key, value, sep in pieces[:-1])
        key, value, _ = pieces[-1]
        running = "#running-req: 1, " if label == "Decode batch" else ""
        texts.append(f"{STAMP}{label}{after}{running}{body}{key}: {value}{end}")
    got, read = _read(texts)
    for fields, text in zip(got, read):
        want = parse_fields("decode" if "Decode batch" in text else "prefill", text)
        assert fields.keys() == want.keys(), text
        for key, value in want.items():
            assert fields[key] == value and isinstance(fields[key], bool) == isinstance(value, bool), (key, text)


def test_every_era_form_of_batch_lines_is_read_by_the_block_reader() -> None:
    lines = []
    for era in ("0.3.6", "0.4.3", "0.4.9", "0.5.3", "0.5.5", "0.5.23"):
        lines.append(STAMP + lf.decode(era, running=233, token=370959, usage=0.82, throughput=4594.01, queue=317))
        lines.append(STAMP + lf.prefill(era, new_seq=4, new_token=8192, cached=512, running=229, queue=313,
                                        usage=0.41, token=272933, hit_rate=0.25, pending=777, throughput=1234.5))
    got, read = _read(lines)
    assert len(read) == len(lines)
    for fields, text in zip(got, read):
        assert fields == parse_fields("decode" if "Decode batch" in text else "prefill", text)


ACCESS = st.tuples(st.sampled_from(["127.0.0.1:54321", "[::1]:8000", "x" * 40, "10.0.0.7:1"]),
                   st.sampled_from(["POST", "GET", "get", "P0ST", ""]),
                   st.sampled_from(["/v1/chat/completions", "/generate?x=1", "/a b", "/" + "p" * 300, "/x\t"]),
                   st.sampled_from(["1.1", "2", "1.x", ""]), st.sampled_from(["200 OK", "404 Not Found", "20", "2000"]))


@SETTINGS
@given(st.lists(ACCESS, min_size=1, max_size=20))
def test_access_fields_equal_parse_fields(lines) -> None:
    texts = [f'{STAMP}INFO:     {client} - "{method} {path} HTTP/{version}" {status}'
             for client, method, path, version, status in lines]
    data = "\n".join(texts).encode()
    fast = scan(data)
    rows, columns = access_fields(data, fast)
    for i, row in enumerate(rows.tolist()):
        text = texts[fast.index[row]]
        got = {k: (int(v[i]) if isinstance(v, np.ndarray) else v[i].as_py()) for k, v in columns.items()}
        assert got == parse_fields("access", text), text
    plain = [t for t in texts if '"POST /v1/chat/completions HTTP/1.1" 200 OK' in t and "127.0.0.1" in t]
    if "\t" not in "".join(texts):  # a tab anywhere in the block leaves its access lines to parse_fields
        assert len(rows) >= len(plain)
