"""Chunks scanned ahead while the caller reads earlier ones, in file order, at most `workers + 1` at once.

- Any stream (stdin, gzip, a small file): the caller reads chunks; worker threads scan them. The scanner is
  numpy over whole chunks and releases the GIL for much of its work.
- A large plain file: worker processes read and scan byte ranges of it themselves, and send back only what the
  caller needs: the hot batch lines as columns, the access count, which slow lines are plain, and the text of
  the lines the per-line parser may read (the loud ones, those an open multi-line record may take, a few
  samples). No chunk's bytes cross a process boundary. A range owns the lines that start inside it; a line
  longer than `MAX_LINE` makes the caller read the file as a stream instead (it is cut there, as the stream
  reader cuts it). `range_workers()` forks them early and reads ahead.

A job (`--export`'s) does more with each scanned chunk where it was scanned; the lines it leaves to the per-line
parser (hot access lines whose fields it cannot read) are slow for the caller too, and no longer counted hot.
"""
from __future__ import annotations

import multiprocessing
import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from toolkit.diagnose.read import source
from toolkit.diagnose.read.fastpath.plain import stamped_plain, surely_plain, vllm_plain
from toolkit.diagnose.read.fastpath.scan import ScannedChunk, scan_chunk
from toolkit.diagnose.read.lines import RECORD_REACH, is_plain, opens_record
from toolkit.diagnose.read.source import MAX_LINE, PAD, Chunk, decode_line, decode_lines
from toolkit.runtime.host_memory import keep_freed_memory  # torch-free

WORKERS = min(2, os.cpu_count() or 1)
PROCESS_MIN_BYTES = 32 << 20  # smaller files are not worth starting processes for

Columns = dict[str, dict[str, np.ndarray]]  # hot batch lines by kind (`BatchLines.by_kind`)


@dataclass(slots=True)
class ReadChunk:
    """A chunk as the reader consumes it: its line count, which lines are slow, the hot batch lines as columns
    by kind with the rank names their codes index, the hot access count, and `texts(begin, end)`, the decoded
    lines [begin, end) for the per-line parser."""

    lines: int
    slow: np.ndarray
    columns: Columns | None
    ranks: list[str]
    access: int
    cut: bool
    texts: Callable[[int, int], list[str]]
    extra: object = None  # what the caller's job made of the chunk where it was scanned
    untimed: np.ndarray | None = None  # hot lines without a time, in line order
    plain: np.ndarray | None = None  # slow lines a worker found plain (`lines.is_plain`); None: not classified

    def stamped(self, begin: int, end: int) -> bool:
        """Whether the hot lines [begin, end) hold one with a time (the per-line parser then notes a stamp)."""
        if self.untimed is None or len(self.untimed) == 0:
            return True
        first, last = np.searchsorted(self.untimed, (begin, end)).tolist()
        return last - first < end - begin


def runs(slow: np.ndarray) -> Iterable[tuple[int, int, bool]]:
    """(begin, end, slow) for each run of equal values in `slow`."""
    edges = np.flatnonzero(np.diff(slow.view(np.int8))) + 1
    bounds = np.concatenate(([0], edges, [len(slow)])).tolist()
    flags = slow[bounds[:-1]].tolist()
    return zip(bounds[:-1], bounds[1:], flags)


def samples(columns: Columns | None) -> list[tuple[str, int]]:
    """(kind, line in the chunk) of the first and last hot line of each batch kind (their messages tell the
    era)."""
    picks: list[tuple[str, int]] = []
    for kind, part in (columns or {}).items():
        line = part["line"]
        picks += [(kind, i) for i in dict.fromkeys([int(line[0]), int(line[-1])])]
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
    slow, access = scanned.slow, scanned.access
    columns, ranks = scanned.columns()
    if result.slow is not None:
        # NOTE: a job leaves only hot access lines to the per-line parser: they count as its lines, not hot ones
        access -= int(np.count_nonzero(result.slow & ~slow))
        slow = result.slow
    return ReadChunk(scanned.lines, slow, columns, ranks, access, chunk.cut, texts, result.payload,
                     scanned.access_lines.untimed)


def _scan(chunk: Chunk, job: Job | None) -> ReadChunk:
    return _view(chunk, scan_chunk(chunk.data, chunk.size), job)


def _ordered(submit: Callable[[object], Future], items: Iterable[object], workers: int,
             ahead: deque[Future] | None = None) -> Iterator:
    """The results of `submit(item)` in order, at most `workers + 1` submitted ahead (`ahead`: already submitted)."""
    ahead = ahead if ahead is not None else deque()
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


@dataclass(slots=True)
class _Workers:
    """`range_workers()`'s pool: its size, and the first ranges of a file submitted (with a job) before the read
    that takes them."""

    pool: ProcessPoolExecutor
    size: int
    ahead_of: tuple[str, int, Job | None] | None = None  # (path, chunk, job) of the ranges in `ahead`
    ahead: deque[Future] = field(default_factory=deque)


_WORKERS: list[_Workers | None] = [None]


@contextmanager
def range_workers(read_ahead: str | Path | None = None, workers: int = WORKERS,
                  job: Job | None = None) -> Iterator[None]:
    """Range workers for the first `scanned_ranges` inside, forked now, while the caller's heap is small (a forked
    process's pages count in its RSS as well as in its parent's); they exit when that read ends, before the
    caller's analysis peaks. `read_ahead`: a log whose first ranges they start reading at once (with `job`),
    while the caller imports the rest of what it needs; the next `scanned_ranges` of it with that job takes
    them."""
    pool = _pool(workers)
    state = _Workers(pool, workers)
    _WORKERS[0] = state
    try:
        if read_ahead is not None and use_processes(read_ahead, workers):
            chunk, size = source.CHUNK, os.path.getsize(read_ahead)
            state.ahead_of = (str(read_ahead), chunk, job)
            state.ahead.extend(_submit(pool, str(read_ahead), start, chunk, size, job)
                               for start in range(0, size, chunk)[: workers + 1])
        yield
    finally:
        _WORKERS[0] = None
        pool.shutdown(cancel_futures=True)


def _pool(workers: int) -> ProcessPoolExecutor:
    return ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork"), initializer=keep_freed_memory)


def scanned_ranges(path: str | Path, chunk: int, workers: int = WORKERS, job: Job | None = None) -> Iterator[ReadChunk]:
    """The file's ranges of `chunk` bytes, each read, scanned (and given to `job`) by a worker process, in
    order. Raises `LineTooLong` at the first range that holds a line longer than MAX_LINE."""
    state = _WORKERS[0]
    if state is None or state.size != workers:
        with _pool(workers) as pool:
            yield from _ranges(pool, path, chunk, workers, job, deque())
        return
    ahead: deque[Future] = deque()
    if state.ahead_of == (str(path), chunk, job):
        ahead, state.ahead, state.ahead_of = state.ahead, deque(), None
    try:
        yield from _ranges(state.pool, path, chunk, workers, job, ahead)
    finally:
        _WORKERS[0] = None
        state.pool.shutdown(cancel_futures=True)


def _ranges(pool: ProcessPoolExecutor, path: str | Path, chunk: int, workers: int, job: Job | None,
            ahead: deque[Future]) -> Iterator[ReadChunk]:
    """The ranges of `path` read by `pool`'s workers; `ahead` holds those of its first ranges already submitted."""
    size, name = os.path.getsize(path), str(path)
    submit = lambda start: _submit(pool, name, start, chunk, size, job)  # noqa: E731
    for packed in _ordered(submit, range(len(ahead) * chunk, size, chunk), workers, ahead):
        if packed.too_long:
            raise LineTooLong(packed.begin)
        yield ReadChunk(packed.lines, packed.slow, packed.columns, packed.ranks, packed.access, False, packed.text,
                        packed.extra, packed.untimed, packed.plain)


def _submit(pool: ProcessPoolExecutor, path: str, start: int, chunk: int, size: int, job: Job | None) -> Future:
    """The range of `chunk` bytes at `start` of the file, read and scanned by one of `pool`'s workers."""
    return pool.submit(_scan_range, path, start, min(start + chunk, size), size, MAX_LINE, job)


@dataclass(slots=True)
class _Packed:
    """What a worker sends back for one range: no chunk bytes, only the texts of the lines the caller may read."""

    begin: int
    lines: int = 0
    slow: np.ndarray | None = None
    columns: Columns | None = None
    ranks: list[str] | None = None
    access: int = 0
    texts: dict[int, str] | None = None
    too_long: bool = False
    extra: object = None
    untimed: np.ndarray | None = None
    plain: np.ndarray | None = None

    def text(self, begin: int, end: int) -> list[str]:
        texts = self.texts
        assert texts is not None
        return [texts[i] for i in range(begin, end)]


def _scan_range(path: str, start: int, stop: int, size: int, max_line: int, job: Job | None) -> _Packed:
    """Read and scan the lines that start in [start, stop), and give them to `job`."""
    begin, buf = _read_lines(path, start, stop, size, max_line)
    if buf is None:
        return _Packed(begin, too_long=True)
    if begin >= stop:
        return _Packed(begin, 0, np.zeros(0, bool), {}, [], 0, {})
    length = len(buf) - PAD
    scanned = scan_chunk(buf, length)
    if int((scanned.ends - scanned.starts).max()) > max_line:
        return _Packed(begin, too_long=True)
    view = _view(Chunk(buf, length, False, (path, begin)), scanned, job)
    lines = _LineTexts(buf, scanned.starts, scanned.ends)
    # NOTE: the slow lines are classified here, in parallel: the caller reads only those that are not plain (most
    # slow lines of a long log are other INFO lines), and the lines an open multi-line record may take
    plain = _plain(buf, scanned, view.slow, lines)
    texts = {i: lines[i] for i in _lines_read(lines, view.slow & ~plain, view.columns)}
    return _Packed(begin, scanned.lines, view.slow, view.columns, view.ranks, view.access, texts,
                   extra=view.extra, untimed=view.untimed, plain=plain)


def _plain(buf: bytearray, scanned: ScannedChunk, slow: np.ndarray, lines: _LineTexts) -> np.ndarray:
    """Which of the `slow` lines are plain (`is_plain`): most are told from their bytes (`stamped_plain` for those
    behind a stamp the scanner read, `vllm_plain` for those behind a vLLM prefix, `surely_plain` for the others),
    the rest decoded."""
    plain = np.zeros(scanned.lines, bool)
    told = np.zeros(scanned.lines, bool)  # lines whose `surely_plain` is known
    stamped = scanned.stamped
    plain[stamped.index] = stamped_plain(buf, scanned.starts, scanned.ends, stamped)
    told[stamped.index] = True
    plain &= slow
    others = np.flatnonzero(slow & ~told)
    if len(others):
        plain[others] = vllm_plain(buf, scanned.starts, scanned.ends, others)
    index = np.flatnonzero(slow & ~plain)
    bounds = zip(index.tolist(), scanned.starts[index].tolist(), scanned.ends[index].tolist(), told[index].tolist())
    plain[index] = [(not known and surely_plain(buf[a:b])) or is_plain(lines[i]) for i, a, b, known in bounds]
    return plain


class _LineTexts:
    """A range's lines, each decoded when first read (`source.decode_line`): the caller reads the text of one line
    in ten of a long log, the rest are hot or plain."""

    __slots__ = ("_data", "_starts", "_ends", "_texts")

    def __init__(self, data: bytearray, starts: np.ndarray, ends: np.ndarray) -> None:
        self._data = memoryview(data)
        self._starts, self._ends = starts, ends
        self._texts: dict[int, str] = {}

    def __len__(self) -> int:
        return len(self._starts)

    def __getitem__(self, i: int) -> str:
        text = self._texts.get(i)
        if text is None:
            text = self._texts[i] = decode_line(self._data[int(self._starts[i]): int(self._ends[i])])
        return text


def _lines_read(lines: _LineTexts, loud: np.ndarray, columns: Columns | None) -> Iterable[int]:
    """The lines whose text the caller may read: the loud ones (slow, not plain), those a multi-line record may
    take (after a line that opens one, and at the range's start, where one may be open from the range before),
    and the samples."""
    n = len(lines)
    loud_lines = np.flatnonzero(loud).tolist()
    yield from loud_lines
    yield from range(min(n, RECORD_REACH))
    for i in loud_lines:
        if opens_record(lines[i]):
            yield from range(i + 1, min(n, i + 1 + RECORD_REACH))
    for _, i in samples(columns):
        yield i


_TAIL = 1 << 16  # bytes read past a range for the end of its last line (more where that line is longer)


def _read_lines(path: str, start: int, stop: int, size: int, max_line: int) -> tuple[int, bytearray | None]:
    """(offset of the first line starting in [start, stop), a buffer of those lines without their last newline
    and `PAD` zero bytes after): an offset >= stop when no line starts there; the buffer None when the last one
    ends more than max_line bytes away."""
    skip = 1 if start > 0 else 0
    buf = bytearray(stop - start + skip + _TAIL + PAD)
    with open(path, "rb", buffering=0) as f:
        f.seek(start - skip)
        got = _fill(f, memoryview(buf)[: len(buf) - PAD])
        first = 0
        if skip:
            first = buf.find(b"\n", 0, stop - start + 1) + 1
            if first == 0:
                return stop, bytearray(PAD)
        begin = start - skip + first
        if begin >= stop:
            return begin, bytearray(PAD)
        # NOTE: the last line owned here ends at the first newline at or after stop - 1.
        end = buf.find(b"\n", stop - start + skip - 1, got)
        while end < 0 and start - skip + got < size:
            if got - (stop - start + skip) > max_line:
                return begin, None
            buf[got:] = bytes(len(buf) - got + _TAIL)
            got += _fill(f, memoryview(buf)[got: len(buf) - PAD])
            end = buf.find(b"\n", stop - start + skip - 1, got)
    end = got if end < 0 else end
    buf[end: end + PAD] = bytes(PAD)
    del buf[end + PAD:]
    del buf[:first]
    return begin, buf


def _fill(f, view: memoryview) -> int:
    got = 0
    while got < len(view):
        n = f.readinto(view[got:])
        if not n:
            break
        got += n
    return got
