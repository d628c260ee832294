"""`toolkit serve` and vLLM-CPU side by side: the same client (vLLM's own `vllm bench serve`), the same workload,
one after the other on this machine, with the ratio.

    python -m benchmarks.vs_vllm [--rates inf 4] [--num-prompts 64 --input-len 256 --output-len 128] [--repeats 3]
                                 [--save]

vLLM-CPU is stood up as ../shared/peers/cpu_peers.sh does (`install-vllm`, `convert`): a venv at
$PEERS_ROOT/peer_vllm and the embedded model converted to a bf16 Hugging Face folder at
$PEERS_ROOT/models/smollm2-135m-instruct-bf16 (PEERS_ROOT defaults to /tmp). When either is missing this says so
and exits 2: no ratio is ever printed against a remembered figure.

Each server gets a warm-up run (8 prompts) and then one run per rate, random prompts of exactly --input-len tokens
(a different seed per rate, the same seeds for both servers), --output-len tokens each (ignore_eos), greedy.
`--repeats N` runs each rate N times (other prompts each time, the same for both servers) and compares the median
runs: one run here varies by up to ~15 % from the next.
`--toolkit-variant` (repeatable) adds runs of our server with other flags (e.g. overlap off) in the same session.
`--interleave` starts every server first and then runs them in turn, for each rate and repeat every server once
(the order rotated by one each repeat): the machine's drift over a session (~10 % here within minutes) then falls
on all servers alike instead of on whichever ran last. Each repeat's runs are neighbours in time and share their
prompts, so the table adds the paired ratios: each repeat's throughput and TPOT over vLLM's in the same repeat,
their median and range, and how many repeats reached vLLM's throughput. Servers idle between their runs. `--save`
writes benchmarks/results/vs_vllm_cpu.json, or vs_vllm_cpu_interleaved.json with --interleave.

`--vllm-dtypes bfloat16 float32` measures vLLM at each dtype; the ratios are against vLLM's best at each rate (on a
CPU without native bf16 GEMMs its float32 is ~5x its bf16). `--isa avx2` runs both servers as an AVX2 CPU without
AVX-512 would (`cpu_capability.AVX2_MACHINE_ENV`: oneDNN, ATen and MKL capped at AVX2, our kernels at x86-64-v3),
on any x86 machine; vLLM's own compiled kernels follow the CPU it runs on (nothing caps them), which the record
states. The record names the suffix: vs_vllm_cpu_avx2[_interleaved].json.
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from benchmarks.common import device_name, free_port, provenance, write_result
from toolkit.tune.launcher import LaunchError, ServerProcess, serve_command

SERVED_NAME = "smollm2-135m-instruct"
VLLM_STARTUP_TIMEOUT = 900.0  # vLLM-CPU compiles its model with inductor at start (~2.5 min on 2 cores)
TOOLKIT_STARTUP_TIMEOUT = 300.0
WARMUP_PROMPTS, WARMUP_SEED = 8, 100
REPEAT_SEED_STEP = 1000  # repeat i of a rate uses seed + 1000 i: other prompts, the same ones for both servers
METRICS = ("output_throughput", "request_throughput", "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms",
           "mean_tpot_ms", "median_tpot_ms", "p99_tpot_ms", "mean_itl_ms", "median_itl_ms", "duration",
           "completed", "total_output_tokens")


@dataclass(frozen=True)
class Peers:
    root: Path

    @property
    def vllm(self) -> Path:
        return self.root / "peer_vllm" / "bin" / "vllm"

    @property
    def model(self) -> Path:
        return self.root / "models" / "smollm2-135m-instruct-bf16"

    def missing(self) -> list[str]:
        return [f"{what} ({path})" for what, path in (("vLLM-CPU", self.vllm), ("the bf16 model folder", self.model))
                if not path.exists()]


def vllm_server(peers: Peers, port: int, out: Path, dtype: str, isa_env: dict[str, str], *flags: str) -> ServerProcess:
    """`vllm serve` of the embedded model on 127.0.0.1 as ../shared/peers/cpu_peers.sh starts it; `isa_env` and
    `flags` come last (they win)."""
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": "4", "HF_HUB_OFFLINE": "1",
           "VLLM_CPU_OMP_THREADS_BIND": f"0-{os.cpu_count() - 1}", **isa_env}
    command = [str(peers.vllm), "serve", str(peers.model), "--host", "127.0.0.1", "--port", str(port), "--dtype",
               dtype, "--max-model-len", "4096", "--served-model-name", SERVED_NAME, *flags]
    return ServerProcess(command, port, out, env=env)


def toolkit_launch(flags: list[str], port: int, log_file: Path) -> tuple[list[str], dict[str, str]]:
    """The `toolkit serve` command and the environment words of a variant: KEY=VALUE words (e.g. its CPU threads)
    set variables, the rest are flags."""
    def is_env(word: str) -> bool:
        return "=" in word and not word.startswith("-")
    env = dict(word.split("=", 1) for word in flags if is_env(word))
    command = serve_command(port, "--served-model-name", SERVED_NAME, *(w for w in flags if not is_env(w)),
                            log_file=log_file)
    return command, env


def toolkit_server(flags: list[str], port: int, out: Path, log_file: Path, isa_env: dict[str, str]) -> ServerProcess:
    command, env = toolkit_launch(flags, port, log_file)
    return ServerProcess(command, port, out, env={**os.environ, **isa_env, **env})


def bench(peers: Peers, port: int, prompts: int, rate: str, seed: int, args, result: Path) -> dict:
    """One `vllm bench serve` run; its saved result JSON."""
    command = [str(peers.vllm), "bench", "serve", "--backend", "openai", "--base-url", f"http://127.0.0.1:{port}",
               "--endpoint", "/v1/completions", "--model", SERVED_NAME, "--tokenizer", str(peers.model),
               "--dataset-name", "random", "--random-input-len", str(args.input_len), "--random-output-len",
               str(args.output_len), "--ignore-eos", "--temperature", "0", "--percentile-metrics", "ttft,tpot,itl,e2el",
               "--metric-percentiles", "50,99", "--disable-tqdm", "--num-prompts", str(prompts), "--request-rate",
               rate, "--seed", str(seed), "--save-result", "--result-dir", str(result.parent), "--result-filename",
               result.name]
    done = subprocess.run(command, env={**os.environ, "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True,
                          timeout=3600)
    if done.returncode != 0 or not result.exists():
        raise RuntimeError(f"vllm bench serve failed ({done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    data = json.loads(result.read_text())
    return {key: data.get(key) for key in METRICS}


@dataclass(frozen=True)
class Contender:
    name: str  # the slug its files are named by
    launch: Callable[[], ServerProcess]  # starts it (a ServerProcess runs from its construction)
    startup_timeout: float


def start(contender: Contender, peers: Peers, args, workdir: Path) -> ServerProcess:
    """Start a server, wait until it is healthy, give it the warm-up run."""
    print(f"== {contender.name}: starting", flush=True)
    server = contender.launch()
    try:
        server.wait_healthy(contender.startup_timeout)
        bench(peers, server.port, WARMUP_PROMPTS, "inf", WARMUP_SEED, args, workdir / f"{contender.name}_warmup.json")
    except BaseException:
        server.stop()
        raise
    return server


def measured_run(name: str, server: ServerProcess, rate: str, repeat: int, peers: Peers, args,
                 workdir: Path) -> dict:
    """Repeat `repeat` of `rate`: the same prompts for every server (seeded by the rate's place and the repeat)."""
    seed = args.rates.index(rate) + 1 + REPEAT_SEED_STEP * repeat
    r = bench(peers, server.port, args.num_prompts, rate, seed, args, workdir / f"{name}_{rate}_{repeat}.json")
    print(f"   {name} rate {rate}: {r['output_throughput']:.1f} output tok/s, TPOT {r['mean_tpot_ms']:.1f} ms, "
          f"TTFT {r['mean_ttft_ms']:.0f} ms, {r['completed']} completed", flush=True)
    return r


def measure(contender: Contender, peers: Peers, args, workdir: Path) -> dict:
    """One server alone: started, warmed up, every rate's repeats, stopped."""
    with start(contender, peers, args, workdir) as server:
        runs = {rate: median_run([measured_run(contender.name, server, rate, repeat, peers, args, workdir)
                                  for repeat in range(args.repeats)]) for rate in args.rates}
    return {"command": shlex.join(server.command), "runs": runs}


def interleaved_order(names: list[str], rates: list[str], repeats: int) -> list[tuple[str, str, int]]:
    """(server, rate, repeat) in running order: for each rate and repeat every server once, the order rotated by
    one each repeat so that no server always runs first."""
    order = []
    for rate in rates:
        for repeat in range(repeats):
            turn = repeat % len(names)
            order.extend((name, rate, repeat) for name in names[turn:] + names[:turn])
    return order


def measure_interleaved(contenders: list[Contender], peers: Peers, args, workdir: Path) -> dict[str, dict]:
    """Every server up at once, run in turn (`interleaved_order`); each one's median runs, by slug."""
    servers: dict[str, ServerProcess] = {}
    runs: dict[str, dict[str, list]] = {c.name: {rate: [] for rate in args.rates} for c in contenders}
    with contextlib.ExitStack() as stack:
        for contender in contenders:
            servers[contender.name] = stack.enter_context(start(contender, peers, args, workdir))
        for name, rate, repeat in interleaved_order(list(servers), args.rates, args.repeats):
            runs[name][rate].append(measured_run(name, servers[name], rate, repeat, peers, args, workdir))
    return {name: {"command": shlex.join(server.command),
                   "runs": {rate: median_run(repeats) for rate, repeats in runs[name].items()}}
            for name, server in servers.items()}


def median_run(repeats: list[dict]) -> dict:
    """The run of median output throughput (the lower middle of an even count), with every run's throughput and
    TPOT in repeat order: one run on this shared 2-core machine varies by up to ~15 % from the next."""
    ranked = sorted(repeats, key=lambda r: r["output_throughput"])
    return {**ranked[(len(ranked) - 1) // 2], "repeat_output_throughputs": [r["output_throughput"] for r in repeats],
            "repeat_mean_tpot_ms": [r["mean_tpot_ms"] for r in repeats]}


def paired_ratios(run: dict, peer: dict) -> dict:
    """Repeat by repeat, a server's throughput and TPOT over the peer's (runs that were neighbours in time, on the
    same prompts): the median ratio, its range, and the repeats that reached the peer's throughput."""
    throughput = [ours / theirs for ours, theirs in zip(run["repeat_output_throughputs"],
                                                        peer["repeat_output_throughputs"], strict=True)]
    tpot = [ours / theirs for ours, theirs in zip(run["repeat_mean_tpot_ms"], peer["repeat_mean_tpot_ms"],
                                                  strict=True)]
    return {"output_throughput": throughput, "median_output_throughput": statistics.median(throughput),
            "mean_tpot_ms": tpot, "median_mean_tpot_ms": statistics.median(tpot),
            "repeats_at_or_above": sum(ratio >= 1.0 for ratio in throughput)}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rates", nargs="+", default=["inf", "4"])
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--input-len", type=int, default=256)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=1,
                        help="runs per rate and server; the table shows the median run and the spread")
    parser.add_argument("--toolkit-flags", default="", help="extra `toolkit serve` flags for the main run")
    parser.add_argument("--toolkit-variant", dest="toolkit_variants", action="append", default=[], metavar="FLAGS",
                        help="another `toolkit serve` flag set to measure, repeatable; KEY=VALUE words set the "
                             "server's environment. Flags start with '--', so join them with '=': "
                             "--toolkit-variant='--disable-overlap-schedule' "
                             "--toolkit-variant='TOOLKIT_CPU_DECODE_THREADS=2'")
    parser.add_argument("--interleave", action="store_true",
                        help="start every server first, then run them in turn for each rate and repeat")
    parser.add_argument("--vllm-dtypes", nargs="+", default=["bfloat16"], choices=["bfloat16", "float32"],
                        help="vLLM's --dtype, each measured; ratios are against vLLM's best at each rate")
    parser.add_argument("--isa", choices=["native", "avx2"], default="native",
                        help="avx2: run both servers as an AVX2 CPU without AVX-512 would, on any x86 machine")
    parser.add_argument("--peers-root", type=Path, default=Path(os.environ.get("PEERS_ROOT", "/tmp")))
    parser.add_argument("--save", action="store_true", help="write benchmarks/results/vs_vllm_cpu.json "
                        "(vs_vllm_cpu_interleaved.json with --interleave)")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats must be at least 1, got {args.repeats}")
    return args


def main() -> int:
    args = parse_args()
    peers = Peers(args.peers_root)
    if missing := peers.missing():
        print("vLLM-CPU is not set up here: missing " + "; ".join(missing) + ".\nStand it up with "
              "../shared/peers/cpu_peers.sh install-hf && cpu_peers.sh convert && cpu_peers.sh install-vllm "
              "(PEERS_ROOT picks the folder), then run this again. No ratio without a measured peer.",
              file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="vs-vllm-") as tmp:
        workdir = Path(tmp)
        variants = {"toolkit": shlex.split(args.toolkit_flags)}
        variants.update({f"toolkit {v}": shlex.split(args.toolkit_flags) + shlex.split(v)
                         for v in args.toolkit_variants})
        isa_env = isa_environment(args.isa)
        contenders = {}
        for name, flags in variants.items():
            slug = name.replace(" ", "_").replace("-", "")
            launch = functools.partial(toolkit_server, flags, free_port(), workdir / f"{slug}.out",
                                       workdir / f"{slug}.log", isa_env)
            contenders[name] = Contender(slug, launch, TOOLKIT_STARTUP_TIMEOUT)
        for dtype in args.vllm_dtypes:
            name = vllm_name(dtype)
            launch = functools.partial(vllm_server, peers, free_port(), workdir / f"{name}.out", dtype, isa_env)
            contenders[name] = Contender(name.replace(" ", "_"), launch, VLLM_STARTUP_TIMEOUT)
        try:
            if args.interleave:
                by_slug = measure_interleaved(list(contenders.values()), peers, args, workdir)
                results = {name: by_slug[c.name] for name, c in contenders.items()}
            else:
                results = {name: measure(c, peers, args, workdir) for name, c in contenders.items()}
        except (LaunchError, RuntimeError, subprocess.TimeoutExpired) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
    paired = _paired(results, args.rates) if args.interleave else None
    table = _table(results, args.rates, paired)
    print(table)
    if args.save:
        record = {**provenance("benchmarks.vs_vllm", sys.argv[1:], device_name("cpu")),
                  "workload": {"num_prompts": args.num_prompts, "input_len": args.input_len,
                               "output_len": args.output_len, "rates": args.rates, "client": "vllm bench serve",
                               "interleaved": args.interleave},
                  "isa": {"mode": args.isa, "environment": isa_env,
                          "note": None if args.isa == "native" else "vLLM's own compiled kernels follow the CPU; "
                          "the environment caps oneDNN, ATen and MKL for both servers"},
                  "vllm_baseline": _baselines(results, args.rates),
                  "servers": results, "ratio_output_throughput": _ratios(results, args.rates), "table": table}
        if paired is not None:
            record["paired_ratios"] = paired
        name = "vs_vllm_cpu" + ("_avx2" if args.isa == "avx2" else "") + ("_interleaved" if args.interleave else "")
        print(f"wrote {write_result(name, record)}")
    return 0


def isa_environment(isa: str) -> dict[str, str]:
    from toolkit.runtime.cpu_capability import AVX2_MACHINE_ENV

    return dict(AVX2_MACHINE_ENV) if isa == "avx2" else {}


def vllm_name(dtype: str) -> str:
    """The contender's name: plain "vllm" for its bf16 (the name earlier records use), "vllm float32" else."""
    return "vllm" if dtype == "bfloat16" else f"vllm {dtype}"


def _is_vllm(name: str) -> bool:
    return name == "vllm" or name.startswith("vllm ")


def _baselines(results: dict, rates: list[str]) -> dict[str, str]:
    """Per rate, the vLLM contender of the highest median output throughput: the baseline every ratio uses."""
    return {rate: max((name for name in results if _is_vllm(name)),
                      key=lambda name: results[name]["runs"][rate]["output_throughput"]) for rate in rates}


def _ratios(results: dict, rates: list[str]) -> dict[str, dict[str, float]]:
    """Every server's median throughput over the baseline's, per rate (the baseline's own is 1.0)."""
    base = _baselines(results, rates)
    return {name: {rate: r["runs"][rate]["output_throughput"] / results[base[rate]]["runs"][rate]["output_throughput"]
                   for rate in rates} for name, r in results.items()}


def _paired(results: dict, rates: list[str]) -> dict[str, dict[str, dict]]:
    """Our servers' repeat-by-repeat ratios to the baseline vLLM's repeats."""
    base = _baselines(results, rates)
    return {name: {rate: paired_ratios(r["runs"][rate], results[base[rate]]["runs"][rate]) for rate in rates}
            for name, r in results.items() if not _is_vllm(name)}


def _table(results: dict, rates: list[str], paired: dict[str, dict[str, dict]] | None = None) -> str:
    """The median runs; with `paired` (`_paired`, interleaved repeats) also each server's repeat-by-repeat ratios
    to vLLM."""
    lines = ["| server | rate | output tok/s | runs (tok/s) | vs vLLM | TPOT mean ms | TTFT mean ms | ITL p50 ms | "
             "duration s |", "|---|---|---|---|---|---|---|---|---|"]
    ratios, base = _ratios(results, rates), _baselines(results, rates)
    for name, result in results.items():
        for rate in rates:
            r = result["runs"][rate]
            ratio = "1.00x (baseline)" if base[rate] == name else f"{ratios[name][rate]:.2f}x"
            spread = ", ".join(f"{x:.0f}" for x in r.get("repeat_output_throughputs", [r["output_throughput"]]))
            lines.append(f"| {name} | {rate} | {r['output_throughput']:.1f} | {spread} | {ratio} | "
                         f"{r['mean_tpot_ms']:.1f} | {r['mean_ttft_ms']:.0f} | {r['median_itl_ms']:.1f} | "
                         f"{r['duration']:.1f} |")
    if paired is not None:
        lines += ["", "| server | rate | throughput / vLLM's, per repeat | median | repeats >= 1.0 | "
                  "TPOT / vLLM's, median |", "|---|---|---|---|---|---|"]
        for name, by_rate in paired.items():
            for rate, p in by_rate.items():
                each = ", ".join(f"{x:.2f}" for x in p["output_throughput"])
                lines.append(f"| {name} | {rate} | {each} | {p['median_output_throughput']:.2f}x | "
                             f"{p['repeats_at_or_above']} of {len(p['output_throughput'])} | "
                             f"{p['median_mean_tpot_ms']:.2f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
