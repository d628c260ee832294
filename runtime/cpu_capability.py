"""What this CPU can do, asked once per process: the facts every CPU decision reads.

Two sources, each for its own kind of decision:
- oneDNN decides what it packs and multiplies natively (bf16/fp16 GEMMs, AMX micro-kernels), and it honours
  `ONEDNN_MAX_CPU_ISA`; so those answers come from oneDNN itself through torch (`torch.ops.mkldnn`), never from
  the CPU's flags.
- The native kernels' compiler flags come from the CPU's own features (`/proc/cpuinfo`), as a named tier
  (`KERNEL_TIERS`), capped by `ONEDNN_MAX_CPU_ISA` when it names a lower ISA (so capping oneDNN to AVX2 runs the
  whole process as an AVX2 machine would) and set outright by `TOOLKIT_CPU_KERNEL_TIER`.
"""
from __future__ import annotations

import functools
import logging
import os
import platform
from dataclasses import dataclass
from pathlib import Path

import torch

logger = logging.getLogger("runtime")
TIER_ENV = "TOOLKIT_CPU_KERNEL_TIER"
ONEDNN_ISA_ENV = "ONEDNN_MAX_CPU_ISA"
# The environment under which any x86-64 machine runs this process as an AVX2 CPU without AVX-512 would: oneDNN
# (no bf16 GEMMs, no AMX), ATen's own kernels and MKL capped at AVX2, the native kernels at the x86-64-v3 tier.
AVX2_MACHINE_ENV = {ONEDNN_ISA_ENV: "AVX2", "ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2",
                    TIER_ENV: "x86-64-v3"}


@dataclass(frozen=True)
class KernelTier:
    """A target the native kernels are compiled for: `requires` are the CPU features it needs."""

    name: str
    arch: str  # platform.machine() of the CPUs it runs on
    isa: str  # the widest vector ISA its kernels use, in words
    cflags: tuple[str, ...]
    requires: frozenset[str]


_V2 = frozenset({"cx16", "lahf_lm", "popcnt", "sse4_1", "sse4_2", "ssse3"})
_V3 = _V2 | {"avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave"}
_V4 = _V3 | {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}
# Ordered from the most portable to the most capable within each architecture.
KERNEL_TIERS: tuple[KernelTier, ...] = (
    KernelTier("x86-64-v2", "x86_64", "sse4.2", ("-march=x86-64-v2",), _V2),
    KernelTier("x86-64-v3", "x86_64", "avx2", ("-march=x86-64-v3",), _V3),
    KernelTier("x86-64-v4", "x86_64", "avx512", ("-march=x86-64-v4",), _V4),
    KernelTier("x86-64-v4-bf16", "x86_64", "avx512-bf16", ("-march=x86-64-v4", "-mavx512bf16"), _V4 | {"avx512_bf16"}),
    KernelTier("armv8.2-a", "aarch64", "neon", ("-march=armv8.2-a",), frozenset({"asimd"})),
    KernelTier("armv8.2-a-bf16", "aarch64", "neon-bf16", ("-march=armv8.2-a+bf16",), frozenset({"asimd", "bf16"})),
)
# ONEDNN_MAX_CPU_ISA values (oneDNN's names) that cap the kernel tier below what the CPU has.
_ONEDNN_ISA_CAPS = {"SSE41": "x86-64-v2", "AVX": "x86-64-v2", "AVX2": "x86-64-v3", "AVX2_VNNI": "x86-64-v3",
                    "AVX2_VNNI_2": "x86-64-v3", "AVX512_CORE": "x86-64-v4", "AVX512_CORE_VNNI": "x86-64-v4"}


def tier_named(name: str) -> KernelTier:
    return next(tier for tier in KERNEL_TIERS if tier.name == name)


class UnsupportedCpu(RuntimeError):
    """This machine cannot run what was asked of it; the message says what and why, in one line."""


@dataclass(frozen=True)
class CpuCapability:
    model_name: str
    arch: str
    features: frozenset[str]
    onednn_bf16: bool  # oneDNN runs bf16 GEMMs natively (avx512bw/vl/dq or avx_ne_convert), within its ISA cap
    onednn_fp16: bool
    amx: bool  # AMX bf16 tiles, within oneDNN's ISA cap
    onednn_isa_cap: str | None
    tier: KernelTier | None  # None: no tier fits (another architecture): the kernels are not built

    @property
    def isa(self) -> str:
        """The widest vector ISA the kernels and oneDNN may use here, in words."""
        return self.arch if self.tier is None else self.tier.isa

    def native_dtype(self, dtype: torch.dtype) -> bool:
        """Whether oneDNN multiplies this dtype natively here (float32 always)."""
        return {torch.bfloat16: self.onednn_bf16, torch.float16: self.onednn_fp16}.get(dtype, True)

    def auto_dtype(self) -> torch.dtype:
        """`--dtype auto` on a CPU: bfloat16 where its GEMMs are native, float32 elsewhere (measured on an AVX2
        CPU: bf16 without native GEMMs converts every weight on every step)."""
        return torch.bfloat16 if self.onednn_bf16 else torch.float32

    def summary(self) -> str:
        tier = self.tier.name if self.tier else "none"
        return (f"CPU: {self.model_name}, ISA {self.isa} (kernel tier {tier}"
                f"{', oneDNN capped at ' + self.onednn_isa_cap if self.onednn_isa_cap else ''}), "
                f"oneDNN bf16: {_yes(self.onednn_bf16)}, fp16: {_yes(self.onednn_fp16)}, AMX: {_yes(self.amx)}")

    def as_record(self) -> dict[str, object]:
        """The probe's answer for a benchmark record's provenance."""
        return {"cpu": self.model_name, "arch": self.arch, "isa": self.isa,
                "kernel_tier": self.tier.name if self.tier else None, "onednn_bf16": self.onednn_bf16,
                "onednn_fp16": self.onednn_fp16, "amx": self.amx, "onednn_max_cpu_isa": self.onednn_isa_cap,
                "auto_dtype": str(self.auto_dtype()).removeprefix("torch.")}


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def read_cpuinfo(path: Path = Path("/proc/cpuinfo")) -> tuple[str, frozenset[str]]:
    """(model name, feature flags) of the first processor listed; ("", {}) where there is no such file."""
    try:
        text = path.read_text()
    except OSError:
        return "", frozenset()
    name, features = "", frozenset[str]()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key in ("model name", "cpu model", "hardware") and not name:
            name = value.strip()
        elif key in ("flags", "features") and not features:
            features = frozenset(value.split())
    return name, features


def best_tier(arch: str, features: frozenset[str], onednn_isa_cap: str | None = None,
              forced: str | None = None) -> KernelTier | None:
    """The most capable tier of `arch` whose features the CPU has, capped by oneDNN's ISA cap; `forced` (a tier
    name) instead, which must be one this CPU can run."""
    fitting = [t for t in KERNEL_TIERS if t.arch == arch and t.requires <= features]
    if forced:
        chosen = next((t for t in KERNEL_TIERS if t.name == forced), None)
        if chosen is None:
            names = ", ".join(t.name for t in KERNEL_TIERS)
            raise UnsupportedCpu(f"{TIER_ENV}={forced}: not a kernel tier; expected one of {names}")
        if chosen not in fitting:
            missing = " ".join(sorted(chosen.requires - features)) or f"an {chosen.arch} CPU"
            raise UnsupportedCpu(f"{TIER_ENV}={forced}: this CPU lacks {missing}")
        return chosen
    cap = _ONEDNN_ISA_CAPS.get((onednn_isa_cap or "").upper())
    if cap is not None:
        names = [t.name for t in KERNEL_TIERS]
        fitting = [t for t in fitting if names.index(t.name) <= names.index(cap)]
    return fitting[-1] if fitting else None


def _onednn_answer(op_name: str) -> bool:
    """oneDNN's own answer through torch's registered op; False where this torch build lacks oneDNN or the op."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        return bool(getattr(torch.ops.mkldnn, op_name)())
    except (AttributeError, RuntimeError):
        return False


def _amx(features: frozenset[str], onednn_isa_cap: str | None) -> bool:
    """AMX bf16 tiles on the CPU, and oneDNN not capped below them (its AMX ISA names contain "AMX")."""
    capped = onednn_isa_cap is not None and "AMX" not in onednn_isa_cap.upper() and onednn_isa_cap.upper() != "ALL"
    return {"amx_tile", "amx_bf16"} <= features and not capped


@functools.lru_cache(maxsize=1)
def probe() -> CpuCapability:
    """This process's CPU, asked once (the environment caps are read at first call, as oneDNN reads them)."""
    name, features = read_cpuinfo()
    arch = platform.machine().lower().replace("amd64", "x86_64").replace("arm64", "aarch64")
    cap = os.environ.get(ONEDNN_ISA_ENV) or None
    tier = best_tier(arch, features, cap, os.environ.get(TIER_ENV) or None)
    return CpuCapability(model_name=name or platform.processor() or arch, arch=arch, features=features,
                         onednn_bf16=_onednn_answer("_is_mkldnn_bf16_supported"),
                         onednn_fp16=_onednn_answer("_is_mkldnn_fp16_supported"), amx=_amx(features, cap),
                         onednn_isa_cap=cap, tier=tier)


@functools.lru_cache(maxsize=1)
def log_once(dtype: torch.dtype | None = None) -> None:
    """The start-up line: what this CPU is and the dtype it gets."""
    chosen = f" -> dtype {str(dtype).removeprefix('torch.')}" if dtype is not None else ""
    logger.info(probe().summary() + chosen)
