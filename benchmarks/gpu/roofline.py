"""The memory-bandwidth roofline of a decode step: the bytes one step must read (every weight the step touches,
once, plus every cached K/V byte of the batch) over the device's bandwidth, measured with a large
device-to-device copy in the same run.

A decode step at small batch is memory-bound: each weight is read once per step whatever the batch, so the
roofline time is `bytes / bandwidth` and a step cannot be faster than that.
"""
from __future__ import annotations

import time

import torch

from toolkit.runtime.model_loader.config import ModelConfig


def decoder_parameters(config: ModelConfig) -> int:
    """Parameters of the Llama-family decoder in runtime/models/decoder.py, the embedding table included."""
    h, q, kv, inter = config.hidden_size, config.q_size, config.kv_size, config.intermediate_size
    per_layer = h * (q + 2 * kv) + q * h + 2 * h * inter + inter * h + 2 * h  # qkv, o, gate_up, down, 2 norms
    if config.attention_bias:
        per_layer += q + 2 * kv
    if config.qk_norm:
        per_layer += 2 * config.head_dim
    embedding = config.vocab_size * h
    lm_head = 0 if config.tie_word_embeddings else embedding
    return config.num_hidden_layers * per_layer + h + embedding + lm_head


def weight_bytes_read(config: ModelConfig, dtype_bytes: int, batch: int) -> int:
    """Weight bytes one decode step reads: all of them, except that an untied embedding table is only read at
    the batch's rows (a tied one is read whole as the LM head)."""
    params = decoder_parameters(config)
    if not config.tie_word_embeddings:
        params -= config.vocab_size * config.hidden_size
    return dtype_bytes * (params + batch * config.hidden_size)


def kv_bytes_read(config: ModelConfig, kv_dtype_bytes: int, batch: int, context: int) -> int:
    """K and V of every layer for `context` tokens (the new one included) of each of `batch` requests."""
    return batch * context * config.kv_bytes_per_token(kv_dtype_bytes)


def decode_step_bytes(config: ModelConfig, dtype_bytes: int, batch: int, context: int) -> int:
    return weight_bytes_read(config, dtype_bytes, batch) + kv_bytes_read(config, dtype_bytes, batch, context)


def roofline_seconds(step_bytes: int, bandwidth_bytes_per_s: float) -> float:
    return step_bytes / bandwidth_bytes_per_s


def measure_copy_bandwidth(device: torch.device, nbytes: int = 1 << 30, iters: int = 10) -> float:
    """Bytes per second a device-to-device copy moves (each copy reads and writes `nbytes`)."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    if device.type != "cuda":
        start = time.perf_counter()
        for _ in range(iters):
            dst.copy_(src)
        return 2 * nbytes * iters / (time.perf_counter() - start)
    torch.cuda.synchronize(device)
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    for _ in range(iters):
        dst.copy_(src)
    end.record()
    torch.cuda.synchronize(device)
    return 2 * nbytes * iters / (begin.elapsed_time(end) / 1e3)
