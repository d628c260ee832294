"""What one forward pass computes: EXTEND (new tokens on top of a cached prefix) or DECODE (one token each)."""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from toolkit.runtime.attention.base import AttentionBackend
    from toolkit.runtime.memory.kv_pool import KVPool


class ForwardMode(IntEnum):
    EXTEND = 1
    DECODE = 2

    @property
    def is_decode(self) -> bool:
        return self is ForwardMode.DECODE


@dataclass
class ForwardBatch:
    mode: ForwardMode
    input_ids: torch.Tensor | None  # [num_tokens]; None until the model worker resolves a decode step's inputs
    positions: torch.Tensor  # [num_tokens]
    out_cache_loc: torch.Tensor  # [num_tokens] KV slots the new tokens are written to
    req_pool_indices: torch.Tensor  # [batch]
    req_pool_indices_cpu: list[int]
    seq_lens: torch.Tensor  # [batch] prefix + new tokens
    seq_lens_cpu: list[int]
    extend_prefix_lens_cpu: list[int]
    extend_seq_lens_cpu: list[int]
    req_to_token: torch.Tensor  # [max_reqs, max_context] slot of each request's token
    kv_pool: KVPool
    attn_backend: AttentionBackend
    # Rows of the flattened tokens whose logits are needed (each request's last token, and the prompt positions
    # whose logprobs are asked); None means all rows.
    logits_indices: torch.Tensor | None = None
    attn_metadata: Any = field(default=None, repr=False)

    @property
    def batch_size(self) -> int:
        return len(self.seq_lens_cpu)

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @classmethod
    def decode(
        cls,
        seq_lens: torch.Tensor,
        seq_lens_cpu: list[int],
        req_pool_indices: torch.Tensor,
        req_pool_indices_cpu: list[int],
        out_cache_loc: torch.Tensor,
        req_to_token: torch.Tensor,
        kv_pool: KVPool,
        attn_backend: AttentionBackend,
        input_ids: torch.Tensor | None = None,
    ) -> ForwardBatch:
        """A decode step from the running batch's persistent tensors. `input_ids` None: the model worker fills
        them in from the previous step's sampled tokens just before the forward."""
        batch = cls(
            mode=ForwardMode.DECODE,
            input_ids=input_ids,
            positions=seq_lens - 1,
            out_cache_loc=out_cache_loc,
            req_pool_indices=req_pool_indices,
            req_pool_indices_cpu=req_pool_indices_cpu,
            seq_lens=seq_lens,
            seq_lens_cpu=seq_lens_cpu,
            extend_prefix_lens_cpu=[n - 1 for n in seq_lens_cpu],
            extend_seq_lens_cpu=[1] * len(seq_lens_cpu),
            req_to_token=req_to_token,
            kv_pool=kv_pool,
            attn_backend=attn_backend,
        )
        attn_backend.init_forward_metadata(batch)
        return batch

    @classmethod
    def build(
        cls,
        mode: ForwardMode,
        req_pool_indices: list[int],
        prefix_lens: list[int],
        new_token_ids: list[list[int]],
        out_cache_loc: torch.Tensor,
        req_to_token: torch.Tensor,
        kv_pool: KVPool,
        attn_backend: AttentionBackend,
        logit_counts: list[int] | None = None,
    ) -> ForwardBatch:
        """Lay out a batch from per-request prefix lengths and new tokens (host lists → device tensors). An extend
        returns logits for the last `logit_counts[i]` tokens of request i (default: its last token only)."""
        device = req_to_token.device
        extend_lens = [len(ids) for ids in new_token_ids]
        seq_lens = [p + e for p, e in zip(prefix_lens, extend_lens)]
        flat_ids = [t for ids in new_token_ids for t in ids]
        positions = [p for prefix, ext in zip(prefix_lens, extend_lens) for p in range(prefix, prefix + ext)]
        logits_indices = None
        if mode is ForwardMode.EXTEND:
            rows, total = [], 0
            for i, ext in enumerate(extend_lens):
                total += ext
                count = logit_counts[i] if logit_counts else 1
                rows.extend(range(total - count, total))
            logits_indices = torch.tensor(rows, dtype=torch.int64, device=device)
        batch = cls(
            mode=mode,
            input_ids=torch.tensor(flat_ids, dtype=torch.int64, device=device),
            positions=torch.tensor(positions, dtype=torch.int64, device=device),
            out_cache_loc=out_cache_loc,
            req_pool_indices=torch.tensor(req_pool_indices, dtype=torch.int64, device=device),
            req_pool_indices_cpu=list(req_pool_indices),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int64, device=device),
            seq_lens_cpu=seq_lens,
            extend_prefix_lens_cpu=list(prefix_lens),
            extend_seq_lens_cpu=extend_lens,
            req_to_token=req_to_token,
            kv_pool=kv_pool,
            attn_backend=attn_backend,
            logits_indices=logits_indices,
        )
        attn_backend.init_forward_metadata(batch)
        return batch
