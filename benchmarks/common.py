"""What the project's own benchmarks share (one copy of each): provenance of a result (command, commit, device,
date), where results go, a free port, random token prompts and the tuning benchmarks' load.

Run benchmarks from the repository root (`python -m benchmarks.<name>`); none of this is packaged.
"""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from toolkit.bench.command import BenchOptions
from toolkit.bench.datasets import DatasetSpec
from toolkit.bench.offline import random_requests
from toolkit.tune.launcher import free_port, toolkit_command

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"

__all__ = ["REPO", "RESULTS", "NoDoctor", "RandomWorkload", "cpu_model", "device_name", "free_port", "git_commit", "provenance", "random_requests",
           "slug", "write_result"]


def git_commit() -> tuple[str, bool]:
    """(HEAD's hash, whether tracked files have uncommitted changes). Outside a checkout (a copy of the tree sent
    to a GPU machine, say): TOOLKIT_SOURCE_COMMIT, the commit the copy was made from, else ("unknown", False)."""
    try:
        head = _git("rev-parse", "HEAD")
        dirty = bool(_git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.CalledProcessError, subprocess.TimeoutExpired):
        return os.environ.get("TOOLKIT_SOURCE_COMMIT", "unknown"), False
    return head, dirty


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=True,
                          timeout=30).stdout.strip()


def cpu_model() -> str:
    """The CPU's marketing name (the capability probe's)."""
    from toolkit.runtime import cpu_capability

    return cpu_capability.probe().model_name


def device_name(device: Any) -> str:
    """The device a result really ran on: the GPU's name, or the CPU's model and core count."""
    if getattr(device, "type", device) == "cuda":
        import torch

        return torch.cuda.get_device_name(device)
    return f"cpu ({cpu_model()}, {os.cpu_count()} cores)"


def provenance(module: str, argv: list[str], device: Any = "cpu", **extra: Any) -> dict[str, Any]:
    """How a result was made: the command that reproduces it, the commit, the device, the host CPU's capability
    probe (ISA, kernel tier, bf16/AMX, the dtype auto picks) and the date."""
    import torch

    from toolkit.runtime import cpu_capability

    commit, dirty = git_commit()
    return {
        "command": shlex.join([Path(sys.executable).name, "-m", module, *argv]),
        "git_commit": commit,
        "git_dirty": dirty,
        "device": device_name(device),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cpu_capability": cpu_capability.probe().as_record(),
        **extra,
    }


def slug(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name).strip("_").lower() or "device"


def write_result(name: str, record: dict, out_dir: Path = RESULTS) -> Path:
    """`out_dir/name.json` is the latest run, pretty-printed; `out_dir/name.runs.jsonl` keeps every run, oldest
    first, one record a line (a latest record written before the log existed goes in first). Returns the path."""
    path, runs = out_dir / f"{name}.json", out_dir / f"{name}.runs.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    earlier = [] if runs.exists() or not path.exists() else [json.loads(path.read_text())]
    with runs.open("a") as log:
        for run in (*earlier, record):
            log.write(json.dumps(run) + "\n")
    path.write_text(json.dumps(record, indent=2) + "\n")
    return path


def bench_random_at_full_rate(url: str, prompts: int, input_len: int, output_len: int, out: Path) -> dict:
    """`toolkit bench` at rate inf on exact-length random prompts (native API, 2 warm-up requests); its record."""
    subprocess.run(toolkit_command(
        "bench", "--base-url", url, "--backend", "sglang", "--dataset", "random", "--rate", "inf",
        "--num-prompts", str(prompts), "--random-input-len", str(input_len), "--random-output-len", str(output_len),
        "--random-range-ratio", "1", "--warmup-requests", "2", "--no-progress", "--output-file", str(out)),
        check=True, stdout=subprocess.DEVNULL)
    return json.loads(out.read_text().splitlines()[-1])


@dataclass(frozen=True, slots=True)
class RandomWorkload:
    """`toolkit bench` at rate inf on `prompts` random prompts of exactly `input_len` tokens, `output_len` out (one
    warm-up request): the tuning benchmarks' load."""

    prompts: int
    input_len: int
    output_len: int

    def options(self) -> BenchOptions:
        spec = DatasetSpec(seed=1, random_input_len=self.input_len, random_output_len=self.output_len,
                           random_range_ratio=1.0)
        return BenchOptions(base_url="http://127.0.0.1:0", dataset=spec, num_prompts=self.prompts, rate="inf",
                            warmup_requests=1, progress=False)

    def record(self) -> dict:
        return {"dataset": "random", "prompts": self.prompts, "input_len": self.input_len,
                "output_len": self.output_len, "rate": "inf", "seed": 1}


class NoDoctor:
    """A tuning benchmark's measurement that needs the objective only: no diagnosis of the server's log."""

    def diagnose(self, log, records):
        return (), None
