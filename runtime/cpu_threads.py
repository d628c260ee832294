"""How many CPU threads each kind of step uses.

Every step runs on every core by default, the server's included. The front end and a bench client need little
CPU (measured: ~1.5% and ~1% of a core while 64 streams decode), and OpenMP's default wait policy (spin a while,
then sleep) hands a core back to them quickly. What did stall each op's barrier was a thread of our own beside
the forward (overlap scheduling: off by default on a CPU, see launch.py) and the passive wait policy (a futex
wake-up per op). Side by side on 2 cores (benchmarks/results/vs_vllm_cpu.json), decoding on 2 threads instead
of 1 served 64 x 256/128 requests ~1.4x faster. TOOLKIT_CPU_DECODE_THREADS sets the decode thread count.
"""
from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch

from toolkit.runtime.host_memory import keep_freed_memory


def decode_threads(cores: int) -> int:
    configured = os.environ.get("TOOLKIT_CPU_DECODE_THREADS")
    return max(1, int(configured)) if configured else cores


class CpuThreadPolicy:
    """Applied by a CPU model runner: its threads per kind of step, and a heap that keeps freed blocks
    (`host_memory`), so the same tensors every step do not fault their pages in again."""

    def __init__(self) -> None:
        keep_freed_memory()
        self.prefill = torch.get_num_threads()
        self.decode = min(self.prefill, decode_threads(self.prefill))

    def apply(self, is_decode: bool) -> None:
        wanted = self.decode if is_decode else self.prefill
        if torch.get_num_threads() != wanted:
            torch.set_num_threads(wanted)


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """Run a stretch of many small ops (a GGUF's dequantization: ~2,000 elementwise ops on tensors of a few MB)
    on one thread. Each op's fork and join waits for every thread to be scheduled: with another busy process on
    the host, the embedded model's dequantization took 12-14 s on 2 threads against 0.8 s on one (1.5 s on 2
    threads on an idle host)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
