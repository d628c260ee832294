"""`--attention-backend` resolution (SGLang's auto rule), the log line naming the choice, and clear errors when a
backend cannot run here."""
from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from toolkit.runtime.attention import registry
from toolkit.runtime.attention.registry import create_backend, resolve_backend_name

REPO = Path(__file__).resolve().parents[3]


def test_auto_is_torch_native_on_cpu():
    assert resolve_backend_name("auto", torch.device("cpu")) == "torch_native"


def test_auto_on_cuda_prefers_flashinfer_then_triton(monkeypatch):
    cuda = torch.device("cuda")
    monkeypatch.setattr(registry, "flashinfer_available", lambda: True)
    assert resolve_backend_name("auto", cuda) == "flashinfer"
    monkeypatch.setattr(registry, "flashinfer_available", lambda: False)
    assert resolve_backend_name("auto", cuda) == "triton"


def test_explicit_names_are_kept():
    for name in ("torch_native", "triton", "flashinfer"):
        assert resolve_backend_name(name, torch.device("cpu")) == name


def test_the_chosen_backend_is_logged(caplog):
    cpu = torch.device("cpu")
    with caplog.at_level(logging.INFO, logger="runtime"):
        backend = create_backend(resolve_backend_name("auto", cpu), cpu)
    assert backend.name == "torch_native"
    assert "Attention backend: torch_native, device=cpu" in caplog.text


def test_an_unresolved_auto_is_no_backend():
    with pytest.raises(ValueError, match="--attention-backend auto: unknown backend"):
        create_backend("auto", torch.device("cpu"))


def test_triton_runs_on_cpu_in_the_interpreter():
    assert create_backend("triton", torch.device("cpu")).name == "triton"


def test_triton_on_cpu_without_the_interpreter_says_how_to_fix_it():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    script = ("import torch; from toolkit.runtime.attention.registry import create_backend; "
              "create_backend('triton', torch.device('cpu'))")
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode != 0
    assert "--attention-backend triton on CPU needs Triton's interpreter: set TRITON_INTERPRET=1" in result.stderr


@pytest.mark.skipif(registry.flashinfer_available(), reason="flashinfer is installed")
def test_flashinfer_missing_names_the_package():
    with pytest.raises(RuntimeError, match=r"needs the `flashinfer` package \(pip install flashinfer-python\)"):
        create_backend("flashinfer", torch.device("cpu"))
