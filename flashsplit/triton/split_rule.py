"""The shared split boundary rule (:mod:`flashsplit.plan`) as Triton device functions.

Both Triton kernels call these, so the split kernel and the combine agree, token for token,
with :func:`flashsplit.plan.split_bounds`.
"""

import triton
import triton.language as tl


@triton.jit
def load_seqlen(SEQLENS, b, capacity):
    """Row b's live length, clamped to [0, capacity]: a wrong ``cache_seqlens`` value (which
    ``decode`` cannot check without a host sync) must not send a kernel past the cache."""
    return tl.minimum(tl.maximum(tl.load(SEQLENS + b), 0), capacity)


@triton.jit
def row_tokens_per_split(seqlen, num_splits, GRANULE: tl.constexpr):
    """Keys per split of a row holding ``seqlen`` keys (a multiple of GRANULE; 0 when empty)."""
    n_granules = tl.cdiv(seqlen, GRANULE)
    return tl.cdiv(n_granules, num_splits) * GRANULE


@triton.jit
def row_split_range(seqlen, split, num_splits, GRANULE: tl.constexpr):
    """``(start, end)`` of one split of a row; empty when ``end <= start``."""
    tps = row_tokens_per_split(seqlen, num_splits, GRANULE)
    start = split * tps
    end = tl.minimum(start + tps, seqlen)
    return start, end


@triton.jit
def row_splits_used(seqlen, num_splits, GRANULE: tl.constexpr):
    """How many splits of a row hold at least one key (0 for an empty row)."""
    tps = row_tokens_per_split(seqlen, num_splits, GRANULE)
    return tl.cdiv(seqlen, tl.maximum(tps, 1))
