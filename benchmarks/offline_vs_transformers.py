"""Offline throughput of the toolkit engine vs batched `transformers.generate`, same prompts, same process.

    python -m benchmarks.offline_vs_transformers [--num-prompts 64 --input-len 256 --output-len 128 --dtype float32]

Prompts are random token ids of exactly `--input-len` tokens; every request generates exactly `--output-len`
tokens (ignore_eos / min_new_tokens), greedily. The two sides run alternately `--rounds` times and each keeps its
best (this machine's speed drifts). Prints both throughputs and their ratio; `--save` writes benchmarks/results/.
"""
from __future__ import annotations

import argparse
import sys
import time

import torch

from benchmarks.common import device_name, provenance, random_requests, write_result


def run_toolkit(prompts: list[list[int]], output_len: int, dtype: str) -> float:
    from toolkit.runtime import Engine

    engine = Engine(dtype=dtype, log_level="warning", device="cpu")  # NOTE: the reference runs on the CPU too
    engine.generate(input_ids=[prompts[0][:16]], sampling_params={"max_new_tokens": 4})
    start = time.perf_counter()
    results = engine.generate(input_ids=prompts, sampling_params={
        "max_new_tokens": output_len, "temperature": 0, "ignore_eos": True})
    elapsed = time.perf_counter() - start
    assert all(r["meta_info"]["completion_tokens"] == output_len for r in results)
    engine.shutdown()
    return elapsed


def run_transformers(prompts: list[list[int]], output_len: int, dtype: str) -> float:
    from transformers import AutoModelForCausalLM

    from toolkit.runtime.model_loader.embedded import embedded_model_path

    path = embedded_model_path()
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                 dtype=getattr(torch, dtype)).eval()
    inputs = torch.tensor(prompts)
    with torch.inference_mode():
        model.generate(inputs[:1, :16], attention_mask=torch.ones_like(inputs[:1, :16]), max_new_tokens=4,
                       do_sample=False, pad_token_id=model.config.pad_token_id)
        start = time.perf_counter()
        out = model.generate(inputs, attention_mask=torch.ones_like(inputs), max_new_tokens=output_len,
                             min_new_tokens=output_len, do_sample=False, pad_token_id=model.config.pad_token_id)
        elapsed = time.perf_counter() - start
    assert out.shape[1] == inputs.shape[1] + output_len
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--input-len", type=int, default=256)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--dtype", default=None, choices=("bfloat16", "float32"),
                        help="both sides' dtype (default: what --dtype auto picks on this CPU)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=2, help="alternate both sides; keep each side's best")
    parser.add_argument("--save", action="store_true", help="write benchmarks/results/offline_vs_transformers_cpu.json")
    args = parser.parse_args()
    if args.dtype is None:
        from toolkit.runtime import cpu_capability

        args.dtype = str(cpu_capability.probe().auto_dtype()).removeprefix("torch.")
    from toolkit.runtime.model_loader.tokenizer import load_tokenizer

    special = set(load_tokenizer(None).all_special_ids)
    vocab = load_tokenizer(None).vocab_size
    prompts = [r.input_ids for r in random_requests(args.num_prompts, args.input_len, args.output_len, 1.0, vocab,
                                                    args.seed, special)]
    output_tokens = args.num_prompts * args.output_len
    ours_runs, theirs_runs = [], []
    for _ in range(args.rounds):
        ours_runs.append(run_toolkit(prompts, args.output_len, args.dtype))
        theirs_runs.append(run_transformers(prompts, args.output_len, args.dtype))
    ours, theirs = min(ours_runs), min(theirs_runs)
    print("all rounds (s): toolkit " + ", ".join(f"{x:.1f}" for x in ours_runs)
          + "; transformers " + ", ".join(f"{x:.1f}" for x in theirs_runs))
    record = {
        **provenance("benchmarks.offline_vs_transformers", sys.argv[1:], device_name("cpu"),
                     threads=torch.get_num_threads()),
        "toolkit_seconds": ours, "transformers_seconds": theirs,
        "toolkit_rounds_s": ours_runs, "transformers_rounds_s": theirs_runs,
        "toolkit_output_tok_s": output_tokens / ours, "transformers_output_tok_s": output_tokens / theirs,
        "ratio": theirs / ours,
    }
    print(f"toolkit engine:        {ours:7.2f} s  {output_tokens / ours:8.1f} output tok/s")
    print(f"transformers.generate: {theirs:7.2f} s  {output_tokens / theirs:8.1f} output tok/s")
    print(f"ratio (toolkit / transformers throughput): {theirs / ours:.2f}x")
    if args.save:
        print(f"wrote {write_result('offline_vs_transformers_cpu', record)}")


if __name__ == "__main__":
    main()
