"""Blocks scanned ahead on worker threads come out in file order, equal to scanning them one by one, with a
bounded look-ahead; a worker's error reaches the caller."""
from __future__ import annotations

import io

import numpy as np
import pandas as pd
import pytest

from toolkit.diagnose import blocks
from toolkit.diagnose.blocks import scanned_blocks
from toolkit.diagnose.columns import batch_fields
from toolkit.diagnose.parser import parse_path
from toolkit.diagnose.reader import LineReader
from toolkit.diagnose.scan import scan
from tests.diagnose import logfactory as lf

BLOCK = 4096


def _log_bytes(decode_lines: int = 600) -> bytes:
    log = lf.Log("0.5.5").start()
    log.decode_series(decode_lines, running=[(i * 7) % 300 for i in range(decode_lines)])
    log.add("Prefill batch. #new-seq: 1, #new-token: 128, #cached-token: 0, token usage: 0.10, "
            "#running-req: 3, #queue-req: 0")
    return (log.text() + "\n" + "\n".join(lf.access() for _ in range(50)) + "\n").encode()


def _reader(data: bytes) -> LineReader:
    return LineReader(io.BytesIO(data), block=BLOCK)


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_scanned_blocks_equal_sequential_scans_in_order(workers: int) -> None:
    data = _log_bytes()
    sequential = list(_reader(data).raw_blocks())
    scanned = list(scanned_blocks(_reader(data), read_fields=True, workers=workers))
    assert len(sequential) > 10
    assert [(b.data, b.cut) for b in scanned] == sequential
    for block, (raw, _) in zip(scanned, sequential):
        expected = scan(raw)
        assert (block.fast is None) == (expected is None)
        if expected is None:
            continue
        for column in ("index", "kind", "time", "start", "end"):
            np.testing.assert_array_equal(getattr(block.fast, column), getattr(expected, column))
        rows, columns = batch_fields(expected)
        np.testing.assert_array_equal(block.fields[0], rows)
        assert block.fields[1].keys() == columns.keys()
        for name, values in columns.items():
            pd.testing.assert_series_equal(pd.Series(block.fields[1][name]), pd.Series(values))


def test_look_ahead_is_bounded() -> None:
    data = _log_bytes()
    read = 0
    reader = _reader(data)
    raw_blocks = reader.raw_blocks

    def counting():
        nonlocal read
        for item in raw_blocks():
            read += 1
            yield item

    reader.raw_blocks = counting
    for consumed, _ in enumerate(scanned_blocks(reader, read_fields=False, workers=2), start=1):
        assert read - consumed <= 2


def test_a_worker_error_reaches_the_caller(monkeypatch) -> None:
    def broken(data: bytes):
        raise ValueError("scanner broke")

    monkeypatch.setattr(blocks, "scan", broken)
    with pytest.raises(ValueError, match="scanner broke"):
        list(scanned_blocks(_reader(_log_bytes(50)), read_fields=False))


def test_parse_path_numbers_lines_across_scanned_blocks(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr("toolkit.diagnose.reader.BLOCK", BLOCK)
    path = tmp_path / "server.log"
    data = _log_bytes()
    path.write_bytes(data)
    lines = data.decode().split("\n")
    decode = [e for e in parse_path(path) if e.kind == "decode"]
    assert len(decode) == 600
    assert all("Decode batch" in lines[e.line - 1] for e in decode)
