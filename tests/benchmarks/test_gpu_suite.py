"""The GPU benchmark suite without a GPU: the roofline arithmetic with exact numbers, the run plan, and the CPU dry
run end to end (tiny configs, one JSON per benchmark carrying its provenance)."""
from __future__ import annotations

import json
import re

import pytest
import torch

from benchmarks.gpu import suite
from benchmarks.gpu.roofline import (
    decode_step_bytes,
    decoder_parameters,
    kv_bytes_read,
    roofline_seconds,
    weight_bytes_read,
)
from toolkit.runtime.model_loader.config import config_from_hf_dict, load_preset
from toolkit.runtime.models.registry import MODEL_CLASSES
from tests.runtime.tiny_models import TINY_CONFIGS


def test_llama_3_1_8b_decode_step_bytes():
    config = load_preset("llama-3.1-8b")
    assert decoder_parameters(config) == 8_030_261_248
    # untied: the 128256 x 4096 embedding table is read only at the batch's rows
    assert weight_bytes_read(config, 2, batch=1) == 2 * (8_030_261_248 - 128_256 * 4096 + 4096) == 15_009_857_536
    assert kv_bytes_read(config, 2, batch=1, context=1024) == 1024 * 131_072  # 8 KV heads x 128 x 32 layers x K,V
    step = decode_step_bytes(config, 2, batch=256, context=1024)
    assert step == 15_009_857_536 + 255 * 4096 * 2 + 256 * 1024 * 131_072
    assert roofline_seconds(decode_step_bytes(config, 2, 1, 1024), 3.0e12) == pytest.approx(5.048025e-3)


def test_qwen3_0_6b_reads_its_tied_embedding_whole():
    config = load_preset("qwen3-0.6b")
    assert decoder_parameters(config) == 596_049_920
    assert weight_bytes_read(config, 2, batch=1) == 2 * (596_049_920 + 1024) == 1_192_101_888
    assert kv_bytes_read(config, 2, batch=8, context=100) == 8 * 100 * (8 * 128 * 28 * 2 * 2)


@pytest.mark.parametrize("name", [*TINY_CONFIGS, "llama-3.1-8b", "qwen3-0.6b", "qwen2.5-7b"])
def test_parameter_formula_counts_the_model_class(name):
    config = load_preset(name) if name in ("llama-3.1-8b", "qwen3-0.6b", "qwen2.5-7b") else \
        config_from_hf_dict(dict(TINY_CONFIGS[name]))
    with torch.device("meta"):
        model = MODEL_CLASSES[config.architecture](config, 64)
    assert decoder_parameters(config) == sum(p.numel() for p in model.parameters())


def test_suite_plan_runs_llama_twice_and_every_part_with_the_shared_flags():
    opts = suite.build_parser().parse_args(["--attention-backend", "triton"])
    runs = suite.plan(opts)
    assert [(name, module) for name, module, _ in runs] == [
        ("decode", suite.DECODE), ("llama_graph_on", suite.OFFLINE), ("llama_graph_off", suite.OFFLINE),
        ("qwen", suite.OFFLINE),
    ]
    assert runs[2][2] == ["--workload", "llama-3.1-8b", "--disable-cuda-graph", "--attention-backend", "triton",
                          "--engine-args", "{}"]
    assert all("--dry-run" not in argv for _, _, argv in runs)
    only = suite.plan(suite.build_parser().parse_args(["--only", "qwen3-0.6b", "--dry-run"]))
    assert only == [("qwen", suite.OFFLINE, ["--workload", "qwen3-0.6b", "--attention-backend", "auto",
                                             "--engine-args", "{}", "--dry-run"])]


def test_dry_run_writes_one_result_per_benchmark_with_provenance(tmp_path):
    results = suite.main(["--dry-run", "--out", str(tmp_path)])
    files = sorted(p.name for p in tmp_path.glob("*.json"))
    assert [re.sub(r"_cpu_.*", "", f) for f in files] == ["decode_roofline", "offline_llama-3.1-8b",
                                                          "offline_qwen3-0.6b"]
    assert sorted(p.name for p in tmp_path.glob("*.runs.jsonl")) == [f.replace(".json", ".runs.jsonl") for f in files]
    for path in tmp_path.glob("*.json"):
        record = json.loads(path.read_text())
        meta = record["meta"]
        assert meta["cpu_capability"]["kernel_tier"] and "onednn_bf16" in meta["cpu_capability"]
        assert meta["command"].endswith(f"-m benchmarks.gpu.suite --dry-run --out {tmp_path}")
        assert re.fullmatch(r"[0-9a-f]{40}|unknown", meta["git_commit"])
        assert meta["device"].startswith("cpu") and meta["dry_run"] is True
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", meta["date"])
    decode = results["decode_roofline"]
    assert [r["batch"] for r in decode["rows"]] == [1, 3]
    assert all(r["step_ms"] > 0 and r["roofline_ms"] > 0 and r["cuda_graph"] is False for r in decode["rows"])
    assert decode["target"]["met"] is None  # no claims from a CPU run
    llama = results["offline_llama-3.1-8b"]
    for run in (llama["graph_on"], llama["graph_off"]):
        assert run["successful_requests"] == 4 and 16 <= run["total_output_tokens"] <= 32
        assert run["graph_decode_steps"] == 0 < run["decode_steps"]
    assert llama["graph_on"]["cuda_graph_requested"] and not llama["graph_off"]["cuda_graph_requested"]
    assert llama["graph_speedup_output_throughput"] > 0 and llama["target"]["met"] is None
    assert results["offline_qwen3-0.6b"]["workload"]["temperature"] == 0.6
