"""Chunks scanned ahead on worker threads come out in file order, equal to scanning them one by one, with a
bounded look-ahead; a worker's error reaches the caller. Chunks hold whole lines and zero padding."""
from __future__ import annotations

import io

import numpy as np
import pytest

from toolkit.diagnose.read.fastpath import ahead
from toolkit.diagnose.read.fastpath.ahead import JobResult, scanned_chunks
from toolkit.diagnose.read.fastpath.scan import scan_chunk
from toolkit.diagnose.read.lines import parse_path
from toolkit.diagnose.read.source import PAD, LineReader
from tests.diagnose import logfactory as lf

CHUNK = 4096


def _log_bytes(decode_lines: int = 600) -> bytes:
    log = lf.Log("0.5.5").start()
    log.decode_series(decode_lines, running=[(i * 7) % 300 for i in range(decode_lines)])
    log.add("Prefill batch. #new-seq: 1, #new-token: 128, #cached-token: 0, token usage: 0.10, "
            "#running-req: 3, #queue-req: 0")
    return (log.text() + "\n" + "\n".join(lf.access() for _ in range(50)) + "\n").encode()


def _reader(data: bytes) -> LineReader:
    return LineReader(io.BytesIO(data), chunk=CHUNK)


def test_chunks_hold_whole_lines_and_padding() -> None:
    data = _log_bytes()
    chunks = list(_reader(data).chunks())
    assert len(chunks) > 10
    assert b"\n".join(bytes(c.data[: c.size]) for c in chunks) + b"\n" == data
    assert all(bytes(c.data[c.size: c.size + PAD]) == bytes(PAD) for c in chunks)


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_scanned_chunks_equal_sequential_scans_in_order(workers: int) -> None:
    data = _log_bytes()
    sequential = list(_reader(data).chunks())
    job = lambda chunk, scanned: JobResult((chunk, scanned))  # noqa: E731
    scanned = [read.extra for read in scanned_chunks(_reader(data).chunks(), workers=workers, job=job)]
    assert [bytes(c.data) for c, _ in scanned] == [bytes(c.data) for c in sequential]
    for (chunk, got), expected in zip(scanned, (scan_chunk(c.data, c.size) for c in sequential)):
        np.testing.assert_array_equal(got.slow, expected.slow)
        for column in ("index", "kind", "time", "rank"):
            np.testing.assert_array_equal(getattr(got.batch, column), getattr(expected.batch, column))
        assert got.batch.fields.keys() == expected.batch.fields.keys() and got.access == expected.access
        for name, values in expected.batch.fields.items():
            np.testing.assert_array_equal(got.batch.fields[name], values)


def test_look_ahead_is_bounded() -> None:
    read = 0

    def counting():
        nonlocal read
        for chunk in _reader(_log_bytes()).chunks():
            read += 1
            yield chunk

    for consumed, _ in enumerate(scanned_chunks(counting(), workers=2), start=1):
        assert read - consumed <= 2


def test_a_worker_error_reaches_the_caller(monkeypatch) -> None:
    def broken(data, size):
        raise ValueError("scanner broke")

    monkeypatch.setattr(ahead, "scan_chunk", broken)
    with pytest.raises(ValueError, match="scanner broke"):
        list(scanned_chunks(_reader(_log_bytes(50)).chunks()))


def test_line_numbers_count_across_chunks(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr("toolkit.diagnose.read.source.CHUNK", CHUNK)
    path = tmp_path / "server.log"
    data = _log_bytes()
    path.write_bytes(data)
    lines = data.decode().split("\n")
    decode = [e for e in parse_path(path) if e.kind == "decode"]
    assert len(decode) == 600
    assert all(lines[e.line - 1].endswith(e.text) for e in decode)
