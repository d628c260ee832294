"""`toolkit report` and `toolkit diagnose --html` from the command line, the one-line errors, and `--open`."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request
import webbrowser
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.reports.conftest import SECTION_IDS
from tests.reports.page import Page
from toolkit.cli import app

ROOT = Path(__file__).resolve().parents[2]


def invoke(*args: str, **kwargs):
    return CliRunner().invoke(app, list(args), **kwargs)


def test_report_from_bench_and_log_writes_one_page(bench_file, server_log, tmp_path):
    out = tmp_path / "deep" / "r.html"
    result = invoke("report", "--bench", str(bench_file), "--server-log", str(server_log), "--out", str(out),
                    "--title", "<i>my run</i>")
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == f"report: {out}"
    page = Page(out.read_text())
    assert tuple(page.sections) == SECTION_IDS and page.title == "<i>my run</i>"
    assert str(bench_file) in out.read_text() and len(page.images()) == 3


def test_bench_alone_and_several_bench_files(bench_file, records, tmp_path):
    out = tmp_path / "r.html"
    result = invoke("report", "--bench", str(bench_file), "--bench", str(bench_file), "-o", str(out))
    assert result.exit_code == 0, result.output
    page = Page(out.read_text())
    assert page.title == f"toolkit report: stub-model · random · {2 * len(records)} runs"
    assert "No server log was given" in page.sections["diagnosis"]


def test_log_alone(server_log, tmp_path):
    out = tmp_path / "r.html"
    assert invoke("report", "--server-log", str(server_log), "--out", str(out)).exit_code == 0
    page = Page(out.read_text())
    assert "No bench records" in page.sections["tables"] and "Server crashed" in page.sections["diagnosis"]


def test_diagnose_html_renders_a_log_alone(server_log, tmp_path):
    out = tmp_path / "d.html"
    result = invoke("diagnose", str(server_log), "--html", str(out), "--format", "json")
    assert result.exit_code == 0, result.output
    assert f"html: {out}" in result.stderr and result.stdout.startswith("{")
    page = Page(out.read_text())
    assert tuple(page.sections) == SECTION_IDS and "the whole log" in page.sections["timeline"]
    assert "<script" not in out.read_text() and len(page.images()) == 1


def _bad(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("case", ["nothing", "missing bench", "missing log", "malformed", "empty", "not an object",
                                  "unwritable"])
def test_bad_input_is_one_line_and_exit_2(case, tmp_path, bench_file):
    args = {
        "nothing": [],
        "missing bench": ["--bench", str(tmp_path / "nope.jsonl")],
        "missing log": ["--bench", str(bench_file), "--server-log", str(tmp_path / "nope.log")],
        "malformed": ["--bench", _bad(tmp_path, "bad.jsonl", '{"request_rate": 1}\n{oops\n')],
        "empty": ["--bench", _bad(tmp_path, "empty.jsonl", "\n\n")],
        "not an object": ["--bench", _bad(tmp_path, "list.jsonl", "[1]\n")],
        "unwritable": ["--bench", str(bench_file), "--out", str(tmp_path)],
    }[case]
    expected = {
        "nothing": "nothing to report", "missing bench": "--bench .*nope.jsonl: no such file",
        "missing log": "--server-log .*nope.log: no such file", "malformed": r"bad.jsonl line 2: not JSON",
        "empty": "empty.jsonl: no bench records", "not an object": "list.jsonl line 1: not a bench record",
        "unwritable": "cannot write the report",
    }[case]
    result = invoke("report", *args)
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and re.search(expected, lines[0]), result.stderr
    assert "Traceback" not in result.output


def test_open_uses_a_browser_when_there_is_a_display(bench_file, tmp_path, monkeypatch):
    opened = []
    monkeypatch.setenv("DISPLAY", ":0")
    monkeypatch.setattr(webbrowser, "open", lambda url: opened.append(url) or True)
    out = tmp_path / "r.html"
    result = invoke("report", "--bench", str(bench_file), "--out", str(out), "--open")
    assert result.exit_code == 0, result.output
    assert opened == [out.resolve().as_uri()] and "opened" in result.stdout


def test_open_without_a_browser_serves_on_localhost_until_ctrl_c(bench_file, tmp_path):
    out = tmp_path / "r.html"
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY")}
    proc = subprocess.Popen([sys.executable, "-m", "toolkit.cli", "report", "--bench", str(bench_file), "--out",
                             str(out), "--open"], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        lines = [proc.stdout.readline(), proc.stdout.readline()]
        match = re.search(r"serving .* at (http://127\.0\.0\.1:\d+/)", lines[1])
        assert lines[0].startswith("report: ") and match, lines
        url = match.group(1)
        with urllib.request.urlopen(url, timeout=10) as resp:
            assert resp.status == 200 and resp.read() == out.read_bytes()
            assert resp.headers["Content-Type"].startswith("text/html")
        with pytest.raises(urllib.error.HTTPError, match="404"):
            urllib.request.urlopen(url + "etc/passwd", timeout=10)
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0 and "stopped" in stdout and "Traceback" not in stderr, stderr


def test_help_lists_the_flags_without_importing_the_renderer():
    result = invoke("report", "--help", env={"COLUMNS": "200"})
    assert result.exit_code == 0
    for flag in ("--bench", "--server-log", "--out", "--title", "--open"):
        assert flag in result.output
    assert "--html" in invoke("diagnose", "--help", env={"COLUMNS": "200"}).output
    probe = "import sys, toolkit.cli; print(sorted(m for m in sys.modules if m.startswith(('toolkit.reports.', 'jinja2', " \
            "'matplotlib'))))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.stdout.strip() == "['toolkit.reports.cli']", out.stderr
