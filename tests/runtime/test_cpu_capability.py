"""The CPU capability probe: tier selection from faked feature sets (every architecture, on any machine), the ISA
cap and the forced tier, the dtype rule, /proc/cpuinfo parsing, and the probe of this machine agreeing with
oneDNN's own answer."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from toolkit.runtime import cpu_capability
from toolkit.runtime.cpu_capability import KERNEL_TIERS, UnsupportedCpu, best_tier, read_cpuinfo

TIERS = {tier.name: tier for tier in KERNEL_TIERS}
SKYLAKE_X = TIERS["x86-64-v4"].requires | {"sse4a", "rdrand"}  # AVX-512 without BF16 (Skylake-X, Cascade Lake)
SAPPHIRE_RAPIDS = TIERS["x86-64-v4-bf16"].requires | {"amx_tile", "amx_bf16"}
EPYC_ZEN3 = TIERS["x86-64-v3"].requires | {"sse4a", "vaes"}
OLD_X86 = TIERS["x86-64-v2"].requires
GRAVITON2 = frozenset({"fp", "asimd", "crc32", "atomics"})
GRAVITON3 = GRAVITON2 | {"bf16", "sve"}


@pytest.mark.parametrize("arch, features, expected", [
    ("x86_64", SAPPHIRE_RAPIDS, "x86-64-v4-bf16"),
    ("x86_64", SKYLAKE_X, "x86-64-v4"),
    ("x86_64", EPYC_ZEN3, "x86-64-v3"),
    ("x86_64", OLD_X86, "x86-64-v2"),
    ("aarch64", GRAVITON2, "armv8.2-a"),
    ("aarch64", GRAVITON3, "armv8.2-a-bf16"),
])
def test_the_most_capable_tier_the_cpu_has(arch, features, expected):
    assert best_tier(arch, features).name == expected


def test_no_tier_for_an_unknown_architecture_or_a_bare_cpu():
    assert best_tier("riscv64", frozenset({"rvv"})) is None
    assert best_tier("x86_64", frozenset()) is None


@pytest.mark.parametrize("cap, expected", [("AVX2", "x86-64-v3"), ("avx2", "x86-64-v3"), ("SSE41", "x86-64-v2"),
                                           ("AVX512_CORE", "x86-64-v4"), ("AVX512_CORE_AMX", "x86-64-v4-bf16"),
                                           (None, "x86-64-v4-bf16")])
def test_onednn_isa_cap_caps_the_kernel_tier(cap, expected):
    assert best_tier("x86_64", SAPPHIRE_RAPIDS, cap).name == expected


def test_a_forced_tier_is_taken_when_the_cpu_can_run_it():
    assert best_tier("x86_64", SAPPHIRE_RAPIDS, forced="x86-64-v3").name == "x86-64-v3"


@pytest.mark.parametrize("arch, features, forced, message", [
    ("x86_64", EPYC_ZEN3, "x86-64-v4", "lacks avx512bw avx512cd avx512dq avx512f avx512vl"),
    ("x86_64", EPYC_ZEN3, "armv8.2-a", "lacks asimd"),
    ("x86_64", EPYC_ZEN3, "avx9000", "not a kernel tier; expected one of x86-64-v2"),
])
def test_a_forced_tier_the_cpu_cannot_run_is_one_clear_error(arch, features, forced, message):
    with pytest.raises(UnsupportedCpu, match=message):
        best_tier(arch, features, forced=forced)


def _capability(**changes) -> cpu_capability.CpuCapability:
    base = cpu_capability.CpuCapability("test CPU", "x86_64", EPYC_ZEN3, onednn_bf16=False, onednn_fp16=False,
                                        amx=False, onednn_isa_cap=None, tier=TIERS["x86-64-v3"])
    return dataclasses.replace(base, **changes)


def test_auto_dtype_is_bf16_only_where_onednn_multiplies_it_natively():
    assert _capability().auto_dtype() == torch.float32
    assert _capability(onednn_bf16=True).auto_dtype() == torch.bfloat16
    assert not _capability().native_dtype(torch.bfloat16) and _capability().native_dtype(torch.float32)


def test_the_summary_line_names_the_cpu_isa_and_answers():
    line = _capability(onednn_isa_cap="AVX2").summary()
    assert line == ("CPU: test CPU, ISA avx2 (kernel tier x86-64-v3, oneDNN capped at AVX2), oneDNN bf16: no, "
                    "fp16: no, AMX: no")
    assert _capability().as_record()["auto_dtype"] == "float32"


def test_amx_needs_the_tiles_and_no_lower_onednn_cap():
    assert cpu_capability._amx(SAPPHIRE_RAPIDS, None)
    assert cpu_capability._amx(SAPPHIRE_RAPIDS, "AVX512_CORE_AMX")
    assert not cpu_capability._amx(SAPPHIRE_RAPIDS, "AVX2")
    assert not cpu_capability._amx(SKYLAKE_X, None)


def test_cpuinfo_of_x86_and_arm(tmp_path):
    x86 = tmp_path / "x86"
    x86.write_text("processor\t: 0\nmodel name\t: AMD EPYC 7B13\nflags\t\t: fpu sse4_2 avx2\n\n"
                   "processor\t: 1\nmodel name\t: other\nflags\t\t: fpu\n")
    assert read_cpuinfo(x86) == ("AMD EPYC 7B13", frozenset({"fpu", "sse4_2", "avx2"}))
    arm = tmp_path / "arm"
    arm.write_text("processor\t: 0\nBogoMIPS\t: 243.75\nFeatures\t: fp asimd bf16\nCPU part\t: 0xd40\n")
    assert read_cpuinfo(arm) == ("", frozenset({"fp", "asimd", "bf16"}))
    assert read_cpuinfo(tmp_path / "missing") == ("", frozenset())


def test_this_machine_agrees_with_onednn():
    probe = cpu_capability.probe()
    assert probe.onednn_bf16 == torch.ops.mkldnn._is_mkldnn_bf16_supported()
    assert probe.auto_dtype() == (torch.bfloat16 if probe.onednn_bf16 else torch.float32)
    assert probe.tier is not None and probe.tier.requires <= probe.features
