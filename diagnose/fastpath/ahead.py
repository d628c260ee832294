"""Chunks scanned ahead on worker threads while the caller consumes earlier ones.

The scanner is numpy over whole chunks and releases the GIL for most of its work, so a second core scans the
next chunks while the caller reads this one's slow lines. Chunks come out in file order, and at most
`workers + 1` are in memory at once.
"""
from __future__ import annotations

import os
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor

from toolkit.diagnose.fastpath.scan import ScannedChunk, scan_chunk
from toolkit.diagnose.source import Chunk

WORKERS = min(2, os.cpu_count() or 1)


def scanned_chunks(chunks: Iterable[Chunk], workers: int = WORKERS) -> Iterator[tuple[Chunk, ScannedChunk]]:
    """Each chunk with its scan, in order; a cut line's chunk is not scanned (it is one unread line)."""
    with ThreadPoolExecutor(workers, thread_name_prefix="diagnose-scan") as pool:
        ahead: deque[tuple[Chunk, Future[ScannedChunk]]] = deque()
        for chunk in chunks:
            ahead.append((chunk, pool.submit(scan_chunk, chunk.data, chunk.size)))
            if len(ahead) > workers:
                done, future = ahead.popleft()
                yield done, future.result()
        while ahead:
            done, future = ahead.popleft()
            yield done, future.result()
