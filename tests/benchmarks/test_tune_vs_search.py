"""`benchmarks.tune_vs_search` with its launches faked by a known objective: the searches spend the budgets they are
given, Optuna is told the start and every launch (failures as failures), random search shares one stream, and the
bests are re-measured and paired round by round."""
from __future__ import annotations

import json

import pytest

import benchmarks.tune_vs_search as tvs
from toolkit.tune.flags import Flags

START = Flags.parse("--max-running-requests 2 --max-total-tokens 1024")


def objective(flags: Flags) -> float | None:
    """Throughput that grows with the cap and the pool; a 768-token pool fails to launch."""
    point = tvs.space_values(flags)
    if point["--max-total-tokens"] == "768":
        return None
    cap = 16 if point["--max-running-requests"] == tvs.DEFAULT else int(point["--max-running-requests"])
    pool = 8192 if point["--max-total-tokens"] == tvs.DEFAULT else int(point["--max-total-tokens"])
    return float(min(cap, 8) * 10 + min(pool, 4096) / 256)


def fake_measure(calls: list[str]):
    def measure(flags: Flags) -> tvs.Measured:
        calls.append(flags.text())
        value = objective(flags)
        return tvs.Measured(flags.text(), value, () if value is None else (value,),
                            None if value is not None else "launch failed", 1.0)
    return measure


def test_space_points_round_trip_and_refuse_values_outside_the_space():
    point = tvs.space_values(START)
    assert point == {"--max-running-requests": "2", "--max-total-tokens": "1024",
                     "--chunked-prefill-size": tvs.DEFAULT, "--schedule-conservativeness": tvs.DEFAULT}
    assert tvs.with_values(Flags(), point).key == START.key
    with pytest.raises(ValueError, match="--max-running-requests 5 is not in the search space"):
        tvs.space_values(Flags.parse("--max-running-requests 5"))


def test_random_draws_are_a_fixed_stream_of_distinct_points_in_the_space():
    draws = tvs.random_draws(40, seed=3)
    assert draws == tvs.random_draws(40, seed=3) and draws[:10] == tvs.random_draws(10, seed=3)
    assert len({tuple(d.values()) for d in draws}) == 40
    assert all(d[flag] in choices for d in draws for flag, choices in tvs.SPACE.items())
    assert tvs.random_draws(5, seed=4) != draws[:5]


def test_random_search_spends_its_launches_starting_from_the_start():
    start = tvs.Measured(START.text(), 30.0)
    draws = [tvs.Measured(f"--max-running-requests {n}", float(n)) for n in (1, 90, 3, 4, 5, 6, 7)]
    equal = tvs.random_search(START, start, draws, 3)
    assert [m.flags for m in equal.launches] == [START.text(), "--max-running-requests 1", "--max-running-requests 90"]
    assert equal.best == "--max-running-requests 90" and tvs.random_search(START, start, draws, 2).best == START.text()
    assert len(tvs.random_search(START, start, draws, 8).launches) == 8


def test_optuna_is_told_the_start_and_every_launch_and_beats_the_start_on_a_smooth_objective():
    calls: list[str] = []
    start = tvs.Measured(START.text(), objective(START))
    search = tvs.optuna_search(START, start, fake_measure(calls), launches=12, seed=0)
    assert len(search.launches) == 12 and len(calls) == 11  # the start is told, not launched again
    assert search.launches[0] is start
    best = next(m for m in search.launches if m.flags == search.best)
    assert best.value > start.value
    assert all(m.value is None for m in search.launches if "--max-total-tokens 768" in m.flags)


def test_paired_ratios_are_per_round_against_the_best_median():
    values = {"a": [100.0, 90.0, 110.0], "b": [50.0, None, 60.0], "c": [101.0, 95.0, 99.0]}
    ratios = tvs.paired_ratios(values)
    assert ratios["a"]["is_best"] and ratios["a"]["median_ratio"] == 1.0
    assert ratios["b"]["ratios"] == [0.5, 0.545] and ratios["b"]["median_ratio"] == 0.523
    assert ratios["c"]["ratios"] == [1.01, 1.056, 0.9] and ratios["c"]["spread"] == [0.9, 1.056]


def _faked_launches(monkeypatch, measure, run_tuner):
    """tune and every launch faked by `measure`: the options, the shared random stream and its `draw_more`."""
    monkeypatch.setattr(tvs, "run_tuner", run_tuner)
    monkeypatch.setattr(tvs, "Launches", lambda target, workload, repeats, root, objective: measure)
    draws: list[tvs.Measured] = []

    def draw_more(count: int) -> None:
        for point in tvs.random_draws(count, 0)[len(draws):]:
            draws.append(measure(tvs.with_values(Flags(), point)))

    return tvs.build_parser().parse_args(["--rounds", "2"]), draws, draw_more


def test_a_start_compares_every_method_on_the_same_reused_measurements(monkeypatch, tmp_path):
    calls: list[str] = []
    measure = fake_measure(calls)

    def run_tuner(target, start, workload, folder, repeats, max_steps, objective):
        steps = [start, start.set("--max-running-requests", "8"), start.set("--max-running-requests", "8")
                 .set("--max-total-tokens", "4096")]
        return tvs.Search("tune", [measure(f) for f in steps], 3.0, steps[-1].text(), "nothing actionable left")

    opts, draws, draw_more = _faked_launches(monkeypatch, measure, run_tuner)
    result = tvs.compare_start(tvs.TOOLKIT, "cap and pool low", START, tvs.WORKLOAD.options(), opts, tmp_path, draws,
                               draw_more, tvs.Console(quiet=True))
    assert result["tune_launches"] == 3 and len(draws) == 4 * 3 - 1
    launches = {s["method"]: s["launches"] for s in result["searches"]}
    assert launches == {"tune": 3, "random": 3, "optuna": 3, "random 4x": 12}
    assert result["result"]["control"]["flags"] == START.text() and result["result"]["control"]["launches"] == 0
    tuned = result["result"]["tune"]
    assert tuned["flags"] == "--max-running-requests 8 --max-total-tokens 4096" and tuned["ratio"] == 1.0
    assert result["result"]["control"]["ratio"] == pytest.approx(objective(START) / objective(Flags.parse(
        tuned["flags"])), abs=1e-3)
    assert json.loads(json.dumps(result)) == result  # saved as JSON as it is


def test_the_vllm_target_launches_vllm_serve_with_the_flags_and_sends_openai_requests(tmp_path):
    from benchmarks.vs_vllm import SERVED_NAME, Peers

    target = tvs.vllm_target(Peers(tmp_path))
    start = Flags.parse(next(iter(target.starts.values())))
    assert all(tvs.space_values(Flags.parse(flags), target.space) for flags in target.starts.values())
    command = target.launcher().command(start.set("--max-num-seqs", "8"), 8123, tmp_path)
    assert command[0] == "env" and "VLLM_SERVER_DEV_MODE=1" in command  # /reset_prefix_cache between repeats
    serve = command.index(str(tmp_path / "peer_vllm" / "bin" / "vllm"))
    assert command[serve + 1:serve + 3] == ["serve", str(tmp_path / "models" / "smollm2-135m-instruct-bf16")]
    assert command[command.index("--port") + 1] == "8123" and command[-6:-4] == ["--max-num-seqs", "8"]
    workload = target.workload(tvs.VLLM_WORKLOAD)
    assert (workload.backend, workload.model) == ("openai", SERVED_NAME)
    assert all(d[flag] in choices for d in tvs.random_draws(10, 0, target.space)
               for flag, choices in target.space.items())


def test_a_rerun_against_a_saved_comparison_runs_tune_again_and_keeps_the_saved_searches(monkeypatch, tmp_path):
    calls: list[str] = []
    measure = fake_measure(calls)
    tuner_steps = {"before": ["--max-running-requests", "8"], "after": ["--max-running-requests", "16"]}
    version = ["before"]

    def run_tuner(target, start, workload, folder, repeats, max_steps, objective):
        steps = [start, start.set(*tuner_steps[version[0]])]
        return tvs.Search("tune", [measure(f) for f in steps], 2.0, steps[-1].text(), "nothing actionable left")

    opts, draws, draw_more = _faked_launches(monkeypatch, measure, run_tuner)
    saved = json.loads(json.dumps(tvs.compare_start(tvs.TOOLKIT, "cap and pool low", START, tvs.WORKLOAD.options(),
                                                    opts, tmp_path, draws, draw_more, tvs.Console(quiet=True))))
    version[0], before = "after", len(calls)
    again = tvs.compare_against(tvs.TOOLKIT, saved, tvs.WORKLOAD.options(), opts, tmp_path, tvs.Console(quiet=True))
    assert again["chosen"]["tune"] == START.set("--max-running-requests", "16").text()
    assert [s for s in again["searches"] if s["method"] != "tune"] == [
        s for s in saved["searches"] if s["method"] != "tune"]
    configs = len(set(again["chosen"].values()))
    assert len(calls) - before == 2 + 2 * configs  # tune's two launches, then every best twice: nothing else


def test_the_max_rate_objective_reaches_every_method_with_a_bench_that_searches_rates(monkeypatch, tmp_path):
    from toolkit.tune.session import TuneOptions, check_tune_options

    objectives: list[str] = []
    monkeypatch.setattr(tvs, "run_tuner", lambda target, start, workload, folder, repeats, max_steps, objective: (
        objectives.append(f"tune {objective}"), tvs.Search("tune", [tvs.Measured(start.text(), 1.0, (1.0,))]))[1])

    def launches(target, workload, repeats, root, objective):
        objectives.append(f"{root.name} {objective}")
        return lambda flags: tvs.Measured(flags.text(), 1.0, (1.0,))

    monkeypatch.setattr(tvs, "Launches", launches)
    monkeypatch.setattr(tvs, "OUT", tmp_path)
    assert tvs.main(["--objective", "max-rate", "--starts", "cap and pool low", "--rounds", "1"]) == 0
    assert sorted(set(objectives)) == ["check max-rate", "optuna max-rate", "random max-rate", "tune max-rate"]
    workload = tvs.MaxRate().options(tvs.TOOLKIT.workload(tvs.WORKLOAD))
    assert workload.num_prompts is None and workload.duration and workload.slo and workload.rate == "1"
    opts = tvs.build_parser().parse_args(["--max-rate-runs", "3"])
    assert (opts.max_rate_runs, opts.max_rate_duration) == (3, tvs.MaxRate().duration)
    check_tune_options(TuneOptions(workload, "max-rate"))  # what tune itself accepts
