"""The shared split boundary rule (:mod:`flashsplit.plan`) as CuTeDSL device helpers.

The split kernel calls these, so every CTA owns exactly the keys
:func:`flashsplit.plan.split_bounds` gives its split (the same rule as
``flashsplit/triton/split_rule.py``), in multiples of :data:`flashsplit.plan.SPLIT_GRANULE`.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int32

from ..plan import SPLIT_GRANULE


@cute.jit
def load_seqlen(mSeqlens: cute.Tensor, b: Int32, capacity: Int32) -> Int32:
    """Row ``b``'s live length, clamped to ``capacity``: a wrong ``cache_seqlens`` value (which
    ``decode`` cannot check without a host sync) must not send a CTA past the cache. A negative
    length needs no lower clamp: every split of it comes out empty (``row_split_range``)."""
    return cutlass.min(mSeqlens[b], capacity)


@cute.jit
def row_tokens_per_split(seqlen: Int32, num_splits: Int32) -> Int32:
    """Keys per split of a row holding ``seqlen`` keys (a multiple of the granule; 0 when empty)."""
    g = SPLIT_GRANULE
    return ((seqlen + g - 1) // g + num_splits - 1) // num_splits * g


@cute.jit
def row_split_range(seqlen: Int32, split: Int32, num_splits: Int32):
    """``(start, end)`` of one split of a row; empty when ``end <= start``."""
    tps = row_tokens_per_split(seqlen, num_splits)
    start = split * tps
    end = cutlass.min(start + tps, seqlen)
    return start, end
