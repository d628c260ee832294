"""Parse-throughput benchmark: `python -m benchmarks.diagnose_parse [--lines N] [--runs R] [--sglang-path DIR]`.

Writes an N-line (default 1,000,000) mixed log (prefill, decode and HTTP access lines of several eras) to a
temporary file, then measures, each run in a fresh subprocess, lines/s (wall clock), CPU seconds (all threads)
and peak RSS, best of R runs, for:
  classify  every event kind with time, rank and line: the block scanner's columns for hot lines, parser rows
            for the rest (what `analyze` reads);
  rows      the same as `parse_path` rows, one `(kind, line, time, rank, text, source)` tuple per event;
  fields    classify, then every field of every event read: the block reader's columns for decode, prefill
            and access lines, `parse_fields` for the other events and for lines the block reader leaves;
  analyze   `diagnose.analyze([log])` end to end (timeline, phases and rules included);
  sglang    SGLang's own `sglang.srt.debug_utils.log_parser.parse` (polars; decode lines of the 0.5.5+ era
            only), when sglang and polars are importable (add `--sglang-path` for a separate install dir).
Memory flatness: classify is also run on a quarter of the file; its peak RSS should not change.
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

import numpy as np

from toolkit.diagnose.scan import KINDS

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


def _classify(path: str, fields: bool) -> dict:
    from toolkit.diagnose.blocks import scanned_blocks
    from toolkit.diagnose.columns import access_fields
    from toolkit.diagnose.fields import parse_fields
    from toolkit.diagnose.parser import ParseStats, Parser
    from toolkit.diagnose.reader import LineReader, open_log

    if fields:
        import pyarrow  # noqa: F401 - the block reader's access strings; imported before the clock starts
    stats = ParseStats()
    parser = Parser(0, stats)
    start, cpu = time.perf_counter(), time.process_time()
    read = 0
    with open_log(path) as stream:
        no = 1
        for scanned in scanned_blocks(LineReader(stream), read_fields=fields):
            block = parser.feed_scanned(scanned.data, scanned.fast, no, hot_rows=False)
            no += block.count
            if fields:
                read += _read_fields(block, scanned.fields, access_fields, parse_fields)
        rows = parser.finish()
        if fields:
            read += sum(len(parse_fields(r[0], r[4])) >= 0 for r in rows)
    return {"lines": stats.lines, "seconds": time.perf_counter() - start, "cpu": time.process_time() - cpu,
            "events": dict(stats.kinds), "read": read}


def _read_fields(block, batch, access_fields, parse_fields) -> int:
    """Every field of every event of a block (`batch`: its decode/prefill fields, read while scanning);
    returns how many events were read."""
    for kind, _, _, _, text, _ in block.rows:
        parse_fields(kind, text)
    fast = block.fast
    if fast is None:
        return len(block.rows)
    batch_rows, _ = batch
    access_rows, _ = access_fields(block.data, fast)
    unread = np.ones(len(fast.index), bool)
    unread[batch_rows] = unread[access_rows] = False
    left = np.flatnonzero(unread)
    text, kinds = block.text or block.data.decode("ascii"), KINDS[fast.kind[left]].tolist()
    for kind, begin, stop in zip(kinds, fast.start[left].tolist(), fast.end[left].tolist()):
        parse_fields(kind, text[begin:stop])
    return len(block.rows) + len(fast.index)


def _rows(path: str) -> dict:
    from toolkit.diagnose.parser import ParseStats, row_batches

    stats = ParseStats()
    start, cpu = time.perf_counter(), time.process_time()
    for _ in row_batches(path, 0, stats):
        pass
    return {"lines": stats.lines, "seconds": time.perf_counter() - start, "cpu": time.process_time() - cpu,
            "events": dict(stats.kinds)}


def _analyze(path: str) -> dict:
    from toolkit.diagnose import analyze

    start, cpu = time.perf_counter(), time.process_time()
    d = analyze([path])
    return {"lines": d.stats.lines, "seconds": time.perf_counter() - start, "cpu": time.process_time() - cpu,
            "events": dict(d.stats.kinds)}


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
    import polars  # noqa: F401 - imported before the clock starts (its parse() imports it on first call)

    start, cpu = time.perf_counter(), time.process_time()
    with open(path) as f:
        df = module.parse(f.read())
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    with open(path) as f:
        lines = sum(1 for _ in f)
    return {"lines": lines, "seconds": seconds, "cpu": cpu, "events": {"decode": df.height}, "how": how}


def _child(mode: str, path: str) -> None:
    result = {"classify": lambda: _classify(path, False), "rows": lambda: _rows(path),
              "fields": lambda: _classify(path, True), "analyze": lambda: _analyze(path),
              "sglang": lambda: _sglang(path)}[mode]()
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(result))


def _run(mode: str, path: str, extra_path: str | None) -> dict:
    env = dict(os.environ)
    if extra_path:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), os.getcwd(), extra_path) if p)
    proc = subprocess.run([sys.executable, "-m", "benchmarks.diagnose_parse", "--child", mode, path],
                          capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or ["failed"])[-1]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _best(mode: str, path: str, extra_path: str | None, runs: int) -> dict:
    """The fastest of `runs` runs (the machine is shared: the best run is the least disturbed one)."""
    results = [_run(mode, path, extra_path) for _ in range(runs)]
    good = [r for r in results if "error" not in r]
    return min(good, key=lambda r: r["seconds"]) if good else results[0]


MODES = {
    "classify": "ours: classify (every event kind, time, rank, line)",
    "quarter": "ours: classify, quarter of the file (memory flatness)",
    "rows": "ours: classify into parser rows (parse_path tuples)",
    "fields": "ours: every field of every event read",
    "analyze": "ours: analyze() end to end (timeline and rules too)",
    "sglang": "sglang.srt.debug_utils.log_parser (polars)",
}


def _report(results: dict[str, dict]) -> None:
    for mode, r in results.items():
        name = MODES[mode]
        if "error" in r:
            print(f"{name:56s} could not run: {r['error']}")
            continue
        how = f"  ({r['how']})" if "how" in r else ""
        print(f"{name:56s} {r['lines'] / r['seconds']:>11,.0f} lines/s  {r['seconds']:6.2f} s  cpu {r['cpu']:6.2f} s"
              f"  peak RSS {r['peak_rss_mb']:6.1f} MiB  events {sum(r['events'].values()):,}{how}")
    theirs = results.get("sglang", {})
    for mode in ("classify", "fields", "analyze"):
        ours = results.get(mode, {})
        if "error" not in ours and ours and theirs and "error" not in theirs:
            ratio = (ours["lines"] / ours["seconds"]) / (theirs["lines"] / theirs["seconds"])
            print(f"ratio ours {mode} / sglang (lines/s, same file, same run): {ratio:.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=1_000_000)
    ap.add_argument("--runs", type=int, default=3, help="runs per measurement; the fastest is reported")
    ap.add_argument("--modes", default=",".join(MODES), help="comma-separated subset of " + ", ".join(MODES))
    ap.add_argument("--sglang-path", default=None, help="a directory holding sglang and polars (pip --target)")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        _child(*args.child)
        return
    modes = [m for m in args.modes.split(",") if m in MODES]
    with tempfile.TemporaryDirectory() as tmp:
        big, quarter = os.path.join(tmp, "mixed.log"), os.path.join(tmp, "quarter.log")
        write_log(big, args.lines)
        write_log(quarter, args.lines // 4)
        print(f"log: {args.lines:,} lines, {os.path.getsize(big) / 2**20:.0f} MiB; python {sys.version.split()[0]}, "
              f"{os.cpu_count()} cores; best of {args.runs} runs; load average before: "
              + " ".join(f"{x:.2f}" for x in os.getloadavg()))
        results = {mode: _best("classify" if mode == "quarter" else mode, quarter if mode == "quarter" else big,
                               args.sglang_path, args.runs) for mode in modes}
        print("load average after: " + " ".join(f"{x:.2f}" for x in os.getloadavg()))
    _report(results)


if __name__ == "__main__":
    main()
