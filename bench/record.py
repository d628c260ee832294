"""One run's record: `toolkit bench` writes it (one JSON line per run in `--output-file`), and diagnose, report and
tune read it through this module only: `BenchRecord` types the keys they read, `read_records` reads the file.

Record schema (one JSON object per run; numbers that could not be measured are null):
- run configuration: `tool`, `version`, `backend`, `base_url`, `model`, `tokenizer`, `dataset_name`,
  `dataset_path`, `random_input_len`, `random_output_len`, `random_range_ratio`, `request_rate` (req/s, or the
  string "inf"; sessions/s in a multi-turn run), `turns` (1: single requests), `arrival`
  (poisson|constant|gamma|trace), `burstiness`, `max_concurrency`, `seed`, `warmup_requests`, `warmup_failures`,
  `request_timeout`, `ignore_eos`, `json_schema` (the `--json-schema` file that constrained every output, or null),
  `sweep` ({"role": "saturation"|"rate", "step": i}, only when a command runs several rates);
  `search` (only with `--find-max-rate`: {"role": "saturation"|"probe", "step": i, "meets_slo": bool, and after
  each answered probe the bracket so far: "max_rate" (highest passing rate or null), "bracket_hi" (lowest failing
  rate or null), "probes"});
- SGLang bench_serving names: `duration` (s, first send to last response), `completed`, `total_input_tokens`,
  `total_output_tokens`, `request_throughput`, `input_throughput`, `output_throughput`, `total_throughput`,
  `concurrency` (mean requests in flight), `cached_tokens` (prompt tokens the server said it took from its prefix
  cache: `usage.prompt_tokens_details.cached_tokens` or `meta_info.cached_tokens`; null when no response said) and
  `cache_hit_rate` (their share of those responses' prompt tokens), and for each of ttft, tpot, itl and
  e2e_latency the keys `mean_X_ms`, `median_X_ms`, `p90_X_ms`, `p99_X_ms`, `std_X_ms`, `max_X_ms`;
- outcome counts: `num_requests` (sent), `failed`, `shed` (refused by the server for load: HTTP 503, or an in-stream
  error with code 503 / queue_full / waiting_timeout; not counted in `failed`), `cancelled` (stopped by Ctrl-C),
  `errors` ({kind: count} of the failed, kinds `http_<status>`, `timeout`, `connection`, `malformed_response`,
  `server_error`, `empty_response`), `interrupted`;
- goodput (with `--slo`): `slo` ({"ttft"|"tpot"|"e2e": ms}), `goodput` (req/s meeting every SLO),
  `slo_attainment` (fraction of sent requests meeting every SLO);
- client verdict (rule in `bench.verdict`), two facts apart: dispatch (did the client send on schedule?)
  `scheduled_rate`, `achieved_rate` (req/s as sent), `dispatch_ratio`, `send_lag_p50_ms`, `send_lag_p99_ms`,
  `send_lag_max_ms`, `concurrency_wait_p99_ms`, `send_lag_limit_ms` (the lag past which the client counts as the
  bottleneck: 10 ms, or a tenth of the mean scheduled gap when longer), `dispatch_kept_up`, and
  `client_bottleneck` (its negation: the client, not the server, shaped the load); timing (are the measured
  latencies free of client-side delay?) `loop_lag_p50_ms`, `loop_lag_p99_ms` (how late the client's event loop
  woke for a due timer, sampled every 10 ms: how late a token arriving then was timestamped; the loop busy or the
  process descheduled), `timing_lag_limit_ms` (2 ms, or a tenth of the median TTFT when longer), `timing_kept_up` (null when the loop was not sampled); then
  `client_verdict` (one sentence, e.g. "Dispatch kept up, timing did not: ..."), `shed_verdict` (a sentence when
  the server shed load, else null);
- who sent the load: `workers` (`--workers N`; 1: the command's own process), `worker_backend` ("process",
  "ray" with `--ray-address`, null for the command's own process), `per_worker` ([{"worker", "requests",
  "sent", "completed", "failed", "scheduled_rate", "achieved_rate", "send_lag_p99_ms", "loop_lag_p99_ms",
  "ready_before_start_ms"}]: worker w sent arrivals w, w + N, ... of the one schedule from a shared start; every
  other key of the record is computed from the union of all workers' per-request samples);
- the window, for cutting server logs: `started_at`, `ended_at` (unix seconds), `started_at_iso`, `ended_at_iso`
  (local time with offset), `server_log` (the `--server-log` path or null);
- server side: `scraped_metrics` ([{"t": unix seconds, "metrics": {sample name: value}}]), `scrape_error`;
- over time (rules in `bench.timeline`): `steady` (null for a burst; else the window `t0`, `t1` in seconds from
  the run start and `started_at`, `ended_at` in unix seconds, `requests` sent and `completed` in it,
  `request_throughput`, `output_throughput`, and the ttft/tpot/itl/e2e_latency keys above over the requests sent
  in it); `slice_seconds`; `slices` ([{"t0", "t1", "sent", "completed", "request_rate", "output_throughput",
  "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms", and with `--scrape-metrics` where the server has the
  gauges "running", "queued"}]);
- `--repeats N` (N > 1): `repeat` ({"index", "count", "seed"}) on every repeat's record, and on the last one
  `repeats` ({"count", "seeds", "confidence": 0.95, "metrics": {key: {"mean", "ci_low", "ci_high", "half_width",
  "std", "n"}}}: Student-t intervals over the repeats, keys in `bench.stats.REPEAT_METRICS`);
- several rates (`--sweep`, a rate list): `stopped_early` ({"rate", "reason", "skipped": [rates]}) on the run that
  showed the server past saturation (rule in `bench.sweep`), and on the last record `pareto` ({"x":
  "per_user_output_throughput", "y": "output_throughput", "points", "front": [{"request_rate",
  "per_user_output_throughput", "output_throughput"}]}: rule in `bench.pareto`);
- multi-turn chat (`--turns T`, T > 1; rule in `bench.conversation`): `sessions` (sessions started), `think_time`
  (s), `skipped_turns` (turns not sent because an earlier turn of their session failed), `by_turn` ([{"turn" (from
  1), "requests", "completed", "mean_ttft_ms", "cached_tokens", "cache_hit_rate"}]), `cache_hit_rate_first_turn`,
  `cache_hit_rate_later_turns` (server-reported, as `cache_hit_rate`; null when unreported);
- `requests` (only with `--output-details`): one row per request with `index`, `scheduled_ms`, `send_lag_ms`,
  `sent_at`, `input_len`, `output_len`, `ttft_ms`, `tpot_ms`, `e2e_ms`, `itl_ms` (list), `error`, `message`, `text`,
  `cached_tokens`, and in a multi-turn run `session` (from 0) and `turn` (from 1).
"""
from __future__ import annotations

import json
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, Union, get_args, get_origin, get_type_hints


@dataclass(frozen=True, slots=True)
class BenchRecord:
    """The keys other tools read, typed (None: absent or null), and every other key in `extra`. Records of other
    tools (SGLang's bench_serving) are read too: every key is optional."""

    tool: str | None = None
    version: str | None = None
    backend: str | None = None
    base_url: str | None = None
    model: str | None = None
    dataset_name: str | None = None
    request_rate: float | str | None = None  # req/s, or "inf"
    max_concurrency: int | None = None
    num_requests: int | None = None
    completed: int | None = None
    failed: int | None = None
    shed: int | None = None
    errors: dict[str, int] | None = None
    interrupted: bool | None = None
    duration: float | None = None
    request_throughput: float | None = None
    input_throughput: float | None = None
    output_throughput: float | None = None
    concurrency: float | None = None
    mean_ttft_ms: float | None = None
    median_ttft_ms: float | None = None
    p90_ttft_ms: float | None = None
    p99_ttft_ms: float | None = None
    mean_itl_ms: float | None = None
    median_itl_ms: float | None = None
    p90_itl_ms: float | None = None
    p99_itl_ms: float | None = None
    slo: dict[str, float] | None = None
    goodput: float | None = None
    slo_attainment: float | None = None
    scheduled_rate: float | None = None
    achieved_rate: float | None = None
    dispatch_ratio: float | None = None
    send_lag_p50_ms: float | None = None
    send_lag_p99_ms: float | None = None
    send_lag_max_ms: float | None = None
    concurrency_wait_p99_ms: float | None = None
    client_bottleneck: bool | None = None
    client_verdict: str | None = None
    shed_verdict: str | None = None
    started_at: float | None = None
    ended_at: float | None = None
    started_at_iso: str | None = None
    ended_at_iso: str | None = None
    server_log: str | None = None
    scraped_metrics: list[dict[str, Any]] | None = None
    scrape_error: str | None = None
    requests: list[dict[str, Any]] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    # NOTE: the object's keys as read, in order, so `to_json` gives back exactly that object (an absent key stays
    # absent, a null stays null); empty for a record built in code: then the typed keys that are set, then `extra`.
    key_order: tuple[str, ...] = ()

    @classmethod
    def from_json(cls, obj: object) -> BenchRecord:
        """Raises ValueError naming the first key whose value has the wrong type."""
        if not isinstance(obj, dict):
            raise ValueError(f"a JSON {_json_type(obj)}, not an object")
        for key, value in obj.items():
            if key in TYPED and not _fits(value, TYPED[key]):
                raise ValueError(f"key {key!r} is a JSON {_json_type(value)}, not {_show(TYPED[key])}")
        typed = {k: v for k, v in obj.items() if k in TYPED}
        extra = {k: v for k, v in obj.items() if k not in TYPED}
        return cls(**typed, extra=extra, key_order=tuple(obj))

    @property
    def request_rate_number(self) -> float | int | None:
        """The asked rate as a number; None where none was asked or it was "inf" (no rate: all at once)."""
        return None if isinstance(self.request_rate, str) else self.request_rate

    def to_json(self) -> dict[str, Any]:
        order = self.key_order or (*(k for k in TYPED if getattr(self, k) is not None), *self.extra)
        return {k: getattr(self, k) if k in TYPED else self.extra[k] for k in order}


# NOTE: the typed keys and their annotations, read once: from_json checks against them, to_json writes them.
TYPED: dict[str, Any] = {k: v for k, v in get_type_hints(BenchRecord).items() if k not in ("extra", "key_order")}


def _fits(value: object, hint: Any) -> bool:
    """Whether a parsed JSON value has the annotated type (a JSON integer is a float too; a bool is neither)."""
    origin, args = get_origin(hint), get_args(hint)
    if origin in (Union, types.UnionType):
        return any(_fits(value, arg) for arg in args)
    if hint is type(None):
        return value is None
    if hint is Any:
        return True
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if origin is dict:
        return isinstance(value, dict) and all(_fits(v, args[1]) for v in value.values())
    if origin is list:
        return isinstance(value, list) and all(_fits(v, args[0]) for v in value)
    return isinstance(value, hint)


def _show(hint: Any) -> str:
    return str(hint).replace("typing.", "")


def _json_type(value: object) -> str:
    names = {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}
    return names.get(type(value), "number")


class RecordError(ValueError):
    """A records file that cannot be read, said in one line that names the file (and the line)."""


class RecordsRead(NamedTuple):
    records: list[BenchRecord]
    skipped: int  # lines that are not a bench record (a lenient read; a strict one raises at the first)


def read_records(path: str | Path, *, strict: bool) -> RecordsRead:
    """Every record of one JSONL file; blank lines are skipped. `strict`: any other line that is not a bench record
    raises RecordError; else such lines are skipped and counted. A missing or unreadable file raises either way."""
    try:
        text = Path(path).read_text(encoding="utf-8", errors="strict" if strict else "replace")
    except FileNotFoundError:
        raise RecordError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise RecordError(f"{path}: cannot read ({exc})") from None
    records, skipped = [], 0
    for no, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            records.append(_record(line))
        except RecordError as exc:
            if strict:
                raise RecordError(f"{path} line {no}: {exc}") from None
            skipped += 1
    return RecordsRead(records, skipped)


def _record(line: str) -> BenchRecord:
    try:
        obj = json.loads(line)
    except ValueError as exc:
        raise RecordError(f"not JSON ({exc})") from None
    try:
        return BenchRecord.from_json(obj)
    except ValueError as exc:
        raise RecordError(f"not a bench record ({exc})") from None
