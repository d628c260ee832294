"""Each flag is declared once and checked from its declaration; values SGLang has that we do not implement are
refused, never accepted and ignored; the device's defaults are filled once."""
from __future__ import annotations

import dataclasses

import pytest

from toolkit.runtime.device_defaults import with_device_defaults
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


def test_device_defaults_are_resolved_once_into_frozen_arguments():
    resolved = with_device_defaults(ServerArgs(device="cpu"))
    assert isinstance(resolved, ResolvedArgs)
    assert (resolved.device, resolved.page_size, resolved.chunked_prefill_size) == ("cpu", 16, 2048)
    assert with_device_defaults(resolved) is resolved
    with pytest.raises(dataclasses.FrozenInstanceError):
        resolved.page_size = 1  # type: ignore[misc]
    assert repr(resolved).startswith("ServerArgs(")  # NOTE: the `server_args=` log line diagnose reads


def test_a_prefill_chunk_smaller_than_a_page_is_refused_naming_both():
    with pytest.raises(ValueError, match="--chunked-prefill-size 8 is smaller than a KV page \\(16 tokens on cpu"):
        with_device_defaults(ServerArgs(device="cpu", chunked_prefill_size=8))
    assert with_device_defaults(ServerArgs(device="cpu", chunked_prefill_size=16)).chunked_prefill_size == 16
    assert with_device_defaults(ServerArgs(device="cpu", chunked_prefill_size=8, page_size=8)).page_size == 8
    assert not with_device_defaults(ServerArgs(device="cpu", chunked_prefill_size=-1)).chunked_prefill_enabled


def test_resolved_arguments_refuse_unfilled_device_defaults():
    with pytest.raises(ValueError, match="name no device"):
        ResolvedArgs()
    with pytest.raises(ValueError, match="not filled: chunked_prefill_size, page_size, disable_overlap_schedule"):
        ResolvedArgs(device="cpu")
