"""Flags: parsing, changing and writing them; diagnose's typed changes as flag changes in SGLang's or vLLM's names."""
from __future__ import annotations

import pytest

from tests.tune.fakes import Advice
from toolkit.diagnose.findings import Current
from toolkit.diagnose.vocabulary import Change
from toolkit.tune.flags import FlagChange, Flags, engine_flag, launch_line, propose
from toolkit.tune.launch import CommandLauncher, template_tokens


def test_flags_parse_values_switches_and_equals_forms_and_write_them_back():
    flags = Flags.parse("--max-total-tokens 2048 --enable-mixed-chunk --chunked-prefill-size=-1 --dtype bfloat16")
    assert flags.get("--max-total-tokens") == "2048" and flags.get("--enable-mixed-chunk") is True
    assert flags.get("--chunked-prefill-size") == "-1"
    assert flags.argv() == ["--max-total-tokens", "2048", "--enable-mixed-chunk", "--chunked-prefill-size", "-1",
                            "--dtype", "bfloat16"]
    assert Flags.parse(flags.argv()) == flags


def test_changing_a_flag_keeps_the_others_and_removing_one_restores_the_default():
    flags = Flags.parse("--a 1 --b 2")
    assert flags.set("--a", "3").argv() == ["--a", "3", "--b", "2"]
    assert flags.set("--a", None).argv() == ["--b", "2"] and flags.set("--c", True).argv()[-1] == "--c"
    assert flags.set("--a", "3").differences(flags) == [("--a", "3", "1")]
    assert Flags.parse("--b 2 --a 1").key == flags.key


def test_a_stray_positional_is_a_clear_error():
    with pytest.raises(ValueError, match="expected a --flag"):
        Flags.parse("--a 1 2")


@pytest.mark.parametrize("change, expected", [
    (Change("admission", "0.3"), ("--schedule-conservativeness", "0.3", ())),
    (Change("prefill_budget", "4096"), ("--chunked-prefill-size", "4096", ())),
    (Change("torch_compile", True, companions=(Change("torch_compile_max_bs", "32"),)),
     ("--enable-torch-compile", True, (("--torch-compile-max-bs", "32"),))),
    (Change("graphs_off", False), ("--disable-cuda-graph", None, ())),
    (Change("graph_max_bs", "256", companions=(Change("kv_memory", "0.83"),)),
     ("--cuda-graph-max-bs", "256", (("--mem-fraction-static", "0.83"),))),
    (Change("schedule_policy", "lpm"), ("--schedule-policy", "lpm", ())),
])
def test_a_findings_typed_change_becomes_a_flag_change(change, expected):
    proposal = propose(Advice("x", "warning", change), "sglang")
    assert (proposal.flag, proposal.value, proposal.companions) == expected


def test_alternatives_are_offered_in_the_advice_but_never_applied():
    """The prefill-stall finding offers mixed chunks instead of smaller chunks: tune takes only the change."""
    from toolkit.diagnose.findings import Evidence, Finding

    finding = Finding(id="prefill_stall.throughput_dips", severity="warning", title="t", message="m",
                      evidence=Evidence(), change=Change("prefill_budget", "4096"),
                      alternatives=(Change("mixed_chunk", True),))
    assert finding.suggested == "4096 (or --enable-mixed-chunk)"
    assert propose(finding, "sglang") == ("--chunked-prefill-size", "4096", 0, ())


@pytest.mark.parametrize("change", [
    None,
    Change("watchdog"),
    Change("admission", "lots"),
    Change("running_cap", False),
    Change("torch_compile", True, companions=(Change("torch_compile_max_bs", "many"),)),
])
def test_a_change_the_server_does_not_accept_is_not_actionable(change):
    assert propose(Advice("x", "warning", change), "sglang") is None


def test_an_unknown_idea_is_an_error():
    with pytest.raises(ValueError, match="unknown tuning idea"):
        Change("no_such_idea", "1")


def test_vllm_names_and_values():
    assert engine_flag("kv_memory", "vllm") == "--gpu-memory-utilization"
    assert engine_flag("admission", "vllm") is None
    graphs = propose(Advice("x", "warning", Change("graphs_off", False)), "vllm")
    assert (graphs.flag, graphs.value) == ("--enforce-eager", None)
    assert propose(Advice("x", "info", Change("schedule_policy", "lpm")), "vllm") is None
    assert propose(Advice("x", "info", Change("schedule_policy", "fcfs")), "vllm").flag == "--scheduling-policy"
    assert propose(Advice("x", "warning", Change("kv_memory", direction=1)), "vllm").direction == 1
    assert propose(Advice("x", "warning", Change("quantization", False)), "vllm") is None


def test_one_idea_becomes_the_launched_engines_flag_whichever_engine_wrote_the_log():
    seqs = Advice("running_cap.pinned", "warning", Change("running_cap", "512"), Current.of(256))
    assert propose(seqs, "vllm").flag == "--max-num-seqs" and propose(seqs, "sglang").flag == "--max-running-requests"
    default = Current.of(0.9, "default")
    assert propose(Advice("x", "warning", Change("kv_memory", "0.95"), default), "vllm").value == "0.95"
    assert propose(Advice("x", "warning", Change("kv_dtype", "fp8")), "vllm").value == "fp8"
    assert propose(Advice("x", "warning", Change("kv_dtype", "fp8")), "sglang") is None  # SGLang spells it fp8_e5m2


def test_a_change_describes_itself_against_the_flags_it_changes():
    before = Flags.parse("--schedule-conservativeness 2")
    change = FlagChange("--schedule-conservativeness", "0.3")
    assert change.describe(before) == "--schedule-conservativeness 2 → 0.3"
    assert FlagChange("--enable-mixed-chunk", True).describe(before) == "--enable-mixed-chunk (default) → on"


def test_launch_templates_get_flags_port_and_host():
    tokens = template_tokens("python -m sglang.launch_server --model-path 'My Model'")
    assert tokens[-5:] == ("{flags}", "--host", "127.0.0.1", "--port", "{port}")
    assert template_tokens("vllm serve m --port {port} --host 0.0.0.0 {flags}")[-1] == "{flags}"
    launcher = CommandLauncher("vllm serve m --port {port} {flags} --log {log}")
    assert launcher.writes_log
    assert launcher.command(Flags.parse("--max-num-seqs 8"), 1234, __import__("pathlib").Path("/o")) == [
        "vllm", "serve", "m", "--port", "1234", "--max-num-seqs", "8", "--log", "/o/server.log"]
    assert launch_line(("toolkit", "serve", "{flags}"), Flags.parse("--a 'x y'")) == "toolkit serve --a 'x y'"
    assert CommandLauncher().display(Flags.parse("--a 1")) == "toolkit serve --a 1"
    assert CommandLauncher().log_path(__import__("pathlib").Path("/o")).name == "server.log"
    assert CommandLauncher("sglang serve").log_path(__import__("pathlib").Path("/o")).name == "server.out"


@pytest.mark.parametrize("scenario, rule_id", [
    ("torch-compile-small-model", "torch_compile.small_model"),
    ("cuda-graph-not-used-above-max", "cuda_graph.not_used"),
    ("prefill-stall", "prefill_stall.throughput_dips"),
    ("parallelism-dp-over-tp", "parallelism.dp_over_tp"),
])
def test_tune_and_the_corrected_command_apply_the_same_change(scenario, rule_id):
    from tests.diagnose.test_golden_findings import SYNTHETIC
    from toolkit.diagnose import analyze

    diagnosis = analyze(lines=SYNTHETIC[scenario]())
    finding = next(f for f in diagnosis.findings if f.id == rule_id)
    proposal = propose(finding, "sglang")
    for flag, value in ((proposal.flag, proposal.value), *proposal.companions):
        assert (flag if value is True else f"{flag} {value}") in diagnosis.command
