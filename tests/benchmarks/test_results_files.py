"""Benchmark results keep every run: the latest in `name.json`, all of them in `name.runs.jsonl`."""
from __future__ import annotations

import json

from benchmarks.common import write_result


def test_every_run_is_kept_and_the_latest_is_the_json(tmp_path):
    (tmp_path / "bench.json").write_text(json.dumps({"run": 0}))  # written before run logs existed
    for run in (1, 2):
        path = write_result("bench", {"run": run}, tmp_path)
    assert json.loads(path.read_text()) == {"run": 2}
    runs = [json.loads(line) for line in (tmp_path / "bench.runs.jsonl").read_text().splitlines()]
    assert runs == [{"run": 0}, {"run": 1}, {"run": 2}]
