"""Radix prefix cache: match, insert, split, lock/unlock sizes, LRU eviction of unreferenced leaves."""
from __future__ import annotations

import time

import pytest
import torch

from toolkit.runtime.memory.radix_cache import RadixCache


def _slots(start: int, n: int) -> torch.Tensor:
    return torch.arange(start, start + n, dtype=torch.int64)


class _Freed:
    def __init__(self) -> None:
        self.slots: list[int] = []

    def __call__(self, slots: torch.Tensor) -> None:
        self.slots.extend(slots.tolist())


def test_match_returns_longest_cached_prefix_and_splits_nodes():
    cache = RadixCache(_Freed())
    assert cache.insert([1, 2, 3, 4, 5], _slots(10, 5)).already_cached == 0
    assert cache.insert([1, 2, 3, 9], _slots(20, 4)).already_cached == 3  # its copies of the 3 are duplicates
    match = cache.match_prefix([1, 2, 3, 4, 7, 7])
    assert match.indices.tolist() == [10, 11, 12, 13]
    assert cache.match_prefix([1, 2, 3, 9]).indices.tolist() == [10, 11, 12, 23]
    assert cache.match_prefix([5, 1]).indices.tolist() == []
    assert cache.evictable_size() == 6 and cache.total_size() == 6
    cache.check_integrity()


@pytest.mark.parametrize("page_size", [1, 2])
def test_insert_returns_what_a_match_of_its_key_would(page_size):
    cache = RadixCache(_Freed(), page_size)
    cache.insert([1, 2, 3, 4, 5, 6], _slots(10, 6))
    for key, value in (([1, 2, 3, 4], _slots(30, 4)), ([1, 2, 7, 8, 9], _slots(40, 5)), ([4, 4], _slots(50, 2))):
        inserted = cache.insert(key, value)
        match = cache.match_prefix(key)
        assert inserted.indices.tolist() == match.indices.tolist() and inserted.last_node is match.last_node
    cache.check_integrity()


def test_dfs_weight_order_visits_heavier_subtrees_first():
    cache = RadixCache(_Freed())
    cache.insert([1, 2], _slots(0, 2))
    cache.insert([5, 6], _slots(10, 2))
    light, heavy = cache.match_prefix([1, 2, 0]).last_node, cache.match_prefix([5, 6, 0]).last_node
    assert cache.dfs_weight_order([light, None, heavy, heavy]) == [1, 2, 3, 0]


def test_lock_moves_tokens_from_evictable_to_protected_along_the_path():
    cache = RadixCache(_Freed())
    cache.insert([1, 2, 3, 4], _slots(0, 4))
    cache.insert([1, 2, 7, 8, 9], _slots(10, 5))
    node = cache.match_prefix([1, 2, 7, 8, 9, 0]).last_node
    cache.inc_lock_ref(node)
    assert (cache.evictable_size(), cache.protected_size()) == (2, 5)
    cache.inc_lock_ref(node)
    cache.dec_lock_ref(node)
    assert (cache.evictable_size(), cache.protected_size()) == (2, 5)
    cache.dec_lock_ref(node)
    assert (cache.evictable_size(), cache.protected_size()) == (7, 0)
    cache.check_integrity()


def test_evict_frees_least_recently_used_unlocked_leaves_first():
    freed = _Freed()
    cache = RadixCache(freed)
    cache.insert([1, 1, 1], _slots(0, 3))
    time.sleep(0.002)
    cache.insert([2, 2], _slots(10, 2))
    time.sleep(0.002)
    cache.insert([3, 3, 3, 3], _slots(20, 4))
    locked = cache.match_prefix([3, 3, 3, 3, 0]).last_node
    cache.inc_lock_ref(locked)
    assert cache.evict(4) == 5  # [1,1,1] then [2,2]; the locked [3,3,3,3] stays
    assert freed.slots == [0, 1, 2, 10, 11]
    assert cache.evict(100) == 0
    cache.dec_lock_ref(locked)
    assert cache.evict(1) == 4 and cache.total_size() == 0
    cache.check_integrity()


def test_evicting_a_leaf_can_expose_its_parent():
    freed = _Freed()
    cache = RadixCache(freed)
    cache.insert([1, 2, 3], _slots(0, 3))
    cache.insert([1, 2, 3, 4, 5], _slots(0, 5))
    assert cache.evict(3) == 5  # the leaf [4,5] first, then its now-childless parent [1,2,3]
    assert sorted(freed.slots) == [0, 1, 2, 3, 4]


def test_page_aligned_keys_with_page_size_4():
    cache = RadixCache(_Freed(), page_size=4)
    assert cache.insert(list(range(10)), _slots(100, 10)).already_cached == 0  # only 8 tokens (2 pages) are kept
    assert cache.total_size() == 8
    match = cache.match_prefix([0, 1, 2, 3, 4, 5, 9, 9, 9])
    assert match.indices.tolist() == [100, 101, 102, 103]  # a page matches only if all its tokens match
    cache.insert([0, 1, 2, 3, 8, 8, 8, 8], _slots(200, 8))
    assert cache.total_size() == 12
    cache.check_integrity()


def test_integrity_check_catches_corrupt_bookkeeping():
    cache = RadixCache(_Freed())
    cache.insert([1, 2], _slots(0, 2))
    cache._evictable += 1
    try:
        cache.check_integrity()
    except AssertionError as error:
        assert "evictable_size" in str(error)
    else:
        raise AssertionError("corrupt sizes were not detected")
