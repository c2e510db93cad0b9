"""Property-based tests (hypothesis) of calls that update the cache: drawn appends against the
float64 reference, caches and attention both (flashsplit.testing_kvcache).

Drawn: 1-16 new keys and 1-16 queries, GQA groups of 1-9 (up to two row tiles per KV head),
lengths from 0 to the capacity's last slot, left padding (negative and past the row's keys
too), dense caches or rows of a larger one
(cache_batch_idx), pages of 1, 16 or 48 keys, fp8 caches, rotary of either pairing, causal
masks and windows (short enough that new keys fall before a window's first split), softcap,
sinks, batch invariance, and split counts from 1 to 7 or the heuristic's (batch-invariant calls take their own). Every slot a row does
not use holds NaN and the output starts as NaN. On the CPU the Triton backend runs (the
interpreter, fp16); on a CUDA machine every backend that supports a call runs it, in bf16 too.
The default run draws a fixed, reproducible set of examples; ``--full`` draws more.
"""

from __future__ import annotations

import zlib

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from flashsplit.testing_kvcache import KVCacheCase

from conftest import HAS_CUDA
from test_kvcache import _run

DTYPES = [torch.float16, torch.bfloat16] if HAS_CUDA else [torch.float16]
_SETTINGS = dict(derandomize=True, deadline=None, database=None, print_blob=True,
                 suppress_health_check=list(HealthCheck))


@st.composite
def kvcache_cases(draw, padded_rotary: bool = False) -> KVCacheCase:
    """A valid cache-updating call: the new keys fit each row's capacity. ``padded_rotary``: always
    left padding and rotary."""
    batch = draw(st.integers(1, 3))
    page_size = draw(st.sampled_from([0, 0, 1, 16, 48]))
    seqlen_k = draw(st.sampled_from([64, 200, 300]))
    capacity = -(-seqlen_k // page_size) * page_size if page_size else seqlen_k
    seqlen_new = draw(st.integers(1, 16))
    # Lengths anywhere, or just below a split granule (128 keys): new keys then straddle a split
    # boundary, and with a short window some fall before the window's first split.
    room = capacity - seqlen_new
    near_granule = st.builds(lambda g, back: min(room, max(0, g - back)), st.sampled_from([128, 256]),
                             st.integers(1, seqlen_new))
    lengths = tuple(draw(st.lists(st.one_of(st.integers(0, room), near_granule), min_size=batch, max_size=batch)))
    leftpad = None
    if padded_rotary or draw(st.booleans()):
        # In the row's keys, or out of range: negative (clamped to 0) or past its old keys, into or
        # past the new ones (clamped to the row's length with them).
        leftpad = tuple(draw(st.one_of(st.integers(0, n), st.integers(-9, -1), st.integers(n + 1, n + seqlen_new + 9)))
                        for n in lengths)
    causal = draw(st.booleans())
    window = draw(st.sampled_from([(-1, -1), (-1, -1), (0, 0), (2, 0), (40, 0), (30, -1)]))
    if causal and window[1] not in (-1, 0):
        window = (window[0], 0)
    head_dim = draw(st.sampled_from([32, 64]))
    rotary_dim = draw(st.sampled_from([16, head_dim] if padded_rotary else [0, 0, 16, head_dim]))
    return KVCacheCase(
        batch=batch, seqlen_k=seqlen_k, num_heads_kv=draw(st.integers(1, 2)), group=draw(st.integers(1, 9)),
        head_dim=head_dim, dtype=draw(st.sampled_from(DTYPES)), lengths=lengths, seqlen_new=seqlen_new,
        seqlen_q=draw(st.sampled_from([0, 1, seqlen_new, 16])), leftpad=leftpad, page_size=page_size,
        kv_dtype=draw(st.sampled_from([None, None, torch.float8_e4m3fn, torch.float8_e5m2])),
        per_head_scale=draw(st.booleans()),
        batch_idx=None if page_size else draw(st.sampled_from([None, None, "permutation", "subset"])),
        rotary_dim=rotary_dim, rotary_interleaved=draw(st.booleans()), causal=causal, window_size=window,
        softcap=draw(st.sampled_from([0.0, 0.0, 5.0])), sinks=draw(st.booleans()),
        **draw(st.sampled_from([{"batch_invariant": True}] + [{"num_splits": n} for n in (0, 1, 2, 3, 7)])))


def _check(case: KVCacheCase) -> None:
    """The case on every backend that supports it (test_kvcache's runner), inputs seeded by the case."""
    _run(case, torch.Generator().manual_seed(zlib.crc32(repr(case).encode())))


@given(case=kvcache_cases())
@settings(max_examples=4, **_SETTINGS)
def test_drawn_appends_match_the_reference(case):
    _check(case)


@pytest.mark.full
@given(case=kvcache_cases())
@settings(max_examples=300, **_SETTINGS)
def test_drawn_appends_match_the_reference_full(case):
    _check(case)


@given(case=kvcache_cases(padded_rotary=True))
@settings(max_examples=4, **_SETTINGS)
def test_drawn_padded_rotary_appends_match_the_reference(case):
    """Left padding with rotary, the pads negative or past the row's keys as often as inside them:
    rotary positions count from the pad clamped as the attention range clamps it."""
    _check(case)


@pytest.mark.full
@given(case=kvcache_cases(padded_rotary=True))
@settings(max_examples=100, **_SETTINGS)
def test_drawn_padded_rotary_appends_match_the_reference_full(case):
    _check(case)
