"""Whether the next waiting request fits in the KV pool: the pool's capacity against the demand the lines show.

"Usage below 0.9" is not "memory has room" when the next request needs more than what is left: a KV cache of
1,024 tokens holding two requests of ~440 tokens each is 86 % used and admits no third one. So a load line with
requests waiting is judged by a model of the pool, not by a usage threshold:

- the pool's size `P` in tokens is the log's (SGLang `max_total_num_tokens`, vLLM's `KV cache size: N tokens`);
- a running request holds `held = u P / r` tokens (`u` the line's usage, `r` its running requests; SGLang's decode
  line prints the tokens themselves, `#token`, which is used where present);
- what is left is `left = (1 - u) P`: the next request, whose size the running ones stand for, fits when
  `left >= held` (a new request needs its prompt and room to decode: on average what a running one holds).

Without the pool's size the usage alone decides (`FULL_USAGE`). With nothing running there is no size to go by:
room, unless the usage says full.
"""
from __future__ import annotations

import numpy as np

from toolkit.diagnose.read.series import Rows

FULL_USAGE = 0.9  # at or above this share used, the pool is full whatever the requests' size


def held_tokens(rows: Rows, pool: int | None) -> np.ndarray:
    """Per line, the tokens one running request holds (NaN where no request runs or the pool's size is unknown)."""
    running = np.where(rows["running_req"] > 0, rows["running_req"], np.nan)
    if "token" in rows and not np.isnan(rows["token"]).all():
        tokens = rows["token"]
        if pool:
            tokens = np.where(np.isnan(tokens), rows["usage"] * pool, tokens)
        return tokens / running
    return rows["usage"] * pool / running if pool else np.full(len(rows), np.nan)


def no_room(rows: Rows, pool: int | None) -> np.ndarray:
    """Per line: the pool cannot take one more request of the running ones' size (or is at least FULL_USAGE used)."""
    usage = rows["usage"]
    full = usage >= FULL_USAGE
    if not pool:
        return full
    left = (1.0 - usage) * pool
    held = held_tokens(rows, pool)
    return full | (left < np.nan_to_num(held, nan=0.0))


def has_room(rows: Rows, pool: int | None) -> np.ndarray:
    """Per line: the next request of the running ones' size fits (the usage is known and the pool not full)."""
    return ~no_room(rows, pool) & ~np.isnan(rows["usage"])


def requests_held(pool: int, held: float) -> int:
    """How many requests of `held` tokens the pool holds at once."""
    return int(pool // held) if held > 0 else 0
