"""The prefix-cache interface (match, lock, insert, evict, size, integrity), shared by the radix cache and the
no-op cache used with --disable-radix-cache (an empty tree that stays empty)."""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, NamedTuple

import torch


class MatchResult(NamedTuple):
    indices: torch.Tensor  # KV slots of the matched prefix
    last_node: Any  # lock handle for the matched prefix


class InsertResult(NamedTuple):
    already_cached: int  # leading tokens the cache held before (the caller's copies of them are duplicates)
    indices: torch.Tensor  # the cache's KV slots for the whole (page-aligned) key, now resident
    last_node: Any  # lock handle for the key: what `match_prefix(key)` returns right after the insert


class PrefixCache(ABC):
    @abstractmethod
    def match_prefix(self, key: list[int]) -> MatchResult:
        """Longest cached prefix of `key` (page-aligned)."""

    @abstractmethod
    def insert(self, key: list[int], value: torch.Tensor) -> InsertResult:
        """Cache `value` slots for tokens `key` (page-aligned); returns how many leading tokens were cached
        already, and the key's match as it now stands (no second lookup needed)."""

    @abstractmethod
    def cached_len(self, node: Any) -> int:
        """Tokens of the prefix ending at lock handle `node` (a match's `last_node`) that the cache holds."""

    @abstractmethod
    def inc_lock_ref(self, node: Any) -> None:
        """Protect the prefix ending at `node` from eviction."""

    @abstractmethod
    def dec_lock_ref(self, node: Any) -> None: ...

    @abstractmethod
    def evict(self, num_tokens: int) -> int:
        """Free at least `num_tokens` unreferenced cached tokens, least recently used first; returns freed."""

    @abstractmethod
    def evictable_size(self) -> int: ...

    @abstractmethod
    def protected_size(self) -> int: ...

    @abstractmethod
    def reset(self) -> None: ...

    @abstractmethod
    def check_integrity(self) -> None:
        """Raise AssertionError if the tree's size bookkeeping disagrees with its contents."""
