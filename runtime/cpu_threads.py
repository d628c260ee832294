"""How many CPU threads each kind of step uses.

Every step runs on every core by default, the server's included. The front end and a bench client need little
CPU (measured: ~1.5% and ~1% of a core while 64 streams decode), and OpenMP's default wait policy (spin a while,
then sleep) hands a core back to them quickly. What did stall each op's barrier was a thread of our own beside
the forward (overlap scheduling: off by default on a CPU, see launch.py) and the passive wait policy (a futex
wake-up per op). Side by side on 2 cores (benchmarks/results/vs_vllm_cpu.json), decoding on 2 threads instead
of 1 served 64 x 256/128 requests ~1.4x faster. TOOLKIT_CPU_DECODE_THREADS sets the decode thread count.
"""
from __future__ import annotations

import os

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
