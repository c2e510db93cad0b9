"""The shared split boundary rule (:mod:`flashsplit.plan`) as Triton device functions.

Both Triton kernels call these, so the split kernel and the combine agree, token for token,
with :func:`flashsplit.plan.split_bounds`: a row's splits cover ``[first, seqlen)``, where
``first`` is 0, or with a left window bound the first key any query of the row can see,
rounded down to the granule; INVARIANT (batch-invariant decode) splits a row by its own length
(BATCH_INVARIANT_SPLITS splits of at least BATCH_INVARIANT_MIN_SPLIT keys) instead of dividing
its span among the launch's splits. A left-padded row (``cache_leftpad``) is split as the row of
its real keys, shifted by its padding (:func:`flashsplit.plan.row_start`).
"""

import triton
import triton.language as tl

from ..plan import BATCH_INVARIANT_MIN_SPLIT as _MIN_SPLIT, BATCH_INVARIANT_SPLITS as _SPLITS

BATCH_INVARIANT_SPLITS = tl.constexpr(_SPLITS)
BATCH_INVARIANT_MIN_SPLIT = tl.constexpr(_MIN_SPLIT)


@triton.jit
def load_seqlen(SEQLENS, b, capacity, SEQLEN_ADD: tl.constexpr):
    """Row b's live length plus the SEQLEN_ADD keys appended before the attention, clamped to
    [0, capacity]: a wrong ``cache_seqlens`` value (which ``decode`` cannot check without a host
    sync) must not send a kernel past the cache."""
    seqlen = tl.load(SEQLENS + b)
    if SEQLEN_ADD != 0:
        seqlen = seqlen + SEQLEN_ADD
    return tl.minimum(tl.maximum(seqlen, 0), capacity)


@triton.jit
def load_leftpad(LEFTPAD, b, seqlen):
    """Row b's first key (``cache_leftpad[b]``), clamped to [0, seqlen]."""
    return tl.minimum(tl.maximum(tl.load(LEFTPAD + b), 0), seqlen)


@triton.jit
def row_first_key(seqlen, seqlen_q, window_left, GRANULE: tl.constexpr, LEFT_BOUND: tl.constexpr):
    """The first key of a row's splits: 0, or (LEFT_BOUND) the first key query 0 can see
    (``seqlen - seqlen_q - window_left``), rounded down to a multiple of GRANULE."""
    if LEFT_BOUND:
        return tl.maximum(seqlen - seqlen_q - window_left, 0) // GRANULE * GRANULE
    else:
        return seqlen * 0


@triton.jit
def padded_row_first_key(seqlen, leftpad, seqlen_q, window_left, GRANULE: tl.constexpr, LEFT_BOUND: tl.constexpr):
    """:func:`row_first_key` of a row whose keys are ``[leftpad, seqlen)``: its real keys' first
    key, shifted by ``leftpad`` (``flashsplit.plan.row_start``)."""
    return leftpad + row_first_key(seqlen - leftpad, seqlen_q, window_left, GRANULE, LEFT_BOUND)


@triton.jit
def row_tokens_per_split(span, num_splits, GRANULE: tl.constexpr, INVARIANT: tl.constexpr):
    """Keys per split of a row whose splits cover ``span`` keys (a multiple of GRANULE; 0 when
    empty); INVARIANT: :func:`flashsplit.plan.tokens_per_split`'s batch-invariant rule."""
    n_granules = tl.cdiv(span, GRANULE)
    if INVARIANT:
        return tl.maximum(tl.cdiv(n_granules, BATCH_INVARIANT_SPLITS) * GRANULE, BATCH_INVARIANT_MIN_SPLIT)
    else:
        return tl.cdiv(n_granules, num_splits) * GRANULE


@triton.jit
def row_split_range(seqlen, first, split, num_splits, GRANULE: tl.constexpr, INVARIANT: tl.constexpr):
    """``(start, end)`` of one split of a row whose splits cover ``[first, seqlen)``; empty when
    ``end <= start``."""
    tps = row_tokens_per_split(seqlen - first, num_splits, GRANULE, INVARIANT)
    start = first + split * tps
    end = tl.minimum(start + tps, seqlen)
    return start, end


@triton.jit
def row_splits_used(span, num_splits, GRANULE: tl.constexpr, INVARIANT: tl.constexpr):
    """How many splits of a row covering ``span`` keys hold at least one key (0 for none)."""
    tps = row_tokens_per_split(span, num_splits, GRANULE, INVARIANT)
    return tl.cdiv(span, tl.maximum(tps, 1))


@triton.jit
def add_sink(lse, sink):
    """Add a learned sink logit to a finished softmax of log-sum-exp ``lse`` (natural log): returns
    ``lse' = log(exp(lse) + exp(sink))`` and the factor ``exp(lse - lse')`` the output is scaled by
    (the sink joins the denominator only). A row that saw no key (``lse = -inf``) gets ``lse' =
    sink`` and factor 0."""
    m = tl.maximum(lse, sink)
    shift = tl.where(m == float("-inf"), 0.0, m)
    lse_sink = shift + tl.log(tl.exp(lse - shift) + tl.exp(sink - shift))
    return lse_sink, tl.where(lse > float("-inf"), tl.exp(lse - lse_sink), 0.0)
