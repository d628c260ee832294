"""Which DP replica a request goes to (`--load-balance-method`) and the totals /metrics reports over replicas: pure
logic, no server."""
from __future__ import annotations

import re

from toolkit.runtime.io_struct import SchedulerStats, TokenOutput
from toolkit.runtime.server.load_balance import LoadBalancer, ReplicaLoad
from toolkit.runtime.server.metrics import RequestMetrics


def test_round_robin_takes_the_replicas_in_turn():
    balancer = LoadBalancer("round_robin", 3)
    loads = [ReplicaLoad(9, 900), ReplicaLoad(0, 0), ReplicaLoad(5, 5)]
    assert [balancer.choose(loads) for _ in range(7)] == [0, 1, 2, 0, 1, 2, 0]


def test_shortest_queue_picks_the_fewest_open_requests_and_spreads_ties():
    balancer = LoadBalancer("shortest_queue", 3)
    assert balancer.choose([ReplicaLoad(4, 10), ReplicaLoad(2, 9000), ReplicaLoad(3, 1)]) == 1
    loads = [ReplicaLoad(1, 0), ReplicaLoad(1, 0), ReplicaLoad(1, 0)]
    assert [balancer.choose(loads) for _ in range(4)] == [2, 0, 1, 2]


def test_minimum_tokens_picks_the_fewest_open_tokens():
    balancer = LoadBalancer("minimum_tokens", 2)
    loads = [ReplicaLoad(1, 5000), ReplicaLoad(7, 700)]
    assert balancer.choose(loads) == 1
    loads[1].open_tokens += 4400
    assert balancer.choose(loads) == 0


def _value(text: str, name: str, dp_rank: str) -> float:
    return float(re.search(rf'{name}{{dp_rank="{dp_rank}",model_name="m"}} (\S+)', text).group(1))


def test_metrics_carry_each_replica_and_their_totals():
    metrics = RequestMetrics("m", [1000, 3000])
    metrics.on_scheduler_stats(SchedulerStats(num_running_reqs=3, num_used_tokens=500, token_usage=0.5,
                                              total_prefill_tokens=90, total_cached_tokens=10), 0)
    metrics.on_scheduler_stats(SchedulerStats(num_running_reqs=4, num_used_tokens=1500, token_usage=0.5,
                                              total_prefill_tokens=70, total_cached_tokens=30), 1)
    metrics.on_finish(1.5, TokenOutput("r", 1, None, 7, 3, 0), 1)
    text = metrics.render().decode()
    assert _value(text, "sglang:num_running_reqs", "0") == 3 and _value(text, "sglang:num_running_reqs", "1") == 4
    assert _value(text, "sglang:num_running_reqs", "all") == 7
    assert _value(text, "sglang:token_usage", "all") == 0.5  # 2000 of 4000 tokens
    assert _value(text, "sglang:cache_hit_rate", "all") == 0.2  # 40 cached of 200
    assert _value(text, "sglang:max_total_num_tokens", "all") == 4000
    assert _value(text, "sglang:num_requests_total", "1") == 1 and _value(text, "sglang:num_requests_total", "all") == 1
    assert _value(text, "sglang:num_requests_total", "0") == 0


def test_one_replica_keeps_sglangs_labels():
    text = RequestMetrics("m", 1000).render().decode()
    assert 'sglang:max_total_num_tokens{model_name="m"} 1000.0' in text and "dp_rank" not in text


def test_requests_aborts_and_flushes_reach_the_right_replicas():
    """Two replicas' ZMQ pairs: round robin alternates them, an abort goes to the replica that holds the request, a
    flush waits for both answers."""
    import asyncio
    import time

    import zmq

    from toolkit.runtime.io_struct import AbortRequest, FlushCacheRequest, FlushCacheResult, GenerateInput
    from toolkit.runtime.sampling.sampling_params import SamplingParams
    from toolkit.runtime.server.ipc import IpcEndpoints
    from toolkit.runtime.server.tokenizer_manager import TokenizerManager

    async def run() -> None:
        endpoints = [IpcEndpoints.fresh(), IpcEndpoints.fresh()]
        manager = TokenizerManager(endpoints, tokenizer=None, metrics=None, stream_interval=1)
        context = zmq.Context()
        inboxes = [context.socket(zmq.PULL) for _ in endpoints]
        for inbox, endpoint in zip(inboxes, endpoints):
            inbox.connect(endpoint.to_scheduler)
        try:
            deadline = time.monotonic() + 10
            for replica, inbox in zip(manager.replicas, inboxes):  # until both connections are up
                while not replica.send(FlushCacheRequest()):
                    assert time.monotonic() < deadline
                    await asyncio.sleep(0.01)
                assert inbox.poll(2000) and inbox.recv_pyobj() == FlushCacheRequest()
            for i in range(4):
                manager.generate([1, 2, 3], SamplingParams(max_new_tokens=2), rid=f"r{i}")
            got = [[], []]
            for d, inbox in enumerate(inboxes):
                while len(got[d]) < 2 and inbox.poll(2000):
                    got[d].append(inbox.recv_pyobj())
            assert [[m.rid for m in messages] for messages in got] == [["r0", "r2"], ["r1", "r3"]]
            assert all(isinstance(m, GenerateInput) for m in got[0] + got[1])
            assert [r.load.open_requests for r in manager.replicas] == [2, 2]
            manager.abort("r3")
            assert inboxes[1].poll(2000) and inboxes[1].recv_pyobj() == AbortRequest("r3")
            assert not inboxes[0].poll(200)
            assert [r.load.open_requests for r in manager.replicas] == [2, 1]
            flush = asyncio.ensure_future(manager.flush_cache(timeout=10))
            await asyncio.sleep(0)
            assert all(inbox.poll(2000) and inbox.recv_pyobj() == FlushCacheRequest() for inbox in inboxes)
            manager._dispatch(FlushCacheResult(True), 0)
            assert not flush.done()
            manager._dispatch(FlushCacheResult(False), 1)
            assert await flush is False
        finally:
            manager.close()
            context.destroy(linger=0)
            for endpoint in endpoints:
                endpoint.cleanup()

    asyncio.run(run())
