"""scripts/b1_latency.py: a variant is timed only once one call of it matches the reference."""

import os
import sys

import pytest
import torch

import flashsplit
from conftest import DEVICE

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts"))
import b1_latency  # noqa: E402


def _qkv(keys: int):
    gen = torch.Generator().manual_seed(keys)
    q = torch.randn(1, 1, b1_latency.HEADS, b1_latency.DIM, generator=gen)
    k, v = (torch.randn(1, keys, b1_latency.HEADS_KV, b1_latency.DIM, generator=gen) for _ in range(2))
    return tuple(t.to(DEVICE, torch.float16) for t in (q, k, v))


def test_check_variant_passes_a_right_call_and_stops_a_wrong_one(monkeypatch):
    qkv = _qkv(256)
    seqlens = torch.tensor([200], dtype=torch.int32, device=DEVICE)
    b1_latency.check_variant("triton:s2", qkv, seqlens, "triton", 2, None)

    real = flashsplit.decode

    def off_by_one_key(q, k, v, cache_seqlens=None, **kwargs):  # attends one key too few
        return real(q, k, v, cache_seqlens=cache_seqlens - 1, **kwargs)

    monkeypatch.setattr(flashsplit, "decode", off_by_one_key)
    with pytest.raises(AssertionError, match="triton:s2"):
        b1_latency.check_variant("triton:s2", qkv, seqlens, "triton", 2, None)
