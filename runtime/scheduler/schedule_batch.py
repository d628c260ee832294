"""A batch of requests the scheduler runs together, and the layout of one prefill or decode step (its KV slots come
from the `CacheManager`).

The running (decode) batch keeps its step inputs as device tensors across steps (`DecodeInputs`): the table rows,
the lengths, and where each request's next input token lives (the previous step's sampled tokens). A steady decode
step therefore costs a few tensor ops however many requests run; the inputs are re-derived from the requests only
when the batch's membership changes in a way an index cannot follow.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from toolkit.runtime.forward_batch import ForwardBatch, ForwardMode
from toolkit.runtime.model_worker import InputSegment, LaunchedStep
from toolkit.runtime.scheduler.cache_manager import CacheManager
from toolkit.runtime.scheduler.request import Req


@dataclass
class DecodeInputs:
    """The running batch's next decode step, in batch order: table rows, the tokens each request attends over
    (its new one included), and where each new input token comes from."""

    rows: torch.Tensor
    rows_cpu: list[int]
    seq_lens: torch.Tensor
    seq_lens_cpu: list[int]
    tokens: list[InputSegment]

    @classmethod
    def of(cls, reqs: list[Req], device: torch.device) -> DecodeInputs:
        rows_cpu = [r.req_pool_idx for r in reqs]
        seq_lens_cpu = [r.decode_seq_len for r in reqs]
        return cls(_ints(rows_cpu, device), rows_cpu, _ints(seq_lens_cpu, device), seq_lens_cpu,
                   _segments(reqs, device))

    def select(self, keep: list[int]) -> DecodeInputs | None:
        """The inputs of the requests at positions `keep` (in order); None when they cannot be indexed."""
        if len(self.tokens) != 1:
            return None
        keep_t = _ints(keep, self.rows.device)
        source = self.tokens[0]
        index = keep_t if source.index is None else source.index[keep_t]
        return DecodeInputs(self.rows[keep_t], [self.rows_cpu[i] for i in keep], self.seq_lens[keep_t],
                            [self.seq_lens_cpu[i] for i in keep], [InputSegment(source.source, index)])

    def advanced(self, launched: LaunchedStep) -> DecodeInputs:
        """The inputs of the step after `launched`: one token longer, fed by what `launched` samples."""
        return DecodeInputs(self.rows, self.rows_cpu, self.seq_lens + 1, [n + 1 for n in self.seq_lens_cpu],
                            [InputSegment(launched)])


def _ints(values: list[int], device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64, device=device)


def _segments(reqs: list[Req], device: torch.device) -> list[InputSegment]:
    """Runs of requests whose next token comes from the same launched step."""
    segments: list[InputSegment] = []
    run: list[int] = []
    source = None
    for req in reqs:
        step, row = req.token_source
        if step is not source and run:
            segments.append(InputSegment(source, _ints(run, device)))
            run = []
        source = step
        run.append(row)
    if run:
        segments.append(InputSegment(source, _ints(run, device)))
    return segments


@dataclass
class ScheduleBatch:
    reqs: list[Req]
    mode: ForwardMode = ForwardMode.DECODE
    decoding_reqs: list[Req] = field(default_factory=list)  # running requests riding along (mixed chunk)
    # the step's layout, set by prepare_for_extend / prepare_for_decode
    prefix_lens: list[int] = field(default_factory=list)
    new_token_ids: list[list[int]] = field(default_factory=list)
    logit_counts: list[int] = field(default_factory=list)  # trailing positions of each extend that need logits
    out_cache_loc: torch.Tensor | None = None
    batch_is_full: bool = False
    decode_inputs: DecodeInputs | None = None  # kept across decode steps; None when it must be re-derived

    def __len__(self) -> int:
        return len(self.reqs)

    @property
    def is_empty(self) -> bool:
        return not self.reqs

    def prepare_for_extend(self, cache: CacheManager) -> None:
        """Slots for every request's new tokens on top of its resident prefix."""
        self.mode = ForwardMode.EXTEND
        self.prefix_lens = [len(r.prefix_indices) for r in self.reqs]
        self.new_token_ids = [r.fill_ids[len(r.prefix_indices) :] for r in self.reqs]
        self.logit_counts = [r.logit_count(p, len(ids)) for r, p, ids in zip(self.reqs, self.prefix_lens,
                                                                              self.new_token_ids)]
        seq_lens = [len(r.fill_ids) for r in self.reqs]
        self.out_cache_loc = cache.alloc_extend(self.reqs, self.prefix_lens, seq_lens)
        for req, prefix_len, seq_len in zip(self.reqs, self.prefix_lens, seq_lens):
            req.cached_tokens += prefix_len - req.already_computed
            req.already_computed = seq_len

    def prepare_for_decode(self, cache: CacheManager) -> DecodeInputs:
        """One slot per request for the token it generated last step (maybe still in flight); returns the step's
        inputs."""
        self.mode = ForwardMode.DECODE
        inputs = self.decode_inputs or DecodeInputs.of(self.reqs, cache.req_to_token.device)
        self.decode_inputs = inputs
        cache.make_room(self.new_pages_next_decode(cache.page_size) * cache.page_size)
        self.out_cache_loc = cache.alloc_decode(self.reqs, inputs.rows, inputs.seq_lens)
        return inputs

    def new_pages_next_decode(self, page_size: int) -> int:
        if page_size == 1:
            return len(self.reqs)
        return sum(1 for r in self.reqs if (r.decode_seq_len - 1) % page_size == 0)

    def decode_lists(self) -> tuple[list[int], list[list[int]]]:
        """Prefix lengths and new tokens as host lists (a mixed-chunk prefill folds this decode step in; every
        token is then on the host)."""
        inputs = self.decode_inputs
        return [n - 1 for n in inputs.seq_lens_cpu], [[r.output_ids[-1]] for r in self.reqs]

    def mix_with_running(self, running: ScheduleBatch) -> None:
        """Append the running batch's decode tokens to this prefill (each is an extend of one token)."""
        prefix_lens, new_token_ids = running.decode_lists()
        self.prefix_lens = self.prefix_lens + prefix_lens
        self.new_token_ids = self.new_token_ids + new_token_ids
        self.logit_counts = self.logit_counts + [1] * len(new_token_ids)
        self.out_cache_loc = torch.cat([self.out_cache_loc, running.out_cache_loc])
        self.decoding_reqs = list(running.reqs)
        self.reqs = self.reqs + running.reqs

    def filter(self, keep: list[Req] | None = None) -> None:
        """Drop finished requests (or all but those in `keep`); the rest keep their order."""
        if keep is None:
            positions = [i for i, r in enumerate(self.reqs) if not r.finished]
        else:
            kept = set(map(id, keep))
            positions = [i for i, r in enumerate(self.reqs) if id(r) in kept]
        if len(positions) == len(self.reqs):
            return
        if self.decode_inputs is not None:
            self.decode_inputs = self.decode_inputs.select(positions)
        self.reqs = [self.reqs[i] for i in positions]

    def merge(self, other: ScheduleBatch) -> None:
        self.reqs = self.reqs + other.reqs
        self.decode_inputs = None

    def logit_rows(self) -> list[int]:
        """Where each request's last position sits among the extend's logits rows."""
        ends, total = [], 0
        for count in self.logit_counts:
            total += count
            ends.append(total - 1)
        return ends

    def forward_batch(self, req_to_token: torch.Tensor, runner) -> ForwardBatch:
        if self.mode is ForwardMode.DECODE:
            inputs = self.decode_inputs
            return ForwardBatch.decode(
                inputs.seq_lens, inputs.seq_lens_cpu, inputs.rows, inputs.rows_cpu, self.out_cache_loc,
                req_to_token, runner.kv_pool, runner.attn_backend,
            )
        return ForwardBatch.build(
            self.mode,
            [r.req_pool_idx for r in self.reqs],
            self.prefix_lens,
            self.new_token_ids,
            self.out_cache_loc,
            req_to_token,
            runner.kv_pool,
            runner.attn_backend,
            self.logit_counts,
        )
