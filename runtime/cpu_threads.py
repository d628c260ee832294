"""How many CPU threads each kind of step uses.

Decode steps are memory-bound (weights and KV read once per step): extra threads add little, and every op's
OpenMP barrier stalls for a whole scheduler time slice whenever another process (the HTTP front end, a bench
client) holds one of the cores — on 2 cores that made decode 15x slower. Prefill is compute-bound and scales,
so it keeps every core. TOOLKIT_CPU_DECODE_THREADS overrides the decode count.
"""
from __future__ import annotations

import os

import torch


def decode_threads(cores: int) -> int:
    configured = os.environ.get("TOOLKIT_CPU_DECODE_THREADS")
    if configured:
        return max(1, int(configured))
    return max(1, cores // 2)


class CpuThreadPolicy:
    def __init__(self) -> None:
        self.prefill = torch.get_num_threads()
        self.decode = min(self.prefill, decode_threads(self.prefill))

    def apply(self, is_decode: bool) -> None:
        wanted = self.decode if is_decode else self.prefill
        if torch.get_num_threads() != wanted:
            torch.set_num_threads(wanted)
