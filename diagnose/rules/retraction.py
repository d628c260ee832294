"""`retraction.frequent`: decode ran out of KV slots and requests were retracted (SGLang) or preempted (vLLM):
re-queued and recomputed later.

Judged from the retraction lines and their timestamps alone, per rank and per TP group, so an excerpt without
decode lines is judged too (docs/log-formats.md §6.1). A rank's rate is its retractions per busy minute: its
load segments' wall time when it has load lines, else the time from its first to its last retraction, and at
least one minute either way (so a few seconds of excerpt never inflate the rate). A DP rank's TP ranks retract
together; their retractions within one second are one event of the group.
Trigger: more than FREQUENT_PER_MIN per busy minute on a rank or group, at least MIN_COUNT retractions on one
engine (a rank; V0's cumulative counter tells engines apart within one: rllm-org/rllm#93's two preempted once
each);
critical above CRITICAL_PER_MIN (a storm). Without timestamps (SGLang 0.1-0.2.5): more than one retraction per
PER_DECODE_LINES decode lines. vLLM V1 prints `Preemptions: N` per stats interval; V0 warns once per 50.
Below the trigger, retractions are occasional and fine: a note, no finding. V0 warns at its 1st, 51st, 101st, ...
preemption: its lines count by their counter (`_engine_counts`).

`retraction.swapped` (vLLM V0), where `retraction.frequent` has nothing to say: at least SWAPPED_SHARE of the busy
stats lines (requests running or swapped out) show requests swapped out to CPU memory (`Swapped: N reqs` > 0):
more KV memory (or fewer sequences), at the confidence of those lines.
"""
from __future__ import annotations

import numpy as np

from toolkit.diagnose.findings import Current, Finding, confidence_of, evidence, evidence_events
from toolkit.diagnose.read.events import Event
from toolkit.diagnose.read.values import Value
from toolkit.diagnose.rules.context import MIN_LINES, Context, memory_fraction, more_kv_memory
from toolkit.diagnose.vocabulary import Change

FREQUENT_PER_MIN = 1.0
CRITICAL_PER_MIN = 10.0
MIN_COUNT = 2
PER_DECODE_LINES = 25
MIN_BUSY_S = 60.0
V0_WARN_EVERY = 50  # vLLM V0 warns at its 1st, 51st, 101st, ... preemption (`total_num_cumulative_preemption=N`)
SWAPPED_SHARE = 0.5  # `retraction.swapped`: of the stats lines, at least this share with requests swapped out


def _retractions(ctx: Context) -> list[Event]:
    return ctx.timeline.kind("retract") + ctx.timeline.kind("preempt")


def _preemption_counts(ctx: Context) -> dict[str, tuple[int, float | None]]:
    """vLLM V1's `Preemptions: N` summed per rank: (count, its first-to-last span in seconds)."""
    load = ctx.timeline.load()
    if "preemptions" not in load:
        return {}
    counts = load["preemptions"]
    out = {}
    for rank in load.ranks:
        mine = load.rank_is(rank)
        n = int(np.nansum(counts[mine]))
        if n:
            times = load["time"][mine & (np.nan_to_num(counts) > 0)]
            out[rank] = (n, float(times.max() - times.min()) if len(times) and np.isfinite(times).all() else None)
    return out


def _busy(ctx: Context, rank: str, times: list[float]) -> float | None:
    busy = ctx.timeline.busy_seconds(rank) if rank in ctx.timeline.ranks else None
    if busy is None and times:
        busy = max(times) - min(times)
    if busy is None and len(ctx.timeline.ranks) == 1:
        busy = ctx.timeline.busy_seconds(ctx.timeline.ranks[0])
    return busy


def per_rank_rates(ctx: Context) -> dict[str, tuple[int, float | None]]:
    """{rank: (retractions, per busy minute or None without timestamps)}."""
    rows = _retractions(ctx)
    out: dict[str, tuple[int, float | None]] = {}
    for rank in sorted({e.rank for e in rows}):
        mine = [e for e in rows if e.rank == rank]
        times = [e.time for e in mine if e.time is not None]
        busy = _busy(ctx, rank, times) if len(times) == len(mine) else None
        n = sum(_engine_counts(mine))
        out[rank] = (n, n / max(busy, MIN_BUSY_S) * 60.0 if busy is not None else None)
    for rank, (n, span) in _preemption_counts(ctx).items():
        busy = _busy(ctx, rank, [0.0, span] if span is not None else [])
        out[rank] = (n, n / max(busy, MIN_BUSY_S) * 60.0 if busy is not None else None)
    return out


def group_rates(ctx: Context) -> dict[str, tuple[int, float]]:
    """{DP group: (distinct seconds with a retraction, per busy minute)} over the TP ranks of each group."""
    groups: dict[str, list[float]] = {}
    for e in _retractions(ctx):
        if e.time is not None:
            groups.setdefault(e.rank.dp_group or "all ranks", []).append(e.time)
    out = {}
    for group, times in groups.items():
        seconds = np.unique(np.floor(times))
        busy = max(max(times) - min(times), MIN_BUSY_S)
        out[group] = (len(seconds), len(seconds) / busy * 60.0)
    return out


def _engine_counts(rows: list[Event]) -> list[int]:
    """The retractions or preemptions `rows` (one rank's, in line order) stand for, per engine. vLLM V0's lines carry
    its counter (`total_num_cumulative_preemption=N`) and come at its 1st, 51st, 101st, ... preemption: a line
    continues the engine whose last counter is below it by a multiple of V0_WARN_EVERY (lines the excerpt lost in
    between) or by one (a vLLM that warned every time), the one with the largest such counter; any other starts an
    engine (Ray workers of several engines share a prefix without a rank). An engine stands for its counter's
    growth plus one; a line without a counter for one preemption of its own."""
    engines: list[list[int]] = []  # [first, last] counter of each engine
    alone = 0
    for e in rows:
        c = e.fields.get("cumulative_preemptions")
        if not isinstance(c, int) or isinstance(c, bool):
            alone += 1
            continue
        grown = [en for en in engines if en[1] < c and ((c - en[1]) % V0_WARN_EVERY == 0 or c - en[1] == 1)]
        if grown:
            max(grown, key=lambda en: en[1])[1] = c
        else:
            engines.append([c, c])
    return [last - first + 1 for first, last in engines] + [1] * alone


def _most_on_one_engine(rows: list[Event], rates: dict[str, tuple[int, float | None]]) -> int:
    """The most retractions one engine printed: a rank's own count (TP ranks retract together: not their sum;
    vLLM V1's come from its stats lines), within a rank vLLM V0's engines told apart by their counters."""
    most = 0
    for rank, (count, _) in rates.items():
        mine = [e for e in rows if e.rank == rank]
        counted = any(isinstance(e.fields.get("cumulative_preemptions"), int) for e in mine)
        most = max(most, max(_engine_counts(mine)) if counted else count)
    return most


def check(ctx: Context) -> list[Finding]:
    found, note = _frequent(ctx)
    if found:
        return found
    swapped = _swapped(ctx)
    if note is not None and not swapped:
        ctx.notes.append(note)
    return swapped


def _swapped(ctx: Context) -> list[Finding]:
    """vLLM V0's stats lines count the requests preempted to CPU memory (`Swapped: N reqs`): on at least
    SWAPPED_SHARE of them some wait there, so the KV cache cannot hold the running batch (vllm#5578: 100-137
    swapped at 99% KV)."""
    stats = ctx.timeline.load()
    if not ctx.config.vllm or "swapped_req" not in stats or not len(stats):
        return []
    out = np.nan_to_num(stats["swapped_req"]) > 0
    busy = stats.where(out | (np.nan_to_num(stats["running_req"]) > 0) if "running_req" in stats else out)
    swapped = stats.where(out)
    if not len(swapped) or len(swapped) / len(busy) < SWAPPED_SHARE:
        return []
    more = more_kv_memory(ctx.config)
    most = int(np.nanmax(swapped["swapped_req"]))
    usage = float(np.nanmax(swapped["usage"])) if "usage" in swapped else float("nan")
    confidence = confidence_of(len(swapped), MIN_LINES)
    return [Finding(
        id="retraction.swapped", severity="info" if confidence == "low" else "warning",
        title="Requests swapped out of the KV cache",
        message=f"In {len(swapped)} of {len(busy)} busy stats lines requests waited swapped out to CPU memory (up to "
        f"{most}, " + (f"KV cache usage up to {usage:.0%}" if usage == usage else "KV cache usage not printed")
        + "): vLLM preempted them because the KV cache could not hold the running batch, and swaps them back in "
        f"later. More KV memory, or fewer concurrent sequences ({ctx.config.flag('running_cap')}), helps.",
        evidence=evidence(swapped, len(busy), max_swapped=most, max_usage=round(usage, 3) if usage == usage else None),
        **_vllm_remedy(ctx), ranks=swapped.ranks, alternatives=(Change("running_cap", direction=-1),) if more else (),
        confidence=confidence)]


def _frequent(ctx: Context) -> tuple[list[Finding], str | None]:
    """The finding, or the note that the retractions are occasional."""
    rows = _retractions(ctx)
    rates = per_rank_rates(ctx)
    if not rates:
        return [], None
    count = sum(n for n, _ in rates.values())
    timed = {rank: rate for rank, (_, rate) in rates.items() if rate is not None}
    word = "preemptions" if ctx.config.vllm else "retractions"
    if not timed:
        decode_lines = len(ctx.timeline.series("decode"))
        frequent = decode_lines > 0 and count / decode_lines > 1 / PER_DECODE_LINES
        rate, how = None, f"{count} {word} in {decode_lines} decode lines"
        if decode_lines == 0:
            counted = _counted_only(ctx, rows)
            if counted is None:
                ctx.cannot_judge(f"{count} {word} without timestamps or decode lines to rate them by")
            return ([counted] if counted else []), None
    else:
        rank = max(timed, key=timed.get)  # type: ignore[arg-type]
        rate = timed[rank]
        groups = group_rates(ctx)
        where = f" on {rank}" if rank else ""
        ranks = f"{len(rates)} rank{'s' if len(rates) != 1 else ''}"
        how = f"{count} {word} on {ranks}, up to {rate:.1f} per busy minute{where}"
        if len(rates) > 1 and groups:
            g, (events, g_rate) = max(groups.items(), key=lambda kv: kv[1][1])
            how += f" ({events} distinct seconds with one in {g}: {g_rate:.1f} per minute for the group)"
        frequent = rate > FREQUENT_PER_MIN
    if not frequent or _most_on_one_engine(rows, rates) < MIN_COUNT:
        return [], f"{how}: occasional {word} are fine."
    severity = "critical" if rate is not None and rate > CRITICAL_PER_MIN else "warning"
    retracted = sum(_int(e.fields.get("retracted_reqs")) for e in rows if e.kind == "retract")
    facts = {"per_minute": round(rate, 2) if rate is not None else None, "retracted_requests": retracted or None,
             "ranks": len(rates), word: count}  # NOTE: more than the lines where V0 warns once per 50
    title = ("Preemption storm" if ctx.config.vllm else "Retraction storm") if severity == "critical" \
        else ("Frequent preemptions" if ctx.config.vllm else "Frequent retractions")
    if ctx.config.vllm:
        return [Finding(
            id="retraction.frequent", severity=severity, title=title,
            message=f"{how}. A preempted request loses its KV cache and is recomputed later: the KV cache is too small "
            f"for the running batch. More KV memory, or fewer concurrent sequences ({ctx.config.flag('running_cap')}"
            "), helps.",
            evidence=evidence_events(rows, **facts), **_vllm_remedy(ctx), ranks=tuple(sorted(rates)))], None
    current = ctx.config.schedule_conservativeness
    suggested = round(max(1.3, current * 1.3), 1)
    return [Finding(
        id="retraction.frequent", severity=severity, title=title,
        message=f"{how}" + (f" ({retracted} requests retracted)" if retracted else "")
        + ". Each retraction throws away decoded KV and re-prefills the request later; admission was too optimistic "
        "about how much the running requests would still decode.", evidence=evidence_events(rows, **facts),
        change=Change("admission", f"{suggested:g}"), current=Current.of(current),
        tradeoff="A higher value admits fewer requests at once: lower peak batch and throughput, fewer retractions.",
        ranks=tuple(sorted(rates)))], None


def _counted_only(ctx: Context, rows: list[Event]) -> Finding | None:
    """vLLM V0's counter where nothing rates the preemptions (no time, no load lines: a pasted warning, limo#29's
    `total_num_cumulative_preemption=101`): from its second warning on (more than V0_WARN_EVERY preemptions since
    the engine started) an info at low confidence, more KV memory; the excerpt cannot say over how long."""
    counters = [c for e in rows if isinstance(c := e.fields.get("cumulative_preemptions"), int)
                and not isinstance(c, bool)]
    if not counters or max(counters) <= V0_WARN_EVERY:
        return None
    most = max(counters)
    return Finding(
        id="retraction.counted", severity="info", title="Preemptions counted, not timed",
        message=f"vLLM's counter says {most} preemptions since the engine started (total_num_cumulative_preemption), "
        "and the excerpt shows no time to rate them by. If they came within the run you care about, the KV cache is "
        "too small for the running batch: each preempted request is recomputed later.",
        evidence=evidence_events(rows, preemptions=most), **_vllm_remedy(ctx),
        ranks=tuple(sorted({e.rank for e in rows if e.rank})), confidence="low")


def _vllm_remedy(ctx: Context) -> dict[str, Change | Current | str | None]:
    """The change, current value and trade-off for vLLM's preemptions: more KV memory, or fewer concurrent sequences
    where the memory fraction is at its highest already (`rules.context.more_kv_memory`)."""
    more = more_kv_memory(ctx.config)
    if more is None:
        return {"change": Change("running_cap", direction=-1), "current": None,
                "tradeoff": "A smaller batch: lower throughput at peak."}
    return {"change": more, "current": memory_fraction(ctx.config),
            "tradeoff": "Less memory left for activations and CUDA graphs: too high a value risks CUDA OOM."}


def _int(v: Value) -> int:
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else 0
