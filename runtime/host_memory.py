"""Keep freed large blocks in the process heap instead of returning them to the OS (glibc's mallopt).

A decode step allocates tensors of the same sizes every time (logits alone: batch x vocab floats, 50 MB at batch
256). With glibc's defaults every block above the mmap threshold is a fresh mapping, unmapped when freed, so its
pages fault in again on the next step: ~12,000 minor faults per step at batch 256, about 40% of the step's CPU
time on a small model. Raising the mmap and trim thresholds makes those blocks come back from the heap (what
jemalloc or tcmalloc, which vLLM-CPU preloads, do by design). The heap then keeps its peak size. `toolkit diagnose`
applies it too: every chunk it scans allocates arrays of the same sizes.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
from collections.abc import Callable

logger = logging.getLogger("runtime")
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
KEEP_BYTES = 1 << 30  # blocks below this come from (and return to) the heap


@functools.lru_cache(maxsize=1)
def keep_freed_memory() -> bool:
    """Apply the thresholds once per process; False where the C library is not glibc."""
    mallopt = _mallopt()
    if mallopt is None:
        return False
    applied = bool(mallopt(M_MMAP_THRESHOLD, KEEP_BYTES)) and bool(mallopt(M_TRIM_THRESHOLD, KEEP_BYTES))
    logger.debug(f"heap keeps freed blocks below {KEEP_BYTES >> 20} MiB: {applied}")
    return applied


def _mallopt() -> Callable[[int, int], int] | None:
    """The C library's `mallopt`, looked up among the symbols the process has loaded (`find_library` runs
    `ldconfig`, ~30 ms: `toolkit diagnose` calls this before it starts reading), else in the library found."""
    try:
        return ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        pass
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt
    except (OSError, AttributeError):
        return None
