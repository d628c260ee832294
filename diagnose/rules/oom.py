"""Hard out-of-memory errors (multi-line `Prefill/Decode out of memory`) and start-up memory errors.

- `oom.prefill` (critical, any count): lower `--chunked-prefill-size` (to 4096, or half of a smaller value).
- `oom.decode` (critical, any count): lower `--max-running-requests` (to 3/4 of the p90 batch before the OOM).
- `oom.startup` (critical): `Not enough memory`: raise `--mem-fraction-static` (+0.05).
"""
from __future__ import annotations

from toolkit.diagnose.fields import parse_fields
from toolkit.diagnose.findings import Finding, evidence_rows
from toolkit.diagnose.rules.context import Context

PREFILL_TARGET = 4096
MIN_CHUNK = 1024


def check(ctx: Context) -> list[Finding]:
    rows = ctx.timeline.kind("oom")
    by_phase: dict[str, list[tuple]] = {}
    for r in rows:
        by_phase.setdefault(str(parse_fields("oom", r[4]).get("phase")), []).append(r)
    out = []
    if "prefill" in by_phase:
        out.append(_prefill(ctx, by_phase.pop("prefill")))
    if "decode" in by_phase:
        out.append(_decode(ctx, by_phase.pop("decode")))
    for phase_rows in by_phase.values():
        out.append(Finding("oom.other", "critical", "Out of memory", "The scheduler ran out of KV memory.",
                           evidence_rows(phase_rows), "--mem-fraction-static", None, None, None))
    start = ctx.timeline.kind("not_enough_memory")
    if start:
        mfs = ctx.config.mem_fraction_static
        out.append(Finding(
            "oom.startup", "critical", "Not enough memory for the KV pool at start-up",
            "The weights left no room for a KV pool at the given memory fraction.", evidence_rows(start),
            "--mem-fraction-static", f"{mfs + 0.05:.2f}" if mfs else "higher", f"{mfs:g}" if mfs else None,
            "Less headroom for activations; if it still fails, use more GPUs (--tp-size) or a smaller dtype."))
    return out


def _prefill(ctx: Context, rows: list[tuple]) -> Finding:
    current = ctx.config.chunked_prefill_size
    suggested = PREFILL_TARGET if not current or current > PREFILL_TARGET else max(MIN_CHUNK, current // 2)
    fields = parse_fields("oom", rows[0][4])
    return Finding(
        "oom.prefill", "critical", f"Out of memory in prefill ({len(rows)}x)",
        f"A prefill batch asked for {fields.get('requested', '?')} KV slots with "
        f"{fields.get('available_tokens', '?')} available. Smaller chunks bound the tokens one prefill needs.",
        evidence_rows(rows, requested=fields.get("requested"), available=fields.get("available_tokens")),
        "--chunked-prefill-size", str(suggested), str(current) if current else None,
        "Long prompts take more, smaller prefill steps: slightly lower input throughput.",
        tuple(sorted({r[3] for r in rows})))


def _decode(ctx: Context, rows: list[tuple]) -> Finding:
    cap = ctx.config.max_running_requests
    decode = ctx.timeline.batches("decode")
    first = min(r[1] for r in rows)
    before = decode[decode["line"] < first]["running_req"].dropna() if len(decode) else decode
    p90 = float(before.quantile(0.9)) if len(before) else None
    suggested = int(0.75 * p90) if p90 else (cap // 2 if cap else None)
    return Finding(
        "oom.decode", "critical", f"Out of memory in decode ({len(rows)}x)",
        "A decode step could not get KV slots even after retracting. Fewer concurrent requests leave room "
        "for every running request to finish.",
        evidence_rows(rows, p90_running_before=p90, max_running_requests=cap),
        "--max-running-requests", str(max(1, suggested)) if suggested else None, str(cap) if cap else None,
        "Fewer concurrent requests: lower throughput under heavy load.", tuple(sorted({r[3] for r in rows})))
