"""How many tokens of context vLLM's KV cache holds, from its start-up error (docs/log-formats.md §9.5):

- `The model's max seq len (N) is larger than the maximum number of tokens that can be stored in KV cache (M)`
  (V0): M, rounded down to `STEP` tokens;
- `To serve at least one request with the model's max seq len (N), (X GiB KV cache is needed, which is larger
  than the available KV cache memory (Y GiB). Based on the available memory, the estimated maximum model length
  is E.` (V1): E as vLLM estimates it; without the estimate (0.8), N x Y / X rounded down.
"""
from __future__ import annotations

import re
from typing import NamedTuple

STEP = 256
_ASKED = re.compile(r"max seq len \((\d{1,12})\)")
_STORED = re.compile(r"stored in KV cache \((\d{1,12})\)")
_NEEDED = re.compile(r"\(([\d.]{1,20}) GiB KV cache is needed, which is larger than the available KV cache memory "
                     r"\(([\d.]{1,20}) GiB\)")
_ESTIMATE = re.compile(r"estimated maximum model length is (\d{1,12})")


class KvFit(NamedTuple):
    asked: int  # the max seq len the engine was started with
    fits: int  # the longest context the KV cache holds
    how: str  # where `fits` comes from, in words


def rounded_down(tokens: int) -> int:
    return tokens // STEP * STEP if tokens >= STEP else tokens


def prints_sizes(text: str) -> bool:
    """Whether such an error's text holds the sizes that say what fits (read or not)."""
    return any(p.search(text) for p in (_ESTIMATE, _STORED, _NEEDED_START))


_NEEDED_START = re.compile(r"GiB KV cache is needed")


def refused_length(text: str) -> int | None:
    """The max seq len such an error names, also where the excerpt cut it before its sizes."""
    asked = _ASKED.search(text)
    return int(asked.group(1)) if asked is not None else None


def kv_fit(text: str) -> KvFit | None:
    """The max seq len asked for and the context that fits, None when the text is not such an error."""
    n = refused_length(text)
    if n is None:
        return None
    if (m := _ESTIMATE.search(text)) is not None:
        return KvFit(n, int(m.group(1)), "estimates")
    if (m := _STORED.search(text)) is not None:
        return KvFit(n, rounded_down(int(m.group(1))), f"the KV cache stores {m.group(1)} tokens")
    m = _NEEDED.search(text)
    if m is None or float(m.group(1)) <= 0:
        return None
    needed, available = float(m.group(1)), float(m.group(2))
    return KvFit(n, rounded_down(int(n * available / needed)), f"{available:g} of the {needed:g} GiB it needs are free")
