"""`toolkit demo` end to end (short settings): the tuning story from a mistuned start, its pages — and no server
left behind. Where the host can run the AVX2 path and the rest of the suite runs another (AVX-512, bf16, AMX), the
demo runs on the AVX2 path (tests/avx2_machine.py): the machine most users have, covered once a session."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.avx2_machine import AVX2_ENV, CAP_ADDS_COVERAGE
from tests.machine_speed import scaled
from tests.reports.page import Page
from tests.server.server_process import alive, cmdline, run_to_the_end

pytestmark = pytest.mark.slow  # a long unit: it starts early (tests/xdist_units.py)


PNG = b"\x89PNG\r\n\x1a\n"


def _section_images(page: Path, section: str) -> list[bytes]:
    html = page.read_text()
    start = html.index(f'<section id="{section}">')
    return Page(html[start : html.index("</section>", start)]).images()


def _processes_mentioning(text: str) -> list[int]:
    pids = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]
    return [pid for pid in pids if text in cmdline(pid) and alive(pid)]


def test_demo_tunes_from_the_mistuned_start_writes_its_pages_and_stops_every_server(tmp_path):
    out = tmp_path / "demo"
    # 21 requests, `make demo`'s own load on a CPU without oneDNN bf16, one run each (the pages, not the noise rule:
    # tests/tune/test_tune_e2e.py keeps a change over 3 repeats)
    proc = run_to_the_end(
        [sys.executable, "-m", "toolkit.cli", "demo", "--out", str(out), "--num-prompts", "21", "--repeats", "1",
         "--max-steps", "1", "--max-time", f"{scaled(300):.0f}", "--device", "cpu"], timeout=scaled(600),
        env={**os.environ, **AVX2_ENV} if CAP_ADDS_COVERAGE else None)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-3000:]
    assert not _processes_mentioning(str(out)), "a server of the demo outlived it"
    flat = " ".join(output.split())
    assert f"tunepage:{(out / 'tune.html').resolve()}" in "".join(output.split())
    match = re.search(r"output throughput: ([\d.]+) tok/s at the start → ([\d.]+) tok/s after tuning", flat)
    assert match, flat[-2000:]
    steps = [json.loads(line) for line in (out / "tune.jsonl").read_text().splitlines()]
    assert steps[0]["status"] == "baseline" and len(steps) == 2 and len(steps[0]["values"]) == 1
    assert steps[0]["flags"]["--schedule-conservativeness"] == "2"
    assert steps[1]["finding"] is not None and steps[1]["change"]["flag"].startswith("--")
    summary = json.loads((out / "summary.json").read_text())
    assert float(match.group(1)) == round(summary["start"]["mean"], 1)
    # the pages show this run's steps, not just the template's section ids
    tune_page = Page((out / "tune.html").read_text())
    (chart,) = _section_images(out / "tune.html", "chart")
    assert chart.startswith(PNG) and len(chart) > 10_000
    change, finding = steps[1]["change"]["text"], steps[1]["finding"]
    assert change in tune_page.sections["steps"] and finding["title"] in tune_page.sections["steps"]
    assert all(s["status"] in tune_page.sections["steps"] for s in steps)
    evidence = " ".join(tune_page.sections["evidence"].split())
    assert f"Step 1: {change}" in evidence and finding["id"] in evidence
    assert " ".join(summary["best"]["command"].split()) in " ".join(tune_page.sections["command"].split())
    best = steps[summary["best"]["step"]]
    report = Page((out / "report.html").read_text())
    assert f"(step {summary['best']['step']}:" in report.title
    assert all(f"{r['completed']} / {r['num_requests']}" in report.sections["tables"] for r in best["records"])
    (timeline,) = _section_images(out / "report.html", "timeline")  # the tuned server's log, plotted
    assert timeline.startswith(PNG) and len(timeline) > 10_000
    start_log = (out / "step-00" / "server.log").read_text()
    assert "Decode batch." in start_log
    if CAP_ADDS_COVERAGE:
        assert "ISA avx2 (kernel tier x86-64-v3" in start_log and "-> dtype float32" in start_log, start_log[:3000]


def test_a_demo_whose_server_cannot_start_here_exits_non_zero_with_one_clear_line(tmp_path):
    """The server refuses a kernel tier this CPU cannot run (no CPU runs both x86 and Arm code): the demo must not
    print "done" and exit 0, but say why in one line and exit 1."""
    from toolkit.runtime import cpu_capability

    impossible = "armv8.2-a" if cpu_capability.probe().arch == "x86_64" else "x86-64-v3"
    out = tmp_path / "demo"
    done = subprocess.run(
        [sys.executable, "-m", "toolkit.cli", "demo", "--out", str(out), "--num-prompts", "4", "--repeats", "1",
         "--max-steps", "0", "--max-time", "120", "--device", "cpu"],
        capture_output=True, text=True, timeout=300, env={**os.environ, cpu_capability.TIER_ENV: impossible})
    assert done.returncode == 1, done.stdout[-3000:]
    assert "toolkit demo done" not in done.stdout and "Traceback" not in done.stdout + done.stderr
    error_lines = [line for line in done.stdout.splitlines() if line.startswith("error:")]
    assert len(error_lines) == 1, done.stdout[-3000:]
    assert f"{cpu_capability.TIER_ENV}={impossible}: this CPU lacks" in " ".join(done.stdout.split())
    assert not _processes_mentioning(str(out)), "a server of the demo outlived it"
