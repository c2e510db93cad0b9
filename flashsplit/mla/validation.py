"""Validation of :func:`flashsplit.mla_decode`'s arguments: the one place they are checked.

:func:`check_mla_inputs` builds the :class:`~flashsplit.mla.problem.MlaProblem` of a call; the
plan and the backends rely on its shapes, dtypes and devices. ``TypeError`` for a wrong type or
dtype, ``ValueError`` for a wrong shape, layout, device or range, each naming the argument, what
was expected and what was given. No check reads tensor values: nothing here synchronizes.
"""

from __future__ import annotations

import torch

from ..problem import SUPPORTED_DTYPES
from ..target import device_target
from ..validation import (_check_block_table, _check_cpu_dtype, _check_row_index, _require_distinct_elements, _require_last_dim_contiguous,
                          _require_rank, _require_tensor, _shape, check_num_splits, check_softmax_scale)
from .problem import MLA_FP8_TOKEN_BYTES, MLA_HEAD_DIM, MLA_HEAD_DIM_V, MLA_MAX_SEQLEN_Q, MlaProblem

#: The fp8 latent cache format (with one fp32 ``kv_descale`` for the whole cache).
MLA_FP8_DTYPE = torch.float8_e4m3fn


def _require_bool(name: str, value) -> bool:
    if value is not True and value is not False:
        raise TypeError(f"{name}: expected a bool, got {type(value).__name__} {value!r}")
    return value


def _check_q(q) -> tuple[int, int, int]:
    _require_tensor("q", q)
    if q.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"q: expected dtype float16 or bfloat16, got {q.dtype}")
    _require_rank("q", q, 4, "[batch, seqlen_q, num_heads_q, 576]")
    batch, seqlen_q, num_heads_q, head_dim = q.shape
    if head_dim != MLA_HEAD_DIM:
        raise ValueError(f"q: expected head_dim (dim 3) {MLA_HEAD_DIM} (512 latent + 64 rotary features), "
                         f"got {head_dim}")
    if not 1 <= seqlen_q <= MLA_MAX_SEQLEN_Q:
        raise ValueError(f"q: expected seqlen_q (dim 1) in 1..{MLA_MAX_SEQLEN_Q}, got {seqlen_q}")
    if num_heads_q < 1:
        raise ValueError(f"q: expected num_heads_q (dim 2) >= 1, got {num_heads_q}")
    _require_last_dim_contiguous("q", q)
    return batch, seqlen_q, num_heads_q


def _check_cache(kv_cache, q: torch.Tensor) -> None:
    _require_tensor("kv_cache", kv_cache)
    if kv_cache.dtype != q.dtype and kv_cache.dtype != MLA_FP8_DTYPE:
        raise TypeError(f"kv_cache: expected q's dtype {q.dtype} or {MLA_FP8_DTYPE} (with kv_descale), "
                        f"got {kv_cache.dtype}")
    _require_rank("kv_cache", kv_cache, 4, "[batch, seqlen_k, 1, 576] or paged [num_pages, page_size, 1, 576]")
    if kv_cache.shape[2] != 1:
        raise ValueError(f"kv_cache: expected one latent KV head (dim 2 == 1), got shape {_shape(kv_cache)}")
    if kv_cache.shape[3] == MLA_FP8_TOKEN_BYTES and kv_cache.dtype == MLA_FP8_DTYPE:
        # FlashMLA's fp8 tokens: the kernel reads their scales as fp32 and rotary part as 16-bit words
        if any(stride % 4 for stride in kv_cache.stride()[:-1] if stride) or kv_cache.data_ptr() % 4:
            raise ValueError(f"kv_cache: 656-byte fp8 tokens need 4-byte aligned rows, got strides "
                             f"{tuple(kv_cache.stride())}")
    elif kv_cache.shape[3] != MLA_HEAD_DIM:
        raise ValueError(f"kv_cache: expected head_dim (dim 3) {MLA_HEAD_DIM}, or {MLA_FP8_TOKEN_BYTES} bytes of "
                         f"FlashMLA's fp8 tokens ({MLA_FP8_DTYPE}), got shape {_shape(kv_cache)} {kv_cache.dtype}")
    if kv_cache.device != q.device:
        raise ValueError(f"kv_cache: expected q's device {q.device}, got {kv_cache.device}")
    _require_last_dim_contiguous("kv_cache", kv_cache)


def _check_seqlens(cache_seqlens, batch: int, device) -> None:
    if cache_seqlens is None:
        raise ValueError(f"cache_seqlens: required, an int32 tensor [{batch}] of each row's live keys")
    _check_row_index("cache_seqlens", cache_seqlens, batch, device)


def _check_layout(kv_cache: torch.Tensor, block_table, batch: int, device) -> tuple[int, int]:
    """(capacity, page size) of the cache; page size 0 for a dense one."""
    if block_table is None:
        if kv_cache.shape[0] != batch:
            raise ValueError(f"kv_cache: a dense cache (no block_table) expected shape [{batch}, seqlen_k, 1, "
                             f"{MLA_HEAD_DIM}], got {_shape(kv_cache)}")
        return kv_cache.shape[1], 0
    return _check_block_table(block_table, kv_cache, batch, device, cache_name="kv_cache")


def _check_descale(kv_descale, fp8: bool, device) -> None:
    if kv_descale is None:
        if fp8:
            raise ValueError("kv_descale: required for an fp8 cache: a float32 tensor of one element")
        return
    if not fp8:
        raise ValueError("kv_descale: only for an fp8 (float8_e4m3fn) cache; the cache is in q's dtype")
    _require_tensor("kv_descale", kv_descale)
    if kv_descale.dtype != torch.float32:
        raise TypeError(f"kv_descale: expected dtype float32, got {kv_descale.dtype}")
    if kv_descale.numel() != 1:
        raise ValueError(f"kv_descale: expected one element (a per-tensor scale), got shape {_shape(kv_descale)}")
    if kv_descale.device != device:
        raise ValueError(f"kv_descale: expected q's device {device}, got {kv_descale.device}")


def check_out(name: str, out, shape: tuple[int, ...], dtype: torch.dtype, device) -> None:
    """A caller's output tensor: ``shape``, ``dtype``, ``device``, last dim contiguous, elements distinct."""
    _require_tensor(name, out)
    if out.dtype != dtype:
        raise TypeError(f"{name}: expected dtype {dtype}, got {out.dtype}")
    if tuple(out.shape) != shape:
        raise ValueError(f"{name}: expected shape {list(shape)}, got {_shape(out)}")
    if out.device != device:
        raise ValueError(f"{name}: expected q's device {device}, got {out.device}")
    _require_last_dim_contiguous(name, out)
    _require_distinct_elements(name, out)


def check_mla_inputs(q, kv_cache, cache_seqlens, block_table=None, *, head_dim_v=MLA_HEAD_DIM_V,
                     softmax_scale=None, causal=False, num_splits=0, out=None, backend="auto",
                     kv_descale=None) -> tuple[MlaProblem, float]:
    """``(problem, softmax_scale)`` for :func:`flashsplit.mla_decode`'s arguments (see there)."""
    batch, seqlen_q, num_heads_q = _check_q(q)
    if isinstance(head_dim_v, bool) or not isinstance(head_dim_v, int):
        raise TypeError(f"head_dim_v: expected an int, got {type(head_dim_v).__name__}")
    if head_dim_v != MLA_HEAD_DIM_V:
        raise ValueError(f"head_dim_v: expected {MLA_HEAD_DIM_V} (V is the first 512 features of the cache), "
                         f"got {head_dim_v}")
    _check_cache(kv_cache, q)
    _check_cpu_dtype("q", q)
    _check_seqlens(cache_seqlens, batch, q.device)
    capacity, page_size = _check_layout(kv_cache, block_table, batch, q.device)
    fp8_tokens = kv_cache.shape[3] == MLA_FP8_TOKEN_BYTES
    if fp8_tokens and kv_descale is not None:
        raise ValueError("kv_descale: 656-byte fp8 tokens carry their own scales; expected None")
    _check_descale(kv_descale, kv_cache.dtype == MLA_FP8_DTYPE and not fp8_tokens, q.device)
    scale = check_softmax_scale(softmax_scale, MLA_HEAD_DIM)
    _require_bool("causal", causal)
    check_num_splits(num_splits)
    if out is not None:
        check_out("out", out, (batch, seqlen_q, num_heads_q, MLA_HEAD_DIM_V), q.dtype, q.device)
    if not isinstance(backend, str):
        raise TypeError(f"backend: expected a str, got {type(backend).__name__}")
    problem = MlaProblem(batch=batch, seqlen_q=seqlen_q, num_heads_q=num_heads_q, dtype=q.dtype,
                         kv_dtype=kv_cache.dtype, page_size=page_size, capacity=capacity, causal=causal,
                         num_splits=num_splits, device_type=q.device.type, fp8_tokens=fp8_tokens,
                         gpu=device_target(q.device.index) if q.is_cuda else None)
    return problem, scale
