"""How many tokens of context vLLM's KV cache holds, from its start-up refusal (docs/log-formats.md §9.5; its sizes
read by `diagnose.read.errors`):

- `The model's max seq len (N) is larger than the maximum number of tokens that can be stored in KV cache (M)`
  (V0): M, rounded down to `STEP` tokens;
- `To serve at least one request with the model's max seq len (N), (X GiB KV cache is needed, which is larger
  than the available KV cache memory (Y GiB). Based on the available memory, the estimated maximum model length
  is E.` (V1): E as vLLM estimates it; without the estimate (0.8), N x Y / X rounded down.
"""
from __future__ import annotations

from typing import NamedTuple

from toolkit.diagnose.read.errors import Refusal

STEP = 256


class KvFit(NamedTuple):
    asked: int  # the max seq len the engine was started with
    fits: int  # the longest context the KV cache holds
    how: str  # where `fits` comes from, in words


def rounded_down(tokens: int) -> int:
    return tokens // STEP * STEP if tokens >= STEP else tokens


def kv_fit(refusal: Refusal | None) -> KvFit | None:
    """The max seq len asked for and the context that fits, None where no refusal says it."""
    if refusal is None:
        return None
    n = refusal.asked
    if refusal.estimated is not None:
        return KvFit(n, refusal.estimated, "estimates")
    if refusal.stored is not None:
        return KvFit(n, rounded_down(refusal.stored), f"the KV cache stores {refusal.stored} tokens")
    needed, available = refusal.needed_gib, refusal.available_gib
    if needed is None or available is None or needed <= 0:
        return None
    return KvFit(n, rounded_down(int(n * available / needed)), f"{available:g} of the {needed:g} GiB it needs are free")
