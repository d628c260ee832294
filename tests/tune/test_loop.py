"""The tuning loop on a scripted world (no server): keep/revert, the noise test, failed launches, budgets, Ctrl-C,
severity order and the push-until-it-breaks knob."""
from __future__ import annotations

import pytest

from tests.tune.fakes import CLIENT, LOW_USAGE, TRY_LPM, Advice, World, flag
from toolkit.diagnose.findings import Current
from toolkit.diagnose.vocabulary import Change
from toolkit.tune.flags import Flags
from toolkit.tune.loop import Settings, Tuner
from toolkit.tune.objective import NoiseRule, Sample, compare

START = Flags.parse("--max-total-tokens 2048 --schedule-conservativeness 2")


def conservativeness_world(gain: float, lpm_gain: float = 0.0) -> World:
    """Lowering the conservativeness to 0.3 gains `gain` tok/s; lpm gains `lpm_gain`; repeats are ±1 tok/s."""

    def objective(flags: Flags) -> tuple[float, ...]:
        mean = 90.0 + (gain if flag(flags, "--schedule-conservativeness", "1") == "0.3" else 0.0)
        mean += lpm_gain if flags.get("--schedule-policy") == "lpm" else 0.0
        return (mean - 1.0, mean + 1.0)

    def findings(flags: Flags) -> tuple[Advice, ...]:
        low = () if flags.get("--schedule-conservativeness") == "0.3" else (LOW_USAGE,)
        return (TRY_LPM, CLIENT) + low

    return World(objective, findings)


def test_a_change_that_beats_the_noise_is_kept_and_the_loop_ends_when_nothing_is_left():
    world = conservativeness_world(gain=30.0, lpm_gain=0.5)
    result = Tuner(world, clock=world.clock).run(START)
    assert [s.status for s in result.steps] == ["baseline", "kept", "reverted"]
    kept = result.steps[1]
    assert kept.change.flag == "--schedule-conservativeness" and kept.change.value == "0.3"
    assert kept.finding.id == "usage.low_while_queued" and kept.against == 0
    assert kept.comparison.delta == pytest.approx(30.0) and kept.comparison.better
    assert result.best is kept and result.best.flags.get("--max-total-tokens") == "2048"
    assert result.steps[2].change.flag == "--schedule-policy" and result.steps[2].against == 1
    assert result.reason == "nothing actionable is left"


def test_a_change_within_the_noise_is_reverted_and_never_tried_again():
    world = conservativeness_world(gain=1.5)
    result = Tuner(world, clock=world.clock).run(START)
    assert [s.status for s in result.steps] == ["baseline", "reverted", "reverted"]
    assert result.best is result.steps[0] and len(world.asked) == 3
    assert result.reason.startswith("nothing helped")
    assert [s.change.flag for s in result.steps[1:]] == ["--schedule-conservativeness", "--schedule-policy"]


def test_the_most_severe_actionable_finding_drives_the_first_step():
    findings = (TRY_LPM, Advice("oom.decode", "critical", Change("running_cap", "12"), Current.of(64)),
                Advice("fp8.kv_cache", "warning", Change("kv_dtype", "fp8")), CLIENT)  # SGLang spells it fp8_e5m2
    world = World(lambda flags: (10.0, 10.0), lambda flags: findings)
    result = Tuner(world, Settings(max_steps=1), clock=world.clock).run(START)
    assert result.steps[1].change.flag == "--max-running-requests" and result.steps[1].change.value == "12"
    assert result.steps[1].finding.severity == "critical"


def test_a_latency_finding_is_not_taken_for_throughput_and_is_for_an_slo_objective():
    """A smaller chunk against decode stalls trades throughput away (tune_vs_search's tiny pool: -16 %): a throughput
    objective passes it by; goodput and max-rate, whose SLOs it may serve, take it."""
    stalls = Advice("prefill_stall.throughput_dips", "warning", Change("prefill_budget", "1024"), Current.of(2048),
                    serves="latency")
    world = World(lambda flags: (10.0, 10.0), lambda flags: (stalls,))
    result = Tuner(world, Settings(max_steps=2), clock=world.clock).run(START)
    assert len(result.steps) == 1 and result.reason.startswith("nothing actionable")
    world = World(lambda flags: (10.0, 10.0), lambda flags: (stalls,))
    result = Tuner(world, Settings(max_steps=2, objective="goodput"), clock=world.clock).run(START)
    assert result.steps[1].change.flag == "--chunked-prefill-size"


@pytest.mark.parametrize("best, candidate, better", [
    ((90.0, 92.0), (120.0, 122.0), True),  # far beyond the spread
    ((90.0, 92.0), (91.0, 93.5), False),  # within the spread
    ((60.0, 120.0), (100.0, 140.0), False),  # a big gain, but the repeats scatter even more
    ((100.0, 100.0), (102.0, 102.0), False),  # no spread at all, but under the 3% margin
    ((100.0, 100.0), (104.0, 104.0), True),
    ((100.0,), (102.5,), False),  # one repeat: only the margin applies
    ((100.0,), (103.5,), True),
])
def test_the_noise_rule_asks_for_k_pooled_standard_errors_and_a_minimum_margin(best, candidate, better):
    assert compare(Sample(best), Sample(candidate), NoiseRule(k=2.0, min_gain=0.03)).better is better


def test_the_noise_rule_threshold_is_k_pooled_standard_errors():
    result = compare(Sample((90.0, 92.0)), Sample((120.0, 126.0)), NoiseRule(k=2.0, min_gain=0.0))
    pooled = ((2 ** 0.5) ** 2 / 2 + (18 ** 0.5) ** 2 / 2) ** 0.5
    assert result.threshold == pytest.approx(2.0 * pooled * (1 / 2 + 1 / 2) ** 0.5)
    assert result.delta == pytest.approx(32.0) and result.relative == pytest.approx(32.0 / 91.0)


def test_a_failed_launch_is_a_reverted_step_and_the_loop_goes_on():
    world = conservativeness_world(gain=0.0, lpm_gain=20.0)
    world.fails = lambda flags: flags.get("--schedule-conservativeness") == "0.3"
    result = Tuner(world, clock=world.clock).run(START)
    assert [s.status for s in result.steps] == ["baseline", "failed", "kept"]
    assert "launch failed" in result.steps[1].trial.error
    assert result.best.flags.get("--schedule-policy") == "lpm"
    assert result.best.flags.get("--schedule-conservativeness") == "2"


def test_a_start_that_does_not_launch_stops_the_loop_with_the_reason():
    world = conservativeness_world(gain=30.0)
    world.fails = lambda flags: True
    result = Tuner(world, clock=world.clock).run(START)
    assert [s.status for s in result.steps] == ["failed"] and result.best is None
    assert result.reason.startswith("the starting configuration failed: launch failed")


def doubling_world() -> World:
    """The running cap is always pinned and doubling it always helps: the loop would go on forever."""

    def objective(flags: Flags) -> tuple[float, ...]:
        cap = int(flag(flags, "--max-running-requests", "2"))
        return (10.0 * cap, 10.0 * cap + 1.0)

    def findings(flags: Flags) -> tuple[Advice, ...]:
        cap = int(flag(flags, "--max-running-requests", "2"))
        return (Advice("running_cap.pinned", "warning", Change("running_cap", str(cap * 2)), Current.of(cap)),)

    return World(objective, findings)


def test_the_step_budget_bounds_the_loop():
    world = doubling_world()
    result = Tuner(world, Settings(max_steps=3), clock=world.clock).run(Flags.parse("--max-running-requests 2"))
    assert [s.status for s in result.steps] == ["baseline", "kept", "kept", "kept"]
    assert result.best.flags.get("--max-running-requests") == "16"
    assert result.reason == "the step budget is spent (3 steps)" and len(world.asked) == 4


def test_the_time_budget_stops_before_a_step_that_would_not_fit():
    world = doubling_world()
    world.step_seconds = 100.0
    result = Tuner(world, Settings(max_steps=100, max_time=250.0), clock=world.clock).run(Flags())
    assert len(result.steps) == 2 and result.reason.startswith("the time budget is spent (200 s of 250 s")
    assert result.seconds == pytest.approx(200.0)


def test_ctrl_c_stops_the_loop_and_keeps_the_best_so_far():
    world = doubling_world()
    world.interrupt_at = 2
    seen: list[str] = []
    result = Tuner(world, on_step=lambda step, best: seen.append(step.status), clock=world.clock).run(Flags())
    assert [s.status for s in result.steps] == ["baseline", "kept", "interrupted"] and seen == ["baseline", "kept",
                                                                                                  "interrupted"]
    assert result.reason == "stopped by Ctrl-C" and result.best is result.steps[1]
    assert result.best.flags.get("--max-running-requests") == "4"


def test_ctrl_c_during_the_start_leaves_no_best():
    world = doubling_world()
    world.interrupt_at = 0
    result = Tuner(world, clock=world.clock).run(Flags())
    assert result.steps == [] and result.best is None and result.reason == "stopped by Ctrl-C"


def test_a_push_knob_grows_its_step_until_it_helps_and_stops_where_the_launch_breaks():
    more_memory = Advice("gpu_memory.too_much", "warning", Change("kv_memory", direction=1), Current.of(0.8))

    def objective(flags: Flags) -> tuple[float, ...]:
        mfs = float(flag(flags, "--mem-fraction-static", "0.8"))
        return (100.0, 101.0) if mfs < 0.835 else (120.0, 121.0)

    world = World(objective, lambda flags: (more_memory,),
                  fails=lambda flags: float(flag(flags, "--mem-fraction-static", "0.8")) >= 0.845)
    result = Tuner(world, clock=world.clock).run(Flags.parse("--mem-fraction-static 0.8"))
    tried = [s.flags.get("--mem-fraction-static") for s in result.steps]
    assert tried == ["0.8", "0.81", "0.82", "0.84", "0.85"]
    assert [s.status for s in result.steps] == ["baseline", "reverted", "reverted", "kept", "failed"]
    assert result.best.flags.get("--mem-fraction-static") == "0.84" and result.reason == "nothing actionable is left"


def test_a_push_knob_stops_after_a_bounded_number_of_tries():
    more_memory = Advice("gpu_memory.too_much", "warning", Change("kv_memory", "0.95"), Current.of(0.8))
    world = World(lambda flags: (100.0, 101.0), lambda flags: (more_memory,))
    result = Tuner(world, clock=world.clock).run(Flags.parse("--mem-fraction-static 0.8"))
    tried = [s.flags.get("--mem-fraction-static") for s in result.steps[1:]]
    assert tried == ["0.81", "0.82", "0.84", "0.88"] and result.reason.startswith("nothing helped")


def test_vllm_advice_uses_vllm_names_and_skips_what_vllm_cannot_do():
    findings = (LOW_USAGE, Advice("oom.decode", "warning", Change("running_cap", "48"), Current.of(64)))
    world = World(lambda flags: (10.0, 10.0), lambda flags: findings)
    result = Tuner(world, Settings(engine="vllm"), clock=world.clock).run(Flags.parse("--max-num-seqs 64"))
    assert [s.change.flag for s in result.steps[1:]] == ["--max-num-seqs"]
    assert result.steps[1].flags.get("--max-num-seqs") == "48"


def test_a_vllm_memory_push_starts_from_the_default_the_finding_quotes():
    more_memory = Advice("capacity.pool_bound", "warning", Change("kv_memory", direction=1), Current.of(0.9, "default"))
    world = World(lambda flags: (100.0, 101.0), lambda flags: (more_memory,))
    result = Tuner(world, Settings(engine="vllm", max_steps=2), clock=world.clock).run(Flags())
    assert [s.flags.get("--gpu-memory-utilization") for s in result.steps[1:]] == ["0.91", "0.92"]


def test_knobs_limit_what_the_loop_may_move_and_it_goes_on_to_the_next_finding():
    findings = (Advice("oom.decode", "critical", Change("running_cap", "12"), Current.of(64)), LOW_USAGE,
                Advice("joint", "critical", Change("prefill_budget", "512", companions=(Change("running_cap", "8"),))))
    world = World(lambda flags: (10.0, 10.0), lambda flags: findings)
    settings = Settings(max_steps=1, knobs=frozenset({"admission", "prefill_budget"}))
    result = Tuner(world, settings, clock=world.clock).run(START)
    # the cap is not among the knobs, nor is the joint change's companion: the admission finding drives the step
    assert result.steps[1].change.flag == "--schedule-conservativeness"


def test_an_unsized_higher_on_a_plain_knob_doubles_it_until_it_stops_paying():
    """`toolkit tune` against searches (benchmarks/tune_vs_search): a pool-bound finding said only "higher" for a
    hand-set --max-total-tokens, and the loop stopped with the pool still binding; now it doubles the value."""
    bigger_pool = Advice("capacity.pool_bound", "warning", Change("kv_cap", direction=1), Current.of(1024))

    def objective(flags: Flags) -> tuple[float, ...]:
        pool = int(flag(flags, "--max-total-tokens", "1024"))
        return (100.0, 101.0) if pool < 2048 else (150.0, 151.0)

    world = World(objective, lambda flags: (bigger_pool,), fails=lambda flags: int(
        flag(flags, "--max-total-tokens", "1024")) >= 8192)
    result = Tuner(world, clock=world.clock).run(Flags.parse("--max-total-tokens 1024"))
    tried = [s.flags.get("--max-total-tokens") for s in result.steps]
    assert tried == ["1024", "2048", "4096"]
    assert [s.status for s in result.steps] == ["baseline", "kept", "reverted"]
    assert result.best.flags.get("--max-total-tokens") == "2048" and result.reason.startswith("nothing")


def test_an_unsized_lower_halves_the_value_and_a_failed_launch_is_not_retried():
    smaller = Advice("x.y", "warning", Change("running_cap", direction=-1), Current.of(64))
    world = World(lambda flags: (100.0, 101.0), lambda flags: (smaller,),
                  fails=lambda flags: flags.get("--max-running-requests") == "32")
    result = Tuner(world, clock=world.clock).run(Flags.parse("--max-running-requests 64"))
    assert [s.flags.get("--max-running-requests") for s in result.steps] == ["64", "32"]
    assert result.steps[1].status == "failed" and result.reason.startswith("nothing")
