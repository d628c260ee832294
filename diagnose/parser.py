"""Streaming parser: log lines -> `Event`s, in constant memory, for every SGLang era (LOG_FORMATS §1-5, §11).

Raw blocks go through `diagnose.scan` first: hot lines in the common layout are classified in vectorized
operations; every other line takes the per-line path, which classifies with substring tests before any
regex. Fields are read lazily from the event's text. Multi-line records (tracebacks, hard OOM, leak
warnings) are joined into one event. Unreadable lines are counted in `ParseStats`, never raised.
"""
from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Iterator
from operator import itemgetter
from dataclasses import dataclass, field
from typing import NamedTuple
from pathlib import Path

import numpy as np

from toolkit.diagnose.blocks import scanned_blocks
from toolkit.diagnose.events import Event
from toolkit.diagnose.hotlines import HotBlock
from toolkit.diagnose.reader import LineReader, decode_lines, open_log
from toolkit.diagnose.scan import KINDS, FastLines, scan
from toolkit.diagnose.stamp import HAS_STAMP, Stamp, read_stamp


MAX_BLOCK_LINES = 200
MAX_BLOCK_CHARS = 64 * 1024
MAX_EXAMPLES = 20
_CACHE_LIMIT = 8192

_RARE_PATTERNS = {
    "pool": r"max_total_num_tokens?=",
    "load_begin": r"[Ll]oad weight begin",
    "load_end": r"[Ll]oad weight end",
    "kv_alloc": r"KV Cache is allocated",
    "pool_end": r"Memory pool end",
    "graph_failed": r"Capture (?:cuda|CUDA) graph failed",
    "graph_begin": r"Capture (?:[\w-]{1,40} ){0,3}?(?:cuda|CUDA|npu|NPU|cpu|CPU|musa|MUSA) graph begin",
    "graph_end": r"Capture (?:[\w-]{1,40} ){0,3}?(?:cuda|CUDA|npu|NPU|cpu|CPU|musa|MUSA) graph end",
    "dist_init": r"Init torch distributed (?:begin|ends?)",
    "server_args": r"server_args=",
    "tokens_capped": r"max_total_tokens=-?\d+ is larger than the profiled",
    "retract": r"[Dd]ecode out of memory happened|KV cache pool is full\. Retract requests|Testing retraction",
    "oom": r"(?:Prefill|Decode) out of memory",
    "not_enough_memory": r"Not enought? memory",
    "leak": r"leak detected|Warning: available_size=",
    "watchdog": r"[Ww]atchdog timeout",
    "exception": r"(?:\w{1,40} )?hit an exception|Traceback \(most recent call last\)",
    "sigquit": r"Received sigquit",
    "decode": r"#running-req: \d",
}
_RARE = re.compile("|".join(f"(?P<{kind}>{p})" for kind, p in _RARE_PATTERNS.items()))
_BLOCK_OPENERS = frozenset({"exception", "oom", "leak"})
_CONTINUATION = re.compile(
    r"^\s|^\w{0,80}(?:Error|Exception)\b|Try to allocate|Ava(?:ilable|liable) tokens|available_size|evictable_size"
    r"|leak detected|During handling|The above exception"
)


@dataclass(slots=True)
class ParseStats:
    """What the parser saw: every line is an event line, a continuation, `other` (readable, not an event),
    or unread (binary garbage, a label whose fields cannot be read, or a line cut at the length limit)."""

    lines: int = 0
    other: int = 0
    unread: int = 0
    kinds: Counter = field(default_factory=Counter)
    unread_examples: list[tuple[int, str]] = field(default_factory=list)

    def note_unread(self, line: int, text: str) -> None:
        self.unread += 1
        if len(self.unread_examples) < MAX_EXAMPLES:
            self.unread_examples.append((line, text[:300]))


@dataclass(slots=True)
class _Block:
    kind: str
    line: int
    stamp: Stamp
    parts: list[str]
    chars: int = 0

    def add(self, text: str) -> bool:
        if len(self.parts) >= MAX_BLOCK_LINES or self.chars >= MAX_BLOCK_CHARS:
            return False
        self.parts.append(text)
        self.chars += len(text)
        return True


Row = tuple  # (kind, line, time, rank, text, source): an `Event` before it is wrapped


class Block(NamedTuple):
    """One raw block parsed: rows in line order, its line count, the scanner's hot lines (None when the block
    took the per-line path), the block's text when it was decoded ("" otherwise) and its bytes."""

    rows: list[Row]
    count: int
    fast: FastLines | None
    text: str
    data: bytes


class Parser:
    """Turns lines into event rows. One instance per source; it keeps only a bounded stamp cache and at most
    one open multi-line record, so memory does not grow with the log."""

    def __init__(self, source: int = 0, stats: ParseStats | None = None) -> None:
        self.source = source
        self.stats = stats if stats is not None else ParseStats()
        self._stamps: dict[str, Stamp] = {}
        self._block: _Block | None = None
        self._day, self._last_tod, self._stamped = 0, -1.0, False

    def feed(self, lines: Iterable[str], first_line: int = 1) -> list[Row]:
        """Rows for `lines`, numbered from `first_line`; call `finish()` at the end of the source."""
        stats, stamps, source = self.stats, self._stamps, self.source
        rows: list[Row] = []
        append = rows.append
        block = self._block
        no = first_line - 1
        for no, line in enumerate(lines, first_line):
            if block is not None:
                if self._continues(block, line):
                    continue
                rows.extend(self._close_block())
                block = None
            if "Decode batch" in line:
                kind, i = "decode", line.find("Decode batch")
            elif "Prefill batch" in line:
                kind, i = "prefill", line.find("Prefill batch")
            elif "HTTP/" in line and ' - "' in line:
                kind, i = "access", line.rfind(" ", 0, line.find(' - "')) + 1
            elif "new fill batch" in line:
                kind, i = "prefill", line.find("new fill batch")
            else:
                row = self._rare(line, no)
                if row is not None:
                    append(row)
                block = self._block
                continue
            if kind != "access" and "running" not in line:
                stats.note_unread(no, line)
                continue
            pre = line[:i]
            st = stamps.get(pre)
            if st is None:
                st = self._stamp(pre)
            append((kind, no, st[0] if st[2] else self._dateless(st[0]), st[1], line, source))
        stats.kinds.update(map(itemgetter(0), rows))
        stats.lines = max(stats.lines, no)
        return rows

    def feed_bytes(self, data: bytes, first_line: int = 1, hot_rows: bool = True) -> Block:
        """A raw block of lines (no trailing newline) numbered from `first_line`: its rows in line order, and
        the scanner's hot lines. With `hot_rows=False` the hot lines are counted but left out of the rows."""
        return self.feed_scanned(data, scan(data), first_line, hot_rows)

    def feed_scanned(self, data: bytes, fast: FastLines | None, first_line: int = 1, hot_rows: bool = True) -> Block:
        """`feed_bytes` for a block the caller has already scanned (`fast = scan(data)`)."""
        if fast is None:
            lines = decode_lines(data)
            return Block(self.feed(lines, first_line), len(lines), None, "", data)
        rows: list[Row] = []
        text = data.decode("ascii") if hot_rows or fast.slow.any() else ""
        for begin, end, is_slow in _runs(fast.slow):
            if is_slow:
                rows += self._feed_slow(text, fast, begin, end, first_line)
            else:
                rows += self._feed_fast(text, fast, begin, end, first_line, hot_rows)
        return Block(rows, len(fast.slow), fast, text, data)

    def _feed_slow(self, text: str, fast: FastLines, begin: int, end: int, first_line: int) -> list[Row]:
        starts, ends = fast.line_starts, fast.line_ends
        return self.feed(text[starts[begin]: ends[end - 1]].split("\n"), first_line + begin)

    def _feed_fast(self, text: str, fast: FastLines, begin: int, end: int, first_line: int,
                   hot_rows: bool) -> list[Row]:
        rows: list[Row] = []
        if self._block is not None:
            # NOTE: an open multi-line record decides for itself whether the next line continues it.
            rows += self._feed_slow(text, fast, begin, begin + 1, first_line)
            fast.routed.append(begin)
            begin += 1
        lo, hi = np.searchsorted(fast.index, [begin, end])
        if lo == hi:
            return rows
        if hot_rows:
            rows += fast.rows(text, lo, hi, first_line, self.source)
        self._stamped = True
        counts = np.bincount(fast.kind[lo:hi], minlength=len(KINDS)).tolist()
        self.stats.kinds.update({kind: n for kind, n in zip(KINDS.tolist(), counts) if n})
        self.stats.lines = max(self.stats.lines, first_line + end - 1)
        return rows

    def finish(self) -> list[Row]:
        """Rows of a multi-line record left open at the end of the source."""
        rows = self._close_block() if self._block is not None else []
        self.stats.kinds.update(map(itemgetter(0), rows))
        return rows

    def _rare(self, line: str, no: int) -> Row | None:
        m = _RARE.search(line)
        if m is None:
            if "\ufffd" in line or "\x00" in line:
                self.stats.note_unread(no, line)
            else:
                self.stats.other += 1
            return None
        kind = m.lastgroup or ""
        st = self._stamp(line[: m.start()])
        if not st.dated:
            st = Stamp(self._dateless(st.time), st.rank, True)
        text = line[m.start():]
        if kind in _BLOCK_OPENERS:
            self._block = _Block(kind, no, st, [text], len(text))
            return None
        if kind == "decode" and ": " not in text:
            self.stats.note_unread(no, line)
            return None
        return (kind, no, st.time, st.rank, text, self.source)

    def _stamp(self, prefix: str) -> Stamp:
        st = read_stamp(prefix)
        if st.time is not None:
            self._stamped = True
        if len(self._stamps) >= _CACHE_LIMIT:
            self._stamps.clear()
        self._stamps[prefix] = st
        return st

    def _dateless(self, tod: float | None) -> float | None:
        if tod is None:
            return None
        if tod < self._last_tod - 43200:
            self._day += 1
        self._last_tod = tod
        return tod + self._day * 86400.0

    def _continues(self, block: _Block, line: str) -> bool:
        if self._stamped:
            looks_new = HAS_STAMP.search(line) is not None
        else:
            looks_new = _CONTINUATION.search(line) is None and line.strip() != ""
        if "Traceback" not in line and "out of memory" not in line and _RARE.search(line):
            looks_new = looks_new or not (block.kind == "leak" and "leak detected" in line)
        return not looks_new and block.add(line)

    def _close_block(self) -> list[Row]:
        block = self._block
        assert block is not None
        self._block = None
        text = "\n".join(block.parts)
        kinds = [block.kind]
        if block.kind == "exception":
            if "out of memory" in text and "happened" not in text:
                kinds.append("oom")
            if "leak detected" in text:
                kinds.append("leak")
        if block.kind == "leak" and "leak detected" not in text:
            kinds = []
            self.stats.other += 1
        return [(kind, block.line, block.stamp.time, block.stamp.rank, text, self.source) for kind in kinds]


def _runs(slow: np.ndarray) -> Iterator[tuple[int, int, bool]]:
    """(begin, end, slow) for each run of equal values in `slow`."""
    edges = np.flatnonzero(np.diff(slow.view(np.int8))) + 1
    bounds = np.concatenate(([0], edges, [len(slow)])).tolist()
    flags = slow[bounds[:-1]].tolist()
    return zip(bounds[:-1], bounds[1:], flags)


def _events(rows: list[Row]) -> Iterator[Event]:
    return map(Event._make, rows)


def row_batches(path: str | Path, source: int = 0, stats: ParseStats | None = None,
                hot: list[HotBlock] | None = None) -> Iterator[list[Row]]:
    """Row batches (one per ~4 MiB read) from a plain or gzip file, or stdin for `-`. With `hot`, the scanner's
    hot lines are not made into rows but kept there as blocks (with their decode/prefill fields read)."""
    parser = Parser(source, stats)
    with open_log(path) as stream:
        reader = LineReader(stream)
        no = 1
        for scanned in scanned_blocks(reader, read_fields=hot is not None):
            if scanned.cut:
                reader.note_cut(no)
            block = parser.feed_scanned(scanned.data, scanned.fast, no, hot_rows=hot is None)
            if hot is not None and block.fast is not None:
                hot.append(HotBlock.read(block.data, block.fast, no, source, scanned.fields))
            yield block.rows
            no += block.count
        for cut in reader.cut:
            parser.stats.note_unread(cut, f"<line longer than {reader.max_line} bytes, cut>")
        parser.stats.unread += reader.num_cut - len(reader.cut)
    yield parser.finish()


def parse_path(path: str | Path, source: int = 0, stats: ParseStats | None = None) -> Iterator[Event]:
    """Events from a plain or gzip file, or stdin for `-`, streamed."""
    for rows in row_batches(path, source, stats):
        yield from _events(rows)


def parse_lines(lines: Iterable[str], source: int = 0, stats: ParseStats | None = None) -> Iterator[Event]:
    """Events from an iterable of lines (trailing newlines are dropped), streamed in batches."""
    parser = Parser(source, stats)
    batch: list[str] = []
    no = 1
    for line in lines:
        batch.append(line.rstrip("\r\n"))
        if len(batch) >= 4096:
            yield from _events(parser.feed(batch, no))
            no += len(batch)
            batch = []
    yield from _events(parser.feed(batch, no))
    yield from _events(parser.finish())
