"""Which running requests a decode step retracts when the KV pool is full (SGLang's `retract_decode`,
docs/scheduling.md §3); the ratio it leaves behind is `NewTokenRatio.set_after_retraction`."""
from __future__ import annotations

from collections.abc import Callable

from toolkit.runtime.scheduler.request import Req

RETRACT_DECODE_STEPS = 20


def retraction_order(reqs: list[Req]) -> list[int]:
    """Indices sorted so that popping from the end yields the next victim: fewest generated tokens first,
    ties to the longest prompt."""
    order = list(range(len(reqs)))
    order.sort(key=lambda i: (len(reqs[i].output_ids), -len(reqs[i].origin_input_ids)), reverse=True)
    return order


def choose_victims(
    reqs: list[Req], available: Callable[[], int], release: Callable[[Req, int], None]
) -> tuple[list[int], list[int]]:
    """Retract until the pool can hold RETRACT_DECODE_STEPS more tokens for every remaining request; at least
    one request is retracted and the last one never is. Returns (kept indices, retracted indices)."""
    order = retraction_order(reqs)
    retracted: list[int] = []
    while available() < RETRACT_DECODE_STEPS * len(order) or not retracted:
        if len(order) == 1:
            break
        victim = order.pop()
        retracted.append(victim)
        release(reqs[victim], len(order))
    return order, retracted
