"""Flags SGLang has whose values we do not implement are refused, never accepted and ignored."""
from __future__ import annotations

import pytest

from toolkit.runtime.server_args import ServerArgs, parse_server_args


def test_pytorch_sampling_is_the_one_backend():
    assert parse_server_args(["--sampling-backend", "pytorch"]).sampling_backend == "pytorch"
    assert parse_server_args([]).sampling_backend is None


def test_flashinfer_sampling_is_refused_naming_the_flag(capsys):
    with pytest.raises(ValueError, match="--sampling-backend 'flashinfer': expected one of pytorch"):
        ServerArgs(sampling_backend="flashinfer")
    with pytest.raises(SystemExit):
        parse_server_args(["--sampling-backend", "flashinfer"])
    assert "--sampling-backend: invalid choice: 'flashinfer'" in capsys.readouterr().err
