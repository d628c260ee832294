"""`benchmarks.tune_vs_grid --recheck`: the latest saved run's bests re-measured (the measurements faked here), paired
round by round against the grid's best, and saved next to the run with its median and spread."""
from __future__ import annotations

import json

import benchmarks.common as common
import benchmarks.tune_vs_grid as tvg

GRID_BEST = "--max-total-tokens 1536 --max-running-requests 12"
RUN = {"workload": {"prompts": 12, "input_len": 128, "output_len": 16}, "grid_best": {"flags": GRID_BEST},
       "provenance": {"date": "2026-11-27T01:20:35+00:00"},
       "starts": [{"name": "cap too low", "runs_ratio": 0.07,
                   "tuner": {"best_flags": "--max-total-tokens 1536 --max-running-requests 9"}},
                  {"name": "too conservative", "runs_ratio": 0.04, "tuner": {"best_flags": GRID_BEST}}]}


def test_recheck_pairs_each_round_and_saves_median_and_spread(tmp_path, monkeypatch):
    (tmp_path / "tune_vs_grid.runs.jsonl").write_text(json.dumps({"old": True}) + "\n" + json.dumps(RUN) + "\n")
    monkeypatch.setattr(common, "RESULTS", tmp_path)
    monkeypatch.setattr(tvg, "write_result", lambda name, record: common.write_result(name, record, tmp_path))
    measured: list[list[str]] = []

    def remeasure(configs, workload, folder, rounds, say):
        measured.append([c.text() for c in configs])
        assert workload.num_prompts == 12 and rounds == 3
        return {GRID_BEST: [20.0, 30.0, 10.0],
                "--max-total-tokens 1536 --max-running-requests 9": [19.0, 33.0, None]}

    monkeypatch.setattr(tvg, "remeasure", remeasure)
    assert tvg.main(["--recheck", "--rounds", "3", "--save"]) == 0
    assert measured == [[GRID_BEST, "--max-total-tokens 1536 --max-running-requests 9"]]  # each config once
    saved = json.loads((tmp_path / "tune_vs_grid_recheck.json").read_text())
    cap, same = saved["starts"]
    assert cap["check"]["ratios"] == [0.95, 1.1] and cap["check"]["median_ratio"] == 1.025  # a failed run is skipped
    assert cap["check"]["spread"] == [0.95, 1.1] and same["check"]["ratios"] == [1.0, 1.0, 1.0]
    assert saved["of"] == RUN["provenance"]["date"] and saved["rounds"] == 3
