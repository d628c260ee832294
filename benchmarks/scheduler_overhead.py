"""Host time per decode step: everything but the model's forward and the sampling kernels — scheduling, batch
bookkeeping, KV slot allocation, metadata, appending tokens, stop checks, outputs and their IPC message.

    python -m benchmarks.scheduler_overhead [--batch-sizes 64 256] [--steps 50] [--device cpu|cuda] [--save]

The model is a one-layer, 64-wide Llama with dummy weights (SmolLM2's 49k vocabulary), so the forward is cheap and
what is left of a step is the host's own work. Each step's outputs are pickled and sent over ZMQ to a drain
process, as the server's scheduler does. With overlap off the host time is step - forward - sampling; with overlap
on, the step's wall time minus forward and sampling is the host time still exposed (not hidden behind the forward).
On CUDA (bf16, decode in CUDA graphs as served) the forward and sampling timers wait for the GPU before they stop,
so that their time is the GPU's work and not only its launch.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import zmq

from benchmarks.common import RESULTS, provenance, slug, write_result

TINY_LLAMA = {"num_hidden_layers": 1, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
              "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 49152}
PROMPT_LEN = 32


def _drain(endpoint: str) -> None:
    """The front end's side of the socket: receive and unpickle every message until told to stop."""
    context = zmq.Context(1)
    inbox = context.socket(zmq.PULL)
    inbox.connect(endpoint)
    while inbox.recv_pyobj() is not None:
        pass
    context.destroy(linger=0)


class Timer:
    """Wraps a callable and adds up the seconds spent in it, up to `wait()` (on CUDA: until the GPU is done)."""

    def __init__(self, fn: Callable, wait: Callable[[], None] | None = None) -> None:
        self.fn, self.wait, self.seconds = fn, wait, 0.0

    def __call__(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return self.fn(*args, **kwargs)
        finally:
            if self.wait is not None:
                self.wait()
            self.seconds += time.perf_counter() - start


def measure(batch_size: int, steps: int, overlap: bool, outbox: zmq.Socket, device: str) -> dict:
    import torch

    from toolkit.runtime import Engine
    from toolkit.runtime.io_struct import BatchOutput, GenerateInput
    from toolkit.runtime.sampling.sampling_params import SamplingParams

    engine = Engine(model_path="llama-3.2-1b", load_format="dummy", json_model_override_args=json.dumps(TINY_LLAMA),
                    dtype="float32" if device == "cpu" else "bfloat16", device=device, log_level="warning",
                    max_running_requests=batch_size, context_length=2048, decode_log_interval=10**6,
                    disable_overlap_schedule=not overlap)
    scheduler = engine.scheduler
    wait = torch.cuda.synchronize if device == "cuda" else None
    forward = scheduler.runner.forward = Timer(scheduler.runner.forward, wait)
    sampling = scheduler.sampler.sample_batch = Timer(scheduler.sampler.sample_batch, wait)
    params = SamplingParams(max_new_tokens=steps + 40, temperature=0.0, ignore_eos=True)
    for i in range(batch_size):
        scheduler.add_request(GenerateInput(f"r{i}", [5 + i % 1000] * PROMPT_LEN, params))

    def step() -> None:
        outputs = scheduler.step()
        outbox.send_pyobj(BatchOutput(outputs, dataclasses.replace(scheduler.stats)), copy=False)

    while scheduler.waiting or scheduler.chunked_req or len(scheduler.running) < batch_size:
        step()
    for _ in range(5):
        step()
    forward.seconds = sampling.seconds = 0.0
    walls = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        walls.append(time.perf_counter() - start)
    assert len(scheduler.running) == batch_size, "every request must still be decoding"
    engine.shutdown()
    step_ms = statistics.mean(walls) * 1e3
    forward_ms, sample_ms = forward.seconds / steps * 1e3, sampling.seconds / steps * 1e3
    return {"batch_size": batch_size, "overlap": overlap, "step_ms": step_ms, "forward_ms": forward_ms,
            "sample_ms": sample_ms, "host_ms": step_ms - forward_ms - sample_ms}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--save", action="store_true", help="write benchmarks/results/scheduler_overhead.json "
                                                            "(scheduler_overhead_<gpu>.json on CUDA)")
    parser.add_argument("--out", type=Path, default=None, help="folder for --save (default: benchmarks/results/)")
    args = parser.parse_args()
    endpoint = "ipc:///tmp/toolkit-scheduler-overhead"
    context = zmq.Context(1)
    outbox = context.socket(zmq.PUSH)
    outbox.bind(endpoint)
    drain = multiprocessing.get_context("spawn").Process(target=_drain, args=(endpoint,), daemon=True)
    drain.start()
    rows = []
    try:
        for batch_size in args.batch_sizes:
            for overlap in (False, True):
                r = measure(batch_size, args.steps, overlap, outbox, args.device)
                rows.append(r)
                label = "exposed host" if overlap else "host"
                print(f"batch {batch_size:4d} overlap {'on ' if overlap else 'off'}: step {r['step_ms']:6.2f} ms = "
                      f"forward {r['forward_ms']:6.2f} + sampling {r['sample_ms']:5.2f} + {label} "
                      f"{r['host_ms']:5.2f} ms", flush=True)
    finally:
        outbox.send_pyobj(None)
        drain.join(timeout=10)
        context.destroy(linger=0)
    if args.save:
        record = {**provenance("benchmarks.scheduler_overhead", sys.argv[1:], args.device), "rows": rows}
        name = "scheduler_overhead" if args.device == "cpu" else f"scheduler_overhead_{slug(record['device'])}"
        print(f"wrote {write_result(name, record, args.out or RESULTS)}")


if __name__ == "__main__":
    main()
