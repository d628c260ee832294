"""`toolkit tune` against the searches users run instead, from mistuned starts over four flags (issue 51).

For every start, on the same workload and machine:
- **control**: the start itself, untouched;
- **tune**: `toolkit tune` with `--knobs` set to the four flags, `--repeats R`, `--max-steps S`; it uses L launches;
- **random**: random search with the same L launches (the start, then L - 1 draws from the space);
- **optuna**: Optuna's TPE sampler with the same L launches (the start told as its first trial, then L - 1 asks);
- **random 4x**: random search with 4L launches (the start, then 4L - 1 draws).

Every launch is a fresh server; its value is the median of R repeats, each started clean (prefix cache flushed,
server idle: `tune.workload`). Random search draws from one seeded stream shared by the starts (a draw does not
depend on the start), so its launches are measured once and reused; the start's own launch is tune's step 0,
reused by random search and Optuna (the same measurement for all three). Then the control and every method's best
are re-measured together: `--rounds` interleaved rounds (a fresh launch each, order flipped every round), and each
is reported as the median over rounds of its ratio to the round's value of the best re-measured configuration.

    python -m benchmarks.tune_vs_search [--quick] [--rounds 3] [--save]
    python -m benchmarks.tune_vs_search --engine vllm --peers-root /work/peers [--save]

`--engine vllm` runs the same comparison against vLLM-CPU (the `../shared/peers` recipe: $PEERS_ROOT/peer_vllm and
the embedded model's Hugging Face folder) over its own flags (VLLM_SPACE: `--max-num-seqs`,
`--max-num-batched-tokens`, and the KV pool in blocks, `--num-gpu-blocks-override`, its CPU equivalent of
`--gpu-memory-utilization`), launched by `toolkit tune --launch` as a user would; each launch costs a vLLM start-up.

`--quick` shrinks the workload, the budgets and the starts to check the script (numbers mean nothing). `--save`
writes benchmarks/results/tune_vs_search.json (every run kept in tune_vs_search.runs.jsonl, see `write_result`).
Goal (issue 51): tune >= 0.95x the best found, with <= 1/4 of the launches of random 4x, ahead of Optuna and random
at equal budget on most starts, never below the control.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console

from benchmarks.common import NoDoctor, RandomWorkload, provenance, write_result
from benchmarks.vs_vllm import SERVED_NAME, Peers
from toolkit.bench.command import BenchOptions
from toolkit.tune.experiment import Experiment
from toolkit.tune.flags import Flags
from toolkit.tune.launch import CommandLauncher
from toolkit.tune.session import TuneOptions, run_tune
from toolkit.tune.workload import BenchWorkload

MODULE = "benchmarks.tune_vs_search"
OUT = Path("toolkit-out/tune_vs_search")  # NOTE: ignored by git; each run's server logs kept for inspection
DEFAULT = "default"  # a space value meaning "flag not given": the server's own default applies

# NOTE: every value a start uses is in its flag's list, so Optuna can be told the start as a trial of the space.
SPACE: dict[str, tuple[str, ...]] = {
    "--max-running-requests": (DEFAULT, "1", "2", "3", "4", "6", "8", "12", "16", "24", "32"),
    "--max-total-tokens": (DEFAULT, "768", "1024", "1536", "2048", "3072", "4096", "8192"),
    "--chunked-prefill-size": (DEFAULT, "64", "96", "128", "256", "512", "1024", "2048", "4096"),
    "--schedule-conservativeness": (DEFAULT, "0.1", "0.3", "0.5", "1.0", "1.5", "2.0", "3.0"),
}
STARTS = {
    "cap and pool low": "--max-running-requests 2 --max-total-tokens 1024",
    "small chunk, too conservative": "--chunked-prefill-size 64 --schedule-conservativeness 3.0",
    "tiny pool, too aggressive": "--max-total-tokens 768 --schedule-conservativeness 0.1",
    "all four off": "--max-running-requests 3 --max-total-tokens 768 --chunked-prefill-size 96 "
                    "--schedule-conservativeness 2.0",
}
WORKLOAD, QUICK_WORKLOAD = RandomWorkload(16, 192, 32), RandomWorkload(8, 64, 8)

# vLLM-CPU's flags for the same ideas: the running cap, the step budget, the KV pool in blocks (128 tokens a block on
# a CPU; a request of the workload takes 2; 9 blocks are the least that hold one max-model-len request of 1,024,
# below that vLLM refuses to start). vLLM has no admission-conservativeness flag.
VLLM_SPACE: dict[str, tuple[str, ...]] = {
    "--max-num-seqs": (DEFAULT, "1", "2", "4", "8", "16", "32", "64"),
    "--max-num-batched-tokens": (DEFAULT, "128", "256", "512", "1024", "2048", "4096", "8192"),
    "--num-gpu-blocks-override": (DEFAULT, "9", "12", "16", "24", "32", "64"),
}
VLLM_STARTS = {
    "vllm: cap, budget and pool low": "--max-num-seqs 2 --max-num-batched-tokens 128 --num-gpu-blocks-override 12",
    "vllm: tiny pool": "--num-gpu-blocks-override 9",
    "vllm: small step budget": "--max-num-batched-tokens 128",
    "vllm: cap and budget low": "--max-num-seqs 4 --max-num-batched-tokens 256",
}
VLLM_WORKLOAD = RandomWorkload(16, 192, 32)
VLLM_HEALTH_TIMEOUT = 600.0  # a vLLM-CPU start-up takes minutes on 2 cores


@dataclass(frozen=True, slots=True)
class MaxRate:
    """`--objective max-rate`: the highest Poisson rate whose run keeps 90 % of its requests within the SLO, found by
    `toolkit bench`'s search (a first guess, doubled or halved until bracketed, then bisected) in `runs` runs of
    `duration` seconds each (a longer run at a higher rate sends more requests). One search is one repeat."""

    slo: tuple[str, ...] = ("ttft:3000", "tpot:300")
    duration: float = 12.0
    runs: int = 4
    first_rate: str = "1"

    def options(self, throughput: BenchOptions) -> BenchOptions:
        return dataclasses.replace(throughput, num_prompts=None, duration=self.duration, rate=self.first_rate,
                                   slo=self.slo, search_runs=self.runs)

    def record(self) -> dict:
        return {"objective": "max-rate", "slo": list(self.slo), "duration": self.duration, "runs": self.runs,
                "first_rate": self.first_rate}


@dataclass(frozen=True, slots=True)
class Target:
    """What is tuned: the engine (tune's vocabulary), its launch template (None: `toolkit serve`), its flag space and
    starts, and the workload as the client sends it."""

    engine: str
    space: dict[str, tuple[str, ...]]
    starts: dict[str, str]
    launch: str | None = None
    backend: str = "sglang"
    model: str | None = None
    health_timeout: float = 600.0

    def workload(self, workload: RandomWorkload) -> BenchOptions:
        return dataclasses.replace(workload.options(), backend=self.backend, model=self.model)

    def launcher(self) -> CommandLauncher:
        return CommandLauncher(self.launch, self.health_timeout)


TOOLKIT = Target("sglang", SPACE, STARTS)


def vllm_target(peers: Peers) -> Target:
    """vLLM-CPU as ../shared/peers starts it, float32, its stats line every second (diagnose's steady lines within a
    one-minute run) and /reset_prefix_cache on (each repeat starts from an empty prefix cache). `--enforce-eager`:
    a start-up without torch.compile's warm-up takes 37 s here against 113 s (AMD EPYC, 2 cores), the same for
    every method."""
    env = (f"env VLLM_TARGET_DEVICE=cpu VLLM_CPU_KVCACHE_SPACE=1 VLLM_CPU_OMP_THREADS_BIND=0-{os.cpu_count() - 1} "
           "HF_HUB_OFFLINE=1 VLLM_SERVER_DEV_MODE=1 VLLM_LOG_STATS_INTERVAL=1")
    launch = (f"{env} {peers.vllm} serve {peers.model} --host 127.0.0.1 --port {{port}} --dtype float32 "
              f"--max-model-len 1024 --enforce-eager --served-model-name {SERVED_NAME} {{flags}}")
    return Target("vllm", VLLM_SPACE, VLLM_STARTS, launch, "openai", SERVED_NAME, VLLM_HEALTH_TIMEOUT)

Measure = Callable[[Flags], "Measured"]


@dataclass(frozen=True, slots=True)
class Measured:
    """One launch: the median of its repeats (None when the launch or every run failed)."""

    flags: str
    value: float | None
    values: tuple[float, ...] = ()
    error: str | None = None
    seconds: float = 0.0

    @classmethod
    def from_record(cls, record: dict) -> Measured:
        return cls(record["flags"], record["value"], tuple(record["values"]), record["error"], record["seconds"])

    def record(self) -> dict:
        return {"flags": self.flags, "value": self.value, "values": list(self.values), "error": self.error,
                "seconds": round(self.seconds, 1)}


@dataclass(slots=True)
class Search:
    """A method's launches, in order, and its best by its own measurements."""

    method: str
    launches: list[Measured] = field(default_factory=list)
    seconds: float = 0.0
    chosen: str | None = None  # tune's pick (its noise rule decides); the others pick their highest value
    reason: str | None = None  # why tune stopped

    @property
    def best(self) -> str | None:
        if self.chosen is not None:
            return self.chosen
        measured = [m for m in self.launches if m.value is not None]
        return max(measured, key=lambda m: m.value).flags if measured else None

    @classmethod
    def from_record(cls, record: dict) -> Search:
        """A search as `record` saved it (its best: the highest of its launches, as it picked)."""
        return cls(record["method"], [Measured.from_record(t) for t in record["trials"]], record["seconds"])

    def record(self) -> dict:
        return {"method": self.method, "launches": len(self.launches), "seconds": round(self.seconds, 1),
                "best_flags": self.best, "reason": self.reason, "trials": [m.record() for m in self.launches]}


def with_values(start: Flags, values: dict[str, str]) -> Flags:
    """The start with each flag of `values` set (DEFAULT: removed, the server's default)."""
    flags = start
    for flag, value in values.items():
        flags = flags.set(flag, None if value == DEFAULT else value)
    return flags


def space_values(flags: Flags, space: dict[str, tuple[str, ...]] = SPACE) -> dict[str, str]:
    """`flags` as a point of the space (a flag not given is DEFAULT); raises if a value is outside it."""
    point = {}
    for flag, choices in space.items():
        value = flags.get(flag)
        shown = DEFAULT if value is None else str(value)
        if shown not in choices:
            raise ValueError(f"{flag} {shown} is not in the search space {choices}")
        point[flag] = shown
    return point


def random_draws(count: int, seed: int, space: dict[str, tuple[str, ...]] = SPACE) -> list[dict[str, str]]:
    """`count` distinct points drawn uniformly from the space (a fixed stream for a seed)."""
    rng, seen, draws = random.Random(seed), set(), []
    size = 1
    for choices in space.values():
        size *= len(choices)
    while len(draws) < min(count, size):
        point = {flag: rng.choice(choices) for flag, choices in space.items()}
        key = tuple(point.values())
        if key not in seen:
            seen.add(key)
            draws.append(point)
    return draws


def random_search(start: Flags, start_measured: Measured, draws: list[Measured], launches: int,
                  method: str = "random") -> Search:
    """Random search of `launches` launches: the start, then the first launches - 1 of the shared draws."""
    picked = [start_measured, *draws[:max(0, launches - 1)]]
    return Search(method, picked, sum(m.seconds for m in picked))


def optuna_search(start: Flags, start_measured: Measured, measure: Measure, launches: int, seed: int,
                  space: dict[str, tuple[str, ...]] = SPACE) -> Search:
    """Optuna TPE over the space: the start told as its first trial, then launches - 1 asked and measured. A failed
    launch is told as failed (TPE learns to avoid the region)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    distributions = {flag: optuna.distributions.CategoricalDistribution(choices) for flag, choices in space.items()}
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=seed))
    failed = optuna.trial.TrialState.FAIL
    study.add_trial(optuna.trial.create_trial(
        params=space_values(start, space), distributions=distributions, value=start_measured.value,
        state=optuna.trial.TrialState.COMPLETE if start_measured.value is not None else failed))
    search = Search("optuna", [start_measured], start_measured.seconds)
    for _ in range(launches - 1):
        trial = study.ask(distributions)
        measured = measure(with_values(start, trial.params))
        search.launches.append(measured)
        search.seconds += measured.seconds
        if measured.value is None:
            study.tell(trial, state=failed)
        else:
            study.tell(trial, measured.value)
    return search


def paired_ratios(values: dict[str, list[float | None]]) -> dict[str, dict]:
    """Per configuration: its ratio to the best configuration (the highest median) in each round where both ran."""
    medians = {flags: statistics.median([v for v in vs if v is not None]) for flags, vs in values.items()
               if any(v is not None for v in vs)}
    best = max(medians, key=medians.get)
    out = {}
    for flags, vs in values.items():
        ratios = [v / b for v, b in zip(vs, values[best]) if v is not None and b]
        out[flags] = {"values": vs, "median_value": medians.get(flags), "ratios": [round(r, 3) for r in ratios],
                      "median_ratio": round(statistics.median(ratios), 3) if ratios else None,
                      "spread": [round(min(ratios), 3), round(max(ratios), 3)] if ratios else None,
                      "is_best": flags == best}
    return out


def interleaved(configs: list[str], measure: Measure, rounds: int, say) -> dict[str, list[float | None]]:
    """Every configuration once per round, a fresh launch each, the order flipped every round."""
    values: dict[str, list[float | None]] = {c: [] for c in configs}
    for r in range(rounds):
        for flags in configs if r % 2 == 0 else configs[::-1]:
            measured = measure(Flags.parse(flags))
            values[flags].append(measured.value)
            say(f"  re-measure round {r + 1}: {flags or '(defaults)'} -> {show(measured.value)}")
    return values


def show(value: float | None) -> str:
    return "failed" if value is None else f"{value:.1f}"


class Launches:
    """Cold launches of the target's server, each in its own folder, R repeats each."""

    def __init__(self, target: Target, workload: BenchOptions, repeats: int, root: Path,
                 objective: str = "throughput"):
        self.target, self.workload, self.repeats, self.root = target, workload, repeats, root
        self.objective = objective
        self.count = 0

    def __call__(self, flags: Flags) -> Measured:
        experiment = Experiment(self.target.launcher(), BenchWorkload(self.workload, self.objective), NoDoctor(),
                                self.repeats, self.root)
        trial = experiment(flags, self.count)
        self.count += 1
        value = statistics.median(trial.values) if trial.ok else None
        return Measured(flags.text(), value, trial.values, trial.error, trial.seconds)


def run_tuner(target: Target, start: Flags, workload: BenchOptions, folder: Path, repeats: int,
              max_steps: int, objective: str = "throughput") -> Search:
    options = TuneOptions(workload, objective, start, launch=target.launch, engine=target.engine,
                          repeats=repeats, max_steps=max_steps, health_timeout=target.health_timeout,
                          out_dir=folder, knobs=tuple(target.space))
    result = run_tune(options, Console(quiet=True)).result
    launches = [Measured(step.flags.text(), statistics.median(step.trial.values) if step.trial.ok else None,
                         step.trial.values, step.trial.error, step.trial.seconds) for step in result.steps]
    chosen = result.best.flags.text() if result.best else None
    return Search("tune", launches, result.seconds, chosen, result.reason)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small workload, budgets and one start: checks the script")
    parser.add_argument("--repeats", type=int, default=2, help="repeats per launch (each started clean)")
    parser.add_argument("--max-steps", type=int, default=4, help="tune's step budget (launches: at most 1 + this)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved re-measurements of the bests")
    parser.add_argument("--seed", type=int, default=0, help="random search's and Optuna's seed")
    parser.add_argument("--starts", nargs="*", help="only these starts (names of STARTS or VLLM_STARTS)")
    parser.add_argument("--engine", choices=("toolkit", "vllm"), default="toolkit",
                        help="the server tuned: toolkit serve, or vLLM-CPU from the peers recipe")
    parser.add_argument("--peers-root", type=Path, default=Path(os.environ.get("PEERS_ROOT", "/tmp")),
                        help="with --engine vllm: where ../shared/peers/cpu_peers.sh installed vLLM and the model")
    parser.add_argument("--against", type=Path, help="a saved result: run tune again from its starts and re-measure "
                        "its bests with the saved searches' (after a change to tune; the searches do not depend on it)")
    parser.add_argument("--objective", choices=("throughput", "max-rate"), default="throughput",
                        help="what every method maximizes: output tok/s at full rate, or the highest request rate "
                             "meeting a TTFT/TPOT SLO (MaxRate)")
    parser.add_argument("--max-rate-runs", type=int, default=MaxRate().runs, help="with --objective max-rate: runs "
                        "of one search (each a launch's repeat)")
    parser.add_argument("--max-rate-duration", type=float, default=MaxRate().duration,
                        help="with --objective max-rate: seconds of Poisson arrivals per run")
    parser.add_argument("--save", action="store_true")
    return parser


def compare_start(target: Target, name: str, start: Flags, workload: BenchOptions, opts: argparse.Namespace,
                  root: Path, draws: list[Measured], draw_more: Callable[[int], None], console: Console) -> dict:
    """One start: tune, random and Optuna at tune's launches, random 4x; the bests re-measured interleaved."""
    tuned = run_tuner(target, start, workload, root / "tune", opts.repeats, opts.max_steps, opts.objective)
    launches = len(tuned.launches)
    console.print(f"[bold]{name}[/]: tune {launches} launches, best {tuned.best} ({tuned.seconds:.0f} s; "
                  f"{tuned.reason})")
    start_measured = tuned.launches[0]
    draw_more(4 * launches - 1)
    searches = [tuned, random_search(start, start_measured, draws, launches),
                optuna_search(start, start_measured,
                              Launches(target, workload, opts.repeats, root / "optuna", opts.objective), launches,
                              opts.seed, target.space),
                random_search(start, start_measured, draws, 4 * launches, "random 4x")]
    for search in searches[1:]:
        console.print(f"  {search.method}: {len(search.launches)} launches, best {search.best}")
    return judged(target, name, start, searches, workload, opts, root, console)


def compare_against(target: Target, saved: dict, workload: BenchOptions, opts: argparse.Namespace, root: Path,
                    console: Console) -> dict:
    """One start of a saved comparison after a change to tune: tune runs again; the other searches (their launches
    do not depend on tune) are the saved ones; every best is re-measured together again."""
    start = Flags.parse(saved["start"])
    tuned = run_tuner(target, start, workload, root / "tune", opts.repeats, opts.max_steps, opts.objective)
    console.print(f"[bold]{saved['name']}[/]: tune {len(tuned.launches)} launches, best {tuned.best} "
                  f"({tuned.seconds:.0f} s; {tuned.reason}); the other searches as saved")
    searches = [tuned, *(Search.from_record(r) for r in saved["searches"] if r["method"] != "tune")]
    return judged(target, saved["name"], start, searches, workload, opts, root, console)


def judged(target: Target, name: str, start: Flags, searches: list[Search], workload: BenchOptions,
           opts: argparse.Namespace, root: Path, console: Console) -> dict:
    """The control and every search's best, re-measured together (interleaved rounds), as ratios to the best."""
    chosen = {"control": start.text()} | {s.method: s.best for s in searches}
    configs = list(dict.fromkeys(c for c in chosen.values() if c is not None))
    check = Launches(target, workload, opts.repeats, root / "check", opts.objective)
    values = interleaved(configs, check, opts.rounds, console.print)
    ratios = paired_ratios(values)
    return {"name": name, "start": start.text(), "tune_launches": len(searches[0].launches),
            "searches": [s.record() for s in searches], "chosen": chosen, "check": ratios,
            "result": {method: {"flags": flags, "launches": launches_of(method, searches),
                                "seconds": seconds_of(method, searches),
                                "ratio": ratios[flags]["median_ratio"] if flags in ratios else None,
                                "spread": ratios[flags]["spread"] if flags in ratios else None}
                       for method, flags in chosen.items()}}


def launches_of(method: str, searches: list[Search]) -> int:
    return 0 if method == "control" else next(len(s.launches) for s in searches if s.method == method)


def seconds_of(method: str, searches: list[Search]) -> float:
    return 0.0 if method == "control" else round(next(s.seconds for s in searches if s.method == method), 1)


def table(console: Console, results: list[dict]) -> None:
    from rich.table import Table

    methods = ("control", "tune", "random", "optuna", "random 4x")
    out = Table(title="tune vs search: each method's best re-measured, median ratio to the best found by anyone "
                      "[spread] (launches, wall s)")
    out.add_column("start")
    for method in methods:
        out.add_column(method)
    for r in results:
        cells = []
        for method in methods:
            res = r["result"][method]
            ratio = "-" if res["ratio"] is None else f"{res['ratio']:.2f} {res['spread']}"
            cells.append(ratio if method == "control" else f"{ratio} ({res['launches']}, {res['seconds']:.0f})")
        out.add_row(r["name"], *cells)
    console.print(out)


def main(argv: list[str] | None = None) -> int:
    opts = build_parser().parse_args(argv)
    console = Console(highlight=False)
    if opts.engine == "vllm":
        peers = Peers(opts.peers_root)
        if peers.missing():
            console.print(f"missing: {', '.join(peers.missing())}; run ../shared/peers/cpu_peers.sh install-hf, "
                          "convert and install-vllm with PEERS_ROOT set (or pass --peers-root)")
            return 2
        target, shape = vllm_target(peers), VLLM_WORKLOAD
    else:
        target, shape = TOOLKIT, WORKLOAD
    if opts.quick:
        shape = QUICK_WORKLOAD
        opts.max_steps, opts.rounds = min(opts.max_steps, 2), min(opts.rounds, 2)
    workload = target.workload(shape)
    max_rate = (MaxRate(duration=opts.max_rate_duration, runs=opts.max_rate_runs) if opts.objective == "max-rate"
                else None)
    if max_rate is not None:
        workload = max_rate.options(workload)
    starts = dict(list(target.starts.items())[:1]) if opts.quick else target.starts
    if opts.starts:
        starts = {name: target.starts[name] for name in opts.starts}
    root = OUT / time.strftime("%Y%m%d-%H%M%S")
    console.print(f"server logs go to {root}")
    draws: list[Measured] = []
    draw_launch = Launches(target, workload, opts.repeats, root / "random", opts.objective)

    def draw_more(count: int) -> None:
        """Measures the shared random stream up to `count` draws (the start is not a draw)."""
        for point in random_draws(count, opts.seed, target.space)[len(draws):]:
            measured = draw_launch(with_values(Flags(), point))
            draws.append(measured)
            console.print(f"  random draw {len(draws)}: {measured.flags or '(defaults)'} -> {show(measured.value)}")

    results = []
    if opts.against:
        saved = json.loads(opts.against.read_text())
        draws.extend(Measured.from_record(d) for d in saved["random_draws"])
        for i, start_record in enumerate(saved["starts"]):
            if start_record["name"] in starts:
                results.append(compare_against(target, start_record, workload, opts, root / f"start-{i}", console))
    for i, (name, start) in enumerate(() if opts.against else starts.items()):
        results.append(compare_start(target, name, Flags.parse(start), workload, opts, root / f"start-{i}", draws,
                                     draw_more, console))
    table(console, results)
    if opts.save and not opts.quick:
        record = {"engine": opts.engine, "launch": target.launch,
                  "against": str(opts.against) if opts.against else None,
                  "workload": shape.record() | (max_rate.record() if max_rate else {}), "space": target.space,
                  "repeats": opts.repeats, "max_steps": opts.max_steps, "rounds": opts.rounds, "seed": opts.seed,
                  "random_draws": [d.record() for d in draws], "starts": results,
                  "provenance": provenance(MODULE, sys.argv[1:] if argv is None else argv)}
        name = ("tune_vs_search" if opts.engine == "toolkit" else "tune_vs_search_vllm") + (
            "_maxrate" if max_rate else "") + ("_after" if opts.against else "")
        console.print(f"saved {write_result(name, record)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
