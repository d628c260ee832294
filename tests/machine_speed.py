"""How much slower this machine is, at this moment, than the one the suite's wall-clock limits were set on.

A limit such as "tune finishes within 400 s" or "SIGTERM ends the server within 15 s" was set on a quiet 2-core
Xeon; a slower CPU (an AVX2 EPYC: no AMX, no bf16 GEMM) or a second test beside it would turn it into a failure
that says nothing about the code. `scaled(seconds)` stretches such a limit by the factor a short probe of the work
those limits are about (float32 GEMMs the size of the embedded model's layers, and interpreted Python) measures
against that machine's time; it never shrinks one."""
from __future__ import annotations

import functools
import statistics
import time

import torch

# NOTE: the probe's median on the reference machine: Intel Xeon (family 6 model 207, AVX-512 + AMX), 2 cores, idle,
# torch 2.13.0+cpu, 2026-12-02: medians 0.041-0.044 s over three runs of 7. The same machine capped at AVX2
# (ONEDNN_MAX_CPU_ISA, MKL_ENABLE_INSTRUCTIONS, ATEN_CPU_CAPABILITY) measures 1.2x this, beside one busy process 1.7x.
REFERENCE_PROBE_S = 0.042
PROBE_REPEATS = 5


def _probe_once(x: torch.Tensor, w: torch.Tensor) -> float:
    start = time.perf_counter()
    for _ in range(32):
        torch.mm(x, w)
    total = 0
    for i in range(400_000):
        total += i * i % 7
    return time.perf_counter() - start


@functools.cache
def factor() -> float:
    """This machine's time for the probe over the reference machine's, at least 1 (measured once a process)."""
    generator = torch.Generator().manual_seed(0)
    x, w = torch.randn(64, 576, generator=generator), torch.randn(576, 1536, generator=generator)
    times = [_probe_once(x, w) for _ in range(PROBE_REPEATS)]
    return max(1.0, statistics.median(times) / REFERENCE_PROBE_S)


def scaled(seconds: float) -> float:
    """A wall-clock limit set on the reference machine, for this one."""
    return seconds * factor()
