"""Combine of split-KV partials, written in CuTeDSL.

One warp per output row ``(b, m, h)``; each lane owns ``head_dim / 32`` contiguous columns.
The lanes first reduce the row's split LSEs (max, then the sum of ``exp(lse_s - max)``), then
walk the splits once, skipping every split whose LSE is ``-inf`` (its ``out_partial`` slice is
never read: empty splits do not write it). A row whose splits are all ``-inf`` gets O = 0 and
LSE = ``-inf``.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64

from .configs import CombineConfig


class CombineKernel:
    num_threads = 128
    rows_per_cta = 4  # one warp per row

    def __init__(self, config: CombineConfig):
        self.config = config
        self.dtype = {"float16": cutlass.Float16, "bfloat16": cutlass.BFloat16, "float32": cutlass.Float32}[config.dtype]
        self.head_dim = config.head_dim
        self.cols_per_lane = config.head_dim // 32

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
        stream,
    ):
        D = self.head_dim
        mOp = cute.make_tensor(
            op_ptr,
            cute.make_layout(
                (num_splits, batch, seqlen_q, num_heads, D),
                stride=(op_stride_s, op_stride_b, op_stride_l, op_stride_h, 1),
            ),
        )
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
        num_rows = batch * seqlen_q * num_heads
        self.kernel(mOp, mLp, mO, mLSE, num_splits, seqlen_q, num_heads, num_rows).launch(
            grid=[(num_rows + self.rows_per_cta - 1) // self.rows_per_cta, 1, 1],
            block=[self.num_threads, 1, 1],
            stream=stream,
        )

    @cute.kernel
    def kernel(
        self,
        mOp: cute.Tensor,
        mLp: cute.Tensor,
        mO: cute.Tensor,
        mLSE: cute.Tensor,
        num_splits: Int32,
        seqlen_q: Int32,
        num_heads: Int32,
        num_rows: Int32,
    ):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        lane = tidx % 32
        row = bidx * self.rows_per_cta + cute.arch.make_warp_uniform(cute.arch.warp_idx())
        if row < num_rows:
            h = row % num_heads
            m = (row // num_heads) % seqlen_q
            b = row // (num_heads * seqlen_q)

            lse_max = -Float32.inf
            for s in cutlass.range(lane, num_splits, 32, unroll=1):
                lse_max = cute.arch.fmax(lse_max, mLp[s, b, h, m])
            lse_max = cute.arch.warp_reduction(lse_max, cute.arch.fmax)
            safe_max = lse_max
            if lse_max == -Float32.inf:
                safe_max = 0.0
            total = Float32(0.0)
            for s in cutlass.range(lane, num_splits, 32, unroll=1):
                total += cute.math.exp(mLp[s, b, h, m] - safe_max, fastmath=False)
            total = cute.arch.warp_reduction(total, lambda x, y: x + y)

            lse = -Float32.inf
            if total > 0.0:
                lse = safe_max + cute.math.log(total, fastmath=False)

            C = self.cols_per_lane
            acc = cute.make_rmem_tensor((C,), Float32)
            acc.fill(0.0)
            part = cute.make_rmem_tensor((C,), Float32)
            if total > 0.0:
                for s in cutlass.range(num_splits, unroll=1):
                    lse_s = mLp[s, b, h, m]
                    if lse_s != -Float32.inf:
                        w = cute.math.exp(lse_s - lse, fastmath=False)
                        cute.autovec_copy(cute.local_tile(mOp[s, b, m, h, None], (C,), (lane,)), part)
                        for j in cutlass.range_constexpr(C):
                            acc[j] += w * part[j]
            out = cute.make_rmem_tensor((C,), self.dtype)
            out.store(acc.load().to(self.dtype))
            cute.autovec_copy(out, cute.local_tile(mO[b, m, h, None], (C,), (lane,)))
            if lane == 0:
                mLSE[b, h, m] = lse
