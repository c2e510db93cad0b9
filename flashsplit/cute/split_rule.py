"""The shared split boundary rule (:mod:`flashsplit.plan`) as CuTeDSL device helpers.

The split kernel and the merge tail call these, so every CTA owns exactly the keys
:func:`flashsplit.plan.split_bounds` gives its split (the same rule as
``flashsplit/triton/split_rule.py``), in multiples of :data:`flashsplit.plan.SPLIT_GRANULE`: a
row's splits cover ``[first, seqlen)``, where ``first`` is 0, or with a left window bound the
first key query 0 can see, or with left padding at least the row's first key, rounded down to the
granule (Triton's kernel rounds a padded row's keys from its padding instead: the split
boundaries differ, the result does not); ``invariant`` (batch-invariant decode)
cuts a row by its own length (``BATCH_INVARIANT_SPLITS`` splits of at least
``BATCH_INVARIANT_MIN_SPLIT`` keys) instead of dividing it among the launch's splits.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int32

from ..plan import BATCH_INVARIANT_MIN_SPLIT, BATCH_INVARIANT_SPLITS, SPLIT_GRANULE


@cute.jit
def load_seqlen(mSeqlens: cute.Tensor, b: Int32, capacity: Int32) -> Int32:
    """Row ``b``'s live length, clamped to ``capacity``: a wrong ``cache_seqlens`` value (which
    ``decode`` cannot check without a host sync) must not send a CTA past the cache. A negative
    length needs no lower clamp: every split of it comes out empty (``row_split_range``)."""
    return cutlass.min(mSeqlens[b], capacity)


@cute.jit
def load_leftpad(mLeftpad: cute.Tensor, b: Int32, seqlen: Int32) -> Int32:
    """Row ``b``'s first key (``cache_leftpad[b]``), clamped to ``[0, seqlen]``."""
    return cutlass.min(cutlass.max(mLeftpad[b], Int32(0)), seqlen)


@cute.jit
def row_first_key(seqlen: Int32, seqlen_q: Int32, window_left: Int32 | None, pad: Int32 | None = None) -> Int32:
    """The first key of a row's splits: under a left window bound (``window_left``), the first
    key query 0 sees (``seqlen - seqlen_q - window_left``, at least 0); with left padding
    (``pad``), at least the row's first key; rounded down to the granule."""
    g = SPLIT_GRANULE
    first = Int32(0)
    if cutlass.const_expr(window_left is not None):
        first = cutlass.max(seqlen - seqlen_q - window_left, Int32(0))
    if cutlass.const_expr(pad is not None):
        first = cutlass.max(first, pad)
    return first // g * g


@cute.jit
def row_tokens_per_split(seqlen: Int32, num_splits: Int32, invariant: cutlass.Constexpr[bool] = False) -> Int32:
    """Keys per split of a row whose splits cover ``seqlen`` keys (a multiple of the granule; 0
    when empty); ``invariant``: :func:`flashsplit.plan.tokens_per_split`'s batch-invariant rule."""
    g = SPLIT_GRANULE
    if cutlass.const_expr(invariant):
        per_split = ((seqlen + g - 1) // g + BATCH_INVARIANT_SPLITS - 1) // BATCH_INVARIANT_SPLITS * g
        return cutlass.max(per_split, Int32(BATCH_INVARIANT_MIN_SPLIT))
    return ((seqlen + g - 1) // g + num_splits - 1) // num_splits * g


@cute.jit
def row_split_range(seqlen: Int32, split: Int32, num_splits: Int32):
    """``(start, end)`` of one split of a row whose splits cover ``[0, seqlen)``; empty when
    ``end <= start``."""
    tps = row_tokens_per_split(seqlen, num_splits)
    start = split * tps
    end = cutlass.min(start + tps, seqlen)
    return start, end


@cute.jit
def row_split_range_from(seqlen: Int32, first: Int32, split: Int32, num_splits: Int32,
                         invariant: cutlass.Constexpr[bool] = False):
    """``(start, end)`` of one split of a row whose splits cover ``[first, seqlen)`` (a window's
    first key, or 0 with ``invariant``); empty when ``end <= start``."""
    tps = row_tokens_per_split(seqlen - first, num_splits, invariant)
    start = first + split * tps
    end = cutlass.min(start + tps, seqlen)
    return start, end


@cute.jit
def split_tiles(n_keys: Int32, first: Int32 | None, split: Int32, num_splits: Int32, cta_first: Int32 | None,
                tile_n: cutlass.Constexpr[int], invariant: cutlass.Constexpr[bool] = False):
    """``(start, end, first_tile, num_tiles)`` of one split of a row of ``n_keys`` keys: its keys
    (:func:`row_split_range_from` from the row's first key ``first``, or :func:`row_split_range`
    from 0 where ``first`` is None), and its ``tile_n``-key tiles from the one holding
    ``cta_first`` (the first key any query of the CTA sees; None: from ``start``) to ``end``."""
    if cutlass.const_expr(first is None):
        start, end = row_split_range(n_keys, split, num_splits)
    else:
        start, end = row_split_range_from(n_keys, first, split, num_splits, invariant)
    lo = start
    if cutlass.const_expr(cta_first is not None):
        # The tiles before the one holding cta_first hold no key any of the CTA's rows sees.
        lo = cutlass.max(start, cutlass.max(cta_first, Int32(0)) // tile_n * tile_n)
    num_tiles = Int32(0)
    if lo < end:
        num_tiles = (end - lo + tile_n - 1) // tile_n
    return start, end, lo // tile_n, num_tiles
