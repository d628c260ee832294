"""`toolkit demo` end to end (short settings): the tuning story from a mistuned start, its pages — and no server
left behind."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from tests.server.server_process import alive, cmdline


def _processes_mentioning(text: str) -> list[int]:
    pids = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]
    return [pid for pid in pids if text in cmdline(pid) and alive(pid)]


def test_demo_tunes_from_the_mistuned_start_writes_its_pages_and_stops_every_server(tmp_path):
    out = tmp_path / "demo"
    proc = subprocess.Popen(
        [sys.executable, "-m", "toolkit.cli", "demo", "--out", str(out), "--num-prompts", "42", "--repeats", "2",
         "--max-steps", "1", "--max-time", "300", "--device", "cpu"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    output, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, output[-3000:]
    assert not _processes_mentioning(str(out)), "a server of the demo outlived it"
    flat = " ".join(output.split())
    assert f"tunepage:{(out / 'tune.html').resolve()}" in "".join(output.split())
    match = re.search(r"output throughput: ([\d.]+) tok/s at the start → ([\d.]+) tok/s after tuning", flat)
    assert match, flat[-2000:]
    steps = [json.loads(line) for line in (out / "tune.jsonl").read_text().splitlines()]
    assert steps[0]["status"] == "baseline" and len(steps) == 2 and len(steps[0]["values"]) == 2
    assert steps[0]["flags"]["--schedule-conservativeness"] == "2"
    assert steps[1]["finding"] is not None and steps[1]["change"]["flag"].startswith("--")
    summary = json.loads((out / "summary.json").read_text())
    assert float(match.group(1)) == round(summary["start"]["mean"], 1)
    html = (out / "tune.html").read_text()
    assert 'id="chart"' in html and 'id="step-1"' in html and "data:image/png;base64," in html
    report = (out / "report.html").read_text()
    assert 'id="diagnosis"' in report and 'id="timeline"' in report
    assert "Decode batch." in (out / "step-00" / "server.log").read_text()
