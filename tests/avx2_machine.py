"""Running the product as an x86-64 CPU with AVX2 and no AVX-512 would (AMD EPYC, client CPUs), on any x86 machine
that has AVX2: `cpu_capability.AVX2_MACHINE_ENV` caps oneDNN, ATen and MKL at AVX2 and picks the x86-64-v3 kernel
tier, in fresh processes."""
from __future__ import annotations

from toolkit.runtime import cpu_capability

AVX2_ENV = cpu_capability.AVX2_MACHINE_ENV

_HOST = cpu_capability.probe()
# the host can run the AVX2 path at all
HAS_AVX2 = cpu_capability.tier_named("x86-64-v3").requires <= _HOST.features
# the host is itself such a machine: the capped environment changes nothing here
IS_AVX2_HOST = (_HOST.tier is not None and _HOST.tier.name == "x86-64-v3" and not _HOST.onednn_bf16
                and _HOST.onednn_isa_cap is None)
# capping adds coverage: the rest of the suite runs another path (AVX-512, bf16, AMX) on this host
CAP_ADDS_COVERAGE = HAS_AVX2 and not IS_AVX2_HOST
