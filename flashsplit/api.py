"""The public API: ``decode``, ``combine`` and ``plan``."""

from __future__ import annotations

import dataclasses

import torch

from . import backends  # noqa: F401  (registers the backends)
from . import dispatch, torch_ops
from .call import DecodeOptions, DecodeTensors
from .plan import SplitPlan
from .problem import DecodeProblem
from .validation import (check_cache_update_args, check_combine_inputs, check_plan_args, check_sinks, check_softcap,
                         check_window)
from .registry import select
from .target import GpuTarget, device_target, gpu_target

def plan(
    batch: int,
    seqlen_k: int,
    num_heads: int,
    num_heads_kv: int,
    head_dim: int,
    *,
    seqlen_q: int = 1,
    dtype: torch.dtype = torch.bfloat16,
    causal: bool = False,
    has_cache_seqlens: bool = True,
    page_size: int = 0,
    kv_dtype: torch.dtype | None = None,
    num_splits: int = 0,
    num_sms: int | None = None,
    device: str | torch.device | None = None,
    backend: str = "auto",
    gpu: str | GpuTarget | None = None,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    has_sinks: bool = False,
    batch_invariant: bool = False,
    seqlen_new: int = 0,
    has_leftpad: bool = False,
    has_batch_idx: bool = False,
    rotary_dim: int = 0,
) -> SplitPlan:
    """What :func:`decode` will do for these shapes, in pure Python (no GPU needed).

    ``seqlen_k`` is the cache capacity (``k_cache.shape[1]``, or ``max_pages_per_row *
    page_size`` for a paged cache, with ``page_size`` given); ``kv_dtype`` an fp8 cache's dtype.
    By default it plans for the device :func:`decode` would run on here: the current CUDA
    device, or on a machine without one the CPU (the Triton interpreter). ``gpu`` plans for a
    named GPU (``"h200"``, ``"h100"``, ... :data:`flashsplit.target.KNOWN_GPUS`, or a
    :class:`~flashsplit.target.GpuTarget`) from any machine; ``num_sms`` overrides the GPU's SM
    count (and, like ``gpu``, plans for a GPU). ``device="cuda"`` on a machine without CUDA plans
    for an H200; ``device="cpu"`` for the Triton interpreter. ``window_size``, ``softcap``,
    ``has_sinks`` (``sinks`` given) and ``batch_invariant`` as in :func:`decode`: a left window
    bound shrinks the span the splits cover (``SplitPlan.span``). ``seqlen_new`` (new keys per row,
    ``k``/``v`` given), ``has_leftpad``, ``has_batch_idx`` and ``rotary_dim`` describe a call that
    updates the cache (they choose the backend: one that cannot run them is not chosen). Arguments
    describing tensors that :func:`decode` would refuse raise its ``TypeError``/``ValueError``.

    >>> p = plan(1, 32768, 32, 8, 128, gpu="h200", backend="triton")
    >>> p.num_splits, p.grid
    (32, (32, 1, 8))
    >>> plan(1, 4096, 32, 8, 128, gpu="h200").rule   # the vote of the H200's measured table
    'measured'
    >>> plan(1, 4096, 32, 8, 128, gpu="h20").rule   # no table: the hand rules (cute's swapped operands)
    'swapped-operands'
    """
    if device is None:  # where decode would run here, unless a GPU is described
        device = "cuda" if gpu is not None or num_sms is not None or torch.cuda.is_available() else "cpu"
    device = check_plan_args(batch, seqlen_k, num_heads, num_heads_kv, head_dim, seqlen_q, dtype, causal,
                             has_cache_seqlens, page_size, kv_dtype, num_splits, num_sms, device, backend)
    target = None
    if device.type == "cuda":
        target = gpu_target(gpu) if gpu is not None else device_target(device.index)
        if num_sms is not None:
            target = dataclasses.replace(target, num_sms=num_sms)
    elif gpu is not None or num_sms is not None:
        name = "gpu" if gpu is not None else "num_sms"
        raise ValueError(f"{name}: only for device='cuda' (a GPU), got device={str(device)!r}")
    window_left, window_right = check_window(_pair(window_size), causal)
    if not isinstance(has_sinks, bool) or not isinstance(batch_invariant, bool):
        raise TypeError(f"has_sinks, batch_invariant: expected bools, got {has_sinks!r}, {batch_invariant!r}")
    if batch_invariant and num_splits:
        raise ValueError(f"num_splits: batch_invariant=True splits each row by its own length; expected 0, got {num_splits}")
    check_cache_update_args(seqlen_new, has_leftpad, has_batch_idx, rotary_dim, seqlen_k, head_dim, page_size)
    problem = DecodeProblem(
        batch=batch, seqlen_q=seqlen_q, seqlen_k=seqlen_k, num_heads=num_heads, num_heads_kv=num_heads_kv,
        head_dim=head_dim, dtype=dtype, causal=causal, has_cache_seqlens=has_cache_seqlens, device_type=device.type,
        kv_dtype=kv_dtype, page_size=page_size, gpu=target, window_left=window_left, window_right=window_right,
        softcap=check_softcap(softcap), has_sinks=has_sinks, batch_invariant=batch_invariant, seqlen_new=seqlen_new,
        has_leftpad=has_leftpad, has_batch_idx=has_batch_idx, rotary_dim=rotary_dim,
    )
    chosen, rule, reason = select(problem, backend)
    return dispatch.make_plan(problem, chosen, rule, reason, num_splits)


def decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    *,
    cache_seqlens: torch.Tensor | None = None,
    softmax_scale: float | None = None,
    causal: bool = False,
    num_splits: int = 0,
    return_lse: bool = False,
    out: torch.Tensor | None = None,
    block_table: torch.Tensor | None = None,
    page_table: torch.Tensor | None = None,
    k_descale: torch.Tensor | None = None,
    v_descale: torch.Tensor | None = None,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    sinks: torch.Tensor | None = None,
    batch_invariant: bool = False,
    backend: str = "auto",
    k: torch.Tensor | None = None,
    v: torch.Tensor | None = None,
    rotary_cos: torch.Tensor | None = None,
    rotary_sin: torch.Tensor | None = None,
    cache_batch_idx: torch.Tensor | None = None,
    cache_leftpad: torch.Tensor | None = None,
    rotary_interleaved: bool = True,
):
    """Split-KV decode attention over a KV cache (FlashAttention ``flash_attn_with_kvcache`` style;
    :func:`flashsplit.flash_attn_with_kvcache` takes FlashAttention's own signature).

    Args:
        q: ``[B, L_q, H_q, D]`` fp16 or bf16; ``L_q`` >= 1 (several tokens for speculative decoding).
        k_cache, v_cache: ``[B, L_k, H_kv, D]``, q's dtype and device, ``H_q % H_kv == 0``; the last
            dim contiguous, other strides free. ``D`` a multiple of 8 up to 256.
        cache_seqlens: int32 ``[B]`` on q's device, contiguous: live keys of each row (default
            ``L_k``). Slots past a row's length are never read into the result (they may hold
            NaN). A row of length 0 gives O = 0 and LSE = -inf. Values outside ``[0, capacity]``
            are clamped into it on the device (checking them would need a host sync; see
            :func:`check_inputs`).
        softmax_scale: defaults to ``1 / sqrt(D)``; any finite real with ``|softmax_scale| <= 2**64``
            (zero and negative scales included): scores are fp32, see
            :func:`flashsplit.validation.check_softmax_scale` for the bound.
        causal: for ``L_q > 1``, query ``i`` sees keys ``[0, seqlen - L_q + i]`` (bottom-right
            aligned); a no-op at ``L_q = 1``. A query that sees no key gets O = 0, LSE = -inf.
        num_splits: 0 picks by the shared heuristic (see :func:`plan`); ``n`` in 1..256 uses
            exactly ``n`` splits.
        return_lse: also return the softmax log-sum-exp.
        out: optional ``[B, L_q, H_q, D]`` output tensor in q's dtype, last dim contiguous, its
            elements distinct (not an expanded view).
        block_table: int32 ``[B, max_pages_per_row]`` for a paged cache (``page_table`` is an
            alias), last dim contiguous: then ``k_cache``/``v_cache`` are ``[num_pages, page_size,
            H_kv, D]`` (at least one page), any page size >= 1, key ``n`` of row ``b`` lives in
            page ``block_table[b, n // page_size]``; a table of 0 columns is a cache of no keys.
            Pages may be shared and in any order; entries past a row's last page are never read.
            Page ids are not range-checked (that needs a host sync: see :func:`check_inputs`); an
            id outside the cache is clamped into it, so it reads a wrong page, never stray memory.
        k_descale, v_descale: fp32 dequantization scales for an fp8 (``float8_e4m3fn`` /
            ``float8_e5m2``) cache with a 16-bit ``q``: one element, or ``[B, H_kv]`` (any
            strides). The attention is that of the cache times its scale; the output is in q's
            dtype.
        window_size: ``(left, right)`` sliding window, -1 = unbounded (FlashAttention's): query
            ``i`` of a row of ``S`` keys sits at position ``p = S - L_q + i`` and sees keys
            ``p - left .. p + right``; ``causal`` makes ``right`` 0. The splits cover only the keys
            some query can see: a 4k window over a 128k cache is split like a 4k cache.
        softcap: when > 0, scores become ``softcap * tanh(score * softmax_scale / softcap)``
            before the mask (Gemma 2).
        sinks: fp32/bf16/fp16 ``[H_q]``, one learned logit per q head that joins each softmax's
            denominator only (gpt-oss): ``out = sum_j exp(s_j - lse) v_j`` with ``lse`` (also the
            returned one) counting ``exp(sink)`` once. A query that sees no key gets O = 0 and
            LSE = its sink.
        batch_invariant: each row's output and LSE are bitwise the same whatever else is in the
            call: the batch size, the other rows and their lengths, the row's position in the
            batch, the cache's capacity, and a dense or a paged cache (any page size). Each row
            is split by its own length alone (:func:`flashsplit.plan.tokens_per_split`) and its
            splits merged in a fixed order, on kernel configurations that follow none of these;
            ``backend="auto"`` picks the same backend for every such call (the ``batch-invariant``
            rule of :mod:`flashsplit.selection`). Not covered: another backend, GPU model, dtype,
            head layout, the attention options, or a change of the row's own keys or length.
            ``num_splits`` must then be 0.
        backend: ``"auto"`` (the best backend that supports the problem), ``"triton"`` or ``"cute"``.
        k, v: ``[B, L_new, H_kv, D]`` in q's dtype, last dim contiguous, ``L_new`` >= 1: new keys
            and values, written into the caches (in place) at keys ``[cache_seqlens[b],
            cache_seqlens[b] + L_new)`` of row b (dense, through ``block_table``, or in cache row
            ``cache_batch_idx[b]``) before the attention, which then covers ``cache_seqlens[b] +
            L_new`` keys; ``cache_seqlens`` (required) itself is not changed. An fp8 cache stores
            ``k / k_descale`` (fp32 division, saturated to the format's largest finite value,
            rounded to nearest even). A new key past the capacity (a wrong length, unchecked
            without a host sync: :func:`check_inputs`) is not written and the row's length is
            clamped to the capacity: a wrong row, never a stray write. The attention kernel writes
            the new keys itself, in the same launch; graph-capturable.
        rotary_cos, rotary_sin: ``[L_ro, rotary_dim / 2]`` in q's dtype or float32, contiguous,
            ``rotary_dim <= D`` and ``L_ro >= `` the cache's capacity; only with ``k``/``v``.
            Rotate the new keys at positions ``cache_seqlens[b] - cache_leftpad[b] + t`` and q
            (as it is loaded; ``q`` itself is not changed) at the same positions when causal or
            windowed, else every q row at ``cache_seqlens[b] - cache_leftpad[b]`` (the leftpad
            clamped as below). Causal or windowed with more queries than new keys (``L_q >
            L_new``), query ``i`` reaches position ``capacity - L_new + i``: then ``L_ro >=
            capacity + L_q - L_new`` (a shorter table is refused). The first ``rotary_dim``
            features rotate, the rest pass through.
        rotary_interleaved: True: pairs of features ``(2j, 2j + 1)`` (GPT-J); False: ``(j, j +
            rotary_dim / 2)`` (GPT-NeoX).
        cache_batch_idx: int32 ``[B]``, dense caches only: row b reads (and writes) cache row
            ``cache_batch_idx[b]`` of caches ``[B_cache, L_k, H_kv, D]`` of any ``B_cache >= 1``.
            Indices are clamped into the cache; with ``k`` they should be distinct (duplicates
            write the same row twice, in no defined order).
        cache_leftpad: int32 ``[B]``: row b's keys are ``[cache_leftpad[b], cache_seqlens[b])``
            (left-padded batched prompts); positions for causal, windowed and rotary attention
            count from its first real key. Clamped into ``[0, seqlen]`` on the device.

    Returns:
        ``out`` ``[B, L_q, H_q, D]`` in q's dtype, and with ``return_lse`` also ``lse`` fp32
        ``[B, H_q, L_q]`` (natural log).

    Never synchronizes with the host, so it can be captured in a CUDA graph; the split count
    depends on shapes only, so one captured graph serves any ``cache_seqlens``. Under
    ``torch.compile`` it runs as the custom operator ``torch.ops.flashsplit.decode_into`` (one
    opaque graph node, no graph break).
    """
    # The last signature's native step (flashsplit.native): None unless this call has that
    # signature and can launch without Python work; then the path below runs. Read only outside
    # torch.compile (Dynamo would guard on it).
    step = None if _is_compiling() else _HOST_STEPS.step
    if step is not None:
        result = step(q, k_cache, v_cache, out, cache_seqlens, block_table, page_table, k_descale, v_descale, sinks,
                      k, v, rotary_cos, rotary_sin, cache_batch_idx, cache_leftpad, return_lse, softmax_scale, causal,
                      num_splits, backend, window_size, softcap, batch_invariant, rotary_interleaved)
        if result is not None:
            return result
    if page_table is not None:
        if block_table is not None:
            raise ValueError("page_table: an alias of block_table; pass one of them, not both")
        block_table = page_table
    if return_lse is not False and return_lse is not True:
        raise TypeError(f"return_lse: expected a bool, got {type(return_lse).__name__}")
    lse = None
    fresh_out = out is None
    if isinstance(q, torch.Tensor) and q.dim() == 4:  # else decode_into names the problem
        try:
            if fresh_out:
                out = torch.empty_like(q)
            if return_lse:
                batch, seqlen_q, num_heads, _ = q.shape
                lse = torch.empty((batch, num_heads, seqlen_q), dtype=torch.float32, device=q.device)
        except (RuntimeError, NotImplementedError):  # a nested or other odd q: validation names it
            pass
    # Built with tuple.__new__ (``_make``), which skips the NamedTuples' keyword binding: this
    # runs on every eager step.
    tensors = _tensors((q, k_cache, v_cache, out, lse, cache_seqlens, block_table, k_descale, v_descale, sinks,
                        k, v, rotary_cos, rotary_sin, cache_batch_idx, cache_leftpad))
    options = _options((softmax_scale, causal, num_splits, backend,
                        tuple(window_size) if isinstance(window_size, list) else window_size, softcap,
                        batch_invariant, rotary_interleaved))
    if _is_compiling():
        # Dynamo cannot trace the kernel launchers (nor validate fake tensors' pointers): the
        # operator validates and launches when the compiled graph runs. A call that writes new
        # keys goes through the operator whose schema says the caches are written.
        operator = torch_ops.decode_into if k is None and v is None else torch_ops.decode_append_into
        operator(*tensors, *options)
    else:
        dispatch.decode_into(tensors, options, fresh_out)
    return (out, lse) if return_lse else out


_tensors = DecodeTensors._make
_options = DecodeOptions._make
_is_compiling = torch.compiler.is_compiling
_HOST_STEPS = dispatch.HOST_STEPS


def decode_into(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor | None,
    *,
    cache_seqlens: torch.Tensor | None = None,
    block_table: torch.Tensor | None = None,
    k_descale: torch.Tensor | None = None,
    v_descale: torch.Tensor | None = None,
    softmax_scale: float | None = None,
    causal: bool = False,
    num_splits: int = 0,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    sinks: torch.Tensor | None = None,
    batch_invariant: bool = False,
    backend: str = "auto",
    k: torch.Tensor | None = None,
    v: torch.Tensor | None = None,
    rotary_cos: torch.Tensor | None = None,
    rotary_sin: torch.Tensor | None = None,
    cache_batch_idx: torch.Tensor | None = None,
    cache_leftpad: torch.Tensor | None = None,
    rotary_interleaved: bool = True,
) -> None:
    """:func:`decode` writing into given outputs: ``out`` ``[B, L_q, H_q, D]`` (q's dtype) and,
    unless None, ``lse`` fp32 ``[B, H_q, L_q]``, contiguous. Validates every argument."""
    dispatch.decode_into(_tensors((q, k_cache, v_cache, out, lse, cache_seqlens, block_table, k_descale, v_descale,
                                   sinks, k, v, rotary_cos, rotary_sin, cache_batch_idx, cache_leftpad)),
                         _options((softmax_scale, causal, num_splits, backend, _pair(window_size), softcap,
                                   batch_invariant, rotary_interleaved)))


def _pair(window_size):
    """A list ``window_size`` as a tuple (the options are hashed); anything else as given (validated)."""
    return tuple(window_size) if isinstance(window_size, list) else window_size


def combine(
    out_partial: torch.Tensor,
    lse_partial: torch.Tensor,
    *,
    out: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    sinks: torch.Tensor | None = None,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge split partials into the attention output.

    Args:
        out_partial: fp32 ``[S, B, L_q, H_q, D]``, last dim contiguous.
        lse_partial: fp32 ``[S, B, H_q, L_q]``, natural log; ``-inf`` marks an empty split,
            whose ``out_partial`` slice is never read.
        out: optional ``[B, L_q, H_q, D]`` output, float16, bfloat16 or float32, last dim
            contiguous; else a new one of ``out_dtype`` (one of those three; default float32).
        sinks: fp32/bf16/fp16 ``[H_q]``: each q head's learned logit joins its softmax once (as
            :func:`decode`'s ``sinks``; partials never hold them).
        backend: which backend's combine kernel runs.

    Returns:
        ``(out, lse)``: ``out`` ``[B, L_q, H_q, D]`` and ``lse`` fp32 ``[B, H_q, L_q]``; a row
        whose splits are all empty gets O = 0 and LSE = -inf.
    """
    out_dtype = check_combine_inputs(out_partial, lse_partial, out, out_dtype)
    if not isinstance(backend, str):
        raise TypeError(f"backend: expected a str, got {type(backend).__name__}")
    num_splits, batch, seqlen_q, num_heads, head_dim = out_partial.shape
    if out is None:
        out = torch.empty((batch, seqlen_q, num_heads, head_dim), dtype=out_dtype, device=out_partial.device)
    if sinks is not None:
        check_sinks(sinks, num_heads, out_partial.device)
    lse = torch.empty((batch, num_heads, seqlen_q), dtype=torch.float32, device=out_partial.device)
    if out.numel() > 0:
        problem = DecodeProblem(
            batch=batch, seqlen_q=seqlen_q, seqlen_k=0, num_heads=num_heads, num_heads_kv=num_heads,
            head_dim=head_dim, dtype=out.dtype, causal=False, has_cache_seqlens=False,
            device_type=out_partial.device.type, has_sinks=sinks is not None,
        )
        chosen = select(problem, backend)[0]
        if sinks is None:
            chosen.combine(out_partial, lse_partial, out, lse)
        else:
            chosen.combine(out_partial, lse_partial, out, lse, sinks=sinks)
    return out, lse
