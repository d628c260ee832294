"""The CUDA-graph stand-in (tests/runtime/capture_guard.py) refuses what a real capture cannot hold, and lets
through what it can: the rules the decode-graph tests rely on, each seen failing."""
from __future__ import annotations

import pytest
import torch

from tests.runtime.capture_guard import CaptureViolation, GuardedCapture, kernel
from toolkit.runtime.forward_batch import ForwardBatch, ForwardMode


def _batch(seq_lens: list[int]) -> ForwardBatch:
    n = len(seq_lens)
    ids = torch.zeros(n, dtype=torch.int64)
    return ForwardBatch(ForwardMode.DECODE, ids, ids, ids, ids, [0] * n, torch.tensor(seq_lens), seq_lens,
                        [s - 1 for s in seq_lens], [1] * n, torch.zeros(1, 1, dtype=torch.int32), None, None)


BUFFER = torch.arange(8, dtype=torch.float32)
OUT = torch.zeros(8)
BATCH = _batch([3, 9])


def _capture_and_replay(region, between=lambda: None) -> GuardedCapture:
    graph = GuardedCapture(region)
    between()
    graph.replay()
    return graph


@pytest.mark.parametrize("region, refusal", [
    (lambda: OUT.fill_(BUFFER.sum().item()), r"Tensor\.item\(\) \(a host sync\)"),
    (lambda: OUT.fill_(len(BUFFER.tolist())), r"Tensor\.tolist\(\)"),
    (lambda: OUT.copy_(BUFFER if BUFFER.any() else -BUFFER), r"Tensor\.__bool__\(\)"),
    (lambda: OUT[: int(BUFFER[3])].zero_(), r"Tensor\.__int__\(\)"),
    (lambda: OUT.copy_(BUFFER.cpu()), r"Tensor\.cpu\(\)"),
    (lambda: OUT.add_(torch.tensor([1.0] * 8)), r"torch\.tensor\(\) \(a tensor of host data\)"),
    (lambda: torch.cuda.synchronize(), r"torch\.cuda\.synchronize\(\)"),
    (lambda: OUT.fill_(max(BATCH.seq_lens_cpu)), r"ForwardBatch\.seq_lens_cpu read inside"),
    (lambda: OUT.fill_(BATCH.req_pool_indices_cpu[0]), r"ForwardBatch\.req_pool_indices_cpu read"),
])
def test_host_syncs_and_host_values_are_refused_at_capture(region, refusal):
    with pytest.raises(CaptureViolation, match=refusal):
        GuardedCapture(region)


def test_a_buffer_reallocated_between_replays_is_refused():
    holder = {"buf": torch.ones(8)}
    region = lambda: OUT.copy_(holder["buf"] * 2)  # noqa: E731 - reads whatever tensor the holder has now
    with pytest.raises(CaptureViolation, match="replay op 0 is not the captured graph's"):
        _capture_and_replay(region, between=lambda: holder.update(buf=torch.ones(8)))


def test_a_replay_that_runs_other_ops_or_shapes_is_refused():
    calls = []

    def branching():  # a Python decision a graph would have frozen at capture
        calls.append(1)
        OUT.copy_(BUFFER + 1 if len(calls) == 1 else BUFFER * 2)

    with pytest.raises(CaptureViolation, match="replay op 0"):
        _capture_and_replay(branching)
    sizes = iter([4, 6])
    with pytest.raises(CaptureViolation, match="replay op 0"):
        _capture_and_replay(lambda: OUT[: next(sizes)].zero_())


def test_what_a_graph_can_hold_passes():
    """Ops on persistent buffers, scratch made at capture and kept, a host list's length (the graph's fixed
    size), and a kernel's own host work."""
    scratch = {}

    @kernel("host-side kernel")
    def launch(x: torch.Tensor) -> None:
        x.add_(float(x.sum().item() > 0))

    def region():
        if "s" not in scratch:
            scratch["s"] = torch.empty(8)
        torch.mul(BUFFER, len(BATCH.seq_lens_cpu), out=scratch["s"])
        OUT.copy_(scratch["s"])
        launch(OUT)

    graph = _capture_and_replay(region)
    graph.replay()
    assert graph.replays == 2 and torch.equal(OUT, BUFFER * 2 + 1)
    assert BUFFER.sum().item() == 28 and max(BATCH.seq_lens_cpu) == 9  # the rules hold inside the region only
