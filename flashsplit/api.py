"""The public API: ``decode``, ``combine`` and ``plan``."""

from __future__ import annotations

import functools

import torch

from . import backends  # noqa: F401  (registers the backends)
from . import torch_ops  # registers torch.ops.flashsplit.decode_into (torch.compile)
from .plan import SplitPlan, cdiv, choose_num_splits, device_num_sms, tokens_per_split, SPLIT_GRANULE
from .problem import (DecodeProblem, check_combine_inputs, check_decode_inputs, check_lse_out,
                      check_plan_args, check_softmax_scale)
from . import registry
from .registry import Backend, select

@functools.lru_cache(maxsize=4096)  # static facts in, frozen plan out: one dict lookup per decode step
def _make_plan(problem: DecodeProblem, backend: Backend, backend_reason: str, num_splits: int, num_sms: int) -> SplitPlan:
    block_m = backend.block_m(problem)
    row_blocks = cdiv(problem.packed_rows, block_m)
    work_units = problem.work_units(block_m)
    units_per_sm = backend.units_per_sm(problem)
    if num_splits == 0:
        num_splits, split_reason = choose_num_splits(work_units, problem.seqlen_k, num_sms, units_per_sm)
    else:
        split_reason = "requested"
    return SplitPlan(
        backend=backend.name,
        backend_reason=backend_reason,
        num_splits=num_splits,
        split_reason=split_reason,
        granule=SPLIT_GRANULE,
        tokens_per_split=tokens_per_split(problem.seqlen_k, num_splits),
        block_m=block_m,
        row_blocks=row_blocks,
        work_units=work_units,
        grid=(num_splits, problem.batch, problem.num_heads_kv * row_blocks),
        num_sms=num_sms,
        units_per_sm=units_per_sm,
        runs_combine=num_splits > 1,
    )


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
    device: str | torch.device = "cuda",
    backend: str = "auto",
) -> SplitPlan:
    """What :func:`decode` will do for these shapes, in pure Python (no GPU needed).

    ``seqlen_k`` is the cache capacity (``k_cache.shape[1]``, or ``max_pages_per_row *
    page_size`` for a paged cache, with ``page_size`` given); ``kv_dtype`` an fp8 cache's dtype;
    ``num_sms`` defaults to the
    device's count (132, an H200's, when there is no CUDA device). ``device="cuda"`` plans
    for the GPU backends even on a machine without one. Arguments describing tensors that
    :func:`decode` would refuse raise its ``TypeError``/``ValueError``.

    >>> p = plan(1, 32768, 32, 8, 128, num_sms=132, backend="triton")
    >>> p.num_splits, p.grid
    (32, (32, 1, 8))
    """
    device = check_plan_args(batch, seqlen_k, num_heads, num_heads_kv, head_dim, seqlen_q, dtype, causal,
                             has_cache_seqlens, page_size, kv_dtype, num_splits, num_sms, device, backend)
    problem = DecodeProblem(
        batch=batch, seqlen_q=seqlen_q, seqlen_k=seqlen_k, num_heads=num_heads, num_heads_kv=num_heads_kv,
        head_dim=head_dim, dtype=dtype, causal=causal, has_cache_seqlens=has_cache_seqlens, device_type=device.type,
        kv_dtype=kv_dtype, page_size=page_size,
    )
    chosen, reason = select(problem, backend)
    return _make_plan(problem, chosen, reason, num_splits, num_sms or device_num_sms(device.type, device.index))


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
    backend: str = "auto",
):
    """Split-KV decode attention over a KV cache (FlashAttention ``flash_attn_with_kvcache`` style).

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
            :func:`flashsplit.problem.check_softmax_scale` for the bound.
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
        backend: ``"auto"`` (the best backend that supports the problem), ``"triton"`` or ``"cute"``.

    Returns:
        ``out`` ``[B, L_q, H_q, D]`` in q's dtype, and with ``return_lse`` also ``lse`` fp32
        ``[B, H_q, L_q]`` (natural log).

    Never synchronizes with the host, so it can be captured in a CUDA graph; the split count
    depends on shapes only, so one captured graph serves any ``cache_seqlens``. Under
    ``torch.compile`` it runs as the custom operator ``torch.ops.flashsplit.decode_into`` (one
    opaque graph node, no graph break).
    """
    if page_table is not None:
        if block_table is not None:
            raise ValueError("page_table: an alias of block_table; pass one of them, not both")
        block_table = page_table
    if not isinstance(return_lse, bool):
        raise TypeError(f"return_lse: expected a bool, got {type(return_lse).__name__}")
    lse = None
    fresh_out = out is None
    if isinstance(q, torch.Tensor) and q.dim() == 4:  # else decode_into names the problem
        try:
            batch, seqlen_q, num_heads, _ = q.shape
            if fresh_out:
                out = torch.empty_like(q)
            if return_lse:
                lse = torch.empty((batch, num_heads, seqlen_q), dtype=torch.float32, device=q.device)
        except (RuntimeError, NotImplementedError):  # a nested or other odd q: validation names it
            pass
    if torch.compiler.is_compiling():
        # Dynamo cannot trace the kernel launchers (nor validate fake tensors' pointers): the
        # operator validates and launches when the compiled graph runs.
        torch_ops.decode_into(q, k_cache, v_cache, cache_seqlens, block_table, k_descale, v_descale, out, lse,
                              softmax_scale, causal, num_splits, backend)
    else:
        _decode_into(q, k_cache, v_cache, out, lse, cache_seqlens, block_table, k_descale, v_descale, softmax_scale,
                     causal, num_splits, backend, fresh_out)
    return (out, lse) if return_lse else out


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
    backend: str = "auto",
) -> None:
    """:func:`decode` writing into given outputs: ``out`` ``[B, L_q, H_q, D]`` (q's dtype) and,
    unless None, ``lse`` fp32 ``[B, H_q, L_q]``, contiguous. Validates every argument.

    The validation, backend choice and plan depend only on static facts of the arguments, so
    they run once per call signature (:func:`_signature`) and are cached with the backend's
    prepared launcher; a decode loop pays them on its first step only.
    """
    _decode_into(q, k_cache, v_cache, out, lse, cache_seqlens, block_table, k_descale, v_descale, softmax_scale,
                 causal, num_splits, backend)


def _decode_into(q, k_cache, v_cache, out, lse, cache_seqlens, block_table, k_descale, v_descale, softmax_scale,
                 causal, num_splits, backend, fresh_out=False) -> None:
    """:func:`decode_into` with positional arguments (the eager hot path of :func:`decode`);
    ``fresh_out``: ``out`` is ``torch.empty_like(q)``, made by :func:`decode`."""
    key = _signature(q, k_cache, v_cache, out, lse, cache_seqlens, block_table, k_descale, v_descale,
                     softmax_scale, causal, num_splits, backend, fresh_out)
    try:
        run = _PREPARED.get(key) if key is not None else None
    except TypeError:  # an unhashable argument (a list as softmax_scale, ...): validation explains
        key = run = None
    if run is None:
        run = _prepare(q, k_cache, v_cache, out, lse, cache_seqlens, block_table, k_descale, v_descale,
                       softmax_scale, causal, num_splits, backend)
        if key is not None:
            if len(_PREPARED) >= _MAX_PREPARED:
                _PREPARED.clear()
            _PREPARED[key] = run
    run(q, k_cache, v_cache, cache_seqlens, block_table, k_descale, v_descale, out, lse)


_PREPARED: dict[tuple, object] = {}
_MAX_PREPARED = 4096
registry.on_change(_PREPARED.clear)  # a prepared launcher embeds the backend choice


_FRESH_OUT = "out = torch.empty_like(q)"  # the marker _signature keys a fresh output by


def _tensor_facts(t):
    """What validation and the kernels' specialization read of an optional tensor argument:
    everything but its values and its address (beyond 16-byte alignment). A tensor of another
    layout than strided has no ``data_ptr()`` (sparse, mkldnn) or no ``shape`` (nested): it
    raises here, so it is never cached."""
    if t is None:
        return None
    if not isinstance(t, torch.Tensor):
        raise TypeError  # validation names it
    return t.shape, t.stride(), t.dtype, t.device, t.data_ptr() & 15


def _descale_facts(t):
    """:func:`_tensor_facts` and the negation bit: a descale may have any strides, so the
    negated view ``z.conj().imag`` of a complex tensor has the facts of a valid one."""
    return None if t is None else (_tensor_facts(t), t.is_neg())


def _signature(q, k_cache, v_cache, out, lse, cache_seqlens, block_table, k_descale, v_descale, softmax_scale,
               causal, num_splits, backend, fresh_out=False) -> tuple | None:
    """A key of one decode call's static facts (:func:`_tensor_facts` of every tensor, the
    scalars with their types), or None (then nothing is cached). It can still be unhashable (an
    unhashable scalar argument): the lookup catches that. The four tensors every call has are
    read inline: this runs on every eager call. A ``fresh_out`` (``torch.empty_like(q)``) is
    keyed by a marker: its facts follow from q's (shape, dtype, device; q's strides where q is
    dense, else contiguous ones; the allocator's alignment).

    Negated views (``is_neg()``, refused by validation) are keyed apart where public ops can
    make one with a valid tensor's facts: the descales. Elsewhere they cannot: ``.conj().imag``
    has a last-dim stride of 2 (never that of a valid q, cache, out or lse) and there are no
    complex int32 tensors; only the private ``torch._neg_view`` makes a unit-stride one, and
    testing every call for it would cost ~0.2 us a tensor here."""
    try:
        if not (type(q) is type(k_cache) is type(v_cache) is type(out) is torch.Tensor):
            return None  # a subclass or a wrong type: validation explains, nothing cached
        out_facts = _FRESH_OUT if fresh_out else (out.shape, out.stride(), out.dtype, out.device, out.data_ptr() & 15)
        return (q.shape, q.stride(), q.dtype, q.device, q.data_ptr() & 15,
                k_cache.shape, k_cache.stride(), k_cache.dtype, k_cache.device, k_cache.data_ptr() & 15,
                v_cache.shape, v_cache.stride(), v_cache.dtype, v_cache.device, v_cache.data_ptr() & 15,
                out_facts,
                # (the usual None arguments skip the call)
                lse if lse is None else _tensor_facts(lse), _tensor_facts(cache_seqlens),
                block_table if block_table is None else _tensor_facts(block_table),
                k_descale if k_descale is None else _descale_facts(k_descale),
                v_descale if v_descale is None else _descale_facts(v_descale),
                type(softmax_scale), softmax_scale, type(causal), causal, type(num_splits), num_splits,
                type(backend), backend)
    except Exception:  # a sparse tensor, ...: validation explains
        return None


def _prepare(q, k_cache, v_cache, out, lse, cache_seqlens, block_table, k_descale, v_descale, softmax_scale,
             causal, num_splits, backend):
    """Validate one call and return ``run(q, k, v, cache_seqlens, block_table, k_descale, v_descale,
    out, lse)`` that decodes every call with the same static facts."""
    problem = check_decode_inputs(q, k_cache, v_cache, cache_seqlens, causal, num_splits, out,
                                  block_table, k_descale, v_descale)
    check_lse_out(lse, problem.batch, problem.num_heads, problem.seqlen_q, q.device)
    softmax_scale = check_softmax_scale(softmax_scale, problem.head_dim)
    if not isinstance(backend, str):
        raise TypeError(f"backend: expected a str, got {type(backend).__name__}")
    chosen, reason = select(problem, backend)
    batch, seqlen_q, num_heads, head_dim = q.shape
    if batch == 0 or num_heads == 0:
        return _nothing_to_do
    if problem.seqlen_k == 0:
        return _no_keys
    the_plan = _make_plan(problem, chosen, reason, num_splits, device_num_sms(q.device.type, q.device.index))
    return chosen.prepare(problem, the_plan.num_splits, softmax_scale, causal)


def _nothing_to_do(*args) -> None:
    pass


def _no_keys(q, k_cache, v_cache, cache_seqlens, block_table, k_descale, v_descale, out, lse) -> None:
    """A cache with no slots: every row is empty (O = 0, LSE = -inf)."""
    out.zero_()
    if lse is not None:
        lse.fill_(float("-inf"))


def combine(
    out_partial: torch.Tensor,
    lse_partial: torch.Tensor,
    *,
    out: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge split partials into the attention output.

    Args:
        out_partial: fp32 ``[S, B, L_q, H_q, D]``, last dim contiguous.
        lse_partial: fp32 ``[S, B, H_q, L_q]``, natural log; ``-inf`` marks an empty split,
            whose ``out_partial`` slice is never read.
        out: optional ``[B, L_q, H_q, D]`` output, float16, bfloat16 or float32, last dim
            contiguous; else a new one of ``out_dtype`` (one of those three; default float32).
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
    lse = torch.empty((batch, num_heads, seqlen_q), dtype=torch.float32, device=out_partial.device)
    if out.numel() > 0:
        problem = DecodeProblem(
            batch=batch, seqlen_q=seqlen_q, seqlen_k=0, num_heads=num_heads, num_heads_kv=num_heads,
            head_dim=head_dim, dtype=out.dtype, causal=False, has_cache_seqlens=False,
            device_type=out_partial.device.type,
        )
        chosen, _ = select(problem, backend)
        chosen.combine(out_partial, lse_partial, out, lse)
    return out, lse
