"""`benchmarks.cpu_packing` runs end to end on this CPU: every size gets paired plain/packed repeats."""
from __future__ import annotations

import pytest
import torch

from benchmarks import cpu_packing

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="this torch has no oneDNN")


def test_the_packing_benchmark_pairs_every_repeat(capsys):
    record = cpu_packing.main(["--rows", "1", "8", "--step-batches", "2", "--context", "16", "--repeats", "2"])
    assert [(row["what"], row["size"]) for row in record["rows"]] == [("linears", 1), ("linears", 8),
                                                                        ("decode step", 2)]
    for row in record["rows"]:
        assert len(row["ms"]["plain"]) == len(row["ms"]["packed"]) == len(row["plain_over_packed"]) == 2
        assert all(ms > 0 for ms in row["ms"]["plain"] + row["ms"]["packed"])
    assert record["meta"]["cpu_capability"]["isa"]
    assert "decode step" in capsys.readouterr().out
