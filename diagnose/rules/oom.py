"""Hard out-of-memory errors and start-up memory errors (docs/log-formats.md §6.2, §9.5).

- `oom.prefill` (critical, any count): lower `--chunked-prefill-size` (to 4096, or half of a smaller value).
- `oom.decode` (critical, any count): lower `--max-running-requests` (to 3/4 of the p90 batch before the OOM).
- `oom.graph_capture` (critical): a CUDA out-of-memory error while capturing CUDA graphs (its traceback names the
  capture, or SGLang's `Capture cuda graph begin` has no end before it): halve the captured maximum
  (`--cuda-graph-max-bs`, vLLM `--max-cudagraph-capture-size`); or lower the memory fraction by 0.05, or turn
  graphs off (`--disable-cuda-graph`, vLLM `--enforce-eager`).
- `oom.weights` (critical): a CUDA out-of-memory error while the model loaded (the traceback before or just after
  it names `load_model`, `load_weights`, the model loader): more tensor parallelism, or a quantized model; no
  memory fraction helps.
- `oom.before_cache` (critical): a CUDA out-of-memory error whose own accounting (torch's: total capacity, what this
  process held) shows a vLLM process holding `WHOLE_DEVICE` of the device or more after the engine was seen
  starting (a launch command, its configuration, its weights loading) and before any KV cache was sized or it served
  (vllm#188: 9.86 of 10.73 GiB): the weights and the profiling forward over the longest batch need more than the
  device; more tensor parallelism or a quantized model, a shorter context where the weights fit. No memory
  fraction helps (vLLM sizes the cache last, from what they left).
- `oom.full_precision` (critical): a CUDA out-of-memory error (not in graph capture) while the model runs in float32
  (read from the log or the launch command pasted with it, vllm#2140): `--dtype auto`, the checkpoint's half
  precision, where float32 was asked for (`--dtype float`), else `--dtype bfloat16`; it replaces `oom.weights` and
  `oom.other` for those errors.
- `oom.other` (critical): a CUDA out-of-memory error at run time: lower the static memory fraction by 0.05
  (SGLang `--mem-fraction-static`, vLLM `--gpu-memory-utilization`) so activations have room; when the
  sampler or LoRA ran out, a lower running cap (`--max-running-requests`, vLLM `--max-num-seqs`) is the
  alternative.
- `oom.startup` (critical): no room for the KV cache at start-up (SGLang `Not enough memory`; vLLM `No available
  memory for the cache blocks`, `# GPU blocks: 0`, a KV cache memory <= 0 GiB after profiling): raise the
  memory fraction (+0.05). vLLM's max seq len errors (`The model's max seq len (N) is larger than ... KV cache
  (M)`, `To serve at least one request with the model's max seq len (N)`): lower `--max-model-len` to what fits
  (`diagnose.rules.kv_fit`), or raise `--gpu-memory-utilization` instead. V0 checks the max seq len against the
  GPU blocks it has just printed (`# GPU blocks: N`, N x `BLOCK_SIZE` tokens unless the log prints another block
  size): where the log's max seq len is larger, or the traceback right after the blocks is that check
  (`initialize_cache`, `raise_if_cache_size_invalid`) with its error line cut, the same advice. Where vLLM's memory
  profile shows an activation peak of `PEAK_SHARE` of its budget or more, a shorter `--max-model-len` is the
  alternative (vllm#13882). SGLang's start-up crash (its error line cut, or naming memory) after weights that left
  at most `1 - WEIGHTS_FILL` of the GPU and less than a known static fraction keeps back, before any pool
  (sglang#485): a static fraction above what the weights leave, or more GPUs.
"""
from __future__ import annotations

from typing import Literal

import numpy as np

from toolkit.diagnose.findings import Current, Finding, evidence_events
from toolkit.diagnose.read.events import Event
from toolkit.diagnose.rules.context import (SAME_FAILURE_LINES, STEP, Context, capturing_at, first_load_after,
                                            memory_fraction, no_cache_rows)
from toolkit.diagnose.rules.kv_fit import KvFit, kv_fit, rounded_down
from toolkit.diagnose.vocabulary import Change

PREFILL_TARGET = 4096
MIN_CHUNK = 1024
NEAR = 200  # lines: an error record this close before an OOM line is its traceback
# NOTE: an OOM's advice may take the static fraction past the load rules' MAX_FRACTION (rules.context): the
# pool sizing it fixes failed at start-up or in a rare peak, not under the steady load those rules read
OOM_MAX_FRACTION = 0.98
BLOCK_SIZE = 16  # vLLM's KV block on GPUs (tokens), where the log does not print `block_size`
FULL_PRECISION = ("float", "float32", "fp32")  # as `--dtype` and the logs (after `torch.`) spell float32
_MEMORY_FACTS = ("device_blocks", "kv_cache_gb", "total_gpu_memory_gb", "gpu_memory_utilization", "activation_peak_gb")
_SAID = {"not_enough_memory": "no available memory for the cache blocks", "gpu_blocks": "0 GPU blocks",
         "kv_memory": "available KV cache memory <= 0", "memory_profile": "KV cache size <= 0 after profiling"}


def check(ctx: Context) -> list[Finding]:
    by_phase: dict[str, list[Event]] = {}
    for e in ctx.timeline.kind("oom"):
        by_phase.setdefault(str(e.fields.get("phase")), []).append(e)
    out = []
    if "prefill" in by_phase:
        out.append(_prefill(ctx, by_phase.pop("prefill")))
    if "decode" in by_phase:
        out.append(_decode(ctx, by_phase.pop("decode")))
    other = [e for rows in by_phase.values() for e in rows]
    capture = [e for e in other if _shows("capture", _around(ctx, e)) or capturing_at(ctx, e)]
    if capture:
        out.append(_capture(ctx, capture))
    other = [e for e in other if e not in capture]
    if other and _float32(ctx.config.dtype):
        out.append(_full_precision(ctx, other))
        other = []
    loading = [e for e in other if _shows("loading", _around(ctx, e, after=True))]
    if loading:
        out.append(_loading(ctx, loading))
    other = [e for e in other if e not in loading]
    early = [e for e in other if _before_cache(ctx, e)]
    if early:
        out.append(_outgrown(ctx, early))
    other = [e for e in other if e not in early]
    if other:
        out.append(_other(ctx, other))
    start = sorted(ctx.timeline.kind("not_enough_memory") + no_cache_rows(ctx), key=lambda e: e.line)
    if start:
        out.append(_startup(ctx, start))
    elif (crash := _weights_fill(ctx)) is not None:
        out.append(_no_pool_left(ctx, *crash))
    elif (blocks := _blocks_fit(ctx)) is not None:
        out.append(_context_fit(ctx, *blocks))
    return out


WEIGHTS_FILL = 0.88  # SGLang: weights taking more of the GPU than this leave less than its static fraction's reserve


def _weights_fill(ctx: Context) -> tuple[list[Event], float, float] | None:
    """SGLang's start-up crash after weights that left less than `1 - WEIGHTS_FILL` of the GPU free, before any
    KV pool (sglang#485: 5.59 of 78.81 GB left, its error line cut), where the static fraction (if the log gives
    it) is below what the weights leave room for and the crash's error line is cut or names memory: (the weights'
    lines and the crash, the least memory left on a rank, the memory before the weights)."""
    cfg, tl = ctx.config, ctx.timeline
    loaded = [e for e in tl.kind("load_end") if isinstance(e.fields.get("avail_mem"), float)]
    if cfg.vllm or not loaded or not cfg.gpu_mem_gb:
        return None
    source, after = loaded[-1].source, loaded[-1].line
    if any(e.source == source and e.line > after
           for kind in ("kv_alloc", "pool", "pool_end", "decode", "prefill") for e in tl.kind(kind)):
        return None
    crash = [e for e in tl.kind("exception") if e.source == source and e.line > after][:1]
    left = min(float(e.fields["avail_mem"]) for e in loaded if e.source == source)  # type: ignore[arg-type]
    if not crash or left > (1 - WEIGHTS_FILL) * cfg.gpu_mem_gb or not crash[0].error.about_memory:
        return None
    fraction = now.value if (now := memory_fraction(cfg)) is not None else None
    if fraction is not None and fraction > 1 - left / cfg.gpu_mem_gb:
        return None  # NOTE: its reserve fitted what the weights left: something else failed
    return [e for e in loaded if e.source == source] + crash, left, cfg.gpu_mem_gb



def _no_pool_left(ctx: Context, rows: list[Event], left: float, before: float) -> Finding:
    quoted = memory_fraction(ctx.config)
    fraction = quoted.value if quoted is not None else None
    needed = 1 - left / before  # NOTE: the static fraction above which anything is left for the pool
    change = Change("kv_memory", f"{min(OOM_MAX_FRACTION, max(needed + 0.02, (fraction or 0) + STEP)):.2f}")
    return Finding(
        id="oom.startup", severity="critical", title="The weights left no room for a KV cache at start-up",
        message=f"After the weights only {left:.2f} of {before:.2f} GB were free ({left / before:.0%}), and start-up "
        f"failed before a KV pool was made: the memory SGLang keeps back ({ctx.config.flag('kv_memory')} leaves "
        f"1 - fraction of the GPU to activations) was more than what was left, unless the fraction is above "
        f"{needed:.2f}.", evidence=evidence_events(rows, left_gb=left, before_weights_gb=before), change=change,
        current=quoted,
        tradeoff="A fraction this high leaves little for activations (large prefills may run out of memory); more GPUs "
        "(tensor parallelism) or a quantized model leave room for both.", alternatives=(Change("tp", direction=1),))


def _blocks_fit(ctx: Context) -> tuple[list[Event], KvFit] | None:
    """The context vLLM's GPU blocks hold, where the log shows that it did not hold the max seq len: the max seq
    len it prints is larger, or the traceback right after the blocks line is the check that compares them."""
    cfg = ctx.config
    tl = ctx.timeline
    if not cfg.vllm:
        return None
    rows = [e for e in tl.kind("gpu_blocks")
            if e.fields.get("device") == "gpu" and isinstance(e.fields.get("device_blocks"), int)]
    if not rows or first_load_after(ctx, rows[-1].line, rows[-1].source) is not None:  # NOTE: it started
        return None
    blocks = rows[-1]
    size = int(cfg.arg("block_size") or BLOCK_SIZE)  # type: ignore[call-overload]
    tokens = int(blocks.fields["device_blocks"]) * size  # type: ignore[call-overload]
    near = [e for kind in ("oom", "not_enough_memory") for e in tl.kind(kind)
            if e.source == blocks.source and 0 < e.line - blocks.line <= 2 * SAME_FAILURE_LINES]
    check = [e for e in tl.kind("exception") if e.source == blocks.source and not near
             and 0 < e.line - blocks.line <= SAME_FAILURE_LINES and "cache_check" in e.error.signs
             and e.error.cut]  # NOTE: an error line names its own cause (an OOM in capture_model)
    asked = cfg.context_len or 0
    if not (asked > tokens or (check and not asked)):
        return None
    how = f"its {blocks.fields['device_blocks']} GPU blocks of {size} tokens hold {tokens}"
    return [blocks, *check], KvFit(asked, rounded_down(tokens), how)


def _other(ctx: Context, rows: list[Event]) -> Finding:
    sampler = any(_shows("sampler", _around(ctx, e)) for e in rows)
    if any(_shows("wake", _around(ctx, e)) for e in rows):
        said = ("The engine ran out of memory in the allocator that lets it release memory for another process and "
                "take it back (vLLM's sleep mode, SGLang's memory saver): the other process on the GPU, in a "
                "colocated RL set-up the trainer, still held memory; a smaller static share needs less of it.")
    else:
        said = ("The device ran out of memory while serving: the static memory (weights, KV cache, graphs) left too "
                "little for activations" + (" (the sampler's or LoRA's buffers grow with the running batch)."
                                            if sampler else "."))
    return Finding(
        id="oom.other", severity="critical", title=f"Out of memory ({len(rows)}x)", message=said,
        evidence=evidence_events(rows), change=_kv_memory(ctx, -1), current=memory_fraction(ctx.config),
        tradeoff="A smaller KV cache holds fewer tokens: fewer concurrent requests.",
        alternatives=(Change("running_cap", direction=-1),) if sampler else ())


WHOLE_DEVICE = 0.85  # an OOM where the process already holds this share of the device (torch's own accounting)
# what shows a vLLM engine starting (a pasted launch command, its configuration, its weights loading), and what it
# prints once a KV cache was sized or it serves: an OOM after the first and before all of the second came first
STARTING = frozenset({"launch_command", "engine_config", "engine_args", "weights_loaded"})
CACHE_SIZED = frozenset({"kv_capacity", "gpu_blocks", "kv_memory", "graph_captured"})
SERVING = ("decode", "prefill", "stats")


def _before_cache(ctx: Context, e: Event) -> bool:
    """vLLM sizes its KV cache last, from what the weights and a profiling forward left of its share: an OOM with the
    process holding nearly the whole device, after the engine was seen starting and before any cache was sized,
    came before the cache (SGLang's pool is a fixed share taken at start-up: its OOMs there are the share's)."""
    total, held = e.fields.get("device_total_gb"), e.fields.get("process_gb")
    if not (ctx.config.vllm and _is_number(total) and _is_number(held) and total > 0
            and held >= WHOLE_DEVICE * total):
        return False
    mine = [x for kind in STARTING | CACHE_SIZED for x in ctx.timeline.kind(kind) if x.source == e.source
            and x.line < e.line]
    started = [x.line for x in mine if x.kind in STARTING]
    if not started:
        return False
    start = min(started)
    sized = any(x.kind in CACHE_SIZED and x.line > start for x in mine)
    return not sized and not any(
        np.any((rows["source"] == e.source) & (rows["line"] > start) & (rows["line"] < e.line))
        for rows in (ctx.timeline.series(kind) for kind in SERVING) if len(rows))


def _outgrown(ctx: Context, rows: list[Event]) -> Finding:
    """What comes before the KV cache (the weights, then the profiling forward over the longest batch) needs more
    than the device: no memory fraction helps, it shares out what is left after them."""
    e = rows[0]
    total, held = e.fields["device_total_gb"], e.fields["process_gb"]
    cfg = ctx.config
    return Finding(
        id="oom.before_cache", severity="critical", title=f"Out of memory before a KV cache was sized ({len(rows)}x)",
        message=f"When the device ran out this process already held {held:.2f} of its {total:.2f} GiB, and nothing "
        "before it sized a KV cache: what comes first (the weights, then the forward that profiles the longest "
        "batch) needs more than the device has. A lower memory fraction does not help, it shares out what is left "
        "after them.", evidence=evidence_events(rows, process_gb=held, device_total_gb=total),
        change=Change("tp", direction=1), current=Current.of(cfg.tp_size) if cfg.parallelism_source != "default" else None,
        tradeoff="More GPUs per replica (or a quantized model) make room for the weights; where the weights fit and the "
        "profiling forward does not, a shorter context (a smaller longest batch) is enough.",
        ranks=tuple(sorted({x.rank for x in rows if x.rank})),
        alternatives=(Change("quantization"), Change("context", direction=-1)))


def _capture(ctx: Context, rows: list[Event]) -> Finding:
    cap = ctx.config.cuda_graph_max_bs
    return Finding(
        id="oom.graph_capture", severity="critical", title=f"Out of memory while capturing CUDA graphs ({len(rows)}x)",
        message=f"Capturing CUDA graphs for batches up to {cap or '?'} ran out of memory: every captured size keeps "
        "its own buffers, on top of the KV cache already allocated.",
        evidence=evidence_events(rows, cuda_graph_max_bs=cap),
        change=Change("graph_max_bs", str(max(1, cap // 2))) if cap else Change("graph_max_bs", direction=-1),
        current=Current.of(cap) if cap else None,
        tradeoff="Batches above the new maximum decode without graphs (slower); a smaller KV cache instead holds fewer "
        "tokens; no graphs at all slows every decode step.",
        ranks=tuple(sorted({e.rank for e in rows})),
        alternatives=(_kv_memory(ctx, -1, alternative=True), Change("graphs_off", True)))


def _around(ctx: Context, e: Event, after: bool = False) -> list[Event]:
    """The OOM and the error record right before it (the traceback an OOM line broke away from); `after`: also the
    one right after it (another worker's traceback of the same failure, vllm#14095)."""
    rows = [x for x in ctx.timeline.kind("exception") if x.source == e.source]
    before = [x for x in rows if 0 < e.line - x.line <= NEAR][-1:]
    later = [x for x in rows if 0 < x.line - e.line <= SAME_FAILURE_LINES][:1] if after else []
    return [*before, e, *later]


def _shows(sign: str, records: list[Event]) -> bool:
    """Whether any of the records shows `sign` (`diagnose.read.errors.SIGNS`: where it ran, what it hit)."""
    return any(sign in x.error.signs for x in records)


def _float32(dtype: object) -> bool:
    return str(dtype).removeprefix("torch.") in FULL_PRECISION


def _full_precision(ctx: Context, rows: list[Event]) -> Finding:
    """The model runs in float32 (`--dtype float`, vllm#2140): its weights take twice the checkpoint's half
    precision, before any KV cache or activation."""
    cfg = ctx.config
    dtype, asked = cfg.dtype, cfg.value("dtype")
    # NOTE: asked for (`--dtype float`): `auto` is the checkpoint's half precision (both engines load a float32
    # checkpoint in float16 under it); float32 under `auto` (a float32 checkpoint on an engine that keeps it,
    # as ours does): half precision explicitly
    explicit = _float32(asked)
    return Finding(
        id="oom.full_precision", severity="critical", title=f"Out of memory with the model in float32 ({len(rows)}x)",
        message=f"The device ran out of memory while the model runs in float32 (dtype {dtype}): its weights take twice "
        "the memory of half precision (bfloat16 or float16), and no memory fraction makes room for that.",
        evidence=evidence_events(rows, dtype=dtype), change=Change("dtype", "auto" if explicit else "bfloat16"),
        current=Current.of(asked) if asked else Current.of(dtype) if dtype else None,
        tradeoff=("auto loads the checkpoint's own half precision (float16 on GPUs without bfloat16)" if explicit else
         "bfloat16 needs a GPU that has it (float16 otherwise)") + "; float32 rarely changes the output of a model "
        "trained in half precision.", ranks=tuple(sorted({e.rank for e in rows if e.rank})))


def _loading(ctx: Context, rows: list[Event]) -> Finding:
    """The weights did not fit while the model loaded: no memory fraction helps (the weights come first)."""
    cfg = ctx.config
    return Finding(
        id="oom.weights", severity="critical", title=f"Out of memory while loading the weights ({len(rows)}x)",
        message="A device ran out of memory while the model loaded: its share of the weights does not fit. A lower "
        "memory fraction does not help (the weights come before the KV cache); split them over more GPUs, or "
        "load a quantized (or smaller) model.", evidence=evidence_events(rows), change=Change("tp", direction=1),
        current=Current.of(cfg.tp_size) if cfg.parallelism_source != "default" else None,
        tradeoff="More GPUs per replica: fewer replicas on the same machines; a quantized model can cost accuracy.",
        ranks=tuple(sorted({e.rank for e in rows if e.rank})), alternatives=(Change("quantization"),))


def _startup(ctx: Context, rows: list[Event]) -> Finding:
    slots = next((e.error.state_slots for e in rows if e.error.state_slots is not None), None)
    if slots is not None:
        return _state_slots(ctx, rows, *slots)
    short = next((e for e in rows if all(_is_number(e.fields.get(k)) for k in _FREE_FACTS)), None)
    if short is not None:
        return _less_free_than_asked(ctx, rows, short.fields)
    fit = next((f for e in rows if (f := kv_fit(e.error.refusal)) is not None), None)
    if fit is not None:
        return _context_fit(ctx, rows, fit)
    asked = next((e.error.refusal.asked for e in rows if e.error.refusal is not None), None)
    if asked is not None:
        return _context_refused(ctx, rows, asked)
    change, quoted = _kv_memory(ctx, 1), memory_fraction(ctx.config)
    if ctx.config.vllm:
        facts = {k: v for e in rows + ctx.timeline.kind("memory_profile") for k, v in e.fields.items()
                 if k in _MEMORY_FACTS}
        peak, shorter = _activation_peak(ctx, facts)
        if not shorter and any(e.error.in_kv_check for e in rows):
            peak += (" The traceback was cut inside vLLM's KV cache memory check, which also refuses a max model len "
                     "that the KV cache cannot hold one request of: a shorter one is the other way.")
            shorter = (Change("context", direction=-1),)
        return Finding(
            id="oom.startup", severity="critical", title="No memory left for the KV cache at start-up",
            message="vLLM found no room for KV cache blocks after the weights and the profiled activation peak "
            f"({_said(rows)}): {ctx.config.flag('kv_memory')} is the share of the GPU it may use, and it was used "
            f"up before the cache.{peak}", evidence=evidence_events(rows, **facts), change=change, current=quoted,
            tradeoff="Less memory left for other processes on the GPU; if the weights alone do not fit, use more GPUs "
            "(tensor parallelism) or a quantized model.", alternatives=shorter)
    return Finding(
        id="oom.startup", severity="critical", title="Not enough memory for the KV cache at start-up",
        message="The weights left no room for a KV cache at the given memory fraction.", evidence=evidence_events(rows),
        change=change, current=quoted,
        tradeoff="Less headroom for activations; if it still fails, use more GPUs (tensor parallelism) or a smaller "
        "dtype.")


_FREE_FACTS = ("free_gb", "total_gpu_memory_gb", "gpu_memory_utilization")  # vLLM's `Free memory on device`
PEAK_SHARE = 0.15  # an activation peak above this share of vLLM's budget is worth making smaller


def _activation_peak(ctx: Context, facts: dict) -> tuple[str, tuple[Change, ...]]:
    """Where vLLM's memory profile shows an activation peak of at least `PEAK_SHARE` of its budget (vllm#13882:
    1.42 of 5.60 GiB): a sentence on it, and a shorter max model len as the alternative (the profile run's batch
    is the most tokens a step may take: the max model len where chunked prefill is off, V0's default)."""
    peak, total, util = (facts.get(k) for k in ("activation_peak_gb", "total_gpu_memory_gb", "gpu_memory_utilization"))
    if not (_is_number(peak) and _is_number(total) and _is_number(util)) or peak < PEAK_SHARE * total * util:
        return "", ()
    length = ctx.config.context_len
    shorter = Change("context", str(length // 2)) if length and length >= 2048 else Change("context", direction=-1)
    return (f" The profile run's activation peak took {peak:g} of the {total * util:.2f} GiB it may use: a shorter "
            f"{ctx.config.flag('context')} makes the profiled batch, and that peak, smaller."), (shorter,)


def _is_number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _less_free_than_asked(ctx: Context, rows: list[Event], said: dict) -> Finding:
    """vLLM refused to start: less GPU memory was free than `--gpu-memory-utilization` x the device asks for. The
    share that fits what was free, rounded down to a hundredth (vLLM's check is `free < utilization x total`)."""
    free, total = float(said["free_gb"]), float(said["total_gpu_memory_gb"])
    util = float(said["gpu_memory_utilization"])
    fits = int(free / total * 100) / 100 if total > 0 else 0.0
    change = Change("kv_memory", f"{fits:.2f}") if 0 < fits < util else Change("kv_memory", direction=-1)
    name = ctx.config.flag("kv_memory")
    return Finding(
        id="oom.startup", severity="critical", title="Less GPU memory free than the engine asks for at start-up",
        message=f"{free:g} of {total:g} GiB were free when the engine started, and {name} {util:g} asks for "
        f"{said['asked_gb']} GiB: another process holds GPU memory (or the device is shared), so the engine refused "
        "to start.",
        evidence=evidence_events(rows, free_gb=free, total_gpu_memory_gb=total, gpu_memory_utilization=util),
        change=change, current=Current.of(util),
        tradeoff="A smaller share leaves a smaller KV cache (fewer concurrent requests); freeing what the other "
        "process holds keeps the share.")


def _context_fit(ctx: Context, rows: list[Event], fit: KvFit) -> Finding:
    context = ctx.config.context_len or fit.asked or None
    full = f"the full context ({context} tokens)" if context else "the full context (its length not in the log)"
    return Finding(
        id="oom.startup", severity="critical", title="The KV cache cannot hold one request at max_model_len",
        message=f"vLLM needs room for one request at {full} and {fit.how}: {fit.fits} tokens fit in the memory left "
        "for the KV cache.", evidence=evidence_events(rows, max_model_len=context, fits=fit.fits),
        change=Change("context", str(fit.fits)), current=Current.of(context) if context else None,
        tradeoff=f"Requests longer than {fit.fits} tokens are rejected; more KV memory "
        f"({ctx.config.flag('kv_memory')}, or an fp8 KV cache) keeps more of the context instead.",
        alternatives=(_kv_memory(ctx, 1, alternative=True),))


def _state_slots(ctx: Context, rows: list[Event], asked: int, blocks: int) -> Finding:
    """A hybrid model's state cache (one block per running request) holds fewer requests than the running cap."""
    return Finding(
        id="oom.startup", severity="critical", title="More running requests than state cache blocks at start-up",
        message=f"The model keeps one state block per running request and its cache has {blocks}, fewer than the "
        f"{asked} requests {ctx.config.flag('running_cap')} lets run, so the engine refused to start.",
        evidence=evidence_events(rows, max_num_seqs=asked, state_blocks=blocks),
        change=Change("running_cap", str(blocks)), current=Current.of(asked),
        tradeoff=f"Fewer requests run at once; more memory ({ctx.config.flag('kv_memory')}) gives the state cache "
        "more blocks instead.", alternatives=(_kv_memory(ctx, 1, alternative=True),))


def _context_refused(ctx: Context, rows: list[Event], asked: int) -> Finding:
    """vLLM's max seq len refusal without sizes read: the excerpt cut it before them, or they are not in a form
    `kv_fit` reads."""
    sizes = ("its sizes are not in a form read here" if any(e.error.sizes_printed for e in rows)
             else "the excerpt ends before the sizes that say how many tokens fit")
    return Finding(
        id="oom.startup", severity="critical", title="The KV cache cannot hold one request at max_model_len",
        message=f"vLLM needs room for one request at the full context ({asked} tokens) and refused to start; {sizes}.",
        evidence=evidence_events(rows, max_model_len=asked), change=Change("context", direction=-1),
        current=Current.of(asked),
        tradeoff=f"Requests longer than the shorter max model len are rejected; more KV memory "
        f"({ctx.config.flag('kv_memory')}, or an fp8 KV cache) keeps the context instead.",
        alternatives=(_kv_memory(ctx, 1, alternative=True),))


def _kv_memory(ctx: Context, direction: Literal[-1, 1], alternative: bool = False) -> Change:
    """The static memory fraction STEP lower or higher (at most OOM_MAX_FRACTION), or only the direction when it is
    unknown. An `alternative` carries no current value of its own: it moves by a value only from a fraction the log
    states, not from the engine's default (a wrapper that sets its own, QAnything's 0.33 or another's 0.98, would
    read `0.95` as the wrong way), so from a default it says only which way."""
    now = memory_fraction(ctx.config)
    if now is None or not now.value or (alternative and ctx.config.mem_fraction_static is None):
        return Change("kv_memory", direction=direction)
    return Change("kv_memory", f"{min(OOM_MAX_FRACTION, now.value + STEP * direction):.2f}")  # type: ignore[operator]


def _said(rows: list[Event]) -> str:
    kinds = {e.kind for e in rows}
    said = [words for kind, words in _SAID.items() if kind in kinds]
    return ", ".join(said) or "the engine said so"


def _prefill(ctx: Context, rows: list[Event]) -> Finding:
    current = ctx.config.chunked_prefill_size
    suggested = PREFILL_TARGET if not current or current > PREFILL_TARGET else max(MIN_CHUNK, current // 2)
    fields = rows[0].fields
    return Finding(
        id="oom.prefill", severity="critical", title=f"Out of memory in prefill ({len(rows)}x)",
        message=f"A prefill batch asked for {fields.get('requested', '?')} KV slots with "
        f"{fields.get('available_tokens', '?')} available. Smaller chunks bound the tokens one prefill needs.",
        evidence=evidence_events(rows, requested=fields.get("requested"), available=fields.get("available_tokens")),
        change=Change("prefill_budget", str(suggested)), current=Current.of(current) if current else None,
        tradeoff="Long prompts take more, smaller prefill steps: slightly lower input throughput.",
        ranks=tuple(sorted({e.rank for e in rows})))


def _decode(ctx: Context, rows: list[Event]) -> Finding:
    cap = ctx.config.max_running_requests
    decode = ctx.timeline.series("decode")
    first = min(e.line for e in rows)
    before = decode.where(decode["line"] < first)["running_req"]
    before = before[~np.isnan(before)]
    p90 = float(np.quantile(before, 0.9)) if len(before) else None
    suggested = int(0.75 * p90) if p90 else (cap // 2 if cap else None)
    return Finding(
        id="oom.decode", severity="critical", title=f"Out of memory in decode ({len(rows)}x)",
        message="A decode step could not get KV slots even after retracting. Fewer concurrent requests leave room "
        "for every running request to finish.",
        evidence=evidence_events(rows, p90_running_before=p90, max_running_requests=cap),
        change=Change("running_cap", str(max(1, suggested))) if suggested else Change("running_cap", direction=-1),
        current=Current.of(cap) if cap else None,
        tradeoff="Fewer concurrent requests: lower throughput under heavy load.",
        ranks=tuple(sorted({e.rank for e in rows})))
