"""The CPU runner's heap keeps freed blocks: a tensor allocated again every step does not fault its pages in again
(counted with getrusage, not timed)."""
from __future__ import annotations

import resource
import subprocess
import sys

import pytest

PROBE = """
import resource, sys, torch
from toolkit.runtime.host_memory import keep_freed_memory
if sys.argv[1] == "keep":
    assert keep_freed_memory()
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
torch.empty(50 << 20, dtype=torch.uint8).fill_(1)  # the first allocation faults in either way
before = faults()
for _ in range(5):
    torch.empty(50 << 20, dtype=torch.uint8).fill_(1)  # a step's logits-sized tensor, freed at once
print(faults() - before)
"""


def _faults(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return int(out.stdout.strip())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_a_tensor_allocated_every_step_does_not_fault_in_again():
    pages = (50 << 20) // resource.getpagesize()
    assert _faults("default") >= 4 * pages, "glibc maps and unmaps each block: the baseline faults every time"
    assert _faults("keep") < pages // 10
