"""The GPU attention micro-benchmark parses its flags and runs its CPU dry run end to end."""
from __future__ import annotations

import json

import pytest

from benchmarks.gpu import attention_microbench


def test_microbench_help_lists_the_sweep_flags(capsys):
    with pytest.raises(SystemExit) as exit_info:
        attention_microbench.main(["--help"])
    assert exit_info.value.code == 0
    help_text = capsys.readouterr().out
    for flag in ("--batch-sizes", "--context-lens", "--backends", "--dry-run", "--peak-gbs"):
        assert flag in help_text


def test_microbench_dry_run_times_triton_and_torch_native(tmp_path):
    out = tmp_path / "microbench.json"
    report = attention_microbench.main(["--dry-run", "--out", str(out)])
    assert json.loads(out.read_text()) == report
    timed = {(r["backend"], r["batch"]) for r in report["rows"] if r["ms"] is not None}
    assert timed == {("triton", 1), ("triton", 3), ("torch_native", 1), ("torch_native", 3)}
