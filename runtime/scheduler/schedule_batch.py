"""A batch of requests the scheduler runs together, and the KV bookkeeping of one prefill or decode step."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from toolkit.runtime.forward_batch import ForwardBatch, ForwardMode
from toolkit.runtime.memory.prefix_cache import PrefixCache
from toolkit.runtime.memory.allocator import TokenAllocator
from toolkit.runtime.memory.req_to_token import ReqToTokenPool
from toolkit.runtime.scheduler.request import Req


class KVOutOfMemoryError(RuntimeError):
    """SGLang's hard OOM: the admission budget should have prevented it."""


@dataclass
class KVMemory:
    req_to_token: ReqToTokenPool
    allocator: TokenAllocator
    tree_cache: PrefixCache

    @property
    def page_size(self) -> int:
        return self.allocator.page_size

    def evict_if_needed(self, num_tokens: int) -> None:
        if self.allocator.available_size() < num_tokens:
            self.tree_cache.evict(num_tokens)

    def oom_message(self, phase: str, num_tokens: int) -> str:
        available, evictable = self.allocator.available_size(), self.tree_cache.evictable_size()
        return (
            f"{phase} out of memory. Try to lower your batch size.\nTry to allocate {num_tokens} tokens.\n"
            f"Available tokens: {available + evictable}\navailable_size()={available}\n"
            f"evictable_size()={evictable}\n"
        )


@dataclass
class ScheduleBatch:
    reqs: list[Req]
    mode: ForwardMode = ForwardMode.DECODE
    decoding_reqs: list[Req] = field(default_factory=list)  # running requests riding along (mixed chunk)
    # the step's layout, set by prepare_for_extend / prepare_for_decode
    prefix_lens: list[int] = field(default_factory=list)
    new_token_ids: list[list[int]] = field(default_factory=list)
    out_cache_loc: torch.Tensor | None = None
    batch_is_full: bool = False

    def __len__(self) -> int:
        return len(self.reqs)

    @property
    def is_empty(self) -> bool:
        return not self.reqs

    def prepare_for_extend(self, memory: KVMemory) -> None:
        """Give every request a table row and slots for its new tokens on top of its resident prefix."""
        self.mode = ForwardMode.EXTEND
        self.prefix_lens = [len(r.prefix_indices) for r in self.reqs]
        self.new_token_ids = [r.fill_ids[len(r.prefix_indices) :] for r in self.reqs]
        seq_lens = [len(r.fill_ids) for r in self.reqs]
        for req in self.reqs:
            req.req_pool_idx = memory.req_to_token.alloc()
            if req.req_pool_idx is None:
                raise KVOutOfMemoryError("req_to_token pool is exhausted; lower --max-running-requests")
            if len(req.prefix_indices):
                memory.req_to_token.write(req.req_pool_idx, 0, req.prefix_indices)
        last_locs = [int(r.prefix_indices[-1]) if len(r.prefix_indices) else 0 for r in self.reqs]
        num_new = sum(len(ids) for ids in self.new_token_ids)
        memory.evict_if_needed(num_new + (len(self.reqs) * memory.page_size if memory.page_size > 1 else 0))
        slots = memory.allocator.alloc_extend(self.prefix_lens, seq_lens, last_locs)
        if slots is None:
            raise KVOutOfMemoryError(memory.oom_message("Prefill", num_new))
        offset = 0
        for req, prefix_len, ids, seq_len in zip(self.reqs, self.prefix_lens, self.new_token_ids, seq_lens):
            memory.req_to_token.write(req.req_pool_idx, prefix_len, slots[offset : offset + len(ids)])
            offset += len(ids)
            req.cached_tokens += prefix_len - req.already_computed
            req.already_computed = seq_len
            req.is_retracted = False
        self.out_cache_loc = slots

    def prepare_for_decode(self, memory: KVMemory) -> None:
        """One slot per request for the token it generated last step."""
        self.mode = ForwardMode.DECODE
        self.prefix_lens = [r.seq_len - 1 for r in self.reqs]
        self.new_token_ids = [[r.output_ids[-1]] for r in self.reqs]
        rows = torch.tensor([r.req_pool_idx for r in self.reqs], dtype=torch.int64)
        positions = torch.tensor(self.prefix_lens, dtype=torch.int64)
        table = memory.req_to_token.req_to_token
        rows, positions = rows.to(table.device), positions.to(table.device)
        memory.evict_if_needed(self.new_pages_next_decode(memory.page_size) * memory.page_size)
        if memory.page_size == 1:
            slots = memory.allocator.alloc(len(self.reqs))
        else:
            slots = memory.allocator.alloc_decode(positions + 1, table[rows, positions - 1].to(torch.int64))
        if slots is None:
            raise KVOutOfMemoryError(memory.oom_message("Decode", len(self.reqs)))
        table[rows, positions] = slots.to(table.dtype)
        self.out_cache_loc = slots

    def new_pages_next_decode(self, page_size: int) -> int:
        if page_size == 1:
            return len(self.reqs)
        return sum(1 for r in self.reqs if (r.seq_len - 1) % page_size == 0)

    def mix_with_running(self, running: ScheduleBatch) -> None:
        """Append the running batch's decode tokens to this prefill (each is an extend of one token)."""
        self.prefix_lens = self.prefix_lens + running.prefix_lens
        self.new_token_ids = self.new_token_ids + running.new_token_ids
        self.out_cache_loc = torch.cat([self.out_cache_loc, running.out_cache_loc])
        self.decoding_reqs = list(running.reqs)
        self.reqs = self.reqs + running.reqs

    def filter(self, keep: list[Req] | None = None) -> None:
        """Drop finished requests (or keep exactly `keep`)."""
        self.reqs = [r for r in self.reqs if not r.finished] if keep is None else keep

    def merge(self, other: ScheduleBatch) -> None:
        self.reqs = self.reqs + other.reqs

    def forward_batch(self, req_to_token: ReqToTokenPool, runner) -> ForwardBatch:
        return ForwardBatch.build(
            self.mode,
            [r.req_pool_idx for r in self.reqs],
            self.prefix_lens,
            self.new_token_ids,
            self.out_cache_loc,
            req_to_token.req_to_token,
            runner.kv_pool,
            runner.attn_backend,
        )
