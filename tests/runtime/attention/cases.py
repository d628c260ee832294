"""Hand-built attention batches over a paged KV pool: the same batch runs through two backends for comparison."""
from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass

import torch

from toolkit.runtime.attention.base import AttentionBackend, AttentionLayer
from toolkit.runtime.forward_batch import ForwardBatch, ForwardMode
from toolkit.runtime.memory.kv_pool import KVPool


@dataclass(frozen=True)
class Request:
    prefix_len: int  # tokens already cached (page-aligned unless it is a decode step)
    new_len: int  # tokens computed in this batch (1 for decode)
    shares_prefix_with: int | None = None  # index of an earlier request whose first prefix_len slots it reuses


@dataclass
class Case:
    """One batch: a pool holding every prefix, the new tokens' q/k/v, and the ForwardBatch fields."""

    mode: ForwardMode
    layer: AttentionLayer
    pool: KVPool
    req_to_token: torch.Tensor
    rows: list[int]
    prefix_lens: list[int]
    new_lens: list[int]
    out_cache_loc: torch.Tensor
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor

    def run(self, backend: AttentionBackend) -> tuple[torch.Tensor, KVPool]:
        """Attention output of `backend` on a private copy of the pool, and that pool afterwards."""
        pool = copy.deepcopy(self.pool)
        new_tokens = [[0] * n for n in self.new_lens]
        batch = ForwardBatch.build(
            self.mode, self.rows, self.prefix_lens, new_tokens, self.out_cache_loc, self.req_to_token, pool,
            backend,
        )
        return backend.forward(self.q, self.k, self.v, self.layer, batch), pool

    def reference(self) -> tuple[torch.Tensor, KVPool]:
        """torch_native's float32 output of the same batch, on the case's device (a backend runs on the device it
        was made for: its native kernel is a CPU one)."""
        from toolkit.runtime.attention.torch_native import TorchNativeBackend

        return self.to(torch.float32).run(TorchNativeBackend(self.q.device))

    def to(self, dtype: torch.dtype, device: str | torch.device | None = None) -> Case:
        """The same batch with every float tensor (pool included) cast, e.g. a float32 reference of a bf16 case."""
        device = device or self.q.device
        pool = copy.deepcopy(self.pool)
        pool.dtype = dtype
        pool.k_buffer = [b.to(device, dtype) for b in pool.k_buffer]
        pool.v_buffer = [b.to(device, dtype) for b in pool.v_buffer]
        return dataclasses.replace(
            self, pool=pool, req_to_token=self.req_to_token.to(device), out_cache_loc=self.out_cache_loc.to(device),
            q=self.q.to(device, dtype), k=self.k.to(device, dtype), v=self.v.to(device, dtype),
        )


def make_case(
    requests: list[Request],
    page_size: int,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    decode: bool = False,
    device: str = "cpu",
    seed: int = 0,
) -> Case:
    """Random pages per request (slot = page * page_size + position % page_size, as the allocator lays them
    out), random cached K/V for every prefix, random q/k/v for the new tokens."""
    gen = torch.Generator().manual_seed(seed)
    assert not decode or all(r.new_len == 1 for r in requests)
    seq_lens = [r.prefix_len + r.new_len for r in requests]
    pages_needed = sum(-(-s // page_size) for s in seq_lens)
    num_pages = pages_needed + 3
    pool = KVPool(num_pages * page_size, page_size, 1, num_kv_heads, head_dim, dtype, device)
    free_pages = (torch.randperm(num_pages, generator=gen) + 1).tolist()
    max_ctx = max(seq_lens) + page_size
    req_to_token = torch.zeros(len(requests) + 2, max_ctx, dtype=torch.int32, device=device)
    rows = list(range(1, len(requests) + 1))
    slots_of: list[list[int]] = []
    for r, seq_len in zip(requests, seq_lens):
        slots = _slots(r, seq_len, page_size, free_pages, slots_of)
        slots_of.append(slots)
        req_to_token[rows[len(slots_of) - 1], :seq_len] = torch.tensor(slots, dtype=torch.int32)
    for layer_buffers in (pool.k_buffer, pool.v_buffer):
        layer_buffers[0].copy_(torch.randn(layer_buffers[0].shape, generator=gen).to(dtype))
    new_slots = [s for r, slots in zip(requests, slots_of) for s in slots[r.prefix_len :]]
    tokens = len(new_slots)
    case = Case(
        mode=ForwardMode.DECODE if decode else ForwardMode.EXTEND,
        layer=AttentionLayer(0, num_heads, num_kv_heads, head_dim, head_dim**-0.5),
        pool=pool,
        req_to_token=req_to_token,
        rows=rows,
        prefix_lens=[r.prefix_len for r in requests],
        new_lens=[r.new_len for r in requests],
        out_cache_loc=torch.tensor(new_slots, dtype=torch.int64, device=device),
        q=torch.randn(tokens, num_heads, head_dim, generator=gen).to(device, dtype),
        k=torch.randn(tokens, num_kv_heads, head_dim, generator=gen).to(device, dtype),
        v=torch.randn(tokens, num_kv_heads, head_dim, generator=gen).to(device, dtype),
    )
    return case


def _slots(r: Request, seq_len: int, page_size: int, free_pages: list[int], earlier: list[list[int]]) -> list[int]:
    shared = earlier[r.shares_prefix_with][: r.prefix_len] if r.shares_prefix_with is not None else []
    assert len(shared) % page_size == 0, "a shared prefix is page-aligned"
    own_pages = [free_pages.pop() for _ in range(-(-(seq_len - len(shared)) // page_size))]
    own = [own_pages[j // page_size] * page_size + j % page_size for j in range(seq_len - len(shared))]
    return shared + own
