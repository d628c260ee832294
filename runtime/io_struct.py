"""Every message between the HTTP front end and the scheduler process, and the request checks both sides share.

Plain dataclasses with no torch (SGLang's `managers/io_struct.py`): the front end imports this module, never the
scheduler or the model, so the HTTP process stays light.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

from toolkit.runtime.sampling.sampling_params import SamplingParams

FinishKind = Literal["stop", "length", "abort"]


@dataclass(frozen=True)
class FinishReason:
    kind: FinishKind
    matched: int | str | None = None  # the stop token id or stop string that ended the request
    message: str | None = None  # why an abort happened
    code: str | None = None  # an abort the server chose for load, not the request's fault: "waiting_timeout"

    def to_json(self) -> dict[str, Any]:
        """SGLang's `meta_info.finish_reason`."""
        if self.kind == "length":
            return {"type": "length", "length": self.matched}
        if self.kind == "abort":
            return {"type": "abort", "message": self.message}
        return {"type": "stop", "matched": self.matched}


WAITING_TIMEOUT = "waiting_timeout"  # FinishReason.code: waited past --queue-timeout before it was scheduled
INVALID_GRAMMAR = "invalid_grammar"  # FinishReason.code: its grammar is invalid, too slow to compile, or off


# ---- front end → scheduler ----

@dataclass(frozen=True)
class GenerateInput:
    """A tokenized request as the scheduler receives it."""

    rid: str
    input_ids: list[int]
    sampling_params: SamplingParams
    return_logprob: bool = False
    top_logprobs_num: int = 0


@dataclass(frozen=True)
class AbortRequest:
    rid: str


@dataclass(frozen=True)
class FlushCacheRequest:
    pass


@dataclass(frozen=True)
class ShutdownRequest:
    pass


@dataclass(frozen=True)
class DrainRequest:
    """Process the step in flight now (the offline Engine, once its requests are done, so their KV is cached)."""


# ---- scheduler → front end ----

class TokenOutput(NamedTuple):
    """One request's progress in one step: a new token, a finish, or both (a tuple: one per request per step,
    so cheap to build and to pickle)."""

    rid: str
    token_id: int | None
    finished_reason: FinishReason | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    logprob: float | None = None
    top_logprobs: list[tuple[int, float]] | None = None


@dataclass(frozen=True)
class SchedulerReady:
    """Sent once the model is loaded: what the front end needs to validate and report."""

    server_args: dict[str, Any]
    context_len: int
    max_total_num_tokens: int
    max_running_requests: int
    vocab_size: int
    model_class: str
    attention_backend: str
    tokenizer_path: str  # what the user named (--tokenizer-path or the model)
    tokenizer_folder: str  # a folder the front end's torch-free FastTokenizer loads (a GGUF's is converted once)


@dataclass
class SchedulerStats:
    """The scheduler's live counters: the latest log-line values plus cumulative totals. The scheduler updates its
    own in place and sends a copy with every step; the front end serves them (/get_server_info, /get_load, /metrics)."""

    num_running_reqs: int = 0
    num_queue_reqs: int = 0
    num_grammar_queue_reqs: int = 0  # requests waiting for their grammar to compile
    num_used_tokens: int = 0
    token_usage: float = 0.0
    gen_throughput: float = 0.0
    input_throughput: float = 0.0
    cache_hit_rate: float = 0.0
    num_retracted_reqs: int = 0
    total_retracted_reqs: int = 0
    total_prefill_tokens: int = 0
    total_cached_tokens: int = 0
    total_generated_tokens: int = 0
    total_decode_steps: int = 0
    total_prefill_batches: int = 0
    new_token_ratio: float = 0.0
    memory_leak_detected: bool = False


@dataclass(frozen=True)
class BatchOutput:
    outputs: list[TokenOutput]
    stats: SchedulerStats = field(default_factory=SchedulerStats)  # NOTE: a copy, never the scheduler's live object


@dataclass(frozen=True)
class FlushCacheResult:
    ok: bool


@dataclass(frozen=True)
class SchedulerFailed:
    message: str


# ---- checks both sides apply ----

def token_id_error(input_ids: list[int], vocab_size: int) -> str | None:
    """Token ids outside the model's vocabulary would index past its embedding table."""
    if not input_ids:
        return "the prompt is empty"
    low, high = min(input_ids), max(input_ids)
    if low < 0 or high >= vocab_size:
        return f"token id {high if high >= vocab_size else low} is outside the model's vocabulary [0, {vocab_size})"
    return None


def logit_bias_error(params: SamplingParams, vocab_size: int) -> str | None:
    """A biased token id outside the model's vocabulary."""
    outside = [token for token, _ in params.logit_bias_items if token >= vocab_size]
    return f"logit_bias: token id {outside[0]} is outside the model's vocabulary [0, {vocab_size})" if outside else None


def context_length_error(input_len: int, max_new_tokens: int, context_len: int) -> str | None:
    """SGLang's length validation; None when the request fits the context."""
    if input_len >= context_len:
        return (f"The input ({input_len} tokens) is longer than the model's context length "
                f"({context_len} tokens).")
    if input_len + max_new_tokens >= context_len:
        return (f"Requested token count exceeds the model's maximum context length of {context_len} tokens. "
                f"You requested a total of {input_len + max_new_tokens} tokens: {input_len} tokens from the input "
                f"and {max_new_tokens} tokens for the completion.")
    return None
