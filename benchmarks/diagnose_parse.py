"""Diagnose speed and memory, side by side with SGLang's own log parser, on one generated log.

    python -m benchmarks.diagnose_parse [--lines N] [--runs R] [--sglang-parser FILE --sglang-path DIR]
                                        [--json OUT]

Writes an N-line (default 1,000,000) mixed log (decode, prefill and HTTP access lines of several eras) to a
temporary file, then measures, each in a fresh process, lines/s (wall clock), CPU seconds and peak RSS, the
fastest of R runs (the machine is shared: the fastest run is the least disturbed; CPU seconds, which a busy
machine disturbs less, are recorded too: `lines_per_cpu_s`, all processes of the command together):
  command   the whole command as a user runs it: `toolkit diagnose LOG > /dev/null` (start-up included);
  export    `toolkit diagnose LOG --export events.csv` (every event streamed out as CSV);
  analyze   `toolkit.diagnose.analyze([LOG])` in a process that has imported it (no start-up);
  scan      the fast path alone: every chunk scanned, one thread;
  sglang    SGLang's `log_parser.parse(text)` (python/sglang/srt/debug_utils/log_parser.py, polars), from a
            copy of the file given with --sglang-parser and polars importable from --sglang-path;
  sglang-ray  that parser's own pattern (`_PATTERN_DECODE`) through polars `str.extract_groups`, rows with a
            throughput kept, on a copy of the log with Ray's `(SGLangEngine pid=N) ` before every line: the
            form the pattern is written for (on plain SGLang lines it needs whitespace before the `[` stamp and
            matches nothing; parse() itself then stops at its Int64 cast of `token usage`, so this mode times
            its extraction without that cast).
It prints one line per mode and the ratio of ours to SGLang's (lines/s, same file, same run); --json writes the
results with the command, commit, CPU model and date.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time

from benchmarks.common import cpu_model, provenance

_ERAS = (
    ("[{ts} TP0] Decode batch. #running-req: {r}, #token: {tok}, token usage: {u:.2f}, gen throughput (token/s): "
     "{g:.2f}, #queue-req: {q}"),
    ("[{ts} TP0] Decode batch. #running-req: {r}, #token: {tok}, token usage: {u:.2f}, cuda graph: True, "
     "gen throughput (token/s): {g:.2f}, #queue-req: {q}"),
    ("[{ts} DP1 TP1] Decode batch, #running-req: {r}, #token: {tok}, token usage: {u:.2f}, cuda graph: True, "
     "gen throughput (token/s): {g:.2f}, #queue-req: {q}, "),
)
_PREFILL = (
    ("[{ts} TP0] Prefill batch. #new-seq: 2, #new-token: {n}, #cached-token: {c}, cache hit rate: 12.50%, "
     "token usage: {u:.2f}, #running-req: {r}, #queue-req: {q}"),
    ("[{ts} DP1 TP1] Prefill batch, #new-seq: 2, #new-token: {n}, #cached-token: {c}, token usage: {u:.2f}, "
     "#running-req: {r}, #queue-req: {q}, "),
)
_ACCESS = '[{ts}] INFO:     127.0.0.1:{port} - "POST /v1/chat/completions HTTP/1.1" 200 OK'


RAY_PREFIX = "(SGLangEngine pid=4242) "


def write_log(path: str, n: int, seed: int = 0, prefix: str = "") -> None:
    rng = random.Random(seed)
    t0 = 1762833987
    with open(path, "w") as f:
        for i in range(n):
            ts = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t0 + i // 50))
            x = rng.random()
            r, q, u = rng.randint(1, 300), rng.randint(0, 500), rng.random()
            if x < 0.5:
                line = rng.choice(_ERAS).format(ts=ts, r=r, tok=int(u * 6e5), u=u, g=rng.random() * 5e3, q=q)
            elif x < 0.75:
                line = rng.choice(_PREFILL).format(ts=ts, n=rng.randint(1, 8192), c=rng.randint(0, 8192), u=u,
                                                   r=r, q=q)
            else:
                line = _ACCESS.format(ts=ts, port=rng.randint(1024, 65535))
            f.write(prefix + line + "\n")


def _lines(path: str) -> int:
    with open(path, "rb") as f:
        return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))


def _analyze(path: str) -> dict:
    from toolkit.diagnose import analyze

    start, cpu = time.perf_counter(), time.process_time() + _children_cpu()
    d = analyze([path])
    return {"seconds": time.perf_counter() - start, "cpu": time.process_time() + _children_cpu() - cpu,
            "events": sum(d.stats.kinds.values()), "verdict": d.verdict}


def _children_cpu() -> float:
    """CPU seconds of the worker processes that have ended (the fast path's process pool)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _scan(path: str) -> dict:
    from toolkit.diagnose.fastpath.scan import scan_chunk
    from toolkit.diagnose.source import LineReader, open_log

    start, cpu, events = time.perf_counter(), time.process_time(), 0
    with open_log(path) as stream:
        for chunk in LineReader(stream).chunks():
            scanned = scan_chunk(chunk.data, chunk.size)
            events += len(scanned.batch.index) + scanned.access
    return {"seconds": time.perf_counter() - start, "cpu": time.process_time() - cpu, "events": events}


def _sglang(path: str, parser_file: str) -> dict:
    spec = importlib.util.spec_from_file_location("sglang_log_parser", parser_file)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    import polars  # noqa: F401 - imported before the clock starts (parse() imports it on first call)

    start, cpu = time.perf_counter(), time.process_time()
    with open(path) as f:
        df = module.parse(f.read())
    return {"seconds": time.perf_counter() - start, "cpu": time.process_time() - cpu, "events": df.height}


def _sglang_ray(path: str, parser_file: str) -> dict:
    spec = importlib.util.spec_from_file_location("sglang_log_parser", parser_file)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    import polars as pl

    ray = path + ".ray"
    with open(path) as src, open(ray, "w") as dst:
        dst.writelines(RAY_PREFIX + line for line in src)
    start, cpu = time.perf_counter(), time.process_time()
    with open(ray) as f:
        frame = pl.DataFrame({"line": f.read().splitlines()})
    rows = frame.select(pl.col("line").str.extract_groups(module._PATTERN_DECODE).alias("info")).unnest("info")
    rows = rows.filter(pl.col("throughput").is_not_null())
    result = {"seconds": time.perf_counter() - start, "cpu": time.process_time() - cpu, "events": rows.height}
    os.unlink(ray)
    return result


def _command(argv: list[str]) -> dict:
    """Run a command (stdout to /dev/null); its wall time, CPU time and peak RSS (the only child waited for)."""
    start = time.perf_counter()
    proc = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    seconds = time.perf_counter() - start
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode not in (0, 1):
        raise RuntimeError(proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}")
    return {"seconds": seconds, "cpu": usage.ru_utime + usage.ru_stime, "child_rss_mb": usage.ru_maxrss / 1024}


def _child(mode: str, path: str, extra: str | None) -> None:
    if mode == "command":
        result = _command([sys.executable, "-m", "toolkit.cli", "diagnose", path])
    elif mode == "export":
        with tempfile.TemporaryDirectory() as tmp:
            result = _command([sys.executable, "-m", "toolkit.cli", "diagnose", path, "--export",
                               os.path.join(tmp, "events.csv")])
    else:
        result = {"analyze": lambda: _analyze(path), "scan": lambda: _scan(path),
                  "sglang": lambda: _sglang(path, extra or ""),
                  "sglang-ray": lambda: _sglang_ray(path, extra or "")}[mode]()
    rss = result.pop("child_rss_mb", None)
    result["peak_rss_mb"] = rss if rss is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(result))


def _run(mode: str, path: str, sglang_parser: str | None, sglang_path: str | None) -> dict:
    env = dict(os.environ)
    if mode.startswith("sglang") and sglang_path:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), os.getcwd(), sglang_path) if p)
    argv = [sys.executable, "-m", "benchmarks.diagnose_parse", "--child", mode, path]
    if mode.startswith("sglang"):
        argv += ["--extra", sglang_parser or ""]
    proc = subprocess.run(argv, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or ["failed"])[-1]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


MODES = {
    "command": "ours: `toolkit diagnose LOG` (whole command)",
    "export": "ours: `toolkit diagnose LOG --export x.csv`",
    "analyze": "ours: analyze() in process",
    "scan": "ours: fast path scan, one thread",
    "sglang": "sglang log_parser.parse (polars)",
    "sglang-ray": "sglang's pattern, Ray-prefixed copy (polars)",
}


def _best(mode: str, path: str, args, runs: int) -> dict:
    results = [_run(mode, path, args.sglang_parser, args.sglang_path) for _ in range(runs)]
    good = [r for r in results if "error" not in r]
    return min(good, key=lambda r: r["seconds"]) if good else results[0]


def _report(results: dict[str, dict], lines: int) -> dict[str, float]:
    for mode, r in results.items():
        name = MODES[mode]
        if "error" in r:
            print(f"{name:48s} could not run: {r['error']}")
            continue
        r["lines_per_s"] = lines / r["seconds"]
        r["lines_per_cpu_s"] = lines / r["cpu"] if r["cpu"] else None
        print(f"{name:48s} {r['lines_per_s']:>11,.0f} lines/s  {r['seconds']:6.2f} s  cpu {r['cpu']:6.2f} s"
              f"  peak RSS {r['peak_rss_mb']:6.1f} MiB  events {r.get('events', '-')}")
    ratios = {}
    for baseline in ("sglang", "sglang-ray"):
        theirs = results.get(baseline, {})
        for mode in ("command", "analyze", "export"):
            ours = results.get(mode, {})
            if ours and theirs and "error" not in ours and "error" not in theirs:
                ratios[f"{mode}/{baseline}"] = theirs["seconds"] / ours["seconds"]
                print(f"ratio ours ({mode}) / {baseline}, lines/s on {lines:,} lines in the same run: "
                      f"{ratios[f'{mode}/{baseline}']:.2f}x")
    return ratios


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=1_000_000)
    ap.add_argument("--runs", type=int, default=3, help="runs per measurement; the fastest is reported")
    ap.add_argument("--modes", default=",".join(MODES), help="comma-separated subset of " + ", ".join(MODES))
    ap.add_argument("--sglang-parser", default=None, help="a copy of SGLang's log_parser.py (never committed)")
    ap.add_argument("--sglang-path", default=None, help="a directory from which polars imports (pip --target)")
    ap.add_argument("--json", default=None, help="write the results here (benchmarks/results/diagnose_*.json)")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    ap.add_argument("--extra", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        _child(*args.child, args.extra)
        return
    modes = [m for m in args.modes.split(",") if m in MODES]
    with tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, "mixed.log")
        write_log(log, args.lines)
        size = os.path.getsize(log)
        load_before = os.getloadavg()
        print(f"log: {args.lines:,} lines, {size / 1e6:.0f} MB; python {sys.version.split()[0]}, {os.cpu_count()} "
              f"cores ({cpu_model()}); best of {args.runs} runs; load average before: "
              + " ".join(f"{x:.2f}" for x in load_before))
        results = {mode: _best(mode, log, args, args.runs) for mode in modes}
        load_after = os.getloadavg()
        print("load average after: " + " ".join(f"{x:.2f}" for x in load_after))
    ratios = _report(results, args.lines)
    if args.json:
        record = {
            **provenance("benchmarks.diagnose_parse", sys.argv[1:], "cpu"), "python": sys.version.split()[0],
            "log": {"lines": args.lines, "bytes": size, "mix": "50% decode, 25% prefill, 25% access; 5 forms"},
            "runs": args.runs, "load_average": {"before": load_before, "after": load_after},
            "results": results, "ratio_vs_sglang": ratios,
        }
        with open(args.json, "w") as f:
            json.dump(record, f, indent=2)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
