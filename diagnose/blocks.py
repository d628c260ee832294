"""Raw blocks of a log, scanned ahead of the parser on worker threads.

The block scanner and the batch-field reader are numpy over whole blocks and release the GIL for much of
their work, so a second core scans (and reads the decode/prefill fields of) the next blocks while the parser
consumes this one. Blocks come out in file order, and at most `workers + 1` are in memory at once.
"""
from __future__ import annotations

import os
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from toolkit.diagnose.columns import BatchFields, batch_fields
from toolkit.diagnose.reader import LineReader
from toolkit.diagnose.scan import FastLines, scan

WORKERS = min(2, os.cpu_count() or 1)


@dataclass(frozen=True, slots=True)
class ScannedBlock:
    """A raw block (see `LineReader.raw_blocks`), the scanner's hot lines (None: the block needs the per-line
    path), and with `read_fields` the decode/prefill fields of those lines (`columns.batch_fields`)."""

    data: bytes
    cut: bool
    fast: FastLines | None
    fields: BatchFields | None


def _scan(data: bytes, cut: bool, read_fields: bool) -> ScannedBlock:
    fast = scan(data)
    fields = batch_fields(fast) if read_fields and fast is not None else None
    return ScannedBlock(data, cut, fast, fields)


def scanned_blocks(reader: LineReader, read_fields: bool, workers: int = WORKERS) -> Iterator[ScannedBlock]:
    """The reader's raw blocks in order, each scanned on a worker thread while earlier ones are consumed."""
    with ThreadPoolExecutor(workers, thread_name_prefix="diagnose-scan") as pool:
        ahead: deque[Future[ScannedBlock]] = deque()
        for data, cut in reader.raw_blocks():
            ahead.append(pool.submit(_scan, data, cut, read_fields))
            if len(ahead) > workers:
                yield ahead.popleft().result()
        while ahead:
            yield ahead.popleft().result()
