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
    """The device by name; a CUDA device carries its index (the current one: `--base-gpu-id` and the TP rank set
    it), so the threads that work on it can select it."""
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is available")
    if name == "cuda" or (name == "auto" and torch.cuda.is_available()):
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu" if name == "auto" else name)
