"""The merge's in-register row sum adds in the order of a warp's shuffle reduction.

A last-CTA merge of one CTA per SM sums a row's ``exp(lse_s - max)`` in registers
(``RowMerge.one_chunk_sum``); the other merges reduce the same values across the warp's lanes
(``cute.arch.warp_reduction``: ``shfl.bfly`` at offsets 16, 8, ..., 1). The kernels that merge
in a cluster and those that count arrivals are tested on the GPU to give the same bits, which
holds only if both sums add in the same order. Simulated here in float32, on the CPU.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from flashsplit.cute.backend import CUTLASS_MISSING

pytestmark = pytest.mark.skipif(importlib.util.find_spec("cutlass") is None,
                                reason=CUTLASS_MISSING)


def _warp_reduction_sum(values: np.ndarray) -> np.float32:
    """Lane 0's result of a 32-lane butterfly sum, lane ``l`` holding ``values[l]`` (0 past them)."""
    lanes = np.zeros(32, dtype=np.float32)
    lanes[:len(values)] = values
    offset = 16
    while offset:
        lanes = lanes + lanes[np.arange(32) ^ offset]  # each lane: its value + its partner's
        offset //= 2
    return lanes[0]


def _adjacent_pairs_sum(values: list) -> np.float32:
    while len(values) > 1:
        values = [values[i] + values[i + 1] if i + 1 < len(values) else values[i] for i in range(0, len(values), 2)]
    return values[0]


def test_in_register_sum_matches_the_warp_reduction_bit_for_bit():
    from flashsplit.cute.merge import butterfly

    rng = np.random.default_rng(0)
    differs = 0
    for trial in range(400):
        n = 1 + trial % 32
        # exp(lse_s - max) of a row: one 1 (the max), the rest in (0, 1] over many magnitudes
        values = np.exp(-rng.exponential(4.0, size=n)).astype(np.float32)
        values[rng.integers(n)] = 1.0
        expected = _warp_reduction_sum(values)
        got = butterfly([np.float32(v) for v in values], lambda x, y: np.float32(x + y))
        assert got.tobytes() == expected.tobytes(), (n, got, expected)
        differs += _adjacent_pairs_sum([np.float32(v) for v in values]).tobytes() != expected.tobytes()
    assert differs > 0  # the order matters: adding neighbours first gives other bits


def test_butterfly_max_and_lengths():
    from flashsplit.cute.merge import butterfly

    assert butterfly([3.0], max) == 3.0
    for n in range(1, 33):
        assert butterfly(list(range(n)), max) == n - 1
        assert butterfly([1] * n, lambda x, y: x + y) == n
