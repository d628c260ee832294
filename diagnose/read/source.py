"""Reading a log in constant memory: plain files, gzip (by magic number) and stdin (`-`), as chunks of lines.

A chunk holds whole lines (about `CHUNK` bytes; its last line has no newline) followed by `PAD` zero bytes, so
the vectorized reader can load eight bytes at any offset inside it. A line longer than `MAX_LINE` bytes is cut
there and the rest skipped, so one huge line cannot grow memory.
"""
from __future__ import annotations

import gzip
import io
import os
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, NamedTuple

if TYPE_CHECKING:
    from toolkit.diagnose.read.lines import ParseStats

CHUNK = 2 << 20
MAX_LINE = 1 << 20
PAD = 128
# NOTE: no sequence spans a newline, so a chunk's lines and each line decoded alone read the same
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07\x1b\n]*(?:\x07|\x1b\\)")
# NOTE: colour codes whose ESC a paste dropped (`[2m2025-05-13T13:47:38.880Z[0m [32m INFO[0m`): read as colour
# codes on a line that holds the reset code `[0m` (the fast path leaves such lines to this reader)
PASTED_RESET = "[0m"
_PASTED_COLOURS = re.compile(r"\[[0-9;]{1,12}m")


class LogError(OSError):
    """A log that cannot be read (missing, a directory, not a file); the message is one line for the user."""


def check_log(path: str | Path) -> None:
    """Raise `LogError` unless `path` is `-` or a readable regular file."""
    if str(path) == "-":
        return
    if os.path.isdir(path):
        raise LogError(f"{path} is a directory, not a log file")
    if not os.path.exists(path):
        raise LogError(f"no such file: {path}")
    if not os.path.isfile(path):
        raise LogError(f"{path} is not a regular file")
    if not os.access(path, os.R_OK):
        raise LogError(f"{path} is not readable")


@contextmanager
def open_log(path: str | Path) -> Iterator[BinaryIO]:
    """Open a log for binary reading; `-` is stdin, gzip is recognised by its magic number."""
    stdin = str(path) == "-"
    if not stdin:
        check_log(path)
    raw = sys.stdin.buffer if stdin else open(path, "rb")  # noqa: SIM115 - closed below
    try:
        if not isinstance(raw, io.BufferedReader):
            raw = io.BufferedReader(raw)  # type: ignore[arg-type]
        head = raw.peek(2)[:2]
        yield gzip.GzipFile(fileobj=raw) if head == b"\x1f\x8b" else raw
    finally:
        if not stdin:
            raw.close()


class Chunk(NamedTuple):
    """`data[:size]` is whole lines without the last newline; `data[size:]` is at least `PAD` zero bytes.
    `cut` marks a one-line chunk holding a line cut at the length limit. `origin`: (path, offset) where
    `data[:size]` is that file's bytes from offset, as a range worker read them; None for a stream's chunk (its
    bytes are read once)."""

    data: bytearray
    size: int
    cut: bool
    origin: tuple[str, int] | None = None


class LineReader:
    """Yields chunks of whole lines; counts the lines cut at `max_line`."""

    def __init__(self, stream: BinaryIO, max_line: int | None = None, chunk: int | None = None) -> None:
        self.stream, self.max_line, self.chunk = stream, max_line or MAX_LINE, chunk or CHUNK
        self.cut: list[int] = []  # 1-based numbers of the lines cut at max_line (first 100 kept)
        self.num_cut = 0

    def chunks(self) -> Iterator[Chunk]:
        pending, skipping = b"", False
        while True:
            buf = bytearray(len(pending) + self.chunk + PAD)
            buf[: len(pending)] = pending
            got = self._fill(memoryview(buf)[len(pending): len(pending) + self.chunk])
            if got == 0:
                break
            end = len(pending) + got
            start = 0
            if skipping:
                nl = buf.find(b"\n", 0, end)
                if nl < 0:
                    pending = b""
                    continue
                start, skipping = nl + 1, False
            last = buf.rfind(b"\n", start, end)
            if last < 0:
                pending = bytes(buf[start:end])
            else:
                pending = bytes(buf[last + 1: end])
                yield self._chunk(buf, start, last, False)
            if len(pending) > self.max_line:
                cut = bytearray(pending[: self.max_line]) + bytes(PAD)
                yield Chunk(cut, self.max_line, True)
                pending, skipping = b"", True
        if pending:
            yield Chunk(bytearray(pending) + bytes(PAD), len(pending), False)

    def _fill(self, view: memoryview) -> int:
        """Read until `view` is full or the stream ends (pipes and gzip return short reads)."""
        got = 0
        while got < len(view):
            n = self.stream.readinto(view[got:])  # type: ignore[attr-defined]
            if not n:
                break
            got += n
        return got

    @staticmethod
    def _chunk(buf: bytearray, start: int, last: int, cut: bool) -> Chunk:
        if start:
            del buf[:start]
            last -= start
        buf[last: last + PAD] = bytes(PAD)
        return Chunk(buf, last, cut)

    def note_cut(self, lineno: int) -> None:
        self.num_cut += 1
        if len(self.cut) < 100:
            self.cut.append(lineno)

    def report_cuts(self, stats: ParseStats) -> None:
        """Count the cut lines as unread in `stats` (the first 100 with an example each)."""
        for line in self.cut:
            stats.note_unread(line, f"<line longer than {self.max_line} bytes, cut>")
        stats.unread += self.num_cut - len(self.cut)


def decode_lines(data: bytes | bytearray | memoryview) -> list[str]:
    """The lines of a chunk's text, CR and ANSI colour codes removed."""
    return decode_line(data).split("\n")


def decode_line(data: bytes | bytearray | memoryview) -> str:
    """Text, CR and ANSI colour codes removed: a chunk's lines, decoded alone, are its `decode_lines`."""
    return cleaned(bytes(data).decode("utf-8", "replace"))


def cleaned(text: str) -> str:
    """Text as the readers take it: CR, ANSI colour codes and colour codes a paste lost the ESC of removed (the text
    of lines passed as strings is cleaned as a file's decoded lines are)."""
    if "\r" in text:
        text = text.replace("\r", "")
    if "\x1b" in text:
        text = _ANSI.sub("", text)
    if PASTED_RESET in text:
        text = "\n".join(_without_pasted_colours(line) for line in text.split("\n"))
    return text


def _without_pasted_colours(line: str) -> str:
    """A line's colour codes whose ESC a paste dropped, removed where the line holds the reset code."""
    return _PASTED_COLOURS.sub("", line) if PASTED_RESET in line else line
