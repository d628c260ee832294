"""Advice is data: a finding carries a typed change of an idea, its flag comes from the one idea table per engine,
the text is rendered from it, the corrected command applies the change and its companions but never an
alternative, and `--format json` carries the typed change."""
from __future__ import annotations

import json

import pytest

from tests.diagnose.test_golden_findings import SYNTHETIC
from toolkit.diagnose import analyze
from toolkit.diagnose.findings import Evidence, Finding
from toolkit.diagnose.report_json import render_json
from toolkit.diagnose.vocabulary import IDEAS, Change, knob


def _finding(diagnosis, rule_id: str) -> Finding:
    return next(f for f in diagnosis.findings if f.id == rule_id)


def test_every_idea_has_a_flag_and_a_way_to_move() -> None:
    knobs = {name: (knob(name, "sglang"), knob(name, "vllm")) for name in IDEAS}
    assert all(any(k is not None and k.flag.startswith("--") for k in pair) for pair in knobs.values())
    assert all(idea.move in ("set", "push", "switch") for idea in IDEAS.values())
    no_sglang = [name for name, (sglang, _) in knobs.items() if sglang is None]
    assert no_sglang == ["async_scheduling", "spec_draft_tokens_v0"]
    assert knob("kv_memory", "vllm").flag == "--gpu-memory-utilization"
    assert knob("kv_memory", "sglang").flag == "--mem-fraction-static"
    assert knob("admission", "vllm") is None


def test_each_engines_knob_says_its_argument_default_kind_and_choices() -> None:
    """vLLM's table is the one place of its flags' kinds, defaults and what the corrected command keeps; SGLang's
    come from `toolkit serve`'s declarations."""
    util = knob("kv_memory", "vllm")
    assert (util.arg, util.kind, util.default, util.kept, util.always) == ("gpu_memory_utilization", "float", 0.9, True,
                                                                           True)
    assert knob("kv_dtype", "vllm").choices == {"auto", "fp8", "fp8_e5m2", "fp8_e4m3"}
    assert knob("graph_max_bs", "vllm").default == 512 and knob("dtype", "vllm").kind is None
    assert (knob("admission", "sglang").kind, knob("admission", "sglang").default) == ("float", 1.0)
    assert knob("schedule_policy", "sglang").default is None  # SGLang's releases differ: always written
    assert knob("mamba_slots", "sglang").kind is None  # not a flag of `toolkit serve`: tune never passes it


def test_a_change_has_a_value_or_a_direction_not_both() -> None:
    with pytest.raises(ValueError, match="not both"):
        Change("kv_memory", "0.9", direction=1)


def test_the_advice_text_is_rendered_in_the_words_of_the_engine() -> None:
    change = Change("graphs_off", False)
    sglang = Finding(id="cuda_graph.disabled", severity="warning", title="t", message="m", evidence=Evidence(),
                     change=change)
    vllm = Finding(id="cuda_graph.disabled", severity="warning", title="t", message="m", evidence=Evidence(),
                   change=change, engine="vllm")
    assert (sglang.flag, sglang.suggested) == ("--disable-cuda-graph", "remove (graphs on)")
    assert (vllm.flag, vllm.suggested) == ("--enforce-eager", "remove (graphs on)")
    assert vllm.advice() == ("change", "--enforce-eager remove (graphs on)")


def test_the_corrected_command_applies_companions_but_not_alternatives() -> None:
    stall = analyze(lines=SYNTHETIC["prefill-stall"]())
    finding = _finding(stall, "prefill_stall.throughput_dips")
    assert finding.alternatives == (Change("mixed_chunk", True),)
    assert finding.suggested == "4096 (or --enable-mixed-chunk)"
    assert "--chunked-prefill-size 4096" in stall.command and "--enable-mixed-chunk" not in stall.command
    compile_ = analyze(lines=SYNTHETIC["torch-compile-small-model"]())
    assert "--enable-torch-compile --torch-compile-max-bs 16" in compile_.command


def test_a_direction_alone_changes_nothing_in_the_command() -> None:
    d = analyze(lines=SYNTHETIC["gpu-memory-without-fraction"]())
    f = _finding(d, "gpu_memory.too_much")
    assert f.change == Change("kv_memory", direction=1) and f.suggested == "higher"
    assert "--mem-fraction-static" not in d.command


def test_json_carries_the_typed_change() -> None:
    d = analyze(lines=SYNTHETIC["prefill-stall"]())
    (f,) = [f for f in json.loads(render_json(d))["findings"] if f["id"] == "prefill_stall.throughput_dips"]
    assert f["engine"] == "sglang" and f["action"] is None
    assert f["change"] == {"idea": "prefill_budget", "flag": "--chunked-prefill-size", "move": "set",
                           "value": "4096", "direction": 0, "companions": []}
    assert f["alternatives"] == [{"idea": "mixed_chunk", "flag": "--enable-mixed-chunk", "move": "switch",
                                  "value": True, "direction": 0, "companions": []}]


def test_json_names_vllm_flags_for_a_vllm_log() -> None:
    d = analyze(lines=SYNTHETIC["vllm-pool-vs-concurrency"]())
    (f,) = [f for f in json.loads(render_json(d))["findings"] if f["id"] == "capacity.pool_vs_concurrency"]
    assert f["change"] is None and f["action"] == "if requests run long"
    assert [(a["idea"], a["flag"], a["value"]) for a in f["alternatives"]] == [
        ("running_cap", "--max-num-seqs", "13"), ("context", "--max-model-len", "6985")]
