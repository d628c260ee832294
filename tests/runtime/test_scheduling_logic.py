"""The pure scheduling rules with exact numbers: admission budget, chunking, lpm order, new-token ratio,
retraction victims and the ratio they leave."""
from __future__ import annotations

import pytest
import torch

from toolkit.runtime.memory.allocator import TokenAllocator
from toolkit.runtime.memory.req_to_token import ReqToTokenPool
from toolkit.runtime.sampling.sampling_params import SamplingParams
from toolkit.runtime.scheduler.cache_manager import CacheManager
from toolkit.runtime.scheduler.new_token_ratio import NewTokenRatio
from toolkit.runtime.scheduler.policy import SchedulePolicy
from toolkit.runtime.scheduler.prefill_adder import AddReqResult, PrefillAdder, running_reservation
from toolkit.runtime.scheduler.request import Req
from toolkit.runtime.scheduler.retraction import choose_victims, retraction_order


class _Slots:
    """The admission view of a KV cache with nothing cached (the radix cache off)."""

    def __init__(self, available: int, page_size: int = 1) -> None:
        self.available, self.page_size = available, page_size

    def available_size(self) -> int:
        return self.available

    def evictable_size(self) -> int:
        return 0

    def lock_prefix(self, req: Req) -> None:
        pass

    def unlock_prefix(self, req: Req) -> None:
        pass


def _manager(radix: bool) -> CacheManager:
    return CacheManager(ReqToTokenPool(4, 256, "cpu"), TokenAllocator(1024, 1, "cpu"), radix_cache=radix)


def _req(rid: str, input_len: int, max_new: int, generated: int = 0, first_token: int = 0) -> Req:
    req = Req(rid, [first_token + i for i in range(input_len)], SamplingParams(max_new_tokens=max_new))
    req.output_ids = [7] * generated
    return req


def _ready(req: Req) -> Req:
    req.init_next_round_input()
    return req


def test_running_requests_reserve_their_remaining_tokens_times_the_ratio():
    running = [_req("a", 10, 100, generated=40), _req("b", 10, 10_000, generated=0)]
    # min(100-40, 4096)*0.5 + min(10000, 4096)*0.5
    assert running_reservation(running, 0.5) == 30 + 2048


def test_admission_budget_is_free_plus_evictable_minus_reservations():
    running = [_req("r", 10, 200, generated=100)]  # reserves 100 * 0.7 = 70
    adder = PrefillAdder(_Slots(1000), running, 0.7, max_prefill_tokens=16384, chunked_prefill_size=None)
    assert adder.rem_total_tokens == pytest.approx(930)
    # 500 + 300 = 800 < 930: admitted, budget now 130
    assert adder.add_one_req(_ready(_req("a", 500, 300))) is AddReqResult.CONTINUE
    assert adder.rem_total_tokens == pytest.approx(130)
    # 100 + 30 = 130 is not < 130: refused for lack of KV
    assert adder.add_one_req(_ready(_req("b", 100, 30))) is AddReqResult.NO_TOKEN
    assert [r.rid for r in adder.can_run_list] == ["a"]


def test_max_new_tokens_estimate_is_clipped_at_4096():
    adder = PrefillAdder(_Slots(5000), [], 1.0, 16384, None)
    assert adder.add_one_req(_ready(_req("a", 100, 1_000_000))) is AddReqResult.CONTINUE
    assert adder.rem_total_tokens == 5000 - 100 - 4096


def test_request_cost_is_page_ceiled():
    adder = PrefillAdder(_Slots(1000, page_size=16), [], 1.0, 16384, None)
    adder.add_one_req(_ready(_req("a", 17, 10)))
    assert (adder.log_input_tokens, adder.rem_total_tokens) == (32, 1000 - 32 - 10)


def test_max_prefill_tokens_stops_the_batch_but_the_first_request_may_exceed_it():
    adder = PrefillAdder(_Slots(100_000), [], 1.0, max_prefill_tokens=100, chunked_prefill_size=None)
    assert adder.add_one_req(_ready(_req("big", 300, 10))) is AddReqResult.OTHER
    assert [r.rid for r in adder.can_run_list] == ["big"]
    assert adder.add_one_req(_ready(_req("next", 5, 10))) is AddReqResult.OTHER
    assert len(adder.can_run_list) == 1


def test_long_input_is_split_into_a_chunk_of_the_remaining_chunk_budget():
    adder = PrefillAdder(_Slots(100_000), [], 1.0, 16384, chunked_prefill_size=64)
    assert adder.add_one_req(_ready(_req("a", 40, 10))) is AddReqResult.CONTINUE  # 24 chunk tokens remain
    long_req = _ready(_req("b", 200, 10))
    assert adder.add_one_req(long_req) is AddReqResult.OTHER
    assert adder.new_chunked_req is long_req
    assert (long_req.extend_input_len, len(long_req.fill_ids)) == (24, 24)
    # the next round continues the chunked request from where it stopped
    long_req.prefix_indices = torch.arange(24)
    long_req.init_next_round_input()
    adder = PrefillAdder(_Slots(100_000), [], 1.0, 16384, chunked_prefill_size=64)
    assert adder.add_chunked_req(long_req) is long_req and long_req.extend_input_len == 64
    long_req.prefix_indices = torch.arange(152)
    long_req.init_next_round_input()
    adder = PrefillAdder(_Slots(100_000), [], 1.0, 16384, chunked_prefill_size=64)
    assert adder.add_chunked_req(long_req) is None  # the last 48 tokens fit: the chunked prefill is done
    assert long_req.extend_input_len == 48 and adder.rem_total_tokens == 100_000 - 48 - 10


def test_chunk_with_pages_leaves_room_for_a_page():
    adder = PrefillAdder(_Slots(100_000, page_size=16), [], 1.0, 16384, chunked_prefill_size=64)
    req = _ready(_req("a", 200, 10))
    adder.add_one_req(req)
    assert req.extend_input_len == 64 - 16 + 1


def test_lpm_orders_by_cached_prefix_and_deprioritizes_in_queue_sharing():
    cache = _manager(radix=True)
    cache.tree.insert(list(range(100)), cache.allocator.alloc(100))
    long_hit = _req("long-hit", 120, 10)  # tokens 0..119: 100 cached
    short_hit = _req("short-hit", 60, 10)  # tokens 0..59: 59 cached (one token is always computed)
    miss_a = _req("miss-a", 50, 10, first_token=1000)
    miss_b = _req("miss-b", 50, 10, first_token=1000)  # shares 49 tokens with miss-a, which goes first
    waiting = [miss_a, short_hit, miss_b, long_hit]
    assert SchedulePolicy("lpm", cache).sort(waiting) is True
    assert [r.rid for r in waiting] == ["long-hit", "short-hit", "miss-a", "miss-b"]
    assert [len(r.prefix_indices) for r in waiting] == [100, 59, 0, 0]


def test_lpm_falls_back_to_fcfs_above_128_waiting():
    cache = _manager(radix=True)
    waiting = [_req(str(i), 5, 1) for i in range(129)]
    policy = SchedulePolicy("lpm", cache)
    assert policy.active_policy(waiting) == "fcfs"
    assert policy.sort(waiting) is False and [r.rid for r in waiting] == [str(i) for i in range(129)]


def test_lof_puts_longest_output_first():
    waiting = [_req("a", 5, 10), _req("b", 5, 300), _req("c", 5, 20)]
    SchedulePolicy("lof", _manager(radix=False)).sort(waiting)
    assert [r.rid for r in waiting] == ["b", "c", "a"]


def test_new_token_ratio_init_decay_floor_and_reset():
    ratio = NewTokenRatio.from_conservativeness(1.0)
    assert (ratio.init, ratio.floor) == (pytest.approx(0.7), pytest.approx(0.098))
    assert ratio.decay == pytest.approx((0.7 - 0.098) / 600)
    for _ in range(300):
        ratio.step_decay()
    assert ratio.value == pytest.approx(0.7 - 300 * ratio.decay)
    for _ in range(400):
        ratio.step_decay()
    assert ratio.value == pytest.approx(0.098)
    ratio.reset()
    assert ratio.value == pytest.approx(0.7)
    assert NewTokenRatio.from_conservativeness(0.3).init == pytest.approx(0.21)
    assert NewTokenRatio.from_conservativeness(2.0).init == 1.0 and NewTokenRatio.from_conservativeness(2.0).floor == pytest.approx(0.14)


def test_retraction_victims_are_fewest_generated_then_longest_prompt():
    reqs = [_req("a", 10, 100, generated=5), _req("b", 50, 100, generated=2),
            _req("c", 10, 100, generated=2), _req("d", 10, 100, generated=9)]
    order = retraction_order(reqs)
    assert [reqs[i].rid for i in reversed(order)] == ["b", "c", "a", "d"]


def test_retraction_stops_when_twenty_tokens_per_remaining_request_are_free():
    reqs = [_req("a", 10, 100, generated=5), _req("b", 50, 100, generated=2),
            _req("c", 10, 100, generated=2), _req("d", 10, 100, generated=9)]
    free = {"n": 30}
    released = []

    def release(req: Req, remaining: int) -> None:
        released.append(req.rid)
        free["n"] += 15

    kept, retracted = choose_victims(reqs, lambda: free["n"], release)
    # 30 < 80 → retract b (45 < 60) → retract c (60 >= 40): stop
    assert released == ["b", "c"]
    assert sorted(reqs[i].rid for i in kept) == ["a", "d"]
    remaining = [reqs[i] for i in kept]
    ratio = NewTokenRatio.from_conservativeness(1.0)
    ratio.set_after_retraction(remaining)
    assert ratio.value == pytest.approx((5 + 9 + 20 * 2) / 200)


def test_retraction_takes_at_least_one_and_never_the_last():
    reqs = [_req("a", 10, 100), _req("b", 10, 100)]
    kept, retracted = choose_victims(reqs, lambda: 10_000, lambda req, remaining: None)
    assert len(retracted) == 1 and len(kept) == 1
    kept, retracted = choose_victims([_req("x", 5, 5)], lambda: 0, lambda req, remaining: None)
    assert retracted == [] and kept == [0]


def test_ratio_after_retraction_is_capped_at_one():
    ratio = NewTokenRatio.from_conservativeness(1.0)
    ratio.set_after_retraction([_req("a", 5, 10, generated=9)])
    assert ratio.value == 1.0
