"""Each engine's vocabulary in one table (docs/log-formats.md §10): the tuning ideas the rules turn, and for each
engine its arguments, each a `Knob` (its flag, its name as the log prints it, the idea it serves, its default, its
kind and choices, whether the corrected launch command writes it). `knob(idea, engine)` is the one lookup: the
config reads a value by idea (`ServerConfig.value`), the advice, `toolkit tune` and the reports find the flag.

SGLang's knobs take their kind, choices and default from `toolkit serve`'s own flag declarations
(`runtime/server_args.py`, whose flags are SGLang's), except where SGLang's default differs (`SGLANG_DEFAULTS`);
vLLM's are declared here. A knob without a kind is one the advice names but `toolkit tune` never passes (the server
it launches would reject it). A `Change` names an idea, never a flag.
"""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Literal

from toolkit.diagnose.read.values import Value
from toolkit.runtime.server_args import flag_fields  # torch-free: the flag declarations only

Engine = Literal["sglang", "vllm"]
ENGINES: tuple[Engine, ...] = ("sglang", "vllm")
Move = Literal["set", "push", "switch"]
Kind = Literal["switch", "int", "float", "str"]
ChangeValue = str | bool  # a value as the engine spells it ("0.85", "fp8_e5m2"); True / False: a switch on / off


@dataclass(frozen=True, slots=True, kw_only=True)
class Idea:
    """A knob the rules turn, whatever the engine calls it: how it `move`s (`set` to an advised value, `push` in
    small steps until it breaks: `toolkit tune` raises it toward the advice and backs off on a failed launch,
    `switch` on and off), and what turning a switch off means where its flag is a negation (`off`)."""

    name: str
    title: str
    move: Move
    off: str | None = None


IDEAS: dict[str, Idea] = {idea.name: idea for idea in (
    Idea(name="admission", title="admission conservativeness", move="set"),
    Idea(name="kv_memory", title="KV memory fraction", move="push"),
    # NOTE: a cap on the pool set by hand (SGLang in tokens, vLLM in blocks): it moves only up, by direction
    Idea(name="kv_cap", title="KV pool size set by hand", move="set"),
    Idea(name="running_cap", title="max running requests", move="set"),
    Idea(name="max_queued", title="waiting-queue cap (503 beyond it)", move="set"),
    Idea(name="prefill_budget", title="tokens per prefill / step", move="set"),
    Idea(name="max_prefill", title="tokens per prefill batch", move="set"),
    Idea(name="mixed_chunk", title="decode rides along prefill", move="switch"),
    Idea(name="context", title="context length", move="set"),
    Idea(name="kv_dtype", title="KV cache dtype", move="set"),
    Idea(name="quantization", title="weight quantization", move="set"),
    Idea(name="dtype", title="weights' and activations' dtype", move="set"),
    Idea(name="graph_max_bs", title="largest captured CUDA-graph batch", move="set"),
    Idea(name="piecewise_max_tokens", title="largest piecewise CUDA-graph token count", move="set"),
    Idea(name="graphs_off", title="CUDA graphs off", move="switch", off="graphs on"),
    Idea(name="torch_compile", title="torch.compile", move="switch"),
    Idea(name="torch_compile_max_bs", title="largest torch.compile batch", move="set"),
    Idea(name="schedule_policy", title="schedule policy", move="set"),
    Idea(name="tp", title="tensor parallel size", move="set"),
    Idea(name="dp", title="data parallel size", move="set"),
    Idea(name="watchdog", title="watchdog timeout", move="set"),
    Idea(name="overlap_off", title="overlap scheduling off", move="switch", off="overlap on"),
    # NOTE: a hybrid (mamba / linear attention) model's recurrent states live in a pool of their own (SGLang)
    Idea(name="mamba_memory", title="memory for mamba states, against the KV cache's", move="push"),
    Idea(name="mamba_slots", title="mamba state slots", move="set"),
    Idea(name="async_scheduling", title="async scheduling (vLLM V1)", move="switch", off="synchronous scheduling"),
    Idea(name="spec_draft_tokens", title="speculative draft tokens per step", move="set"),
    Idea(name="spec_draft_tokens_v0", title="speculative draft tokens per step (vLLM V0)", move="set"),
    Idea(name="spec_steps", title="speculative draft steps", move="set"),
    Idea(name="spec_topk", title="EAGLE draft top-k", move="set"),
)}
# What the arguments are that no idea moves (the corrected command writes some; the config reads the model)
ROLES = ("model", "tokenizer", "served_name", "host", "port", "page_size", "radix_cache_off",
         "attention_backend", "dp_attention", "prefix_caching")


@dataclass(frozen=True, slots=True, kw_only=True)
class Knob:
    """One argument of an engine: its `flag`, its name as the log prints it (`arg`), what it is (`idea`: one of
    `IDEAS`, or a role of `ROLES`), the value the engine runs with where the log names none (`default`; None where
    the engine derives it, or its release decides), its `kind` and `choices` (no kind: `toolkit tune` never passes
    it), and whether the corrected launch command writes it (`kept`: unless at its default; `always`: even then, as
    the memory fraction every memory finding quotes)."""

    flag: str
    arg: str
    idea: str
    kind: Kind | None = None
    default: Value = None
    choices: frozenset[str] | None = None
    kept: bool = False
    always: bool = False

    def __post_init__(self) -> None:
        if self.idea not in IDEAS and self.idea not in ROLES:
            raise ValueError(f"unknown idea or role {self.idea!r}")


def _arg(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_")


def _vllm(flag: str, idea: str, kind: Kind | None = None, default: Value = None, **more) -> Knob:
    return Knob(flag=flag, arg=_arg(flag), idea=idea, kind=kind, default=default, **more)


# vLLM's arguments, the corrected command's first and in its order
VLLM: tuple[Knob, ...] = (
    _vllm("--model", "model"),  # NOTE: `vllm serve MODEL` names it first, without its flag
    _vllm("--host", "host", kept=True),
    _vllm("--port", "port", default=8000, kept=True),
    _vllm("--tensor-parallel-size", "tp", "int", 1, kept=True),
    _vllm("--data-parallel-size", "dp", "int", 1, kept=True),
    _vllm("--quantization", "quantization", "str", kept=True),
    _vllm("--kv-cache-dtype", "kv_dtype", "str", "auto", choices=frozenset({"auto", "fp8", "fp8_e5m2", "fp8_e4m3"}),
          kept=True),
    _vllm("--max-model-len", "context", "int", kept=True),
    _vllm("--gpu-memory-utilization", "kv_memory", "float", 0.9, kept=True, always=True),
    _vllm("--num-gpu-blocks-override", "kv_cap", "int", kept=True),
    _vllm("--max-num-seqs", "running_cap", "int", kept=True),
    _vllm("--max-num-batched-tokens", "prefill_budget", "int", kept=True),
    _vllm("--enable-prefix-caching", "prefix_caching", default=True, kept=True),
    _vllm("--enforce-eager", "graphs_off", "switch", False, kept=True),
    _vllm("--max-cudagraph-capture-size", "graph_max_bs", "int", 512, kept=True),
    _vllm("--scheduling-policy", "schedule_policy", "str", choices=frozenset({"fcfs", "priority"})),
    _vllm("--dtype", "dtype"),
    _vllm("--async-scheduling", "async_scheduling"),
    # NOTE: a key inside `--speculative-config`, in its JSON CLI form (`--json-arg.key value`, vLLM >= 0.10)
    _vllm("--speculative-config.num_speculative_tokens", "spec_draft_tokens"),
    _vllm("--num-speculative-tokens", "spec_draft_tokens_v0"),
)

# NOTE: the logs are SGLang's, so where its default is not ours the log source's wins: page_size (ours is filled
# from the device, SGLang's is 1), attention_backend (SGLang's None picks per device, ours spells it "auto"),
# schedule_policy (SGLang releases differ, lpm in older ones, fcfs in newer: always written), and
# enable_dp_attention (no flag of ours).
SGLANG_DEFAULTS: dict[str, Value] = {
    "page_size": 1, "attention_backend": None, "schedule_policy": None, "enable_dp_attention": False,
}
# SGLang's arguments by what they are: the corrected command's, in its order, then the others the advice names
SGLANG_KEPT: tuple[tuple[str, str], ...] = (
    ("model_path", "model"), ("tokenizer_path", "tokenizer"), ("served_model_name", "served_name"),
    ("host", "host"), ("port", "port"), ("tp_size", "tp"), ("dp_size", "dp"), ("dtype", "dtype"),
    ("quantization", "quantization"), ("kv_cache_dtype", "kv_dtype"), ("context_length", "context"),
    ("mem_fraction_static", "kv_memory"), ("max_running_requests", "running_cap"),
    ("max_queued_requests", "max_queued"),
    ("max_total_tokens", "kv_cap"), ("chunked_prefill_size", "prefill_budget"),
    ("max_prefill_tokens", "max_prefill"), ("schedule_policy", "schedule_policy"),
    ("schedule_conservativeness", "admission"), ("page_size", "page_size"), ("disable_radix_cache", "radix_cache_off"),
    ("enable_mixed_chunk", "mixed_chunk"), ("attention_backend", "attention_backend"),
    ("disable_cuda_graph", "graphs_off"), ("cuda_graph_max_bs", "graph_max_bs"),
    ("enable_torch_compile", "torch_compile"),
    ("torch_compile_max_bs", "torch_compile_max_bs"), ("enable_dp_attention", "dp_attention"),
)
SGLANG_OTHERS: tuple[tuple[str, str], ...] = (
    ("piecewise_cuda_graph_max_tokens", "piecewise_max_tokens"), ("watchdog_timeout", "watchdog"),
    ("disable_overlap_schedule", "overlap_off"), ("mamba_full_memory_ratio", "mamba_memory"),
    ("max_mamba_cache_size", "mamba_slots"), ("speculative_num_draft_tokens", "spec_draft_tokens"),
    ("speculative_num_steps", "spec_steps"), ("speculative_eagle_topk", "spec_topk"),
)


def _sglang(arg: str, idea: str, kept: bool) -> Knob:
    """SGLang's argument as `toolkit serve` declares it (a flag it lacks has no kind: never passed)."""
    declared = _declared().get(arg)
    if declared is None:
        return Knob(flag="--" + arg.replace("_", "-"), arg=arg, idea=idea, default=SGLANG_DEFAULTS.get(arg), kept=kept)
    field, spec = declared
    written = str(field.type).replace(" ", "")
    kind: Kind = ("switch" if written.startswith("bool") else "int" if written.startswith(("int", "list[int]"))
                  else "float" if written.startswith("float") else "str")
    return Knob(flag="--" + arg.replace("_", "-"), arg=arg, idea=idea, kind=kind,
                default=SGLANG_DEFAULTS[arg] if arg in SGLANG_DEFAULTS else field.default,
                choices=frozenset(map(str, spec.choices)) if spec.choices else None, kept=kept)


def _declared() -> dict[str, tuple[dataclasses.Field, object]]:
    return {f.name: (f, spec) for f, spec in flag_fields()}


SGLANG: tuple[Knob, ...] = (*(_sglang(arg, idea, True) for arg, idea in SGLANG_KEPT),
                            *(_sglang(arg, idea, False) for arg, idea in SGLANG_OTHERS))
KNOBS: dict[Engine, tuple[Knob, ...]] = {"sglang": SGLANG, "vllm": VLLM}
FP8_KV: dict[Engine, str] = {"sglang": "fp8_e5m2", "vllm": "fp8"}  # an fp8 KV cache, in each engine's words


@functools.lru_cache(maxsize=None)
def _by_idea(engine: Engine) -> dict[str, Knob]:
    return {k.idea: k for k in KNOBS[engine]}


def knob(idea: str, engine: Engine) -> Knob | None:
    """The engine's knob for an idea (or a role), None where the engine has none."""
    return _by_idea(engine).get(idea)


def named(idea: str, engine: Engine) -> str:
    """The flag that names an idea in words for `engine`: its own, else the other engine's (a knob it lacks)."""
    found = knob(idea, engine) or next(k for e in ENGINES if (k := knob(idea, e)) is not None)
    return found.flag


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
        flag = named(self.idea, engine)
        return flag if self.value is True else f"{flag} {self.value_text() or ''}".strip()
