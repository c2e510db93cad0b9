"""The Triton MLA backend: tiles, partial buffers and launches of the MLA split kernel, then
flashsplit's Triton combine kernel (head dim 512) when a launch has several splits.

Portable (any GPU Triton supports) and exact on the CPU through the Triton interpreter.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton

from ..plan import SPLIT_GRANULE, cdiv
from ..triton import INTERPRETER_OFF, interpreter_active
from .problem import MLA_FP8_SCALE_TILE, MLA_FP8_TOKEN_BYTES, MLA_HEAD_DIM_V, MLA_ROPE_DIM, MlaProblem
from .registry import MlaBackend
from .triton_kernel import LOG2E, mla_split_kernel


@dataclass(frozen=True)
class MlaTiles:
    """Compile-time tile shape of the MLA split kernel."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int


#: Packed rows per tile: 16 (4 warps, a 16 x 512 fp32 accumulator at 64 registers a thread);
#: wider problems take several row blocks, whose programs read the same key tiles through the
#: L2. H100, bf16, pages of 64: 32-row tiles on 8 warps ran H_q = 128 at 78-85 TFLOPS, and
#: B = 1 x 1k at 101 us.
MAX_BLOCK_M = 16
#: Keys per tile. H100, bf16, pages of 64, graph replay, the same split counts: 64-key tiles beat
#: 32-key ones in all 32 cells of ``flashsplit bench --mla`` (H_q = 16: B = 1 x 1k 10.5 vs
#: 12.4 us, B = 8 x 64k 211.2 vs 218.7, B = 128 x 64k 3092 vs 3170; H_q = 128: 1.27-1.42x, B = 32 x
#: 16k 882 vs 1241); three stages did not help (B = 8 x 64k, H_q = 16: 223.0 us).
BLOCK_N = 64
NUM_STAGES = 2


def choose_tiles(packed_rows: int, max_block_m: int = MAX_BLOCK_M, block_n: int = BLOCK_N,
                 num_stages: int = NUM_STAGES) -> MlaTiles:
    """Tiles for ``packed_rows`` (``seqlen_q x H_q``) rows: the smallest power of two >= the rows,
    at least 16 (``tl.dot``'s minimum), at most ``max_block_m`` (16, 32 or 64: 4 warps up to 16
    rows, else 8; 64 rows is the shape of Hopper's warpgroup MMA), ``block_n`` keys (16-128: it
    divides the split granule) and ``num_stages`` pipeline stages. ``flashsplit bench --mla``
    times other tiles beside these (``--mla m64 n64 s3``).

    >>> choose_tiles(16), choose_tiles(128).block_m, choose_tiles(128, 64).block_m
    (MlaTiles(block_m=16, block_n=64, num_warps=4, num_stages=2), 16, 64)
    """
    block_m = min(max_block_m, max(16, triton.next_power_of_2(packed_rows)))
    return MlaTiles(block_m=block_m, block_n=block_n, num_warps=4 if block_m <= 16 else 8, num_stages=num_stages)


class TritonMlaBackend(MlaBackend):
    name = "triton"
    priority = 0

    def supports(self, problem: MlaProblem) -> str | None:
        if problem.device_type == "cuda":
            return None
        if problem.device_type == "cpu":
            return None if interpreter_active() else f"tensors are on the CPU and {INTERPRETER_OFF}"
        return f"tensors are on {problem.device_type!r}; the Triton backend needs CUDA (or the CPU interpreter)"

    def block_m(self, problem: MlaProblem) -> int:
        return choose_tiles(problem.packed_rows).block_m

    def units_per_sm(self, problem: MlaProblem) -> int:
        # The split counts the 64-key tiles were measured with (BLOCK_N) planned two per SM.
        return 2

    def launch_split(self, q, kv_cache, cache_seqlens, block_table, kv_descale, num_splits: int,
                     softmax_scale: float, causal: bool, out_partial=None, lse_partial=None, out=None,
                     lse=None, tiles: MlaTiles | None = None) -> None:
        """The split kernel: partials when ``out_partial`` is given, else (one split) ``out``/``lse``;
        ``tiles``: :func:`choose_tiles`' by default."""
        batch, seqlen_q, num_heads, _ = q.shape
        tiles = tiles or choose_tiles(seqlen_q * num_heads)
        row_blocks = cdiv(seqlen_q * num_heads, tiles.block_m)
        paged = block_table is not None
        capacity = block_table.shape[1] * kv_cache.shape[1] if paged else kv_cache.shape[1]
        partials = out_partial is not None
        # FlashMLA's fp8 tokens: the same bytes read as fp32 (their scales) and q's dtype (rotary part)
        fp8_tokens = kv_cache.shape[-1] == MLA_FP8_TOKEN_BYTES
        kv_f32, kv_16 = (kv_cache.view(torch.float32), kv_cache.view(q.dtype)) if fp8_tokens else (kv_cache, kv_cache)
        mla_split_kernel[(row_blocks, num_splits, batch)](
            q, kv_cache, kv_f32, kv_16, cache_seqlens, block_table, kv_descale, out_partial, lse_partial, out, lse,
            *q.stride()[:3], kv_cache.stride(0), kv_cache.stride(1), block_table.stride(0) if paged else 0,
            *(out_partial.stride()[:4] if partials else (0,) * 4),
            *(lse_partial.stride()[:3] if partials else (0,) * 3),
            *(out.stride()[:3] if out is not None else (0,) * 3), *(lse.stride()[:2] if lse is not None else (0, 0)),
            seqlen_q, num_heads, capacity, num_splits, kv_cache.shape[0], softmax_scale * LOG2E,
            BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, DV=MLA_HEAD_DIM_V, D_ROPE=MLA_ROPE_DIM,
            GRANULE=SPLIT_GRANULE, PAGED=paged, PAGE_SIZE=kv_cache.shape[1] if paged else 1,
            CAUSAL=causal and seqlen_q > 1, HAS_DESCALE=kv_descale is not None, WRITE_PARTIALS=partials,
            WRITE_LSE=lse is not None, RUNTIME_BOUND_WHILE=interpreter_active(), TILE_SCALED=fp8_tokens,
            SCALE_TILE=MLA_FP8_SCALE_TILE,
            num_warps=tiles.num_warps, num_stages=tiles.num_stages)

    def run(self, q, kv_cache, cache_seqlens, block_table, out, lse, *, num_splits, softmax_scale, causal,
            kv_descale, tiles: MlaTiles | None = None) -> None:
        if num_splits == 1:
            self.launch_split(q, kv_cache, cache_seqlens, block_table, kv_descale, 1, softmax_scale, causal,
                              out=out, lse=lse, tiles=tiles)
            return
        out_partial, lse_partial = alloc_partials(q, num_splits)
        self.launch_split(q, kv_cache, cache_seqlens, block_table, kv_descale, num_splits, softmax_scale, causal,
                          out_partial, lse_partial, tiles=tiles)
        combine(out_partial, lse_partial, out, lse)

    def forward_partials(self, q, kv_cache, cache_seqlens, block_table, *, num_splits, softmax_scale, causal,
                         kv_descale=None):
        out_partial, lse_partial = alloc_partials(q, num_splits)
        self.launch_split(q, kv_cache, cache_seqlens, block_table, kv_descale, num_splits, softmax_scale, causal,
                          out_partial, lse_partial)
        return out_partial, lse_partial


#: Programs per output row of the combine, each merging 128 of its 512 columns: a decode of few
#: rows (B = 1, 16 q heads: 16 rows) reads its partials through four times as many programs.
COMBINE_COLUMN_BLOCKS = 4


def combine(out_partial: torch.Tensor, lse_partial: torch.Tensor, out: torch.Tensor, lse: torch.Tensor | None) -> None:
    """Merge MLA partials into ``out``/``lse`` with flashsplit's Triton combine kernel."""
    from .. import registry  # the GQA registry's Triton backend owns the combine kernel

    registry.get("triton").launch_combine(out_partial, lse_partial, None, out, lse, skip_single_split_rows=False,
                                          column_blocks=COMBINE_COLUMN_BLOCKS)


def alloc_partials(q: torch.Tensor, num_splits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Fresh fp32 ``out_partial`` ``[S, B, s_q, H_q, 512]`` and ``lse_partial`` ``[S, B, H_q, s_q]``
    (fresh per call, so a captured CUDA graph owns its own)."""
    batch, seqlen_q, num_heads, _ = q.shape
    out_partial = torch.empty((num_splits, batch, seqlen_q, num_heads, MLA_HEAD_DIM_V), dtype=torch.float32,
                              device=q.device)
    lse_partial = torch.empty((num_splits, batch, num_heads, seqlen_q), dtype=torch.float32, device=q.device)
    return out_partial, lse_partial
