"""Combine of split-KV partials, written in CuTeDSL, for latency: about one memory round trip.

One CTA per output row ``(b, m, h)`` (grid = B * L_q * H), of ``W = 8`` warps. The warps share
the row as :class:`flashsplit.cute.merge.RowMerge` describes: warp ``w`` takes splits ``w, w + W,
...``, lanes own ``head_dim / 32`` contiguous columns, and every load a warp needs first (the
row's LSEs and its first ``chunk = 4`` splits, 16-byte vector loads when the partials are
aligned: checked at run time, otherwise scalar loads) is issued before anything waits on memory.
The warps' sums meet in shared memory (one barrier) and thread ``t`` writes column ``t``. A row
whose splits are all ``-inf`` gets O = 0 and LSE ``-inf`` (with sinks: LSE = the head's sink,
:func:`flashsplit.cute.softmax.add_sink`). ``W * chunk = 32`` splits are in flight at once; the
splits past them are loaded a chunk per warp at a time, one more round trip per chunk.

A row's reduction order does not depend on the launch's split count up to 32 (what a
batch-invariant decode launches): split ``s`` always sits in lane ``s`` of every warp's LSE
registers and in chunk slot ``s // W`` of warp ``s % W``, the tree reductions are fixed, and a
split past the launch's count is ``-inf``, which adds exactly 0 to each sum.
"""

from __future__ import annotations

import cutlass
from cutlass import Float32, Int32, Int64, cute
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T
from cutlass.memory import SmemAllocator

from . import softmax
from .configs import CombineConfig
from .merge import RowMerge


def _opaque(x: Int64) -> Int64:
    """``x``, hidden from the compiler's known-bits analysis: the placeholder pointer the kernel is
    compiled with claims 16-byte alignment, which would fold the runtime alignment check away."""
    return Int64(llvm.inline_asm(T.i64(), [x.ir_value()], "mov.b64 $0, $1;", "=l,l"))


class CombineKernel:
    def __init__(self, config: CombineConfig):
        self.config = config
        self.dtype = {"float16": cutlass.Float16, "bfloat16": cutlass.BFloat16, "float32": cutlass.Float32}[config.dtype]
        self.head_dim = config.head_dim
        self.cols_per_lane = config.head_dim // 32
        # A lane's columns load as vectors of up to 4 fp32 (16 bytes) when aligned; d = 96's
        # 3 columns per lane are 32 apart (RowMerge.strided): scalar loads, one path.
        self.vec = 1 if self.cols_per_lane & (self.cols_per_lane - 1) else min(self.cols_per_lane, 4)
        # 8 warps of 4 splits each: 32 splits in flight per row, each warp's share of the
        # weighted sum a short chain (H200, B = 1 x 4k/16k: 10.77 / 21.96 us vs 10.87 / 22.03
        # with 4 warps of 8 splits; a bare combine 2.05 vs 2.02 us). The CTA's 256 threads cover
        # every head dim (thread t writes column t). At most 32 fp32 partials per lane (d = 256).
        self.num_warps = 8
        self.chunk = 4
        self.num_threads = 32 * self.num_warps
        self.row_merge = RowMerge(config.head_dim, self.num_warps, self.chunk)

    @staticmethod
    def can_implement(head_dim: int) -> str | None:
        if head_dim % 32 != 0 or head_dim > 256:
            return f"head_dim {head_dim} is not a multiple of 32 up to 256"
        return None

    @cute.jit
    def __call__(
        self,
        op_ptr: cute.Pointer,
        lp_ptr: cute.Pointer,
        o_ptr: cute.Pointer,
        lse_ptr: cute.Pointer,
        num_splits: Int32,
        batch: Int32,
        seqlen_q: Int32,
        num_heads: Int32,
        op_stride_s: Int64,
        op_stride_b: Int64,
        op_stride_l: Int64,
        op_stride_h: Int64,
        lp_stride_s: Int64,
        lp_stride_b: Int64,
        lp_stride_h: Int64,
        lp_stride_l: Int64,
        o_stride_b: Int64,
        o_stride_l: Int64,
        o_stride_h: Int64,
        sinks_ptr: cute.Pointer,
        stream,
    ):
        """Merge the partials at ``op_ptr``/``lp_ptr`` into ``o_ptr``/``lse_ptr``; a sinks config
        reads ``sinks`` ``[num_heads]`` (its dtype) and joins each head's sink to its rows."""
        D = self.head_dim
        mLp = cute.make_tensor(
            lp_ptr,
            cute.make_layout(
                (num_splits, batch, num_heads, seqlen_q), stride=(lp_stride_s, lp_stride_b, lp_stride_h, lp_stride_l)
            ),
        )
        mO = cute.make_tensor(
            o_ptr, cute.make_layout((batch, seqlen_q, num_heads, D), stride=(o_stride_b, o_stride_l, o_stride_h, 1))
        )
        mLSE = cute.make_tensor(
            lse_ptr,
            cute.make_layout((batch, num_heads, seqlen_q), stride=(num_heads * seqlen_q, seqlen_q, 1)),
        )
        mSinks = None
        if cutlass.const_expr(bool(self.config.sinks)):
            mSinks = cute.make_tensor(sinks_ptr, cute.make_layout((num_heads,)))
        num_rows = batch * seqlen_q * num_heads
        self.kernel(
            op_ptr, op_stride_s, op_stride_b, op_stride_l, op_stride_h, mLp, mO, mLSE,
            num_splits, batch, seqlen_q, num_heads, mSinks,
        ).launch(
            grid=[num_rows, 1, 1],
            block=[self.num_threads, 1, 1],
            stream=stream,
            # A programmatic dependent of the split kernel, whose CTAs signal it after their last
            # tile (SplitConfig.signals_combine); after a kernel that does not signal (another
            # backend's partials) it starts when that grid ends.
            use_pdl=True,
        )

    @cute.kernel
    def kernel(
        self,
        op_ptr: cute.Pointer,
        op_stride_s: Int64,
        op_stride_b: Int64,
        op_stride_l: Int64,
        op_stride_h: Int64,
        mLp: cute.Tensor,
        mO: cute.Tensor,
        mLSE: cute.Tensor,
        num_splits: Int32,
        batch: Int32,
        seqlen_q: Int32,
        num_heads: Int32,
        mSinks: cute.Tensor | None,
    ):
        D, V = self.head_dim, self.vec
        tidx, _, _ = cute.arch.thread_idx()
        row, _, _ = cute.arch.block_idx()
        h = row % num_heads
        m = (row // num_heads) % seqlen_q
        b = row // (num_heads * seqlen_q)
        # Nothing of the previous grid (the split kernel's partials) is read before this wait;
        # without a programmatic dependence it returns at once.
        cute.arch.griddepcontrol_wait()

        smem = SmemAllocator()
        sAcc = smem.allocate_tensor(Float32, cute.make_layout((self.num_warps, D), stride=(D, 1)), byte_alignment=16)

        # The partials' pointer and strides are runtime values: take the vector path only when
        # every lane's slice really is aligned to V fp32 (the caller does not promise it).
        shape = (num_splits, batch, seqlen_q, num_heads, D)
        if cutlass.const_expr(self.row_merge.strided):
            mOp = cute.make_tensor(op_ptr, cute.make_layout(shape, stride=(op_stride_s, op_stride_b, op_stride_l,
                                                                           op_stride_h, 1)))
            self.combine_row(mOp, mLp, mO, mLSE, sAcc, num_splits, b, m, h, tidx, mSinks)
        else:
            addr = _opaque(op_ptr.toint())
            misaligned = addr | (op_stride_s * 4) | (op_stride_b * 4) | (op_stride_l * 4) | (op_stride_h * 4)
            if misaligned % (4 * V) == 0:
                mOp = cute.make_tensor(
                    cute.make_ptr(Float32, addr, cute.AddressSpace.gmem, assumed_align=4 * V),
                    cute.make_layout(
                        shape,
                        stride=(
                            cute.assume(op_stride_s, divby=V), cute.assume(op_stride_b, divby=V),
                            cute.assume(op_stride_l, divby=V), cute.assume(op_stride_h, divby=V), 1,
                        ),
                    ),
                )
                self.combine_row(mOp, mLp, mO, mLSE, sAcc, num_splits, b, m, h, tidx, mSinks)
            else:
                mOp = cute.make_tensor(
                    cute.make_ptr(Float32, addr, cute.AddressSpace.gmem, assumed_align=4),
                    cute.make_layout(shape, stride=(op_stride_s, op_stride_b, op_stride_l, op_stride_h, 1)),
                )
                self.combine_row(mOp, mLp, mO, mLSE, sAcc, num_splits, b, m, h, tidx, mSinks)

    @cute.jit
    def combine_row(self, mOp, mLp, mO, mLSE, sAcc, num_splits, b, m, h, tidx, mSinks=None):
        C, NW = self.cols_per_lane, self.num_warps
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        lane = tidx % 32
        acc = cute.make_rmem_tensor((C,), Float32)
        sink = None
        if cutlass.const_expr(mSinks is not None):  # loaded first: its latency overlaps the partials'
            sink = mSinks[h].to(Float32)
        lse = self.row_merge.warp_sum(mOp, mLp, acc, num_splits, b, m, h, warp, lane)
        factor = None
        if cutlass.const_expr(mSinks is not None):  # the head's sink joins the merged softmax
            lse, factor = softmax.add_sink(lse, sink)

        # 4. Merge the warps through shared memory; thread t writes column t (d = 64: t < 64).
        cute.autovec_copy(acc, self.row_merge.lane_columns(sAcc[warp, None], lane))
        cute.arch.barrier()
        if tidx < self.head_dim:
            o = sAcc[0, tidx]
            for w in cutlass.range_constexpr(1, NW):
                o += sAcc[w, tidx]
            if cutlass.const_expr(factor is not None):
                o = o * factor
            mO[b, m, h, tidx] = o.to(self.dtype)
        if tidx == 0:
            mLSE[b, h, m] = lse
