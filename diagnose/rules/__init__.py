"""Rules: one module per finding, each `check(ctx) -> list[Finding]` with its thresholds at the top.

`RULES` is the registry in report order; `run_rules` evaluates them all and never lets one rule's error stop
the others (the error becomes an `info` finding so it is seen, not hidden). Rules name ideas, not flags; every
finding is stamped with the engine that wrote the log, whose flags its advice is rendered in; where the log does
not tell the engine, its advice (in SGLang's words) also names vLLM's flag for the same knob. A rule that cannot
judge says why with `ctx.cannot_judge(...)`; the verdict lists those. Each rule has its own context; findings,
notes and what could not be judged come back in registry order.
"""
from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import replace

from toolkit.diagnose.findings import Evidence, Finding
from toolkit.diagnose.rules import (
    capacity,
    client,
    crashes,
    cuda_graph,
    fp8,
    gpu_memory,
    multimodal,
    oom,
    parallelism,
    pd_transfer,
    prefill_budget,
    prefill_chunk,
    prefill_stall,
    prompt_limit,
    queue,
    retraction,
    running_cap,
    schedule_policy,
    shedding,
    speculative,
    throughput,
    torch_compile,
    usage,
)
from toolkit.diagnose.rules.context import Context
from toolkit.diagnose.vocabulary import knob

Rule = Callable[[Context], list[Finding]]

RULES: dict[str, Rule] = {
    "crashes": crashes.check,
    "pd_transfer": pd_transfer.check,
    "oom": oom.check,
    "gpu_memory": gpu_memory.check,
    "multimodal": multimodal.check,
    "capacity": capacity.check,
    "prompt_limit": prompt_limit.check,
    "retraction": retraction.check,
    "throughput": throughput.check,
    "usage": usage.check,
    "running_cap": running_cap.check,
    "queue": queue.check,
    "shedding": shedding.check,
    "client": client.check,
    "cuda_graph": cuda_graph.check,
    "prefill_stall": prefill_stall.check,
    "prefill_chunk": prefill_chunk.check,
    "prefill_budget": prefill_budget.check,
    "schedule_policy": schedule_policy.check,
    "parallelism": parallelism.check,
    "torch_compile": torch_compile.check,
    "fp8": fp8.check,
    "speculative": speculative.check,
}



def run_rules(ctx: Context) -> list[Finding]:
    contexts = [ctx.for_rule(name) for name in RULES]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        found = list(map(_run, RULES.values(), contexts))
    for own in contexts:
        ctx.notes += own.notes
        ctx.unjudged += own.unjudged
    engine = ctx.config.advice_engine
    stamped = [replace(finding, engine=engine) for findings in found for finding in findings]
    return stamped if ctx.config.engine is not None else [_in_both_engines(f) for f in stamped]


def _in_both_engines(finding: Finding) -> Finding:
    """A finding on a log whose engine cannot be told: its message also names vLLM's flag for the knob."""
    vllm = knob(finding.change.idea, "vllm") if finding.change is not None else None
    if vllm is None or vllm.flag == finding.flag:
        return finding
    return replace(finding, message=f"{finding.message} (The log does not tell which engine ran it: on vLLM the "
                                    f"same knob is {vllm.flag}.)")


def _run(rule: Rule, ctx: Context) -> list[Finding]:
    try:
        return rule(ctx)
    except Exception as exc:  # noqa: BLE001 - a broken rule is reported, the others still run
        return [Finding(id=f"rule-error.{ctx.rule}", severity="info", title=f"rule {ctx.rule} could not run",
                        message=f"{type(exc).__name__}: {exc}", evidence=Evidence())]


__all__ = ["RULES", "Context", "run_rules"]
