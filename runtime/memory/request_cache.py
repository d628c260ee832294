"""Hand a request's KV slots to the prefix cache when it finishes (or pauses between prefill chunks)."""
from __future__ import annotations

import torch

from toolkit.runtime.memory.prefix_cache import PrefixCache
from toolkit.runtime.memory.allocator import TokenAllocator
from toolkit.runtime.memory.req_to_token import ReqToTokenPool
from toolkit.runtime.scheduler.request import Req


class RequestCache:
    def __init__(self, tree: PrefixCache, req_to_token: ReqToTokenPool, allocator: TokenAllocator) -> None:
        self.tree = tree
        self.req_to_token = req_to_token
        self.allocator = allocator
        self.page_size = allocator.page_size

    def cache_finished_req(self, req: Req, resident_len: int | None = None) -> None:
        """Insert the request's resident tokens into the tree, free what the tree does not keep, release its
        row and lock. `resident_len` defaults to every position that has a KV slot (all but the last output,
        unless an overlapped step already computed that one too)."""
        if resident_len is None:
            resident_len = req.kv_allocated
        slots = self.req_to_token.slots(req.req_pool_idx, resident_len)
        if self.tree.disabled:
            self.allocator.free(slots)
        else:
            token_ids = (req.origin_input_ids + req.output_ids)[:resident_len]
            aligned = resident_len // self.page_size * self.page_size
            self.allocator.free(slots[aligned:])
            already_cached = self.tree.insert(token_ids[:aligned], slots[:aligned].clone())
            # NOTE: slots the tree already held for this prefix (inserted meanwhile by another request) are
            # duplicates of ours; ours are freed.
            self.allocator.free(slots[len(req.prefix_indices) : already_cached])
            self.tree.dec_lock_ref(req.last_node)
        self.req_to_token.free(req.req_pool_idx)
        req.req_pool_idx = None
        req.last_node = None

    def cache_unfinished_req(self, req: Req) -> None:
        """Make the resident part of a request (a finished prefill chunk) shareable and switch the request's
        prefix to the tree's slots, keeping its lock on the new prefix."""
        if self.tree.disabled:
            req.prefix_indices = self.req_to_token.slots(req.req_pool_idx, len(req.fill_ids))
            return
        token_ids = req.fill_ids
        slots = self.req_to_token.slots(req.req_pool_idx, len(token_ids))
        aligned = len(token_ids) // self.page_size * self.page_size
        already_cached = self.tree.insert(token_ids[:aligned], slots[:aligned].clone())
        self.allocator.free(slots[len(req.prefix_indices) : already_cached])
        new_indices, new_last_node = self.tree.match_prefix(token_ids[:aligned])
        old_len = len(req.prefix_indices)
        self.req_to_token.write(req.req_pool_idx, old_len, new_indices[old_len:])
        self.tree.dec_lock_ref(req.last_node)
        self.tree.inc_lock_ref(new_last_node)
        req.prefix_indices = torch.cat([new_indices, slots[len(new_indices) :]])
        req.last_node = new_last_node

    def release_without_caching(self, req: Req, resident_len: int) -> None:
        """Free everything a request holds beyond its locked tree prefix (retraction, abort mid-prefill)."""
        start = len(req.prefix_indices) // self.page_size * self.page_size if not self.tree.disabled else 0
        self.allocator.free(self.req_to_token.slots(req.req_pool_idx, resident_len, start=start))
        self.req_to_token.free(req.req_pool_idx)
        self.tree.dec_lock_ref(req.last_node)
        req.req_pool_idx = None
        req.last_node = None

    def release_paused(self, req: Req) -> None:
        """Free a chunked request between chunks (it holds slots but no table row)."""
        start = 0 if self.tree.disabled else len(req.prefix_indices) // self.page_size * self.page_size
        self.allocator.free(req.prefix_indices[start:])
        self.tree.dec_lock_ref(req.last_node)
        req.last_node = None
