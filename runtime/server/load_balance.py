"""Which DP replica takes a new request (`--load-balance-method`, SGLang's names):

- `round_robin`: the replicas in turn;
- `shortest_queue`: the one with the fewest open requests (sent and not finished);
- `minimum_tokens`: the one whose open requests hold the fewest tokens (prompt + max_new_tokens each).

Ties go to the first replica after the last one chosen, so a burst spreads over equally loaded replicas.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass
class ReplicaLoad:
    open_requests: int = 0
    open_tokens: int = 0


class LoadBalancer:
    def __init__(self, method: str, replicas: int) -> None:
        self.method = method
        self.replicas = replicas
        self._last = replicas - 1

    def choose(self, loads: Sequence[ReplicaLoad]) -> int:
        order = [(self._last + 1 + i) % self.replicas for i in range(self.replicas)]
        if self.method == "shortest_queue":
            chosen = min(order, key=lambda d: loads[d].open_requests)
        elif self.method == "minimum_tokens":
            chosen = min(order, key=lambda d: loads[d].open_tokens)
        else:
            chosen = order[0]
        self._last = chosen
        return chosen
