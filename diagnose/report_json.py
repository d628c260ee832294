"""`--format json`: the stable, documented schema `toolkit.diagnose/1` (see docs/diagnose-json.md)."""
from __future__ import annotations

import json
import math
from typing import Any

from toolkit.diagnose.analysis import Diagnosis
from toolkit.diagnose.bench_input import run_facts
from toolkit.diagnose.findings import Finding
from toolkit.diagnose.read.messages import KINDS
from toolkit.diagnose.timeline import distribution
from toolkit.diagnose.vocabulary import IDEAS, Change, Engine, knob

SCHEMA = "toolkit.diagnose/1"


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if hasattr(value, "item"):
        return _clean(value.item())
    return value


def change_dict(c: Change, engine: Engine) -> dict[str, Any]:
    """A typed change with its flag in `engine`'s words and how its idea moves."""
    found = knob(c.idea, engine)
    return {"idea": c.idea, "flag": found.flag if found else None, "move": IDEAS[c.idea].move, "value": c.value,
            "direction": c.direction, "companions": [change_dict(x, engine) for x in c.companions]}


def finding_dict(f: Finding) -> dict[str, Any]:
    ev = f.evidence
    return {
        "id": f.id, "rule": f.rule, "severity": f.severity, "title": f.title, "message": f.message,
        "flag": f.flag, "suggested": f.suggested, "current": f.current, "tradeoff": f.tradeoff,
        "engine": f.engine, "change": change_dict(f.change, f.engine) if f.change else None,
        "alternatives": [change_dict(a, f.engine) for a in f.alternatives], "action": f.action,
        "ranks": list(f.ranks), "confidence": f.confidence,
        "evidence": {
            "count": ev.count, "total": ev.total, "fraction": _clean(ev.fraction),
            "span": list(ev.span) if ev.span else None, "seconds": _clean(ev.seconds), "lines": list(ev.lines),
            "facts": {k: _clean(v) for k, v in ev.facts.items()},
        },
    }


def _ranks(d: Diagnosis) -> dict[str, Any]:
    tl = d.timeline
    decode, prefill, stats, steady = (tl.series("decode"), tl.series("prefill"), tl.series("stats"), tl.steady())
    out = {}
    for rank in tl.ranks:
        mine = steady.of_rank(rank)
        busy = mine.where(~mine["after_idle"].astype(bool))
        out[rank] = {
            "decode_lines": int(decode.rank_is(rank).sum()),
            "prefill_lines": int(prefill.rank_is(rank).sum()),
            "stats_lines": int(stats.rank_is(rank).sum()),
            "steady_decode_lines": len(mine),
            "queue_req": distribution(mine["queue_req"]), "usage": distribution(mine["usage"]),
            "running_req": distribution(mine["running_req"]),
            "gen_throughput": distribution(busy["gen_throughput"]),
        }
    return out


def to_dict(d: Diagnosis) -> dict[str, Any]:
    cfg, tl = d.config, d.timeline
    ranks = _ranks(d)
    return {
        "schema": SCHEMA,
        "verdict": {"status": d.status, "text": d.verdict, "enough_data": d.enough_data,
                    "data_problem": d.data_problem},
        "unjudged": [{"rule": rule, "why": why} for rule, why in d.unjudged],
        "sources": d.sources,
        "window": list(d.window) if d.window else None,
        "lines": {"total": d.stats.lines, "events": sum(d.stats.kinds.values()), "other": d.stats.other,
                  "unread": d.stats.unread},
        "unread_examples": [{"line": n, "text": t} for n, t in d.stats.unread_examples],
        "event_counts": {k: int(d.stats.kinds.get(k, 0)) for k in KINDS},
        "config": {
            "era": cfg.era, "engine": cfg.engine, "engine_version": cfg.engine_version, "device": cfg.device,
            "tp_size": cfg.tp_size, "dp_size": cfg.dp_size, "parallelism_source": cfg.parallelism_source,
            "max_concurrency": cfg.max_concurrency, "max_total_num_tokens": cfg.max_total_num_tokens,
            "chunked_prefill_size": cfg.chunked_prefill_size, "max_prefill_tokens": cfg.max_prefill_tokens,
            "max_running_requests": cfg.max_running_requests, "context_len": cfg.context_len,
            "available_mem_gb": cfg.available_mem_gb, "gpu_mem_gb": cfg.gpu_mem_gb,
            "weight_mem_gb": cfg.weight_mem_gb, "kv_mem_gb": cfg.kv_mem_gb, "graph_mem_gb": cfg.graph_mem_gb,
            "dtype": cfg.dtype, "model_class": cfg.model_class,
            "server_args": {k: _clean(v) for k, v in cfg.args.items()},
        },
        "phases": [p._asdict() for p in tl.phases],
        "ranks": ranks,
        "findings": [finding_dict(f) for f in d.findings],
        "notes": d.notes,
        "command": d.command,
        "metrics": d.metrics.quoted() if d.metrics else None,
        "bench": [run_facts(r) for r in d.bench.runs] if d.bench else None,
    }


def render_json(d: Diagnosis) -> str:
    return json.dumps(to_dict(d), indent=2, default=str)
