"""The one owner of the scheduler's KV bookkeeping (mini-sglang's `CacheManager`): table rows, slot allocation,
the prefix tree's match / lock / insert / evict, and the single path by which a request gives its KV back.

A request's table row, from admission until it finishes, is retracted or is aborted:

    [0, tree_len)              slots the prefix tree owns, locked by `req.last_node`
                               (tree_len = tree.cached_len(req.last_node): 0 with the radix cache off)
    [tree_len, kv_allocated)   slots allocated for this request alone (`kv_allocated`: every launched step counted)

`cache_req` inserts the page-aligned resident tokens into the tree. Of the request's own slots, those the tree
already held (another request inserted the same tokens meanwhile) are duplicates and freed at once; on finish the
rest the tree did not take is freed and the lock dropped, on a chunk boundary it is kept and the lock moves to the
new, longer prefix. `release` (retraction, abort) frees every slot of the request's own, keeping the tree's share.
With --disable-radix-cache the tree is empty and stays empty (`NoPrefixCache`), so the same code frees everything
on finish and keeps everything on a chunk boundary.
"""
from __future__ import annotations

import logging

import torch

from toolkit.runtime.memory.allocator import TokenAllocator
from toolkit.runtime.memory.prefix_cache import PrefixCache
from toolkit.runtime.memory.radix_cache import NoPrefixCache, RadixCache
from toolkit.runtime.memory.req_to_token import ReqToTokenPool
from toolkit.runtime.scheduler.request import Req

logger = logging.getLogger("runtime")


class KVOutOfMemoryError(RuntimeError):
    """SGLang's hard OOM: the admission budget should have prevented it."""


class CacheManager:
    def __init__(self, table: ReqToTokenPool, allocator: TokenAllocator, radix_cache: bool) -> None:
        self.table = table
        self.allocator = allocator
        self.page_size = allocator.page_size
        self.pool_size = allocator.size
        device = table.req_to_token.device
        self.tree: PrefixCache = (
            RadixCache(allocator.free, self.page_size, device) if radix_cache else NoPrefixCache(device)
        )

    @property
    def req_to_token(self) -> torch.Tensor:
        """The table the attention backends read: row r lists request r's slots in order."""
        return self.table.req_to_token

    # ---- admission ----
    @property
    def shares_prefixes(self) -> bool:
        """Whether requests share cached prefixes (the radix cache is on)."""
        return isinstance(self.tree, RadixCache)

    def match_prefix(self, req: Req) -> None:
        """The tokens the request makes resident this round, and the longest cached prefix of them."""
        req.init_next_round_input(self.tree.match_prefix(req.max_prefix_ids()))

    def lock_prefix(self, req: Req) -> None:
        """Protect the request's matched prefix from eviction (admission holds it until the request releases)."""
        self.tree.inc_lock_ref(req.last_node)

    def unlock_prefix(self, req: Req) -> None:
        self.tree.dec_lock_ref(req.last_node)

    def dfs_weight_order(self, reqs: list[Req]) -> list[Req]:
        """`reqs` depth-first over the tree by their matched prefixes, heavier subtrees first."""
        if not isinstance(self.tree, RadixCache):
            return list(reqs)
        return [reqs[i] for i in self.tree.dfs_weight_order([r.last_node for r in reqs])]

    # ---- allocation ----
    def make_room(self, num_tokens: int) -> bool:
        """Evict `num_tokens` cached tokens when fewer are free (SGLang's allocation path); True if they are free."""
        if self.allocator.available_size() < num_tokens:
            self.tree.evict(num_tokens)
        return self.allocator.available_size() >= num_tokens

    def evict(self, num_tokens: int) -> None:
        self.tree.evict(num_tokens)

    def alloc_extend(self, reqs: list[Req], prefix_lens: list[int], seq_lens: list[int]) -> torch.Tensor:
        """Slots for positions prefix_lens[i]..seq_lens[i]-1 of each request, written to its row (a request
        without a row gets one, holding its matched prefix)."""
        for req in reqs:
            if req.req_pool_idx is None:
                self._assign_row(req)
        last_locs = [int(r.prefix_indices[-1]) if len(r.prefix_indices) else 0 for r in reqs]
        num_new = sum(seq - prefix for prefix, seq in zip(prefix_lens, seq_lens))
        self.make_room(num_new + (len(reqs) * self.page_size if self.page_size > 1 else 0))
        slots = self.allocator.alloc_extend(prefix_lens, seq_lens, last_locs)
        if slots is None:
            raise KVOutOfMemoryError(self._oom_message("Prefill", num_new))
        offset = 0
        for req, prefix_len, seq_len in zip(reqs, prefix_lens, seq_lens):
            self.table.write(req.req_pool_idx, prefix_len, slots[offset : offset + seq_len - prefix_len])
            offset += seq_len - prefix_len
            req.kv_allocated = seq_len
        return slots

    def alloc_decode(self, reqs: list[Req], rows: torch.Tensor, seq_lens: torch.Tensor) -> torch.Tensor:
        """One slot per request for its token at position seq_lens[i] - 1 (rows[i] is its table row)."""
        table = self.table.req_to_token
        positions = seq_lens - 1
        if self.page_size == 1:
            slots = self.allocator.alloc(len(reqs))
        else:
            slots = self.allocator.alloc_decode(seq_lens, table[rows, positions - 1].to(torch.int64))
        if slots is None:
            raise KVOutOfMemoryError(self._oom_message("Decode", len(reqs)))
        table[rows, positions] = slots.to(table.dtype)
        for req in reqs:
            req.kv_allocated += 1
        return slots

    def _assign_row(self, req: Req) -> None:
        req.req_pool_idx = self.table.alloc()
        if req.req_pool_idx is None:
            raise KVOutOfMemoryError("req_to_token pool is exhausted; lower --max-running-requests")
        if len(req.prefix_indices):
            self.table.write(req.req_pool_idx, 0, req.prefix_indices)

    def _oom_message(self, phase: str, num_tokens: int) -> str:
        available, evictable = self.allocator.available_size(), self.tree.evictable_size()
        return (
            f"{phase} out of memory. Try to lower your batch size.\nTry to allocate {num_tokens} tokens.\n"
            f"Available tokens: {available + evictable}\navailable_size()={available}\n"
            f"evictable_size()={evictable}\n"
        )

    # ---- giving KV back ----
    def cache_req(self, req: Req, *, finished: bool) -> None:
        """Insert the request's resident tokens into the tree. Finished: free what the tree did not take, its row
        and its lock. Not finished (a prefill chunk, or a prefill whose request goes on decoding): keep every slot
        and the row, with the prefix now the tree's and the lock on it."""
        resident = req.kv_allocated
        slots = self.table.slots(req.req_pool_idx, resident)
        token_ids = (req.origin_input_ids + req.output_ids)[:resident]
        aligned = token_ids[: resident // self.page_size * self.page_size]
        tree_len = self.tree.cached_len(req.last_node)
        already_cached, prefix, node = self.tree.insert(aligned, slots[: len(aligned)])
        self.allocator.free(slots[tree_len:already_cached])
        self.tree.dec_lock_ref(req.last_node)
        if finished:
            self.allocator.free(slots[len(prefix) :])
            self._free_row(req)
            return
        self.tree.inc_lock_ref(node)
        self.table.write(req.req_pool_idx, tree_len, prefix[tree_len:])
        req.prefix_indices = torch.cat([prefix, slots[len(prefix) :]])
        req.last_node = node

    def release(self, req: Req) -> None:
        """Free every slot the request holds beyond the tree's share, its row and its lock (retraction, abort)."""
        tree_len = self.tree.cached_len(req.last_node)
        self.allocator.free(self.table.slots(req.req_pool_idx, req.kv_allocated, start=tree_len))
        self.tree.dec_lock_ref(req.last_node)
        self._free_row(req)

    def _free_row(self, req: Req) -> None:
        self.table.free(req.req_pool_idx)
        req.req_pool_idx = None
        req.last_node = None

    # ---- accounting ----
    def available_size(self) -> int:
        return self.allocator.available_size()

    def evictable_size(self) -> int:
        return self.tree.evictable_size()

    def protected_size(self) -> int:
        return self.tree.protected_size()

    def is_idle_clean(self) -> bool:
        """SGLang's idle integrity check: every slot is free or cached, nothing is locked, every row is free."""
        available, evictable = self.allocator.available_size(), self.tree.evictable_size()
        ok = available + evictable == self.pool_size and self.tree.protected_size() == 0
        ok = ok and self.table.available_size() == self.table.size
        try:
            self.tree.check_integrity()
        except AssertionError as exc:
            logger.error(f"radix cache integrity check failed: {exc}")
            ok = False
        return ok

    def flush(self) -> None:
        """Forget every cached prefix (only when no request holds KV)."""
        self.tree.reset()
        self.allocator.clear()
