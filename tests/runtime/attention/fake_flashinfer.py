"""A stand-in for the `flashinfer` package at the version pyproject's `gpu` extra pins (VERSION), written from its
documented plan/run semantics in plain torch, so the FlashInfer backend's metadata and wrapper calls can be checked
on CPU. It is no evidence about the real kernels.

It is strict where a lenient fake would swallow a mistake:
- every constructor, `plan()` and `run()` has the pinned version's exact signature (an argument that version does
  not take is a TypeError here too; `test_flashinfer_backend.py` compares them with the installed package where
  there is one), and an argument the stand-in does not model must keep its default (NotImplementedError);
- `plan()` checks what FlashInfer reads: int32 index arrays, head counts, a CUDA-graph wrapper's fixed batch size
  and buffer capacity (it copies the metadata into those buffers, as the real one does); it refuses to run inside
  a graph capture (it copies to the host);
- `run()` checks the dtypes against `plan()` (FlashInfer's own messages), q's rows and heads, the paged cache's
  NHD layout and page size, and that the metadata it reads is still what was planned (a re-plan was not forgotten);
- the log-sum-exp is base 2 unless `lse_base="ln"`, and `merge_state` merges base-2 states, as FlashInfer's do.
"""
from __future__ import annotations

import inspect
import math
import sys
import types

import torch

from tests.runtime.capture_guard import kernel

VERSION = "0.7.2.post1"


def _dtype(value: str | torch.dtype) -> torch.dtype:
    return getattr(torch, value) if isinstance(value, str) else value


def _only_modelled(method, values: dict, modelled: tuple[str, ...]) -> None:
    """Arguments the stand-in does not model must keep the pinned version's defaults."""
    for name, param in inspect.signature(method).parameters.items():
        if name == "self" or name in modelled or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        value, default = values[name], param.default
        if value is not default and (torch.is_tensor(value) or value != default):
            raise NotImplementedError(f"the flashinfer stand-in does not model {method.__qualname__}({name}="
                                      f"{value!r})")


def _host(array: torch.Tensor) -> torch.Tensor:
    """plan()'s host copy (`.to("cpu")` copies a CUDA tensor; on a CPU it must copy too)."""
    return array.to("cpu", copy=True)


def _int32(**arrays: torch.Tensor) -> None:
    for name, array in arrays.items():
        if array.dtype != torch.int32:
            raise ValueError(f"{name} must be int32 (FlashInfer reads it as int32), got {array.dtype}")


def _not_capturing(what: str) -> None:
    try:
        capturing = torch.cuda.is_current_stream_capturing()
    except RuntimeError:  # a CPU build of torch has no streams to capture on
        capturing = False
    if capturing:
        raise RuntimeError(f"{what}.plan() inside a CUDA graph capture: plan copies to the host and cannot be "
                           "captured")


def _check_cached_qkv_data_type(q: torch.Tensor, k: torch.Tensor, dtype_q: torch.dtype,
                                dtype_kv: torch.dtype) -> None:
    if q.dtype != dtype_q:
        raise ValueError(f"The dtype of q {q.dtype} does not match the q_data_type {dtype_q} specified in plan "
                         "function.")
    if k.dtype != dtype_kv:
        raise ValueError(f"The dtype of k {k.dtype} does not match the kv_data_type {dtype_kv} specified in plan "
                         "function.")


def _lse(lse: torch.Tensor, base: str) -> torch.Tensor:
    if base not in ("log2", "ln"):
        raise ValueError(f"lse_base must be 'log2' or 'ln', got {base!r}")
    return lse / math.log(2) if base == "log2" else lse


def _attend(q, k, v, causal: bool, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """q: [n, H, D], k/v: [m, Hkv, D] → out [n, H, D], natural lse [n, H]; causal aligns the queries to the last
    keys."""
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


class _Wrapper:
    plans = 0

    def _setup(self, workspace: torch.Tensor, kv_layout: str) -> None:
        if kv_layout not in ("NHD", "HND"):
            raise KeyError(f"Invalid kv_layout {kv_layout}")
        if kv_layout != "NHD":
            raise NotImplementedError("the flashinfer stand-in models the NHD layout only")
        if workspace.dtype != torch.uint8 or workspace.data_ptr() % 16:
            raise ValueError("float_workspace_buffer must be a 16-byte aligned uint8 buffer")
        self.plan_args: dict | None = None

    def _planned(self, **args) -> None:
        type(self).plans += 1
        self.plan_args = args

    def _geometry(self, q: torch.Tensor, k_shape: torch.Size, rows: int) -> dict:
        a = self.plan_args
        if a is None:
            raise RuntimeError("run() before plan()")
        _check_cached_qkv_data_type(q, self._k_for_dtype, a["q_dtype"], a["kv_dtype"])
        if q.shape[0] != rows:
            raise ValueError(f"q.shape[0] ({q.shape[0]}) does not match the planned {rows} rows")
        if tuple(q.shape[1:]) != (a["heads"], a["head_dim"]) or tuple(k_shape[-2:]) != (a["kv_heads"], a["head_dim"]):
            raise ValueError(f"q {tuple(q.shape)} / kv {tuple(k_shape)} do not match the planned heads "
                             f"{a['heads']}/{a['kv_heads']} of dim {a['head_dim']}")
        return a

    def _paged(self, paged_kv_cache, indptr_name: str) -> tuple[torch.Tensor, torch.Tensor]:
        if not isinstance(paged_kv_cache, tuple) or len(paged_kv_cache) != 2:
            raise NotImplementedError("the flashinfer stand-in models a (k_cache, v_cache) tuple only")
        k_cache, v_cache = paged_kv_cache
        page_size = self.plan_args["page_size"]
        for cache in (k_cache, v_cache):
            if cache.dim() != 4 or cache.shape[1] != page_size:
                raise ValueError(f"an NHD paged cache is [pages, {page_size}, kv_heads, head_dim], got "
                                 f"{tuple(cache.shape)}")
        self._k_for_dtype = k_cache
        return k_cache, v_cache

    def _still_planned(self, **read: torch.Tensor) -> None:
        """What the kernel reads now must be what plan() saw (FlashInfer's work split was planned from it)."""
        for name, array in read.items():
            planned = self.plan_args[name]
            if not torch.equal(array[: planned.numel()].cpu(), planned):
                raise RuntimeError(f"{type(self).__name__}.run(): {name} changed since plan(); re-plan first")


def _scaled(cache_tokens: torch.Tensor, scale: float | None) -> torch.Tensor:
    """An fp8 cache's calibration scale (FlashInfer folds k_scale into the logits and v_scale into the output)."""
    return cache_tokens if scale is None else cache_tokens.float() * scale


def _request_tokens(cache, indptr, indices, last_page_len, b: int) -> torch.Tensor:
    pages = indices[int(indptr[b]) : int(indptr[b + 1])].long()
    if pages.numel() == 0:
        return cache[:0, 0]
    tokens = cache[pages].flatten(0, 1)
    return tokens[: (pages.numel() - 1) * cache.shape[1] + int(last_page_len[b])]


class BatchPrefillWithRaggedKVCacheWrapper(_Wrapper):
    def __init__(self, float_workspace_buffer: torch.Tensor, kv_layout: str = "NHD", use_cuda_graph: bool = False,
                 qo_indptr_buf=None, kv_indptr_buf=None, custom_mask_buf=None, mask_indptr_buf=None,
                 backend: str = "auto", jit_args=None, jit_kwargs=None, variant_owns_mask: bool = False) -> None:
        _only_modelled(BatchPrefillWithRaggedKVCacheWrapper.__init__, locals(), ("float_workspace_buffer", "kv_layout"))
        self._setup(float_workspace_buffer, kv_layout)

    def plan(self, qo_indptr: torch.Tensor, kv_indptr: torch.Tensor, num_qo_heads: int, num_kv_heads: int,
             head_dim_qk: int, head_dim_vo=None, custom_mask=None, packed_custom_mask=None, causal: bool = False,
             pos_encoding_mode: str = "NONE", use_fp16_qk_reduction: bool = False, window_left: int = -1,
             logits_soft_cap=None, sm_scale=None, rope_scale=None, rope_theta=None, q_data_type="float16",
             kv_data_type=None, o_data_type=None, non_blocking: bool = True, prefix_len_ptr=None,
             token_pos_in_items_ptr=None, token_pos_in_items_len: int = 0, max_item_len_ptr=None,
             fixed_split_size=None, disable_split_kv: bool = False, seq_lens=None, seq_lens_q=None,
             max_token_per_sequence=None, max_sequence_kv=None, v_indptr=None, o_indptr=None,
             uniform_q_len=None) -> None:
        _only_modelled(BatchPrefillWithRaggedKVCacheWrapper.plan, locals(), (
            "qo_indptr", "kv_indptr", "num_qo_heads", "num_kv_heads", "head_dim_qk", "causal", "sm_scale",
            "q_data_type", "kv_data_type", "non_blocking"))
        _not_capturing(type(self).__name__)
        _int32(qo_indptr=qo_indptr, kv_indptr=kv_indptr)
        q_dtype = _dtype(q_data_type)
        self._planned(qo_indptr=_host(qo_indptr), kv_indptr=_host(kv_indptr), causal=causal,
                      scale=sm_scale or head_dim_qk**-0.5, heads=num_qo_heads, kv_heads=num_kv_heads,
                      head_dim=head_dim_qk, q_dtype=q_dtype, kv_dtype=_dtype(kv_data_type or q_dtype))
        self._buffers = {"qo_indptr": qo_indptr, "kv_indptr": kv_indptr}

    @kernel("flashinfer.ragged_prefill")
    def run(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *args, q_scale=None, k_scale=None,
            v_scale=None, o_scale=None, out=None, lse=None, return_lse: bool = False, lse_base: str = "log2",
            lse_layout: str = "NH", enable_pdl=None, kv_cache_sf=None):
        _only_modelled(BatchPrefillWithRaggedKVCacheWrapper.run, locals(), (
            "q", "k", "v", "return_lse", "lse_base", "enable_pdl"))
        if args:
            raise NotImplementedError("the flashinfer stand-in takes no custom-kernel arguments")
        self._k_for_dtype = k
        a = self._geometry(q, k.shape, int(self.plan_args["qo_indptr"][-1]))
        self._still_planned(**self._buffers)
        qo, kv = a["qo_indptr"], a["kv_indptr"]
        outs = [_attend(q[qo[b] : qo[b + 1]], k[kv[b] : kv[b + 1]], v[kv[b] : kv[b + 1]], a["causal"], a["scale"])
                for b in range(len(qo) - 1)]
        out, lse = torch.cat([o for o, _ in outs]), torch.cat([s for _, s in outs])
        return (out, _lse(lse, lse_base)) if return_lse else out


class BatchPrefillWithPagedKVCacheWrapper(_Wrapper):
    def __init__(self, float_workspace_buffer: torch.Tensor, kv_layout: str = "NHD", use_cuda_graph: bool = False,
                 qo_indptr_buf=None, paged_kv_indptr_buf=None, paged_kv_indices_buf=None,
                 paged_kv_last_page_len_buf=None, custom_mask_buf=None, mask_indptr_buf=None, backend: str = "auto",
                 jit_args=None, jit_kwargs=None, variant_owns_mask: bool = False) -> None:
        _only_modelled(BatchPrefillWithPagedKVCacheWrapper.__init__, locals(), ("float_workspace_buffer", "kv_layout"))
        self._setup(float_workspace_buffer, kv_layout)

    def plan(self, qo_indptr: torch.Tensor, paged_kv_indptr: torch.Tensor, paged_kv_indices: torch.Tensor,
             paged_kv_last_page_len: torch.Tensor, num_qo_heads: int, num_kv_heads: int, head_dim_qk: int,
             page_size: int, head_dim_vo=None, custom_mask=None, packed_custom_mask=None, causal: bool = False,
             pos_encoding_mode: str = "NONE", use_fp16_qk_reduction: bool = False, sm_scale=None,
             window_left: int = -1, logits_soft_cap=None, rope_scale=None, rope_theta=None, q_data_type="float16",
             kv_data_type=None, o_data_type=None, non_blocking: bool = True, prefix_len_ptr=None,
             token_pos_in_items_ptr=None, token_pos_in_items_len: int = 0, max_item_len_ptr=None, seq_lens=None,
             seq_lens_q=None, block_tables=None, max_token_per_sequence=None, max_sequence_kv=None,
             fixed_split_size=None, disable_split_kv: bool = False, uniform_q_len=None) -> None:
        _only_modelled(BatchPrefillWithPagedKVCacheWrapper.plan, locals(), (
            "qo_indptr", "paged_kv_indptr", "paged_kv_indices", "paged_kv_last_page_len", "num_qo_heads",
            "num_kv_heads", "head_dim_qk", "page_size", "causal", "sm_scale", "q_data_type", "kv_data_type",
            "non_blocking"))
        _not_capturing(type(self).__name__)
        _int32(qo_indptr=qo_indptr, paged_kv_indptr=paged_kv_indptr, paged_kv_indices=paged_kv_indices,
               paged_kv_last_page_len=paged_kv_last_page_len)
        q_dtype = _dtype(q_data_type)
        self._planned(qo_indptr=_host(qo_indptr), indptr=_host(paged_kv_indptr), indices=_host(paged_kv_indices),
                      last=_host(paged_kv_last_page_len), causal=causal,
                      scale=sm_scale or head_dim_qk**-0.5, heads=num_qo_heads, kv_heads=num_kv_heads,
                      head_dim=head_dim_qk, page_size=page_size, q_dtype=q_dtype,
                      kv_dtype=_dtype(kv_data_type or q_dtype))
        self._buffers = {"qo_indptr": qo_indptr, "indptr": paged_kv_indptr, "indices": paged_kv_indices,
                         "last": paged_kv_last_page_len}

    @kernel("flashinfer.paged_prefill")
    def run(self, q: torch.Tensor, paged_kv_cache, *args, q_scale=None, k_scale=None, v_scale=None, out=None,
            lse=None, return_lse: bool = False, lse_base: str = "log2", lse_layout: str = "NH", enable_pdl=None,
            window_left=None, sinks=None, kv_cache_sf=None, skip_softmax_threshold_scale_factor=None,
            use_fp16_softmax=None, uses_spcompress=None):
        _only_modelled(BatchPrefillWithPagedKVCacheWrapper.run, locals(), (
            "q", "paged_kv_cache", "k_scale", "v_scale", "return_lse", "lse_base", "enable_pdl"))
        if args:
            raise NotImplementedError("the flashinfer stand-in takes no custom-kernel arguments")
        k_cache, v_cache = self._paged(paged_kv_cache, "indptr")
        a = self._geometry(q, k_cache.shape, int(self.plan_args["qo_indptr"][-1]))
        self._still_planned(**self._buffers)
        qo, outs = a["qo_indptr"], []
        for b in range(len(qo) - 1):
            k = _scaled(_request_tokens(k_cache, a["indptr"], a["indices"], a["last"], b), k_scale)
            v = _scaled(_request_tokens(v_cache, a["indptr"], a["indices"], a["last"], b), v_scale)
            outs.append(_attend(q[qo[b] : qo[b + 1]], k, v, a["causal"], a["scale"]))
        out, lse = torch.cat([o for o, _ in outs]), torch.cat([s for _, s in outs])
        return (out, _lse(lse, lse_base)) if return_lse else out


class BatchDecodeWithPagedKVCacheWrapper(_Wrapper):
    def __init__(self, float_workspace_buffer: torch.Tensor, kv_layout: str = "NHD", use_cuda_graph: bool = False,
                 use_tensor_cores: bool = False, paged_kv_indptr_buffer=None, paged_kv_indices_buffer=None,
                 paged_kv_last_page_len_buffer=None, backend: str = "auto", jit_args=None) -> None:
        _only_modelled(BatchDecodeWithPagedKVCacheWrapper.__init__, locals(), (
            "float_workspace_buffer", "kv_layout", "use_cuda_graph", "use_tensor_cores", "paged_kv_indptr_buffer",
            "paged_kv_indices_buffer", "paged_kv_last_page_len_buffer"))
        self._setup(float_workspace_buffer, kv_layout)
        self.use_tensor_cores = use_tensor_cores
        self.is_cuda_graph_enabled = use_cuda_graph
        if use_cuda_graph:
            for name, buffer in (("paged_kv_indptr_buffer", paged_kv_indptr_buffer),
                                 ("paged_kv_indices_buffer", paged_kv_indices_buffer),
                                 ("paged_kv_last_page_len_buffer", paged_kv_last_page_len_buffer)):
                if not torch.is_tensor(buffer):
                    raise ValueError(f"{name} should be a torch.Tensor in cudagraph mode")
            self._fixed_batch_size = len(paged_kv_last_page_len_buffer)
            if len(paged_kv_indptr_buffer) != self._fixed_batch_size + 1:
                raise ValueError("The size of paged_kv_indptr_buffer should be batch_size + 1")
        self._buffers = {"indptr": paged_kv_indptr_buffer, "indices": paged_kv_indices_buffer,
                         "last": paged_kv_last_page_len_buffer}

    def plan(self, indptr: torch.Tensor, indices: torch.Tensor, last_page_len: torch.Tensor, num_qo_heads: int,
             num_kv_heads: int, head_dim: int, page_size: int, *deprecated_positional_args, **kwargs) -> None:
        if deprecated_positional_args:
            raise TypeError("plan(): optional arguments after page_size are deprecated positionally in flashinfer "
                            f"{VERSION}; pass them by keyword")
        self._plan_impl(indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size, **kwargs)

    def _plan_impl(self, indptr: torch.Tensor, indices: torch.Tensor, last_page_len: torch.Tensor,
                   num_qo_heads: int, num_kv_heads: int, head_dim: int, page_size: int, *,
                   pos_encoding_mode: str = "NONE", window_left: int = -1, window_right: int = 0,
                   logits_soft_cap=None, q_data_type="float16", kv_data_type=None, o_data_type=None,
                   data_type=None, sm_scale=None, rope_scale=None, rope_theta=None, non_blocking: bool = True,
                   block_tables=None, seq_lens=None, fixed_split_size=None, disable_split_kv: bool = False,
                   q_len_per_req: int = 1, is_causal=None) -> None:
        _only_modelled(BatchDecodeWithPagedKVCacheWrapper._plan_impl, locals(), (
            "indptr", "indices", "last_page_len", "num_qo_heads", "num_kv_heads", "head_dim", "page_size",
            "q_data_type", "kv_data_type", "sm_scale", "non_blocking"))
        _not_capturing(type(self).__name__)
        _int32(indptr=indptr, indices=indices, last_page_len=last_page_len)
        if num_qo_heads % num_kv_heads:
            raise ValueError(f"num_qo_heads {num_qo_heads} is not a multiple of num_kv_heads {num_kv_heads}")
        batch_size = len(last_page_len)
        if self.is_cuda_graph_enabled:
            if batch_size != self._fixed_batch_size:
                raise ValueError(f"The batch size should be fixed in cudagraph mode, the runtime batch size "
                                 f"{batch_size}  mismatches the batch size set during initialization "
                                 f"{self._fixed_batch_size}")
            if len(indices) > len(self._buffers["indices"]):
                raise ValueError("The size of indices should be less than or equal to the allocated buffer")
            self._buffers["indptr"].copy_(indptr)
            self._buffers["last"].copy_(last_page_len)
            self._buffers["indices"][: len(indices)].copy_(indices)
        else:
            self._buffers = {"indptr": indptr, "indices": indices, "last": last_page_len}
        q_dtype = _dtype(q_data_type)
        self._planned(indptr=_host(indptr), indices=_host(indices), last=_host(last_page_len),
                      scale=sm_scale or head_dim**-0.5, heads=num_qo_heads, kv_heads=num_kv_heads, head_dim=head_dim,
                      page_size=page_size, q_dtype=q_dtype, kv_dtype=_dtype(kv_data_type or q_dtype),
                      batch_size=batch_size)

    @kernel("flashinfer.decode")
    def run(self, q: torch.Tensor, paged_kv_cache, *args, q_scale=None, k_scale=None, v_scale=None, out=None,
            lse=None, return_lse: bool = False, enable_pdl=None, window_left=None, sinks=None, q_len_per_req=None,
            skip_softmax_threshold_scale_factor=None, kv_cache_sf=None):
        _only_modelled(BatchDecodeWithPagedKVCacheWrapper.run, locals(), (
            "q", "paged_kv_cache", "k_scale", "v_scale", "return_lse", "enable_pdl"))
        if args:
            raise NotImplementedError("the flashinfer stand-in takes no custom-kernel arguments")
        k_cache, v_cache = self._paged(paged_kv_cache, "indptr")
        a = self._geometry(q, k_cache.shape, self.plan_args["batch_size"])
        self._still_planned(**self._buffers)
        outs = [_attend(q[b : b + 1], _scaled(_request_tokens(k_cache, a["indptr"], a["indices"], a["last"], b),
                                              k_scale),
                        _scaled(_request_tokens(v_cache, a["indptr"], a["indices"], a["last"], b), v_scale), False,
                        a["scale"])
                for b in range(q.shape[0])]
        out, lse = torch.cat([o for o, _ in outs]), torch.cat([s for _, s in outs])
        return (out, _lse(lse, "log2")) if return_lse else out


@kernel("flashinfer.merge_state")
def merge_state(v_a: torch.Tensor, s_a: torch.Tensor, v_b: torch.Tensor, s_b: torch.Tensor):
    """FlashInfer's merge of two attention states whose log-sum-exps are base 2."""
    s_a, s_b = s_a.float(), s_b.float()
    top = torch.maximum(s_a, s_b)
    w_a, w_b = torch.exp2(s_a - top), torch.exp2(s_b - top)
    merged = (v_a.float() * w_a[..., None] + v_b.float() * w_b[..., None]) / (w_a + w_b)[..., None]
    return merged.to(v_a.dtype), top + torch.log2(w_a + w_b)


WRAPPERS = (BatchPrefillWithRaggedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper,
            BatchDecodeWithPagedKVCacheWrapper)


def install(monkeypatch) -> types.ModuleType:
    """Put the stand-in at `flashinfer` / `flashinfer.cascade` for one test (each wrapper class counts its plans)."""
    module = types.ModuleType("flashinfer")
    module.__version__ = VERSION
    for cls in WRAPPERS:
        setattr(module, cls.__name__, type(cls.__name__, (cls,), {"plans": 0}))
    cascade = types.ModuleType("flashinfer.cascade")
    cascade.merge_state = merge_state
    module.cascade = cascade
    monkeypatch.setitem(sys.modules, "flashinfer", module)
    monkeypatch.setitem(sys.modules, "flashinfer.cascade", cascade)
    return module


def real_flashinfer_missing() -> str | None:
    """Why the real FlashInfer cannot run here (a skip reason), or None when it can."""
    import importlib.util
    from pathlib import Path

    if not torch.cuda.is_available():
        return "needs CUDA"
    if importlib.util.find_spec("flashinfer") is None:
        return "needs flashinfer (`make test` installs the gpu extra where an NVIDIA driver is)"
    from flashinfer.jit.cpp_ext import get_cuda_path

    try:
        nvcc = Path(get_cuda_path()) / "bin" / "nvcc"
    except RuntimeError as exc:
        return f"flashinfer JIT-compiles its kernels with nvcc: {exc}"
    return None if nvcc.exists() else f"flashinfer JIT-compiles its kernels with nvcc, not found at {nvcc}"
