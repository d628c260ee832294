"""Engine lines through the prefixes real deployments add (docs/log-formats.md §1): journald, docker compose,
container runtimes and cloud logging, Ray workers, a collector's stamp before the engine's, and other programs'
lines in between. Both readers read them the same (the fast path hands every prefixed line to the per-line
parser). Also the "regressions" of issue 30: hand-shortened decode lines, the KV-pool leak wordings, and a
healthy ramp-up that must get no warning.

Real excerpts are kept exactly and cite their source; the other lines are built from real line shapes."""
from __future__ import annotations

import pytest

from toolkit.diagnose import analyze
from toolkit.diagnose.read.lines import ParseStats, parse_lines
from toolkit.diagnose.read.prefix import clock_text
from toolkit.diagnose.read.source import decode_line, decode_lines
from tests.diagnose import logfactory as lf
from tests.diagnose.logfactory import Log
from tests.diagnose.test_fastpath import _same
from tests.diagnose.test_log_format_differential import _assert_same_events, _hot_lines

STAMP = "[2025-11-26 21:03:11 TP0] "
VLLM = "INFO 11-26 21:03:11 [loggers.py:123] "
DECODE = ("Decode batch, #running-req: 12, #token: 9000, token usage: 0.30, cuda graph: True, "
          "gen throughput (token/s): 812.55, #queue-req: 0")
STATS = ("Engine 000: Avg prompt throughput: 12.0 tokens/s, Avg generation throughput: 300.5 tokens/s, "
         "Running: 8 reqs, Waiting: 0 reqs, GPU KV cache usage: 3.1%, Prefix cache hit rate: 0.0%")
SG_TIME, VL_TIME = "2025-11-26 21:03:11", "11-26 21:03:11"

# (id, line, kind, time as the log printed it, rank)
PREFIXED = [
    # 1. journald (`journalctl -u sglang`): its own stamp, then the engine's; or its stamp only
    ("journald then sglang stamp", "Nov 26 21:03:11 host python[1234]: " + STAMP + DECODE, "decode", SG_TIME, "TP0"),
    ("journald stamp only", "Nov 26 21:03:11 host python[1234]: " + DECODE, "decode", VL_TIME, ""),
    ("journald short-precise, one-digit day", "Nov  6 21:03:11.123456 gpu-1 sglang[7]: " + DECODE, "decode",
     "11-06 21:03:11", ""),
    ("journald short-iso", "2025-11-26T21:03:11+0000 host python[1234]: " + DECODE, "decode", SG_TIME, ""),
    ("journald then vllm", "Nov 26 21:03:15 host vllm[99]: " + VLLM + STATS, "stats", VL_TIME, "DP0"),
    # 2. docker compose
    ("compose sglang", "sglang-1  | " + STAMP + DECODE, "decode", SG_TIME, "TP0"),
    ("compose vllm", "vllm-server  | " + VLLM + STATS, "stats", VL_TIME, "DP0"),
    # 3. container runtime (CRI) / cloud logging / `kubectl logs --timestamps`
    ("cri then sglang stamp", "2025-11-26T21:03:11.123456789Z stdout F " + STAMP + DECODE, "decode", SG_TIME, "TP0"),
    ("rfc3339 then sglang stamp", "2025-11-26T21:03:11.123Z " + STAMP + DECODE, "decode", SG_TIME, "TP0"),
    ("cri stamp only", "2025-11-26T21:03:11.123456789Z stdout F " + DECODE, "decode", SG_TIME, ""),
    ("rfc3339 stamp only", "2025-11-26T21:03:11.123Z " + DECODE, "decode", SG_TIME, ""),
    ("cri then vllm", "2025-11-26T21:03:11.123456789Z stderr F " + VLLM + STATS, "stats", VL_TIME, "DP0"),
    # 4. Ray workers and vLLM V1's processes
    ("ray sglang engine", "(SGLangEngine pid=123) " + STAMP + DECODE, "decode", SG_TIME, "TP0"),
    ("ray vllm worker with ip", "(RayWorkerWrapper pid=1234, ip=10.0.0.1) " + VLLM + STATS, "stats", VL_TIME, "DP0"),
    ("vllm v1 engine core", "(EngineCore_DP1 pid=123) " + VLLM + STATS.replace("Engine 000", "Engine 001"), "stats",
     VL_TIME, "DP1"),
    ("vllm v1 api server", "(APIServer pid=1) " + VLLM + STATS, "stats", VL_TIME, "DP0"),
    # https://github.com/vllm-project/vllm/issues/43295
    ("real: vllm v1 api server", "(APIServer pid=3646) INFO 05-19 10:13:11 [loggers.py:271] Engine 000: Avg prompt "
     "throughput: 0.0 tokens/s, Avg generation throughput: 1055.3 tokens/s, Running: 18 reqs, Waiting: 43 reqs, GPU "
     "KV cache usage: 95.9%, Prefix cache hit rate: 0.0%", "stats", "05-19 10:13:11", "DP0"),
    # https://github.com/tenstorrent/tt-inference-server/issues/3359
    ("real: rfc3339 then vllm v1", "2026-05-12T08:01:39.331095044Z (APIServer pid=1) INFO 05-12 08:01:39 "
     "[loggers.py:271] Engine 000: Avg prompt throughput: 6335.3 tokens/s, Avg generation throughput: 4.8 tokens/s, "
     "Running: 9 reqs, Waiting: 0 reqs, GPU KV cache usage: 62.8%, Prefix cache hit rate: 0.0%", "stats",
     "05-12 08:01:39", "DP0"),
    # https://github.com/sgl-project/sglang/issues/3424: the paste began after the stamp's `[`
    ("sglang stamp without its [", SG_TIME + " TP0] " + DECODE, "decode", SG_TIME, "TP0"),
    ("time-only stamp without its [", "21:03:11 TP2] " + DECODE, "decode", "21:03:11", "TP2"),
    # https://github.com/sgl-project/sglang/pull/7481: the paste began inside the year: the date is lost, no time
    ("sglang stamp from inside its year", "025-11-26 21:03:11 TP0] " + DECODE, "decode", "?", "TP0"),
    ("sglang stamp from its date's dash", "-11-26 21:03:11.250] " + DECODE, "decode", "?", ""),
    # https://github.com/vllm-project/vllm/issues/11517: Python logging with a datefmt (no milliseconds)
    ("python logging without ms", "2024-12-23 18:28:10 - vllm.engine.metrics - INFO - " + STATS, "stats",
     "2024-12-23 18:28:10", "DP0"),
    # https://github.com/sgl-project/sglang-omni/pull/712: `%(asctime)s [%(levelname)s] %(name)s: `
    ("python logging, level in brackets", "2026-06-07 10:59:31,659 [INFO] sglang.srt.managers.scheduler_metrics_mixin: "
     + DECODE, "decode", "2026-06-07 10:59:31", ""),
    ("python logging, level in brackets, no ms", "2026-06-07 10:59:31 [INFO] sglang.srt.managers.scheduler: " + DECODE,
     "decode", "2026-06-07 10:59:31", ""),
    # https://github.com/vllm-project/vllm/issues/1734: the paste began after vLLM's level
    ("vllm prefix without its level", "11-26 21:03:11 llm_engine.py:624] " + STATS, "stats", VL_TIME, "DP0"),
    # https://github.com/antgroup/sglang/pull/4: an SGLang fork's logger
    ("sglang fork's logger", "2025-11-26 21:03:11 INFO 8900 [ DP15 TP15 EP15 scheduler_metrics_mixin.py:222] "
     + DECODE, "decode", SG_TIME, "DP15 TP15 EP15"),
    # https://github.com/ai-dynamo/dynamo/issues/1074: Rust `tracing`'s layout (Dynamo), Slurm's task label before it
    ("tracing layout", "2025-05-13T13:47:39.069Z  INFO metrics.log: " + STATS, "stats", "2025-05-13 13:47:39", "DP0"),
    ("slurm label then tracing", "0: 2025-05-13T13:47:39.069Z  INFO metrics.log: " + STATS, "stats",
     "2025-05-13 13:47:39", "DP0"),
    # 5. two stamps: the engine's (closest to the message) wins
    ("collector stamp then sglang's", "[2025-11-26T21:09:00Z] " + STAMP + DECODE, "decode", SG_TIME, "TP0"),
    ("python stamp then sglang's", "2025-11-26 21:09:00.000 " + STAMP + DECODE, "decode", SG_TIME, "TP0"),
    # https://github.com/vllm-project/vllm/issues/18916 (a collector's local time, vLLM's UTC)
    ("real: collector stamp then vllm's", "2025-05-30 09:55:29.284 | INFO 05-30 07:55:29 [loggers.py:116] Engine "
     "000: Avg prompt throughput: 1.1 tokens/s, Avg generation throughput: 315.1 tokens/s, Running: 2 reqs, Waiting: "
     "0 reqs, GPU KV cache usage: 2.9%, Prefix cache hit rate: 0.0%", "stats", "05-30 07:55:29", "DP0"),
]


@pytest.mark.parametrize("name,line,kind,when,rank", PREFIXED, ids=[p[0] for p in PREFIXED])
def test_engine_line_is_read_through_the_prefix(name: str, line: str, kind: str, when: str, rank: str) -> None:
    stats = ParseStats()
    events = list(parse_lines([line], stats=stats))
    assert [e.kind for e in events] == [kind]
    assert clock_text(events[0].time) == when and events[0].rank == rank
    assert isinstance(events[0].fields["running_req"], int)
    assert stats.unread == 0 and stats.other == 0


# https://github.com/vllm-project/vllm/issues/27073: docker's RFC3339 stamp, then the API server's process prefix
@pytest.mark.parametrize("outer,when", [("2025-10-15T00:02:43.157050784Z ", "2025-10-15 00:02:43"),
                                        ("2025-10-15T00:02:43.157Z stdout F ", "2025-10-15 00:02:43"),
                                        ("Oct 15 00:02:43 host vllm[9]: ", "10-15 00:02:43")])
def test_an_access_line_is_read_through_a_collector_stamp_and_a_vllm_process_prefix(outer: str, when: str) -> None:
    """An access line prints no vLLM clock, so the process prefix after the collector's stamp is all there is
    before the message: read past it, the stamp keeps the time."""
    line = outer + '(APIServer pid=1) INFO:     10.250.5.33:50840 - "GET /metrics HTTP/1.1" 200 OK'
    (event,) = parse_lines([line])
    assert event.kind == "access" and event.text.startswith("INFO:") and clock_text(event.time) == when
    assert event.rank == ""  # as on the API server's own access lines: its process names no rank


# https://github.com/vllm-project/vllm/issues/39064: stern's `pod container ` before the API server's access line
@pytest.mark.parametrize("line,kind", [
    ('vllm-test-fix-39064 vllm (APIServer pid=1) INFO:     127.0.0.1:59892 - "GET /metrics HTTP/1.1" 200 OK', "access"),
    ('vllm-0 vllm (APIServer pid=1) INFO:     127.0.0.1:59892 - "GET /metrics HTTP/1.1" 200 OK', "access"),
    # not stern's: a capital letter, or three words, before the process prefix
    ('Vllm-0 vllm (APIServer pid=1) INFO:     127.0.0.1:59892 - "GET /metrics HTTP/1.1" 200 OK', None),
    ('my vllm pod (APIServer pid=1) INFO:     127.0.0.1:59892 - "GET /metrics HTTP/1.1" 200 OK', None),
    # https://github.com/kyuz0/amd-strix-halo-vllm-toolboxes/issues/73: docker compose's prefix before it
    ('vllm-1  | (APIServer pid=1) INFO:     172.20.0.1:49200 - "POST /v1/chat/completions HTTP/1.1" 200 OK', "access"),
])
def test_an_access_line_is_read_through_sterns_pod_and_container(line: str, kind: str | None) -> None:
    events = parse_lines([line])
    assert [e.kind for e in events] == ([kind] if kind else [])


@pytest.mark.parametrize("text,cleaned", [
    ("[2m2025-05-13T13:47:39Z[0m [32m INFO[0m x", "2025-05-13T13:47:39Z  INFO x"),
    ("[2025-05-13 13:47:39] [1;31mred[0m", "[2025-05-13 13:47:39] red"),
    # without the reset code the brackets are text (an index, a list), kept
    ("[2025-05-13 13:47:39] item [2m of [32m", "[2025-05-13 13:47:39] item [2m of [32m"),
    ("a [0m\nb [2m", "a \nb [2m"),  # line by line: a chunk decodes as its lines one by one
])
def test_colour_codes_a_paste_lost_the_esc_of_are_removed_where_the_line_resets(text: str, cleaned: str) -> None:
    assert decode_line(text.encode()) == cleaned
    assert decode_lines(text.encode()) == [decode_line(line.encode()) for line in text.split("\n")]


def test_a_stats_line_with_pasted_colour_codes_is_read(tmp_path) -> None:
    # https://github.com/ai-dynamo/dynamo/issues/1074 (a file's lines are decoded, colour codes removed, then read)
    log = tmp_path / "dynamo.log"
    log.write_text("0: [2m2025-05-13T13:47:39.069Z[0m [32m INFO[0m [2mmetrics.log[0m[2m:[0m Avg prompt throughput: "
                   "0.0 tokens/s, Avg generation throughput: 30273.6 tokens/s, Running: 8 reqs, Swapped: 0 reqs, "
                   "Pending: 0 reqs, GPU KV cache usage: 1.4%, CPU KV cache usage: 0.0%.   \n")
    d = analyze([log])
    assert d.stats.kinds["stats"] == 1 and d.stats.unread == 0
    load = d.timeline.load()
    assert load["running_req"].tolist() == [8] and load["token_usage"].tolist() == pytest.approx([0.014])


def test_lines_with_pasted_colour_codes_read_the_same_in_both_paths(tmp_path, monkeypatch) -> None:
    """The fast path leaves a line holding `[0m` to the per-line reader, which removes the codes first."""
    access = '[2025-11-26 21:03:11] INFO:     127.0.0.1:5 - "GET /health HTTP/1.1" 200 OK'
    lines = [STAMP + DECODE, "[2m" + STAMP + "[0m" + DECODE, STAMP + DECODE.replace("Decode", "[32mDecode[0m"),
             STAMP + DECODE + " [0m", access + "[0m"] * 40  # NOTE: an access line's layout ends at ` - "`
    data = "\n".join(lines).encode()
    _assert_same_events(tmp_path, monkeypatch, data, 4096)
    assert _hot_lines(data) == 40  # the clean lines only
    events = list(parse_lines(decode_lines(data)))
    assert [e.kind for e in events] == ["decode", "decode", "decode", "decode", "access"] * 40


def test_lines_passed_as_text_are_cleaned_as_a_files_lines(tmp_path) -> None:
    """`analyze(lines=...)` removes CR, ANSI colour codes and pasted ones as reading a file does (the library's
    callers pass text a terminal or an issue coloured)."""
    lines = ["\x1b[32m" + STAMP + "\x1b[0m" + DECODE, "[2m" + STAMP + "[0m" + DECODE, STAMP + DECODE + "\r",
             "\x1b[2m2025-05-13T13:47:39.069Z\x1b[0m \x1b[32m INFO\x1b[0m metrics.log: " + STATS] * 5
    log = tmp_path / "coloured.log"
    log.write_bytes("\n".join(lines).encode())
    as_text, as_file = analyze(lines=lines), analyze([log])
    assert as_text.stats.kinds == as_file.stats.kinds and as_text.stats.kinds["decode"] == 15
    assert as_text.stats.kinds["stats"] == 5 and as_text.stats.unread == 0


def test_a_journald_traceback_stays_one_record() -> None:
    lines = ["Nov 26 21:03:11 host python[1234]: Traceback (most recent call last):",
             'Nov 26 21:03:11 host python[1234]:   File "scheduler.py", line 10, in event_loop',
             "Nov 26 21:03:11 host python[1234]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
             "Nov 26 21:03:12 host python[1234]: " + DECODE]
    assert [e.kind for e in parse_lines(lines)] == ["exception", "oom", "decode"]


# 6. other programs between the engine's lines
OTHERS = [
    "[2025-11-26 21:03:11,123] LMCache INFO: Stored 256 out of total 256 tokens (lmcache/v1/cache_engine.py:191)",
    '{"level":"info","ts":1764191000.123,"caller":"router/main.go:88","msg":"Decode batch, #running-req: 3"}',
    '{"timestamp":"2025-11-26T21:03:11.123Z","level":"INFO","fields":{"message":"worker ready"},"target":"router"}',
    "Nov 26 21:03:11 host systemd[1]: Started sglang.service - SGLang server.",
    # https://github.com/sgl-project/sglang/pull/3699
    "2025-02-26 15:44:36,973 - INFO - flashinfer.jit: Loading JIT ops: cascade",
    # https://github.com/vllm-project/vllm/issues/6090
    "2024-07-03 11:58:42,096 INFO worker.py:1724 -- Started a local Ray instance.",
    "[2025-11-26 21:03:11] Potential memory leak detected! Growth: 12.00MB over 5 checks",
]


def test_other_programs_lines_are_other_and_leave_the_engine_lines_whole() -> None:
    lines = []
    for i, other in enumerate(OTHERS):
        lines += [f"[2025-11-26 21:03:{10 + i:02d} TP0] " + DECODE, other]
    lines.append("[2025-11-26 21:04:00 TP0] " + DECODE)
    stats = ParseStats()
    events = list(parse_lines(lines, stats=stats))
    assert [e.kind for e in events] == ["decode"] * (len(OTHERS) + 1)
    assert [e.line for e in events] == list(range(1, 2 * len(OTHERS) + 2, 2))
    assert stats.other == len(OTHERS) and stats.unread == 0


def _mixed_log() -> bytes:
    lines = [line for _, line, *_ in PREFIXED] + OTHERS
    lines += [STAMP + DECODE, "sglang-1  | " + STAMP + DECODE, STAMP + SHORTENED[0][1]]
    return ("\n".join(lines * 3) + "\n").encode()


def test_prefixed_and_other_lines_read_the_same_in_both_paths(tmp_path, monkeypatch) -> None:
    for chunk in (512, 8 << 20):
        _assert_same_events(tmp_path, monkeypatch, _mixed_log(), chunk)


# regressions: decode lines shortened by hand are read where the fields left suffice
SHORTENED = [
    ("no #queue-req", "Decode batch, #running-req: 12, #token: 9000, token usage: 0.30, cuda graph: True, "
     "gen throughput (token/s): 812.55", {"running_req": 12, "token_usage": 0.30, "gen_throughput": 812.55}),
    ("no throughput nor queue", "Decode batch, #running-req: 12, #token: 9000, token usage: 0.30",
     {"running_req": 12, "token": 9000, "token_usage": 0.30}),
    ("`...` in the middle", "Decode batch, #running-req: 12, ..., gen throughput (token/s): 812.55, #queue-req: 4",
     {"running_req": 12, "gen_throughput": 812.55, "queue_req": 4}),
    ("trailing `...`", "Decode batch. #running-req: 12, #token: 9000, ...", {"running_req": 12, "token": 9000}),
]


@pytest.mark.parametrize("name,message,fields", SHORTENED, ids=[s[0] for s in SHORTENED])
def test_a_shortened_decode_line_is_read(tmp_path, monkeypatch, name: str, message: str, fields: dict) -> None:
    stats = ParseStats()
    events = list(parse_lines([STAMP + message], stats=stats))
    assert [e.kind for e in events] == ["decode"] and stats.unread == 0
    for key, value in fields.items():
        assert events[0].fields.get(key) == pytest.approx(value), key
    _assert_same_events(tmp_path, monkeypatch, (STAMP + message + "\n").encode() * 3, 8 << 20)


LEAKS = [
    # toolkit serve (runtime/scheduler/stats_log.py)
    ("toolkit serve", ["token_to_kv_pool_allocator memory leak detected! max_total_num_tokens=665690, "
                       "available_size=665000, evictable_size=0, protected_size=0"]),
    ("sglang 0.3 warning", ["KV cache pool leak detected!"]),
    ("sglang 0.4.9+ ValueError", ["ValueError: token_to_kv_pool_allocator memory leak detected! available_size=10, "
                                  "protected_size=0, self.max_total_num_tokens=100"]),
    ("sglang req_to_token_pool", ["req_to_token_pool memory leak detected!available_size=3756, total_size=3757"]),
    ("sglang hybrid pools", ["ValueError: pool memory leak detected! [full] total=130, available=126, evictable=0"]),
    ("sglang traceback", ["Traceback (most recent call last):", '  File "scheduler.py", line 1326, in check_memory',
                          "ValueError: token_to_kv_pool_allocator memory leak detected! full_available_size=6016, "
                          "full_evictable_size=390685"]),
]


@pytest.mark.parametrize("name,message", LEAKS, ids=[leak[0] for leak in LEAKS])
def test_a_kv_pool_leak_is_recognised(name: str, message: list[str]) -> None:
    lines = [STAMP + message[0]] + message[1:] + ["[2025-11-26 21:03:20 TP0] " + DECODE]
    events = list(parse_lines(lines))
    assert "leak" in [e.kind for e in events]
    assert "crash.leak" in {f.id for f in analyze(lines=lines).findings}


def test_another_programs_memory_leak_is_not_the_kv_pool() -> None:
    assert [e.kind for e in parse_lines(["[2025-11-26 21:03:11] Potential memory leak detected! Growth: 12MB"])] == []


def test_a_healthy_ramp_up_gets_no_warning() -> None:
    log = Log().start(lf.Startup(), model_path="meta-llama/Llama-3.1-8B-Instruct", tp_size=1,
                      mem_fraction_static=0.85, schedule_policy="fcfs", cuda_graph_max_bs=256)
    ramp = [4 * i for i in range(30)]  # 0 -> 116 running over the first minute (a line each 2 s), queue empty
    log.decode_series(30, running=ramp, queue=0, usage=[0.002 * r for r in ramp], throughput=[30.0 * r for r in ramp])
    log.decode_series(300, running=120, queue=0, usage=0.24, throughput=3600.0)
    findings = analyze(lines=log.lines).findings
    assert [f.id for f in findings if f.severity != "info"] == []


def test_the_benchmarks_realistic_log_reads_the_same_in_both_paths(tmp_path, monkeypatch) -> None:
    from benchmarks.diagnose_parse import write_log

    path = tmp_path / "realistic.log"
    write_log(str(path), 6000, mix="realistic")
    _assert_same_events(tmp_path, monkeypatch, path.read_bytes(), 64 * 1024)


def test_two_vllm_workers_error_lines_are_two_records() -> None:
    """vllm-project/vllm#14452: rank 7's OOM line, then rank 0's traceback tail and OOM line: a line of another
    worker (`(VllmWorker rank=N pid=M)`, rank TPN) never continues a record, however indented."""
    prefix = "(VllmWorker rank={} pid=1{}) ERROR 03-16 06:12:38 [multiproc_executor.py:375] "
    oom = "RuntimeError: CUDA out of memory occurred when warming up sampler with 1024 dummy requests."
    lines = [prefix.format(7, 7) + oom, prefix.format(0, 0) + "    raise RuntimeError(", prefix.format(0, 0) + oom]
    events = list(parse_lines(lines))
    assert [(e.kind, e.line, e.rank) for e in events] == [("oom", 1, "TP7"), ("oom", 3, "TP0")]
    same = [prefix.format(0, 0) + oom, prefix.format(0, 0) + "    raise RuntimeError("]
    assert [(e.kind, e.text.count("\n")) for e in parse_lines(same)] == [("oom", 1)]  # its own lines join it


# a paste that lost its newlines: vLLM records glued into one physical line (vllm-project/vllm#2595, V0)
V0_RECORD = ("(_AsyncLLMEngine pid=1974) INFO 01-25 11:26:{s:02d} llm_engine.py:706] Avg prompt throughput: 0.0 "
             "tokens/s, Avg generation throughput: {gen} tokens/s, Running: 1 reqs, Swapped: 0 reqs, Pending: 0 reqs, "
             "GPU KV cache usage: 0.1%, CPU KV cache usage: 0.0%")
V1_RECORD = ("(APIServer pid=1) INFO 10-14 17:02:{s:02d} [loggers.py:123] Engine 000: Avg prompt throughput: 0.0 "
             "tokens/s, Avg generation throughput: {gen} tokens/s, Running: 38 reqs, Waiting: 0 reqs, GPU KV cache "
             "usage: 88.5%, Prefix cache hit rate: 42.4%")


@pytest.mark.parametrize("record", [V0_RECORD, V1_RECORD, V1_RECORD.replace("(APIServer pid=1) ", "")],
                         ids=["v0", "v1", "no-process"])
def test_records_glued_into_one_line_are_read_one_by_one(record: str) -> None:
    """Four records on one line, each from its own prefix (the process prefix too): four stats events, each with
    its own time and throughput, all on line 1."""
    line = " ".join(record.format(s=s, gen=70.0 + s) for s in (13, 18, 23, 28))
    events = list(parse_lines([line]))
    assert [(e.kind, e.line) for e in events] == [("stats", 1)] * 4
    assert [e.fields["gen_throughput"] for e in events] == [83.0, 88.0, 93.0, 98.0]
    assert [clock_text(e.time)[-2:] for e in events] == ["13", "18", "23", "28"]


def test_a_glued_record_cut_before_its_counts_is_unread_and_a_wrapped_one_is_read() -> None:
    """The excerpt ends inside the last glued record (`Avg generation thro`): unread. A record whose line wraps
    before `Running:` (the wrap continues on the next line) is a stats line still."""
    whole = V1_RECORD.format(s=13, gen=80.0)
    stats = ParseStats()
    assert [e.kind for e in parse_lines([whole + " " + whole[:120]], stats=stats)] == ["stats"]
    assert stats.unread == 1
    assert [e.kind for e in parse_lines([whole[:120], whole[120:]])] == ["stats"]


@pytest.mark.parametrize("line", [
    V1_RECORD.format(s=13, gen=80.0),  # one record
    "[2025-11-11 04:06:27 TP0] Receive: obj=GenerateReqInput(text='INFO 01-25 11:26:58 a.py:1] x')",  # SGLang's
    "(APIServer pid=1) INFO 10-14 17:02:13 [serving.py:1] prompt: 'WARNING 01-25 11:26:58 [a.py:1] hi'",  # quoted
    # a prompt quoting a log line, the quote open before a prefix after a space
    "(APIServer pid=1) INFO 10-14 17:02:13 [logger.py:1] Received request x: prompt: 'my log says (APIServer pid=1) "
    "INFO 10-14 17:02:14 [loggers.py:123] Engine 000: Avg prompt throughput: 1.0 tokens/s, Running: 38 reqs'",
    # an SGLang line is SGLang's whatever it quotes
    "[2025-01-01 00:00:00] note: " + V1_RECORD.format(s=13, gen=80.0) + " " + V1_RECORD.format(s=18, gen=80.0),
], ids=["one-record", "sglang-line", "quoted-prefix-without-space", "quoted-prefix-after-space", "sglang-stamped"])
def test_a_line_with_one_record_is_not_split(line: str) -> None:
    from toolkit.diagnose.read.prefix import glued_records

    assert glued_records(line) == [line]


def test_a_glued_record_that_opens_a_traceback_reads_the_same_in_both_paths(tmp_path, monkeypatch) -> None:
    """A glued line whose second record opens an engine-core traceback, its lines after it, amid thousands of plain
    lines: the range workers send the traceback's lines to the caller (they are read as the per-line parser reads
    them)."""
    plain = "(APIServer pid=1) INFO 10-14 17:02:13 [async_llm.py:261] Added request chatcmpl-{}."
    fatal = "(EngineCore_DP0 pid=2) ERROR 10-14 17:02:14 [core.py:700] "
    lines = [plain.format(i) for i in range(3000)] + [plain.format("x") + " " + fatal + "EngineCore encountered a "
                                                      "fatal error."]
    lines += [fatal + f'  File "/v/core.py", line {i}, in run' for i in range(5)]  # plain alone: no record open
    lines += [plain.format(i) for i in range(3000, 6000)]
    data = ("\n".join(lines) + "\n").encode()
    _same(tmp_path, monkeypatch, data, chunk=1 << 20, processes=True)
    _same(tmp_path, monkeypatch, data, chunk=64 * 1024, processes=True)


def test_an_indented_paste_that_opens_a_traceback_reads_the_same_in_both_paths(tmp_path, monkeypatch) -> None:
    """A line without a prefix indented by the paste (limo#29, vllm#5079) is read from its first other character:
    ` Traceback (most recent call last):` amid thousands of plain lines opens a record, and the range workers send
    the lines after it (`opens_record` reads it so too); its own indented lines continue it."""
    plain = "[2025-11-26 21:03:11 TP0] Cache flushed successfully! {}"
    lines = [plain.format(i) for i in range(3000)] + [" Traceback (most recent call last):",
                                                      '   File "/x/scheduler.py", line 1, in event_loop',
                                                      "     self.run()", " RuntimeError: boom"]
    lines += [plain.format(i) for i in range(3000, 6000)]
    data = ("\n".join(lines) + "\n").encode()
    _same(tmp_path, monkeypatch, data, chunk=1 << 20, processes=True)
    _same(tmp_path, monkeypatch, data, chunk=64 * 1024, processes=True)
    (event,) = [e for e in parse_lines(lines) if e.kind == "exception"]
    assert event.text.startswith("Traceback") and event.text.endswith("RuntimeError: boom")


@pytest.mark.parametrize("line,kind", [
    (" Sequence group 221 is preempted by PreemptionMode.RECOMPUTE mode because there is not enough KV cache space.",
     "preempt"),
    ("   ValueError: No available memory for the cache blocks.", "not_enough_memory"),
    ('  File "/x/engine.py", line 1, in step', None),  # a traceback's line outside its record is no event
    ("EngineCore_0 pid=1597554) ValueError: No available memory for the cache blocks.", "not_enough_memory"),
    ("EngineCore_0 pid=1597554 ValueError: No available memory for the cache blocks.", None),  # no process prefix
    # without its `(` a process prefix is read only with vLLM's CamelCase name (not prose before `pid=N)`)
    ("killed worker process pid=42) ValueError: No available memory for the cache blocks.", None),
    ("    ValueError: No available memory for the cache blocks.", None),  # 4 blanks: a traceback's source line
    # https://github.com/sgl-project/sglang/issues/10088: a whole line pasted as inline code
    ("`[2025-09-05 20:48:29 TP0] Capture cuda graph end. Time elapsed: 12.11 s. mem usage=0.54 GB. avail mem=16.74 "
     "GB.`", "graph_end"),
    ("the log says `[2025-09-05 20:48:29 TP0] Capture cuda graph end. avail mem=16.74 GB.`", None),  # prose quoting
    ("`[2025-09-05 20:48:29 TP0] Capture cuda graph end. avail mem=16.74 GB.", None),  # no closing backtick: a quote
    # https://github.com/vllm-project/vllm/issues/2140: an error pasted as a markdown quote, also nested or indented
    ("> torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 518.00 MiB. GPU 0 has a total capacty of "
     "21.67 GiB of which 4.06 MiB is free.", "oom"),
    (">> ValueError: No available memory for the cache blocks.", "not_enough_memory"),
    ("  >ValueError: No available memory for the cache blocks.", "not_enough_memory"),
    (">     ValueError: No available memory for the cache blocks.", None),  # 5 blanks in the quote: a source line
    ("> the server said no available memory for the cache blocks", None),  # quoted prose
    # https://github.com/vllm-project/vllm/issues/25350: vLLM's source tag alone, the paste begun after its time
    ("[kv_cache_utils.py:868] Maximum concurrency for 100,000 tokens per request: 2.31x", "max_concurrency"),
    ("[kv_cache_utils.py] Maximum concurrency for 100,000 tokens per request: 2.31x", None),  # no line number
    ("[notes:868] Maximum concurrency for 100,000 tokens per request: 2.31x", None),  # no Python source
    # https://github.com/local-inference-lab/rtx6kpro/issues/103: vLLM's process in brackets, then its source tag
    ("[Worker_TP1] [model_runner.py:411] Model loading took 81.11 GiB memory and 53.455084 seconds",
     "weights_loaded"),
    ("[EngineCore] [gpu_worker.py:628] Available KV cache memory: 7.94 GiB", "kv_memory"),
    ("[Worker_TP1] Available KV cache memory: 7.94 GiB", None),  # a bracketed name alone is no prefix
])
def test_a_paste_indented_begun_after_a_paren_or_in_inline_code_is_read(line: str, kind: str | None) -> None:
    assert [e.kind for e in parse_lines([line])] == ([kind] if kind else [])


def test_a_bracketed_vllm_process_names_the_rank() -> None:
    """`[Worker_TP1] [model_runner.py:411] ` (rtx6kpro#103) is a prefix without time whose process is rank TP1."""
    (event,) = parse_lines(["[Worker_TP1] [model_runner.py:1048] Graph capturing finished in 4 secs, took 0.31 GiB"])
    assert (event.kind, event.rank, event.time) == ("graph_captured", "TP1", None)


def test_a_line_in_inline_code_is_read_without_its_backticks() -> None:
    """Its last field reads as a number, not with the closing backtick (sglang#10088's form, on decode lines)."""
    lines = [f"`[2025-09-05 20:48:{i:02d} TP0] Decode batch. #running-req: 10, #token: 100, token usage: 0.50, "
             f"gen throughput (token/s): 10.00, #queue-req: 3000`" for i in range(40)]
    events = list(parse_lines(lines))
    assert [e.fields["queue_req"] for e in events] == [3000] * 40 and not events[0].text.endswith("`")


def test_a_traceback_source_line_after_a_full_record_is_no_event() -> None:
    """A record holds at most MAX_RECORD_LINES lines; the indented lines after it are a traceback's source lines,
    never events of their own (a paste indents a line by at most MAX_PASTE_INDENT blanks)."""
    from toolkit.diagnose.read.lines import MAX_PASTE_INDENT, MAX_RECORD_LINES

    lines = ["[2025-01-01 00:00:00 TP0] Scheduler hit an exception: Traceback (most recent call last):"]
    lines += [f'  File "x.py", line {i}, in f' for i in range(MAX_RECORD_LINES + 10)]
    lines += ["    server_args=server_args,", "    Traceback (most recent call last):"]
    assert [(e.kind, e.line) for e in parse_lines(lines)] == [("exception", 1)]
    assert MAX_PASTE_INDENT < 4


def test_glued_records_read_the_same_in_both_paths(tmp_path, monkeypatch) -> None:
    """A glued line among plain ones is not plain (the workers send it to the per-line parser), in every chunking."""
    plain = "(APIServer pid=1) INFO 10-14 17:02:{s:02d} [async_llm.py:261] Added request chatcmpl-{s}."
    glued = " ".join([plain.format(s=29), *(V1_RECORD.format(s=s, gen=80.0) for s in (30, 35))])  # plain first
    lines = [plain.format(s=s) for s in range(12)] + [glued, plain.replace("Added", "Aborted").format(s=40)]
    data = ("\n".join(lines * 20) + "\n").encode()
    for chunk in (512, 8 << 20):
        _assert_same_events(tmp_path, monkeypatch, data, chunk)
    _same(tmp_path, monkeypatch, data, chunk=4096, processes=True)  # the range workers' plain lines
    from toolkit.diagnose.read.fastpath.plain import surely_plain
    from toolkit.diagnose.read.lines import is_plain

    assert not is_plain(glued) and not surely_plain(glued.encode()) and surely_plain(lines[0].encode())


@pytest.mark.parametrize("line,start", [
    ("deepseek-v32-exp  | Exception: Capture cuda graph failed: ", 20),
    ("sglang-1  |   File \"/sgl-workspace/sglang/python/sglang/srt/model_executor/model_runner.py\", line 431", 12),
    ("Name  | Value", 8),  # any compose-like text: the message after it is other
])
def test_a_compose_prefix_before_a_line_without_a_stamp_is_read_past(line: str, start: int) -> None:
    """sglang#11218: the tail of a traceback behind `deepseek-v32-exp  | `, no stamps: its error line is read."""
    from toolkit.diagnose.read.prefix import read_prefix

    assert read_prefix(line).start == start and read_prefix(line).time is None


def test_a_compose_prefixed_failed_capture_is_read_and_advised() -> None:
    lines = ['deepseek-v32-exp  |   File "/sgl/python/sglang/srt/model_executor/cuda_graph_runner.py", line 393, '
             'in __init__', "deepseek-v32-exp  |     raise Exception(",
             "deepseek-v32-exp  | Exception: Capture cuda graph failed: ", "deepseek-v32-exp  | Possible solutions:"]
    d = analyze(lines=lines)
    assert d.stats.kinds["graph_failed"] == 1
    assert [f.id for f in d.findings] == ["crash.graph_capture"] and d.findings[0].flag == "--cuda-graph-max-bs"


# https://github.com/sgl-project/sglang/pull/16974: decode lines trimmed by hand to the rank tags and the speculative
# figures
@pytest.mark.parametrize("line,kind,rank", [
    ("[DP0 TP0] Decode batch, accept len: 1.52, accept rate: 0.51, cuda graph: True", "decode", "DP0 TP0"),
    ("[DP1 TP1 EP1] Decode batch, accept len: 2.34, accept rate: 0.78", "decode", "DP1 TP1 EP1"),
    ("[DP0 TP0] Decode batch, cuda graph: True", None, None),  # no count and no accept length: not read
    ("[dp0] Decode batch, accept len: 1.52", None, None),  # not SGLang's tags
])
def test_a_decode_line_trimmed_to_its_rank_and_accept_length_is_read(line: str, kind: str | None,
                                                                     rank: str | None) -> None:
    events = list(parse_lines([line]))
    assert [(e.kind, e.rank) for e in events] == ([(kind, rank)] if kind else [])
    if kind:
        assert events[0].time is None and events[0].fields["accept_len"] > 1


def test_kserve_s_access_log_is_read_through_its_logger_prefix() -> None:
    """kserve#4470: KServe logs uvicorn's access line as `%(asctime)s.%(msecs)03d %(name)s %(levelprefix)s`, and
    prints the server's process id after the client; its own trace logger prints the id before its name (other)."""
    access = ('2025-05-14 17:45:10.901 uvicorn.access INFO:     127.0.0.1:42226 1647689 - "POST /openai/v1/chat/'
              'completions HTTP/1.1" 200 OK')
    trace = "2025-05-14 17:45:10.901 1647689 kserve.trace Received request chatcmpl-017ee87d: prompt: 'x'"
    stats = ParseStats()
    (event,) = parse_lines([access, trace], stats=stats)
    assert (event.kind, clock_text(event.time), stats.other) == ("access", "2025-05-14 17:45:10", 1)
    assert event.fields == {"client": "127.0.0.1:42226", "method": "POST", "path": "/openai/v1/chat/completions",
                            "status": 200}


def test_a_log_viewer_s_stamp_is_the_only_time_of_a_line_without_an_engine_stamp() -> None:
    """vllm#18916 (held-out batch 16): `YYYY-mm-dd HH:MM:SS.mmm | ` before every line; the access line prints no
    engine stamp, so the viewer's is its time; before vLLM's prefix, the engine's stamp keeps the time."""
    access = '2025-05-30 09:55:22.282 | INFO:     172.17.0.1:41148 - "POST /v1/chat/completions HTTP/1.1" 200 OK'
    stats = ("2025-05-30 09:55:29.284 | INFO 05-30 07:55:29 [loggers.py:116] Engine 000: Avg prompt throughput: 1.1 "
             "tokens/s, Avg generation throughput: 315.1 tokens/s, Running: 2 reqs, Waiting: 0 reqs, GPU KV cache "
             "usage: 2.9%, Prefix cache hit rate: 0.0%")
    first, second = parse_lines([access, stats])
    assert (first.kind, clock_text(first.time), first.fields["status"]) == ("access", "2025-05-30 09:55:22", 200)
    assert (second.kind, clock_text(second.time)) == ("stats", "05-30 07:55:29")


def test_loguru_s_level_and_place_after_the_stamp_are_prefix() -> None:
    """loguru's default format (`{time} | {level: <8} | {name}:{function}:{line} - {message}`) begins like a log
    viewer's stamp and bar: the level and the place are prefix too, so a traceback's head after them opens the
    record (as it did before the viewer's form was read)."""
    lines = ["2024-01-01 10:00:00.123 | ERROR    | mod:fn:1 - Traceback (most recent call last):",
             '  File "x.py", line 1, in f', "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"]
    assert [e.kind for e in parse_lines(lines)] == ["exception", "oom"]
