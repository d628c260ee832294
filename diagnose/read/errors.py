"""Error records (docs/log-formats.md §6.2-§6.3, §9.5): hard OOMs, exceptions and tracebacks, start-up memory errors,
leaks, watchdogs; their fields, and what their text says, read once into `ErrorText`: the error lines, where the
traceback ran (`SIGNS`), the engine its words name, and vLLM's refusal sizes.

An error line is `SomeError: message` (`ERROR_LINE`); a record whose text holds none was cut before it (a traceback's
tail not pasted). Judges read `Event.error`, never the text.
"""
from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from typing import NamedTuple

from toolkit.diagnose.read.messages import ERROR_KINDS, VLLM_FREE_MEMORY, kind_of
from toolkit.diagnose.read.values import Fields, Number, Value, assignments, message, value

ERROR_LINE = r"^\s*[\w.]{0,80}(?:Error|Exception|Warning): (.*)$"  # its message, per line (re.M)
# SGLang's mamba state pool out of slots, raised (an AssertionError, a RuntimeError) where a batch is admitted
# (ormandj/sglang-glm53-flash-sm120#12): `Not enough space for mamba cache` / `mamba ping pong idx` / `decoupled
# drafter mamba rollback checkpoints`
MAMBA_POOL_FULL = r"Not enough space for (?:mamba|decoupled drafter mamba)\b"
# vLLM's KV cache memory check, where a traceback cut before its error line ends (vllm#20726): it raises only
# where the memory left for the KV cache holds nothing, or no request at the max model len
KV_MEMORY_CHECK = r"\b_?check_enough_kv_cache_memory\b"
MEMORY_WORDS = r"(?i)memory|\bOOM\b"  # an error line that names memory
# Error records name their engine by wording (vLLM's KV cache start-up errors) or by the traceback's source paths
# (SGLang first: its older tracebacks pass through vLLM's layers).
ENGINE_WORDS = {"sglang": r"[Nn]ot enought? (?:GPU )?memory|[/\\]sglang[/\\]",
                # vLLM's errors name its engine arguments as Python does (`lowering `max_num_seqs` or
                # `gpu_memory_utilization``, llm-d#787); SGLang has no argument of these names
                "vllm": r"cache blocks|max seq len|[/\\]vllm[/\\]|\b(?:gpu_memory_utilization|max_num_seqs|"
                        r"max_num_batched_tokens)\b|" + VLLM_FREE_MEMORY}
# What a record's text shows of where it ran or what it hit, by name: each pattern's first group that matched (the
# whole match where it has none), the distinct ones in order.
SIGNS: dict[str, str] = {
    "capture": r"(?i)captur",  # capture_model, capture_one_batch_size, Capturing CUDA graphs
    "sampler": r"(?i)sampler|lora",
    # the allocator with which an engine releases memory for a trainer and takes it back: vLLM's sleep mode
    # (`wake_up`, its cumem allocator), SGLang's torch_memory_saver (`resume_memory_occupation`)
    "wake": r"\bwake_up\b|cumem_allocator|\bcumem\.py|torch_memory_saver|resume_memory_occupation",
    "loading": r"\bload_model\b|\bload_weights\b|model_loader|weight_loader",  # the model was loading
    "cache_check": r"\binitialize_cache\b|\braise_if_cache_size_invalid\b|\b_verify_cache_size\b",  # vLLM V0's
    "profile_run": r"\bdetermine_num_available_blocks\b|\bprofile_run\b",  # vLLM's memory profile run
    # SGLang's overlap scheduler; NOTE: the overlap worker's constructor is no overlap frame: a start-up traceback
    # passes it because the worker is built there (sglang#4489)
    "overlap": r"\b(event_loop_overlap\w*|forward_thread_func_?|TpModelWorkerClient"
               r'|tp_worker_overlap_thread\.py(?=", line \d+, in (?!__init__\b)))',
    # SGLang's start-up: the model runner built and initialized (weights, memory pool, CUDA graphs, torch.compile)
    "startup": r'\b(model_runner\.py)", line \d+, in (?:__init__|initialize|init_\w+)\b'
               r"|\b(torch/_dynamo|torch/_inductor)/",
    "async_scheduling": r"\b(AsyncScheduler|async_scheduler\.py|step_with_batch_queue|AsyncGPUModelRunnerOutput)",
    "sampler_warmup": r"\b_dummy_sampler_run\b",  # vLLM's sampler warm-up, at start-up after the graphs
    "graph_capture": r'\b(cuda_graph_runner\.py)", line \d+, in (?:__init__|capture)|\b(capture_model)\b',
}
# A PD-disaggregation KV transfer that rejects prefill and decode servers of different TP sizes, and the sizes
PD_TP = r"(?i)different TP sizes|(?:prefill|decode)\w{0,20}[ _]tp[ _]size\W{1,3}\d+"
PD_TP_SIZES = (r"(?i)prefill\w{0,20}[ _]tp[ _]size\W{1,3}(\d+)",
               r"(?i)(?:decode|dst)\w{0,20}[ _]tp[ _]size\W{1,3}(\d+)")
# vLLM refusing to start at a max seq len its KV cache cannot hold (V0: `The model's max seq len (N) is larger than
# the maximum number of tokens that can be stored in KV cache (M)`; V1: `... (X GiB KV cache is needed, which is
# larger than the available KV cache memory (Y GiB). Based on the available memory, the estimated maximum model
# length is E.`)
REFUSAL = {
    "asked": r"max seq len \((\d{1,12})\)",
    "stored": r"stored in KV cache \((\d{1,12})\)",
    "needed": r"\(([\d.]{1,20}) GiB KV cache is needed, which is larger than the available KV cache memory "
              r"\(([\d.]{1,20}) GiB\)",
    "estimated": r"estimated maximum model length is (\d{1,12})",
}
REFUSAL_SIZES = r"estimated maximum model length is \d|stored in KV cache \(\d|GiB KV cache is needed"
# vLLM refusing to start a hybrid (Mamba / linear-attention) model at more running requests than its state cache has
# blocks, one per request: `max_num_seqs (1024) exceeds available Mamba cache blocks (524)`
STATE_SLOTS = r"max_num_seqs \((\d{1,9})\) exceeds available Mamba cache blocks \((\d{1,9})\)"


class Refusal(NamedTuple):
    """vLLM's refusal to start at a max seq len its KV cache cannot hold: the max seq len `asked`, and the sizes
    printed with it: V1's `estimated` longest model length, V0's tokens the KV cache `stored`, the GiB one request
    `needed` and those `available` (None where not printed)."""

    asked: int
    estimated: int | None
    stored: int | None
    needed_gib: float | None
    available_gib: float | None


class ErrorText(NamedTuple):
    """What an error record's text says: its error lines' messages (`errors`, in order: a chained exception prints
    more than one; none where the record was cut before them), whether it was cut inside vLLM's KV cache memory
    check, `about_memory` (cut, or its last error line names memory), the `engine` its words or paths name, its
    `signs` by name (`SIGNS`: what of each its text shows), the mamba state pool out of slots (in an error line),
    the TP sizes a PD transfer rejected (`pd_tp`: prefill's, decode's; None where it is no such error), vLLM's
    max seq len `refusal`, whether refusal sizes are printed (read or not), and the running requests asked for
    and the state blocks a hybrid model's cache has (`state_slots`; None where it is no such refusal)."""

    errors: tuple[str, ...]
    in_kv_check: bool
    about_memory: bool
    engine: str | None
    signs: Mapping[str, tuple[str, ...]]
    mamba_pool_full: bool
    pd_tp: tuple[int | None, int | None] | None
    refusal: Refusal | None
    sizes_printed: bool
    state_slots: tuple[int, int] | None = None

    @property
    def cut(self) -> bool:
        return not self.errors

    @property
    def error(self) -> str | None:
        """The message of its last error line."""
        return self.errors[-1] if self.errors else None


_ERROR_LINE = re.compile(ERROR_LINE, re.M)
_MAMBA_POOL_FULL = re.compile(MAMBA_POOL_FULL)
_KV_MEMORY_CHECK = re.compile(KV_MEMORY_CHECK)
_MEMORY_WORDS = re.compile(MEMORY_WORDS)
_ENGINE_WORDS = {engine: re.compile(words) for engine, words in ENGINE_WORDS.items()}
_SIGNS = {name: re.compile(pattern) for name, pattern in SIGNS.items()}
_PD_TP = re.compile(PD_TP)
_PD_TP_SIZES = tuple(re.compile(pattern) for pattern in PD_TP_SIZES)
_REFUSAL = {name: re.compile(pattern) for name, pattern in REFUSAL.items()}
_REFUSAL_SIZES = re.compile(REFUSAL_SIZES)
_STATE_SLOTS = re.compile(STATE_SLOTS)


@functools.lru_cache(maxsize=1024)
def read_error(text: str) -> ErrorText:
    """What an error record's text says (read once per text)."""
    errors = tuple(_ERROR_LINE.findall(text))
    signs = {name: found for name, pattern in _SIGNS.items() if (found := _named(pattern, text))}
    return ErrorText(
        errors=errors,
        in_kv_check=cut_in_kv_check(text),
        about_memory=not errors or _MEMORY_WORDS.search(errors[-1]) is not None,
        engine=next((engine for engine, words in _ENGINE_WORDS.items() if words.search(text)), None),
        signs=signs,
        mamba_pool_full=any(_MAMBA_POOL_FULL.search(line) for line in errors),
        pd_tp=_pd_tp(text),
        refusal=_refusal(text),
        sizes_printed=_REFUSAL_SIZES.search(text) is not None,
        state_slots=_state_slots(text),
    )


def _state_slots(text: str) -> tuple[int, int] | None:
    m = _STATE_SLOTS.search(text)
    return (int(m.group(1)), int(m.group(2))) if m else None


def _pd_tp(text: str) -> tuple[int | None, int | None] | None:
    if _PD_TP.search(text) is None:
        return None
    prefill, decode = (_number(pattern, text, int) for pattern in _PD_TP_SIZES)
    return prefill, decode  # type: ignore[return-value]


def _named(pattern: re.Pattern[str], text: str) -> tuple[str, ...]:
    found = (m if isinstance(m, str) else next(filter(None, m)) for m in pattern.findall(text))
    return tuple(dict.fromkeys(found))


def _number(pattern: re.Pattern[str], text: str, kind: type, group: int = 1) -> int | float | None:
    m = pattern.search(text)
    try:
        return kind(m.group(group)) if m is not None else None
    except ValueError:
        return None


def _refusal(text: str) -> Refusal | None:
    asked = _number(_REFUSAL["asked"], text, int)
    if asked is None:
        return None
    estimated, stored = (_number(_REFUSAL[name], text, int) for name in ("estimated", "stored"))
    needed, available = (_number(_REFUSAL["needed"], text, float, group) for group in (1, 2))
    return Refusal(asked, estimated, stored, needed, available)  # type: ignore[arg-type]


def error_lines(text: str) -> list[str]:
    """The messages of an exception's error lines (`RuntimeError: ...` -> `...`), in order."""
    return _ERROR_LINE.findall(text)


def error_line(text: str) -> str | None:
    """The message of the last error line of an exception's text, None when the text holds none (a traceback cut
    before it)."""
    found = error_lines(text)
    return found[-1] if found else None


def error_kinds(text: str) -> list[str]:
    """The error kinds (`ERROR_KINDS`) named by the error lines of an exception's text; a text cut before any
    inside vLLM's KV cache memory check is `not_enough_memory` (`cut_in_kv_check`)."""
    found: list[str] = []
    for said in _ERROR_LINE.findall(text):
        kind = kind_of(said)
        if kind in ERROR_KINDS and kind not in found:
            found.append(kind)
    if not found and cut_in_kv_check(text):
        found.append("not_enough_memory")
    return found


def cut_in_kv_check(text: str) -> bool:
    """Whether an exception's text holds no error line and ends in vLLM's KV cache memory check (its last frame,
    or the call into it on its last line)."""
    return error_line(text) is None and _KV_MEMORY_CHECK.search("\n".join(text.rsplit("\n", 2)[-2:])) is not None


# -- fields ---------------------------------------------------------------------------------------------------

_OOM_NUMBERS = {
    "requested": re.compile(r"Try to allocate (\d+)"),
    "available_tokens": re.compile(r"Ava(?:ilable|liable) tokens: (\d+)"),
    "available_size": re.compile(r"available_size(?:\(\))?=(\d+)"),
    "evictable_size": re.compile(r"evictable_size(?:\(\))?=(\d+)"),
}
_OOM_PHASE = re.compile(r"(Prefill|Decode) out of memory")
# torch's own accounting in a CUDA OOM: before 2.1 `(GPU 0; 10.73 GiB total capacity; 9.85 GiB already allocated;
# 46.44 MiB free; 9.86 GiB reserved in total by PyTorch)`; since `GPU 0 has a total capac(i)ty of 23.64 GiB of which
# 1.42 GiB is free. [Including non-PyTorch memory, ]this process has 22.22 GiB memory in use.`
_SIZE = r"([\d.]+) (GiB|MiB|KiB|bytes)"
_TORCH_OOM = {
    "device_total_gb": re.compile(_SIZE + r" total capacity|total capac(?:i)?ty of " + _SIZE),
    "device_free_gb": re.compile(_SIZE + r" free\b|of which " + _SIZE + r" is free"),
    "process_gb": re.compile(r"this process has " + _SIZE + r" memory in use|" + _SIZE + r" reserved in total by PyTorch"),
}
_GIB = {"GiB": 1.0, "MiB": 1 / 1024, "KiB": 1 / 1024**2, "bytes": 1 / 1024**3}


def _oom(text: str) -> dict[str, Value]:
    m = _OOM_PHASE.search(text)
    out: dict[str, Value] = {"phase": m.group(1).lower() if m else "unknown"}
    for key, pattern in _OOM_NUMBERS.items():
        found = pattern.search(text)
        if found:
            out[key] = int(found.group(1))
    for key, pattern in _TORCH_OOM.items():
        found = pattern.search(text)
        if found:
            amount, unit = [g for g in found.groups() if g is not None][:2]
            out[key] = round(float(amount) * _GIB[unit], 3)
    return out


_WATCHDOG_NAME = re.compile(r"(\w{1,40}) watchdog timeout")
_SOFT = re.compile(r"soft=(True|False)")


def _watchdog(text: str) -> dict[str, Value]:
    out = {k: v for k, v in assignments(text).items() if k == "watchdog_timeout"}
    name = _WATCHDOG_NAME.search(text)
    out["component"] = name.group(1) if name else "Scheduler"
    soft = _SOFT.search(text)
    if soft:
        out["soft"] = soft.group(1) == "True"
    return out


_RAISED = re.compile(r"^\s*([\w.]{0,80}(?:Error|Exception|Interrupt|Exit)\b.*)$", re.M)  # the error it raised
_COMPONENT = re.compile(r"(\w{1,40}) hit an exception")


def _exception(text: str) -> dict[str, Value]:
    errors = _RAISED.findall(text)
    component = _COMPONENT.search(text)
    first = text.strip().splitlines()[0] if text.strip() else ""
    out: dict[str, Value] = {
        "component": component.group(1) if component else "",
        "error": errors[-1].strip() if errors else first.strip(),
    }
    if _OOM_PHASE.search(text):
        out["oom_phase"] = _oom(text)["phase"]
    return out


# vLLM's start-up refusal (`VLLM_FREE_MEMORY`): another process holds GPU memory, or the utilization asks for more
# than the device has free
_FREE_ON_DEVICE = re.compile(VLLM_FREE_MEMORY + r"([\d.]{1,12})/([\d.]{1,12}) GiB\) on startup is less than "
                             r"desired GPU memory utilization \(([\d.]{1,12}), ([\d.]{1,12}) GiB\)")
_FREE_FIELDS = ("free_gb", "total_gpu_memory_gb", "gpu_memory_utilization", "asked_gb")


def _not_enough_memory(text: str) -> dict[str, Value]:
    out: dict[str, Value] = {"message": text.strip()}
    m = _FREE_ON_DEVICE.search(text)
    if m is not None:
        for name, number in zip(_FREE_FIELDS, m.groups()):
            out[name] = value(number)
    return out


_MESSAGE = {"message": str}
FIELDS: dict[str, Fields] = {
    "oom": Fields(_oom, {"phase": str} | dict.fromkeys(_OOM_NUMBERS, int) | dict.fromkeys(_TORCH_OOM, float)),
    "exception": Fields(_exception, {"component": str, "error": str, "oom_phase": str}),
    "not_enough_memory": Fields(_not_enough_memory, _MESSAGE | dict.fromkeys(_FREE_FIELDS, Number)),
    "leak": Fields(assignments, {}, open=True),  # `available_size=..., evictable_size=..., ...`
    "watchdog": Fields(_watchdog, {"watchdog_timeout": Number, "component": str, "soft": bool}),
    "sigquit": Fields(message, _MESSAGE),
    "engine_dead": Fields(message, _MESSAGE),
    "stop": Fields(message, _MESSAGE),
    "graph_failed": Fields(message, _MESSAGE),
}
