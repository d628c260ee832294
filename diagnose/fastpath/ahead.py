"""Chunks scanned ahead while the caller reads earlier ones, in file order, at most `workers + 1` at once.

- Any stream (stdin, gzip, a small file): the caller reads chunks; worker threads scan them. The scanner is
  numpy over whole chunks and releases the GIL for much of its work.
- A large plain file: worker processes read and scan byte ranges of it themselves, and send back only what the
  caller needs: the hot batch lines as columns, the access count, and the text of the lines the per-line parser
  must read (slow runs, the first line of each hot run, a few samples). No chunk's bytes cross a process
  boundary. A range owns the lines that start inside it; a line longer than `MAX_LINE` makes the caller read
  the file as a stream instead (it is cut there, as the stream reader cuts it).
"""
from __future__ import annotations

import multiprocessing
import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from toolkit.diagnose.fastpath.scan import BatchLines, ScannedChunk, scan_chunk
from toolkit.diagnose.source import MAX_LINE, PAD, Chunk, decode_lines

WORKERS = min(2, os.cpu_count() or 1)
PROCESS_MIN_BYTES = 32 << 20  # smaller files are not worth starting processes for


@dataclass(slots=True)
class ReadChunk:
    """A chunk as the reader consumes it: its line count, which lines are slow, the hot batch lines and access
    count, and `texts(begin, end)`, the decoded lines [begin, end) for the per-line parser."""

    lines: int
    slow: np.ndarray
    batch: BatchLines
    access: int
    cut: bool
    texts: Callable[[int, int], list[str]]
    extra: object = None  # what the caller's job made of the chunk where it was scanned


def runs(slow: np.ndarray) -> Iterable[tuple[int, int, bool]]:
    """(begin, end, slow) for each run of equal values in `slow`."""
    edges = np.flatnonzero(np.diff(slow.view(np.int8))) + 1
    bounds = np.concatenate(([0], edges, [len(slow)])).tolist()
    flags = slow[bounds[:-1]].tolist()
    return zip(bounds[:-1], bounds[1:], flags)


def samples(batch: BatchLines) -> list[int]:
    """The first and last hot line of each batch kind (their messages tell the era)."""
    picks: list[int] = []
    for code in (0, 1):
        rows = np.flatnonzero(batch.kind == code)
        picks += [int(batch.index[i]) for i in dict.fromkeys(rows[:1].tolist() + rows[-1:].tolist())]
    return picks


@dataclass(slots=True)
class JobResult:
    """What a job made of a chunk: `payload` for the caller, and `slow`, the lines the caller must read line
    by line instead of the scan's (None: the scan's)."""

    payload: object
    slow: np.ndarray | None = None


Job = Callable[[Chunk, ScannedChunk], JobResult]  # more work on a scanned chunk, done where it was scanned


def _view(chunk: Chunk, scanned: ScannedChunk, job: Job | None = None) -> ReadChunk:
    def texts(begin: int, end: int) -> list[str]:
        return decode_lines(memoryview(chunk.data)[scanned.starts[begin]: scanned.ends[end - 1]])

    result = job(chunk, scanned) if job is not None else JobResult(None)
    slow = scanned.slow if result.slow is None else result.slow
    return ReadChunk(scanned.lines, slow, scanned.batch, scanned.access, chunk.cut, texts, result.payload)


def _scan(chunk: Chunk, job: Job | None) -> ReadChunk:
    return _view(chunk, scan_chunk(chunk.data, chunk.size), job)


def _ordered(submit: Callable[[object], Future], items: Iterable[object], workers: int) -> Iterator:
    ahead: deque[Future] = deque()
    for item in items:
        ahead.append(submit(item))
        if len(ahead) > workers:
            yield ahead.popleft().result()
    while ahead:
        yield ahead.popleft().result()


def scanned_chunks(chunks: Iterable[Chunk], workers: int = WORKERS, job: Job | None = None) -> Iterator[ReadChunk]:
    """The chunks of a stream, each scanned (and given to `job`) on a worker thread while earlier ones are
    consumed."""
    with ThreadPoolExecutor(workers, thread_name_prefix="diagnose-scan") as pool:
        yield from _ordered(lambda chunk: pool.submit(_scan, chunk, job), chunks, workers)


# -- byte ranges of a plain file, scanned in worker processes ----------------------------------------------

class LineTooLong(Exception):
    """A range holds a line longer than MAX_LINE: the caller reads the rest of the file, from `offset` (the
    start of the range's first line), as a stream."""

    def __init__(self, offset: int) -> None:
        super().__init__(offset)
        self.offset = offset


def use_processes(path: str | Path, workers: int = WORKERS) -> bool:
    """Whether `path` is a plain (not gzip) regular file big enough, and processes can be forked."""
    if workers < 2 or str(path) == "-" or "fork" not in multiprocessing.get_all_start_methods():
        return False
    try:
        if not os.path.isfile(path) or os.path.getsize(path) < PROCESS_MIN_BYTES:
            return False
        with open(path, "rb") as f:
            return f.read(2) != b"\x1f\x8b"
    except OSError:
        return False


def scanned_ranges(path: str | Path, chunk: int, workers: int = WORKERS, job: Job | None = None) -> Iterator[ReadChunk]:
    """The file's ranges of `chunk` bytes, each read, scanned (and given to `job`) by a worker process, in
    order. Raises `LineTooLong` at the first range that holds a line longer than MAX_LINE."""
    size = os.path.getsize(path)
    context = multiprocessing.get_context("fork")
    with ProcessPoolExecutor(workers, mp_context=context) as pool:
        submit = lambda start: pool.submit(_scan_range, str(path), start, min(start + chunk, size), size,  # noqa: E731
                                           MAX_LINE, job)
        for packed in _ordered(submit, range(0, size, chunk), workers):
            if packed.too_long:
                raise LineTooLong(packed.begin)
            yield ReadChunk(packed.lines, packed.slow, packed.batch, packed.access, False, packed.text, packed.extra)


@dataclass(slots=True)
class _Packed:
    """What a worker sends back for one range: no chunk bytes, only the texts the caller may read."""

    begin: int
    lines: int = 0
    slow: np.ndarray | None = None
    batch: BatchLines | None = None
    access: int = 0
    texts: dict[tuple[int, int], list[str]] | None = None
    too_long: bool = False
    extra: object = None

    def text(self, begin: int, end: int) -> list[str]:
        return self.texts[(begin, end)]  # type: ignore[index]


_EMPTY = bytearray(b"x") + bytes(PAD)


def _scan_range(path: str, start: int, stop: int, size: int, max_line: int, job: Job | None) -> _Packed:
    """Read and scan the lines that start in [start, stop)."""
    begin, data = _read_lines(path, start, stop, size, max_line)
    if data is None:
        return _Packed(begin, too_long=True)
    if begin >= stop:
        empty = scan_chunk(_EMPTY, 1).batch
        return _Packed(begin, 0, np.zeros(0, bool), empty, 0, {})
    buf = bytearray(len(data) + PAD)
    buf[: len(data)] = data
    scanned = scan_chunk(buf, len(data))
    if int((scanned.ends - scanned.starts).max()) > max_line:
        return _Packed(begin, too_long=True)
    view = _view(Chunk(buf, len(data), False), scanned, job)
    texts: dict[tuple[int, int], list[str]] = {}
    for first, end, slow in runs(view.slow):
        key = (first, end) if slow else (first, first + 1)
        texts[key] = view.texts(*key)
    for i in samples(scanned.batch):
        texts.setdefault((i, i + 1), view.texts(i, i + 1))
    return _Packed(begin, scanned.lines, view.slow, scanned.batch, scanned.access, texts, extra=view.extra)


def _read_lines(path: str, start: int, stop: int, size: int, max_line: int) -> tuple[int, bytes | None]:
    """(offset of the first line starting in [start, stop), those lines' bytes without their last newline):
    an offset >= stop when no line starts there; bytes None when the last one ends more than max_line bytes
    away."""
    with open(path, "rb") as f:
        begin = 0
        if start > 0:
            f.seek(start - 1)
            head = f.read(stop - start + 1)
            first = head.find(b"\n")
            if first < 0:
                return stop, b""
            begin = start + first
        if begin >= stop:
            return begin, b""
        f.seek(begin)
        data = f.read(stop - begin)
        if data.endswith(b"\n"):
            return begin, data[:-1]
        if stop >= size:
            return begin, data
        # NOTE: the last line owned here ends at the first newline at or after stop - 1.
        tail = f.read(max_line + 1)
        end = tail.find(b"\n")
        if end < 0 and begin + len(data) + len(tail) < size:
            return begin, None
        return begin, data + (tail if end < 0 else tail[:end])
