"""The CPU runner's heap keeps freed blocks: the tensors a decode step allocates every time (its logits above
all) do not fault their pages in again on the next step (counted with getrusage, not timed).

The heap still grows now and then (a new peak, another thread's arena), and that step faults its new pages in once;
so the test reads the median step, not the mean."""
from __future__ import annotations

import json
import statistics
import subprocess
import sys

import pytest

PROBE = """
import json, resource, sys
import toolkit.runtime.cpu_threads as cpu_threads
if sys.argv[1] == "default":
    cpu_threads.keep_freed_memory = lambda: False  # glibc's own thresholds
from toolkit.runtime import Engine
from toolkit.runtime.io_struct import GenerateInput
from toolkit.runtime.sampling.sampling_params import SamplingParams
tiny = {"num_hidden_layers": 1, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 49152}
engine = Engine(model_path="llama-3.2-1b", load_format="dummy", json_model_override_args=json.dumps(tiny),
                dtype="float32", device="cpu", log_level="warning", max_running_requests=256, context_length=512,
                disable_overlap_schedule=True)
scheduler = engine.scheduler
params = SamplingParams(max_new_tokens=100, temperature=0.0, ignore_eos=True)
for i in range(256):
    scheduler.add_request(GenerateInput(f"r{i}", [5 + i] * 16, params))
for _ in range(5):
    scheduler.step()
faults = []
for _ in range(21):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    scheduler.step()
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps(faults))
"""


def _median_faults_per_step(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return int(statistics.median(json.loads(out.stdout.strip().splitlines()[-1])))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_a_decode_step_does_not_fault_its_tensors_in_again():
    logits_pages = 256 * 49152 * 4 // 4096
    assert _median_faults_per_step("default") >= logits_pages, "glibc maps and unmaps the logits every step"
    assert _median_faults_per_step("keep") < logits_pages // 10


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_mallopt_is_found_without_running_ldconfig(monkeypatch) -> None:
    """`toolkit diagnose` applies the thresholds before its read starts: the lookup must not run `ldconfig`
    (`ctypes.util.find_library`, ~30 ms) where the process has the C library loaded."""
    import ctypes.util

    from toolkit.runtime import host_memory

    def no_ldconfig(name: str) -> str:
        raise AssertionError(f"find_library({name!r}) was called")

    monkeypatch.setattr(ctypes.util, "find_library", no_ldconfig)
    host_memory.keep_freed_memory.cache_clear()
    try:
        assert host_memory.keep_freed_memory()
    finally:
        host_memory.keep_freed_memory.cache_clear()
