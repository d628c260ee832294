"""How many CPU threads each kind of step uses.

Prefill is compute-bound and keeps every core. Decode is memory-bound: a second thread gains ~15-20% on an
idle 2-core machine, but each op's OpenMP barrier then stalls for a whole scheduler time slice whenever another
process holds a core (on 2 cores that made decode steps 3x slower). The offline Engine owns the machine and
decodes on every core; the server's scheduler shares it with the HTTP front end (and usually the client), so it
decodes on all but one. TOOLKIT_CPU_DECODE_THREADS overrides both.
"""
from __future__ import annotations

import os

import torch

from toolkit.runtime.host_memory import keep_freed_memory


def decode_threads(cores: int, shares_cores: bool) -> int:
    configured = os.environ.get("TOOLKIT_CPU_DECODE_THREADS")
    if configured:
        return max(1, int(configured))
    return max(1, cores - 1) if shares_cores else cores


class CpuThreadPolicy:
    """Applied by a CPU model runner: its threads per kind of step, and a heap that keeps freed blocks
    (`host_memory`), so the same tensors every step do not fault their pages in again."""

    def __init__(self, shares_cores: bool = False) -> None:
        keep_freed_memory()
        self.prefill = torch.get_num_threads()
        self.decode = min(self.prefill, decode_threads(self.prefill, shares_cores))

    def apply(self, is_decode: bool) -> None:
        wanted = self.decode if is_decode else self.prefill
        if torch.get_num_threads() != wanted:
            torch.set_num_threads(wanted)
