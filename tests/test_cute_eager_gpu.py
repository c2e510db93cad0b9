"""The CuTe backend's eager hot path on a Hopper GPU: after a signature's first call, later calls
launch through :func:`flashsplit.cute.eager.eager_path` and stay exact with new tensors, new
lengths and another stream: one split, the in-kernel merge, the combine kernel, with and without
an lse, paged, with sinks.

Skipped cleanly without CUDA, compute capability 9.0 or nvidia-cutlass-dsl.
"""

from __future__ import annotations

import pytest
import torch

import flashsplit
from flashsplit import dispatch
from flashsplit.testing import check_against_reference, to_paged

from conftest import CUTE_GPU_MARKS

pytestmark = CUTE_GPU_MARKS


@pytest.fixture
def combine_every_split_count(monkeypatch):
    """Launches of several splits merge in the combine kernel (``CuteBackend.merge_max_splits`` 1)."""
    from flashsplit.cute.backend import CuteBackend
    from flashsplit.registry import invalidate

    monkeypatch.setattr(CuteBackend, "merge_max_splits", 1)
    invalidate()
    yield
    invalidate()


def _steps(num_splits, return_lse, paged=False, sinks=False, batch=3, keys=8192):
    gen = torch.Generator().manual_seed(num_splits * 7 + return_lse * 3 + paged + 2 * sinks)
    q_heads, kv_heads, dim = 32, 8, 128
    k = torch.randn(batch, keys, kv_heads, dim, generator=gen).to("cuda", torch.bfloat16)
    v = torch.randn(batch, keys, kv_heads, dim, generator=gen).to("cuda", torch.bfloat16)
    head_sinks = torch.randn(q_heads, generator=gen).to("cuda") if sinks else None
    if paged:  # the rows' pages shuffled into one pool
        k_pool, v_pool, table, _, _ = to_paged(k, v, [keys] * batch, 128, gen, share_first_page=False)
    side = torch.cuda.Stream()
    for step, stream in enumerate([None, None, side, None]):
        q = torch.randn(batch, 1, q_heads, dim, generator=gen).to("cuda", torch.bfloat16)
        lens = torch.randint(1, keys + 1, (batch,), generator=gen, dtype=torch.int32).to("cuda")
        out = torch.full_like(q, float("nan"))
        with torch.cuda.stream(stream or torch.cuda.current_stream()):
            got = flashsplit.decode(q, k_pool if paged else k, v_pool if paged else v, cache_seqlens=lens,
                                    block_table=table if paged else None, num_splits=num_splits, out=out,
                                    return_lse=return_lse, sinks=head_sinks, backend="cute")
        torch.cuda.synchronize()
        lse = got[1] if return_lse else None
        check_against_reference(out, lse, q, k, v, lens, what=f"step {step}", sinks=head_sinks)
        yield step


def _count_eager_calls():
    """Wrap the one prepared decode's eager path; returns the list its taken calls append to."""
    assert len(dispatch._PREPARED) == 1
    prepared = next(iter(dispatch._PREPARED.values()))
    assert callable(prepared.eager), "the first CUDA call builds the eager path"
    taken, path = [], prepared.eager

    def counted(tensors):
        ok = path(tensors)
        taken.append(ok)
        return ok

    prepared.eager = counted
    return taken


def _check_steps(**case):
    dispatch._PREPARED.clear()
    taken = None
    for step in _steps(**case):
        if step == 0:
            taken = _count_eager_calls()
    # Every later call took it; the first on the side stream declined (no workspace there yet).
    assert taken == [True, False, True], taken


@pytest.mark.parametrize("return_lse", [False, True])
@pytest.mark.parametrize("num_splits", [1, 0, 7])
def test_eager_path_direct_and_merged(num_splits, return_lse):
    _check_steps(num_splits=num_splits, return_lse=return_lse)


@pytest.mark.parametrize("return_lse", [False, True])
def test_eager_path_with_the_combine_kernel(return_lse, combine_every_split_count):
    _check_steps(num_splits=7, return_lse=return_lse)


@pytest.mark.parametrize("num_splits", [1, 7])
def test_eager_path_paged_and_sinks(num_splits):
    _check_steps(num_splits=num_splits, return_lse=True, paged=True, sinks=True)
