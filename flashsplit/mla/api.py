"""The public MLA API: ``mla_decode``, ``mla_plan`` and FlashMLA's drop-in pair
``get_mla_metadata`` / ``flash_mla_with_kvcache``."""

from __future__ import annotations

import dataclasses
import functools

import torch

from ..plan import MAX_SPLITS, SplitPlan
from ..problem import SUPPORTED_DTYPES
from ..target import GpuTarget, device_target, gpu_target
from . import backends  # noqa: F401  (registers the MLA backends)
from .plan import make_mla_plan, mla_num_splits
from .problem import MLA_FP8_TOKEN_BYTES, MLA_HEAD_DIM_V, MLA_MAX_SEQLEN_Q, MlaProblem
from .registry import select
from .validation import MLA_FP8_DTYPE, _require_bool, check_mla_inputs


def mla_decode(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    cache_seqlens: torch.Tensor,
    *,
    block_table: torch.Tensor | None = None,
    head_dim_v: int = MLA_HEAD_DIM_V,
    softmax_scale: float | None = None,
    causal: bool = False,
    num_splits: int = 0,
    return_lse: bool = False,
    out: torch.Tensor | None = None,
    backend: str = "auto",
    kv_descale: torch.Tensor | None = None,
):
    """Multi-head latent attention decode (DeepSeek-V3 family): every q head attends one shared
    latent KV head of 576 features; V is each key's first 512 features.

    Args:
        q: ``[B, s_q, H_q, 576]`` float16 or bfloat16, last dim contiguous; ``s_q`` in 1..4
            (several tokens for multi-token prediction or speculative decoding), any ``H_q >= 1``.
        kv_cache: the latent cache, q's dtype or ``float8_e4m3fn`` (then ``kv_descale``), last dim
            contiguous: dense ``[B, L, 1, 576]``, or paged ``[num_pages, page_size, 1, 576]``
            with ``block_table`` (any page size >= 1). A ``float8_e4m3fn`` cache 656 wide holds
            FlashMLA's fp8 tokens (DeepSeek-V3.2): 512 e4m3 latent values, 4 fp32 scales (one
            per 128 of them), 64 rotary values in q's dtype, rows 4-byte aligned.
        cache_seqlens: int32 ``[B]`` on q's device, contiguous: live keys of each row. Slots
            past a row's length are never read (they may hold NaN). Values outside ``[0,
            capacity]`` are clamped into it on the device.
        block_table: int32 ``[B, max_pages_per_row]``, last dim contiguous: key ``n`` of row
            ``b`` lives in page ``block_table[b, n // page_size]``; entries past a row's last
            page are never read; an id outside the cache is clamped into it.
        head_dim_v: 512 (FlashMLA's argument; the only value).
        softmax_scale: defaults to ``576 ** -0.5``, as FlashMLA's.
        causal: for ``s_q > 1``, query ``i`` sees keys ``[0, seqlen - s_q + i]`` (bottom-right
            aligned); a no-op at ``s_q = 1``.
        num_splits: 0 picks by the shared plan (see :func:`mla_plan`); ``n`` in 1..256 uses
            exactly ``n`` splits.
        return_lse: also return the log-sum-exp.
        out: optional ``[B, s_q, H_q, 512]`` output in q's dtype, last dim contiguous.
        backend: ``"auto"``, ``"triton"`` or ``"cute"``.
        kv_descale: float32, one element, for an fp8 cache: keys and values are the cache's
            values times it.

    Returns:
        ``out`` ``[B, s_q, H_q, 512]`` in q's dtype, and with ``return_lse`` ``lse`` fp32 ``[B,
        H_q, s_q]``, natural log of the scaled scores' sum of exponentials. A query that sees no
        key (a row of 0 keys, or a causal query before the row's first key) gets ``out = 0``
        and ``lse = -inf`` (:func:`flash_mla_with_kvcache` returns FlashMLA's ``+inf``).

    Never synchronizes with the host: capturable in a CUDA graph, and the split count depends
    on shapes only, so one graph serves any ``cache_seqlens``.
    """
    _require_bool("return_lse", return_lse)
    problem, scale = check_mla_inputs(q, kv_cache, cache_seqlens, block_table, head_dim_v=head_dim_v,
                                      softmax_scale=softmax_scale, causal=causal, num_splits=num_splits, out=out,
                                      backend=backend, kv_descale=kv_descale)
    batch, seqlen_q, num_heads_q, _ = q.shape
    if out is None:
        out = torch.empty((batch, seqlen_q, num_heads_q, MLA_HEAD_DIM_V), dtype=q.dtype, device=q.device)
    lse = torch.empty((batch, num_heads_q, seqlen_q), dtype=torch.float32, device=q.device) if return_lse else None
    if out.numel() > 0:
        chosen, splits = _prepared(problem, backend)
        chosen.run(q, kv_cache, cache_seqlens, block_table, out, lse, num_splits=splits, softmax_scale=scale,
                   causal=causal, kv_descale=kv_descale)
    return (out, lse) if return_lse else out


@functools.lru_cache(maxsize=1024)  # static facts only: a decode loop plans once
def _prepared(problem: MlaProblem, backend: str):
    chosen = select(problem, backend)[0]
    return chosen, mla_num_splits(problem, chosen.block_m(problem), chosen.units_per_sm(problem))[0]


def mla_plan(
    batch: int,
    seqlen_k: int,
    num_heads_q: int,
    *,
    seqlen_q: int = 1,
    dtype: torch.dtype = torch.bfloat16,
    kv_dtype: torch.dtype | None = None,
    page_size: int = 0,
    causal: bool = False,
    num_splits: int = 0,
    device: str | torch.device = "cuda",
    backend: str = "auto",
    gpu: str | GpuTarget | None = None,
    num_sms: int | None = None,
) -> SplitPlan:
    """What :func:`mla_decode` will do for these shapes, in pure Python (no GPU needed):
    the backend, the rule that chose it, and the split count with its reason (memory- or
    compute-bound, :mod:`flashsplit.mla.plan`).

    ``seqlen_k`` is the capacity (``L``, or ``max_pages_per_row * page_size`` with
    ``page_size``); ``kv_dtype`` ``torch.float8_e4m3fn`` for an fp8 cache. ``gpu`` plans for a
    named GPU (``"h100"``, ``"h200"``, ...); by default the current CUDA device, or an H200.

    >>> p = mla_plan(4, 16384, 16, page_size=64, gpu="h100", backend="triton")
    >>> p.num_splits, p.grid
    (64, (64, 4, 1))
    >>> mla_plan(32, 4096, 128, page_size=64, gpu="h100", backend="triton").num_splits   # compute-bound
    1
    """
    for name, value, least in (("batch", batch, 0), ("seqlen_k", seqlen_k, 0), ("num_heads_q", num_heads_q, 1),
                               ("seqlen_q", seqlen_q, 1), ("page_size", page_size, 0), ("num_splits", num_splits, 0)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name}: expected an int, got {type(value).__name__}")
        if value < least:
            raise ValueError(f"{name}: expected >= {least}, got {value}")
    if seqlen_q > MLA_MAX_SEQLEN_Q:
        raise ValueError(f"seqlen_q: expected 1..{MLA_MAX_SEQLEN_Q}, got {seqlen_q}")
    if num_splits > MAX_SPLITS:
        raise ValueError(f"num_splits: expected 0 (heuristic) or 1..{MAX_SPLITS}, got {num_splits}")
    if page_size and seqlen_k % page_size:
        raise ValueError(f"seqlen_k: expected a multiple of page_size {page_size}, got {seqlen_k}")
    if dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"dtype: expected torch.float16 or torch.bfloat16, got {dtype}")
    if kv_dtype not in (None, dtype, MLA_FP8_DTYPE):
        raise TypeError(f"kv_dtype: expected None, dtype or {MLA_FP8_DTYPE}, got {kv_dtype}")
    _require_bool("causal", causal)
    device = torch.device(device)
    target = None
    if device.type == "cuda":
        target = gpu_target(gpu) if gpu is not None else device_target(device.index)
        if num_sms is not None:
            target = dataclasses.replace(target, num_sms=num_sms)
    elif gpu is not None:
        raise ValueError(f"gpu: only for device='cuda', got device={str(device)!r}")
    problem = MlaProblem(batch=batch, seqlen_q=seqlen_q, num_heads_q=num_heads_q, dtype=dtype,
                         kv_dtype=kv_dtype or dtype, page_size=page_size, capacity=seqlen_k, causal=causal,
                         num_splits=num_splits, device_type=device.type, gpu=target)
    chosen, rule, reason = select(problem, backend)
    return make_mla_plan(problem, chosen, rule, reason)


@dataclasses.dataclass
class MlaMetadata:
    """What :func:`get_mla_metadata` returns: the shapes of the first
    :func:`flash_mla_with_kvcache` call made with it, which later calls must match (FlashMLA's
    rule for its scheduler metadata). flashsplit plans from static shapes, so nothing here
    depends on ``cache_seqlens``: one object serves any lengths."""

    config: tuple | None = None


def get_mla_metadata(*args, **kwargs) -> tuple[MlaMetadata, None]:
    """FlashMLA's ``get_mla_metadata``: ``(metadata, None)``; the arguments (its old interface's
    ``cache_seqlens``, heads per KV head, ...) are accepted and not needed."""
    return MlaMetadata(), None


def flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata,
                           num_splits=None, softmax_scale=None, causal=False, is_fp8_kvcache=False):
    """FlashMLA's dense-mode ``flash_mla_with_kvcache``, on flashsplit: ``(out, lse)``.

    q ``[B, s_q, H_q, 576]``, ``k_cache`` ``[num_pages, page_size, 1, 576]`` (any page size)
    with ``block_table`` int32 ``[B, max_pages]`` (or None for a dense ``[B, L, 1, 576]``
    cache), ``cache_seqlens`` int32 ``[B]``, ``head_dim_v`` 512, ``tile_scheduler_metadata``
    from :func:`get_mla_metadata`, ``num_splits`` None (the plan picks; :func:`mla_decode`
    takes a count). Returns out ``[B, s_q, H_q, 512]`` and lse fp32 ``[B, H_q, s_q]``; a query
    that sees no key gets ``out = 0`` and, as FlashMLA, ``lse = +inf``. ``is_fp8_kvcache``: the
    cache holds FlashMLA's 656-byte fp8 tokens (DeepSeek-V3.2: ``float8_e4m3fn [..., 1, 656]``,
    512 e4m3 latent values, 4 fp32 scales of 128 values each, 64 rotary values in q's dtype); an
    e4m3 cache with one per-tensor scale runs through :func:`mla_decode` with ``kv_descale``.
    """
    if not isinstance(tile_scheduler_metadata, MlaMetadata):
        raise TypeError(f"tile_scheduler_metadata: expected what flashsplit.get_mla_metadata() returns, got "
                        f"{type(tile_scheduler_metadata).__name__}")
    if num_splits is not None:
        raise ValueError(f"num_splits: expected None (the plan picks; mla_decode(num_splits=n) fixes a count), "
                         f"got {type(num_splits).__name__}")
    _require_bool("is_fp8_kvcache", is_fp8_kvcache)
    if isinstance(k_cache, torch.Tensor) and k_cache.dim() == 4:
        tokens = k_cache.shape[-1] == MLA_FP8_TOKEN_BYTES and k_cache.dtype == MLA_FP8_DTYPE
        if is_fp8_kvcache != tokens:
            raise ValueError(f"is_fp8_kvcache: {is_fp8_kvcache}, but k_cache is {k_cache.dtype} of width "
                             f"{k_cache.shape[-1]}; is_fp8_kvcache=True goes with {MLA_FP8_TOKEN_BYTES}-byte "
                             f"{MLA_FP8_DTYPE} tokens, False with 576 values in q's dtype")
    if isinstance(q, torch.Tensor) and isinstance(k_cache, torch.Tensor) and q.dim() == 4 and k_cache.dim() == 4:
        config = (*q.shape[:3], k_cache.shape[1], k_cache.shape[2], causal)
        if tile_scheduler_metadata.config is None:
            tile_scheduler_metadata.config = config
        elif tile_scheduler_metadata.config != config:
            raise ValueError(f"tile_scheduler_metadata: made for (batch, seqlen_q, num_heads_q, page_size, "
                             f"num_heads_k, causal) = {tile_scheduler_metadata.config}, called with {config}; "
                             f"use one metadata object per configuration")
    try:
        out, lse = mla_decode(q, k_cache, cache_seqlens, block_table=block_table, head_dim_v=head_dim_v,
                              softmax_scale=softmax_scale, causal=causal, return_lse=True)
    except (TypeError, ValueError) as error:  # name the argument as this signature does
        message = str(error)
        if message.startswith("kv_cache:"):
            raise type(error)("k_cache:" + message[len("kv_cache:"):]) from None
        raise
    return out, lse.masked_fill_(lse == float("-inf"), float("inf"))
