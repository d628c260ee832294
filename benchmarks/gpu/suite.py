"""The GPU benchmark suite in one command, on dummy-weight models:
  1. decode step time of llama-3.1-8b (bf16) at batch 1/8/64/256 against the memory-bandwidth roofline;
  2. offline throughput of llama-3.1-8b on 1000 random prompts (input 256–1024, output 128–512, ignore_eos),
     CUDA graphs on vs off;
  3. offline throughput of qwen3-0.6b on 256 prompts, input and output uniform in [100, 1024].
Each part runs in its own process (so each engine plans its memory on an empty GPU) and writes one JSON under
--out with the command, git commit, device and date.

    python -m benchmarks.gpu.suite --out benchmarks/results/
    python -m benchmarks.gpu.suite --dry-run --out /tmp/suite     # CPU, tiny configs, in-process, seconds
"""
from __future__ import annotations

import argparse
import importlib
import json
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

import torch

from benchmarks.common import RESULTS, provenance, slug, write_result

MODULE = "benchmarks.gpu.suite"
DECODE, OFFLINE = "benchmarks.gpu.decode_roofline", "benchmarks.gpu.offline_throughput"
PARTS = ("decode", "llama-3.1-8b", "qwen3-0.6b")
LLAMA_TARGET = {"device": "H100", "output_throughput_tok_s": 16000.0}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=None, help="result folder (default: benchmarks/results/; none for "
                                                               "a dry run)")
    parser.add_argument("--only", nargs="+", choices=PARTS, default=list(PARTS))
    parser.add_argument("--attention-backend", default="auto")
    parser.add_argument("--engine-args", default="{}", help="extra ServerArgs as JSON, passed to every part")
    parser.add_argument("--in-process", action="store_true", help="run the parts in this process")
    parser.add_argument("--dry-run", action="store_true", help="CPU, tiny configs, in-process: exercises the code")
    return parser


def plan(opts: argparse.Namespace) -> list[tuple[str, str, list[str]]]:
    """(run name, module, its argv) of every run, in order."""
    common = ["--attention-backend", opts.attention_backend, "--engine-args", opts.engine_args]
    common += ["--dry-run"] if opts.dry_run else []
    runs = []
    if "decode" in opts.only:
        runs.append(("decode", DECODE, common))
    if "llama-3.1-8b" in opts.only:
        runs.append(("llama_graph_on", OFFLINE, ["--workload", "llama-3.1-8b", *common]))
        runs.append(("llama_graph_off", OFFLINE, ["--workload", "llama-3.1-8b", "--disable-cuda-graph", *common]))
    if "qwen3-0.6b" in opts.only:
        runs.append(("qwen", OFFLINE, ["--workload", "qwen3-0.6b", *common]))
    return runs


def execute(module: str, argv: list[str], in_process: bool) -> dict:
    """The run's record, or {"error": ...} when it failed."""
    if in_process:
        try:
            return importlib.import_module(module).main(argv)
        except Exception:  # noqa: BLE001 - one failed part is reported, the others still run
            return {"error": traceback.format_exc()}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "record.json"
        done = subprocess.run([sys.executable, "-m", module, *argv, "--json-out", str(out)], cwd=RESULTS.parents[1])
        if done.returncode != 0 or not out.exists():
            return {"error": f"{module} exited with status {done.returncode}"}
        return json.loads(out.read_text())


def combine(runs: dict[str, dict], meta: dict) -> dict[str, dict]:
    """One result per benchmark, keyed by its file name."""
    results = {}
    if "decode" in runs:
        results["decode_roofline"] = _with_suite_meta(runs["decode"], meta)
    if "llama_graph_on" in runs:
        on, off = runs["llama_graph_on"], runs["llama_graph_off"]
        results["offline_llama-3.1-8b"] = {
            "meta": meta, "graph_on": on, "graph_off": off,
            "graph_speedup_output_throughput": _ratio(on, off, "output_throughput"),
            "target": {**LLAMA_TARGET, "met": _llama_target_met(on, meta)},
        }
    if "qwen" in runs:
        results["offline_qwen3-0.6b"] = _with_suite_meta(runs["qwen"], meta)
    return results


def _with_suite_meta(run: dict, meta: dict) -> dict:
    """The run's record under the suite's provenance; the run's own (its sub-command) stays as run_meta."""
    fields = {k: v for k, v in run.items() if k != "meta"}
    return {"meta": meta, "run_meta": run.get("meta"), **fields}


def _ratio(a: dict, b: dict, key: str) -> float | None:
    return a[key] / b[key] if key in a and key in b and b[key] else None


def _llama_target_met(graph_on: dict, meta: dict) -> bool | None:
    if meta["dry_run"] or LLAMA_TARGET["device"] not in meta["device"] or "output_throughput" not in graph_on:
        return None
    return graph_on["output_throughput"] >= LLAMA_TARGET["output_throughput_tok_s"]


def main(argv: list[str] | None = None) -> dict[str, dict]:
    argv = sys.argv[1:] if argv is None else list(argv)
    opts = build_parser().parse_args(argv)
    device = torch.device("cpu" if opts.dry_run else "cuda")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"{MODULE} needs a CUDA GPU; use --dry-run to exercise it on CPU")
    meta = provenance(MODULE, argv, device, dry_run=opts.dry_run)
    runs = {name: execute(module, run_argv, opts.in_process or opts.dry_run)
            for name, module, run_argv in plan(opts)}
    results = combine(runs, meta)
    out = opts.out or (None if opts.dry_run else RESULTS)
    if out is not None:
        for name, record in results.items():
            path = write_result(f"{name}_{slug(record['meta']['device'])}", record, out)
            print(f"wrote {path}")
    failed = [name for name, record in runs.items() if "error" in record]
    for name in failed:
        print(f"{name} failed: {runs[name]['error']}", file=sys.stderr)
    if failed and __name__ == "__main__":
        sys.exit(1)
    return results


if __name__ == "__main__":
    main()
