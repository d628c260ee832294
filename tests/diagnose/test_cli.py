"""`toolkit diagnose` through typer's CliRunner: formats, plots, export, fail-on, stdin, gzip, bad input."""
from __future__ import annotations

import gzip
import json

import pandas as pd
import pytest
from typer.testing import CliRunner

from tests.diagnose import logfactory as lf
from tests.diagnose.logfactory import Log, Startup
from toolkit.cli import app

runner = CliRunner()


def _log(tmp_path, *, retractions: int = 20, name: str = "server.log") -> str:
    log = Log("0.4.9").start(Startup(available=12.0), model_path="m", tp_size=1, mem_fraction_static=0.85)
    for i in range(200):
        log.add(lf.prefill("0.4.9", new_seq=1, new_token=500, cached=100, running=100, queue=5, usage=0.9,
                           token=600000), dt=1)
        log.add(lf.decode("0.4.9", running=100, token=600000, usage=0.9, throughput=3000, queue=5), dt=2)
        if i % (200 // max(retractions, 1)) == 0 and retractions:
            log.add(lf.retract("0.4.9", k=1, old=0.5, new=0.8))
        log.add(lf.access(), scheduler=False)
    path = tmp_path / name
    path.write_text(log.text())
    return str(path)


def test_json_schema_has_counts_and_findings(tmp_path) -> None:
    result = runner.invoke(app, ["diagnose", _log(tmp_path), "--format", "json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["schema"] == "toolkit.diagnose/1"
    assert doc["event_counts"]["decode"] == 200 and doc["event_counts"]["access"] == 200
    assert doc["event_counts"]["retract"] == 20
    by_id = {f["id"]: f for f in doc["findings"]}
    f = by_id["retraction.frequent"]
    assert {"id", "severity", "flag", "suggested", "evidence"} <= set(f)
    assert f["evidence"]["count"] == 20 and f["evidence"]["lines"]
    assert by_id["gpu_memory.too_much"]["suggested"] == "0.920"
    assert doc["command"].startswith("python -m sglang.launch_server --model-path m")
    assert doc["verdict"]["status"] == "warning"


def test_text_report_puts_the_verdict_first(tmp_path) -> None:
    result = runner.invoke(app, ["diagnose", _log(tmp_path)])
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert out.index("Verdict") < out.index("WARNING") < out.index("INFO") < out.index("What was read")
    assert "--schedule-conservativeness" in out and "Corrected launch command" in out


@pytest.mark.parametrize("level,code", [("critical", 0), ("warning", 1), ("info", 1)])
def test_fail_on(tmp_path, level: str, code: int) -> None:
    assert runner.invoke(app, ["diagnose", _log(tmp_path), "--fail-on", level]).exit_code == code


def test_plots_one_png_per_rank(tmp_path) -> None:
    out = tmp_path / "plots"
    result = runner.invoke(app, ["diagnose", _log(tmp_path), "--plots", str(out)])
    assert result.exit_code == 0, result.output
    pngs = sorted(out.glob("*.png"))
    assert [p.name for p in pngs] == ["timeline-server.png"]
    assert pngs[0].read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_export_one_row_per_event(tmp_path, suffix: str) -> None:
    target = tmp_path / f"events{suffix}"
    result = runner.invoke(app, ["diagnose", _log(tmp_path), "--export", str(target), "--format", "json"])
    assert result.exit_code == 0, result.output
    df = pd.read_csv(target) if suffix == ".csv" else pd.read_parquet(target)
    assert {"kind", "time", "rank", "line", "running_req", "queue_req", "text"} <= set(df.columns)
    assert (df["kind"] == "decode").sum() == 200
    assert len(df) == json.loads(result.stdout)["lines"]["events"]
    first = df[df["kind"] == "decode"].iloc[0]
    assert (first["running_req"], first["queue_req"]) == (100, 5)


def test_stdin_and_gzip_give_the_same_result(tmp_path) -> None:
    path = _log(tmp_path)
    gz = tmp_path / "server.log.gz"
    gz.write_bytes(gzip.compress(open(path, "rb").read()))
    plain = json.loads(runner.invoke(app, ["diagnose", path, "--format", "json"]).stdout)
    zipped = json.loads(runner.invoke(app, ["diagnose", str(gz), "--format", "json"]).stdout)
    piped = json.loads(runner.invoke(app, ["diagnose", "-", "--format", "json"],
                                     input=open(path).read()).stdout)
    assert plain["event_counts"] == zipped["event_counts"] == piped["event_counts"]
    assert [f["id"] for f in plain["findings"]] == [f["id"] for f in piped["findings"]]


def test_exports_from_stdin_and_gzip_equal_the_files(tmp_path) -> None:
    """A stream's chunks are read once: the export keeps a copy of their messages' bytes in its stash (a file's
    are read from it again); the rows come out the same."""
    path = _log(tmp_path)
    gz = tmp_path / "server.log.gz"
    gz.write_bytes(gzip.compress(open(path, "rb").read()))
    outs = [tmp_path / f"{name}.csv" for name in ("plain", "zipped", "piped")]
    for source, out in zip([path, str(gz), "-"], outs):
        result = runner.invoke(app, ["diagnose", source, "--export", str(out)], input=open(path).read())
        assert result.exit_code == 0, result.output
    assert outs[0].read_bytes() == outs[1].read_bytes() == outs[2].read_bytes()
    assert outs[0].read_bytes().count(b"\n") > 200


@pytest.mark.parametrize("args,needle", [
    (["missing.log"], "no such file: missing.log"),
    (["{log}", "--format", "xml"], "unknown --format 'xml'"),
    (["{log}", "--fail-on", "sometimes"], "unknown --fail-on 'sometimes'"),
    (["{log}", "--export", "events.json"], "--export needs a .csv or .parquet"),
    (["{log}", "--export", "no-such-dir/events.csv"], "--export no-such-dir/events.csv: no such directory: no-such-dir"),
    (["{log}", "--bench", "nope.jsonl"], "no such file: nope.jsonl"),
    ([], "no log given"),
])
def test_bad_input_is_one_clear_line(tmp_path, args: list[str], needle: str) -> None:
    log = _log(tmp_path)
    result = runner.invoke(app, ["diagnose", *[a.replace("{log}", log) for a in args]])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in result.output


def test_an_export_onto_a_directory_is_one_clear_line(tmp_path) -> None:
    (tmp_path / "events.csv").mkdir()
    result = runner.invoke(app, ["diagnose", _log(tmp_path), "--export", str(tmp_path / "events.csv")])
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1 and "is a directory" in lines[0], result.output


def test_bad_metrics_file_is_one_clear_line(tmp_path) -> None:
    bad = tmp_path / "metrics.txt"
    bad.write_text("this is { not prometheus\n")
    result = runner.invoke(app, ["diagnose", _log(tmp_path), "--metrics", str(bad)])
    assert result.exit_code == 2 and len(result.stderr.strip().splitlines()) == 1


def test_metrics_and_bench_are_evidence(tmp_path) -> None:
    metrics = tmp_path / "metrics.txt"
    metrics.write_text(
        "# TYPE sglang:token_usage gauge\nsglang:token_usage{tp_rank=\"0\"} 0.91\n"
        "# TYPE sglang:num_requests_total counter\nsglang:num_requests_total{tp_rank=\"0\"} 1200\n"
        "# TYPE sglang:time_to_first_token_seconds histogram\n"
        "sglang:time_to_first_token_seconds_bucket{le=\"+Inf\"} 4\nsglang:time_to_first_token_seconds_sum 2.0\n"
        "sglang:time_to_first_token_seconds_count 4\n")
    bench = tmp_path / "bench.jsonl"
    bench.write_text(json.dumps({"request_rate": 8, "achieved_rate": 5.0, "client_bottleneck": True,
                                 "completed": 100}) + "\n")
    result = runner.invoke(app, ["diagnose", _log(tmp_path), "--format", "json", "--metrics", str(metrics),
                                 "--bench", str(bench)])
    doc = json.loads(result.stdout)
    assert doc["metrics"]["sglang:token_usage"] == 0.91
    assert doc["metrics"]["sglang:num_requests_total"] == 1200
    assert doc["metrics"]["sglang:time_to_first_token_seconds"] == 0.5
    assert "client.bottleneck" in {f["id"] for f in doc["findings"]}
    assert doc["bench"][0]["achieved_rate"] == 5.0


def test_script_tags_and_control_characters_are_reported_as_text(tmp_path) -> None:
    log = Log("0.4.9").start(model_path="<script>alert(1)</script>")
    log.add("Scheduler hit an exception: Traceback (most recent call last):\n"
            "ValueError: <script>alert('x')</script>\x07\x1b]0;pwned\x07 [bold red]markup[/bold red]", dt=1)
    path = tmp_path / "evil.log"
    path.write_text(log.text())
    text = runner.invoke(app, ["diagnose", str(path)], env={"COLUMNS": "300"})
    assert text.exit_code == 0, text.output
    assert "<script>alert('x')</script>" in text.stdout and "[bold red]markup[/bold red]" in text.stdout
    assert "\x07" not in text.stdout and "\x1b" not in text.stdout and "\\x07" in text.stdout
    doc = json.loads(runner.invoke(app, ["diagnose", str(path), "--format", "json"]).stdout)
    crash = next(f for f in doc["findings"] if f["id"] == "crash.exception")
    assert "<script>alert('x')</script>" in crash["message"]
    assert "<script>alert(1)</script>" in doc["command"]


def test_the_command_as_a_process_ends_with_its_output_and_status(tmp_path) -> None:
    """`toolkit diagnose` ends its process without the interpreter's teardown (`toolkit.cli.main`): the report,
    the export and the status are all there, for a success, a `--fail-on` status and a bad input."""
    import subprocess
    import sys

    log, out = _log(tmp_path), tmp_path / "events.csv"
    command = [sys.executable, "-m", "toolkit.cli", "diagnose", log]
    done = subprocess.run([*command, "--format", "json", "--export", str(out)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["event_counts"]["decode"] == 200, "the whole report, flushed"
    assert len(pd.read_csv(out)) == _events(log), "the whole export, closed"
    failed = subprocess.run([*command, "--fail-on", "warning"], capture_output=True, text=True, timeout=120)
    assert failed.returncode == 1 and "Verdict" in failed.stdout
    bad = subprocess.run([*command[:-1], str(tmp_path / "missing.log")], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "no such file" in bad.stderr


def _events(log: str) -> int:
    from toolkit.diagnose.read.lines import parse_lines

    with open(log) as f:
        return sum(1 for _ in parse_lines(f.read().splitlines()))
