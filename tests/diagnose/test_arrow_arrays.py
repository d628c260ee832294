"""`diagnose.read.arrow_arrays`: each array equals what `pyarrow.array` makes of the same values, and an export never
imports pandas."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from toolkit.diagnose.read.arrow_arrays import booleans, empty_table, names, numbers, spans, texts, values_of

SETTINGS = settings(max_examples=60, deadline=None)
FLOATS = st.floats(allow_nan=False, width=64)


@SETTINGS
@given(st.lists(st.tuples(FLOATS, st.booleans()), max_size=40))
def test_numbers_equal_pyarrow_array(rows) -> None:
    values = np.array([v for v, _ in rows], np.float64)
    missing = np.array([m for _, m in rows], bool)
    got = numbers(values, missing=missing)
    assert got.validate(full=True) is None
    assert got.equals(pa.array(values, pa.float64(), mask=missing))


def test_numbers_of_another_type_of_the_same_width_read_the_same_bytes() -> None:
    stamps = np.array([0, 1_762_833_987_000], np.int64)
    got = numbers(stamps, pa.timestamp("ms"), np.array([False, True]))
    assert got.equals(pa.array([0, None], pa.timestamp("ms")))
    assert numbers(np.arange(3, dtype=np.int32)).type == pa.int32()


@SETTINGS
@given(st.lists(st.tuples(st.booleans(), st.booleans()), max_size=40))
def test_booleans_equal_pyarrow_array(rows) -> None:
    values, missing = np.array([v for v, _ in rows], bool), np.array([m for _, m in rows], bool)
    got = booleans(values, missing)
    assert got.validate(full=True) is None
    assert got.equals(pa.array(values, pa.bool_(), mask=missing))


@SETTINGS
@given(st.lists(st.one_of(st.none(), st.text(max_size=12)), max_size=30))
def test_texts_equal_pyarrow_array(values) -> None:
    clean = [None if v is None else v.encode("utf-8", "replace").decode() for v in values]
    got = texts(values)
    assert got.validate(full=True) is None
    assert got.equals(pa.array(clean, pa.string()))


def test_a_character_utf8_cannot_hold_becomes_a_replacement_not_an_error() -> None:
    assert texts(["a\udcffb"]).to_pylist() == ["a?b"]


@SETTINGS
@given(st.lists(st.text(alphabet="abc xyz,\"", max_size=8), min_size=1, max_size=20), st.randoms())
def test_spans_are_the_text_of_each_span_in_any_order(words, random) -> None:
    data = b"".join(w.encode() + b"\n" for w in words)
    begin = np.cumsum([0] + [len(w) + 1 for w in words[:-1]]).astype(np.int64)
    stop = begin + np.array([len(w) for w in words], np.int64)
    order = list(range(len(words)))
    random.shuffle(order)
    got = spans(data, begin[order], stop[order])
    assert got.validate(full=True) is None
    assert got.to_pylist() == [words[i] for i in order]


def test_spans_placed_in_their_rows_are_null_in_the_others() -> None:
    data = b"GET /a\nPOST /bb\n"
    got = spans(data, np.array([7, 0]), np.array([11, 3]), at=np.array([4, 1]), length=6)
    assert got.validate(full=True) is None
    assert got.to_pylist() == [None, "GET", None, None, "POST", None]
    assert spans(data, np.zeros(0, np.int64), np.zeros(0, np.int64), at=np.zeros(0, np.int64), length=2).to_pylist() \
        == [None, None]


def test_names_and_an_empty_table_and_values_of_chunked_columns() -> None:
    assert names(np.array([2, 0, 2]), ["a", "b", "c"]).to_pylist() == ["c", "a", "c"]
    schema = pa.schema([("kind", pa.string()), ("line", pa.int64())])
    assert empty_table(schema).equals(schema.empty_table())
    column = pa.chunked_array([pa.array([1, 2, 3], pa.int64()).slice(1), pa.array([7], pa.int64())])
    assert values_of(column, np.int64).tolist() == [2, 3, 7]
    with pytest.raises(ValueError, match="nulls"):
        values_of(pa.array([1, None], pa.int64()), np.int64)


def test_an_export_never_imports_pandas(tmp_path) -> None:
    """pandas is 0.2 s of CPU that holds the GIL while the logs are read; nothing in `--export` (CSV or Parquet)
    needs it. A log of the benchmark's realistic mix, read by worker processes and by the stream reader."""
    code = """
import sys
from benchmarks.diagnose_parse import write_log
from toolkit.diagnose.read.export import export_events
from toolkit.diagnose.read.fastpath import ahead
write_log(sys.argv[1] + "/log", 3000, mix="realistic")
for smallest, suffix in ((0, ".csv"), (0, ".parquet"), (1 << 62, ".threads.csv")):
    ahead.PROCESS_MIN_BYTES = smallest  # 0: read by worker processes; else by the stream reader and threads
    export_events([sys.argv[1] + "/log"], sys.argv[1] + "/events" + suffix)
assert "pandas" not in sys.modules, "the export imported pandas"
"""
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], check=False, capture_output=True, text=True,
                          timeout=120, cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "events.csv").read_bytes() == (tmp_path / "events.threads.csv").read_bytes()
    assert (tmp_path / "events.parquet").stat().st_size > 0
