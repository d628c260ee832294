"""Data flows one way: diagnose never imports the report (the CLI's composition root hands `--html` its page
writer), and the command's analysis path never imports pandas (its import alone costs a third of a second)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_diagnose_never_imports_reports() -> None:
    for path in (ROOT / "diagnose").rglob("*.py"):
        assert "toolkit.reports" not in path.read_text(), path


def test_analyzing_a_log_imports_neither_reports_nor_pandas(tmp_path) -> None:
    log = tmp_path / "server.log"
    log.write_text("[2025-11-11 04:06:27] Decode batch, #running-req: 1, #token: 9, token usage: 0.00, "
                   "cuda graph: True, gen throughput (token/s): 1.00, #queue-req: 0\n" * 20)
    code = ("import sys, io; from rich.console import Console; from toolkit.diagnose import analyze; "
            "from toolkit.diagnose.report_terminal import render; "
            f"render(analyze([{str(log)!r}]), Console(file=io.StringIO())); "
            "print(sorted(m for m in sys.modules if m.startswith(('toolkit.reports', 'pandas'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]"
