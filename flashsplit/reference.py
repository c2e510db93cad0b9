"""Reference decode attention in plain PyTorch (float32 / float64), for tests and benchmarks.

It follows the same conventions as the kernels: bottom-right causal alignment, natural-log LSE,
a row with no visible key gives O = 0 and LSE = -inf, and :func:`split_partials_ref` cuts each
row at exactly the boundaries of :mod:`flashsplit.plan`, so kernels can be checked split by split.
"""

from __future__ import annotations

import math

import torch

from .plan import SPLIT_GRANULE, split_bounds


def _visible_mask(
    batch: int, seqlen_q: int, seqlen_k: int, cache_seqlens: torch.Tensor | None, causal: bool, device,
    window_size: tuple[int, int] = (-1, -1), cache_leftpad: torch.Tensor | None = None,
) -> torch.Tensor:
    """Bool ``[B, L_q, L_k]``: may query position m of row b see key j.

    Query m of a row of n keys is token ``p = n - L_q + m``; it sees keys ``j < n`` with
    ``p - left <= j <= p + right`` (``window_size = (left, right)``, -1 unbounded; causal: right 0)
    and, with ``cache_leftpad``, ``j >= cache_leftpad[b]`` (the row's keys start there; positions
    relative to that start give the same masks).
    """
    keys = torch.arange(seqlen_k, device=device)[None, None, :]
    if cache_seqlens is None:
        lengths = torch.full((batch,), seqlen_k, device=device, dtype=torch.long)
    else:
        lengths = cache_seqlens.to(device=device, dtype=torch.long)
    pos = (lengths[:, None] - seqlen_q + torch.arange(seqlen_q, device=device))[:, :, None]  # [B, L_q, 1]
    left, right = window_size
    if causal:
        right = 0
    visible = keys < lengths[:, None, None]
    if cache_leftpad is not None:
        visible = visible & (keys >= cache_leftpad.to(device=device, dtype=torch.long)[:, None, None])
    if right >= 0:
        visible = visible & (keys <= pos + right)
    if left >= 0:
        visible = visible & (keys >= pos - left)
    return visible


def attention_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cache_seqlens: torch.Tensor | None = None,
    causal: bool = False,
    softmax_scale: float | None = None,
    upcast: bool = True,
    key_range: tuple[torch.Tensor, torch.Tensor] | None = None,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    sinks: torch.Tensor | None = None,
    cache_leftpad: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Decode attention, computed directly from the definitions.

    q ``[B, L_q, H_q, D]``, k/v ``[B, L_k, H_kv, D]``; returns ``out`` ``[B, L_q, H_q, D]`` and
    ``lse`` fp32 ``[B, H_q, L_q]``. With ``upcast`` the math runs in float64 and ``out`` is
    float64; without it, in the inputs' dtype (what "PyTorch in the same precision" means for
    error budgets). ``key_range`` (``start``, ``end`` int tensors ``[B]``) further restricts
    each row to keys ``[start, end)``. Masked keys are excluded by selection, so NaN in unused
    cache slots never reaches the result. ``window_size`` as in :func:`_visible_mask`;
    ``softcap`` > 0: scores ``softcap * tanh(q.k * scale / softcap)``; ``sinks`` ``[H_q]``: each q
    head's logit joins its softmax denominator (and the LSE), never the output; ``cache_leftpad``
    ``[B]``: row b's keys start at ``cache_leftpad[b]``.
    """
    batch, seqlen_q, num_heads, head_dim = q.shape
    seqlen_k, num_heads_kv = k.shape[1], k.shape[2]
    group = num_heads // num_heads_kv
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(head_dim)
    compute = torch.float64 if upcast else q.dtype
    # GQA without copying K/V per q head: q heads as [H_kv, group] (q head = kv head * group + g).
    qc = q.to(compute).reshape(batch, seqlen_q, num_heads_kv, group, head_dim)
    kc, vc = k.to(compute), v.to(compute)
    visible = _visible_mask(batch, seqlen_q, seqlen_k, cache_seqlens, causal, q.device, window_size, cache_leftpad)
    if key_range is not None:
        keys = torch.arange(seqlen_k, device=q.device)
        start, end = (t.to(q.device, torch.long) for t in key_range)
        visible = visible & ((keys >= start[:, None]) & (keys < end[:, None]))[:, None, :]
    hidden = ~visible[:, None, None, :, :]  # [B, 1, 1, L_q, L_k]
    # Scores in the compute dtype (as a low-precision kernel would get them), softmax in >= fp32.
    scores = (torch.einsum("bmkgd,bjkd->bkgmj", qc, kc) * scale).to(torch.float64 if upcast else torch.float32)
    if softcap > 0:
        scores = softcap * torch.tanh(scores / softcap)
    scores = scores.masked_fill(hidden, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)  # [B, H_kv, group, L_q]
    if sinks is not None:
        sink = sinks.to(scores.dtype).reshape(1, num_heads_kv, group, 1).expand_as(lse)
        lse = torch.logaddexp(lse, sink)
    probs = torch.exp(scores - torch.where(torch.isneginf(lse), 0.0, lse)[..., None]).masked_fill(hidden, 0.0)
    # Keys no query may see are zeroed by selection, so NaN in unused slots never reaches out.
    vc = torch.where(visible.any(dim=1)[:, :, None, None], vc, torch.zeros((), dtype=vc.dtype, device=vc.device))
    out = torch.einsum("bkgmj,bjkd->bmkgd", probs.to(compute), vc).reshape(batch, seqlen_q, num_heads, head_dim)
    lse = lse.reshape(batch, num_heads, seqlen_q)
    return out, lse.float()


def split_partials_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cache_seqlens: torch.Tensor | None,
    num_splits: int,
    causal: bool = False,
    softmax_scale: float | None = None,
    granule: int = SPLIT_GRANULE,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    batch_invariant: bool = False,
    cache_leftpad: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-split partials with the plan's boundaries (window, fixed split length and left padding
    included), in float64 math; sinks never enter partials (the combine adds them).

    Returns ``out_partial`` fp32 ``[S, B, L_q, H_q, D]`` and ``lse_partial`` fp32
    ``[S, B, H_q, L_q]``; a split with no visible key has LSE ``-inf`` and O = 0.
    """
    batch, seqlen_q, seqlen_k = q.shape[0], q.shape[1], k.shape[1]
    lengths = [seqlen_k] * batch if cache_seqlens is None else [int(n) for n in cache_seqlens.cpu()]
    pads = [0] * batch if cache_leftpad is None else [int(p) for p in cache_leftpad.cpu()]
    bounds = [split_bounds(n, num_splits, granule, seqlen_q=seqlen_q, window_left=window_size[0],
                           invariant=batch_invariant, leftpad=pad)
              for n, pad in zip(lengths, pads)]
    outs, lses = [], []
    for s in range(num_splits):
        start = torch.tensor([bounds[b][s][0] for b in range(batch)])
        end = torch.tensor([bounds[b][s][1] for b in range(batch)])
        out, lse = attention_ref(q, k, v, cache_seqlens, causal, softmax_scale, key_range=(start, end),
                                 window_size=window_size, softcap=softcap, cache_leftpad=cache_leftpad)
        outs.append(out.float())
        lses.append(lse)
    return torch.stack(outs), torch.stack(lses)


def combine_ref(out_partial: torch.Tensor, lse_partial: torch.Tensor,
                sinks: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge partials (``[S, B, L_q, H_q, D]``, ``[S, B, H_q, L_q]``) in float64; ``sinks``
    ``[H_q]`` join each row's denominator once.

    Returns ``out`` float64 ``[B, L_q, H_q, D]`` and ``lse`` fp32 ``[B, H_q, L_q]``.
    """
    lse_p = lse_partial.double()
    lse = torch.logsumexp(lse_p, dim=0)  # -inf when every split is empty
    if sinks is not None:
        lse = torch.logaddexp(lse, sinks.double().to(lse.device)[None, :, None])
    weights = torch.exp(lse_p - torch.where(torch.isneginf(lse), 0.0, lse))  # [S, B, H, L_q]
    weights = weights.permute(0, 1, 3, 2)[..., None]  # [S, B, L_q, H, 1]
    o_p = torch.where(weights > 0, out_partial.double(), 0.0)  # never let an empty split's O in
    return (weights * o_p).sum(0), lse.float()


def gather_paged(cache: torch.Tensor, block_table: torch.Tensor) -> torch.Tensor:
    """A paged cache ``[num_pages, page_size, H_kv, D]`` as the dense ``[B, max_pages * page_size,
    H_kv, D]`` cache it stands for (row b's key n is ``cache[block_table[b, n // page_size],
    n % page_size]``). Entries of ``block_table`` out of range are clamped, so a table padded
    with garbage past a row's pages still gathers (those keys are past the row's length)."""
    pages = block_table.long().clamp(0, cache.shape[0] - 1)
    batch, max_pages = pages.shape
    return cache[pages].reshape(batch, max_pages * cache.shape[1], *cache.shape[2:])


def dequantize(cache: torch.Tensor, descale: torch.Tensor | None, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``cache * descale`` in ``dtype`` for a dense ``[B, L, H_kv, D]`` cache; ``descale`` is one
    element or ``[B, H_kv]`` (None: no scaling)."""
    out = cache.to(dtype)
    if descale is None:
        return out
    scale = descale.to(dtype)
    scale = scale.reshape(()) if scale.numel() == 1 else scale[:, None, :, None]
    return out * scale


def rotary_ref(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor,
               interleaved: bool = True) -> torch.Tensor:
    """Rotary embedding of ``x`` ``[B, L, H, D]`` at ``positions`` (int ``[B, L]``), in float64.

    ``cos``/``sin`` ``[L_ro, rotary_dim / 2]``; the first ``rotary_dim`` features rotate, the rest
    pass through. ``interleaved``: pairs ``(2j, 2j + 1)`` (GPT-J); else ``(j, j + rotary_dim / 2)``
    (GPT-NeoX). Pair ``j`` of a token at position ``p`` turns by the angle whose cosine is
    ``cos[p, j]``: ``(x0, x1) -> (x0 cos - x1 sin, x0 sin + x1 cos)``. Positions are clamped into
    ``[0, L_ro)``, as the kernels do.
    """
    half = cos.shape[1]
    pos = positions.to(device=cos.device, dtype=torch.long).clamp(0, cos.shape[0] - 1)
    c = cos.double()[pos][:, :, None, :].to(x.device)  # [B, L, 1, half]
    s = sin.double()[pos][:, :, None, :].to(x.device)
    out = x.double().clone()
    if interleaved:
        x0, x1 = out[..., 0:2 * half:2].clone(), out[..., 1:2 * half:2].clone()
        out[..., 0:2 * half:2] = x0 * c - x1 * s
        out[..., 1:2 * half:2] = x0 * s + x1 * c
    else:
        x0, x1 = out[..., :half].clone(), out[..., half:2 * half].clone()
        out[..., :half] = x0 * c - x1 * s
        out[..., half:2 * half] = x0 * s + x1 * c
    return out


def quantize_ref(x: torch.Tensor, dtype: torch.dtype, descale: torch.Tensor | None) -> torch.Tensor:
    """``x`` ``[B, L, H_kv, D]`` as a cache of ``dtype`` stores it: an fp8 cache holds ``x /
    descale`` (fp32 division, saturated to the format's largest finite value, rounded to nearest
    even); a 16-bit one ``x`` rounded to its dtype. ``descale``: one element or ``[B, H_kv]``."""
    if dtype not in (torch.float8_e4m3fn, torch.float8_e5m2):
        return x.to(dtype)
    scale = descale.float().to(x.device)
    scale = scale.reshape(()) if scale.numel() == 1 else scale[:, None, :, None]
    limit = torch.finfo(dtype).max
    return (x.float() / scale).clamp(-limit, limit).to(dtype)


def append_ref(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               cache_seqlens: torch.Tensor, *, block_table: torch.Tensor | None = None,
               cache_batch_idx: torch.Tensor | None = None, k_descale: torch.Tensor | None = None,
               v_descale: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Copies of the caches after writing the new ``k``/``v`` ``[B, L_new, H_kv, D]`` (float64 or
    any dtype: :func:`quantize_ref` stores them) at keys ``[cache_seqlens[b], cache_seqlens[b] +
    L_new)`` of row b: of cache row ``cache_batch_idx[b]`` for a dense cache, through
    ``block_table`` for a paged one. Keys past the capacity are not written."""
    k_cache, v_cache = k_cache.clone(), v_cache.clone()
    k_new = quantize_ref(k, k_cache.dtype, k_descale)
    v_new = quantize_ref(v, v_cache.dtype, v_descale)
    page_size = k_cache.shape[1]
    capacity = page_size * block_table.shape[1] if block_table is not None else k_cache.shape[1]
    for b, start in enumerate(cache_seqlens.tolist()):
        for t in range(k.shape[1]):
            n = start + t
            if not 0 <= n < capacity:
                continue
            if block_table is not None:
                index = (int(block_table[b, n // page_size]), n % page_size)
            else:
                index = (int(cache_batch_idx[b]) if cache_batch_idx is not None else b, n)
            k_cache[index] = k_new[b, t]
            v_cache[index] = v_new[b, t]
    return k_cache, v_cache
