"""`toolkit tune` against a full grid over the knobs it may move, from mistuned starts, on the embedded model.

For every start the tuner runs with `--knobs` set to the grid's knobs (so both search the same space), and the
grid measures every combination once, cold (a fresh server, prefix cache empty). The grid is shared by the starts:
a start differs from another only in where the tuner begins. Then each start's tuner best and the grid's best are
re-measured interleaved (fresh launch each, order flipped every round) and the paired ratio is reported per round.
Goal (issue 33): tuner best >= 0.95x grid best with <= 1/5 of the grid's runs, for every start.

    python -m benchmarks.tune_vs_grid [--quick] [--rounds 2] [--save]
    python -m benchmarks.tune_vs_grid --recheck [--rounds 8] [--save]

`--recheck` runs no grid and no tuner: it re-measures the latest saved run's grid best and tuner bests in more
interleaved rounds (a paired ratio per round, its median and spread), for ratios the first check left inside the
machine's noise; saved to tune_vs_grid_recheck.json (every recheck kept), naming the run it checks.

`--quick` shrinks the grid and workload to check the script itself (a minute or two); numbers from it mean
nothing. `--save` writes benchmarks/results/tune_vs_grid.json (every run kept, see `write_result`).
"""
from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import time
from pathlib import Path

from rich.console import Console

from benchmarks.common import NoDoctor, RandomWorkload, provenance, write_result
from toolkit.bench.command import BenchOptions
from toolkit.tune.experiment import Experiment
from toolkit.tune.flags import Flags
from toolkit.tune.launch import CommandLauncher
from toolkit.tune.loop import Trial
from toolkit.tune.session import TuneOptions, run_tune
from toolkit.tune.workload import BenchWorkload

MODULE = "benchmarks.tune_vs_grid"
OUT = Path("toolkit-out/tune_vs_grid")  # NOTE: ignored by git; each run's logs kept for inspection
# NOTE: a small fixed pool (12 requests x 144 tokens need more than it holds) makes admission, the cap and the
# prefill chunk all matter on this workload, as they do on a busy GPU server.
BASE_FLAGS = "--max-total-tokens 1536"
GRID = {"--max-running-requests": ("2", "4", "12"), "--chunked-prefill-size": ("96", "512", "4096"),
        "--schedule-conservativeness": ("0.3", "1.0", "2.0")}
STARTS = {"too conservative": "--schedule-conservativeness 2.0", "cap too low": "--max-running-requests 2",
          "chunk too small": "--chunked-prefill-size 96",
          "cap and chunk (the issue's)": "--max-running-requests 2 --chunked-prefill-size 96"}
QUICK_GRID = {"--max-running-requests": ("4", "16"), "--chunked-prefill-size": ("96", "1024")}
QUICK_STARTS = {"cap too low": "--max-running-requests 4"}
WORKLOAD, QUICK_WORKLOAD = RandomWorkload(12, 128, 16), RandomWorkload(8, 64, 8)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a small grid and workload: checks the script only")
    # NOTE: a 27-point grid allows the tuner 5 runs (1/5): one run per configuration, the start and 4 steps
    parser.add_argument("--repeats", type=int, default=1, help="the tuner's runs per configuration")
    parser.add_argument("--max-steps", type=int, default=4, help="the tuner's step budget")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved re-measurements of both bests")
    parser.add_argument("--recheck", action="store_true",
                        help="re-measure the latest saved run's bests only (module docstring)")
    parser.add_argument("--save", action="store_true")
    return parser


def grid_points(grid: dict[str, tuple[str, ...]]) -> list[Flags]:
    base = Flags.parse(BASE_FLAGS)
    points = []
    for values in itertools.product(*grid.values()):
        flags = base
        for flag, value in zip(grid, values):
            flags = flags.set(flag, value)
        points.append(flags)
    return points


def measure_once(flags: Flags, workload: BenchOptions, folder: Path, index: int) -> Trial:
    """One cold run: a fresh server, an empty prefix cache."""
    experiment = Experiment(CommandLauncher(), BenchWorkload(workload, "throughput"), NoDoctor(), 1, folder)
    return experiment(flags, index)


def run_grid(points: list[Flags], workload: BenchOptions, folder: Path, say) -> tuple[list[dict], float]:
    began, rows = time.monotonic(), []
    for i, flags in enumerate(points):
        trial = measure_once(flags, workload, folder, i)
        value = trial.values[0] if trial.ok else None
        rows.append({"flags": flags.text(), "value": value, "error": trial.error, "seconds": round(trial.seconds, 1)})
        say(f"grid {i + 1}/{len(points)}: {flags.text()} -> {value if value is None else round(value, 1)} tok/s")
    return rows, time.monotonic() - began


def run_tuner(start: str, workload: BenchOptions, knobs: tuple[str, ...], folder: Path,
              opts: argparse.Namespace) -> dict:
    began = time.monotonic()
    options = TuneOptions(workload, "throughput", Flags.parse(f"{BASE_FLAGS} {start}"), repeats=opts.repeats,
                          max_steps=opts.max_steps, out_dir=folder, knobs=knobs)
    outcome = run_tune(options, Console(quiet=True))
    steps = [json.loads(line) for line in (folder / "tune.jsonl").read_text().splitlines()]
    best = outcome.result.best
    return {
        "start": start, "best_flags": best.flags.text() if best else None,
        "best_mean": best.sample.mean if best else None, "reason": outcome.result.reason,
        "runs": sum(len(s["values"]) + (1 if s["error"] else 0) for s in steps),
        "launches": len(steps), "seconds": round(time.monotonic() - began, 1),
        "steps": [{k: s.get(k) for k in ("step", "status", "change", "values", "mean", "threshold", "delta")}
                  | {"finding": (s.get("finding") or {}).get("id"),
                     "cache_reset": sorted({r.get("cache_reset") for r in s.get("records", [])} - {None})}
                  for s in steps],
    }


def remeasure(configs: list[Flags], workload: BenchOptions, folder: Path, rounds: int, say) -> dict[str, list]:
    """Every configuration once per round, cold, the order flipped every round; {flags text: values by round}."""
    values: dict[str, list[float | None]] = {c.text(): [] for c in configs}
    for r in range(rounds):
        for i, flags in enumerate(configs if r % 2 == 0 else configs[::-1]):
            trial = measure_once(flags, workload, folder / f"round-{r}", i)
            values[flags.text()].append(trial.values[0] if trial.ok else None)
            say(f"re-measure round {r + 1}: {flags.text()} -> {values[flags.text()][-1]}")
    return values


def paired(tuner: list[float | None], grid: list[float | None]) -> dict:
    ratios = [t / g for t, g in zip(tuner, grid) if t and g]
    return {"tuner": tuner, "grid": grid, "ratios": ratios,
            "median_ratio": statistics.median(ratios) if ratios else None}


def recheck(opts: argparse.Namespace, argv: list[str] | None, console: Console) -> int:
    """The latest saved run's bests, re-measured in `opts.rounds` interleaved rounds (cold runs, order flipped)."""
    from benchmarks.common import RESULTS

    run = json.loads((RESULTS / "tune_vs_grid.runs.jsonl").read_text().splitlines()[-1])
    w = run["workload"]
    workload = RandomWorkload(w["prompts"], w["input_len"], w["output_len"]).options()
    grid_best = run["grid_best"]["flags"]
    configs = list({f.text(): f for f in [Flags.parse(grid_best)]
                    + [Flags.parse(s["tuner"]["best_flags"]) for s in run["starts"]]}.values())
    root = OUT / time.strftime("recheck-%Y%m%d-%H%M%S")
    console.print(f"re-measuring {len(configs)} configurations of the run of {run['provenance']['date']} "
                  f"({opts.rounds} rounds); logs go to {root}")
    values = remeasure(configs, workload, root, opts.rounds, console.print)
    starts = []
    for s in run["starts"]:
        check = paired(values[Flags.parse(s["tuner"]["best_flags"]).text()], values[grid_best])
        ratios = check["ratios"]
        check["spread"] = [min(ratios), max(ratios)] if ratios else None
        starts.append({"name": s["name"], "tuner_best": s["tuner"]["best_flags"], "runs_ratio": s["runs_ratio"],
                       "check": check})
        console.print(f"{s['name']}: per round {', '.join(f'{x:.2f}' for x in ratios)}; median "
                      f"{check['median_ratio']:.3f}, spread {check['spread']}")
    if opts.save:
        record = {"of": run["provenance"]["date"], "grid_best": grid_best,
                  "rounds": opts.rounds, "values": values, "starts": starts,
                  "provenance": provenance(MODULE, sys.argv[1:] if argv is None else argv)}
        console.print(f"saved {write_result('tune_vs_grid_recheck', record)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    opts = build_parser().parse_args(argv)
    console = Console(highlight=False)
    if opts.recheck:
        return recheck(opts, argv, console)
    workload = (QUICK_WORKLOAD if opts.quick else WORKLOAD).options()
    grid, starts = (QUICK_GRID, QUICK_STARTS) if opts.quick else (GRID, STARTS)
    knobs = tuple(grid)
    points = grid_points(grid)
    root = OUT / time.strftime("%Y%m%d-%H%M%S")
    console.print(f"server logs and tune steps go to {root}")
    rows, grid_seconds = run_grid(points, workload, root / "grid", console.print)
    measured = [r for r in rows if r["value"] is not None]
    grid_best = max(measured, key=lambda r: r["value"])
    console.print(f"grid best: {grid_best['flags']} {grid_best['value']:.1f} tok/s "
                  f"({len(points)} runs, {grid_seconds:.0f} s)")
    results = []
    for i, (name, start) in enumerate(starts.items()):
        tuned = run_tuner(start, workload, knobs, root / f"tune-{i}", opts)
        console.print(f"{name}: tuner best {tuned['best_flags']} {tuned['best_mean']:.1f} tok/s in "
                      f"{tuned['runs']} runs ({tuned['seconds']:.0f} s); {tuned['reason']}")
        results.append({"name": name, "tuner": tuned, "runs_ratio": tuned["runs"] / len(points)})
    # NOTE: one interleaved re-measurement of the grid's best and every distinct tuner best, sharing the rounds
    configs = list({f.text(): f for f in [Flags.parse(grid_best["flags"])]
                    + [Flags.parse(r["tuner"]["best_flags"]) for r in results]}.values())
    values = remeasure(configs, workload, root / "check", opts.rounds, console.print)
    for r in results:
        r["check"] = paired(values[Flags.parse(r["tuner"]["best_flags"]).text()], values[grid_best["flags"]])
    table(console, results, grid_best, len(points), grid_seconds)
    if opts.save and not opts.quick:
        record = {"workload": WORKLOAD.record(), "base_flags": BASE_FLAGS, "grid": grid,
                  "grid_rows": rows, "grid_best": grid_best, "grid_runs": len(points),
                  "grid_seconds": round(grid_seconds, 1), "starts": results,
                  "provenance": provenance(MODULE, sys.argv[1:] if argv is None else argv)}
        console.print(f"saved {write_result('tune_vs_grid', record)}")
    return 0


def table(console: Console, results: list[dict], grid_best: dict, grid_runs: int, grid_seconds: float) -> None:
    from rich.table import Table

    out = Table(title=f"tune vs grid (grid: {grid_runs} runs, {grid_seconds:.0f} s; best {grid_best['flags']})")
    for column in ("start", "tuner best", "tuner/grid per round", "median ratio", "runs (share of grid)",
                   "tuner wall s"):
        out.add_column(column)
    for r in results:
        tuned, check = r["tuner"], r["check"]
        out.add_row(r["name"], tuned["best_flags"] or "-", ", ".join(f"{x:.2f}" for x in check["ratios"]) or "-",
                    f"{check['median_ratio']:.2f}" if check["median_ratio"] else "-",
                    f"{tuned['runs']} ({r['runs_ratio']:.2f})", f"{tuned['seconds']:.0f}")
    console.print(out)


if __name__ == "__main__":
    raise SystemExit(main())
