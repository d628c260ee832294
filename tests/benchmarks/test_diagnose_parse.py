"""`benchmarks.diagnose_parse --baseline COMMIT` runs the whole command paired with another commit's build,
interleaved, and prints every pair, its ratio and the median."""
from __future__ import annotations

import re
import subprocess
import sys

from benchmarks.common import REPO


def test_the_command_is_paired_with_a_baseline_commit(tmp_path) -> None:
    proc = subprocess.run([sys.executable, "-m", "benchmarks.diagnose_parse", "--lines", "3000", "--runs", "1",
                           "--modes", "command", "--baseline", "HEAD", "--pairs", "2"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    pairs = re.findall(r"pair (\d): ours +([\d.]+) s .* baseline +([\d.]+) s .* ratio ([\d.]+)x", out)
    assert [p[0] for p in pairs] == ["1", "2"] and all(float(s) > 0 for p in pairs for s in p[1:])
    assert re.search(r"median ratio [\d.]+x \(spread [\d.]+-[\d.]+\)", out)
    worktrees = subprocess.run(["git", "worktree", "list"], cwd=REPO, capture_output=True, text=True).stdout
    assert "baseline" not in worktrees, "the baseline's worktree is removed"
