"""`toolkit bench-offline`: offline throughput through the in-process Engine (SGLang's bench_offline_throughput).

N prompts with random input/output lengths in SGLang's `[range_ratio·L, L]` sense (or a JSONL of prompts),
all submitted at once with `ignore_eos`, timed end to end; prints request/input/output throughput and appends a
JSON record.
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

from toolkit.runtime.server_args import ServerArgs, SuggestingArgumentParser, add_cli_args


@dataclass(frozen=True)
class OfflineRequest:
    input_ids: list[int]
    output_len: int


def random_requests(num: int, input_len: int, output_len: int, range_ratio: float, vocab_size: int,
                    seed: int, special_ids: set[int]) -> list[OfflineRequest]:
    rng = random.Random(seed)
    usable = [t for t in range(min(vocab_size, 32000)) if t not in special_ids]
    requests = []
    for _ in range(num):
        n_in = rng.randint(max(int(input_len * range_ratio), 1), input_len)
        n_out = rng.randint(max(int(output_len * range_ratio), 1), output_len)
        requests.append(OfflineRequest([rng.choice(usable) for _ in range(n_in)], n_out))
    return requests


def jsonl_requests(path: Path, tokenizer, default_output_len: int, limit: int) -> list[OfflineRequest]:
    """The `custom` dataset's JSONL (`{"prompt", "output_len"}` or a messages list), as token ids."""
    from toolkit.bench.datasets.base import DatasetError
    from toolkit.bench.datasets.custom import read_rows

    try:
        rows = read_rows(path)[:limit]
    except DatasetError as exc:
        raise SystemExit(f"toolkit bench-offline: error: {exc}") from None
    return [OfflineRequest(tokenizer.encode(row.prompt), row.output_len or default_output_len) for row in rows]


def build_parser() -> SuggestingArgumentParser:
    parser = SuggestingArgumentParser(prog="toolkit bench-offline",
                                      description="Offline throughput of the in-process engine.")
    group = parser.add_argument_group("Benchmark")
    group.add_argument("--num-prompts", type=int, default=64)
    group.add_argument("--random-input-len", type=int, default=256)
    group.add_argument("--random-output-len", type=int, default=128)
    group.add_argument("--random-range-ratio", type=float, default=1.0,
                       help="lengths are uniform in [ratio*L, L] (1.0 = exactly L)")
    group.add_argument("--dataset-path", type=Path, default=None, help="JSONL of {\"prompt\", \"output_len\"}")
    group.add_argument("--seed", type=int, default=1)
    group.add_argument("--output-file", type=Path, default=None, help="append one JSON record per run")
    add_cli_args(parser)
    return parser


def main(argv: list[str]) -> int:
    parser = build_parser()
    ns = vars(parser.parse_args(argv))
    bench = {k: ns.pop(k) for k in ("num_prompts", "random_input_len", "random_output_len", "random_range_ratio",
                                    "dataset_path", "seed", "output_file")}
    if bench["num_prompts"] < 1 or not 0.0 <= bench["random_range_ratio"] <= 1.0:
        parser.error("--num-prompts must be >= 1 and --random-range-ratio in [0, 1]")
    if bench["dataset_path"] is not None and not bench["dataset_path"].exists():
        parser.error(f"--dataset-path {bench['dataset_path']}: no such file")
    try:
        args = ServerArgs(**ns)
    except ValueError as exc:
        parser.error(str(exc))
    record = run(args, **bench)
    print_summary(record)
    if bench["output_file"] is not None:
        with open(bench["output_file"], "a", encoding="utf-8") as out:
            out.write(json.dumps(record) + "\n")
    return 0


def run(args: ServerArgs, num_prompts: int, random_input_len: int, random_output_len: int,
        random_range_ratio: float, dataset_path: Path | None, seed: int, output_file: Path | None = None) -> dict:
    from toolkit.runtime.engine import Engine

    engine = Engine(**asdict(args))
    tokenizer = engine.tokenizer
    if dataset_path is not None:
        requests = jsonl_requests(dataset_path, tokenizer, random_output_len, num_prompts)
    else:
        specials = set(getattr(tokenizer, "all_special_ids", []))
        requests = random_requests(num_prompts, random_input_len, random_output_len, random_range_ratio,
                                   engine.runner.config.vocab_size, seed, specials)
    engine.generate(input_ids=[[1, 2, 3]], sampling_params={"max_new_tokens": 2})  # warm-up
    params = [{"max_new_tokens": r.output_len, "temperature": 0.0, "ignore_eos": True} for r in requests]
    start = time.perf_counter()
    results = engine.generate(input_ids=[r.input_ids for r in requests], sampling_params=params)
    latency = time.perf_counter() - start
    input_tokens = sum(len(r.input_ids) for r in requests)
    output_tokens = sum(r["meta_info"]["completion_tokens"] for r in results)
    return {
        "backend": "toolkit-engine",
        "model": engine.runner.source.display_path,
        "device": str(engine.runner.device),
        "dtype": str(engine.runner.dtype).replace("torch.", ""),
        "attention_backend": engine.runner.attention_backend_name,
        **throughput_record(len(results), latency, input_tokens, output_tokens),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def throughput_record(requests: int, latency: float, input_tokens: int, output_tokens: int) -> dict:
    """The `bench_offline_throughput` counters and rates of one timed run."""
    return {
        "successful_requests": requests,
        "total_latency": latency,
        "total_input_tokens": input_tokens,
        "total_output_tokens": output_tokens,
        "request_throughput": requests / latency,
        "input_throughput": input_tokens / latency,
        "output_throughput": output_tokens / latency,
        "total_throughput": (input_tokens + output_tokens) / latency,
    }


def print_summary(record: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="Offline throughput", show_header=False)
    for key in ("model", "device", "dtype", "successful_requests", "total_latency", "total_input_tokens",
                "total_output_tokens", "request_throughput", "input_throughput", "output_throughput"):
        value = record[key]
        table.add_row(key, f"{value:.2f}" if isinstance(value, float) else str(value))
    Console().print(table)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
