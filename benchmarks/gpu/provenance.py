"""What every GPU result records about how it was made: the command, the git commit, the device and the date."""
from __future__ import annotations

import json
import platform
import shlex
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]


def git_commit() -> tuple[str, bool]:
    """(HEAD's hash, whether the working tree has changes); ("unknown", False) outside a git checkout."""
    try:
        head = _git("rev-parse", "HEAD")
        dirty = bool(_git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.CalledProcessError):
        return "unknown", False
    return head, dirty


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=True,
                          timeout=30).stdout.strip()


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({platform.processor() or platform.machine()})"


def run_metadata(module: str, argv: list[str], device: torch.device, dry_run: bool) -> dict:
    commit, dirty = git_commit()
    return {
        "command": shlex.join([Path(sys.executable).name, "-m", module, *argv]),
        "git_commit": commit,
        "git_dirty": dirty,
        "device": device_name(device),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "dry_run": dry_run,
    }


def slug(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name).strip("_").lower() or "device"


def write_result(out_dir: Path, name: str, record: dict) -> Path:
    path = out_dir / f"{name}_{slug(record['meta']['device'])}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2) + "\n")
    return path
