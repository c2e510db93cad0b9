"""The reference itself: against naive per-head softmax attention, and split-by-split."""

import doctest
import importlib
import math

import pytest
import torch

from flashsplit.reference import attention_ref, combine_ref, split_partials_ref


def naive_attention(q, k, v, lengths, causal):
    """Loop over rows and heads: the definition, with no vectorised masking tricks."""
    batch, seqlen_q, num_heads, head_dim = q.shape
    group = num_heads // k.shape[2]
    out = torch.zeros(q.shape, dtype=torch.float64)
    lse = torch.full((batch, num_heads, seqlen_q), float("-inf"), dtype=torch.float64)
    for b in range(batch):
        for h in range(num_heads):
            for m in range(seqlen_q):
                n = lengths[b]
                visible = n - seqlen_q + m + 1 if causal else n
                visible = max(0, min(visible, n))
                if visible == 0:
                    continue
                scores = k[b, :visible, h // group].double() @ q[b, m, h].double() / math.sqrt(head_dim)
                lse[b, h, m] = torch.logsumexp(scores, 0)
                out[b, m, h] = torch.softmax(scores, 0) @ v[b, :visible, h // group].double()
    return out, lse


@pytest.mark.parametrize("causal", [False, True])
def test_reference_matches_naive(causal, generator):
    q = torch.randn(3, 4, 6, 16, generator=generator)
    k = torch.randn(3, 50, 2, 16, generator=generator)
    v = torch.randn(3, 50, 2, 16, generator=generator)
    lengths = [50, 2, 0]
    seqlens = torch.tensor(lengths, dtype=torch.int32)
    k[1, 2:] = float("nan")
    v[1, 2:] = float("nan")
    out, lse = attention_ref(q, k, v, seqlens, causal)
    ref_out, ref_lse = naive_attention(q, k, v, lengths, causal)
    torch.testing.assert_close(out, ref_out)
    torch.testing.assert_close(lse, ref_lse.float())
    assert torch.isneginf(lse[2]).all() and (out[2] == 0).all(), "an empty row: O = 0, LSE = -inf"


@pytest.mark.parametrize("num_splits", [1, 3, 17])
def test_split_partials_combine_to_the_whole(num_splits, generator):
    q = torch.randn(2, 2, 8, 32, generator=generator)
    k = torch.randn(2, 700, 2, 32, generator=generator)
    v = torch.randn(2, 700, 2, 32, generator=generator)
    seqlens = torch.tensor([700, 250], dtype=torch.int32)
    out_p, lse_p = split_partials_ref(q, k, v, seqlens, num_splits, causal=True)
    assert out_p.shape == (num_splits, 2, 2, 8, 32) and lse_p.shape == (num_splits, 2, 8, 2)
    out, lse = combine_ref(out_p, lse_p)
    ref, ref_lse = attention_ref(q, k, v, seqlens, causal=True)
    torch.testing.assert_close(out, ref, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(lse, ref_lse)
    if num_splits == 17:  # 250 keys = 2 granules: splits 2.. of row 1 are empty
        assert torch.isneginf(lse_p[2:, 1]).all()


def test_docstring_examples():
    # importlib: the package attribute ``flashsplit.plan`` is the function, not the module.
    for module in map(importlib.import_module, ("flashsplit.plan", "flashsplit.api")):
        failures, tried = doctest.testmod(module)
        assert tried > 0 and failures == 0, module.__name__
