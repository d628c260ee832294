"""The SSE benchmark's log side: the per-token step median it compares the client's ITL p50 with."""
from __future__ import annotations

from benchmarks.sse_streams import decode_steps, full_step_times_ms, per_token_median

LOG = """[2026-11-23 19:59:00] Decode batch. #running-req: 8, #token: 99, token usage: 0.00, cuda graph: False, gen throughput (token/s): 0.10, #queue-req: 0
[2026-11-23 20:00:00] Prefill batch. #new-seq: 4, #new-token: 128, #cached-token: 0, token usage: 0.00, #running-req: 0, #queue-req: 0
[2026-11-23 20:00:00] Decode batch. #running-req: 4, #token: 132, token usage: 0.01, cuda graph: False, gen throughput (token/s): 400.00, #queue-req: 0
[2026-11-23 20:00:00] Decode batch. #running-req: 4, #token: 136, token usage: 0.01, cuda graph: False, gen throughput (token/s): 200.00, #queue-req: 0
[2026-11-23 20:00:00] Decode batch. #running-req: 1, #token: 34, token usage: 0.00, cuda graph: False, gen throughput (token/s): 200.00, #queue-req: 0
[2026-11-23 20:00:00] Decode batch. #running-req: 4, #token: 140, token usage: 0.01, cuda graph: False, gen throughput (token/s): 0.00, #queue-req: 0
"""


def test_each_step_counts_once_per_token_it_produced(tmp_path):
    log = tmp_path / "server.log"
    log.write_text(LOG)
    steps = decode_steps(log)
    # the first line (its time runs from start-up) and a line with no throughput measured are left out
    assert steps == [(4, 10.0), (4, 20.0), (1, 5.0)]
    # 9 tokens: 1 at 5 ms, 4 at 10 ms, 4 at 20 ms -> the 5th token's step is the median
    assert per_token_median(steps) == 10.0
    assert per_token_median([(1, 5.0), (8, 30.0)]) == 30.0  # an unweighted median of steps would say 17.5


def test_full_steps_need_a_full_step_before_them(tmp_path):
    log = tmp_path / "server.log"
    log.write_text(LOG)
    assert full_step_times_ms(log, batch=4) == [20.0]  # the first full step follows the prefill
