"""Parser tolerance: prefixes, rank tags, ANSI, CRLF, separators, unknown keys, multi-line records, inputs."""
from __future__ import annotations

import gzip

import pytest

from toolkit.diagnose.read.lines import ParseStats, parse_lines, parse_path
from toolkit.diagnose.read.prefix import clock_text
from toolkit.diagnose.read.source import LineReader, decode_lines

DECODE = ("Decode batch. #running-req: 233, #token: 370959, token usage: 0.82, cuda graph: True, "
          "gen throughput (token/s): 4594.01, #queue-req: 317")
T = 1762833987.0


def one(line: str):
    events = list(parse_lines([line]))
    assert len(events) == 1, events
    return events[0]


@pytest.mark.parametrize("prefix,rank", [
    ("[2025-11-11 04:06:27] ", ""),
    ("[2025-11-11 04:06:27 TP3] ", "TP3"),
    ("[2025-11-11 04:06:27 DP1 TP1] ", "DP1 TP1"),
    ("[2025-11-11 04:06:27 DP6 TP6 EP6] ", "DP6 TP6 EP6"),
    ("[2025-11-11 04:06:27 DP0 PP1 ATTN_CP0 MOE_DP0 TP2 EP2] ", "DP0 PP1 ATTN_CP0 MOE_DP0 TP2 EP2"),
    ("sglang-1  | [2025-11-11 04:06:27 TP0] ", "TP0"),
    ("(SGLangEngine pid=35555, ip=10.15.36.1) [2025-11-11 04:06:27 TP0] ", "TP0"),
    ("2025-11-11T04:06:27.123456789Z stdout F [2025-11-11 04:06:27 TP0] ", "TP0"),
    ("Nov 11 04:06:27 host python[123]: [2025-11-11 04:06:27 TP1] ", "TP1"),
    ("2025-11-11 04:06:27,000 - sglang - INFO - ", ""),
])
def test_any_prefix_before_the_tag(prefix: str, rank: str) -> None:
    e = one(prefix + DECODE)
    assert (e.kind, e.time, e.rank) == ("decode", T, rank)
    assert e.fields["running_req"] == 233 and e.fields["queue_req"] == 317


def test_milliseconds_and_iteration_number() -> None:
    e = one("[2025-11-11 04:06:27.250 TP0] Decode batch [51341], #running-req: 3, #token: 9, token usage: 0.00, "
            "cuda graph: True, gen throughput (token/s): 1.00, #queue-req: 0")
    assert e.time == T + 0.25 and e.fields["iter"] == 51341


def test_ansi_colours_and_crlf(tmp_path) -> None:
    path = tmp_path / "colour.log"
    path.write_bytes(b"\x1b[32m[2025-11-11 04:06:27 TP0]\x1b[0m " + DECODE.encode() + b",\r\n")
    (e,) = list(parse_path(path))
    assert e.rank == "TP0" and e.fields["queue_req"] == 317


def test_unknown_keys_any_order_and_trailing_separators() -> None:
    e = one("[2025-11-11 04:06:27] Decode batch, #queue-req: 7, est. decode TFLOPS/s (per GPU): 12.5, "
            "#running-req: 9, #full token: 100, full token usage: 0.30, #swa token: 50, swa token usage: 0.60, "
            "npu graph: False, mystery key: ??, gen throughput (token/s): 5.00, ")
    f = e.fields
    assert (f["queue_req"], f["running_req"], f["token"], f["token_usage"], f["cuda_graph"]) == (7, 9, 100, 0.6, False)
    assert f["gen_throughput"] == 5.0 and f["mystery_key"] == "??"


def test_hh_mm_ss_clock_wraps_at_midnight() -> None:
    lines = [f"[23:59:59 TP0] {DECODE}", f"[00:00:01 TP0] {DECODE}"]
    times = [e.time for e in parse_lines(lines)]
    assert times == [86399.0, 86401.0]


@pytest.mark.parametrize("line, shown", [
    (f"[23:59:59 TP0] {DECODE}", "23:59:59"),
    (f"(APIServer pid=7) INFO 11-21 23:10:29 [loggers.py:335] {DECODE}", "11-21 23:10:29"),
    (f"[2025-11-11 04:06:27 TP0] {DECODE}", "2025-11-11 04:06:27"),
])
def test_times_are_written_back_as_the_log_printed_them(line: str, shown: str) -> None:
    assert clock_text(one(line).time) == shown


def test_a_wrapped_time_only_clock_names_the_day() -> None:
    assert clock_text(86401.0) == "day 1 00:00:01" and clock_text(None) == "?"


def test_multi_line_oom_inside_a_traceback_is_one_record() -> None:
    lines = [
        "[2025-11-11 04:06:27 TP0] Scheduler hit an exception: Traceback (most recent call last):",
        '  File "scheduler.py", line 10, in run',
        "RuntimeError: Decode out of memory. Try to lower your batch size.",
        "Try to allocate 64 tokens.",
        "Avaliable tokens: 15",
        "self.token_to_kv_pool_allocator.available_size()=10",
        "self.tree_cache.evictable_size()=5",
        "[2025-11-11 04:06:28 TP0] " + DECODE,
    ]
    stats = ParseStats()
    events = list(parse_lines(lines, stats=stats))
    assert [e.kind for e in events] == ["exception", "oom", "decode"]
    assert events[1].fields == {"phase": "decode", "requested": 64, "available_tokens": 15,
                                "available_size": 10, "evictable_size": 5}
    assert events[0].line == 1 and events[2].line == 8 and stats.other == 0


def test_sglang_jax_oom_form_and_old_print() -> None:
    (e,) = [e for e in parse_lines(["Decode out of memory. Try to allocate 8 tokens. Available tokens: 30 "
                                    "(available_size=10 + evictable_size=20)"]) if e.kind == "oom"]
    assert (e.fields["available_size"], e.fields["evictable_size"]) == (10, 20)
    (e,) = list(parse_lines(["Prefill out of memory. This should nerver happen."]))
    assert e.fields["phase"] == "prefill"


@pytest.mark.parametrize("lines,fields", [
    (["/x/scheduler.py:1: UserWarning: Warning: available_size=5, max_total_num_token=100",
      "KV cache pool leak detected!", "  warnings.warn("], {"available_size": 5, "max_total_num_tokens": 100}),
    (["[2025-11-11 04:06:27 TP0] KV cache pool leak detected!available_size=5, max_total_num_tokens=100"],
     {"available_size": 5, "max_total_num_tokens": 100}),
])
def test_leak_forms(lines: list[str], fields: dict) -> None:
    leaks = [e for e in parse_lines(lines) if e.kind == "leak"]
    assert len(leaks) == 1 and leaks[0].fields == fields


@pytest.mark.parametrize("line", [
    "[2025-11-11 04:06:27 TP0] Capture cuda graph begin. This can take up to several minutes. avail mem=20.10 GB",
    "[2025-11-11 04:06:27 TP0] Capture draft cuda graph begin. This can take up to several minutes.",
    "[2025-11-11 04:06:27 TP0] Capture decode prefill CUDA graph begin. backend=fa3, num_tokens=8, avail mem=20.10 GB",
])
def test_graph_capture_forms(line: str) -> None:
    assert one(line).kind == "graph_begin"


def test_0523_graph_end_form() -> None:
    e = one("[2025-11-11 04:06:27 TP0] Capture target prefill CUDA graph end. elapsed=1.25 s, mem usage=0.50 GB, "
            "avail mem=12.00 GB.")
    assert (e.kind, e.fields["elapsed"], e.fields["mem_usage"], e.fields["avail_mem"]) == ("graph_end", 1.25, 0.5, 12.0)


def test_server_args_with_nested_values_and_sanitized_dict_form() -> None:
    e = one("[2025-11-11 04:06:27] server_args=ServerArgs(model_path='a, b(c)', tp_size=2, "
            "json_model_override_args='{\"x\": 1}', cuda_graph_bs=[1, 2, 4], lora_paths=None, api_key=<redacted>, "
            "mem_fraction_static=0.871, disable_cuda_graph=False)")
    f = e.fields
    assert f["model_path"] == "a, b(c)" and f["tp_size"] == 2 and f["mem_fraction_static"] == 0.871
    assert f["cuda_graph_bs"] == "[1, 2, 4]" and f["disable_cuda_graph"] is False and f["lora_paths"] is None
    d = one("server_args={'model_path': 'm', 'tp_size': 4}").fields
    assert d == {"model_path": "m", "tp_size": 4}


def test_truncated_server_args_still_yields_what_it_has() -> None:
    f = one("server_args=ServerArgs(model_path='m', tp_size=2, mem_fraction_st").fields
    assert f["model_path"] == "m" and f["tp_size"] == 2


def test_unreadable_lines_are_counted_not_fatal() -> None:
    stats = ParseStats()
    events = list(parse_lines(["[2025-11-11 04:06:27] Decode batch. garbled \x00\x01",
                               "\ufffd\ufffd binary", "just a log line", DECODE], stats=stats))
    assert [e.kind for e in events] == ["decode"]
    assert stats.unread == 2 and stats.other == 1 and stats.lines == 4
    assert stats.unread_examples[0][0] == 1


def test_gzip_and_plain_files_give_the_same_events(tmp_path) -> None:
    text = "\n".join(f"[2025-11-11 04:06:{i:02d} TP0] {DECODE}" for i in range(50)) + "\n"
    plain, gz = tmp_path / "a.log", tmp_path / "a.log.gz"
    plain.write_text(text)
    gz.write_bytes(gzip.compress(text.encode()))
    assert list(parse_path(plain)) == list(parse_path(gz))
    assert len(list(parse_path(gz))) == 50


def test_huge_line_is_cut_and_memory_stays_bounded(tmp_path) -> None:
    path = tmp_path / "huge.log"
    path.write_bytes(b"x" * 5000 + b"\n" + (DECODE + "\n").encode())
    import io

    reader = LineReader(io.BytesIO(path.read_bytes()), max_line=1000, chunk=256)
    chunks = list(reader.chunks())
    lines = [line for chunk in chunks for line in decode_lines(chunk.data[: chunk.size])]
    assert max(len(x) for x in lines) <= 1000 and sum(chunk.cut for chunk in chunks) == 1
    assert any(line.startswith("Decode batch") for line in lines)
    assert all(chunk.data[chunk.size:] == bytes(len(chunk.data) - chunk.size) for chunk in chunks)


def test_line_numbers_count_across_chunks(tmp_path, monkeypatch) -> None:
    path = tmp_path / "many.log"
    lines = ["noise"] * 999 + [DECODE] + ["noise"] * 10
    path.write_text("\n".join(lines))
    monkeypatch.setattr("toolkit.diagnose.read.source.CHUNK", 997)
    (e,) = list(parse_path(path))
    assert e.line == 1000
