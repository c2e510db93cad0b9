"""Inputs and checks shared by the MLA tests and the bench's correctness gate: caches as
engines hold them (pages in any order, NaN in every slot no row owns, garbage page ids past a
row's pages) and the float64 reference with the error rule of :mod:`flashsplit.testing`."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..plan import cdiv
from ..testing import check_lse, check_output, quantize_fp8
from .problem import MLA_FP8_SCALE_TILE, MLA_FP8_TOKEN_BYTES, MLA_HEAD_DIM, MLA_HEAD_DIM_V
from .reference import mla_attention_ref
from .validation import MLA_FP8_DTYPE

#: A page id no cache has: what a table holds past a row's last page.
GARBAGE_PAGE = 2**30 + 7


@dataclass
class MlaInputs:
    q: torch.Tensor
    kv_cache: torch.Tensor
    cache_seqlens: torch.Tensor
    block_table: torch.Tensor | None
    kv_descale: torch.Tensor | None

    def kwargs(self) -> dict:
        return dict(block_table=self.block_table, kv_descale=self.kv_descale)


def quantize_fp8_tokens(cache: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """FlashMLA's 656-byte fp8 tokens ``[pages, slots, 1, 656]`` (e4m3) of ``cache`` ``[pages,
    slots, 1, 576]``: each 128 latent values divided by a power-of-two scale that brings their
    largest magnitude under e4m3's 448, the scales as fp32, the rotary values in ``dtype``. NaN
    stays NaN. Each page gets one spare token of bytes, as FlashMLA's own test caches have: pages
    are not ``slots x 656`` bytes apart."""
    pages, slots, heads, _ = cache.shape
    tiles = MLA_HEAD_DIM_V // MLA_FP8_SCALE_TILE
    out = torch.zeros((pages, slots + 1, heads, MLA_FP8_TOKEN_BYTES), dtype=torch.uint8)[:, :slots]
    latent = cache[..., :MLA_HEAD_DIM_V].float().unflatten(-1, (tiles, MLA_FP8_SCALE_TILE))
    amax = latent.abs().amax(dim=-1) / 448.0
    scale = torch.pow(2, amax.clamp_min(1e-4).log2().ceil())
    out[..., :MLA_HEAD_DIM_V] = (latent / scale[..., None]).flatten(-2).to(torch.float8_e4m3fn).view(torch.uint8)
    out[..., MLA_HEAD_DIM_V: MLA_HEAD_DIM_V + 4 * tiles] = scale.float().contiguous().view(torch.uint8)
    out[..., MLA_HEAD_DIM_V + 4 * tiles:] = cache[..., MLA_HEAD_DIM_V:].to(dtype).contiguous().view(torch.uint8)
    return out.view(torch.float8_e4m3fn)


def make_mla_inputs(batch: int, seqlen_q: int, num_heads_q: int, lengths: list[int], *, page_size: int = 0,
                    dtype: torch.dtype = torch.float16, fp8: bool = False, fp8_tokens: bool = False, device="cpu",
                    generator=None, capacity: int = 0) -> MlaInputs:
    """Random inputs with rows of ``lengths`` keys (``capacity``: at least that many slots per row;
    ``page_size`` 0: dense). Unused slots and pages hold NaN. ``fp8``: an e4m3 cache with one
    scale; ``fp8_tokens``: FlashMLA's 656-byte fp8 tokens (:func:`quantize_fp8_tokens`)."""
    assert len(lengths) == batch
    capacity = max(capacity, max(lengths, default=0), 1)
    q = torch.randn((batch, seqlen_q, num_heads_q, MLA_HEAD_DIM), generator=generator).to(dtype)
    if page_size == 0:
        cache = torch.randn((batch, capacity, 1, MLA_HEAD_DIM), generator=generator)
        for b, n in enumerate(lengths):
            cache[b, n:] = float("nan")
        table = None
    else:
        per_row = cdiv(capacity, page_size)
        num_pages = batch * per_row + 2  # two pages no row owns
        cache = torch.full((num_pages, page_size, 1, MLA_HEAD_DIM), float("nan"))
        table = torch.randperm(num_pages, generator=generator)[: batch * per_row].view(batch, per_row).int()
        for b, n in enumerate(lengths):
            used = cdiv(n, page_size)
            for i in range(used):
                live = min(page_size, n - i * page_size)
                cache[table[b, i], :live] = torch.randn((live, 1, MLA_HEAD_DIM), generator=generator)
            table[b, used:] = GARBAGE_PAGE
    descale = None
    if fp8_tokens:
        cache = quantize_fp8_tokens(cache, dtype)
    elif fp8:
        cache, descale = quantize_fp8(cache, MLA_FP8_DTYPE, per_head=False)
    else:
        cache = cache.to(dtype)
    seqlens = torch.tensor(lengths, dtype=torch.int32)
    return MlaInputs(q.to(device), cache.to(device), seqlens.to(device), None if table is None else table.to(device),
                     None if descale is None else descale.to(device))


def check_mla(out: torch.Tensor, lse: torch.Tensor | None, inputs: MlaInputs, *, causal: bool = False,
              softmax_scale=None) -> float:
    """Assert ``out`` (and ``lse``) against the float64 reference with the error rule of
    :func:`flashsplit.testing.check_output`; returns the output's error."""
    args = (inputs.q, inputs.kv_cache, inputs.cache_seqlens, inputs.block_table)
    kw = dict(softmax_scale=softmax_scale, causal=causal, kv_descale=inputs.kv_descale)
    ref, ref_lse = mla_attention_ref(*args, **kw)
    ref_lowp, _ = mla_attention_ref(*args, **kw, dtype=torch.float32 if inputs.q.dtype == torch.float32
                                    else inputs.q.dtype)
    err = check_output(out.cpu(), ref, ref_lowp.double(), inputs.q.dtype)
    if lse is not None:
        check_lse(lse.cpu(), ref_lse)
    return err
