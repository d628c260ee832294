"""The corrected command's "needs no flag" values come from the server's own flag declarations, except where
SGLang's default (the log source's) differs, and reading them keeps diagnose torch-free."""
from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

from toolkit.diagnose.vocabulary import SGLANG, SGLANG_DEFAULTS, SGLANG_KEPT
from toolkit.runtime.server_args import ServerArgs

KEPT_ARGS = tuple((k.arg, k.default) for k in SGLANG if k.kept)
KEPT_NAMES = tuple(arg for arg, _ in SGLANG_KEPT)

ROOT = Path(__file__).resolve().parents[2]


def test_kept_defaults_are_server_args_defaults_unless_sglang_differs() -> None:
    ours = {f.name: f.default for f in dataclasses.fields(ServerArgs)}
    assert [name for name, _ in KEPT_ARGS] == list(KEPT_NAMES)
    for name, default in KEPT_ARGS:
        expected = SGLANG_DEFAULTS[name] if name in SGLANG_DEFAULTS else ours[name]
        assert default == expected and type(default) is type(expected), name


def test_sglang_overrides_are_only_where_the_defaults_differ() -> None:
    ours = {f.name: f.default for f in dataclasses.fields(ServerArgs)}
    assert all(name not in ours or ours[name] != value for name, value in SGLANG_DEFAULTS.items())
    assert (ours["max_prefill_tokens"], ours["port"], ours["torch_compile_max_bs"]) == (16384, 30000, 32)


def test_advice_imports_no_torch() -> None:
    code = "import sys, toolkit.diagnose.advice; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "False"
