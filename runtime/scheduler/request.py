"""A request's state inside the scheduler: its lifecycle status, its tokens, its place in the KV cache, and why it
finished."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import torch

from toolkit.runtime.io_struct import FinishReason, LogprobEntry
from toolkit.runtime.memory.prefix_cache import MatchResult
from toolkit.runtime.sampling.sampling_params import SamplingParams

_NO_SLOTS = torch.empty(0, dtype=torch.int64)


class ReqStatus(Enum):
    """Where a request is in its life; each transition is set in one place:

        WAITING ─admit─> PREFILLING ─prefill done─> RUNNING ─retract─> RETRACTED ─admit─> PREFILLING ...
        any live status ─finish─> FINISHED or ABORTED (`Req.finish`, by the reason's kind)

    Held by the scheduler: WAITING and RETRACTED in the waiting queue; PREFILLING in a prefill batch, and between
    chunks as the chunked request; RUNNING in the running batch (where a finished request stays until filtered).
    """

    WAITING = "waiting"  # queued, never admitted
    PREFILLING = "prefilling"  # admitted: its input (maybe in chunks) is being made resident
    RUNNING = "running"  # decoding in the running batch
    RETRACTED = "retracted"  # back in the queue, its KV released, to be prefilled again
    FINISHED = "finished"  # stopped by a stop token or string, or its length
    ABORTED = "aborted"  # aborted by the client, a limit, or the scheduler

    @property
    def is_done(self) -> bool:
        return self in (ReqStatus.FINISHED, ReqStatus.ABORTED)


@dataclass(eq=False)
class Req:
    rid: str
    origin_input_ids: list[int]
    sampling_params: SamplingParams
    eos_token_ids: frozenset[int] = frozenset()
    return_logprob: bool = False
    top_logprobs_num: int = 0
    logprob_start_len: int = -1  # the first prompt position whose logprob is returned; -1 for none
    output_ids: list[int] = field(default_factory=list)
    # KV-cache state (scheduler/cache_manager.py draws the regions): fill_ids = the tokens this round makes resident;
    # prefix_indices = slots already resident; last_node = the prefix tree's lock handle for the leading slots it
    # owns; req_pool_idx = the table row, held from admission until finish, retraction or abort.
    fill_ids: list[int] = field(default_factory=list)
    prefix_indices: torch.Tensor = _NO_SLOTS
    last_node: Any = None
    extend_input_len: int = 0
    req_pool_idx: int | None = None
    is_chunked: int = 0  # > 0 while a prefill chunk is in flight and more chunks follow
    already_computed: int = 0
    cached_tokens: int = 0
    status: ReqStatus = ReqStatus.WAITING
    finished_reason: FinishReason | None = None  # set with the status, by `finish` only
    to_abort: str | None = None  # an abort asked for, applied by the scheduler at its next step
    # outputs
    output_logprobs: list[float] = field(default_factory=list)
    output_top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    # the prompt's logprobs from `logprob_start_len`, gathered chunk by chunk; sent with the first token
    input_logprobs: list[LogprobEntry] = field(default_factory=list)
    created_time: float = field(default_factory=time.perf_counter)
    first_token_time: float | None = None
    tail_text: Any = None  # decode(ids) → str, set by the scheduler for stop-string checks
    # Decode steps launched whose token is not appended yet (overlap scheduling keeps one step in flight).
    inflight: int = 0
    # Table positions that have a KV slot: what is resident once every launched step has run.
    kv_allocated: int = 0
    # (launched step, row): where this request's next input token is, on the device.
    token_source: tuple[Any, int] | None = None
    # A constrained request's position in its grammar (constrained/backend.py), advanced by every appended token;
    # set once its grammar is compiled. A retracted request keeps it: its tokens so far are kept too.
    grammar: Any = None
    # What finishing checks per token, resolved once: a length bound, a set of token ids, stop strings or not.
    max_new_tokens: int = field(init=False)
    stop_token_set: frozenset[int] = field(init=False)
    checks_stop_strings: bool = field(init=False)
    penalized: bool = field(init=False)  # sampling counts its tokens (frequency/presence/repetition penalties)
    plain_greedy: bool = field(init=False)  # argmax, nothing else: no penalties, no logprobs

    def __post_init__(self) -> None:
        params = self.sampling_params
        self.max_new_tokens = params.max_new_tokens
        eos = frozenset() if params.ignore_eos else self.eos_token_ids
        self.stop_token_set = eos | frozenset(params.stop_token_ids)
        self.checks_stop_strings = bool(params.stop) and self.tail_text is not None
        self.penalized = params.has_penalties
        self.plain_greedy = (params.is_greedy and not self.penalized and not self.return_logprob
                             and not params.logit_bias)

    @property
    def finished(self) -> bool:
        return self.status.is_done

    def finish(self, reason: FinishReason) -> None:
        self.finished_reason = reason
        self.status = ReqStatus.ABORTED if reason.kind == "abort" else ReqStatus.FINISHED

    @property
    def seq_len(self) -> int:
        return len(self.origin_input_ids) + len(self.output_ids)

    def init_next_round_input(self, prefix: MatchResult | None = None) -> None:
        """Tokens to make resident this round on top of the resident prefix, or of `prefix` (a fresh cache match
        of `max_prefix_ids()`, from the `CacheManager`)."""
        self.fill_ids = self.origin_input_ids + self.output_ids
        if prefix is not None:
            self.prefix_indices, self.last_node = prefix
        self.extend_input_len = len(self.fill_ids) - len(self.prefix_indices)

    def max_prefix_ids(self) -> list[int]:
        # NOTE: matching stops one token short of the input so at least one token is computed for the logits, and
        # before the first position whose logits give a prompt logprob (a cached prefix has no logits).
        self.fill_ids = self.origin_input_ids + self.output_ids
        limit = len(self.fill_ids) - 1
        if self.wants_prompt_logprobs:
            limit = min(limit, max(self.logprob_start_len, 1) - 1)
        return self.fill_ids[: max(limit, 0)]

    @property
    def wants_prompt_logprobs(self) -> bool:
        """The prompt's logprobs are asked for and not computed yet (a retracted request has them already)."""
        return self.logprob_start_len >= 0 and not self.output_ids

    def logit_count(self, prefix_len: int, extend_len: int) -> int:
        """How many trailing positions of this round's extend need logits: the last one (the next token, or
        nothing for a chunk with more to come) and those before it whose next prompt token's logprob is asked."""
        if not self.wants_prompt_logprobs:
            return 1
        first = max(prefix_len, max(self.logprob_start_len, 1) - 1)
        return max(prefix_len + extend_len - first, 1)

    def reset_for_retract(self) -> None:
        """Back to the queue with no KV: the next admission prefills every token so far again."""
        self.status = ReqStatus.RETRACTED
        self.kv_allocated = 0
        self.token_source = None
        self.prefix_indices = _NO_SLOTS
        self.last_node = None
        self.extend_input_len = 0
        self.req_pool_idx = None
        self.already_computed = 0

    @property
    def decode_seq_len(self) -> int:
        """Tokens the next decode step attends over: every token so far, those still in flight included."""
        return len(self.origin_input_ids) + len(self.output_ids) + self.inflight

    def check_finished(self) -> None:
        if self.finished:
            return
        if self.to_abort is not None:
            self.finish(FinishReason("abort", message=self.to_abort))
            return
        reason = self.finish_after(self.output_ids[-1])
        if reason is not None:
            self.finish(reason)

    def finish_after(self, token: int) -> FinishReason | None:
        """Why the request ends with `token` (just appended), or None: the per-token check of the hot path."""
        if len(self.output_ids) >= self.max_new_tokens:
            return FinishReason("length", matched=self.max_new_tokens)
        if token in self.stop_token_set:
            return FinishReason("stop", matched=token)
        if self.grammar is not None and self.grammar.is_terminated:
            return FinishReason("stop", matched=token)
        if self.checks_stop_strings:
            return self._stop_string_finish()
        return None

    def _stop_string_finish(self) -> FinishReason | None:
        params = self.sampling_params
        # NOTE: every token decodes to at least one character, so max_len + 1 tokens cover any stop string
        # that ends in the newest token, also one that spans token boundaries.
        tail = self.tail_text(self.output_ids[-(params.stop_str_max_len + 1) :])
        for stop in params.stop:
            if stop in tail:
                return FinishReason("stop", matched=stop)
        return None


def check_statuses(reqs: list[Req], allowed: frozenset[ReqStatus], where: str) -> None:
    """Raise AssertionError if a request held in `where` has a status not in `allowed`."""
    wrong = [f"{r.rid}: {r.status.value}" for r in reqs if r.status not in allowed]
    assert not wrong, f"{where} holds requests in the wrong status: {', '.join(wrong)}"
