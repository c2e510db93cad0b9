"""flashsplit.combine alone, on hand-built partials (empty splits, empty rows, garbage O)."""

import pytest
import torch

import flashsplit
from flashsplit.reference import combine_ref

from conftest import DEVICE


def _partials(generator, num_splits=5, batch=2, seqlen_q=3, num_heads=4, head_dim=64):
    out_p = torch.randn(num_splits, batch, seqlen_q, num_heads, head_dim, generator=generator)
    lse_p = torch.randn(num_splits, batch, num_heads, seqlen_q, generator=generator) * 4
    return out_p, lse_p


# Empty splits' garbage and rows without keys must not reach the arithmetic: in the interpreter,
# 0 * inf or -inf - -inf would warn (numpy), and on a GPU they would be computed and thrown away.
@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_combine_matches_reference_with_empty_splits(generator):
    out_p, lse_p = _partials(generator)
    lse_p[1] = float("-inf")               # an empty split everywhere
    lse_p[:, 1, 2] = float("-inf")         # a row (b=1, head 2) with every split empty
    lse_p[3, 0, 0, 0] = float("-inf")      # one empty split in one row
    out_p[1] = float("nan")                # an empty split's O is garbage and must not be read
    out_p[3, 0, 0, 0] = float("inf")
    out, lse = flashsplit.combine(out_p.to(DEVICE), lse_p.to(DEVICE))
    ref, ref_lse = combine_ref(out_p, lse_p)
    torch.testing.assert_close(out.cpu().double(), ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse.cpu(), ref_lse)
    assert (out[1, :, 2] == 0).all() and torch.isneginf(lse[1, 2]).all()


@pytest.mark.parametrize("num_splits", [1, 2, 17, 256])
def test_combine_split_counts(num_splits, generator):
    out_p, lse_p = _partials(generator, num_splits=num_splits, batch=1, seqlen_q=1, num_heads=2, head_dim=32)
    out, lse = flashsplit.combine(out_p.to(DEVICE), lse_p.to(DEVICE), out_dtype=torch.float16)
    assert out.dtype == torch.float16
    ref, ref_lse = combine_ref(out_p, lse_p)
    torch.testing.assert_close(out.cpu().double(), ref, atol=2e-3, rtol=2e-3)
    torch.testing.assert_close(lse.cpu(), ref_lse)


def test_combine_into_out(generator):
    out_p, lse_p = _partials(generator)
    out = torch.full((2, 3, 4, 64), float("nan"), device=DEVICE)
    result, _ = flashsplit.combine(out_p.to(DEVICE), lse_p.to(DEVICE), out=out)
    assert result is out and not torch.isnan(out).any()


@pytest.mark.parametrize("mutate, exc, match", [
    (lambda o, lp: (o.half(), lp), TypeError, "out_partial: expected dtype float32"),
    (lambda o, lp: (o, lp[:, :, :, :2]), ValueError, "lse_partial: expected shape"),
    (lambda o, lp: (o[0], lp), ValueError, "out_partial: expected 5 dims"),
    (lambda o, lp: ("x", lp), TypeError, "out_partial: expected a torch.Tensor"),
    (lambda o, lp: (o.transpose(-1, -2), lp.transpose(-1, -2)), ValueError, "lse_partial: expected shape|contiguous"),
])
def test_combine_rejects_bad_partials(mutate, exc, match, generator):
    out_p, lse_p = _partials(generator)
    with pytest.raises(exc, match=match):
        flashsplit.combine(*mutate(out_p, lse_p))
