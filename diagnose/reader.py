"""Line reading in constant memory: plain files, gzip (by magic number), and stdin (`-`).

Lines come in blocks (one per ~4 MiB read): raw bytes (`raw_blocks`, complete lines without the last newline)
or decoded lines (`blocks`), where CR and ANSI colour codes are removed per block. A line longer than
`MAX_LINE` bytes is cut there and the rest skipped, so a single huge line cannot grow memory.
"""
from __future__ import annotations

import gzip
import io
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

BLOCK = 4 << 20
MAX_LINE = 1 << 20
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)")


@contextmanager
def open_log(path: str | Path) -> Iterator[BinaryIO]:
    """Open a log for binary reading; `-` is stdin, gzip is recognised by its magic number."""
    stdin = str(path) == "-"
    raw = sys.stdin.buffer if stdin else open(path, "rb")  # noqa: SIM115 - closed below
    try:
        head = raw.peek(2)[:2] if isinstance(raw, io.BufferedReader) else b""
        yield gzip.GzipFile(fileobj=raw) if head == b"\x1f\x8b" else raw
    finally:
        if not stdin:
            raw.close()


class LineReader:
    """Yields blocks of lines (raw or decoded); counts lines that were cut at `MAX_LINE`."""

    def __init__(self, stream: BinaryIO, max_line: int | None = None, block: int | None = None) -> None:
        self.stream, self.max_line, self.block = stream, max_line or MAX_LINE, block or BLOCK
        self.cut: list[int] = []  # 1-based numbers of the lines cut at max_line (first 100 kept)
        self.num_cut = 0

    def blocks(self) -> Iterator[list[str]]:
        lineno = 0
        for data, cut in self.raw_blocks():
            lines = decode_lines(data)
            lineno += len(lines)
            if cut:
                self.note_cut(lineno)
            yield lines

    def raw_blocks(self) -> Iterator[tuple[bytes, bool]]:
        """(block, cut): byte blocks of whole lines, each without its last newline (a block of n lines has
        n - 1 newlines); `cut` marks the one-line block of a line cut at `max_line` (the caller notes it)."""
        pending, skipping = b"", False
        while True:
            chunk = self.stream.read(self.block)
            if not chunk:
                break
            if skipping:
                nl = chunk.find(b"\n")
                if nl < 0:
                    continue
                chunk, skipping = chunk[nl + 1:], False
            data = pending + chunk
            last = data.rfind(b"\n")
            if last < 0:
                pending = data
            else:
                yield data[:last], False
                pending = data[last + 1:]
            if len(pending) > self.max_line:
                yield pending[: self.max_line], True
                pending, skipping = b"", True
        if pending:
            yield pending, False

    def note_cut(self, lineno: int) -> None:
        self.num_cut += 1
        if len(self.cut) < 100:
            self.cut.append(lineno)


def decode_lines(data: bytes) -> list[str]:
    text = data.decode("utf-8", "replace")
    if "\r" in text:
        text = text.replace("\r", "")
    if "\x1b" in text:
        text = _ANSI.sub("", text)
    return text.split("\n")
