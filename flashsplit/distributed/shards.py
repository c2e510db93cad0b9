"""One rank's attention over its shard of each row's keys, as partials for the merge.

A shard holds keys ``[kv_offset[b], kv_offset[b] + n[b])`` of row b (local keys ``[0, n[b])``),
whose total length over all ranks is ``S[b]``. Query ``i`` of ``L_q`` sits at the global position
``P = S - L_q + i`` (bottom-right aligned) and sees global keys ``P - left <= g <= P + right``
(``window_size``; ``causal`` makes ``right`` 0; -1 unbounded). On the shard that is the local
range ``[lo_i, hi_i)`` with ``lo_i = clamp(P - left - kv_offset, 0, n)`` and ``hi_i = clamp(P +
right + 1 - kv_offset, 0, n)``. decode's own masks place the queries at the shard's end, not
at ``P``, so each range is given to decode through per-row arguments it does have:

- **plain** (no left bound, and no right bound or ``L_q = 1``): every query sees every local key;
  one decode of the shard as it is.
- **bulk and tail** (no left bound, a right bound, ``L_q > 1``: causal speculative decoding):
  ``hi_0 <= hi_1 <= ...``, so keys ``[0, hi_0)`` are seen by every query: one decode with
  ``cache_seqlens = hi_0`` (the bulk); the rest, ``[hi_0, hi_i)``, at most ``L_q - 1`` keys per
  query, is one decode of ``B * L_q`` rows of one query each, row ``(b, i)`` bounded by
  ``cache_leftpad = hi_0`` and ``cache_seqlens = hi_i`` (the tail). Two partials.
- **per query** (a left bound: sliding windows): the ``B * L_q`` one-query rows over ``[lo_i,
  hi_i)`` directly; a window bounds what each reads. One partial.

One-query rows read row b's cache through ``cache_batch_idx`` (dense) or a narrow page table
gathered on the device from the pages around the row's range (paged), so the tail reads only
the pages it needs.
"""

from __future__ import annotations

import torch

from ..api import decode

#: How a shard's attention is expressed through decode (see the module docstring).
PLAIN, BULK_AND_TAIL, PER_QUERY = "plain", "bulk-and-tail", "per-query"


def shard_layout(seqlen_q: int, window_left: int, window_right: int) -> str:
    """Which decomposition a shard needs, from static facts only (``window_right`` 0 when causal)."""
    if window_left >= 0:
        return PER_QUERY
    if window_right >= 0 and seqlen_q > 1:
        return BULK_AND_TAIL
    return PLAIN


def key_ranges(n: torch.Tensor, kv_offset: torch.Tensor, total: torch.Tensor, seqlen_q: int,
               window_left: int, window_right: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Local ``[lo, hi)`` int64 ``[B, L_q]`` of the keys each query sees on this shard: ``n``
    local lengths, ``kv_offset`` the shard's first global key, ``total`` the rows' total lengths
    (all ``[B]``)."""
    n = n.long()[:, None]
    pos = (total.long() - seqlen_q - kv_offset.long())[:, None] + torch.arange(seqlen_q, device=n.device)
    lo = (pos - window_left).clamp(min=0) if window_left >= 0 else torch.zeros_like(pos)
    lo = torch.minimum(lo, n)
    hi = (pos + window_right + 1).clamp(min=0) if window_right >= 0 else n.expand_as(pos)
    hi = torch.minimum(hi, n)
    return lo, torch.maximum(hi, lo)


def row_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor,
               *, span: int, block_table: torch.Tensor | None, cache_batch_idx: torch.Tensor | None,
               k_descale: torch.Tensor | None, v_descale: torch.Tensor | None, **options
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of each query ``(b, i)`` of q ``[B, L_q, H_q, D]`` to local keys ``[lo[b, i],
    hi[b, i])`` (int64 ``[B, L_q]``, ``hi - lo <= span``), as ``B * L_q`` decode rows of one query.

    Returns ``out`` ``[B, L_q, H_q, D]`` and ``lse`` fp32 ``[B, H_q, L_q]``.
    """
    batch, seqlen_q, num_heads, head_dim = q.shape
    rows = batch * seqlen_q
    if block_table is not None and seqlen_q > 1:
        # A narrow table per query row: the pages from the one holding lo onwards, enough for
        # `span` keys; columns past the row's table are clamped (never read: past hi).
        page_size, width = k_cache.shape[1], block_table.shape[1]
        pages = min(width, (span + 2 * page_size - 2) // page_size)
        first_page = torch.div(lo, page_size, rounding_mode="floor")
        cols = (first_page[..., None] + torch.arange(pages, device=q.device)).clamp(max=max(width - 1, 0))
        table = block_table.long()[:, None, :].expand(batch, seqlen_q, width)
        block_table = torch.gather(table, 2, cols).to(torch.int32).reshape(rows, pages)
        lo, hi = lo - first_page * page_size, hi - first_page * page_size
    elif block_table is None and seqlen_q > 1:
        source = cache_batch_idx if cache_batch_idx is not None else torch.arange(batch, device=q.device)
        cache_batch_idx = source.to(torch.int32).repeat_interleave(seqlen_q)
    if seqlen_q > 1:
        k_descale, v_descale = (s.repeat_interleave(seqlen_q, dim=0) if s is not None and s.numel() != 1 else s
                                for s in (k_descale, v_descale))
    out, lse = decode(q.reshape(rows, 1, num_heads, head_dim), k_cache, v_cache,
                      cache_seqlens=hi.to(torch.int32).reshape(rows), cache_leftpad=lo.to(torch.int32).reshape(rows),
                      block_table=block_table, cache_batch_idx=cache_batch_idx, k_descale=k_descale,
                      v_descale=v_descale, return_lse=True, **options)
    return out.view(batch, seqlen_q, num_heads, head_dim), lse.view(batch, seqlen_q, num_heads).transpose(1, 2)


def shard_partials(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, *, layout: str,
                   n: torch.Tensor, cache_seqlens: torch.Tensor | None, kv_offset: torch.Tensor | None,
                   total: torch.Tensor | None, capacity: int, window_left: int, window_right: int,
                   block_table: torch.Tensor | None, cache_batch_idx: torch.Tensor | None,
                   k_descale: torch.Tensor | None, v_descale: torch.Tensor | None, num_splits: int,
                   batch_invariant: bool, backend: str, **scores) -> tuple[list, list]:
    """This rank's partials ``(outs, lses)`` (lists of ``[B, L_q, H_q, D]`` and fp32 ``[B, H_q,
    L_q]``) for ``layout``; ``n`` are the clamped local lengths, ``total`` the rows' total
    lengths (None for ``PLAIN``). ``scores``: ``softmax_scale`` and ``softcap``."""
    cache = dict(block_table=block_table, cache_batch_idx=cache_batch_idx, k_descale=k_descale, v_descale=v_descale)
    options = dict(batch_invariant=batch_invariant, **scores)
    # One-query rows need cache_leftpad, which the cute backend does not take (auto runs Triton).
    row_backend = "auto" if backend == "cute" else backend
    if layout == PLAIN:
        out, lse = decode(q, k_cache, v_cache, cache_seqlens=cache_seqlens, num_splits=num_splits, backend=backend,
                          return_lse=True, **cache, **options)
        return [out], [lse]
    seqlen_q = q.shape[1]
    lo, hi = key_ranges(n, kv_offset, total, seqlen_q, window_left, window_right)
    if layout == PER_QUERY:
        span = capacity if window_right < 0 else min(capacity, window_left + window_right + 1)
        out, lse = row_decode(q, k_cache, v_cache, lo, hi, span=span, num_splits=num_splits, backend=row_backend,
                              **cache, **options)
        return [out], [lse]
    bulk_end = hi[:, :1]
    o_bulk, lse_bulk = decode(q, k_cache, v_cache, cache_seqlens=bulk_end.to(torch.int32).reshape(-1).contiguous(),
                              num_splits=num_splits, backend=backend, return_lse=True, **cache, **options)
    # The tail holds at most L_q - 1 keys per query: one split (batch-invariant decode picks its own).
    o_tail, lse_tail = row_decode(q, k_cache, v_cache, bulk_end.expand_as(hi), hi, span=min(capacity, seqlen_q - 1),
                                  num_splits=0 if batch_invariant else 1, backend=row_backend, **cache, **options)
    return [o_bulk, o_tail], [lse_bulk, lse_tail]
