"""Launch the MLA split kernel: validate, compile once per key, pass addresses, sizes, strides.

:func:`mla_split_forward` writes the fp32 partials of every split of an MLA decode (one shared
576-feature latent KV head, V its first 512 features); a combine merges them. It reads no tensor
values on the host (the split boundaries come from ``cache_seqlens`` on the device), so it can
be captured in a CUDA graph. cutlass is imported on first use.
"""

from __future__ import annotations

import math
import threading

import torch

from .launch_args import Arg, cute_args
from .mla_configs import HEAD_DIM, HEAD_DIM_V, MLAConfig, mla_supports

#: ``MLASplitKernel.__call__``'s arguments (element roles: "q" q's dtype, "kv" the cache's).
MLA_ARGS: tuple[Arg, ...] = (
    Arg("q_ptr", "ptr", "q"), Arg("kv_ptr", "ptr", "kv"), Arg("o_ptr", "ptr", "float32", 16),
    Arg("lse_ptr", "ptr", "float32", 4), Arg("seqlens_ptr", "ptr", "int32", 4),
    Arg("block_table_ptr", "ptr", "int32", 4),
    *(Arg(n, "i32") for n in ("batch", "seqlen_q", "num_heads", "num_splits", "cache_rows", "cache_len",
                              "capacity", "max_pages")),
    *(Arg(n, "i64") for n in ("block_table_stride_b", "q_stride_b", "q_stride_l", "q_stride_h", "kv_stride_b",
                              "kv_stride_l", "o_stride_s", "o_stride_b", "o_stride_l", "o_stride_h", "lse_stride_s",
                              "lse_stride_b", "lse_stride_h", "lse_stride_l")),
    Arg("softmax_scale_log2", "f32"), Arg("descale_ptr", "ptr", "float32", 4), Arg("descale_stride_b", "i64"),
    Arg("stream", "stream"),
)

_CACHE: dict[MLAConfig, object] = {}
_LOCK = threading.Lock()
_DTYPE_NAMES = {torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float8_e4m3fn: "float8_e4m3fn"}
_ONES: dict[torch.device, torch.Tensor] = {}  # the descale of an fp8 cache given none


def compile_mla(config: MLAConfig, options: str | None = None):
    """The compiled MLA split kernel for ``config``, cached per key (``options``, e.g. PTX dumps
    for the compile check, build a one-off)."""
    if options is None and config in _CACHE:
        return _CACHE[config]
    import cutlass.cute as cute

    from .mla_kernel import MLASplitKernel

    args = cute_args(MLA_ARGS, _elements(config))
    if options:
        return cute.compile(MLASplitKernel(config), *args, options=options)
    compiled = cute.compile(MLASplitKernel(config), *args)
    with _LOCK:
        _CACHE[config] = compiled
    return compiled


def _elements(config: MLAConfig) -> dict[str, str]:
    return {"q": config.dtype, "kv": config.dtype if config.kv_dtype == "same" else config.kv_dtype}


def mla_compile_cache_size() -> int:
    """How many MLA kernels are compiled (new shapes must not add any)."""
    return len(_CACHE)


def _check(cond: bool, name: str, expected: str, got) -> None:
    if not cond:
        raise ValueError(f"{name}: expected {expected}, got {got}")


def mla_split_forward(q, kv_cache, cache_seqlens, block_table, out_partial, lse_partial, *, softmax_scale, causal,
                      num_splits, kv_descale=None) -> None:
    """Every split's fp32 partials of MLA decode on a Hopper GPU.

    q ``[B, s_q, H_q, 576]`` (fp16/bf16, 16-byte aligned, last dim contiguous); ``kv_cache`` of
    q's dtype, paged ``[num_pages, page, 1, 576]`` (``block_table`` int32 ``[B, max_pages]``,
    page a multiple of 64) or dense ``[B, L, 1, 576]`` (``block_table`` None); ``cache_seqlens``
    int32 ``[B]`` (clamped to the capacity on the device). Split ``s`` of row ``b`` covers keys
    ``[s * T, min((s + 1) * T, n))``, ``T = flashsplit.plan.tokens_per_split(n, num_splits)``;
    ``causal``: query token ``i`` sees keys ``< n - s_q + 1 + i``. Writes ``out_partial`` fp32
    ``[num_splits, B, s_q, H_q, 512]`` (zeros where a row saw no key of the split) and
    ``lse_partial`` fp32 ``[num_splits, B, H_q, s_q]`` (natural log, -inf where a row saw no
    key). An e4m3 cache (``torch.float8_e4m3fn``) holds values times ``1 / kv_descale``: fp32
    on q's device, one element or one per batch row (``[B]`` or ``[B, 1]``, any stride; None:
    1); a 16-bit cache takes none.
    """
    _check(q.dim() == 4, "q", "[B, s_q, H_q, 576]", tuple(q.shape))
    batch, seqlen_q, num_heads, head_dim = q.shape
    paged = block_table is not None
    _check(kv_cache.dim() == 4 and kv_cache.shape[2] == 1, "kv_cache", "[rows, slots, 1, 576]", tuple(kv_cache.shape))
    reason = mla_supports(dtype=_DTYPE_NAMES.get(q.dtype, str(q.dtype)),
                          kv_dtype=_DTYPE_NAMES.get(kv_cache.dtype, str(kv_cache.dtype)), head_dim=head_dim,
                          head_dim_v=out_partial.shape[-1], num_heads_q=num_heads, seqlen_q=seqlen_q, paged=paged,
                          page_size=kv_cache.shape[1])
    if reason is not None:
        raise ValueError(f"q, kv_cache: {reason}")
    fp8 = kv_cache.dtype == torch.float8_e4m3fn
    if kv_descale is not None:
        _check(fp8, "kv_descale", "None for a 16-bit cache", "a tensor")
        _check(isinstance(kv_descale, torch.Tensor) and kv_descale.dtype == torch.float32
               and kv_descale.device == q.device
               and (kv_descale.numel() == 1 or tuple(kv_descale.shape) in ((batch,), (batch, 1))), "kv_descale",
               f"fp32 on {q.device}, one element or [{batch}] or [{batch}, 1]",
               f"{getattr(kv_descale, 'dtype', type(kv_descale))} {tuple(getattr(kv_descale, 'shape', ()))}")
    _check(kv_cache.shape[3] == HEAD_DIM, "kv_cache", f"a last dim of {HEAD_DIM}", tuple(kv_cache.shape))
    _check(isinstance(num_splits, int) and num_splits >= 1, "num_splits", "an int >= 1", num_splits)
    _check(tuple(out_partial.shape) == (num_splits, batch, seqlen_q, num_heads, HEAD_DIM_V)
           and out_partial.dtype == torch.float32 and out_partial.stride(-1) == 1
           and all(x % 4 == 0 for x in out_partial.stride()[:4]) and out_partial.data_ptr() % 16 == 0, "out_partial",
           f"fp32 [{num_splits}, {batch}, {seqlen_q}, {num_heads}, {HEAD_DIM_V}], 16-byte aligned rows",
           f"{out_partial.dtype} {tuple(out_partial.shape)}")
    _check(tuple(lse_partial.shape) == (num_splits, batch, num_heads, seqlen_q)
           and lse_partial.dtype == torch.float32, "lse_partial",
           f"fp32 [{num_splits}, {batch}, {num_heads}, {seqlen_q}]", f"{lse_partial.dtype} {tuple(lse_partial.shape)}")
    _check(cache_seqlens.dtype == torch.int32 and tuple(cache_seqlens.shape) == (batch,)
           and cache_seqlens.is_contiguous(), "cache_seqlens", f"contiguous int32 [{batch}]",
           f"{cache_seqlens.dtype} {tuple(cache_seqlens.shape)}")
    tensors = {"q": q, "kv_cache": kv_cache, "cache_seqlens": cache_seqlens, "out_partial": out_partial,
               "lse_partial": lse_partial}
    if paged:
        _check(block_table.dtype == torch.int32 and block_table.dim() == 2 and block_table.shape[0] == batch
               and block_table.stride(1) == 1, "block_table", f"int32 [{batch}, max_pages], last dim contiguous",
               f"{block_table.dtype} {tuple(block_table.shape)}")
        tensors["block_table"] = block_table
    else:
        _check(kv_cache.shape[0] == batch, "kv_cache", f"{batch} dense rows (or a block_table)", kv_cache.shape[0])
    for name, t in tensors.items():
        _check(t.is_cuda and t.device == q.device, name, f"a CUDA tensor on {q.device}", t.device)
    # 16-byte aligned rows: q's 8-element loads, the cache's TMA (every stride but the last).
    _check(q.stride(3) == 1 and all(s % 8 == 0 for s in q.stride()[:3]) and q.data_ptr() % 16 == 0, "q",
           "16-byte aligned rows (strides multiples of 8, last dim contiguous)", q.stride())
    align = 16 // kv_cache.element_size()
    _check(kv_cache.stride(3) == 1 and kv_cache.stride(1) % align == 0 and kv_cache.stride(0) % align == 0
           and kv_cache.data_ptr() % 16 == 0, "kv_cache", "16-byte aligned rows, last dim contiguous",
           kv_cache.stride())

    if batch == 0:
        return
    if kv_cache.shape[0] == 0 or kv_cache.shape[1] == 0 or (paged and block_table.shape[1] == 0):
        # A cache of no keys (which no TMA descriptor can describe): every split is empty.
        out_partial.zero_()
        lse_partial.fill_(-math.inf)
        return
    config = MLAConfig(_DTYPE_NAMES[q.dtype], paged, bool(causal), "float8_e4m3fn" if fp8 else "same")
    descale, descale_stride = kv_descale, 0
    if descale is not None and descale.numel() > 1:
        descale_stride = descale.stride(0)
    if descale is None:  # (16-bit: never read)
        descale = _ONES.get(q.device)
        if descale is None:
            descale = _ONES[q.device] = torch.ones(1, dtype=torch.float32, device=q.device)
    compiled = compile_mla(config)
    if paged:
        cache_rows, cache_len = kv_cache.shape[0], kv_cache.shape[1]
        max_pages, bt_ptr, bt_stride = block_table.shape[1], block_table.data_ptr(), block_table.stride(0)
        capacity = max_pages * cache_len
    else:
        cache_rows, cache_len = batch, kv_cache.shape[1]
        max_pages, bt_ptr, bt_stride = 1, cache_seqlens.data_ptr(), 1  # (never read)
        capacity = cache_len
    raw = (q.data_ptr(), kv_cache.data_ptr(), out_partial.data_ptr(), lse_partial.data_ptr(),
           cache_seqlens.data_ptr(), bt_ptr,
           batch, seqlen_q, num_heads, num_splits, cache_rows, cache_len, capacity, max_pages,
           bt_stride, q.stride(0), q.stride(1), q.stride(2), kv_cache.stride(0), kv_cache.stride(1),
           *out_partial.stride()[:4], *lse_partial.stride(),
           float(softmax_scale) * math.log2(math.e), descale.data_ptr(), descale_stride,
           torch.cuda.current_stream(q.device).cuda_stream)
    compiled(*cute_args(MLA_ARGS, _elements(config), raw))
