"""`toolkit tune --launch` on a server that is not ours: a fake SGLang of known capacity (`--max-running-requests`
requests at once, 0.1 s each) that logs SGLang's lines to its output. The loop reads that output as the log,
raises the running cap to what the pinned-cap finding sizes from the pool (4), and the highest rate meeting the SLO doubles with it."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.server.server_process import alive, cmdline
from tests.tune.fake_sglang import SERVICE, SERVICE_S
from toolkit.bench.max_rate import TOLERANCE
from toolkit.cli import app

pytestmark = pytest.mark.slow  # a long unit: it starts early (tests/xdist_units.py)

MODULE = "tests.tune.fake_sglang"
PROMPTS, TTFT_SLO_S, ATTAINMENT = 24, 0.1, 0.9


def slo_boundary(slots: int) -> float:
    """The highest constant rate at which 90% of the requests start within the TTFT bound: request k waits
    k * (1/capacity - 1/rate) in the queue, and may wait the bound less the script's own TTFT."""
    allowed = TTFT_SLO_S - SERVICE.ttft
    return 1.0 / (SERVICE_S / slots - allowed / (ATTAINMENT * PROMPTS))


def test_tune_launch_raises_the_running_cap_of_a_foreign_server_and_doubles_its_max_rate(tmp_path):
    out = tmp_path / "tune"
    launch = f"{sys.executable} -m {MODULE} --model-path fake-model {{flags}}"
    result = CliRunner().invoke(app, [
        "tune", "--launch", launch, "--flags", "--max-running-requests 2", "--objective", "max-rate",
        "--slo", "ttft:100", "--num-prompts", "24", "--arrival", "constant", "--random-input-len", "16",
        "--random-output-len", "4", "--repeats", "1", "--max-steps", "1", "--search-runs", "6",
        "--health-timeout", "60", "--out", str(out)])
    assert result.exit_code == 0, result.output
    pids = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]
    assert not [pid for pid in pids if MODULE in cmdline(pid) and alive(pid)], "a launched server outlived tune"
    start, step = [json.loads(line) for line in (out / "tune.jsonl").read_text().splitlines()]
    assert start["verdict"].startswith("NEEDS TUNING: Running batch pinned at max_running_requests")
    assert step["finding"]["id"] == "running_cap.pinned"
    assert step["change"] == {"flag": "--max-running-requests", "from": "2", "to": "4",
                              "text": "--max-running-requests 2 → 4"}
    for slots, found in ((2, start["mean"]), (4, step["mean"])):
        boundary = slo_boundary(slots)
        assert boundary / (1 + TOLERANCE) ** 1.5 <= found <= boundary * 1.03, (slots, found, boundary)
    assert step["status"] == "kept" and 1.8 <= step["mean"] / start["mean"] <= 2.5
    assert all(r["search"]["role"] in ("saturation", "probe") for r in step["records"])
    assert "Decode batch." in (out / "step-00" / "server.out").read_text()
    assert step["command"] == f"{sys.executable} -m {MODULE} --model-path fake-model --max-running-requests 4"
    assert f"-m {MODULE} --model-path fake-model --max-running-requests 4" in " ".join(result.output.split())


@pytest.mark.parametrize("flags, reason", [
    ("--max-running-requests 2 --no-such-flag 1", "the starting configuration failed: launch failed"),
])
def test_a_start_that_does_not_launch_is_reported_not_raised(tmp_path, flags, reason):
    launch = f"{sys.executable} -m {MODULE} --model-path fake-model {{flags}}"
    result = CliRunner().invoke(app, ["tune", "--launch", launch, "--flags", flags, "--health-timeout", "30",
                                      "--out", str(tmp_path / "tune")])
    assert result.exit_code == 1 and reason in " ".join(result.output.split()), result.output
    step = json.loads((tmp_path / "tune" / "tune.jsonl").read_text())
    assert step["status"] == "failed" and "unrecognized arguments: --no-such-flag" in step["error"]


def test_the_goodput_objective_counts_only_requests_within_the_slo(tmp_path):
    out = tmp_path / "tune"
    launch = f"{sys.executable} -m {MODULE} --model-path fake-model {{flags}}"
    result = CliRunner().invoke(app, [
        "tune", "--launch", launch, "--flags", "--max-running-requests 2", "--objective", "goodput",
        "--slo", "ttft:100", "--rate", "30", "--num-prompts", "24", "--arrival", "constant",
        "--random-input-len", "16", "--random-output-len", "4", "--repeats", "2", "--max-steps", "1",
        "--health-timeout", "60", "--out", str(out)])
    assert result.exit_code == 0, result.output
    start, step = [json.loads(line) for line in (out / "tune.jsonl").read_text().splitlines()]
    for entry in (start, step):
        assert entry["values"] == [pytest.approx(r["goodput"]) for r in entry["records"]]
    attained = [[r["slo_attainment"] for r in entry["records"]] for entry in (start, step)]
    assert max(attained[0]) < 0.9 <= min(attained[1]), attained  # 30 req/s is past 2 slots' capacity, not 4's
    assert step["status"] == "kept"
    assert step["change"]["text"] == "--max-running-requests 2 → 4"
