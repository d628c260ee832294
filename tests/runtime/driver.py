"""Drives a ModelRunner by hand (allocate slots, lay out batches), for model-level tests below the scheduler."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from toolkit.runtime.forward_batch import ForwardBatch, ForwardMode
from toolkit.runtime.model_runner import ModelRunner


@dataclass
class Sequence:
    row: int
    tokens: list[int] = field(default_factory=list)  # every token whose KV is cached


class KVDriver:
    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner
        self.pool = runner.req_to_token_pool
        self.used_cuda_graph = False  # whether the latest forward replayed a captured graph

    def new_sequence(self, prefix_of: Sequence | None = None, prefix_len: int = 0) -> Sequence:
        """A fresh sequence, optionally sharing the first `prefix_len` cached tokens of another."""
        seq = Sequence(row=self.pool.alloc())
        if prefix_of is not None and prefix_len:
            self.pool.write(seq.row, 0, self.pool.slots(prefix_of.row, prefix_len))
            seq.tokens = prefix_of.tokens[:prefix_len]
        return seq

    def extend(self, seqs: list[Sequence], new_tokens: list[list[int]]) -> torch.Tensor:
        prefix_lens = [len(s.tokens) for s in seqs]
        seq_lens = [p + len(t) for p, t in zip(prefix_lens, new_tokens)]
        last_locs = [int(self.pool.req_to_token[s.row, p - 1]) if p else 0 for s, p in zip(seqs, prefix_lens)]
        slots = self.runner.allocator.alloc_extend(prefix_lens, seq_lens, last_locs)
        offset = 0
        for seq, prefix, tokens in zip(seqs, prefix_lens, new_tokens):
            self.pool.write(seq.row, prefix, slots[offset : offset + len(tokens)])
            offset += len(tokens)
            seq.tokens = seq.tokens + list(tokens)
        batch = ForwardBatch.build(
            ForwardMode.EXTEND, [s.row for s in seqs], prefix_lens, new_tokens, slots,
            self.pool.req_to_token, self.runner.kv_pool, self.runner.attn_backend,
        )
        return self._forward(batch)

    def decode(self, seqs: list[Sequence], next_tokens: list[int]) -> torch.Tensor:
        prefix_lens = [len(s.tokens) for s in seqs]
        device = self.pool.req_to_token.device  # the allocator's contract: tensors on the pool's device
        seq_lens = torch.tensor([p + 1 for p in prefix_lens], device=device)
        last_locs = torch.tensor([int(self.pool.req_to_token[s.row, p - 1]) for s, p in zip(seqs, prefix_lens)],
                                 device=device)
        slots = self.runner.allocator.alloc_decode(seq_lens, last_locs)
        for seq, prefix, slot, token in zip(seqs, prefix_lens, slots, next_tokens):
            self.pool.req_to_token[seq.row, prefix] = slot
            seq.tokens = seq.tokens + [token]
        batch = ForwardBatch.build(
            ForwardMode.DECODE, [s.row for s in seqs], prefix_lens, [[t] for t in next_tokens], slots,
            self.pool.req_to_token, self.runner.kv_pool, self.runner.attn_backend,
        )
        return self._forward(batch)

    def _forward(self, batch: ForwardBatch) -> torch.Tensor:
        logits, self.used_cuda_graph = self.runner.forward(batch)
        return logits
