"""scripts/strided_read.py: its split read visits exactly the elements it says it reads (each
program's sum against torch's), in the strided (decode's) and the blocked (contiguous) pattern."""

import os
import sys

import pytest
import torch

from conftest import DEVICE

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts"))
import strided_read  # noqa: E402


@pytest.mark.parametrize("dtype", [torch.float16, torch.uint8])
@pytest.mark.parametrize("keys,splits,block", [(96, 4, 16), (100, 3, 32)])  # even and ragged splits
def test_split_read_sums_each_programs_keys(dtype, keys, splits, block):
    gen = torch.Generator().manual_seed(keys + splits)
    batch, heads_kv, head_dim = 2, 3, 32
    shape = (batch, keys, heads_kv, head_dim)
    if dtype == torch.uint8:
        k, v = (torch.randint(0, 255, shape, generator=gen, dtype=torch.uint8) for _ in range(2))
    else:
        k, v = (torch.randn(shape, generator=gen).to(dtype) for _ in range(2))
    k, v = k.to(DEVICE), v.to(DEVICE)
    per_split = -(-keys // splits)
    sums = k.double() + v.double()

    got = strided_read.split_read(k, v, splits, block, 4, 2, strided=True).double().cpu()
    want = torch.stack([sums[b, s * per_split:(s + 1) * per_split, h].sum()
                        for s in range(splits) for b in range(batch) for h in range(heads_kv)]).cpu()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-3)

    if keys % splits == 0:  # contiguous regions of the same sizes tile the flat caches
        got = strided_read.split_read(k, v, splits, block, 4, 2, strided=False).double().cpu()
        flat = sums.reshape(-1, head_dim)
        want = torch.stack([flat[p * per_split:(p + 1) * per_split].sum()
                            for p in range(splits * batch * heads_kv)]).cpu()
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-3)
