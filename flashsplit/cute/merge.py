"""Merge of split-KV partials into one output row, shared by the combine kernel and the split
kernel's last-CTA merge (``SplitConfig.merge``).

A row ``(b, m, h)`` has ``num_splits`` partials: fp32 ``out_partial[s, b, m, h, :]`` and natural-log
``lse_partial[s, b, h, m]``. ``W`` warps share the row: warp ``w`` takes splits ``w, w + W, ...``,
and in it every lane owns ``head_dim / 32`` contiguous columns (vector loads of 2, 4 or 8 fp32);
at d = 96 a lane's 3 columns are ``lane, lane + 32, lane + 64`` instead (three scalar loads, each
one coalesced 128-byte row segment per warp: no 12-byte vector exists). Each warp issues all of its
first loads before anything waits on memory:

* the row's split LSEs, lane ``l`` holding splits ``l, l + 32, ...`` (every warp reads all of them);
* its first ``chunk`` splits: each one's LSE (one address for the whole warp) and the lane's
  columns of the partial O (vector loads where the tensor's layout proves alignment).

The warp then reduces the row's LSE on its own with shuffles (max, then the sum of
``exp(lse_s - max)``; exp/log as FAST_MATH says), weights its splits by ``exp(lse_s - lse)`` and sums them;
further chunks cost one more round trip each. A warp that owns its row alone and finds every
split in its first chunk (the last-CTA merge of up to ``chunk`` splits) loads only that chunk
and reduces the row's LSE in registers, in the order of the shuffles, so that both paths give
the same bits (:meth:`RowMerge.one_chunk_sum`). A split of weight 0 (LSE ``-inf``: empty, its
``out_partial`` slice never written and maybe NaN) is dropped by selection, never multiplied by 0.
A row whose splits are all ``-inf`` gets LSE ``-inf`` and a zero sum.
"""

from __future__ import annotations

import cutlass
from cutlass import Float32, cute

#: flashsplit.plan.MAX_SPLITS: LSEs up to this split count are held in registers (8 per lane);
#: more splits are still right, re-read from memory.
SPLITS_IN_REGISTERS = 256
#: exp/log by the hardware approximations (``ex2.approx``/``lg2.approx``: ~2^-22 relative
#: error, far below the fp32 partials' rounding) instead of the accurate library sequences.
FAST_MATH = True


class RowMerge:
    """The per-warp part of merging one row (see the module docstring).

    ``num_warps`` warps share a row; ``chunk`` is how many of a warp's splits sit in registers at
    once (``head_dim / 32 * chunk`` fp32 per lane). ``one_chunk``: a single warp per row takes
    :meth:`one_chunk_sum` when the row's splits fit one chunk (a kernel with the registers for it).
    """

    def __init__(self, head_dim: int, num_warps: int, chunk: int, one_chunk: bool = False):
        self.head_dim = head_dim
        self.cols_per_lane = head_dim // 32
        #: A lane's columns are 32 apart (not a power of two per lane: d = 96), else contiguous.
        self.strided = self.cols_per_lane & (self.cols_per_lane - 1) != 0
        self.num_warps = num_warps
        self.chunk = chunk
        self.one_chunk = one_chunk and num_warps == 1
        self.lse_regs = SPLITS_IN_REGISTERS // 32

    def lane_columns(self, row, lane):
        """The lane's ``cols_per_lane`` columns of a row (a (head_dim,) tensor of stride 1):
        contiguous, or (``strided``) ``lane + 32 j``."""
        if cutlass.const_expr(self.strided):
            return cute.make_tensor(row.iterator + lane, cute.make_layout((self.cols_per_lane,), stride=(32,)))
        return cute.local_tile(row, (self.cols_per_lane,), (lane,))

    @cute.jit
    def load_chunk(self, gO, gL, lse_c, part, first, num_splits, lane):
        """This warp's splits ``first + W u`` (u < chunk) of the row (``gO``: (splits, D) partial
        O, ``gL``: (splits,) LSEs): each one's LSE (``-inf`` past the last split) and the lane's
        columns of its partial O. Nothing here waits on memory."""
        NW = self.num_warps
        lse_c.fill(-Float32.inf)
        for u in cutlass.range_constexpr(self.chunk):
            s = first + NW * u
            if s < num_splits:
                lse_c[u] = gL[s]
                cute.autovec_copy(self.lane_columns(gO[s, None], lane), part[None, u])

    @cute.jit
    def accumulate_chunk(self, acc, lse_c, part, lse):
        """``acc += exp(lse_s - lse) * O_s`` over a loaded chunk; a split of weight 0 (empty, or
        past the last split) is dropped by selection: its O may be garbage or NaN."""
        for u in cutlass.range_constexpr(self.chunk):
            w = cute.math.exp(lse_c[u] - lse, fastmath=FAST_MATH)
            for j in cutlass.range_constexpr(self.cols_per_lane):
                v = w * part[j, u]
                if not w > 0.0:
                    v = Float32(0.0)
                acc[j] += v

    @cute.jit
    def warp_sum(self, mOp, mLp, acc, num_splits, b, m, h, warp, lane):
        """``acc`` (``cols_per_lane`` fp32) = this warp's share of ``sum_s exp(lse_s - lse) O_s``
        over the lane's columns; returns the row's LSE (``-inf`` when every split is empty)."""
        # The row's views, sliced once: each load below adds only its split's offset. Indexing
        # the 4-5 mode tensors per load recomputed the row's 64-bit offset every time (~4 64-bit
        # multiplies per load before the loads were all issued): H200, a bare combine of 32
        # splits 2.37 -> 2.02 us, B = 1 x 4k 11.45 -> 10.87, B = 4 x 4k (in-kernel merge) 22.15 -> 21.71.
        gL = mLp[None, b, h, m]
        gO = mOp[None, b, m, h, None]
        lse = -Float32.inf
        if cutlass.const_expr(self.one_chunk):
            if num_splits <= self.chunk:  # (warp-uniform)
                lse = self.one_chunk_sum(gO, gL, acc, num_splits, lane)
            else:
                lse = self.chunked_sum(gO, gL, acc, num_splits, warp, lane)
        else:
            lse = self.chunked_sum(gO, gL, acc, num_splits, warp, lane)
        return lse

    @cute.jit
    def one_chunk_sum(self, gO, gL, acc, num_splits, lane):
        """:meth:`warp_sum` of a row whose splits all fit one chunk of a warp that owns the row:
        every lane loads every split's LSE with its columns, so the row's max and sum need no
        shuffles and no second set of LSE loads (the last-CTA merge's path from the arrival
        count to the stores)."""
        lse_c = cute.make_rmem_tensor((self.chunk,), Float32)
        part = cute.make_rmem_tensor((self.cols_per_lane, self.chunk), Float32)
        self.load_chunk(gO, gL, lse_c, part, 0, num_splits, lane)
        row_max = butterfly([lse_c[u] for u in range(self.chunk)], cute.arch.fmax)
        safe_max = row_max
        if row_max == -Float32.inf:
            safe_max = Float32(0.0)
        # Summed in the order of the chunked path's warp reduction, so both give the same bits.
        total = butterfly([cute.math.exp(lse_c[u] - safe_max, fastmath=FAST_MATH) for u in range(self.chunk)],
                          lambda x, y: x + y)
        lse, safe_lse = row_lse(safe_max, total)
        acc.fill(0.0)
        self.accumulate_chunk(acc, lse_c, part, safe_lse)
        return lse

    @cute.jit
    def chunked_sum(self, gO, gL, acc, num_splits, warp, lane):
        """:meth:`warp_sum` in chunks (see the module docstring)."""
        C, NW, K = self.cols_per_lane, self.num_warps, self.lse_regs

        # 1. Issue the loads: the row's LSEs (lane l: splits l + 32 k), then this warp's first
        #    chunk of splits. All are independent of each other.
        lse_r = cute.make_rmem_tensor((K,), Float32)
        lse_r.fill(-Float32.inf)
        for k in cutlass.range_constexpr(K):
            s = lane + 32 * k
            if s < num_splits:
                lse_r[k] = gL[s]
        lse_c = cute.make_rmem_tensor((self.chunk,), Float32)
        part = cute.make_rmem_tensor((C, self.chunk), Float32)  # column-major: part[None, u] contiguous
        self.load_chunk(gO, gL, lse_c, part, warp, num_splits, lane)

        # 2. The row's LSE, in every warp: max, then the sum of exp(lse_s - max).
        row_max = -Float32.inf
        for k in cutlass.range_constexpr(K):
            row_max = cute.arch.fmax(row_max, lse_r[k])
        for s in cutlass.range(lane + 32 * K, num_splits, 32, unroll=1):
            row_max = cute.arch.fmax(row_max, gL[s])
        row_max = cute.arch.warp_reduction(row_max, cute.arch.fmax)
        safe_max = row_max
        if row_max == -Float32.inf:
            safe_max = Float32(0.0)
        total = Float32(0.0)
        for k in cutlass.range_constexpr(K):
            if 32 * k < num_splits:  # (warp-uniform: registers past the last split hold -inf)
                total += cute.math.exp(lse_r[k] - safe_max, fastmath=FAST_MATH)
        for s in cutlass.range(lane + 32 * K, num_splits, 32, unroll=1):
            total += cute.math.exp(gL[s] - safe_max, fastmath=FAST_MATH)
        total = cute.arch.warp_reduction(total, lambda x, y: x + y)
        lse, safe_lse = row_lse(safe_max, total)

        # 3. This warp's weighted sum: the chunk in registers, then any further chunks.
        acc.fill(0.0)
        self.accumulate_chunk(acc, lse_c, part, safe_lse)
        for first in cutlass.range(warp + NW * self.chunk, num_splits, NW * self.chunk, unroll=1):
            self.load_chunk(gO, gL, lse_c, part, first, num_splits, lane)
            self.accumulate_chunk(acc, lse_c, part, safe_lse)
        return lse


def butterfly(values, op):
    """``op`` over ``values`` (trace-time Python) in the order of ``cute.arch.warp_reduction``
    (``shfl.bfly`` at offsets 16, 8, ..., 1) over lanes holding ``values[lane]``, the lanes
    past them holding ``op``'s identity: value ``u`` meets ``u + n / 2`` first. A float sum
    depends on its order; this one matches a warp that reduced the same values across lanes."""
    n = 1 << max(0, len(values) - 1).bit_length()
    values = list(values) + [None] * (n - len(values))
    while n > 1:
        n //= 2
        values = [values[u] if values[u + n] is None else op(values[u], values[u + n]) for u in range(n)]
    return values[0]


@cute.jit
def row_lse(safe_max, total):
    """``(lse, safe_lse)`` of a row from its max (0 where every split is empty) and its sum of
    ``exp(lse_s - max)``: the natural-log LSE (``-inf`` when the sum is 0) and the shift its
    splits' weights ``exp(lse_s - safe_lse)`` take (0 then: every weight is ``exp(-inf)``)."""
    lse = -Float32.inf
    safe_lse = Float32(0.0)
    if total > 0.0:
        lse = safe_max + cute.math.log(total, fastmath=FAST_MATH)
        safe_lse = lse
    return lse, safe_lse
