"""Held-out batch 23's lessons (tests/diagnose/real_logs/README.md, "Held-out batch 23"), each a general rule:

- a rank's run of load lines with a request waiting at both ends is steady however short it is: a DP excerpt whose
  sixteen ranks print one or two decode lines each still shows a running cap pinned with a queue (before, a segment
  under three lines was all ramp, and nothing was judged: "0 steady decode lines of 27");
- the same short runs without a queue stay ramp: a line or two of a rank that nobody waits on says nothing of a cap.
"""
from __future__ import annotations

from toolkit.diagnose import analyze

POOL = ("[2026-01-12 05:01:32 DP0 TP0 EP0] max_total_num_tokens=75904, chunked_prefill_size=-1, "
        "max_prefill_tokens=1500, max_running_requests=16, context_len=65536, available_gpu_mem=5.41 GB")


def _dp_excerpt(queue: int) -> list[str]:
    lines = [POOL]
    for second in (20, 24):
        for rank in range(8):
            lines.append(f"[2026-01-12 05:15:{second} DP{rank} TP{rank} EP{rank}] Decode batch, #running-req: 16, "
                         f"#token: 45824, token usage: 0.60, cuda graph: True, gen throughput (token/s): 350.41, "
                         f"#queue-req: {queue}, ")
    return lines


def test_short_runs_with_a_queue_on_many_ranks_are_steady_and_show_the_pinned_cap():
    d = analyze(lines=_dp_excerpt(queue=1))
    assert len(d.timeline.steady()) == 16
    pinned = [f for f in d.findings if f.id == "running_cap.pinned"]
    assert pinned and pinned[0].flag == "--max-running-requests"


def test_short_runs_nobody_waits_on_stay_ramp():
    d = analyze(lines=_dp_excerpt(queue=0))
    assert len(d.timeline.steady()) == 0
    assert "running_cap.pinned" not in {f.id for f in d.findings}
