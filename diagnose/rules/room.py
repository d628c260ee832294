"""Whether the next waiting request fits in the KV pool: the pool's capacity against the requests' size.

"Usage below 0.9" is not "memory has room" when the next request needs more than what is left: a KV cache of
1,024 tokens holding two requests of ~440 tokens each is 86 % used and takes no third one. So a load line with
requests waiting is judged by a model of the pool, not by a usage threshold:

- the pool's size `P` in tokens is the log's (SGLang `max_total_num_tokens`, vLLM's `KV cache size: N tokens`);
- on each line a running request holds `t / r` tokens (SGLang's decode line prints the tokens `#token`; else
  `u P`, the usage of the pool), `r` the running requests;
- a request's size `S` is what requests grow to in this log: the largest of those per-line shares (a line averages
  requests at every stage of their output, so its share is below their final size; the largest is a line of a few
  requests near their end);
- the pool holds `P // S` requests of that size at once. A line has no room for the next request when it already
  runs that many (SGLang's admission reserves each running request's remaining output; vLLM admits the prompt and
  then preempts when decode outgrows the cache: either way the pool binds), or when its usage is `FULL_USAGE` or
  more whatever the size.

Without the pool's size, or with no request running anywhere, the usage alone decides.
"""
from __future__ import annotations

import numpy as np

from toolkit.diagnose.read.series import Rows

FULL_USAGE = 0.9  # at or above this share used, the pool is full whatever the requests' size


def held_tokens(rows: Rows, pool: int | None) -> np.ndarray:
    """Per line, the tokens one running request holds (NaN where none runs or neither tokens nor pool are known)."""
    running = np.where(rows["running_req"] > 0, rows["running_req"], np.nan)
    tokens = rows["token"] if "token" in rows else np.full(len(rows), np.nan)
    if pool:
        tokens = np.where(np.isnan(tokens), rows["usage"] * pool, tokens)
    return tokens / running


def request_size(rows: Rows, pool: int | None) -> float | None:
    """The tokens a request of this log grows to (None where no line tells)."""
    held = held_tokens(rows, pool)
    held = held[np.isfinite(held) & (held > 0)]
    return float(held.max()) if len(held) else None


def requests_held(pool: int, size: float) -> int:
    """How many requests of `size` tokens the pool holds at once."""
    return int(pool // size) if size > 0 else 0


def no_room(rows: Rows, pool: int | None, size: float | None = None) -> np.ndarray:
    """Per line: the pool takes no further request of the log's size (or is at least FULL_USAGE used). `size`:
    the requests' size when the caller knows it from more lines than `rows` (default: `rows`' own)."""
    full = rows["usage"] >= FULL_USAGE
    size = size if size is not None else request_size(rows, pool)
    if not pool or size is None:
        return full
    return full | (rows["running_req"] >= max(1, requests_held(pool, size)))


def has_room(rows: Rows, pool: int | None, size: float | None = None) -> np.ndarray:
    """Per line: the next request of the log's size fits (the usage is known and the pool not bound)."""
    return ~no_room(rows, pool, size) & ~np.isnan(rows["usage"])


def waiting_at_full(rows: Rows, pool: int | None, size: float | None = None) -> np.ndarray:
    """Per line: requests wait and the pool has no room for the next one (`no_room`): the pool held them back."""
    return (rows["queue_req"] > 0) & no_room(rows, pool, size)

