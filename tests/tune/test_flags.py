"""Flags: parsing, changing and writing them; diagnose's advice as a change in SGLang's or vLLM's names."""
from __future__ import annotations

import pytest

from tests.tune.fakes import Advice
from toolkit.tune.flags import Change, Flags, engine_flag, launch_line, propose
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


@pytest.mark.parametrize("flag, suggested, expected", [
    ("--schedule-conservativeness", "0.3", ("--schedule-conservativeness", "0.3", ())),
    ("--chunked-prefill-size", "4096 (or --enable-mixed-chunk)", ("--chunked-prefill-size", "4096", ())),
    ("--enable-torch-compile", "on (with --torch-compile-max-bs 32)",
     ("--enable-torch-compile", True, (("--torch-compile-max-bs", "32"),))),
    ("--disable-cuda-graph", "remove (graphs on)", ("--disable-cuda-graph", None, ())),
    ("--cuda-graph-max-bs", "256 (and lower --mem-fraction-static with it)", ("--cuda-graph-max-bs", "256", ())),
    ("--schedule-policy", "lpm", ("--schedule-policy", "lpm", ())),
])
def test_sglang_advice_becomes_a_change(flag, suggested, expected):
    proposal = propose(Advice("x", "warning", flag, suggested), "sglang")
    assert (proposal.flag, proposal.value, proposal.companions) == expected


@pytest.mark.parametrize("flag, suggested", [
    (None, "client: raise the request rate / --max-concurrency"),
    ("--watchdog-timeout", None),
    ("--schedule-conservativeness", "a lot lower"),
    ("--port", "30001"),
    ("--max-running-requests", "remove"),
    ("--no-such-flag", "1"),
])
def test_advice_that_names_nothing_the_server_accepts_is_not_actionable(flag, suggested):
    assert propose(Advice("x", "warning", flag, suggested), "sglang") is None


def test_vllm_names_and_values():
    assert engine_flag("--mem-fraction-static", "vllm") == "--gpu-memory-utilization"
    assert engine_flag("--schedule-conservativeness", "vllm") is None
    graphs = propose(Advice("x", "warning", "--disable-cuda-graph", "remove (graphs on)"), "vllm")
    assert (graphs.flag, graphs.value) == ("--enforce-eager", None)
    assert propose(Advice("x", "info", "--schedule-policy", "lpm"), "vllm") is None
    assert propose(Advice("x", "info", "--schedule-policy", "fcfs"), "vllm").flag == "--scheduling-policy"
    assert propose(Advice("x", "warning", "--mem-fraction-static", "higher"), "vllm").direction == 1
    assert propose(Advice("x", "warning", "--quantization", "remove"), "vllm") is None


def test_advice_in_either_engines_words_becomes_the_launched_engines_flag():
    """diagnose names flags in the words of the engine that wrote the log."""
    seqs = Advice("running_cap.pinned", "warning", "--max-num-seqs", "512", "256")
    assert propose(seqs, "vllm").flag == "--max-num-seqs" and propose(seqs, "sglang").flag == "--max-running-requests"
    assert propose(Advice("x", "warning", "--gpu-memory-utilization", "0.95", "0.9 (default)"), "vllm").value == "0.95"
    assert propose(Advice("x", "warning", "--kv-cache-dtype", "fp8"), "vllm").value == "fp8"
    assert propose(Advice("x", "warning", "--kv-cache-dtype", "fp8"), "sglang") is None  # SGLang spells it fp8_e5m2


def test_a_change_describes_itself_against_the_flags_it_changes():
    before = Flags.parse("--schedule-conservativeness 2")
    change = Change("--schedule-conservativeness", "0.3")
    assert change.describe(before) == "--schedule-conservativeness 2 → 0.3"
    assert Change("--enable-mixed-chunk", True).describe(before) == "--enable-mixed-chunk (default) → on"


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
