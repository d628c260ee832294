"""The soak benchmark, 30 seconds of it (`python -m benchmarks.soak` runs 30 minutes): `toolkit serve` with a 2048-token pool under `toolkit bench` at twice its
capacity plus a chaos client (disconnects mid-stream, resets before the headers, half-sent bodies, client
timeouts). Nothing but the expected client aborts may fail, and the server must come out of it clean."""
from __future__ import annotations

import json

import pytest

from tests.machine_speed import scaled
from benchmarks import soak


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_30_second_soak_leaves_the_server_clean(tmp_path, capsys):
    out = tmp_path / "soak.json"
    # NOTE: a 10 s client timeout (the full run's is 20 s) still times requests out at twice the capacity, and the
    # queue left at the end drains in half the time
    soak.main(["--duration", "30", "--request-timeout", "10", "--out", str(out)])
    result = json.loads(out.read_text())
    verdict, requests = result["verdict"], result["requests"]
    assert verdict["no_unexpected_errors"], (requests["unexpected_bench_errors"], requests["chaos_errors"])
    assert verdict["health_every_sample"], result["health"]["failures"]
    assert verdict["no_log_problems"], result["log"]
    assert verdict["pool_empty_at_end"], result["final_state"]
    assert verdict["every_chaos_kind_ran"], requests["chaos_by_kind"]
    assert verdict["sigterm_exit_0"] and result["shutdown"]["seconds"] < scaled(5.0), result["shutdown"]
    assert requests["bench_completed"] > 0 and requests["bench_errors_by_kind"].get("timeout", 0) > 0, requests
    # NOTE: 30 s is too short to judge RSS flatness (the 30-minute run does); a per-request leak in the front end
    # of even ~50 KB would still show here.
    front_end = result["rss"]["after_warmup"]["front_end_mb"]
    assert front_end["end"] < front_end["start"] + 64, front_end
    assert {"command", "git_commit", "device", "date"} <= set(result)
