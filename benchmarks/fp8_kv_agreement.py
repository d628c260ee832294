"""Greedy output with an fp8 KV cache against the same model with a bf16 KV cache, on the embedded SmolLM2.

    python -m benchmarks.fp8_kv_agreement [--num-prompts 32 --max-new-tokens 32 --save]

Both runs use bfloat16 weights and the default CPU KV budget (so the startup lines show the pool size each dtype
gets). For each fp8 format it prints the pool size, whether any logprob was NaN or infinite, and how far the greedy
outputs agree with the bf16-KV outputs: position by position, the matching prefix before the first differing token,
and whole answers. Free-running greedy outputs diverge for good after one differing token, so these are lower
bounds of a per-step agreement.
"""
from __future__ import annotations

import argparse
import math
import sys
from dataclasses import asdict, dataclass

from benchmarks.common import provenance, write_result

QUESTIONS = [
    "What is the capital of France?", "Write a haiku about the sea.", "Explain gravity to a child.",
    "List three prime numbers.", "What is photosynthesis?", "Give me a synonym for happy.",
    "How many days are in a leap year?", "Name a famous painter.", "What does a thermometer measure?",
    "Translate 'good morning' to Spanish.", "Why is the sky blue?", "What is 12 times 12?",
    "Suggest a name for a pet cat.", "What is the largest planet?", "Describe a rainbow in one sentence.",
    "What is the boiling point of water?", "Who wrote Romeo and Juliet?", "What is a noun?",
    "Give a tip for better sleep.", "What language is spoken in Brazil?", "How do bees make honey?",
    "What is the opposite of cold?", "Name three fruits.", "What is the speed of light?",
    "Write a short greeting for a birthday card.", "What is an atom?", "How many continents are there?",
    "What is the main ingredient of bread?", "Explain what a computer does.", "What is the tallest mountain?",
    "Give an example of a mammal.", "What causes rain?",
]


@dataclass
class Agreement:
    positions: float  # tokens equal at the same position / tokens compared
    prefix: float  # mean fraction of each answer before its first differing token
    identical: int  # answers equal token for token
    answers: int


def agreement(reference: list[list[int]], outputs: list[list[int]]) -> Agreement:
    same = total = 0
    prefixes = []
    for ref, out in zip(reference, outputs):
        length = max(len(ref), len(out))
        matches = [a == b for a, b in zip(ref, out)]
        same, total = same + sum(matches), total + length
        first_diff = matches.index(False) if False in matches else min(len(ref), len(out))
        prefixes.append(first_diff / length if length else 1.0)
    identical = sum(ref == out for ref, out in zip(reference, outputs))
    return Agreement(same / total, sum(prefixes) / len(prefixes), identical, len(reference))


def chat_prompts(tokenizer, count: int) -> list[list[int]]:
    prompts = []
    for question in (QUESTIONS * (count // len(QUESTIONS) + 1))[:count]:
        ids = tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                            tokenize=True)
        prompts.append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
    return prompts


def greedy(kv_cache_dtype: str, prompts: list[list[int]] | None, count: int, max_new_tokens: int,
           engine_args: dict | None = None) -> tuple[list[list[int]], bool, int, list[list[int]]]:
    """(outputs, all logprobs finite, max_total_num_tokens, prompts) of one engine run."""
    from toolkit.runtime import Engine

    engine = Engine(dtype="bfloat16", device="cpu", kv_cache_dtype=kv_cache_dtype, log_level="warning",
                    **(engine_args or {}))
    try:
        prompts = prompts or chat_prompts(engine.tokenizer, count)
        results = engine.generate(input_ids=prompts, return_logprob=True, sampling_params={
            "max_new_tokens": max_new_tokens, "temperature": 0.0, "ignore_eos": True})
        finite = all(math.isfinite(lp) for r in results for lp, _ in r["meta_info"]["output_token_logprobs"])
        return [r["output_ids"] for r in results], finite, engine.runner.max_total_num_tokens, prompts
    finally:
        engine.shutdown()


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--save", action="store_true", help="write benchmarks/results/fp8_kv_agreement.json")
    opts = parser.parse_args(argv)
    reference, finite, pool, prompts = greedy("auto", None, opts.num_prompts, opts.max_new_tokens)
    print(f"bf16 KV: max_total_num_tokens={pool}, logprobs finite: {finite}")
    record = {"bf16": {"max_total_num_tokens": pool, "finite": finite}}
    for fmt in ("fp8_e4m3", "fp8_e5m2"):
        outputs, finite, fp8_pool, _ = greedy(fmt, prompts, opts.num_prompts, opts.max_new_tokens)
        agree = agreement(reference, outputs)
        print(f"{fmt}: max_total_num_tokens={fp8_pool} ({fp8_pool / pool:.2f}x), logprobs finite: {finite}, "
              f"token agreement {agree.positions:.1%} by position, {agree.prefix:.1%} before the first difference, "
              f"{agree.identical}/{agree.answers} answers identical")
        record[fmt] = {"max_total_num_tokens": fp8_pool, "pool_ratio": fp8_pool / pool, "finite": finite,
                       **asdict(agree)}
    if opts.save:
        path = write_result("fp8_kv_agreement", {
            **provenance("benchmarks.fp8_kv_agreement", argv, num_prompts=opts.num_prompts,
                         max_new_tokens=opts.max_new_tokens, model="SmolLM2-135M-Instruct (embedded), bf16 weights"),
            "results": record})
        print(f"wrote {path}")


if __name__ == "__main__":
    main(sys.argv[1:])
