"""`benchmarks.cpu_prefill_attention` runs end to end: each prefill is timed with the kernel and with SDPA, every
layer taking the path it was forced to."""
from __future__ import annotations

import pytest
import torch

from benchmarks import cpu_prefill_attention
from toolkit.runtime import kernels as cpu_kernels

pytestmark = pytest.mark.skipif(not cpu_kernels.prefill_attention_supported(torch.float32),
                                reason="float32 prefill attention needs an x86 CPU with AVX2")


def test_the_prefill_benchmark_pairs_kernel_and_sdpa(capsys):
    record = cpu_prefill_attention.main(["--shapes", "2x40", "--repeats", "2"])
    (row,) = record["rows"]
    assert (row["prompts"], row["tokens"]) == (2, 40)
    assert len(row["ms"]["sdpa"]) == len(row["ms"]["kernel"]) == len(row["sdpa_over_kernel"]) == 2
    assert all(ms > 0 for ms in row["ms"]["sdpa"] + row["ms"]["kernel"])
    assert "2x40" in capsys.readouterr().out
