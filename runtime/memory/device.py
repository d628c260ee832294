"""Free memory of the device the model runs on, in GiB."""
from __future__ import annotations

import torch

GIB = 1 << 30


def available_memory_gib(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        free, _ = torch.cuda.mem_get_info(device)
        return free / GIB
    return _mem_available_kib() * 1024 / GIB


def total_memory_mib(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory / (1 << 20)
    return _meminfo_kib("MemTotal") / 1024


def _mem_available_kib() -> int:
    return _meminfo_kib("MemAvailable")


def _meminfo_kib(key: str) -> int:
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/meminfo has no {key}")


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is available")
    return torch.device(name)
