"""Tuning ideas and the typed change a finding asks for (docs/log-formats.md §10).

`IDEAS` is the one table of the knobs the rules turn: each idea's flag per engine (SGLang; vLLM; `toolkit serve`,
whose flags are SGLang's) and how it moves: `set` to an advised value, `push` in small steps until it breaks
(`toolkit tune` raises it toward the advice and backs off on a failed launch), or `switch` on and off. A
`Change` names an idea, never a flag: the corrected launch command, `toolkit tune` and the reports look the flag up
here for the engine they write for.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Engine = Literal["sglang", "vllm", "toolkit"]
Move = Literal["set", "push", "switch"]
ChangeValue = str | bool  # a value as the engine spells it ("0.85", "fp8_e5m2"); True / False: a switch on / off


@dataclass(frozen=True, slots=True)
class Idea:
    name: str
    title: str
    sglang: str | None  # None: SGLang has no such knob (a vLLM-only switch)
    vllm: str | None  # None: vLLM has no such knob
    move: Move
    off: str | None = None  # what turning the switch off means, when its flag is a negation

    def flag(self, engine: Engine) -> str | None:
        return self.vllm if engine == "vllm" else self.sglang


IDEAS: dict[str, Idea] = {idea.name: idea for idea in (
    Idea("admission", "admission conservativeness", "--schedule-conservativeness", None, "set"),
    Idea("kv_memory", "KV memory fraction", "--mem-fraction-static", "--gpu-memory-utilization", "push"),
    Idea("running_cap", "max running requests", "--max-running-requests", "--max-num-seqs", "set"),
    Idea("max_queued", "waiting-queue cap (503 beyond it)", "--max-queued-requests", None, "set"),
    Idea("prefill_budget", "tokens per prefill / step", "--chunked-prefill-size", "--max-num-batched-tokens", "set"),
    Idea("max_prefill", "tokens per prefill batch", "--max-prefill-tokens", None, "set"),
    Idea("mixed_chunk", "decode rides along prefill", "--enable-mixed-chunk", None, "switch"),
    Idea("context", "context length", "--context-length", "--max-model-len", "set"),
    Idea("kv_dtype", "KV cache dtype", "--kv-cache-dtype", "--kv-cache-dtype", "set"),
    Idea("quantization", "weight quantization", "--quantization", "--quantization", "set"),
    Idea("dtype", "weights' and activations' dtype", "--dtype", "--dtype", "set"),
    Idea("graph_max_bs", "largest captured CUDA-graph batch", "--cuda-graph-max-bs", "--max-cudagraph-capture-size",
         "set"),
    Idea("piecewise_max_tokens", "largest piecewise CUDA-graph token count", "--piecewise-cuda-graph-max-tokens", None,
         "set"),
    Idea("graphs_off", "CUDA graphs off", "--disable-cuda-graph", "--enforce-eager", "switch", off="graphs on"),
    Idea("torch_compile", "torch.compile", "--enable-torch-compile", None, "switch"),
    Idea("torch_compile_max_bs", "largest torch.compile batch", "--torch-compile-max-bs", None, "set"),
    Idea("schedule_policy", "schedule policy", "--schedule-policy", "--scheduling-policy", "set"),
    Idea("tp", "tensor parallel size", "--tp-size", "--tensor-parallel-size", "set"),
    Idea("dp", "data parallel size", "--dp-size", "--data-parallel-size", "set"),
    Idea("watchdog", "watchdog timeout", "--watchdog-timeout", None, "set"),
    Idea("overlap_off", "overlap scheduling off", "--disable-overlap-schedule", None, "switch", off="overlap on"),
    # NOTE: a hybrid (mamba / linear attention) model's recurrent states live in a pool of their own (SGLang)
    Idea("mamba_memory", "memory for mamba states, against the KV cache's", "--mamba-full-memory-ratio", None,
         "push"),
    Idea("mamba_slots", "mamba state slots", "--max-mamba-cache-size", None, "set"),
    Idea("async_scheduling", "async scheduling (vLLM V1)", None, "--async-scheduling", "switch",
         off="synchronous scheduling"),
    # NOTE: vLLM's key inside `--speculative-config`, in its JSON CLI form (`--json-arg.key value`, vLLM >= 0.10)
    Idea("spec_draft_tokens", "speculative draft tokens per step", "--speculative-num-draft-tokens",
         "--speculative-config.num_speculative_tokens", "set"),
    Idea("spec_draft_tokens_v0", "speculative draft tokens per step (vLLM V0)", None, "--num-speculative-tokens",
         "set"),
    Idea("spec_steps", "speculative draft steps", "--speculative-num-steps", None, "set"),
    Idea("spec_topk", "EAGLE draft top-k", "--speculative-eagle-topk", None, "set"),
)}


def flag_of(idea: str, engine: Engine) -> str | None:
    """The engine's flag for `idea`, None when the engine has no such knob."""
    return IDEAS[idea].flag(engine)


@dataclass(frozen=True, slots=True)
class Change:
    """Move `idea` to `value`, or only in `direction` (+1 higher, -1 lower) when no value is known; with
    neither, the change names the knob to look at and moves nothing. `companions` must come along with it."""

    idea: str
    value: ChangeValue | None = None
    direction: Literal[-1, 0, 1] = 0
    companions: tuple[Change, ...] = ()

    def __post_init__(self) -> None:
        if self.idea not in IDEAS:
            raise ValueError(f"unknown tuning idea {self.idea!r}")
        if self.value is not None and self.direction:
            raise ValueError("a change has a value or a direction, not both")

    @property
    def moves(self) -> bool:
        return self.value is not None or self.direction != 0

    def value_text(self) -> str | None:
        """The value as advice words: the value, `on`, `remove (...)`, `higher`/`lower`, or None."""
        if self.value is True:
            return "on"
        if self.value is False:
            off = IDEAS[self.idea].off
            return f"remove ({off})" if off else "remove"
        if self.value is not None:
            return self.value
        return {1: "higher", -1: "lower"}.get(self.direction)

    def as_flag(self, engine: Engine) -> str:
        """`--flag value` in the engine's words (a switch turned on is its bare flag)."""
        known = IDEAS[self.idea]
        flag = flag_of(self.idea, engine) or known.sglang or known.vllm
        return flag if self.value is True else f"{flag} {self.value_text() or ''}".strip()
