"""The consumer warpgroup's Q tile: the GQA-packed query rows of one KV head in shared memory.

Packed row ``r = m * group + h`` (q-head fastest) is ``q[b, m, kvh * group + h, :]``; a CTA's
row tile ``row_block`` holds rows ``[row_block * rows, (row_block + 1) * rows)`` (64 for the
64-row consumer, 8 for the swapped one), the ones past ``L_q x group`` padding.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from .configs import SplitConfig
from .warp_roles import NUM_CONSUMER_THREADS, ElementTypes, publish_smem_writes


def tile_rows(seqlen_q, group, row_block, rows: int):
    """The real (not padding) packed rows of row tile ``row_block``: 1..``rows``."""
    return cutlass.min(seqlen_q * group - row_block * rows, rows)


@cute.jit
def pow2_scale(amax):
    """``(2^s, 2^-s)`` with ``amax * 2^s`` in [2^13, 2^14) (fp32 bit patterns: exact); ``(1, 1)``
    for 0 (an all-zero or masked row) or a denormal, ``s`` clamped to +-100."""
    bits = cute.make_rmem_tensor((1,), Float32)
    bits[0] = amax
    biased = (cute.recast_tensor(bits, Int32)[0] >> 23) & 0xFF  # amax in [2^(biased-127), ...)
    shift = Int32(0)
    if biased > 0:
        shift = cutlass.max(cutlass.min(127 + 13 - biased, Int32(100)), Int32(-100))
    pows = cute.make_rmem_tensor((2,), Int32)
    pows[0] = (shift + 127) << 23
    pows[1] = (127 - shift) << 23
    as_float = cute.recast_tensor(pows, Float32)
    return as_float[0], as_float[1]


class QTile:
    """Loads one CTA's packed Q rows (``config.rows`` of them) into its wgmma operand tile."""

    def __init__(self, config: SplitConfig):
        self.head_dim = config.head_dim
        self.rows = config.rows
        self.fp16_operands = config.fp16_operands
        #: Lanes per q row in the load: one per 8-element chunk, padded to a power of two with
        #: fp16 operands (the row-max butterfly runs inside a warp's aligned run of lanes).
        chunks_per_row = config.head_dim // 8
        self.lanes_per_row = 1 << (chunks_per_row - 1).bit_length() if config.fp16_operands else chunks_per_row
        types = ElementTypes(config)
        self.dtype, self.op_dtype = types.dtype, types.op

    @cute.jit
    def load(self, mQ, sQ, sRowScale, tidx, batch_idx, kvh, row_block, seqlen_q, group):
        """Gather the packed Q rows into the swizzled operand tile ``sQ`` (plain global loads:
        the rows are tiny and not one TMA box), then publish it to the consumer warpgroup.

        fp16 operands (bf16 q): each row is multiplied by the power of two that brings its
        largest magnitude into [2^13, 2^14) (exact in fp16, whose mantissa holds bf16's) and
        ``sRowScale[row]`` gets the inverse, which the softmax applies to the row's scores. A
        row's ``D / 8`` chunks are consecutive lanes of one warp: its max is a butterfly shuffle.
        (d = 96: a row's 12 chunks take a run of 16 lanes, the last 4 idle, so that no row
        straddles two warps.)
        """
        D, M = self.head_dim, self.rows
        chunks_per_row = D // 8
        lanes_per_row = self.lanes_per_row
        num_rows = seqlen_q * group
        chunks = M * lanes_per_row  # (swapped operands, 8 rows at d = 64: 64 chunks, half the threads)
        T = NUM_CONSUMER_THREADS
        for i in cutlass.range_constexpr((chunks + T - 1) // T):
            chunk = tidx + i * T
            row = chunk // lanes_per_row
            col = (chunk % lanes_per_row) * 8
            r = row_block * M + row
            frag = cute.make_rmem_tensor((8,), self.dtype)
            frag.fill(0.0)
            if cutlass.const_expr(chunks % T != 0):
                if chunk >= chunks:
                    r = num_rows  # past the tile: load nothing (and store nothing below)
            if cutlass.const_expr(lanes_per_row != chunks_per_row):
                if col >= D:
                    r = num_rows  # an idle lane of the row's run: loads nothing, its max is 0
            if r < num_rows:
                m = r // group
                hq = kvh * group + r % group
                gsrc = cute.local_tile(mQ[m, hq, None, batch_idx], (8,), (col // 8,))
                cute.autovec_copy(gsrc, frag)
            if cutlass.const_expr(self.fp16_operands):
                amax = Float32(0.0)
                for j in cutlass.range_constexpr(8):
                    x = frag[j].to(Float32)
                    amax = cute.arch.fmax(amax, cute.arch.fmax(x, -x))
                for o in cutlass.range_constexpr(lanes_per_row.bit_length() - 1):  # offsets 1, 2, ...
                    amax = cute.arch.fmax(amax, cute.arch.shuffle_sync_bfly(amax, offset=1 << o))
                scale, inverse = pow2_scale(amax)
                # (Every lane took part in the shuffles; only the tile's chunks store.)
                if cutlass.const_expr(chunks % T != 0):
                    if chunk < chunks:
                        self.store_scaled(sQ, sRowScale, frag, row, col, chunk, scale, inverse)
                else:
                    self.store_scaled(sQ, sRowScale, frag, row, col, chunk, scale, inverse)
            elif cutlass.const_expr(chunks % T != 0):
                if chunk < chunks:
                    for j in cutlass.range_constexpr(8):
                        sQ[row, col + j, 0] = frag[j]
            else:
                for j in cutlass.range_constexpr(8):
                    sQ[row, col + j, 0] = frag[j]
        publish_smem_writes()

    @cute.jit
    def store_scaled(self, sQ, sRowScale, frag, row, col, chunk, scale, inverse):
        """fp16 operands: a chunk of 8 q values times its row's power of two into ``sQ`` (a
        padding lane of d = 96's 16-lane runs stores nothing), and the row's first lane stores
        the inverse into ``sRowScale``."""
        if cutlass.const_expr(self.lanes_per_row != self.head_dim // 8):
            if col < self.head_dim:
                for j in cutlass.range_constexpr(8):
                    sQ[row, col + j, 0] = (frag[j].to(Float32) * scale).to(self.op_dtype)
        else:
            for j in cutlass.range_constexpr(8):
                sQ[row, col + j, 0] = (frag[j].to(Float32) * scale).to(self.op_dtype)
        if chunk % self.lanes_per_row == 0:
            sRowScale[row] = inverse
