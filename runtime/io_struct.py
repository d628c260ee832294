"""Every message between the HTTP front end and the scheduler process, and the request checks both sides share.

Plain dataclasses with no torch (SGLang's `managers/io_struct.py`): the front end imports this module, never the
scheduler or the model, so the HTTP process stays light.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
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
    # SGLang's: the first prompt position whose logprob is returned (with `return_logprob`); -1 for none
    logprob_start_len: int = -1


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

LogprobEntry = tuple[int, "float | None", "list[tuple[int, float]] | None"]  # (token, logprob, top alternatives)


class TokenOutput(NamedTuple):
    """One request's progress in one step: a new token, a finish, or both (a tuple: one per request per step,
    so cheap to build and to pickle). `input_logprobs` rides on a request's first token only: one entry per prompt
    token from its `logprob_start_len` (the first prompt token's logprob is None)."""

    rid: str
    token_id: int | None
    finished_reason: FinishReason | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    logprob: float | None = None
    top_logprobs: list[tuple[int, float]] | None = None
    input_logprobs: list[LogprobEntry] | None = None


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


# ---- Prometheus metrics (SGLang's names, docs/log-formats.md §13): each declared once, here ----

MetricKind = Literal["gauge", "counter", "histogram"]
TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0, 200.0, 400.0)
ITL_BUCKETS = (0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.025, 0.03, 0.035, 0.04, 0.06, 0.08, 0.1, 0.2, 0.4,
               0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0)
E2E_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0, 200.0, 400.0,
               800.0)


class Metric(NamedTuple):
    name: str
    kind: MetricKind
    help: str
    buckets: tuple[float, ...] = ()

    @property
    def sample(self) -> str:
        """The name a scrape shows: prometheus-client adds `_total` to a counter's."""
        return self.name + "_total" if self.kind == "counter" else self.name


def _exported(default: Any, kind: MetricKind, name: str, help: str) -> Any:
    """A stats field served on /metrics under `name`."""
    return field(default=default, metadata={"metric": Metric(name, kind, help)})


@dataclass
class SchedulerStats:
    """The scheduler's live counters: the latest log-line values plus cumulative totals. The scheduler updates its
    own in place and sends a copy with every step; the front end serves them (/get_server_info, /get_load, /metrics).
    A field's metadata names the metric it is served as (`STATS_METRICS`)."""

    num_running_reqs: int = _exported(0, "gauge", "sglang:num_running_reqs", "The number of running requests.")
    num_queue_reqs: int = _exported(0, "gauge", "sglang:num_queue_reqs", "The number of requests in the waiting queue.")
    num_grammar_queue_reqs: int = _exported(0, "gauge", "sglang:num_grammar_queue_reqs",
                                            "The number of requests whose grammar is compiling.")
    num_used_tokens: int = _exported(0, "gauge", "sglang:num_used_tokens", "The number of used KV tokens.")
    token_usage: float = _exported(0.0, "gauge", "sglang:token_usage",
                                   "The KV token usage (used / max_total_num_tokens).")
    gen_throughput: float = _exported(0.0, "gauge", "sglang:gen_throughput",
                                      "The generation throughput (token/s) of the last decode log window.")
    input_throughput: float = 0.0
    cache_hit_rate: float = _exported(0.0, "gauge", "sglang:cache_hit_rate", "The prefix cache hit rate.")
    num_retracted_reqs: int = _exported(0, "gauge", "sglang:num_retracted_reqs",
                                        "The number of requests retracted by the last retraction.")
    total_retracted_reqs: int = _exported(0, "counter", "sglang:num_retracted_requests",
                                          "Retracted requests, cumulative.")
    total_prefill_tokens: int = 0
    total_cached_tokens: int = 0
    total_generated_tokens: int = 0
    total_decode_steps: int = 0
    total_prefill_batches: int = 0
    new_token_ratio: float = _exported(0.0, "gauge", "sglang:new_token_ratio",
                                       "The current new-token ratio of the admission budget.")
    memory_leak_detected: bool = False


# SchedulerStats field → the metric it is served as
STATS_METRICS: dict[str, Metric] = {f.name: f.metadata["metric"] for f in fields(SchedulerStats) if f.metadata}


class FrontEndMetrics(NamedTuple):
    """The metrics the front end observes itself, as tokens and refusals reach it."""

    max_total_num_tokens: Metric
    prompt_tokens: Metric
    generation_tokens: Metric
    cached_tokens: Metric
    num_requests: Metric
    num_aborted: Metric
    queue_rejected: Metric
    ttft: Metric
    itl: Metric
    e2e: Metric


FRONT_END_METRICS = FrontEndMetrics(
    max_total_num_tokens=Metric("sglang:max_total_num_tokens", "gauge", "The KV pool size in tokens."),
    prompt_tokens=Metric("sglang:prompt_tokens", "counter", "Prompt tokens of finished requests."),
    generation_tokens=Metric("sglang:generation_tokens", "counter", "Generated tokens of finished requests."),
    cached_tokens=Metric("sglang:cached_tokens", "counter", "Prompt tokens served from the prefix cache."),
    num_requests=Metric("sglang:num_requests", "counter", "Finished requests."),
    num_aborted=Metric("sglang:num_aborted_requests", "counter", "Aborted requests."),
    queue_rejected=Metric("sglang:num_queue_rejected_requests", "counter",
                          "Requests shed by the waiting queue (503): reason queue_full (--max-queued-requests) or "
                          "waiting_timeout (--queue-timeout)."),
    ttft=Metric("sglang:time_to_first_token_seconds", "histogram", "Time to first token.", TTFT_BUCKETS),
    itl=Metric("sglang:inter_token_latency_seconds", "histogram", "Time between tokens.", ITL_BUCKETS),
    e2e=Metric("sglang:e2e_request_latency_seconds", "histogram", "End-to-end request latency.", E2E_BUCKETS),
)
METRICS: tuple[Metric, ...] = (*STATS_METRICS.values(), *FRONT_END_METRICS)


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
