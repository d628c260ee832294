"""`toolkit demo` end to end (short settings): serve, bench sweep, diagnose, report — and no server left."""
from __future__ import annotations

import re
import subprocess
import sys

from pathlib import Path

from tests.server.server_process import alive, cmdline


def _processes_mentioning(text: str) -> list[int]:
    pids = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]
    return [pid for pid in pids if text in cmdline(pid) and alive(pid)]


def test_demo_writes_a_report_with_findings_and_stops_its_server(tmp_path):
    out = tmp_path / "demo"
    proc = subprocess.Popen(
        [sys.executable, "-m", "toolkit.cli", "demo", "--out", str(out), "--num-prompts", "4", "--input-len", "32",
         "--output-len", "12"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    output, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, output[-3000:]
    assert not _processes_mentioning(str(out / "server.log")), "the demo's server outlived it"
    report = out / "report.html"
    assert f"report: {report.resolve()}" in output.replace("\n", "")
    html = report.read_text()
    for section in ("config", "verdict", "tables", "sweep", "timeline", "diagnosis"):
        assert f'id="{section}"' in html
    assert re.search(r'id="finding-\d+"', html), "the report has no findings"
    log = (out / "server.log").read_text()
    assert "Prefill batch." in log and "Decode batch." in log
    records = (out / "bench.jsonl").read_text().splitlines()
    assert len(records) >= 2  # the saturation run and at least one rate below it
