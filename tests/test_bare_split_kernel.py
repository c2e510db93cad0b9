"""scripts/bare_split_kernel.py: each load path (pointers, TMA descriptors) and dot order
(plain, swapped) of its bare split kernel gives partials whose merge is attention, on fp8 and
16-bit caches, the outputs poisoned with NaN first."""

import os
import sys

import pytest
import torch

from conftest import DEVICE

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts"))
import bare_split_kernel  # noqa: E402


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float16])
@pytest.mark.parametrize("config", ["32:4:2", "swap32:4:2"])
@pytest.mark.parametrize("tma", [False, True], ids=["ptr", "tma"])
def test_bare_split_partials_merge_to_attention(dtype, config, tma):
    gen = torch.Generator().manual_seed(7)
    batch, keys, heads_kv, group, head_dim, splits = 2, 128, 2, 4, 128, 2
    q = torch.randn(batch, 1, heads_kv * group, head_dim, generator=gen).to(torch.float16).to(DEVICE)
    k, v = (torch.randn(batch, keys, heads_kv, head_dim, generator=gen).to(dtype).to(DEVICE) for _ in range(2))
    op = torch.full((splits, batch, heads_kv * group, head_dim), float("nan"), device=DEVICE)
    lse = torch.full((splits, batch, heads_kv * group), float("nan"), device=DEVICE)

    bare_split_kernel.bare_split(q, k, v, splits, config, tma, op, lse)

    got = bare_split_kernel.merged(op, lse).double().cpu()
    want = bare_split_kernel.reference(q, k, v).cpu()
    assert not got.isnan().any()
    torch.testing.assert_close(got, want, rtol=2e-3, atol=2e-3)
