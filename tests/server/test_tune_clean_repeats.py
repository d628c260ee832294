"""The repeats `toolkit tune` compares are exchangeable: on the real server, each repeat of one configuration starts
from an empty prefix cache, so the second repeat takes exactly as many prompt tokens from the cache as the first
(here none). Without the flush — what tune did before — the second repeat of the same prompts is served from the
radix cache, which made every second repeat 30-120 % faster and set the noise threshold above real gains."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from toolkit.bench.command import BenchOptions, measure_step
from toolkit.bench.datasets import DatasetSpec
from toolkit.bench.sweep import Step
from toolkit.tune.workload import BenchWorkload

PROMPTS, INPUT_LEN, OUTPUT_LEN = 6, 96, 4


@dataclass
class Served:
    url: str
    log: Path


def options(url: str) -> BenchOptions:
    spec = DatasetSpec(seed=3, random_input_len=INPUT_LEN, random_output_len=OUTPUT_LEN, random_range_ratio=1.0)
    return BenchOptions(base_url=url, dataset=spec, num_prompts=PROMPTS, warmup_requests=0, progress=False)


def test_every_repeat_starts_from_an_empty_prefix_cache(server) -> None:
    target = Served(server.url, server.log_file)
    work = BenchWorkload(options(server.url), "throughput", "sglang")
    runs = [work.run(target, repeat)[1][0] for repeat in range(2)]
    assert [r["cache_reset"] for r in runs] == ["flush_cache", "flush_cache"]
    assert [r["seed"] for r in runs] == [3, 3] and all(r["completed"] == PROMPTS for r in runs)
    assert runs[0]["cached_tokens"] is not None
    assert runs[1]["cached_tokens"] == runs[0]["cached_tokens"] < PROMPTS * INPUT_LEN // 4, runs

    # the contamination the flush removes: the same prompts again, cache kept, come mostly from the cache
    opts, prepared = work._prepared(target, seed=3)
    again = measure_step(Step(None, "single"), opts, prepared, Console(quiet=True))
    assert again["cached_tokens"] > runs[1]["cached_tokens"] + PROMPTS * INPUT_LEN // 2, again["cached_tokens"]
