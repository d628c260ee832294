"""An honest verdict: "OK" only when the load rules ran on enough data; "NOT ENOUGH DATA" with the reason for an
empty log, a log of another program, random bytes, start-up lines only or an excerpt too short; and inputs that
used to break the command (a 400-digit count, a directory, gzip through stdin) give one clear answer."""
from __future__ import annotations

import gzip
import json
import os
import random

import pytest
from typer.testing import CliRunner

from toolkit.cli import app
from toolkit.diagnose import analyze
from tests.diagnose import logfactory as lf
from tests.diagnose.logfactory import Log, Rank, Startup, VllmLog

runner = CliRunner()


def _json(path, *extra: str, input: str | bytes | None = None) -> dict:
    result = runner.invoke(app, ["diagnose", str(path), "--format", "json", *extra], input=input)
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output
    return json.loads(result.stdout)


def test_an_empty_log_is_not_enough_data(tmp_path) -> None:
    path = tmp_path / "empty.log"
    path.write_text("")
    doc = _json(path)
    assert doc["verdict"]["status"] == "insufficient" and doc["verdict"]["enough_data"] is False
    assert doc["verdict"]["text"] == "NOT ENOUGH DATA: the log is empty"


def test_random_bytes_are_not_enough_data(tmp_path) -> None:
    path = tmp_path / "random.bin"
    path.write_bytes(random.Random(0).randbytes(5 << 20))
    doc = _json(path)
    assert doc["verdict"]["status"] == "insufficient"
    assert doc["verdict"]["text"].startswith("NOT ENOUGH DATA: no SGLang or vLLM log line was recognised in ")
    assert doc["lines"]["unread"] > 0


def test_a_log_of_another_program_is_not_enough_data() -> None:
    d = analyze(lines=[f"2025-11-11 04:06:{i:02d} nginx: GET /index.html 200" for i in range(50)])
    assert d.status == "insufficient" and "no SGLang or vLLM log line was recognised in 50 lines" in d.verdict


def test_start_up_lines_only_are_not_enough_data() -> None:
    d = analyze(lines=Log().start(Startup(available=6.5), model_path="m", tp_size=1).lines)
    assert d.status == "insufficient" and d.findings == []
    assert d.verdict.startswith("NOT ENOUGH DATA: no decode or stats lines to judge the load by (read: ")
    assert ("queue", "0 steady decode lines of 0 (needs 10)") in d.unjudged


def test_start_up_findings_still_show_that_the_load_was_not_judged() -> None:
    d = analyze(lines=Log().start(Startup(available=12.0), model_path="m", tp_size=1, mem_fraction_static=0.85).lines)
    assert d.status == "warning" and d.findings[0].id == "gpu_memory.too_much"
    assert d.verdict.endswith("; load not judged: no decode or stats lines to judge the load by "
                              "(read: 1 server_args, 1 load_begin, 1 load_end, 1 kv_alloc)")


def test_a_short_excerpt_is_not_enough_data() -> None:
    d = analyze(lines=Log().decode_series(6, running=50, queue=0, usage=0.5).lines)
    assert d.status == "insufficient"
    assert d.verdict == ("NOT ENOUGH DATA: 6 decode lines over 10 s, 6 of them steady: the load rules need at least "
                         "10 steady ones")


def test_ok_only_when_the_load_rules_ran() -> None:
    d = analyze(lines=Log().decode_series(30, running=50, queue=[0, 0, 0, 0, 3], usage=0.5).lines)
    assert d.status == "ok" and d.enough_data and d.findings == []
    assert d.verdict == "OK: no problems found in 30 lines (30 decode lines, 30 steady)"
    assert ("usage", "6 steady decode lines with a queue below the running cap (needs 10)") in d.unjudged


def _storm(ranks: int, seconds: int, every: float = 1.0) -> list[str]:
    """An excerpt of `seconds` seconds, no decode lines: every TP rank retracts (older wording) each `every` s."""
    log = Log("0.4.3")
    for i in range(int(seconds / every)):
        for tp in range(ranks):
            log.add(lf.retract("0.4.3", k=2, old=0.3, new=0.8), dt=every if tp == 0 else 0.0,
                    rank=Rank(tp=tp, tp_size=ranks))
    return log.lines


def test_a_twelve_second_retraction_storm_without_decode_lines_is_critical() -> None:
    d = analyze(lines=_storm(ranks=8, seconds=12))
    f = d.findings[0]
    assert d.status == "critical" and f.id == "retraction.frequent" and f.title == "Retraction storm"
    assert d.verdict.startswith("CRITICAL: Retraction storm (1 critical)")
    assert "96 retractions on 8 ranks, up to 12.0 per busy minute" in f.message
    assert "12 distinct seconds with one in all ranks: 12.0 per minute for the group" in f.message
    assert (f.flag, f.suggested) == ("--schedule-conservativeness", "1.3") and len(f.ranks) == 8
    assert (d.config.tp_size, d.config.dp_size, d.config.parallelism_source) == (8, 1, "rank tags")
    assert not any("occasional" in note for note in d.notes)


@pytest.mark.parametrize("seconds,severity", [(11, "critical"), (10, "warning")])
def test_a_storm_is_more_than_ten_retractions_a_minute(seconds: int, severity: str) -> None:
    d = analyze(lines=_storm(ranks=2, seconds=seconds))
    assert [f.severity for f in d.findings if f.id == "retraction.frequent"] == [severity]


def test_a_vllm_log_is_read_and_judged() -> None:
    log = VllmLog().start().stats_series(30, running=64, waiting=0, usage=0.4, gen=2000.0)
    d = analyze(lines=log.lines)
    assert d.config.engine == "vllm" and d.timeline.load_kind == "stats" and len(d.timeline.load()) == 30
    assert d.status == "info" and d.findings[0].id == "queue.empty_under_load"
    assert d.verdict.startswith("OK, with suggestions: Queue mostly empty")
    assert d.config.max_total_num_tokens == 447088 and d.config.context_len == 32768
    assert d.config.engine_version == "0.11.0" and d.config.cuda_graph_max_bs == 512


def test_a_400_digit_count_is_read_without_a_traceback(tmp_path) -> None:
    log = Log().decode_series(20, running=50)
    log.add(lf.decode("0.4.9", running=50, token=10 ** 400, usage=0.5, throughput=100.0, queue=1), dt=1)
    path = tmp_path / "huge-count.log"
    path.write_text(log.text())
    doc = _json(path)
    assert doc["event_counts"]["decode"] == 21 and doc["ranks"][""]["decode_lines"] == 21


def test_a_directory_is_named_a_directory(tmp_path) -> None:
    result = runner.invoke(app, ["diagnose", str(tmp_path)])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert result.stderr.strip() == f"error: {tmp_path} is a directory, not a log file"


def test_gzip_through_stdin_reads_as_the_plain_file(tmp_path) -> None:
    log = Log().start(model_path="m", tp_size=1).decode_series(30, running=50, queue=[0, 3], usage=0.5)
    path = tmp_path / "server.log"
    path.write_text(log.text())
    plain = _json(path)
    piped = _json("-", input=gzip.compress(path.read_bytes()))
    assert piped["event_counts"] == plain["event_counts"] and piped["lines"] == plain["lines"]
    assert piped["verdict"] == plain["verdict"] and piped["event_counts"]["decode"] == 30


def test_export_from_stdin_reads_the_log_once(tmp_path) -> None:
    log = Log().decode_series(12, running=50)
    out = tmp_path / "events.csv"
    result = runner.invoke(app, ["diagnose", "-", "--export", str(out), "--format", "json"], input=log.text())
    assert result.exit_code == 0, result.output
    assert out.read_text().count("\n") == 13 and json.loads(result.stdout)["event_counts"]["decode"] == 12
    assert not [p for p in os.listdir(tmp_path) if p.startswith("toolkit-diagnose-")]
