"""Hard out-of-memory errors and start-up memory errors (docs/log-formats.md §6.2, §9.5).

- `oom.prefill` (critical, any count): lower `--chunked-prefill-size` (to 4096, or half of a smaller value).
- `oom.decode` (critical, any count): lower `--max-running-requests` (to 3/4 of the p90 batch before the OOM).
- `oom.other` (critical): a CUDA out-of-memory error at run time: lower the static memory fraction by 0.05
  (SGLang `--mem-fraction-static`, vLLM `--gpu-memory-utilization`) so activations have room.
- `oom.startup` (critical): no room for the KV cache at start-up (SGLang `Not enough memory`, vLLM `No available
  memory for the cache blocks` / `To serve at least one request with the model's max seq len`): raise the
  memory fraction (+0.05), or for vLLM's max seq len error lower `--max-model-len` to the estimate it prints.
"""
from __future__ import annotations

import re

import numpy as np

from toolkit.diagnose.events import Event
from toolkit.diagnose.findings import Finding, evidence_events
from toolkit.diagnose.flags import flag, memory_fraction
from toolkit.diagnose.rules.context import Context

PREFILL_TARGET = 4096
MIN_CHUNK = 1024
_ESTIMATE = re.compile(r"estimated maximum model length is (\d{1,12})")


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
    if other:
        mfs, quoted = memory_fraction(ctx.config)
        out.append(Finding(
            "oom.other", "critical", f"Out of memory ({len(other)}x)",
            "The device ran out of memory while serving: the static memory (weights, KV cache, graphs) left "
            "too little for activations.", evidence_events(other), flag(ctx.config, "kv_memory"),
            f"{mfs - 0.05:.2f}" if mfs else "lower", quoted,
            "A smaller KV cache holds fewer tokens: fewer concurrent requests."))
    start = ctx.timeline.kind("not_enough_memory")
    if start:
        out.append(_startup(ctx, start))
    return out


def _startup(ctx: Context, rows: list[Event]) -> Finding:
    estimate = next((int(m.group(1)) for e in rows if (m := _ESTIMATE.search(e.text))), None)
    if ctx.config.vllm and estimate:
        context = ctx.config.context_len
        return Finding(
            "oom.startup", "critical", "The KV cache cannot hold one request at max_model_len",
            f"vLLM needs room for one request at the full context ({context or '?'} tokens) and estimates "
            f"that {estimate} fit in the memory left for the KV cache.", evidence_events(rows),
            flag(ctx.config, "context"), str(estimate), str(context) if context else None,
            "Longer requests are rejected; raising --gpu-memory-utilization instead keeps them.")
    current, quoted = memory_fraction(ctx.config)
    return Finding(
        "oom.startup", "critical", "Not enough memory for the KV cache at start-up",
        "The weights left no room for a KV cache at the given memory fraction.", evidence_events(rows),
        flag(ctx.config, "kv_memory"), f"{min(0.98, current + 0.05):.2f}" if current else "higher", quoted,
        "Less headroom for activations; if it still fails, use more GPUs (tensor parallelism) or a smaller dtype.")


def _prefill(ctx: Context, rows: list[Event]) -> Finding:
    current = ctx.config.chunked_prefill_size
    suggested = PREFILL_TARGET if not current or current > PREFILL_TARGET else max(MIN_CHUNK, current // 2)
    fields = rows[0].fields
    return Finding(
        "oom.prefill", "critical", f"Out of memory in prefill ({len(rows)}x)",
        f"A prefill batch asked for {fields.get('requested', '?')} KV slots with "
        f"{fields.get('available_tokens', '?')} available. Smaller chunks bound the tokens one prefill needs.",
        evidence_events(rows, requested=fields.get("requested"), available=fields.get("available_tokens")),
        flag(ctx.config, "prefill_budget"), str(suggested), str(current) if current else None,
        "Long prompts take more, smaller prefill steps: slightly lower input throughput.",
        tuple(sorted({e.rank for e in rows})))


def _decode(ctx: Context, rows: list[Event]) -> Finding:
    cap = ctx.config.max_running_requests
    decode = ctx.timeline.series("decode")
    first = min(e.line for e in rows)
    before = decode.where(decode["line"] < first)["running_req"]
    before = before[~np.isnan(before)]
    p90 = float(np.quantile(before, 0.9)) if len(before) else None
    suggested = int(0.75 * p90) if p90 else (cap // 2 if cap else None)
    return Finding(
        "oom.decode", "critical", f"Out of memory in decode ({len(rows)}x)",
        "A decode step could not get KV slots even after retracting. Fewer concurrent requests leave room "
        "for every running request to finish.",
        evidence_events(rows, p90_running_before=p90, max_running_requests=cap),
        flag(ctx.config, "running_cap"), str(max(1, suggested)) if suggested else None, str(cap) if cap else None,
        "Fewer concurrent requests: lower throughput under heavy load.", tuple(sorted({e.rank for e in rows})))
