"""The order in which waiting requests are considered for admission (`--schedule-policy`)."""
from __future__ import annotations

import random

import torch

from toolkit.runtime.memory.radix_cache import RadixCache
from toolkit.runtime.scheduler.cache_manager import CacheManager
from toolkit.runtime.scheduler.request import Req

LPM_FALLBACK_QUEUE_LEN = 128  # above this many waiting requests, lpm costs more than it saves: use fcfs
IN_BATCH_PREFIX_CHECK_THRESHOLD = 32  # requests with a shorter cached prefix are checked against each other
IN_BATCH_PREFIX_DEPRIORITIZE_THRESHOLD = 32  # ...and wait if another waiting request shares this much


class SchedulePolicy:
    def __init__(self, policy: str, cache: CacheManager, seed: int = 0) -> None:
        if not cache.shares_prefixes and policy in ("lpm", "dfs-weight"):
            policy = "fcfs"  # prefix-aware orders need the radix cache
        self.policy = policy
        self.cache = cache
        self._random = random.Random(seed)

    def active_policy(self, waiting: list[Req]) -> str:
        if self.policy == "lpm" and len(waiting) > LPM_FALLBACK_QUEUE_LEN:
            return "fcfs"
        return self.policy

    def sort(self, waiting: list[Req]) -> bool:
        """Reorder `waiting` in place; returns True when prefixes were matched (no need to match again)."""
        policy = self.active_policy(waiting)
        if policy == "lof":
            waiting.sort(key=lambda r: -r.sampling_params.max_new_tokens)
        elif policy == "random":
            self._random.shuffle(waiting)
        elif policy in ("lpm", "dfs-weight"):
            deprioritized = self._match_prefixes(waiting)
            if policy == "lpm":
                waiting.sort(key=lambda r: float("inf") if r.rid in deprioritized else -len(r.prefix_indices))
            else:
                waiting[:] = self.cache.dfs_weight_order(waiting)
            return True
        return False

    def _match_prefixes(self, waiting: list[Req]) -> set[str]:
        """Match every waiting request against the cache; of requests with little cached prefix that share a
        long prefix with an earlier waiting request, only the first goes ahead (the rest reuse its KV later)."""
        # NOTE: a scratch tree of the waiting requests' own prefixes, not the KV cache's.
        in_batch = RadixCache(free_slots=lambda _: None)
        deprioritized: set[str] = set()
        for req in waiting:
            self.cache.match_prefix(req)
            if len(req.prefix_indices) > IN_BATCH_PREFIX_CHECK_THRESHOLD:
                continue
            prefix_ids = req.max_prefix_ids()
            shared = len(in_batch.match_prefix(prefix_ids).indices)
            if shared >= IN_BATCH_PREFIX_DEPRIORITIZE_THRESHOLD:
                deprioritized.add(req.rid)
            else:
                in_batch.insert(prefix_ids, torch.empty(len(prefix_ids), dtype=torch.int64))
        return deprioritized
