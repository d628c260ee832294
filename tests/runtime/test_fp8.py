"""fp8 that really takes effect, end to end on CPU.

KV cache (`--kv-cache-dtype fp8_e4m3|fp8_e5m2`): the pool is float8, the same budget holds twice the tokens, the
checkpoint's k/v scales are applied, and greedy output on the embedded model stays close to a bf16 KV cache with no
NaN. Weights (`--quantization fp8`): a float checkpoint is quantized per channel at load, an fp8 checkpoint
(`quantization_config.quant_method: fp8`, float8 weights, `weight_scale`) loads as it is; both give exactly the
greedy tokens of transformers running the same dequantized weights, under TP too, in less memory.
"""
from __future__ import annotations

import json
import re

import pytest
import torch
from safetensors.torch import load_file, save_file

from benchmarks.fp8_kv_agreement import agreement, greedy
from tests.conftest import reference_greedy
from tests.runtime.engine_fixtures import LogCapture, random_prompts, tiny_engine
from tests.runtime.tiny_models import make_tiny_model
from toolkit.runtime import model_runner
from toolkit.runtime.model_loader.errors import ModelLoadError
from toolkit.runtime.models.fp8 import Fp8Linear, quantize_rows
from toolkit.runtime.models.layers import Slice

NEW_TOKENS = 10
GREEDY = {"max_new_tokens": NEW_TOKENS, "temperature": 0.0, "ignore_eos": True}
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fp8-llama")
    return folder, make_tiny_model("llama-gqa-llama3rope", folder, seed=7)


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    return random_prompts(8, vocab=320, seed=11)


def _generate(engine, prompts, params=GREEDY) -> list[list[int]]:
    return [r["output_ids"] for r in engine.generate(input_ids=prompts, sampling_params=params)]


def _dequantized_reference(model, quantize):
    """The transformers model with every projection's weight replaced by `quantize(name, weight)`'s values."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(tuple(f"{p}.weight" for p in PROJECTIONS)):
                param.copy_(quantize(name, param))
    return model


# ---- KV cache ----

@pytest.mark.parametrize("kv_cache_dtype, dtype", [("fp8_e4m3", torch.float8_e4m3fn), ("fp8_e5m2", torch.float8_e5m2)])
def test_fp8_kv_cache_holds_twice_the_tokens_of_the_same_budget(tiny, monkeypatch, kv_cache_dtype, dtype):
    folder, _ = tiny
    # NOTE: a fixed 0.02 GiB of free RAM: the default CPU budget (25% of it) is then the same for both runs.
    monkeypatch.setattr(model_runner, "available_memory_gib", lambda device: 0.02)
    sizes = {}
    for kv in ("auto", kv_cache_dtype):
        engine = tiny_engine(folder, dtype="bfloat16", kv_cache_dtype=kv, max_total_tokens=None, log_level="info")
        try:
            sizes[kv] = engine.runner.max_total_num_tokens, engine.runner.kv_pool.k_buffer[0].dtype
            page = engine.runner.args.page_size
            assert _generate(engine, [[5, 6, 7, 8]], {"max_new_tokens": 4, "ignore_eos": True})
        finally:
            engine.shutdown()
    (bf16_tokens, bf16_dtype), (fp8_tokens, fp8_dtype) = sizes["auto"], sizes[kv_cache_dtype]
    assert bf16_dtype == torch.bfloat16 and fp8_dtype == dtype
    # NOTE: the pool is whole pages (16 tokens on a CPU): twice the tokens per byte can fit one page more
    assert 2 * bf16_tokens <= fp8_tokens <= 2 * bf16_tokens + page


def test_checkpoint_kv_scales_are_read_and_applied(tmp_path, prompts):
    """k_scale/v_scale of 1/8 (exact in float8: each stored value is 8x the unscaled one) leave greedy output as
    it is with scale 1.0; a reader that ignored them would attend over 8x keys and values."""
    reference = make_tiny_model("llama-gqa-llama3rope", tmp_path, seed=7)
    plain = tiny_engine(tmp_path, kv_cache_dtype="fp8_e4m3")
    try:
        unscaled = _generate(plain, prompts)
    finally:
        plain.shutdown()
    tensors = load_file(tmp_path / "model.safetensors")
    for layer in range(reference.config.num_hidden_layers):
        tensors[f"model.layers.{layer}.self_attn.k_scale"] = torch.tensor(0.125)
        tensors[f"model.layers.{layer}.self_attn.v_scale"] = torch.tensor(0.125)
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    scaled = tiny_engine(tmp_path, kv_cache_dtype="fp8_e4m3")
    try:
        assert scaled.runner.kv_pool.k_scales == [0.125, 0.125] and scaled.runner.kv_pool.v_scales == [0.125, 0.125]
        outputs = _generate(scaled, prompts)
    finally:
        scaled.shutdown()
    assert agreement(unscaled, outputs).positions >= 0.9


def test_fp8_kv_cache_on_the_embedded_model_has_no_nan_and_stays_close_to_bf16():
    """Greedy answers of SmolLM2 (bf16 weights) with an fp8 KV cache against a bf16 one; free-running answers
    diverge for good after one differing token, so agreement is measured over short answers."""
    reference, finite, pool, prompts = greedy("auto", None, 8, 16, {"max_total_tokens": 8192})
    assert finite
    for fmt, minimum in (("fp8_e4m3", 0.5), ("fp8_e5m2", 0.3)):
        outputs, finite, fp8_pool, _ = greedy(fmt, prompts, 8, 16, {"max_total_tokens": 8192})
        assert finite, f"{fmt}: a logprob is NaN or infinite"
        agree = agreement(reference, outputs)
        print(f"{fmt}: {agree}")
        assert agree.positions >= minimum, f"{fmt}: {agree}"


# ---- weights ----

def test_quantize_at_load_gives_the_greedy_tokens_of_the_dequantized_model(tiny, prompts):
    folder, _ = tiny
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    _dequantized_reference(model, lambda name, w: _roundtrip(w))
    expected = [reference_greedy(model, p, NEW_TOKENS) for p in prompts]
    for tp_size in (1, 2):
        engine = tiny_engine(folder, quantization="fp8", tp_size=tp_size)
        try:
            qkv = engine.runner.model.model.layers[0].self_attn.qkv_proj
            assert isinstance(qkv, Fp8Linear) and qkv.weight.dtype == torch.float8_e4m3fn
            assert _generate(engine, prompts) == expected, f"tp_size={tp_size}"
        finally:
            engine.shutdown()


def _roundtrip(weight: torch.Tensor) -> torch.Tensor:
    quantized, scale = quantize_rows(weight)
    return quantized.float() * scale[:, None]


@pytest.mark.parametrize("per_channel", [False, True], ids=["per-tensor", "per-channel"])
def test_an_fp8_checkpoint_loads_directly(tmp_path, prompts, per_channel):
    """A checkpoint as fp8 tools write it: float8 projections, a `weight_scale` each (one value per tensor or per
    output channel), `input_scale`s, and `quantization_config` in config.json; no --quantization flag needed."""
    model = make_tiny_model("llama-gqa-llama3rope", tmp_path, seed=5)
    tensors = load_file(tmp_path / "model.safetensors")
    stored = {}
    for name in [n for n in tensors if n.endswith(tuple(f"{p}.weight" for p in PROJECTIONS))]:
        weight = tensors[name]
        if per_channel:
            quantized, scale = quantize_rows(weight)
            tensors[name.replace(".weight", ".weight_scale")] = scale[:, None]
        else:
            scale = weight.abs().max() / 448
            quantized = (weight / scale).clamp(-448, 448).to(torch.float8_e4m3fn)
            tensors[name.replace(".weight", ".weight_scale")] = scale.reshape(())
        tensors[name] = quantized
        tensors[name.replace(".weight", ".input_scale")] = torch.tensor(1.0)
        stored[name] = (quantized, scale)
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((tmp_path / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "static"}
    (tmp_path / "config.json").write_text(json.dumps(config))

    def dequantize(name: str, weight: torch.Tensor) -> torch.Tensor:
        quantized, scale = stored[name]
        return quantized.float() * (scale[:, None] if per_channel else scale)

    expected = [reference_greedy(_dequantized_reference(model, dequantize), p, NEW_TOKENS) for p in prompts]
    engine = tiny_engine(tmp_path)
    try:
        assert engine.runner.quantization == "fp8"
        o_proj = engine.runner.model.model.layers[1].self_attn.o_proj
        assert torch.equal(o_proj.weight.view(torch.uint8),
                           stored["model.layers.1.self_attn.o_proj.weight"][0].view(torch.uint8))
        assert _generate(engine, prompts) == expected
    finally:
        engine.shutdown()


def test_fp8_weights_shrink_the_weight_memory_line():
    """The embedded model in bf16: the decoder's linear weights drop from 2 bytes to 1 (+ a float32 per row)."""
    from toolkit.runtime import Engine

    used = {}
    for quantization in (None, "fp8"):
        with LogCapture() as log:
            engine = Engine(dtype="bfloat16", device="cpu", quantization=quantization, max_total_tokens=1024,
                            log_level="info")
        try:
            (line,) = [line for line in log.lines if line.startswith("Load weight end.")]
            used[quantization] = float(re.search(r"mem usage=(\d+\.\d+) GB", line).group(1))
            linear = [m for m in engine.runner.model.modules() if isinstance(m, Fp8Linear)]
            assert bool(linear) == (quantization == "fp8")
            assert engine.generate("The capital of France is", {"max_new_tokens": 4, "temperature": 0})["text"]
        finally:
            engine.shutdown()
    print(used)
    # NOTE: the tied embedding stays bf16 (57 MB of the 270): fp8 is ~0.61 of bf16 unpacked, less where oneDNN packs
    # the bf16 layers (a second copy); the line prints GB to two decimals.
    assert used["fp8"] <= 0.65 * used[None]


@pytest.mark.parametrize("quantization_config, message", [
    ({"quant_method": "awq"}, "quant_method 'awq' is not supported; supported: fp8"),
    ({"quant_method": "fp8", "weight_block_size": [128, 128]}, "block-wise fp8 checkpoints"),
])
def test_unsupported_quantized_checkpoints_are_refused(tiny, tmp_path, quantization_config, message):
    folder, _ = tiny
    for path in folder.iterdir():
        (tmp_path / path.name).write_bytes(path.read_bytes())
    config = json.loads((tmp_path / "config.json").read_text())
    config["quantization_config"] = quantization_config
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match=re.escape(message)):
        tiny_engine(tmp_path)


# ---- fp8 GEMMs on a GPU (Hopper: torch._scaled_mm) ----

@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0),
                    reason="torch._scaled_mm's row-wise fp8 GEMM needs an sm90+ GPU")
@pytest.mark.parametrize("rows", [1, 7, 256])
def test_scaled_mm_linear_matches_the_dequantized_gemm_on_cuda(rows):
    """The fp8 tensor-core path agrees with the dequantized bf16 GEMM within e4m3's activation rounding."""
    from toolkit.runtime.models import fp8

    torch.manual_seed(0)
    device = torch.device("cuda")
    layer = Fp8Linear(512, {"w": Slice.whole(384)}, bias=True).to(device)
    weight = torch.randn(384, 512, device=device)
    layer.load_rows(0, weight)
    layer.bias.data = torch.randn(384, device=device, dtype=torch.bfloat16)
    x = torch.randn(rows, 512, device=device, dtype=torch.bfloat16)
    assert fp8.scaled_mm_supported(device)
    fast = layer(x)
    dequantized = (layer.weight.float() * layer.weight_scale[:, None]).to(torch.bfloat16)
    reference = torch.nn.functional.linear(x, dequantized, layer.bias)
    relative = ((fast.float() - reference.float()).norm() / reference.float().norm()).item()
    assert fast.dtype == torch.bfloat16 and relative < 0.05, relative

