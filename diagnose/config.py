"""The server's configuration as the log tells it: SGLang's `server_args=...` and start-up memory lines, vLLM's
engine config, non-default args and capacity lines (docs/log-formats.md §5, §9.3); TP and DP sizes from the
rank tags when the arguments are absent."""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from toolkit.diagnose.era_defaults import default_cuda_graph_max_bs, default_schedule_policy
from toolkit.diagnose.read.events import Event
from toolkit.diagnose.read.messages import CAPTURE_BEGAN, SGLANG_KINDS, VLLM_KINDS
from toolkit.diagnose.read.rank import Rank
from toolkit.diagnose.read.series import LogRecords
from toolkit.diagnose.read.values import Value
from toolkit.diagnose.vocabulary import FP8_KV, Engine, Knob, knob, named

_ERROR_KINDS = ("not_enough_memory", "oom", "exception")  # error records: their words may name the engine


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """What is known about the server; `None` where the log does not say.

    Memory figures are GB per GPU. `gpu_mem_gb` is the free memory before loading weights (largest across
    ranks; vLLM: its `total_gpu_memory`), close to the device size; `available_mem_gb` is what SGLang left
    after the KV pool and graphs (`available_gpu_mem=` or the last `avail mem=`); where graph capture began and
    its end is not in the log, that is unknown and `before_graphs_gb` holds what was left when it began. For vLLM
    the SGLang names
    hold their analogues: `max_total_num_tokens` the KV cache size in tokens, `max_running_requests`
    `max_num_seqs`, `chunked_prefill_size` `max_num_batched_tokens`, `context_len` `max_model_len`."""

    args: Mapping[str, Value] = field(default_factory=dict)
    max_total_num_tokens: int | None = None
    chunked_prefill_size: int | None = None
    max_prefill_tokens: int | None = None
    max_running_requests: int | None = None
    context_len: int | None = None
    available_mem_gb: float | None = None
    before_graphs_gb: float | None = None
    device: str | None = None
    gpu_mem_gb: float | None = None
    weight_mem_gb: float | None = None
    kv_mem_gb: float | None = None
    graph_mem_gb: float | None = None
    dtype: str | None = None
    model_class: str | None = None
    era: str | None = None
    engine: str | None = None
    engine_version: str | None = None
    rank_tp: int | None = None
    rank_dp: int | None = None
    max_concurrency: float | None = None
    scheduled_tokens: int | None = None  # vLLM: the tokens a step schedules where speculative decoding cut them
    captured_max_bs: int | None = None  # the largest decode graph the log's capture lists (`bs=[...]`)
    colocated_with: str | None = None  # the RL framework whose trainer shares the engine's GPUs (its Ray actors)

    def arg(self, name: str, default: Any = None) -> Any:
        value = self.args.get(name)
        return default if value is None else value

    @property
    def vllm(self) -> bool:
        return self.engine == "vllm"

    @property
    def advice_engine(self) -> Engine:
        """The engine whose words the advice uses: vLLM's for a vLLM log, else SGLang's."""
        return "vllm" if self.vllm else "sglang"

    def knob(self, idea: str) -> Knob | None:
        """The engine's knob for an idea (or a role: `model`), None where it has none."""
        return knob(idea, self.advice_engine)

    def value(self, idea: str) -> Value:
        """The value the log gives the engine's knob for an idea (or a role), None where it gives none."""
        found = self.knob(idea)
        return self.args.get(found.arg) if found is not None else None

    def flag(self, idea: str) -> str:
        """The flag that names an idea in the log's engine's words (the other engine's where it has none)."""
        return named(idea, self.advice_engine)

    @property
    def tp_size(self) -> int:
        return int(self.value("tp") or self.rank_tp or 1)

    @property
    def dp_size(self) -> int:
        return int(self.value("dp") or self.rank_dp or 1)

    @property
    def parallelism_source(self) -> str:
        """Where tp/dp come from: the server's arguments, its log's rank tags, or neither (defaults)."""
        if self.value("tp") is not None or self.value("dp") is not None:
            return "arguments"
        return "rank tags" if (self.rank_tp or self.rank_dp) else "default"

    @property
    def max_queued_requests(self) -> int | None:
        """SGLang's waiting-queue cap (`--max-queued-requests`); None when unset or not in the log (0 is a cap)."""
        v = self.value("max_queued")
        return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None

    @property
    def mem_fraction_static(self) -> float | None:
        v = self.value("kv_memory")
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None

    @property
    def schedule_policy(self) -> str | None:
        """SGLang's queue order (vLLM's is not judged): the log's, else the era's default."""
        return None if self.vllm else (self.value("schedule_policy") or default_schedule_policy(self.era))

    @property
    def schedule_conservativeness(self) -> float:
        v = self.value("admission")
        return float(v) if isinstance(v, (int, float)) else 1.0

    @property
    def cuda_graph_max_bs(self) -> int | None:
        """The largest captured decode batch: the log's, the capture's list, else the engine's default (SGLang's by
        era and GPU)."""
        v = self.value("graph_max_bs")
        if isinstance(v, int):
            return v
        if self.vllm:
            return self.knob("graph_max_bs").default  # type: ignore[union-attr,return-value]
        if self.captured_max_bs is not None:
            return self.captured_max_bs
        return default_cuda_graph_max_bs(self.era, self.gpu_mem_gb, self.tp_size) if self.on_gpu else None

    @property
    def cuda_graph_max_bs_known(self) -> bool:
        """Whether the captured maximum comes from the log (its arguments or its capture's list of batch sizes),
        not a default guessed from the era and GPU."""
        return isinstance(self.value("graph_max_bs"), int) or (not self.vllm and self.captured_max_bs is not None)

    @property
    def cuda_graph_disabled(self) -> bool:
        return bool(self.value("graphs_off") or False)

    @property
    def torch_compile(self) -> bool:
        """vLLM (V1) always compiles; SGLang where the log turns it on."""
        return self.vllm or bool(self.value("torch_compile") or False)

    @property
    def chunked_prefill(self) -> bool | None:
        """Whether the log's arguments turn vLLM's chunked prefill on (V0's engine config `chunked_prefill_enabled`,
        an `--enable-chunked-prefill` argument), None where they say nothing."""
        for key in ("chunked_prefill_enabled", "enable_chunked_prefill"):
            said = self.args.get(key)
            if isinstance(said, bool):
                return said
        return None

    @property
    def kv_cache_dtype(self) -> str:
        return str(self.value("kv_dtype") or "auto")

    @property
    def quantization(self) -> str | None:
        v = self.value("quantization")
        return str(v) if v else None

    @property
    def fp8_kv(self) -> str:
        """An fp8 KV cache's dtype, in the engine's words."""
        return FP8_KV[self.advice_engine]

    @property
    def on_gpu(self) -> bool:
        return self.device != "cpu"

    @property
    def total_weight_gb(self) -> float | None:
        return self.weight_mem_gb * self.tp_size if self.weight_mem_gb is not None else None

    @property
    def model(self) -> str | None:
        v = self.value("model")
        return str(v) if v else self.model_class

    def summary(self) -> dict[str, object]:
        """The configuration as the log tells it, in the engine's own names (None where it does not say)."""
        source = {"rank tags": " (from rank tags)", "default": " (no tags or arguments)"}.get(self.parallelism_source, "")
        common = {"engine": self.engine, "device": self.device, "model": self.model,
                  "tp / dp": f"{self.tp_size} / {self.dp_size}{source}", "dtype": self.dtype,
                  "GPUs shared with": f"{self.colocated_with}'s trainer" if self.colocated_with else None}
        if self.vllm:
            return {**common, "vLLM version": self.engine_version, "KV cache size (tokens)": self.max_total_num_tokens,
                    "max concurrency at max_model_len": self.max_concurrency,
                    "max_num_seqs": self.max_running_requests, "max_num_batched_tokens": self.chunked_prefill_size,
                    "max_model_len": self.context_len, "GPU memory (GB)": self.gpu_mem_gb,
                    "weights per device (GB)": self.weight_mem_gb, "KV cache (GB)": self.kv_mem_gb,
                    "CUDA graphs (GB)": self.graph_mem_gb}
        return {**common, "SGLang era (guessed)": self.era, "max_total_num_tokens": self.max_total_num_tokens,
                "max_running_requests": self.max_running_requests, "chunked_prefill_size": self.chunked_prefill_size,
                "max_prefill_tokens": self.max_prefill_tokens, "context_len": self.context_len,
                "available memory (GB)": self.available_mem_gb, "memory before weights (GB)": self.gpu_mem_gb,
                "weights per device (GB)": self.weight_mem_gb, "KV cache (GB)": self.kv_mem_gb}


def read_config(records: LogRecords) -> ServerConfig:
    """Server configuration from the start-up events (first occurrence of each), the engine that wrote the log (the
    messages only one engine prints, the facts its prefixes tell, a launch command, an error's words), the TP/DP
    sizes its rank tags imply, the RL framework whose trainer's actors printed start-up lines, and the release its
    forms prove."""
    events = records.events
    kinds = {k for k, rows in events.items() if rows} | records.batch_kinds
    commands = [e.fields for e in events.get("launch_command", [])]
    engine = ("vllm" if kinds & VLLM_KINDS else "sglang" if kinds & SGLANG_KINDS
              else "vllm" if events.get("vllm_logger")
              else next((str(c["launch_engine"]) for c in reversed(commands) if c), None) or _engine_by_words(events))
    launch = _launch_args(commands, engine)
    rank_tp, rank_dp = _rank_sizes(set(records.ranks) | {e.rank for rows in events.values() for e in rows})
    colocated = [str(e.fields.get("framework")) for e in events.get("colocated", []) if e.fields.get("framework")]
    common = {"rank_tp": rank_tp, "rank_dp": rank_dp, "colocated_with": min(colocated, default=None)}
    if engine == "vllm":
        return _vllm_config(events, records.vllm_generation, launch, common)
    return _sglang_config(records, launch, {**common, "engine": engine, "era": records.era})


def _launch_args(commands: list[dict[str, Value]], engine: str | None) -> dict[str, Value]:
    """The flags of the last launch command pasted with the log that ran this engine (`launch_engine`, the engine
    its program names): what the log's own lines do not say, read after them."""
    last = next((c for c in reversed(commands) if c.get("launch_engine") == engine), {})
    return {k: v for k, v in last.items() if k != "launch_engine"}


def _engine_by_words(events: Mapping[str, list[Event]]) -> str | None:
    """The engine an error record's words or source paths name, when no line of either engine's own says
    (SGLang first: its older tracebacks pass through vLLM's layers)."""
    named = {e.error.engine for kind in _ERROR_KINDS for e in events.get(kind, [])}
    return next((engine for engine in ("sglang", "vllm") if engine in named), None)


def _first(events: Mapping[str, list[Event]], kind: str) -> dict[str, Value]:
    rows = events.get(kind, [])
    return rows[0].fields if rows else {}


def _all(events: Mapping[str, list[Event]], kind: str) -> list[dict[str, Value]]:
    return [e.fields for e in events.get(kind, [])]


def _dtype_arg(args: Mapping[str, Value]) -> str | None:
    """The dtype the arguments ask for where the log prints none it ran with (`auto`: the checkpoint's says)."""
    v = args.get("dtype")
    return str(v) if v and v != "auto" else None


def _num(v: object) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _int(*values: object) -> int | None:
    for v in values:
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0:
            return int(v)
    return None


def _rank_sizes(ranks: Iterable[Rank]) -> tuple[int | None, int | None]:
    """(TP size, DP size) the rank tags imply: one more than the largest index seen (a GPU tag's counts as TP),
    None without tags."""
    tps = [n for r in ranks for n in (r.tp, r.gpu) if n is not None]
    dps = [r.dp for r in ranks if r.dp is not None]
    return (max(tps) + 1 if tps else None), (max(dps) + 1 if dps else None)


def _pool(events: Mapping[str, list[Event]]) -> dict[str, Value]:
    """The memory pool's line (`max_total_num_tokens=..., max_running_requests=..., ...`); where a paste glued it to
    the end of the capture before it (`... avail mem=6.95 GB max_total_num_tokens=...`, sglang#33483), its
    pieces there."""
    pool = _first(events, "pool")
    if pool:
        return pool
    return next((glued for e in events.get("graph_end", []) if (glued := e.glued("pool")) is not None), {})


def _captured_max_bs(events: Mapping[str, list[Event]]) -> int | None:
    """The largest decode batch the last capture of the target model lists (`bs=[1, 2, ..., 32]`, 0.5+)."""
    found = [g["captured_bs"] for g in _all(events, "graph_begin")
             if isinstance(g.get("captured_bs"), int) and not g.get("draft") and not g.get("prefill")]
    return int(found[-1]) if found else None  # type: ignore[arg-type]


def _capture_began_with(events: Mapping[str, list[Event]], pool_end: dict[str, Value]) -> float | None:
    """What the last CUDA-graph capture began with: its `Capture cuda graph begin` line's free memory; without one,
    the first of the capture's progress bars (`Capturing batches (avail_mem=X GB)`, the only capture line of some
    pastes: later bars show less, as graphs are captured); else what the memory pool's end left."""
    began = [_num(e.fields.get("avail_mem")) for e in events.get("graph_begin", [])]
    bars = [_num(e.fields.get("avail_mem")) for e in events.get("graph_progress", [])]
    found = next((v for v in reversed(began) if v is not None), None)
    if found is None:
        found = next((v for v in bars if v is not None), None)
    return found if found is not None else _num(pool_end.get("avail_mem"))


def _past_capture(records: LogRecords, args: dict[str, Value]) -> bool:
    """Whether the memory pool's end is what start-up leaves, with no capture line in the log: graphs are off, or
    the log goes on past where a capture would be (the pool's summary line, batch lines). An excerpt that ends at
    the pool's end stops before the capture (sglang#3434): what it will leave is not in the log."""
    served = bool(records.batch_kinds & {"decode", "prefill"}) or bool(records.events.get("pool"))
    return bool(args.get(knob("graphs_off", "sglang").arg) or False) or served  # type: ignore[union-attr]


def _sglang_config(records: LogRecords, launch: dict[str, Value], extra: dict) -> ServerConfig:
    events = records.events
    args = {**launch, **_first(events, "server_args")}  # NOTE: the pool line's numbers come first below
    pool = _pool(events)
    load_begin = _all(events, "load_begin")
    load_end = _first(events, "load_end")
    kv = _first(events, "kv_alloc")
    graph_end = _all(events, "graph_end")
    pool_end = _first(events, "pool_end")
    avail = _num(pool.get("available_gpu_mem"))
    device = "gpu" if avail is not None else None
    if "available_cpu_mem" in pool or str(args.get("device", "")) == "cpu":
        avail, device = _num(pool.get("available_cpu_mem", avail)), "cpu"
    before_graphs = None
    if avail is None:
        captured = [_num(g.get("avail_mem")) for g in graph_end if not g.get("draft")]
        if captured:
            avail = captured[-1]
        elif any(events.get(kind) for kind in CAPTURE_BEGAN):
            # NOTE: a capture begun without its end in the log (cut, or failed): what it leaves is unknown
            before_graphs = _capture_began_with(events, pool_end)
        elif _past_capture(records, args):
            avail = _num(pool_end.get("avail_mem"))
    begins = [v for v in (_num(b.get("avail_mem")) for b in load_begin) if v is not None]
    if not begins:  # NOTE: 0.1 printed the free memory at `Init torch begin.` instead (sglang#485)
        begins = [v for v in (_num(b.get("avail_mem")) for b in _all(events, "dist_init")) if v is not None]
    gpu_mem = max(begins) if begins else None
    weights = _num(load_end.get("mem_usage"))
    if weights is None and begins and _num(load_end.get("avail_mem")) is not None:
        weights = round(begins[0] - float(load_end["avail_mem"]), 2)  # type: ignore[arg-type]
    kv_gb = sum(v for v in (_num(kv.get(k)) for k in ("k_size", "v_size", "kv_size")) if v is not None) or None
    graph_mem = sum(v for v in (_num(g.get("mem_usage")) for g in graph_end) if v is not None) or None
    return ServerConfig(
        args=args,
        max_total_num_tokens=_int(pool.get("max_total_num_tokens"), kv.get("tokens")),
        chunked_prefill_size=_int(pool.get("chunked_prefill_size"), args.get("chunked_prefill_size")),
        max_prefill_tokens=_int(pool.get("max_prefill_tokens"), args.get("max_prefill_tokens")),
        max_running_requests=_int(pool.get("max_running_requests"), args.get("max_running_requests")),
        context_len=_int(pool.get("context_len"), args.get("context_length")),
        available_mem_gb=avail,
        before_graphs_gb=before_graphs,
        device=device or ("gpu" if gpu_mem is not None else None),
        gpu_mem_gb=gpu_mem,
        weight_mem_gb=weights,
        kv_mem_gb=kv_gb,
        graph_mem_gb=graph_mem,
        dtype=str(load_end["dtype"]) if "dtype" in load_end else _dtype_arg(args),
        model_class=str(load_end["type"]) if "type" in load_end else None,
        captured_max_bs=_captured_max_bs(events),
        **extra,
    )


def _vllm_version(config: Mapping[str, Value], generation: str | None) -> str | None:
    """The version the engine config names, else the generation the stats line's form shows."""
    return str(config["version"]) if config.get("version") else generation


def _vllm_config(events: Mapping[str, list[Event]], generation: str | None, launch: dict[str, Value],
                 extra: dict) -> ServerConfig:
    config = _first(events, "engine_config")
    own: dict[str, Value] = {**config, **_first(events, "engine_args")}
    args = {**launch, **own}
    capacity = {**_first(events, "max_concurrency"), **_first(events, "kv_capacity")}
    profile: dict[str, Value] = {}
    for fields in _all(events, "memory_profile"):
        profile.update(fields)
    blocks = _first(events, "gpu_blocks")
    scheduler: dict[str, Value] = {}
    for fields in _all(events, "scheduler_config"):  # the budget's line, and speculative decoding's cut of it
        scheduler.update(fields)
    kv_memory = _first(events, "kv_memory")
    loaded = _first(events, "weights_loaded")
    graphs = _all(events, "graph_captured")
    device = str(capacity.get("device") or blocks.get("device") or config.get("device_config") or "")
    device = "cpu" if device.startswith("cpu") else ("gpu" if device else None)
    graph_gb = sum(v for v in (_num(g.get("graph_gb")) for g in graphs) if v is not None) or None
    return ServerConfig(
        args=args,
        max_total_num_tokens=_int(capacity.get("kv_tokens")),
        chunked_prefill_size=_int(own.get("max_num_batched_tokens"),
                                  scheduler.get("max_num_batched_tokens"),
                                  launch.get("max_num_batched_tokens")),
        max_running_requests=_int(own.get("max_num_seqs"), launch.get("max_num_seqs")),
        context_len=_int(own.get("max_model_len"), config.get("max_seq_len"), capacity.get("max_model_len"),
                         launch.get("max_model_len")),
        device=device,
        gpu_mem_gb=_num(profile.get("total_gpu_memory_gb")),
        weight_mem_gb=_num(loaded.get("weights_gb")) or _num(profile.get("weights_gb")),
        kv_mem_gb=_num(kv_memory.get("kv_cache_gb")) or _num(profile.get("kv_cache_gb")),
        graph_mem_gb=graph_gb,
        dtype=str(config["dtype"]) if config.get("dtype") else _dtype_arg(args),
        engine="vllm",
        engine_version=_vllm_version(config, generation),
        max_concurrency=_num(capacity.get("max_concurrency")),
        scheduled_tokens=_int(scheduler.get("max_num_scheduled_tokens")),
        **extra,
    )
