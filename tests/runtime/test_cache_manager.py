"""The cache manager's one release path, radix cache on and off: what a finished request leaves cached, what a
chunk boundary keeps locked, what retraction frees, and slots another request cached meanwhile."""
from __future__ import annotations

import pytest

from toolkit.runtime.memory.allocator import TokenAllocator
from toolkit.runtime.memory.req_to_token import ReqToTokenPool
from toolkit.runtime.sampling.sampling_params import SamplingParams
from toolkit.runtime.scheduler.cache_manager import CacheManager
from toolkit.runtime.scheduler.request import Req

POOL = 256
PROMPT = list(range(3, 63))  # 60 tokens


def _cache(radix: bool, page_size: int) -> CacheManager:
    return CacheManager(ReqToTokenPool(8, 128, "cpu"), TokenAllocator(POOL, page_size, "cpu"), radix_cache=radix)


def _req(rid: str) -> Req:
    return Req(rid, list(PROMPT), SamplingParams(max_new_tokens=8))


def _admit(cache: CacheManager, req: Req) -> None:
    cache.match_prefix(req)
    cache.lock_prefix(req)  # the admission rule's lock (PrefillAdder)


def _prefill(cache: CacheManager, req: Req, upto: int | None = None) -> None:
    """Slots for the request's next round, up to `upto` tokens (a chunk) or all of them."""
    if req.req_pool_idx is not None:
        req.init_next_round_input()
    if upto is not None:
        req.fill_ids = req.fill_ids[:upto]
    cache.alloc_extend([req], [len(req.prefix_indices)], [len(req.fill_ids)])


def _finish(cache: CacheManager, req: Req) -> None:
    req.output_ids.append(7)
    cache.cache_req(req, finished=True)


@pytest.mark.parametrize("page_size", [1, 16])
def test_finished_request_leaves_its_aligned_tokens_cached_and_frees_the_rest(page_size):
    cache = _cache(True, page_size)
    req = _req("a")
    _admit(cache, req)
    _prefill(cache, req)
    _finish(cache, req)
    assert cache.evictable_size() == 60 // page_size * page_size
    assert cache.available_size() + cache.evictable_size() == POOL
    assert req.req_pool_idx is None and cache.is_idle_clean()


@pytest.mark.parametrize("page_size", [1, 16])
def test_radix_cache_off_keeps_every_slot_at_a_chunk_boundary_and_frees_every_slot_on_finish(page_size):
    cache = _cache(False, page_size)
    req = _req("a")
    _admit(cache, req)
    _prefill(cache, req, upto=40)
    cache.cache_req(req, finished=False)
    assert req.prefix_indices.tolist() == cache.table.slots(req.req_pool_idx, 40).tolist()
    _prefill(cache, req)
    _finish(cache, req)
    assert (cache.available_size(), cache.evictable_size()) == (POOL, 0)
    assert cache.is_idle_clean()


@pytest.mark.parametrize("radix", [True, False])
@pytest.mark.parametrize("page_size", [1, 16])
def test_chunk_boundary_locks_the_longer_prefix_and_release_keeps_only_the_tree_share(radix, page_size):
    cache = _cache(radix, page_size)
    req = _req("a")
    _admit(cache, req)
    _prefill(cache, req, upto=40)
    cache.cache_req(req, finished=False)
    cached = 40 // page_size * page_size if radix else 0
    assert (cache.protected_size(), cache.evictable_size()) == (cached, 0)
    _prefill(cache, req)
    cache.release(req)  # retracted (or aborted) before finishing
    assert (cache.protected_size(), cache.evictable_size()) == (0, cached)
    assert cache.available_size() + cache.evictable_size() == POOL
    assert cache.is_idle_clean()


def test_a_chunk_boundary_adopts_the_slots_another_request_cached_meanwhile():
    cache = _cache(True, 16)
    chunked, other = _req("chunked"), _req("other")
    _admit(cache, chunked)
    _prefill(cache, chunked, upto=40)
    cache.cache_req(chunked, finished=False)  # the tree holds tokens 0..31; 32..39 are the request's own
    _admit(cache, other)
    _prefill(cache, other)
    _finish(cache, other)  # the tree now holds 0..47, 32..47 in the other request's slots
    _prefill(cache, chunked, upto=56)
    cache.cache_req(chunked, finished=False)
    tree_slots = cache.tree.match_prefix(PROMPT[:48]).indices
    assert cache.table.slots(chunked.req_pool_idx, 48).tolist() == tree_slots.tolist()
    assert chunked.prefix_indices[:48].tolist() == tree_slots.tolist()
    _prefill(cache, chunked)
    _finish(cache, chunked)
    assert cache.available_size() + cache.evictable_size() == POOL
    assert cache.is_idle_clean()
