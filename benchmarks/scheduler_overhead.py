"""Host-side scheduler time per decode step (everything but the model's forward), on a tiny dummy model.

    python -m benchmarks.scheduler_overhead [--batch-sizes 64 256] [--steps 50]

The model is a one-layer, 64-wide Llama with dummy weights, so its forward is cheap and the step time left over
is the scheduler's own work: batch bookkeeping, KV slot allocation, metadata, sampling and output handling.
"""
from __future__ import annotations

import argparse
import json
import time

TINY_LLAMA = {"num_hidden_layers": 1, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
              "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 49152}


def measure(batch_size: int, steps: int) -> dict:
    from toolkit.runtime import Engine
    from toolkit.runtime.sampling.sampling_params import SamplingParams
    from toolkit.runtime.io_struct import GenerateInput

    engine = Engine(model_path="llama-3.2-1b", load_format="dummy", json_model_override_args=json.dumps(TINY_LLAMA),
                    dtype="float32", log_level="warning", max_running_requests=batch_size, context_length=2048,
                    decode_log_interval=10**6)
    scheduler, runner = engine.scheduler, engine.runner
    forward_seconds = [0.0]
    original = runner.forward

    def timed_forward(batch):
        start = time.perf_counter()
        logits = original(batch)
        forward_seconds[0] += time.perf_counter() - start
        return logits

    runner.forward = timed_forward
    params = SamplingParams(max_new_tokens=steps + 20, temperature=0.0, ignore_eos=True)
    for i in range(batch_size):
        scheduler.add_request(GenerateInput(f"r{i}", [5 + i % 1000] * 32, params))
    while scheduler.waiting or scheduler.chunked_req:
        scheduler.step()
    for _ in range(3):
        scheduler.step()
    forward_seconds[0] = 0.0
    start = time.perf_counter()
    for _ in range(steps):
        scheduler.step()
    total = time.perf_counter() - start
    assert len(scheduler.running) == batch_size
    return {"batch_size": batch_size, "step_ms": total / steps * 1e3,
            "forward_ms": forward_seconds[0] / steps * 1e3,
            "host_ms": (total - forward_seconds[0]) / steps * 1e3}


def main() -> None:
    parser = argparse.ArgumentParser(description="Host-side scheduler time per decode step.")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--steps", type=int, default=50)
    args = parser.parse_args()
    for batch_size in args.batch_sizes:
        r = measure(batch_size, args.steps)
        print(f"batch {r['batch_size']:4d}: step {r['step_ms']:.2f} ms = forward {r['forward_ms']:.2f} ms + "
              f"host {r['host_ms']:.2f} ms")


if __name__ == "__main__":
    main()
