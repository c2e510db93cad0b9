"""Validation of the public arguments: the one place where user tensors are checked.

:func:`check_decode_inputs` builds the :class:`~flashsplit.problem.DecodeProblem` of a decode
call; everything past it (plan, backends, launchers) may rely on the shapes, dtypes and devices
being consistent. ``TypeError`` for a wrong type or dtype, ``ValueError`` for a wrong shape,
layout, device or range, each naming the argument, what was expected and what was given. No
check reads tensor values, so nothing here synchronizes with the device.
"""

from __future__ import annotations

import math

import torch

from .call import DecodeOptions, DecodeTensors
from .plan import MAX_SPLITS
from .problem import FP8_DTYPES, MAX_HEAD_DIM, SUPPORTED_DTYPES, DecodeProblem
from .target import device_target

#: The one head dim past MAX_HEAD_DIM that combine() takes: MLA's value width (flashsplit.mla).
MLA_HEAD_DIM_V = 512


def _shape(t: torch.Tensor) -> str:
    return "[" + ", ".join(str(s) for s in t.shape) + "]"


def _require_tensor(name: str, t) -> torch.Tensor:
    """A dense tensor whose memory holds its values: the kernels read and write raw memory, so
    sparse, nested or mkldnn tensors (no strided memory) and negated views (``is_neg()``: the
    memory holds ``-t``) are refused."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.layout != torch.strided or t.is_nested:
        kind = "nested" if t.is_nested else str(t.layout).replace("torch.", "")
        raise TypeError(f"{name}: expected a dense (strided) torch.Tensor, got a {kind} tensor "
                        f"(.to_dense() converts a sparse one)")
    if t.is_neg():
        raise ValueError(f"{name}: a negated view (is_neg(): its memory holds the negated values); "
                         f"pass {name}.resolve_neg()")
    return t


def _require_unit_stride(name: str, t: torch.Tensor, what: str) -> None:
    """``t`` (a small index or length tensor) must be contiguous: the kernels index it as
    ``base + i``, they take no stride for it."""
    if any(size > 1 and stride != 1 for size, stride in zip(t.shape, t.stride())):
        raise ValueError(f"{name}: expected a contiguous {what} (stride 1), got strides {tuple(t.stride())}; "
                         f"{name}.contiguous() fixes it")


def _require_compact(name: str, t: torch.Tensor) -> None:
    """An output the kernels write at compact (``torch.empty``) strides, whatever its own."""
    if t.numel() == 0:
        return
    expected, step = [], 1
    for size in reversed(t.shape):
        expected.append(step)
        step *= size
    if t.stride() != tuple(reversed(expected)):
        raise ValueError(f"{name}: expected a contiguous tensor (strides {tuple(reversed(expected))}), "
                         f"got strides {tuple(t.stride())}")


def _require_distinct_elements(name: str, t: torch.Tensor) -> None:
    """An output whose elements may share memory (a stride 0, an expanded view) would be written
    by several programs at once: refused unless its strides prove every element distinct (sorted
    by stride, each dim steps past the span of the smaller ones)."""
    if t.numel() == 0:
        return
    span = 0  # elements spanned by the dims of smaller strides, less one
    for stride, size in sorted((st, sz) for st, sz in zip(t.stride(), t.shape) if sz > 1):
        if stride <= span:
            raise ValueError(f"{name}: elements may share memory (shape {_shape(t)}, strides {tuple(t.stride())}); "
                             f"expected an output whose elements are distinct (not an expanded view)")
        span += stride * (size - 1)


def _require_rank(name: str, t: torch.Tensor, rank: int, layout: str) -> None:
    if t.dim() != rank:
        raise ValueError(f"{name}: expected {rank} dims {layout}, got {t.dim()} dims of shape {_shape(t)}")


def _require_last_dim_contiguous(name: str, t: torch.Tensor) -> None:
    if t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(f"{name}: the last dim must be contiguous (stride 1), got strides {tuple(t.stride())}")


def head_dim_supported(head_dim: int) -> bool:
    """Head dims ``decode`` takes: multiples of 8 in [8, MAX_HEAD_DIM]."""
    return head_dim % 8 == 0 and 8 <= head_dim <= MAX_HEAD_DIM


def check_plan_args(batch, seqlen_k, num_heads, num_heads_kv, head_dim, seqlen_q, dtype, causal,
                    has_cache_seqlens, page_size, kv_dtype, num_splits, num_sms, device, backend) -> torch.device:
    """Validate :func:`flashsplit.plan`'s arguments as :func:`check_decode_inputs` judges the
    tensors they describe (``TypeError`` for a wrong type, ``ValueError`` for a wrong value);
    returns the device."""
    for name, value, least in (("batch", batch, 0), ("seqlen_k", seqlen_k, 0), ("num_heads", num_heads, 1),
                               ("num_heads_kv", num_heads_kv, 1), ("head_dim", head_dim, 1),
                               ("seqlen_q", seqlen_q, 1), ("page_size", page_size, 0)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name}: expected an int, got {type(value).__name__} {value!r}")
        if value < least:
            raise ValueError(f"{name}: expected a {'non-negative' if least == 0 else 'positive'} int, got {value!r}")
    if num_heads % num_heads_kv != 0:
        raise ValueError(f"num_heads: expected a multiple of num_heads_kv ({num_heads_kv}), got {num_heads}")
    if not head_dim_supported(head_dim):
        raise ValueError(f"head_dim: expected a multiple of 8 in [8, {MAX_HEAD_DIM}], got {head_dim}")
    if page_size and seqlen_k % page_size != 0:
        raise ValueError(f"seqlen_k: expected a multiple of page_size ({page_size}) for a paged cache "
                         f"(max_pages_per_row * page_size), got {seqlen_k}")
    if dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"dtype: expected torch.float16 or torch.bfloat16, got {dtype!r}")
    if kv_dtype is not None and kv_dtype != dtype and kv_dtype not in FP8_DTYPES:
        raise TypeError(f"kv_dtype: expected None, dtype ({dtype}), torch.float8_e4m3fn or torch.float8_e5m2, "
                        f"got {kv_dtype!r}")
    for name, value in (("causal", causal), ("has_cache_seqlens", has_cache_seqlens)):
        if not isinstance(value, bool):
            raise TypeError(f"{name}: expected a bool, got {type(value).__name__}")
    check_num_splits(num_splits)
    if num_sms is not None and (isinstance(num_sms, bool) or not isinstance(num_sms, int) or num_sms < 1):
        raise (ValueError if isinstance(num_sms, int) and not isinstance(num_sms, bool) else TypeError)(
            f"num_sms: expected None or a positive int, got {num_sms!r}")
    if not isinstance(backend, str):
        raise TypeError(f"backend: expected a str, got {type(backend).__name__}")
    if isinstance(device, bool) or not isinstance(device, (str, torch.device, int)):
        raise TypeError(f"device: expected a str, torch.device or CUDA index, got {type(device).__name__}")
    try:
        return torch.device(device)
    except RuntimeError as e:
        raise ValueError(f"device: expected a device such as 'cuda' or 'cpu', got {device!r}") from e


def check_cache_update_args(seqlen_new, has_leftpad, has_batch_idx, rotary_dim, seqlen_k: int, head_dim: int,
                            page_size: int) -> None:
    """:func:`flashsplit.plan`'s description of a cache update, judged as :func:`check_decode_inputs`
    judges the tensors it stands for."""
    for name, value in (("seqlen_new", seqlen_new), ("rotary_dim", rotary_dim)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name}: expected an int, got {type(value).__name__} {value!r}")
    for name, value in (("has_leftpad", has_leftpad), ("has_batch_idx", has_batch_idx)):
        if not isinstance(value, bool):
            raise TypeError(f"{name}: expected a bool, got {type(value).__name__}")
    if not 0 <= seqlen_new <= seqlen_k:
        raise ValueError(f"seqlen_new: expected new keys per row in [0, seqlen_k = {seqlen_k}], got {seqlen_new}")
    if rotary_dim and not seqlen_new:
        raise ValueError("rotary_dim: only with new keys (seqlen_new >= 1)")
    if not 0 <= rotary_dim <= head_dim or rotary_dim % 2:
        raise ValueError(f"rotary_dim: expected an even number in [0, head_dim = {head_dim}], got {rotary_dim}")
    if has_batch_idx and page_size:
        raise ValueError("has_batch_idx: cache_batch_idx is only for a dense cache (page_size 0)")


def check_num_splits(num_splits) -> int:
    if isinstance(num_splits, bool) or not isinstance(num_splits, int):
        raise TypeError(f"num_splits: expected an int, got {type(num_splits).__name__}")
    if not 0 <= num_splits <= MAX_SPLITS:
        raise ValueError(f"num_splits: expected 0 (heuristic) or 1..{MAX_SPLITS}, got {num_splits}")
    return num_splits


def check_decode_inputs(tensors: DecodeTensors, options: DecodeOptions = DecodeOptions()) -> DecodeProblem:
    """Validate ``decode``'s arguments and return the problem they describe.

    Raises ``TypeError`` for a wrong type or dtype, ``ValueError`` for a wrong shape, layout,
    device or range; each message names the argument, what was expected and what was given.
    Values are never read (no host sync): out-of-range page ids or lengths are only caught by
    :func:`flashsplit.check_inputs`. ``tensors.out`` may be None (nothing to check); ``tensors.lse``
    is checked by the caller, which knows the problem.
    """
    q, k_cache, v_cache, out, _, cache_seqlens, block_table, k_descale, v_descale, sinks = tensors[:10]
    causal, num_splits = options.causal, options.num_splits
    _require_tensor("q", q)
    _require_rank("q", q, 4, "[batch, seqlen_q, num_heads, head_dim]")
    if q.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"q: expected dtype float16 or bfloat16, got {q.dtype}")
    _require_last_dim_contiguous("q", q)
    paged = block_table is not None
    layout = "[num_pages, page_size, num_heads_kv, head_dim]" if paged else "[batch, seqlen_k, num_heads_kv, head_dim]"
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        _require_tensor(name, t)
        _require_rank(name, t, 4, layout)
        if t.dtype not in SUPPORTED_DTYPES + FP8_DTYPES:
            raise TypeError(f"{name}: expected dtype float16, bfloat16, float8_e4m3fn or float8_e5m2, got {t.dtype}")
        _require_last_dim_contiguous(name, t)
    batch, seqlen_q, num_heads, head_dim = q.shape
    if k_cache.shape != v_cache.shape:
        raise ValueError(f"k_cache and v_cache: expected the same shape, got {_shape(k_cache)} and {_shape(v_cache)}")
    if k_cache.dtype != v_cache.dtype:
        raise TypeError(f"k_cache/v_cache: expected one dtype, got {k_cache.dtype} and {v_cache.dtype}")
    kv_fp8 = k_cache.dtype in FP8_DTYPES
    if not kv_fp8 and k_cache.dtype != q.dtype:
        raise TypeError(f"k_cache/v_cache: expected q's dtype {q.dtype} (or an fp8 dtype), got {k_cache.dtype}")
    if paged:
        if tensors.cache_batch_idx is not None:
            raise ValueError("cache_batch_idx: only for a dense cache; with block_table each row's pages are its "
                             "cache (reorder the table's rows instead)")
        seqlen_k, page_size = _check_block_table(block_table, k_cache, batch, q.device)
    else:
        if tensors.cache_batch_idx is not None:
            if k_cache.shape[0] == 0 and batch > 0:
                raise ValueError(f"k_cache: expected at least one cache row (dim 0) for cache_batch_idx, got a cache "
                                 f"of shape {_shape(k_cache)}")
        elif k_cache.shape[0] != batch:
            raise ValueError(
                f"k_cache: expected batch {batch} (q's dim 0) for a dense {layout} cache, got {k_cache.shape[0]} "
                f"(pass block_table for a paged cache, or cache_batch_idx to pick rows of a larger one)"
            )
        seqlen_k, page_size = k_cache.shape[1], 0
    num_heads_kv, head_dim_k = k_cache.shape[2:]
    if head_dim_k != head_dim:
        raise ValueError(f"k_cache/v_cache: expected head_dim {head_dim} (q's last dim), got {head_dim_k}")
    if not head_dim_supported(head_dim):
        raise ValueError(f"q: expected head_dim a multiple of 8 in [8, {MAX_HEAD_DIM}], got {head_dim}")
    if num_heads_kv == 0 or num_heads % num_heads_kv != 0:
        raise ValueError(
            f"q/k_cache: expected num_heads ({num_heads}) to be a positive multiple of num_heads_kv ({num_heads_kv})"
        )
    if seqlen_q == 0:
        raise ValueError(f"q: expected seqlen_q >= 1, got shape {_shape(q)}")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if t.device != q.device:
            raise ValueError(f"{name}: expected q's device {q.device}, got {t.device}")
    for name, scale in (("k_descale", k_descale), ("v_descale", v_descale)):
        _check_descale(name, scale, kv_fp8, batch, num_heads_kv, q.device)
    if cache_seqlens is not None:
        _require_tensor("cache_seqlens", cache_seqlens)
        if cache_seqlens.dtype != torch.int32:
            raise TypeError(f"cache_seqlens: expected dtype int32, got {cache_seqlens.dtype}")
        if cache_seqlens.shape != (batch,):
            raise ValueError(f"cache_seqlens: expected shape [{batch}], got {_shape(cache_seqlens)}")
        if cache_seqlens.device != q.device:
            raise ValueError(f"cache_seqlens: expected q's device {q.device}, got {cache_seqlens.device}")
        _require_unit_stride("cache_seqlens", cache_seqlens, f"[{batch}] tensor")
    if not isinstance(causal, bool):
        raise TypeError(f"causal: expected a bool, got {type(causal).__name__}")
    check_num_splits(num_splits)
    if out is not None:
        _require_tensor("out", out)
        if out.shape != q.shape:
            raise ValueError(f"out: expected q's shape {_shape(q)}, got {_shape(out)}")
        if out.dtype != q.dtype:
            raise TypeError(f"out: expected q's dtype {q.dtype}, got {out.dtype}")
        if out.device != q.device:
            raise ValueError(f"out: expected q's device {q.device}, got {out.device}")
        _require_last_dim_contiguous("out", out)
        _require_distinct_elements("out", out)
    window_left, window_right = check_window(options.window_size, causal)
    softcap = check_softcap(options.softcap)
    if sinks is not None:
        check_sinks(sinks, num_heads, q.device)
    if not isinstance(options.batch_invariant, bool):
        raise TypeError(f"batch_invariant: expected a bool, got {type(options.batch_invariant).__name__}")
    if options.batch_invariant and num_splits != 0:
        raise ValueError(f"num_splits: batch_invariant=True splits each row by its own length; "
                         f"expected 0, got {num_splits}")
    for name in ("cache_leftpad", "cache_batch_idx"):
        if getattr(tensors, name) is not None:
            _check_row_index(name, getattr(tensors, name), batch, q.device)
    seqlen_new = _check_new_kv(tensors, batch, num_heads_kv, head_dim, seqlen_k)
    if seqlen_new and num_heads == 0:
        raise ValueError(f"q: expected num_heads >= 1 with k and v (they are written by the decode), got shape "
                         f"{_shape(q)}")
    per_token = seqlen_q > 1 and (causal or window_left >= 0 or window_right >= 0)
    rotary_dim = _check_rotary(tensors, seqlen_new, head_dim, seqlen_k, q, per_token)
    if not isinstance(options.rotary_interleaved, bool):
        raise TypeError(f"rotary_interleaved: expected a bool, got {type(options.rotary_interleaved).__name__}")
    _check_cpu_dtype("q", q)
    return DecodeProblem(
        batch=batch,
        seqlen_q=seqlen_q,
        seqlen_k=seqlen_k,
        num_heads=num_heads,
        num_heads_kv=num_heads_kv,
        head_dim=head_dim,
        dtype=q.dtype,
        causal=causal,
        has_cache_seqlens=cache_seqlens is not None,
        device_type=q.device.type,
        # out too: the cute kernels store the output with 16-byte vectors.
        aligned_16b=all(_is_aligned_16b(t) for t in (q, k_cache, v_cache, out) if t is not None),
        kv_dtype=k_cache.dtype,
        page_size=page_size,
        gpu=device_target(q.device.index) if q.device.type == "cuda" else None,
        window_left=window_left,
        window_right=window_right,
        softcap=softcap,
        has_sinks=sinks is not None,
        batch_invariant=options.batch_invariant,
        seqlen_new=seqlen_new,
        has_leftpad=tensors.cache_leftpad is not None,
        has_batch_idx=tensors.cache_batch_idx is not None,
        rotary_dim=rotary_dim,
        rotary_interleaved=options.rotary_interleaved,
    )


def _check_cpu_dtype(name: str, t: torch.Tensor) -> None:
    """A CPU tensor runs through the Triton interpreter, whose bfloat16 arithmetic is wrong
    (``tl.dot`` of bfloat16 tiles returns garbage, conversions to it truncate): refuse it."""
    if t.dtype == torch.bfloat16 and t.device.type == "cpu":
        raise TypeError(f"{name}: bfloat16 is not supported on the CPU (the Triton interpreter computes it "
                        f"wrongly); float16 works on the CPU, bfloat16 needs a CUDA GPU; got a bfloat16 tensor on "
                        f"{t.device}")


def _check_row_index(name: str, t, batch: int, device) -> None:
    """``cache_leftpad`` / ``cache_batch_idx``: int32 ``[B]`` on q's device, contiguous."""
    _require_tensor(name, t)
    if t.dtype != torch.int32:
        raise TypeError(f"{name}: expected dtype int32, got {t.dtype}")
    if t.shape != (batch,):
        raise ValueError(f"{name}: expected shape [{batch}], got {_shape(t)}")
    if t.device != device:
        raise ValueError(f"{name}: expected q's device {device}, got {t.device}")
    _require_unit_stride(name, t, f"[{batch}] tensor")


def _check_new_kv(tensors: DecodeTensors, batch: int, num_heads_kv: int, head_dim: int, seqlen_k: int) -> int:
    """New keys and values (``k``/``v``, both or neither): ``[B, L_new, H_kv, D]`` in q's dtype
    and device, last dim contiguous, ``1 <= L_new <= capacity``, with ``cache_seqlens`` saying
    where they go. Returns ``L_new`` (0 without them)."""
    q, k_new, v_new = tensors.q, tensors.k_new, tensors.v_new
    if k_new is None and v_new is None:
        return 0
    if k_new is None or v_new is None:
        given, missing = ("k", "v") if v_new is None else ("v", "k")
        raise ValueError(f"{given}: given without {missing}; pass both new keys and values, or neither")
    for name, t in (("k", k_new), ("v", v_new)):
        _require_tensor(name, t)
        _require_rank(name, t, 4, "[batch, seqlen_new, num_heads_kv, head_dim]")
        if t.dtype != q.dtype:
            raise TypeError(f"{name}: expected q's dtype {q.dtype} (an fp8 cache stores it quantized), got {t.dtype}")
        if t.device != q.device:
            raise ValueError(f"{name}: expected q's device {q.device}, got {t.device}")
        if t.shape[0] != batch or tuple(t.shape[2:]) != (num_heads_kv, head_dim):
            raise ValueError(f"{name}: expected shape [{batch}, seqlen_new, {num_heads_kv}, {head_dim}], "
                             f"got {_shape(t)}")
        _require_last_dim_contiguous(name, t)
    if k_new.shape != v_new.shape:
        raise ValueError(f"k and v: expected the same shape, got {_shape(k_new)} and {_shape(v_new)}")
    seqlen_new = k_new.shape[1]
    if seqlen_new == 0:
        raise ValueError(f"k: expected seqlen_new (dim 1) >= 1, got shape {_shape(k_new)}; pass k=None, v=None to "
                         f"append nothing")
    if seqlen_new > seqlen_k:
        raise ValueError(f"k: {seqlen_new} new keys per row cannot fit a cache of capacity {seqlen_k}")
    if tensors.cache_seqlens is None:
        raise ValueError("cache_seqlens: required with k and v (row b's new keys are written at cache_seqlens[b] on); "
                         "got None")
    for name in ("k_cache", "v_cache"):  # written: one slot per element
        _require_distinct_elements(name, getattr(tensors, name))
    return seqlen_new


def _check_rotary(tensors: DecodeTensors, seqlen_new: int, head_dim: int, seqlen_k: int, q,
                  per_token: bool = False) -> int:
    """Rotary tables (``rotary_cos``/``rotary_sin``, both or neither, only with new keys):
    ``[L_ro, rotary_dim / 2]``, one dtype (q's or float32), contiguous, ``rotary_dim <= D`` and
    ``L_ro >= capacity`` (FlashAttention's rule: every position a key can hold). With
    ``per_token`` (query ``i`` rotates at ``cache_seqlens - cache_leftpad + i``: causal or
    windowed, several queries) and more queries than new keys, the queries past the new keys
    reach further: ``L_ro >= capacity + L_q - L_new``, every position a query of a row that fits
    the cache can take (from shapes alone: no length is read). Returns ``rotary_dim`` (0 without
    them)."""
    cos, sin = tensors.rotary_cos, tensors.rotary_sin
    if cos is None and sin is None:
        return 0
    if cos is None or sin is None:
        given, missing = ("rotary_cos", "rotary_sin") if sin is None else ("rotary_sin", "rotary_cos")
        raise ValueError(f"{given}: given without {missing}; pass both rotary tables, or neither")
    if not seqlen_new:
        raise ValueError("rotary_cos: only with k and v (the new keys and q are rotated as they are appended)")
    for name, t in (("rotary_cos", cos), ("rotary_sin", sin)):
        _require_tensor(name, t)
        _require_rank(name, t, 2, "[seqlen_ro, rotary_dim / 2]")
        if t.dtype not in (q.dtype, torch.float32):
            raise TypeError(f"{name}: expected q's dtype {q.dtype} or float32, got {t.dtype}")
        if t.device != q.device:
            raise ValueError(f"{name}: expected q's device {q.device}, got {t.device}")
        _require_compact(name, t)
    if cos.shape != sin.shape or cos.dtype != sin.dtype:
        raise ValueError(f"rotary_cos and rotary_sin: expected one shape and dtype, got {_shape(cos)} {cos.dtype} "
                         f"and {_shape(sin)} {sin.dtype}")
    seqlen_ro, half = cos.shape
    if not 1 <= 2 * half <= head_dim:
        raise ValueError(f"rotary_cos: expected rotary_dim = 2 * dim 1 in [2, head_dim = {head_dim}], got "
                         f"{2 * half} (shape {_shape(cos)})")
    if seqlen_ro < seqlen_k:
        raise ValueError(f"rotary_cos: expected at least {seqlen_k} positions (the cache's capacity), got "
                         f"{seqlen_ro} (shape {_shape(cos)})")
    seqlen_q = q.shape[1]
    if per_token and seqlen_q > seqlen_new and seqlen_ro < seqlen_k + seqlen_q - seqlen_new:
        raise ValueError(
            f"rotary_cos: expected at least {seqlen_k + seqlen_q - seqlen_new} positions: with causal or windowed "
            f"attention query i rotates at cache_seqlens - cache_leftpad + i, and {seqlen_q} queries over "
            f"{seqlen_new} new keys reach position {seqlen_k + seqlen_q - seqlen_new - 1} in a {seqlen_k}-key "
            f"cache; got {seqlen_ro} (shape {_shape(cos)})")
    return 2 * half


def check_sinks(sinks, num_heads: int, device) -> None:
    """``sinks``: one fp32/bf16/fp16 logit per q head, contiguous, on ``device``."""
    _require_tensor("sinks", sinks)
    if sinks.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise TypeError(f"sinks: expected dtype float32, bfloat16 or float16, got {sinks.dtype}")
    if sinks.shape != (num_heads,):
        raise ValueError(f"sinks: expected shape [{num_heads}] (one logit per q head), got {_shape(sinks)}")
    if sinks.device != device:
        raise ValueError(f"sinks: expected q's device {device}, got {sinks.device}")
    if num_heads > 1 and sinks.stride(0) != 1:
        raise ValueError(f"sinks: expected a contiguous tensor, got strides {tuple(sinks.stride())} (use "
                         f".contiguous())")


def check_window(window_size, causal: bool) -> tuple[int, int]:
    """``(left, right)`` of a ``window_size`` argument: two ints >= -1 (-1: unbounded); ``causal``
    sets ``right`` to 0, and a positive ``right`` contradicts it."""
    if not isinstance(window_size, (tuple, list)) or len(window_size) != 2 or not all(
            isinstance(w, int) and not isinstance(w, bool) for w in window_size):
        raise TypeError(f"window_size: expected a (left, right) pair of ints, got {window_size!r}")
    left, right = window_size
    if left < -1 or right < -1:
        raise ValueError(f"window_size: expected each bound >= -1 (-1: unbounded), got {tuple(window_size)}")
    if causal:
        if right > 0:
            raise ValueError(f"window_size: right = {right} > 0 contradicts causal=True (a query sees no later key); "
                             f"pass right = 0 or -1")
        right = 0
    return left, right


def check_softcap(softcap) -> float:
    if isinstance(softcap, bool) or not isinstance(softcap, (int, float)):
        raise TypeError(f"softcap: expected a float, got {type(softcap).__name__}")
    if not (softcap >= 0 and math.isfinite(softcap)):
        raise ValueError(f"softcap: expected a finite value >= 0 (0: off), got {softcap}")
    return float(softcap)


def _check_block_table(block_table, k_cache: torch.Tensor, batch: int, device,
                       cache_name: str = "k_cache") -> tuple[int, int]:
    """Validate a page table against a paged cache (named ``cache_name`` in errors); returns
    (capacity in keys, page size)."""
    _require_tensor("block_table", block_table)
    if block_table.dtype != torch.int32:
        raise TypeError(f"block_table: expected dtype int32, got {block_table.dtype}")
    if block_table.dim() != 2 or block_table.shape[0] != batch:
        raise ValueError(f"block_table: expected shape [{batch}, max_pages_per_row], got {_shape(block_table)}")
    if block_table.device != device:
        raise ValueError(f"block_table: expected q's device {device}, got {block_table.device}")
    if block_table.shape[1] > 0 and block_table.stride(1) != 1:  # (rows may be strided: the kernels take that stride)
        raise ValueError(f"block_table: the last dim must be contiguous, got strides {tuple(block_table.stride())}; "
                         f"block_table.contiguous() fixes it")
    page_size = k_cache.shape[1]
    if page_size == 0:
        raise ValueError(f"{cache_name}: expected page_size (dim 1) >= 1, got a cache of shape {_shape(k_cache)}")
    if k_cache.shape[0] == 0 and block_table.shape[1] > 0:
        # The kernels clamp page ids into [0, num_pages - 1]: with no page that is no page at all.
        raise ValueError(f"{cache_name}: expected at least one page (dim 0) for a block_table of "
                         f"{block_table.shape[1]} pages per row, got a cache of shape {_shape(k_cache)}")
    return block_table.shape[1] * page_size, page_size


def _check_descale(name: str, scale, kv_fp8: bool, batch: int, num_heads_kv: int, device) -> None:
    """fp8 caches need fp32 dequantization scales: a scalar tensor or one per (row, KV head)."""
    if scale is None:
        if kv_fp8:
            raise ValueError(f"{name}: required for an fp8 cache (fp32 scalar tensor or [{batch}, {num_heads_kv}])")
        return
    if not kv_fp8:
        raise ValueError(f"{name}: only meaningful for an fp8 cache; the cache is not fp8")
    _require_tensor(name, scale)
    if scale.dtype != torch.float32:
        raise TypeError(f"{name}: expected dtype float32, got {scale.dtype}")
    if scale.numel() != 1 and tuple(scale.shape) != (batch, num_heads_kv):
        raise ValueError(f"{name}: expected a scalar tensor or shape [{batch}, {num_heads_kv}], got {_shape(scale)}")
    if scale.device != device:
        raise ValueError(f"{name}: expected q's device {device}, got {scale.device}")


#: Output dtypes of :func:`flashsplit.combine`.
COMBINE_OUT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def check_combine_inputs(out_partial, lse_partial, out, out_dtype) -> torch.dtype:
    """Validate :func:`flashsplit.combine`'s arguments as :func:`check_decode_inputs` does
    decode's; returns the output's dtype. ``out_partial`` fp32 ``[S, B, L_q, H, D]`` and
    ``lse_partial`` fp32 ``[S, B, H, L_q]`` on one device, their last dims contiguous (both
    kernels take every other stride); ``out`` ``[B, L_q, H, D]`` fp16/bf16/fp32, last dim
    contiguous, elements distinct."""
    for name, t, rank, layout in (("out_partial", out_partial, 5, "[num_splits, batch, seqlen_q, num_heads, head_dim]"),
                                  ("lse_partial", lse_partial, 4, "[num_splits, batch, num_heads, seqlen_q]")):
        _require_tensor(name, t)
        if t.dtype != torch.float32:
            raise TypeError(f"{name}: expected dtype float32, got {t.dtype}")
        _require_rank(name, t, rank, layout)
    num_splits, batch, seqlen_q, num_heads, head_dim = out_partial.shape
    if lse_partial.shape != (num_splits, batch, num_heads, seqlen_q):
        raise ValueError(f"lse_partial: expected shape {[num_splits, batch, num_heads, seqlen_q]} to match "
                         f"out_partial, got {list(lse_partial.shape)}")
    if lse_partial.device != out_partial.device:
        raise ValueError(f"lse_partial: expected out_partial's device {out_partial.device}, got {lse_partial.device}")
    if not 1 <= num_splits <= MAX_SPLITS:
        raise ValueError(f"out_partial: expected 1..{MAX_SPLITS} splits in dim 0, got {num_splits}")
    if head_dim > MAX_HEAD_DIM and head_dim != MLA_HEAD_DIM_V:
        raise ValueError(f"out_partial: expected head_dim (dim 4) <= {MAX_HEAD_DIM} or {MLA_HEAD_DIM_V} (MLA's "
                         f"latent), got {head_dim}")
    _require_last_dim_contiguous("out_partial", out_partial)
    _require_last_dim_contiguous("lse_partial", lse_partial)
    if out_dtype is not None and out_dtype not in COMBINE_OUT_DTYPES:
        what = out_dtype if isinstance(out_dtype, torch.dtype) else f"a {type(out_dtype).__name__}"
        raise TypeError(f"out_dtype: expected float16, bfloat16 or float32, got {what}")
    if out is None:
        return out_dtype or torch.float32
    _require_tensor("out", out)
    if out.dtype not in COMBINE_OUT_DTYPES:
        raise TypeError(f"out: expected dtype float16, bfloat16 or float32, got {out.dtype}")
    if out_dtype is not None and out.dtype != out_dtype:
        raise TypeError(f"out_dtype: {out_dtype} disagrees with out's dtype {out.dtype}; pass one of them")
    if out.shape != (batch, seqlen_q, num_heads, head_dim):
        raise ValueError(f"out: expected shape {[batch, seqlen_q, num_heads, head_dim]}, got {_shape(out)}")
    if out.device != out_partial.device:
        raise ValueError(f"out: expected out_partial's device {out_partial.device}, got {out.device}")
    _require_last_dim_contiguous("out", out)
    _require_distinct_elements("out", out)
    return out.dtype


def check_lse_out(lse, batch: int, num_heads: int, seqlen_q: int, device) -> None:
    """A caller's ``lse`` output: fp32 ``[batch, num_heads, seqlen_q]`` on q's device,
    contiguous (the cute kernels write it at compact strides, the Triton ones take two strides)."""
    if lse is None:
        return
    _require_tensor("lse", lse)
    if lse.dtype != torch.float32:
        raise TypeError(f"lse: expected dtype float32, got {lse.dtype}")
    if lse.shape != (batch, num_heads, seqlen_q):
        raise ValueError(f"lse: expected shape [{batch}, {num_heads}, {seqlen_q}], got {_shape(lse)}")
    if lse.device != device:
        raise ValueError(f"lse: expected q's device {device}, got {lse.device}")
    _require_compact("lse", lse)


#: The largest ``|softmax_scale|`` accepted (:func:`check_softmax_scale` says why).
MAX_SOFTMAX_SCALE = 2.0 ** 64


def check_softmax_scale(softmax_scale, head_dim: int) -> float:
    """The softmax scale as a float: ``1 / sqrt(head_dim)`` for None, else a finite real number
    (``TypeError`` for another type, ``ValueError`` for NaN, an infinity or ``|softmax_scale| >
    MAX_SOFTMAX_SCALE``). Zero (uniform attention) and negative scales are valid attention.

    Why 2^64: the kernels score a key in fp32 as ``(softmax_scale * log2(e)) * (q . k)``. A
    float16 ``q . k`` is at most ``256 * 65504^2 ~= 1.1e12``, so within the bound no fp16 score
    can exceed ``2^64 * 1.45 * 1.1e12 ~= 3e31``, far inside fp32 (3.4e38), and the result is the
    softmax the float64 reference gives (one-hot as the scale grows). Past the bound ordinary
    scores overflow (1e37 with ``q . k = 35`` is already infinite: NaN out), so such scales are
    refused rather than half-supported. What the bound cannot cover without reading values:
    ``|softmax_scale * q . k|`` (times ``k_descale`` for an fp8 cache) must stay below fp32's
    range, which only bfloat16 inputs with ``|q . k| > ~1e19`` or huge fp8 scales can break;
    :func:`flashsplit.check_inputs` checks the fp8 scales against it.
    """
    if softmax_scale is None:
        return 1.0 / math.sqrt(head_dim)
    if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, (int, float)):
        raise TypeError(f"softmax_scale: expected a finite float, got {type(softmax_scale).__name__} "
                        f"{softmax_scale!r}")
    if isinstance(softmax_scale, float) and not math.isfinite(softmax_scale):
        raise ValueError(f"softmax_scale: expected a finite float, got {softmax_scale!r}")
    if abs(softmax_scale) > MAX_SOFTMAX_SCALE:  # (exact for ints of any size)
        size = (f"{softmax_scale:.3g}" if isinstance(softmax_scale, float)
                else f"an int of {softmax_scale.bit_length()} bits")
        raise ValueError(f"softmax_scale: expected |softmax_scale| <= 2**64 (fp32 scores must not overflow), "
                         f"got {size}")
    return float(softmax_scale)


def _is_aligned_16b(t: torch.Tensor) -> bool:
    itemsize = t.element_size()
    return t.data_ptr() % 16 == 0 and all((s * itemsize) % 16 == 0 for s in t.stride()[:-1])
