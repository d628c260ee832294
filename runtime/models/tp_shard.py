"""Which heads, KV heads and MLP columns a TP rank holds, and which TP sizes a model allows (SGLang's rules)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from toolkit.runtime.model_loader.config import ModelConfig

if TYPE_CHECKING:
    from toolkit.runtime.distributed.group import TPGroup


def tp_coordinates(tp: TPGroup | None) -> tuple[int, int]:
    """(rank, size) of this process in its TP group; (0, 1) without one."""
    return (tp.rank, tp.size) if tp is not None else (0, 1)


@dataclass(frozen=True)
class AttentionShard:
    num_heads: int
    first_head: int
    num_kv_heads: int
    first_kv_head: int

    @classmethod
    def of(cls, config: ModelConfig, rank: int, size: int) -> AttentionShard:
        """Heads split evenly; KV heads split when there are at least `size` of them, else each is replicated on
        size / kv_heads consecutive ranks (SGLang's `num_kv_head_replicas`)."""
        heads = config.num_attention_heads // size
        kv = config.num_key_value_heads
        if kv >= size:
            return cls(heads, rank * heads, kv // size, rank * (kv // size))
        return cls(heads, rank * heads, 1, rank // (size // kv))


def tp_size_error(config: ModelConfig, tp_size: int) -> str | None:
    """Why `tp_size` cannot shard this model, or None when it can."""
    heads, kv = config.num_attention_heads, config.num_key_value_heads
    if _splits(config, tp_size):
        return None
    valid = ", ".join(str(t) for t in range(1, heads + 1) if _splits(config, t))
    return (f"--tp-size {tp_size}: {config.architecture} has {heads} attention heads and {kv} KV heads "
            f"(intermediate size {config.intermediate_size}); the TP size must divide the attention heads and the "
            f"intermediate size, and divide the KV heads or be a multiple of them. TP sizes that work: {valid}")


def _splits(config: ModelConfig, tp_size: int) -> bool:
    kv = config.num_key_value_heads
    kv_ok = kv % tp_size == 0 if kv >= tp_size else tp_size % kv == 0
    return config.num_attention_heads % tp_size == 0 and config.intermediate_size % tp_size == 0 and kv_ok
