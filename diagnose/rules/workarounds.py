"""The workaround an operator tries first for a crash whose traceback names its cause (docs/log-formats.md §6.3):

- a PD-disaggregation KV transfer that rejects prefill and decode servers of different TP sizes
  (`PD Disaggregation does NOT support PD different TP sizes ...`, or an error naming both sizes): run both with
  the same `--tp-size`, or upgrade SGLang to a release that transfers KV between different TP sizes;
- SGLang's mamba state pool out of slots where a batch is admitted (`Not enough space for mamba cache, try to
  increase --mamba-full-memory-ratio or --max-mamba-cache-size.`, `... mamba ping pong idx ...`): a larger share of
  memory for mamba states, or more state slots;
- vLLM's sampler warm-up (`_dummy_sampler_run`, at start-up after the graphs) in a traceback cut before its
  error line: it samples `--max-num-seqs` dummy requests at once and fails where the memory outside the KV cache
  cannot hold them (vLLM then asks for a lower `max_num_seqs` or `gpu_memory_utilization`): a lower running cap;
- an exception raised on SGLang's overlap path (frames `event_loop_overlap*`, `forward_thread_func`,
  `TpModelWorkerClient`, `tp_worker_overlap_thread.py` outside its constructor): `--disable-overlap-schedule`;
- on vLLM V1 started with `--async-scheduling`, an exception raised on the async scheduling path (frames
  `AsyncScheduler`, `async_scheduler.py`, `step_with_batch_queue`, `AsyncGPUModelRunnerOutput`): drop the flag;
- an exception raised while SGLang starts up (the model runner built or initialized, or torch.compile's own frames)
  with `--enable-torch-compile` on: start without it (sglang#4489: a GPTQ-Marlin model);
- an exception raised while SGLang starts up with a context length above `HUGE_CONTEXT` tokens (sglang#6744:
  2,800,000): its per-request tables (`req_to_token`: the running cap x the context length) and buffers grow
  with it: start with a smaller `--context-length`;
- an exception raised while CUDA graphs are captured (SGLang's `cuda_graph_runner.py` in `__init__` / `capture*`,
  vLLM's `capture_model`) whose error line names no cause a rule of its own reads (an OOM, a failed capture: those
  are explained before): run without graphs (`--disable-cuda-graph` / `--enforce-eager`) to get the server up.

The disaggregation and mamba pool errors, and a cut sampler warm-up, are checked first: they name the cause, the
overlap frames only where it was raised.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from toolkit.diagnose.config import ServerConfig
from toolkit.diagnose.findings import Current
from toolkit.diagnose.read.errors import ErrorText
from toolkit.diagnose.read.events import Event
from toolkit.diagnose.vocabulary import Change

class Workaround(NamedTuple):
    """What to change (None: nothing on the server), its current value, trade-off, what to do off the server,
    why (a sentence for the message) and the facts behind it."""

    change: Change | None
    current: Current | None
    tradeoff: str
    action: str | None
    why: str
    facts: dict[str, str | int | None]
    alternatives: tuple[Change, ...] = ()


def workaround(config: ServerConfig, exceptions: Sequence[Event]) -> Workaround | None:
    errors = [e.error for e in exceptions]
    return (_pd_tp(config, errors) or _mamba_pool(config, errors) or _sampler_warmup(config, errors)
            or _overlap(config, errors) or _async_scheduling(config, errors) or _torch_compile(config, errors)
            or _huge_context(config, errors) or _graph_capture(config, errors))


def _frames(sign: str, errors: Sequence[ErrorText]) -> list[str]:
    """What the records show of `sign` (`diagnose.read.errors.SIGNS`), the distinct names in order."""
    return list(dict.fromkeys(name for error in errors for name in error.signs.get(sign, ())))


def _pd_tp(config: ServerConfig, errors: Sequence[ErrorText]) -> Workaround | None:
    said = next((error.pd_tp for error in errors if error.pd_tp is not None), None)
    if said is None:
        return None
    sizes = dict(zip(("prefill", "decode"), said))
    mode = str(config.arg("disaggregation_mode") or "")
    if mode in sizes and sizes[mode] is None and config.parallelism_source == "arguments":
        sizes[mode] = config.tp_size
    known = " and ".join(f"{side} TP {n}" for side, n in sizes.items() if n is not None)
    other = {"prefill": "decode", "decode": "prefill"}.get(mode)
    target = sizes[other] if other is not None else None
    mine = sizes.get(mode)
    why = ("The KV transfer between the prefill and decode servers rejects their different TP sizes"
           + (f" ({known})" if known else "") + ".")
    return Workaround(
        Change("tp", str(target)) if target is not None and target != mine else Change("tp"),
        Current.of(mine) if mine is not None else None,
        "The same TP size on both sides may need more GPUs on one of them, or fit less KV per server.",
        "run prefill and decode with the same --tp-size"
        + (f" (now {known})" if known else "")
        + ", or upgrade SGLang to a release whose KV transfer supports different TP sizes for this model",
        why, {"prefill_tp": sizes["prefill"], "decode_tp": sizes["decode"]})


def _mamba_pool(config: ServerConfig, errors: Sequence[ErrorText]) -> Workaround | None:
    if not any(error.mamba_pool_full for error in errors) or config.vllm:
        return None
    ratio, slots = config.value("mamba_memory"), config.value("mamba_slots")
    return Workaround(
        Change("mamba_memory", direction=1), Current(value=ratio, said=str(ratio)) if ratio is not None else None,
        "More memory for mamba states leaves less for the KV cache (fewer tokens cached); fewer running requests "
        f"({config.flag('running_cap')}) need fewer state slots instead.",
        None, "The mamba state pool had no slot left for a request the scheduler admitted.",
        {"max_mamba_cache_size": slots if isinstance(slots, int) else None},
        alternatives=(Change("mamba_slots", direction=1), Change("running_cap", direction=-1)))


def _sampler_warmup(config: ServerConfig, errors: Sequence[ErrorText]) -> Workaround | None:
    if not config.vllm or not any("sampler_warmup" in error.signs and error.cut for error in errors):
        return None
    seqs = config.value("running_cap")
    return Workaround(
        Change("running_cap", direction=-1), Current.of(seqs) if isinstance(seqs, int) else None,
        "Fewer requests run at once; a lower memory share instead keeps them but caches fewer tokens.",
        None, "The traceback stops inside vLLM's sampler warm-up (_dummy_sampler_run), before its error line: the "
        "warm-up samples as many dummy requests as may run at once, and fails where the memory left outside the "
        "KV cache cannot hold them.", {"frames": "_dummy_sampler_run"},
        alternatives=(Change("kv_memory", direction=-1),))


def _overlap(config: ServerConfig, errors: Sequence[ErrorText]) -> Workaround | None:
    frames = _frames("overlap", errors)
    if config.vllm or not frames or config.value("overlap_off") is True:
        return None
    return Workaround(
        Change("overlap_off", True), Current(value=False, said="overlap on"),
        "Decode runs a few % slower: the CPU schedules the next batch only after the GPU step ends.",
        None, f"The traceback runs through the overlap scheduler ({', '.join(frames)}).",
        {"frames": ", ".join(frames)})


def _async_scheduling(config: ServerConfig, errors: Sequence[ErrorText]) -> Workaround | None:
    frames = _frames("async_scheduling", errors)
    if not config.vllm or not frames or config.value("async_scheduling") is not True:
        return None
    return Workaround(
        Change("async_scheduling", False), Current(value=True, said="on"),
        "Decode runs a few % slower: the next step is scheduled only after the current one ends.",
        None, f"The traceback runs through the async scheduling path ({', '.join(frames)}).",
        {"frames": ", ".join(frames)})


def _torch_compile(config: ServerConfig, errors: Sequence[ErrorText]) -> Workaround | None:
    frames = _frames("startup", errors)
    if config.vllm or not frames or config.value("torch_compile") is not True:
        return None
    return Workaround(
        Change("torch_compile", False), Current(value=True, said="on"),
        "Small decode batches run a little slower without torch.compile; turn it back on once the model's kernels "
        "compile (quantized kernels often do not).",
        None, f"The server died starting up with torch.compile on ({', '.join(frames)}).",
        {"frames": ", ".join(frames)})


HUGE_CONTEXT = 1 << 20  # tokens: above this a context length sizes start-up memory more than the model does


def _huge_context(config: ServerConfig, errors: Sequence[ErrorText]) -> Workaround | None:
    frames = _frames("startup", errors)
    length = config.context_len
    if config.vllm or not frames or not length or length <= HUGE_CONTEXT:
        return None
    return Workaround(
        Change("context", str(HUGE_CONTEXT // 8)), Current.of(length),
        "Requests longer than the new context length are rejected; raise it in steps to the longest you serve.",
        None, f"The server died starting up ({', '.join(frames)}) with a context length of {length} tokens: SGLang "
        "sizes its per-request token table (the running cap x the context length) and buffers by it.",
        {"frames": ", ".join(frames), "context_len": length})


def _graph_capture(config: ServerConfig, errors: Sequence[ErrorText]) -> Workaround | None:
    frames = _frames("graph_capture", errors)
    if not frames or config.value("graphs_off") is True:
        return None
    return Workaround(
        Change("graphs_off", True), Current(value=False, said="graphs on"),
        "Without CUDA graphs small decode batches run slower (every kernel launched from Python); turn them back "
        "on once the capture works" + ("." if config.vllm else f" (a fix, a smaller {config.flag('graph_max_bs')})."),
        None, f"The traceback runs through CUDA graph capture ({', '.join(frames)}).", {"frames": ", ".join(frames)})
