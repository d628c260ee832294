"""Each flag is declared once and checked from its declaration; values SGLang has that we do not implement are
refused, never accepted and ignored; the device's defaults are filled and every auto resolved once, before the
arguments freeze."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from toolkit.runtime import cpu_capability
from toolkit.runtime.device_defaults import resolve_dtype, with_device_defaults
from toolkit.runtime.model_loader.config import load_preset
from toolkit.runtime.model_loader.errors import ModelLoadError
from toolkit.runtime.server_args import ResolvedArgs, ServerArgs, defaults, flag_fields, parse_server_args


def test_pytorch_sampling_is_the_one_backend():
    assert parse_server_args(["--sampling-backend", "pytorch"]).sampling_backend == "pytorch"
    assert parse_server_args([]).sampling_backend is None


def test_flashinfer_sampling_is_refused_naming_the_flag(capsys):
    with pytest.raises(ValueError, match="--sampling-backend 'flashinfer': expected one of pytorch"):
        ServerArgs(sampling_backend="flashinfer")
    with pytest.raises(SystemExit):
        parse_server_args(["--sampling-backend", "flashinfer"])
    assert "--sampling-backend: invalid choice: 'flashinfer'" in capsys.readouterr().err


def test_every_flag_declares_its_group_and_help():
    for f, spec in flag_fields():
        assert spec.group and spec.help, f"{f.name} lacks a group or a help text"


@pytest.mark.parametrize(("changes", "message"), [
    ({"schedule_policy": "sjf"}, "--schedule-policy 'sjf': expected one of fcfs, lpm"),
    ({"log_level": "loud"}, "--log-level 'loud': expected one of debug"),
    ({"quantization": "awq"}, "--quantization 'awq': expected one of fp8"),
    ({"page_size": 0}, "--page-size must be >= 1, got 0"),
    ({"dist_timeout": 0}, "--dist-timeout must be >= 1, got 0"),
])
def test_declared_choices_and_bounds_are_checked_without_argparse(changes, message):
    with pytest.raises(ValueError, match=message):
        ServerArgs(**changes)


def test_defaults_leave_the_device_defaults_unset():
    values = defaults()
    assert values["max_prefill_tokens"] == 16384 and values["port"] == 30000
    assert values["page_size"] is None and values["mem_fraction_static"] is None


MODEL = load_preset("qwen3-0.6b")  # a bfloat16 checkpoint


def _resolved(**changes) -> ResolvedArgs:
    return with_device_defaults(ServerArgs(device="cpu", **changes), MODEL)


def test_device_defaults_are_resolved_once_into_frozen_arguments():
    resolved = _resolved()
    assert isinstance(resolved, ResolvedArgs)
    assert (resolved.device, resolved.page_size, resolved.chunked_prefill_size) == ("cpu", 16, 2048)
    assert with_device_defaults(resolved, MODEL) is resolved
    with pytest.raises(dataclasses.FrozenInstanceError):
        resolved.page_size = 1  # type: ignore[misc]
    assert repr(resolved).startswith("ServerArgs(")  # NOTE: the `server_args=` log line diagnose reads


def test_a_prefill_chunk_smaller_than_a_page_is_refused_naming_both():
    with pytest.raises(ValueError, match="--chunked-prefill-size 8 is smaller than a KV page \\(16 tokens on cpu"):
        _resolved(chunked_prefill_size=8)
    assert _resolved(chunked_prefill_size=16).chunked_prefill_size == 16
    assert _resolved(chunked_prefill_size=8, page_size=8).page_size == 8
    assert not _resolved(chunked_prefill_size=-1).chunked_prefill_enabled


def test_resolved_arguments_refuse_unfilled_device_defaults():
    with pytest.raises(ValueError, match="name no device"):
        ResolvedArgs()
    with pytest.raises(ValueError, match="not filled: chunked_prefill_size, page_size, disable_overlap_schedule"):
        ResolvedArgs(device="cpu")


def test_the_autos_are_resolved_before_the_arguments_freeze():
    resolved = _resolved()
    cpu_dtype = str(cpu_capability.probe().auto_dtype()).removeprefix("torch.")
    assert (resolved.dtype, resolved.attention_backend, resolved.quantization, resolved.page_size) == (
        cpu_dtype, "torch_native", None, 16)
    assert f"dtype={cpu_dtype!r}" in repr(resolved) and "attention_backend='torch_native'" in repr(resolved)
    explicit = _resolved(dtype="float16", attention_backend="triton", quantization="fp8", page_size=32)
    assert (explicit.dtype, explicit.attention_backend, explicit.quantization, explicit.page_size) == (
        "float16", "triton", "fp8", 32)


@pytest.mark.parametrize(("checkpoint", "device", "dtype"), [
    ("float32", "cpu", "float32"), ("float32", "cuda", "float32"),
    ("float16", "cuda", "float16"), ("bfloat16", "cuda", "bfloat16"),
])
def test_auto_dtype_is_the_checkpoints_where_the_device_runs_it(checkpoint, device, dtype):
    config = dataclasses.replace(MODEL, torch_dtype=checkpoint)
    assert resolve_dtype("auto", config, torch.device(device)) == dtype
    assert resolve_dtype("bfloat16", config, torch.device(device)) == "bfloat16"


def test_the_checkpoints_quantization_is_resolved_and_a_contradiction_refused():
    fp8 = dataclasses.replace(MODEL, extra={"quantization_config": {"quant_method": "fp8"}})
    assert with_device_defaults(ServerArgs(device="cpu"), fp8).quantization == "fp8"
    awq = dataclasses.replace(MODEL, extra={"quantization_config": {"quant_method": "awq"}})
    with pytest.raises(ModelLoadError, match="quant_method 'awq' is not supported"):
        with_device_defaults(ServerArgs(device="cpu"), awq)


def test_resolved_arguments_refuse_an_unresolved_auto():
    filled = dataclasses.asdict(_resolved())
    with pytest.raises(ValueError, match="unresolved auto: --dtype, --attention-backend"):
        ResolvedArgs(**{**filled, "dtype": "auto", "attention_backend": "auto"})
