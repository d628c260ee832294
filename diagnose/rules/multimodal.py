"""`multimodal.profile` (vLLM): the multimodal profile run took the memory the KV cache needed.

vLLM V0 profiles a multimodal model (an encoder-decoder such as Llama 3.2 Vision) with a dummy batch of
`--max-num-seqs` requests, each with the most images a prompt may hold (`Starting profile run for multi-modal
models.`; vllm#10569: 256 images of 560 x 560 at the default 256), and sizes the KV cache from what that peak
leaves. Trigger: that line, and after it either a start-up traceback through the profile run
(`determine_num_available_blocks`, `profile_run`) before any GPU blocks line, or GPU blocks that hold fewer
requests of the max model len than `--max-num-seqs` (`Maximum concurrency for L tokens per request: C x`, C below
it; vllm#9630: 70.38 x for 128). Advice: `--max-num-seqs` the largest power of two at most C, or where start-up
failed (its error line cut, or naming memory) a quarter of the current (V0's default 256 where the log does not
give it); nothing where that is not below the current.
"""
from __future__ import annotations

from toolkit.diagnose.findings import Current, Finding, evidence_events
from toolkit.diagnose.read.events import Event
from toolkit.diagnose.rules.context import Context, pow2_at_most
from toolkit.diagnose.vocabulary import Change

DEFAULT_MAX_NUM_SEQS = 256  # vLLM V0's, on GPUs


def check(ctx: Context) -> list[Finding]:
    cfg, tl = ctx.config, ctx.timeline
    profiles = tl.kind("mm_profile")
    if not cfg.vllm or not profiles:
        return []
    at = profiles[-1]
    seqs = cfg.value("running_cap")
    current = seqs if isinstance(seqs, int) and not isinstance(seqs, bool) and seqs > 0 else None
    blocks = [e for e in tl.kind("gpu_blocks") if e.source == at.source and e.line > at.line]
    failed = [e for e in tl.kind("exception") if e.source == at.source and e.line > at.line
              and "profile_run" in e.error.signs and e.error.about_memory]
    if failed and not blocks:
        asked = current or DEFAULT_MAX_NUM_SEQS
        if asked // 4 < 1:
            return []
        return [_finding(ctx, [at, *failed[:1]], asked // 4, asked, current, "start-up failed in the profile run")]
    held = [e for e in tl.kind("max_concurrency") if e.source == at.source and e.line > at.line
            and isinstance(e.fields.get("max_concurrency"), float)]
    if not held or current is None:
        return []
    fits = float(held[-1].fields["max_concurrency"])  # type: ignore[arg-type]
    if fits >= current or fits < 2:  # NOTE: below 2 the largest power of two under it is 1: no smaller batch
        return []
    return [_finding(ctx, [at, held[-1]], pow2_at_most(fits), current, current,
                     f"the KV cache left holds {fits:g} requests of the max model len, fewer than the {current} it "
                     "may run")]


def _finding(ctx: Context, rows: list[Event], suggested: int, asked: int, current: int | None, what: str) -> Finding:
    return Finding(
        id="multimodal.profile", severity="warning", title="The multimodal profile run took the KV cache's memory",
        message=f"vLLM profiled the model with a dummy batch of {asked} multimodal requests (its max-num-seqs), each "
        f"with the most images a prompt may hold, and {what}: the profile's activation peak grows with that batch, and "
        f"the KV cache gets what it leaves. A max-num-seqs of {suggested} profiles a smaller batch.",
        evidence=evidence_events(rows, max_num_seqs=asked), change=Change("running_cap", str(suggested)),
        current=Current.of(current) if current is not None else None,
        tradeoff="Fewer requests run at once (less throughput under load); a larger KV cache holds longer contexts.")
