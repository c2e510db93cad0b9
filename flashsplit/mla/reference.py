"""A float64 PyTorch reference of MLA decode, written from the semantics (tests, bench gate).

Slow and simple: one row at a time, gathering the row's live keys from its pages.
"""

from __future__ import annotations

import math

import torch

from ..plan import split_bounds
from .problem import MLA_FP8_SCALE_TILE, MLA_FP8_TOKEN_BYTES, MLA_HEAD_DIM, MLA_HEAD_DIM_V


def dequantize_fp8_tokens(cache: torch.Tensor, rope_dtype: torch.dtype) -> torch.Tensor:
    """float64 ``[..., 576]`` keys of FlashMLA's 656-byte fp8 tokens ``[..., 656]`` (e4m3): 512
    latent values times their tile's fp32 scale, then the 64 rotary values stored in ``rope_dtype``."""
    raw = cache.contiguous()
    latent = raw[..., :MLA_HEAD_DIM_V].double()
    tiles = MLA_HEAD_DIM_V // MLA_FP8_SCALE_TILE
    scales = raw[..., MLA_HEAD_DIM_V: MLA_HEAD_DIM_V + 4 * tiles].view(torch.float32).double()
    latent = latent * scales.repeat_interleave(MLA_FP8_SCALE_TILE, dim=-1)
    rope = raw[..., MLA_HEAD_DIM_V + 4 * tiles:].view(rope_dtype).double()
    return torch.cat([latent, rope], dim=-1)


def row_keys(kv_cache: torch.Tensor, block_table: torch.Tensor | None, b: int, seqlen: int,
             dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """Row ``b``'s first ``seqlen`` keys, ``[seqlen, 576]`` in ``dtype``."""
    if block_table is None:
        return kv_cache[b, :seqlen, 0].to(dtype)
    page_size = kv_cache.shape[1]
    pages = block_table[b, : -(-seqlen // page_size)].long()
    return kv_cache[pages, :, 0].reshape(-1, kv_cache.shape[-1])[:seqlen].to(dtype)


def mla_attention_ref(q, kv_cache, cache_seqlens, block_table=None, *, softmax_scale=None, causal=False,
                      kv_descale=None, key_range=None, dtype=torch.float64):
    """``(out [B, s_q, H_q, 512], lse [B, H_q, s_q])``, computed in ``dtype`` (float64; q's
    dtype gives PyTorch's own low-precision result, the tests' error yardstick); a query that
    sees no key gets 0 and -inf. ``key_range(b, seqlen) -> (lo, hi)`` restricts row ``b`` to
    keys ``[lo, hi)`` (one split's partial)."""
    batch, seqlen_q, num_heads, _ = q.shape
    scale = MLA_HEAD_DIM ** -0.5 if softmax_scale is None else softmax_scale
    descale = 1.0 if kv_descale is None else float(kv_descale.reshape(-1)[0])
    if kv_cache.shape[-1] == MLA_FP8_TOKEN_BYTES:
        kv_cache = dequantize_fp8_tokens(kv_cache.cpu(), q.dtype)
    out = torch.zeros((batch, seqlen_q, num_heads, MLA_HEAD_DIM_V), dtype=dtype)
    lse = torch.full((batch, num_heads, seqlen_q), -math.inf, dtype=torch.float32 if dtype != torch.float64 else dtype)
    for b in range(batch):
        seqlen = int(cache_seqlens[b])
        lo, hi = (0, seqlen) if key_range is None else key_range(b, seqlen)
        if hi <= lo:
            continue
        keys = row_keys(kv_cache.cpu(), None if block_table is None else block_table.cpu(), b, seqlen, dtype)[lo:hi]
        keys = keys * descale
        scores = torch.einsum("mhd,nd->mhn", q[b].cpu().to(dtype), keys) * scale  # [s_q, H, n]
        if causal:
            n = torch.arange(lo, hi)
            last = seqlen - seqlen_q + torch.arange(seqlen_q)
            scores = scores.masked_fill((n[None, :] > last[:, None])[:, None, :], -math.inf)
        row_lse = torch.logsumexp(scores, dim=-1)  # [s_q, H]
        seen = row_lse > -math.inf
        weights = torch.where(seen[..., None], torch.exp(scores - row_lse[..., None]), 0.0).to(dtype)
        out[b] = torch.einsum("mhn,nd->mhd", weights, keys[:, :MLA_HEAD_DIM_V])
        lse[b] = row_lse.transpose(0, 1).to(lse.dtype)
    return out, lse


def mla_partials_ref(q, kv_cache, cache_seqlens, block_table=None, *, num_splits, softmax_scale=None, causal=False,
                     kv_descale=None):
    """float64 ``(out_partial [S, B, s_q, H_q, 512], lse_partial [S, B, H_q, s_q])`` by
    :func:`flashsplit.plan.split_bounds`; an empty split's output is 0 (never read)."""
    parts = [mla_attention_ref(q, kv_cache, cache_seqlens, block_table, softmax_scale=softmax_scale, causal=causal,
                               kv_descale=kv_descale,
                               key_range=lambda b, n, s=s: split_bounds(n, num_splits)[s])
             for s in range(num_splits)]
    return torch.stack([p[0] for p in parts]), torch.stack([p[1] for p in parts])
