"""`toolkit tune`'s session on fakes: the JSONL of every step, the summary, the page and the printed command;
Ctrl-C ends cleanly with the best command so far; options that cannot work are refused before any launch."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from rich.console import Console

from tests.tune.fakes import FakeLauncher, World, WorldDoctor, WorldWorkload
from tests.tune.test_loop import START, conservativeness_world
from toolkit.bench.command import BenchOptions
from toolkit.bench.datasets import DatasetSpec
from toolkit.bench.options import UsageError
from toolkit.tune.flags import Flags
from toolkit.tune.session import TuneOptions, run_tune


def options(out: Path, **changes) -> TuneOptions:
    workload = changes.pop("workload", BenchOptions(base_url="http://127.0.0.1:0", num_prompts=24))
    return TuneOptions(workload, start=START, out_dir=out, **changes)


def tune(out: Path, world: World, interrupt_at: int | None = None, **changes):
    console = Console(record=True, width=240, force_terminal=False)
    launcher = FakeLauncher()
    outcome = run_tune(options(out, **changes), console, launcher=launcher,
                       workload=WorldWorkload(world, interrupt_at), doctor=WorldDoctor(world))
    return outcome, console.export_text(), launcher


def test_every_step_goes_to_the_jsonl_with_its_evidence_and_the_page_shows_the_gain(tmp_path):
    outcome, text, launcher = tune(tmp_path, conservativeness_world(gain=30.0, lpm_gain=0.5))
    steps = [json.loads(line) for line in (tmp_path / "tune.jsonl").read_text().splitlines()]
    assert [s["status"] for s in steps] == ["baseline", "kept", "reverted"]
    kept = steps[1]
    assert kept["change"] == {"flag": "--schedule-conservativeness", "from": "2", "to": "0.3",
                              "text": "--schedule-conservativeness 2 → 0.3"}
    assert kept["finding"]["id"] == "usage.low_while_queued" and kept["values"] == [119.0, 121.0]
    assert kept["mean"] == pytest.approx(120.0) and kept["spread"] == pytest.approx(2 ** 0.5)
    assert kept["delta"] == pytest.approx(30.0) and kept["against"] == 0 and kept["threshold"] > 0
    assert kept["flags"] == {"--max-total-tokens": "2048", "--schedule-conservativeness": "0.3"}
    assert kept["records"][0]["output_throughput"] == 119.0 and kept["folder"].endswith("step-01")
    assert steps[2]["change"]["flag"] == "--schedule-policy" and steps[2]["against"] == 1
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["best"]["step"] == 1 and summary["gain"] == pytest.approx(30.0 / 90.0)
    assert summary["best"]["command"] == "--max-total-tokens 2048 --schedule-conservativeness 0.3"
    assert summary["reason"] == "nothing actionable is left" and summary["kept"] == [1]
    assert "best launch command" in text and "--max-total-tokens 2048 --schedule-conservativeness 0.3" in text
    assert "90.0 tok/s at the start → 120.0 tok/s at step 1 (+33%)" in text
    html = outcome.html_path.read_text()
    for anchor in ('id="summary"', 'id="command"', 'id="chart"', 'id="steps"', 'id="step-0"', 'id="step-2"',
                   "data:image/png;base64,", 'id="gain">+33%'):
        assert anchor in html, anchor
    assert all(s.stopped for s in launcher.servers) and len(launcher.servers) == 3
    assert outcome.exit_code == 0


def test_ctrl_c_stops_cleanly_and_still_prints_and_writes_the_best_so_far(tmp_path):
    outcome, text, launcher = tune(tmp_path, conservativeness_world(gain=30.0, lpm_gain=0.5), interrupt_at=5)
    steps = [json.loads(line) for line in (tmp_path / "tune.jsonl").read_text().splitlines()]
    assert [s["status"] for s in steps] == ["baseline", "kept", "interrupted"]
    assert outcome.exit_code == 130 and outcome.result.reason == "stopped by Ctrl-C"
    assert "stopped: stopped by Ctrl-C" in text and "--schedule-conservativeness 0.3" in text.split("best launch")[1]
    assert all(s.stopped for s in launcher.servers) and outcome.html_path.is_file()


def test_a_start_that_fails_exits_non_zero_and_says_why(tmp_path):
    world = conservativeness_world(gain=30.0)
    console = Console(record=True, width=240)
    outcome = run_tune(options(tmp_path), console, launcher=FakeLauncher(fail="the server exited with code 1"),
                       workload=WorldWorkload(world), doctor=WorldDoctor(world))
    assert outcome.exit_code == 1 and outcome.result.best is None
    assert "the starting configuration failed: launch failed" in console.export_text()


@pytest.mark.parametrize("changes, message", [
    ({"objective": "latency"}, "--objective 'latency'"),
    ({"objective": "goodput"}, "needs --slo"),
    ({"objective": "max-rate"}, "needs --slo"),
    ({"engine": "trtllm"}, "--engine 'trtllm'"),
    ({"repeats": 0}, "--repeats must be at least 1"),
    ({"workload": BenchOptions(base_url="http://x", sweep=True)}, "drop --sweep"),
    ({"workload": BenchOptions(base_url="http://x", rate="1,2")}, "a single number"),
    ({"workload": BenchOptions(base_url="http://x", dataset=DatasetSpec(name="custom", path=Path("/no/such")))},
     "no such file"),
])
def test_options_that_cannot_work_are_refused_before_any_launch(tmp_path, changes, message):
    launcher = FakeLauncher()
    world = conservativeness_world(gain=30.0)
    with pytest.raises(UsageError, match=message):
        run_tune(options(tmp_path, **changes), Console(quiet=True), launcher=launcher, workload=WorldWorkload(world),
                 doctor=WorldDoctor(world))
    assert launcher.servers == []


def test_the_tune_command_refuses_a_bad_objective_in_one_line():
    from typer.testing import CliRunner

    from toolkit.cli import app

    result = CliRunner().invoke(app, ["tune", "--objective", "goodput", "--flags", "--max-total-tokens 2048"])
    assert result.exit_code == 2 and "needs --slo" in result.output and "Traceback" not in result.output
    flags = CliRunner().invoke(app, ["tune", "--flags", "--a 1 stray"])
    assert flags.exit_code == 2 and "expected a --flag" in flags.output
    assert Flags.parse("--a 1").argv() == ["--a", "1"]


def test_knobs_are_named_by_idea_or_by_the_engines_flag_and_an_unknown_one_is_refused():
    from toolkit.tune.session import knob_ideas

    assert knob_ideas(("running_cap", "--chunked-prefill-size"), "sglang") == {"running_cap", "prefill_budget"}
    assert knob_ideas(("--max-num-seqs",), "vllm") == {"running_cap"} and knob_ideas((), "sglang") is None
    with pytest.raises(UsageError, match="--knobs '--max-num-seqs' is no tuning idea or sglang flag"):
        knob_ideas(("--max-num-seqs",), "sglang")


@pytest.mark.parametrize(("argv", "backend"), [((), "sglang"), (("--engine", "vllm"), "openai"),
                                               (("--engine", "vllm", "--backend", "openai-chat"), "openai-chat")])
def test_the_backend_follows_the_engine_unless_given(monkeypatch, argv, backend):
    """vLLM serves no /generate: `--engine vllm` alone must not send every request to a 404."""
    from typer.testing import CliRunner

    import toolkit.tune.session as session
    from toolkit.cli import app

    seen: list[TuneOptions] = []

    def record(opts: TuneOptions, console: Console) -> None:
        seen.append(opts)
        raise UsageError("recorded")

    monkeypatch.setattr(session, "run_tune", record)
    result = CliRunner().invoke(app, ["tune", *argv])
    assert result.exit_code == 2 and "recorded" in result.output, result.output
    assert seen[0].workload.backend == backend
