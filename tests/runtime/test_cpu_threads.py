"""CPU thread counts per step kind: the server leaves a core to its front end, the offline engine does not."""
from __future__ import annotations

from toolkit.runtime.cpu_threads import decode_threads


def test_engine_decodes_on_every_core_and_the_server_leaves_one(monkeypatch):
    monkeypatch.delenv("TOOLKIT_CPU_DECODE_THREADS", raising=False)
    assert decode_threads(2, shares_cores=False) == 2
    assert decode_threads(2, shares_cores=True) == 1
    assert decode_threads(16, shares_cores=True) == 15
    assert decode_threads(1, shares_cores=True) == 1


def test_environment_overrides_the_decode_thread_count(monkeypatch):
    monkeypatch.setenv("TOOLKIT_CPU_DECODE_THREADS", "3")
    assert decode_threads(8, shares_cores=True) == 3
