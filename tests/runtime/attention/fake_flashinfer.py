"""A stand-in for the `flashinfer` package written from its documented plan/run semantics, in plain torch, so the
FlashInfer backend's metadata and wrapper calls can be checked on CPU. It is no evidence about the real kernels."""
from __future__ import annotations

import sys
import types

import torch


def _attend(q, k, v, causal: bool, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """q: [n, H, D], k/v: [m, Hkv, D] → out [n, H, D], lse [n, H]; causal aligns the queries to the last keys."""
    n, m = q.shape[0], k.shape[0]
    if m == 0:
        return torch.zeros_like(q), torch.full((n, q.shape[1]), float("-inf"))
    group = q.shape[1] // k.shape[1]
    k = k.float().repeat_interleave(group, 1)
    v = v.float().repeat_interleave(group, 1)
    scores = torch.einsum("nhd,mhd->hnm", q.float(), k) * scale
    if causal:
        visible = torch.arange(m)[None, :] <= (m - n + torch.arange(n))[:, None]
        scores = scores.masked_fill(~visible, float("-inf"))
    out = torch.einsum("hnm,mhd->nhd", scores.softmax(-1), v)
    return out.to(q.dtype), scores.logsumexp(-1).T


def _paged(cache: torch.Tensor, indptr, indices, last_page_len, b: int) -> torch.Tensor:
    """Request b's tokens from an NHD cache [pages, page_size, Hkv, D]."""
    assert cache.dim() == 4, "the paged cache is [pages, page_size, heads, dim]"
    pages = indices[int(indptr[b]) : int(indptr[b + 1])].long()
    if pages.numel() == 0:
        return cache[:0, 0]
    tokens = cache[pages].flatten(0, 1)
    return tokens[: (pages.numel() - 1) * cache.shape[1] + int(last_page_len[b])]


class _Wrapper:
    plans = 0

    def __init__(self, workspace: torch.Tensor, kv_layout: str = "NHD", **kwargs) -> None:
        assert kv_layout == "NHD"
        self.plan_args = None

    def _record(self, **kwargs) -> None:
        type(self).plans += 1
        self.plan_args = kwargs


class BatchPrefillWithRaggedKVCacheWrapper(_Wrapper):
    def plan(self, qo_indptr, kv_indptr, num_qo_heads, num_kv_heads, head_dim_qk, causal=False, sm_scale=None,
             q_data_type=torch.float16, **kwargs) -> None:
        self._record(qo=qo_indptr.cpu(), kv=kv_indptr.cpu(), causal=causal, scale=sm_scale)

    def run(self, q, k, v, return_lse: bool = False):
        a = self.plan_args
        outs = [_attend(q[a["qo"][b] : a["qo"][b + 1]], k[a["kv"][b] : a["kv"][b + 1]],
                        v[a["kv"][b] : a["kv"][b + 1]], a["causal"], a["scale"]) for b in range(len(a["qo"]) - 1)]
        out, lse = torch.cat([o for o, _ in outs]), torch.cat([s for _, s in outs])
        return (out, lse) if return_lse else out


class BatchPrefillWithPagedKVCacheWrapper(_Wrapper):
    def plan(self, qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, num_qo_heads, num_kv_heads,
             head_dim_qk, page_size, causal=False, sm_scale=None, q_data_type=torch.float16, kv_data_type=None,
             **kwargs) -> None:
        self._record(qo=qo_indptr.cpu(), indptr=paged_kv_indptr.cpu(), indices=paged_kv_indices.cpu(),
                     last=paged_kv_last_page_len.cpu(), causal=causal, scale=sm_scale)

    def run(self, q, paged_kv_cache, return_lse: bool = False):
        a = self.plan_args
        k_cache, v_cache = paged_kv_cache
        outs = []
        for b in range(len(a["qo"]) - 1):
            k = _paged(k_cache, a["indptr"], a["indices"], a["last"], b)
            v = _paged(v_cache, a["indptr"], a["indices"], a["last"], b)
            outs.append(_attend(q[a["qo"][b] : a["qo"][b + 1]], k, v, a["causal"], a["scale"]))
        out, lse = torch.cat([o for o, _ in outs]), torch.cat([s for _, s in outs])
        return (out, lse) if return_lse else out


class BatchDecodeWithPagedKVCacheWrapper(_Wrapper):
    def __init__(self, workspace, kv_layout: str = "NHD", use_tensor_cores: bool = False, **kwargs) -> None:
        super().__init__(workspace, kv_layout)
        self.use_tensor_cores = use_tensor_cores

    def plan(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size, sm_scale=None,
             q_data_type=torch.float16, kv_data_type=None, **kwargs) -> None:
        self._record(indptr=indptr.cpu(), indices=indices.cpu(), last=last_page_len.cpu(), scale=sm_scale)

    def run(self, q, paged_kv_cache):
        a = self.plan_args
        k_cache, v_cache = paged_kv_cache
        outs = [_attend(q[b : b + 1], _paged(k_cache, a["indptr"], a["indices"], a["last"], b),
                        _paged(v_cache, a["indptr"], a["indices"], a["last"], b), False, a["scale"])[0]
                for b in range(q.shape[0])]
        return torch.cat(outs)


def merge_state(v_a, s_a, v_b, s_b):
    top = torch.maximum(s_a, s_b)
    w_a, w_b = torch.exp(s_a - top), torch.exp(s_b - top)
    merged = (v_a.float() * w_a[..., None] + v_b.float() * w_b[..., None]) / (w_a + w_b)[..., None]
    return merged.to(v_a.dtype), top + torch.log(w_a + w_b)


def install(monkeypatch) -> types.ModuleType:
    """Put the stand-in at `flashinfer` / `flashinfer.cascade` for one test."""
    module = types.ModuleType("flashinfer")
    for cls in (BatchPrefillWithRaggedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper,
                BatchDecodeWithPagedKVCacheWrapper):
        setattr(module, cls.__name__, type(cls.__name__, (cls,), {"plans": 0}))
    cascade = types.ModuleType("flashinfer.cascade")
    cascade.merge_state = merge_state
    module.cascade = cascade
    monkeypatch.setitem(sys.modules, "flashinfer", module)
    monkeypatch.setitem(sys.modules, "flashinfer.cascade", cascade)
    return module
