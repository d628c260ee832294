"""`toolkit bench` and `toolkit tune` declare their shared workload flags once: same names, help and defaults, except
the differences tune declares (`tune.cli.WORKLOAD_DIFFERENCES`), and the same parsing into `BenchOptions`."""
from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from toolkit.bench.command import BenchOptions
from toolkit.bench.workload_options import FLAGS, Flag, command_flags
from toolkit.cli import app
from toolkit.tune.cli import NUM_PROMPTS, WORKLOAD_DIFFERENCES


def params(command: str) -> dict[str, Any]:
    """The command's parsed flags by name, as typer hands them to click (TyperOption)."""
    group: Any = typer.main.get_command(app)
    return {param.name: param for param in group.commands[command].params if param.name}


def shown(param: Any) -> dict[str, Any]:
    """What `--help` shows of a flag and how it parses: spellings, help, default, env var, type and bounds (its click
    type's class and settings: a range's bounds, a choice's choices)."""
    return {"opts": param.opts, "secondary_opts": param.secondary_opts, "help": param.help, "default": param.default,
            "envvar": param.envvar, "type": (type(param.type).__name__, vars(param.type))}


def declared(flag: Flag) -> dict[str, Any]:
    return {"help": flag.help, "default": flag.default}


def shared_values(options: BenchOptions) -> dict[str, Any]:
    return {flag.name: getattr(options.dataset, flag.dataset_field) if flag.dataset_field
            else getattr(options, flag.name) for flag in FLAGS}


def test_every_shared_flag_shows_the_same_help_and_default_in_bench_and_tune():
    bench, tune = params("bench"), params("tune")
    for flag in FLAGS:
        assert flag.name in bench and flag.name in tune, flag.name
        in_bench, in_tune = shown(bench[flag.name]), shown(tune[flag.name])
        assert {k: in_bench[k] for k in ("help", "default")} == declared(flag), flag.name
        expected = {**in_bench, **WORKLOAD_DIFFERENCES.get(flag.name, {})}
        assert in_tune == expected, flag.name


def test_tune_declares_only_real_differences():
    flags = {flag.name: flag for flag in FLAGS}
    for name, changes in WORKLOAD_DIFFERENCES.items():
        for field, value in changes.items():
            assert getattr(flags[name], field) != value, f"{name}.{field} is the same as bench's"
    with pytest.raises(ValueError, match="no_such_flag"):
        command_flags({"no_such_flag": {"default": 1}})


def test_the_same_flags_parse_into_the_same_workload_in_bench_and_tune(monkeypatch):
    seen: dict[str, BenchOptions] = {}

    def bench_run(options: BenchOptions) -> int:
        seen["bench"] = options
        return 0

    def tune_run(options, console) -> SimpleNamespace:
        seen["tune"] = options.workload
        return SimpleNamespace(exit_code=0)

    monkeypatch.setattr("toolkit.bench.command.run", bench_run)
    monkeypatch.setattr("toolkit.tune.session.run_tune", tune_run)
    args = ["--backend", "openai-chat", "--model", "m", "--extra-request-body", '{"stop": ["."]}',
            "--request-rate", "5", "--arrival", "gamma", "--burstiness", "0.5", "--num-prompts", "7",
            "--max-concurrency", "3", "--warmup-requests", "0", "--seed", "9", "--request-timeout", "30",
            "--no-ignore-eos", "--slo", "ttft:100", "--slo-attainment", "0.8", "--search-runs", "4", "--dataset-name",
            "generated-shared-prefix", "--random-input-len", "10", "--random-output-len", "5",
            "--random-range-ratio", "0.25", "--gsp-num-groups", "2", "--gsp-prompts-per-group", "3",
            "--gsp-system-prompt-len", "40", "--gsp-question-len", "8", "--gsp-output-len", "6",
            "--sharegpt-output-len", "11", "--trace-time-scale", "2"]
    for command in ("bench", "tune"):
        result = CliRunner().invoke(app, [command, *args], env={"OPENAI_API_KEY": "sk-test"})
        assert result.exit_code == 0, result.output
    assert shared_values(seen["bench"]) == shared_values(seen["tune"])
    assert seen["bench"].dataset.gsp_num_groups == 2 and seen["bench"].slo == ("ttft:100",)
    assert seen["bench"].api_key == "sk-test" and seen["bench"].rate == "5"


def test_tune_sends_its_own_number_of_prompts_unless_a_duration_is_given(monkeypatch):
    seen: list[BenchOptions] = []
    monkeypatch.setattr("toolkit.tune.session.run_tune",
                        lambda options, console: seen.append(options.workload) or SimpleNamespace(exit_code=0))
    for args in ([], ["--duration", "5"]):
        assert CliRunner().invoke(app, ["tune", *args]).exit_code == 0
    assert [(w.num_prompts, w.duration) for w in seen] == [(NUM_PROMPTS, None), (None, 5.0)]
    assert seen[0].dataset.random_input_len == 128 and not seen[0].progress
