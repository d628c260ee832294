"""benchmarks.vs_vllm without a peer run: its variant flags, the environment words of a variant, and the refusal to
print a ratio when vLLM-CPU is not set up."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from benchmarks import vs_vllm

REPO = Path(__file__).resolve().parents[2]


def test_variants_repeat_and_keep_their_leading_dashes():
    args = vs_vllm.parse_args(["--rates", "inf", "--toolkit-variant=--disable-overlap-schedule",
                               "--toolkit-variant=TOOLKIT_CPU_DECODE_THREADS=2 --disable-overlap-schedule"])
    assert args.rates == ["inf"]
    assert args.toolkit_variants == ["--disable-overlap-schedule",
                                     "TOOLKIT_CPU_DECODE_THREADS=2 --disable-overlap-schedule"]


def test_key_value_words_become_the_server_environment_and_flags_stay_flags(tmp_path):
    command, env = vs_vllm.toolkit_launch(["TOOLKIT_CPU_DECODE_THREADS=2", "--disable-overlap-schedule",
                                           "--chunked-prefill-size=512"], 12345, tmp_path / "log")
    assert env == {"TOOLKIT_CPU_DECODE_THREADS": "2"}
    assert "--disable-overlap-schedule" in command and "--chunked-prefill-size=512" in command
    assert not any(word.startswith("TOOLKIT_") for word in command)


def test_without_vllm_it_says_so_and_exits_2(tmp_path):
    done = subprocess.run([sys.executable, "-m", "benchmarks.vs_vllm", "--peers-root", str(tmp_path)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "vLLM-CPU is not set up here" in done.stderr and "No ratio" in done.stderr
    assert "x |" not in done.stdout


def test_repeats_compare_the_median_run_and_keep_every_runs_throughput():
    repeats = [{"output_throughput": x, "mean_tpot_ms": 100.0 - x / 10} for x in (560.0, 480.0, 590.0, 530.0)]
    median = vs_vllm.median_run(repeats)
    assert median["output_throughput"] == 530.0 and median["mean_tpot_ms"] == 47.0  # the lower middle, whole run
    assert median["repeat_output_throughputs"] == [560.0, 480.0, 590.0, 530.0]
    assert vs_vllm.median_run(repeats[:3])["output_throughput"] == 560.0
    assert vs_vllm.parse_args(["--repeats", "3"]).repeats == 3


def test_the_table_shows_the_ratio_of_the_median_runs_and_each_runs_throughput():
    def result(*throughputs):
        run = vs_vllm.median_run([{"output_throughput": x, "mean_tpot_ms": 90.0, "mean_ttft_ms": 2000.0,
                                   "median_itl_ms": 80.0, "duration": 14.0} for x in throughputs])
        return {"runs": {"inf": run}}
    table = vs_vllm._table({"toolkit": result(500.0, 600.0, 550.0), "vllm": result(610.0, 600.0, 620.0)}, ["inf"])
    assert "| toolkit | inf | 550.0 | 500, 600, 550 | 0.90x |" in table
    assert "| vllm | inf | 610.0 | 610, 600, 620 | 1.00x (baseline) |" in table


def test_paired_ratios_divide_each_repeat_by_the_peers_same_repeat():
    def runs(throughputs, tpots):
        return vs_vllm.median_run([{"output_throughput": x, "mean_tpot_ms": t} for x, t in zip(throughputs, tpots)])
    ours, theirs = runs([600.0, 450.0, 660.0], [80.0, 99.0, 77.0]), runs([500.0, 500.0, 600.0], [100.0, 90.0, 70.0])
    paired = vs_vllm.paired_ratios(ours, theirs)
    assert paired["output_throughput"] == [1.2, 0.9, 1.1]  # repeat by repeat, not median over median (1.2)
    assert paired["median_output_throughput"] == 1.1 and paired["repeats_at_or_above"] == 2
    assert paired["mean_tpot_ms"] == [0.8, 1.1, 1.1] and paired["median_mean_tpot_ms"] == 1.1


def test_the_interleaved_table_adds_the_paired_ratios():
    def result(*throughputs):
        run = vs_vllm.median_run([{"output_throughput": x, "mean_tpot_ms": 90.0, "mean_ttft_ms": 2000.0,
                                   "median_itl_ms": 80.0, "duration": 14.0} for x in throughputs])
        return {"runs": {"inf": run}}
    results = {"toolkit": result(500.0, 660.0, 550.0), "vllm": result(625.0, 600.0, 500.0)}
    assert "per repeat" not in vs_vllm._table(results, ["inf"])
    table = vs_vllm._table(results, ["inf"], vs_vllm._paired(results, ["inf"]))
    assert "| toolkit | inf | 0.80, 1.10, 1.10 | 1.10x | 2 of 3 | 1.00 |" in table


def test_interleaving_runs_every_server_once_per_repeat_in_rotated_order():
    order = vs_vllm.interleaved_order(["toolkit", "vllm"], ["inf", "4"], 3)
    assert order[:6] == [("toolkit", "inf", 0), ("vllm", "inf", 0), ("vllm", "inf", 1), ("toolkit", "inf", 1),
                         ("toolkit", "inf", 2), ("vllm", "inf", 2)]
    assert len(order) == 12 and {(name, rate) for name, rate, _ in order} == {
        (n, r) for n in ("toolkit", "vllm") for r in ("inf", "4")}


class _FakeServer:
    def __init__(self, port: int, events: list) -> None:
        self.port, self.command, self.events = port, ["serve", str(port)], events

    def wait_healthy(self, timeout: float) -> None:
        self.events.append(("healthy", self.port))

    def stop(self) -> None:
        self.events.append(("stopped", self.port))

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def test_interleaved_servers_are_all_up_before_the_first_run_and_share_each_repeats_prompts(monkeypatch, tmp_path):
    events: list = []

    def fake_bench(peers, port, prompts, rate, seed, args, result):
        events.append(("run", port, rate, seed))
        return {"output_throughput": float(port + seed), "completed": prompts, "mean_tpot_ms": 1.0,
                "mean_ttft_ms": 1.0}

    monkeypatch.setattr(vs_vllm, "bench", fake_bench)
    args = vs_vllm.parse_args(["--rates", "inf", "4", "--repeats", "2", "--interleave"])
    contenders = [vs_vllm.Contender(name, lambda port=port: _FakeServer(port, events), 1.0)
                  for name, port in (("toolkit", 1), ("vllm", 2))]
    results = vs_vllm.measure_interleaved(contenders, vs_vllm.Peers(tmp_path), args, tmp_path)
    first_measured = next(i for i, e in enumerate(events) if e[0] == "run" and e[3] != vs_vllm.WARMUP_SEED)
    assert [e for e in events[:first_measured] if e[0] == "healthy"] == [("healthy", 1), ("healthy", 2)]
    measured = [e for e in events if e[0] == "run" and e[3] != vs_vllm.WARMUP_SEED]
    assert [(port, rate) for _, port, rate, _ in measured] == [(1, "inf"), (2, "inf"), (2, "inf"), (1, "inf"),
                                                               (1, "4"), (2, "4"), (2, "4"), (1, "4")]
    seeds = {(port, rate): sorted(seed for _, p, r, seed in measured if (p, r) == (port, rate))
             for port in (1, 2) for rate in ("inf", "4")}
    assert seeds[(1, "inf")] == seeds[(2, "inf")] and seeds[(1, "4")] == seeds[(2, "4")] != seeds[(1, "inf")]
    assert events[-2:] == [("stopped", 2), ("stopped", 1)]
    assert results["vllm"]["runs"]["inf"]["repeat_output_throughputs"] == [2.0 + s for s in seeds[(2, "inf")]]


def test_with_vllm_at_two_dtypes_the_best_at_each_rate_is_the_baseline():
    def result(inf: float, four: float):
        return {"runs": {rate: vs_vllm.median_run([{"output_throughput": x, "mean_tpot_ms": 90.0, "mean_ttft_ms": 1.0,
                                                     "median_itl_ms": 8.0, "duration": 1.0}])
                         for rate, x in (("inf", inf), ("4", four))}}
    results = {"toolkit": result(130.0, 90.0), "vllm": result(25.0, 95.0), "vllm float32": result(125.0, 80.0)}
    assert vs_vllm._baselines(results, ["inf", "4"]) == {"inf": "vllm float32", "4": "vllm"}
    ratios = vs_vllm._ratios(results, ["inf", "4"])
    assert ratios["toolkit"] == {"inf": 130.0 / 125.0, "4": 90.0 / 95.0} and ratios["vllm"]["inf"] == 25.0 / 125.0
    table = vs_vllm._table(results, ["inf", "4"])
    assert "| vllm | inf | 25.0 | 25 | 0.20x |" in table and "| vllm | 4 | 95.0 | 95 | 1.00x (baseline) |" in table
    assert vs_vllm.vllm_name("float32") == "vllm float32" and vs_vllm.vllm_name("bfloat16") == "vllm"
    assert vs_vllm.isa_environment("avx2")["ONEDNN_MAX_CPU_ISA"] == "AVX2" and vs_vllm.isa_environment("native") == {}
