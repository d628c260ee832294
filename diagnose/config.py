"""The server's configuration as the log tells it: `server_args=...` plus the startup memory lines."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from toolkit.diagnose.fields import Value


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """What is known about the server; `None` where the log does not say.

    Memory figures are GB per GPU. `gpu_mem_gb` is the free memory before loading weights (largest across
    ranks), which is close to the device size; `available_mem_gb` is what was left after the KV pool and
    graphs (`available_gpu_mem=` or the last `avail mem=`)."""

    args: Mapping[str, Value] = field(default_factory=dict)
    max_total_num_tokens: int | None = None
    chunked_prefill_size: int | None = None
    max_prefill_tokens: int | None = None
    max_running_requests: int | None = None
    context_len: int | None = None
    available_mem_gb: float | None = None
    device: str | None = None
    gpu_mem_gb: float | None = None
    weight_mem_gb: float | None = None
    kv_mem_gb: float | None = None
    graph_mem_gb: float | None = None
    dtype: str | None = None
    model_class: str | None = None
    era: str | None = None

    def arg(self, name: str, default: Any = None) -> Any:
        value = self.args.get(name)
        return default if value is None else value

    @property
    def tp_size(self) -> int:
        return int(self.arg("tp_size", 1) or 1)

    @property
    def dp_size(self) -> int:
        return int(self.arg("dp_size", 1) or 1)

    @property
    def mem_fraction_static(self) -> float | None:
        v = self.arg("mem_fraction_static")
        return float(v) if isinstance(v, (int, float)) else None

    @property
    def schedule_policy(self) -> str | None:
        from toolkit.diagnose.eras import default_schedule_policy

        return self.arg("schedule_policy") or default_schedule_policy(self.era)

    @property
    def schedule_conservativeness(self) -> float:
        v = self.arg("schedule_conservativeness", 1.0)
        return float(v) if isinstance(v, (int, float)) else 1.0

    @property
    def cuda_graph_max_bs(self) -> int | None:
        from toolkit.diagnose.eras import default_cuda_graph_max_bs

        v = self.arg("cuda_graph_max_bs")
        if isinstance(v, int):
            return v
        return default_cuda_graph_max_bs(self.era, self.gpu_mem_gb, self.tp_size) if self.on_gpu else None

    @property
    def cuda_graph_disabled(self) -> bool:
        return bool(self.arg("disable_cuda_graph", False))

    @property
    def torch_compile(self) -> bool:
        return bool(self.arg("enable_torch_compile", False))

    @property
    def kv_cache_dtype(self) -> str:
        return str(self.arg("kv_cache_dtype", "auto"))

    @property
    def quantization(self) -> str | None:
        v = self.arg("quantization")
        return str(v) if v else None

    @property
    def on_gpu(self) -> bool:
        return self.device != "cpu"

    @property
    def total_weight_gb(self) -> float | None:
        return self.weight_mem_gb * self.tp_size if self.weight_mem_gb is not None else None
