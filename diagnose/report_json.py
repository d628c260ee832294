"""`--format json`: the stable, documented schema `toolkit.diagnose/1` (see docs/diagnose-json.md)."""
from __future__ import annotations

import json
import math
from typing import Any

from toolkit.diagnose.analysis import Diagnosis
from toolkit.diagnose.events import KINDS
from toolkit.diagnose.findings import Finding
from toolkit.diagnose.timeline import distribution

SCHEMA = "toolkit.diagnose/1"


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if hasattr(value, "item"):
        return _clean(value.item())
    return value


def finding_dict(f: Finding) -> dict[str, Any]:
    ev = f.evidence
    return {
        "id": f.id, "severity": f.severity, "title": f.title, "message": f.message,
        "flag": f.flag, "suggested": f.suggested, "current": f.current, "tradeoff": f.tradeoff,
        "ranks": list(f.ranks),
        "evidence": {
            "count": ev.count, "total": ev.total, "fraction": _clean(ev.fraction),
            "span": list(ev.span) if ev.span else None, "lines": list(ev.lines),
            "facts": {k: _clean(v) for k, v in ev.facts.items()},
        },
    }


def to_dict(d: Diagnosis) -> dict[str, Any]:
    cfg, tl = d.config, d.timeline
    ranks = {}
    for rank, df in tl.frames.items():
        dec = df[(df["kind"] == "decode") & (df["phase"] == "steady")]
        ranks[rank] = {
            "decode_lines": int((df["kind"] == "decode").sum()),
            "prefill_lines": int((df["kind"] == "prefill").sum()),
            "steady_decode_lines": len(dec),
            "queue_req": distribution(dec["queue_req"]), "usage": distribution(dec["usage"]),
            "running_req": distribution(dec["running_req"]),
            "gen_throughput": distribution(dec.loc[~dec["after_idle"].astype(bool), "gen_throughput"]),
        }
    return {
        "schema": SCHEMA,
        "verdict": {"status": d.worst or "ok", "text": d.verdict},
        "sources": d.sources,
        "window": list(d.window) if d.window else None,
        "lines": {"total": d.stats.lines, "events": sum(d.stats.kinds.values()), "other": d.stats.other,
                  "unread": d.stats.unread},
        "unread_examples": [{"line": n, "text": t} for n, t in d.stats.unread_examples],
        "event_counts": {k: int(d.stats.kinds.get(k, 0)) for k in KINDS},
        "config": {
            "era": cfg.era, "device": cfg.device, "max_total_num_tokens": cfg.max_total_num_tokens,
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
        "bench": [r.facts() for r in d.bench.runs] if d.bench else None,
    }


def render_json(d: Diagnosis) -> str:
    return json.dumps(to_dict(d), indent=2, default=str)
