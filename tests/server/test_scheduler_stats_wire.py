"""The scheduler's counters cross the process boundary as one typed message (`io_struct.SchedulerStats`): the
scheduler sends a copy with every step, the front end keeps it per replica and serves it by attribute."""
from __future__ import annotations

import pickle
import re
from dataclasses import asdict

from toolkit.runtime.io_struct import BatchOutput, SchedulerStats
from toolkit.runtime.server.ipc import IpcEndpoints
from toolkit.runtime.server.metrics import RequestMetrics
from toolkit.runtime.server.tokenizer_manager import TokenizerManager


def _gauge(metrics: RequestMetrics, name: str) -> float:
    return float(re.search(rf'{name}{{model_name="m"}} (\S+)', metrics.render().decode()).group(1))


def test_a_batch_output_carries_scheduler_stats_over_pickle():
    stats = SchedulerStats(num_running_reqs=3, token_usage=0.25, total_retracted_reqs=2)
    received = pickle.loads(pickle.dumps(BatchOutput([], stats)))
    assert isinstance(received.stats, SchedulerStats) and received.stats == stats
    assert BatchOutput([]).stats == SchedulerStats()


def test_the_front_end_keeps_each_replicas_stats_typed_and_feeds_metrics():
    endpoints = IpcEndpoints.fresh()
    metrics = RequestMetrics("m", 1000)
    manager = TokenizerManager(endpoints, None, metrics, stream_interval=1)
    try:
        assert manager.stats == SchedulerStats()  # NOTE: zeros before the scheduler's first message
        stats = SchedulerStats(num_running_reqs=2, num_queue_reqs=1, num_used_tokens=400, token_usage=0.4,
                               total_retracted_reqs=5)
        manager._dispatch(BatchOutput([], stats))
        assert isinstance(manager.stats, SchedulerStats) and manager.stats.num_used_tokens == 400
        assert _gauge(metrics, "sglang:num_used_tokens") == 400 and _gauge(metrics, "sglang:token_usage") == 0.4
        assert _gauge(metrics, "sglang:num_retracted_requests_total") == 5
        assert asdict(manager.stats)["num_queue_reqs"] == 1  # what /get_server_info's internal_states shows
    finally:
        manager.close()
        endpoints.cleanup()
