"""Parse-throughput benchmark: `python -m diagnose.bench_parse [--lines N] [--sglang-path DIR]`.

Writes an N-line (default 1,000,000) mixed log (prefill, decode and HTTP access lines of several eras) to a
temporary file, then measures, each in a fresh subprocess, lines/s and peak RSS for:
  1. our parser (every event kind classified with time, rank and line; fields lazy),
  2. our parser with every decode/prefill field materialised,
  3. SGLang's own `sglang.srt.debug_utils.log_parser.parse` (polars; decode lines of the 0.5.5+ era only),
     when sglang and polars are importable (add `--sglang-path` for a separate install dir).
Memory flatness: (1) is also run on a quarter of the file; its peak RSS should not change.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time

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


def write_log(path: str, n: int, seed: int = 0) -> None:
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
            f.write(line + "\n")


def _ours(path: str, fields: bool) -> dict:
    from diagnose.fields import parse_fields
    from diagnose.parser import ParseStats, row_batches

    stats = ParseStats()
    start = time.perf_counter()
    for rows in row_batches(path, 0, stats):
        if fields:
            for row in rows:
                parse_fields(row[0], row[4])
    seconds = time.perf_counter() - start
    return {"lines": stats.lines, "seconds": seconds, "events": dict(stats.kinds)}


def _load_sglang_parser():
    try:
        from sglang.srt.debug_utils import log_parser

        return log_parser, "imported sglang.srt.debug_utils.log_parser"
    except Exception as exc:  # noqa: BLE001 - sglang's package __init__ needs its full dependency set
        import importlib.util

        spec = importlib.util.find_spec("sglang")
        if spec is None or not spec.submodule_search_locations:
            raise RuntimeError(f"sglang is not importable: {exc}") from exc
        file = os.path.join(list(spec.submodule_search_locations)[0], "srt", "debug_utils", "log_parser.py")
        mod_spec = importlib.util.spec_from_file_location("sglang_log_parser", file)
        module = importlib.util.module_from_spec(mod_spec)  # type: ignore[arg-type]
        mod_spec.loader.exec_module(module)  # type: ignore[union-attr]
        return module, f"loaded {file} directly (the sglang package import failed: {type(exc).__name__})"


def _sglang(path: str) -> dict:
    module, how = _load_sglang_parser()
    start = time.perf_counter()
    with open(path) as f:
        df = module.parse(f.read())
    seconds = time.perf_counter() - start
    with open(path) as f:
        lines = sum(1 for _ in f)
    return {"lines": lines, "seconds": seconds, "events": {"decode": df.height}, "how": how}


def _child(mode: str, path: str) -> None:
    result = {"ours": lambda: _ours(path, False), "fields": lambda: _ours(path, True),
              "sglang": lambda: _sglang(path)}[mode]()
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(result))


def _run(mode: str, path: str, extra_path: str | None) -> dict:
    env = dict(os.environ)
    if extra_path:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), os.getcwd(), extra_path) if p)
    proc = subprocess.run([sys.executable, "-m", "diagnose.bench_parse", "--child", mode, path],
                          capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or ["failed"])[-1]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=1_000_000)
    ap.add_argument("--sglang-path", default=None, help="a directory holding sglang and polars (pip --target)")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        _child(*args.child)
        return
    with tempfile.TemporaryDirectory() as tmp:
        big, quarter = os.path.join(tmp, "mixed.log"), os.path.join(tmp, "quarter.log")
        write_log(big, args.lines)
        write_log(quarter, args.lines // 4)
        print(f"log: {args.lines:,} lines, {os.path.getsize(big) / 2**20:.0f} MiB; python {sys.version.split()[0]}, "
              f"{os.cpu_count()} cores")
        results = {
            "ours (classify + time/rank/line, fields lazy)": _run("ours", big, args.sglang_path),
            "ours, quarter of the file (memory flatness)": _run("ours", quarter, args.sglang_path),
            "ours (all decode/prefill fields materialised)": _run("fields", big, args.sglang_path),
            "sglang.srt.debug_utils.log_parser (polars)": _run("sglang", big, args.sglang_path),
        }
    for name, r in results.items():
        if "error" in r:
            print(f"{name:48s} could not run: {r['error']}")
            continue
        print(f"{name:48s} {r['lines'] / r['seconds']:>12,.0f} lines/s  peak RSS {r['peak_rss_mb']:7.1f} MiB  "
              f"events {sum(r['events'].values()):,}" + (f"  ({r['how']})" if "how" in r else ""))
    ours, theirs = results["ours (classify + time/rank/line, fields lazy)"], results[
        "sglang.srt.debug_utils.log_parser (polars)"]
    if "error" not in ours and "error" not in theirs:
        ratio = (ours["lines"] / ours["seconds"]) / (theirs["lines"] / theirs["seconds"])
        print(f"ratio ours/sglang (lines/s, same file, same run): {ratio:.2f}x")


if __name__ == "__main__":
    main()
