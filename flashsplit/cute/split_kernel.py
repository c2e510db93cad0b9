"""Split-KV decode forward for Hopper (sm_90a), written in CuTeDSL.

One CTA per (split ``s``, batch row ``b``, KV head ``kvh`` x row block). The CTA owns the keys
``[start, end)`` of its split, computed on the device from ``cache_seqlens[b]`` with the shared
rule of :mod:`flashsplit.plan`, and the GQA-packed query rows of one KV head:
packed row ``r = m * group + h`` (q-head fastest) is ``q[b, m, kvh * group + h, :]``.

Warp roles (160 threads):

- warps 0-3, the consumer warpgroup: load Q into shared memory (plain global loads; the packed
  rows are tiny and not one TMA box), then per KV tile ``S = Q K^T`` (wgmma, both operands in
  shared memory), mask, online softmax in fp32 registers (exp2 with a log2(e)-scaled scale),
  ``O += P V`` (wgmma, P from registers), and the epilogue straight from registers.
- warp 4, the producer: TMA (``cp.async.bulk.tensor``) loads of one K tile and one V tile per
  pipeline stage, completed on the stage's mbarrier (``PipelineTmaAsync``).

Dense and paged caches share one load path: the cache is viewed as ``(slot, d, kv_head, cache
row)`` and tile ``t`` of batch row ``b`` is TMA tile ``(tile in row, cache row)``. Dense: the
cache row is ``b`` and the tile is ``t``. Paged (``SplitConfig.paged``, page size a multiple of
the tile): the cache row is the page ``block_table[b, t // tiles_per_page]``, read by the producer
warp one tile ahead, and the tile is ``t % tiles_per_page``; a tile never straddles a page.
Sub-tile paging (``SplitConfig.subtile_page = P``, pages of P < tile_n keys, P a multiple of 8):
each K/V tile is ``tile_n / P`` TMA boxes of P keys, box ``j`` from page
``block_table[b, t * tile_n / P + j]`` into rows ``[j*P, (j+1)*P)`` of the stage, all on the
stage's mbarrier (``load_subtile``); the consumer is the same. Other page sizes: one bulk copy
per key row into staging slots (``gather_pages``, ``load_gather``).

Other compile keys (:class:`~flashsplit.cute.configs.SplitConfig`): fp8 caches land in staging
slots the consumer converts (``convert_kv``; ``fp16_operands`` for a bf16 q); ``merge`` has the
last CTA of a row tile merge the partials (``merge_if_last``); the tile, stages and CTAs per SM
come from the config (two per SM, or one with ``configs.ONE_PER_SM_TILE``). Warp halves holding
only padding rows skip the softmax (``softmax_rows``).

No ``setmaxnreg``: with one producer warp (not a warpgroup) the CTA holds only 160 threads, so
two CTAs per SM already leave the consumer ~200 registers, more than it needs.
"""

from __future__ import annotations

import math

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass.memory import SmemAllocator
from cutlass.tensor_utils import LayoutEnum
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import Float32, Int32, Int64
from cutlass.cute.nvgpu import cpasync, warpgroup

from ..plan import SPLIT_GRANULE
from . import split_rule
from .configs import SplitConfig
from .merge import RowMerge

LOG2_E = math.log2(math.e)
LN_2 = math.log(2.0)


class SplitKVDecodeKernel:
    """Static configuration of one compiled split kernel (see :class:`SplitConfig`)."""

    block_m = 64
    num_consumer_threads = 128
    num_threads = 160  # one consumer warpgroup + one producer warp
    producer_warp = 4
    q_barrier_id = 1  # named barrier of the consumer warpgroup (0 is __syncthreads)

    def __init__(self, config: SplitConfig):
        self.config = config
        self.dtype = cutlass.Float16 if config.dtype == "float16" else cutlass.BFloat16
        self.head_dim = config.head_dim
        self.tile_n = config.tile_n
        self.stages = config.stages
        self.causal = config.causal
        self.write_partials = config.write_partials
        self.units_per_sm = config.units_per_sm
        self.paged = config.paged
        # Sub-tile paging: pages of P < tile_n keys, tile_n / P TMA boxes per K/V tile.
        self.subtile_page = config.subtile_page
        self.boxes_per_tile = config.tile_n // config.subtile_page if config.subtile_page else 1
        self.fp8 = config.fp8
        # Gathered paging (any page size): one bulk copy per key row into the staging slots.
        self.gather_pages = config.gather_pages
        self.staged = config.staged
        self.kv_dtype = {
            "same": self.dtype, "float8_e4m3fn": cutlass.Float8E4M3FN, "float8_e5m2": cutlass.Float8E5M2,
        }[config.kv_dtype]
        # 16-bit operand stages: the TMA stages, or one buffer the consumer converts (fp8) or
        # copies (gathered 16-bit rows) each staged tile into.
        self.operand_stages = 1 if self.staged else self.stages
        # The wgmma operands' type (q, K, V, P): q's, or fp16 for an fp8 cache with a bf16 q
        # (SplitConfig.fp16_operands: q rows scaled into fp16's range, the scores scaled back).
        self.fp16_operands = config.fp16_operands
        self.scaled_q = config.fp16_operands  # per-row q scale in row_scale
        self.op_dtype = cutlass.Float16 if config.fp16_operands else self.dtype
        # Last-CTA merge (SplitConfig.merge): one warp per row, 64 fp32 of partials per lane in
        # flight (d = 128: 16 splits a round trip).
        self.merge = config.merge
        self.row_merge = RowMerge(config.head_dim, 1, 2048 // config.head_dim)
        # A partials launch that a combine follows signals it after its last tile (PDL).
        self.signals_combine = config.signals_combine
        # Swapped operands for 1-8 packed rows (SplitConfig.swap_rows): the CTA's row tile is
        # swap_rows q rows (wgmma's N) instead of wgmma's M = 64.
        self.swap_rows = config.swap_rows
        self.block_m = config.rows

    @staticmethod
    def can_implement(head_dim: int, tile_n: int) -> str | None:
        if head_dim not in (64, 128, 256):
            return f"head_dim {head_dim} is not one of 64, 128, 256"
        if SPLIT_GRANULE % tile_n != 0 or tile_n % 64 != 0:
            return f"tile_n {tile_n} must be a multiple of 64 dividing the {SPLIT_GRANULE}-key split granule"
        return None

    # ------------------------------------------------------------------------------------------
    # Host side: tensors, TMA atoms, shared storage, grid.
    # ------------------------------------------------------------------------------------------
    @cute.jit
    def __call__(
        self,
        q_ptr: cute.Pointer,
        k_ptr: cute.Pointer,
        v_ptr: cute.Pointer,
        o_ptr: cute.Pointer,
        lse_ptr: cute.Pointer,
        seqlens_ptr: cute.Pointer,
        block_table_ptr: cute.Pointer,
        batch: Int32,
        seqlen_q: Int32,
        seqlen_k: Int32,
        num_heads: Int32,
        num_heads_kv: Int32,
        num_splits: Int32,
        cache_rows: Int32,
        cache_len: Int32,
        max_pages: Int32,
        block_table_stride_b: Int64,
        q_stride_b: Int64,
        q_stride_l: Int64,
        q_stride_h: Int64,
        k_stride_b: Int64,
        k_stride_l: Int64,
        k_stride_h: Int64,
        v_stride_b: Int64,
        v_stride_l: Int64,
        v_stride_h: Int64,
        o_stride_s: Int64,
        o_stride_b: Int64,
        o_stride_l: Int64,
        o_stride_h: Int64,
        softmax_scale_log2: Float32,
        k_descale_ptr: cute.Pointer,
        v_descale_ptr: cute.Pointer,
        k_descale_stride_b: Int64,
        k_descale_stride_h: Int64,
        v_descale_stride_b: Int64,
        v_descale_stride_h: Int64,
        out_ptr: cute.Pointer,
        out_lse_ptr: cute.Pointer,
        arrivals_ptr: cute.Pointer,
        out_stride_b: Int64,
        out_stride_l: Int64,
        out_stride_h: Int64,
        stream,
    ):
        """Launch on raw pointers; sizes and strides are runtime values.

        ``seqlen_k`` is the capacity of a row in keys (lengths are clamped to it). The caches are
        ``[cache_rows, cache_len, num_heads_kv, D]``: dense ``cache_rows = batch`` and
        ``cache_len = seqlen_k``; paged ``cache_rows = num_pages``, ``cache_len = page_size`` and
        the int32 ``block_table`` is ``[batch, max_pages]`` with row stride
        ``block_table_stride_b`` (a dense launch passes any pointer: it is never read).
        fp8 caches (``kv_dtype``): fp32 descales indexed ``[b * stride_b + kvh * stride_h]``
        (strides 0 for a one-element descale); a 16-bit config never reads them.
        ``merge``: the partials at ``o_ptr``/``lse_ptr`` are the launcher's compact workspace;
        the final ``out`` (q's dtype, ``[batch, seqlen_q, heads, D]`` with 16-byte aligned
        strides) and compact fp32 ``lse`` ``[batch, heads, seqlen_q]`` are written by the last
        CTA of each row tile, counted on the zeroed int32 ``arrivals``
        ``[batch * heads_kv * row_blocks]`` (other configs never read these three).
        """
        D, N, M = self.head_dim, self.tile_n, self.block_m
        group = num_heads // num_heads_kv
        row_blocks = (seqlen_q * group + M - 1) // M

        # q viewed as (seqlen_q, heads, d, batch); o the same plus a leading split mode.
        mQ = cute.make_tensor(
            q_ptr, cute.make_layout((seqlen_q, num_heads, D, batch), stride=(q_stride_l, q_stride_h, 1, q_stride_b))
        )
        # K as the B operand of S = Q K^T: (slots, d, kv_heads, cache rows), d contiguous (K-major).
        # A cache row is a batch row (dense) or a page (paged).
        mK = cute.make_tensor(
            k_ptr,
            cute.make_layout((cache_len, D, num_heads_kv, cache_rows), stride=(k_stride_l, 1, k_stride_h, k_stride_b)),
        )
        # V as the B operand of O = P V: (d, slots, kv_heads, cache rows), d contiguous (N-major).
        mV = cute.make_tensor(
            v_ptr,
            cute.make_layout((D, cache_len, num_heads_kv, cache_rows), stride=(1, v_stride_l, v_stride_h, v_stride_b)),
        )
        o_strides = (o_stride_s, o_stride_b, o_stride_l, o_stride_h)
        if cutlass.const_expr(self.merge):
            # The workspace's partials: every stride a multiple of D, so the merge's loads of a
            # lane's D / 32 columns are vectors.
            o_strides = tuple(cute.assume(x, divby=self.row_merge.cols_per_lane) for x in o_strides)
        mO = cute.make_tensor(
            o_ptr, cute.make_layout((num_splits, batch, seqlen_q, num_heads, D), stride=(*o_strides, 1))
        )
        # lse (partials: [splits, batch, heads, seqlen_q]; final: the same with one split), compact.
        mLSE = cute.make_tensor(
            lse_ptr,
            cute.make_layout(
                (num_splits, batch, num_heads, seqlen_q),
                stride=(batch * num_heads * seqlen_q, num_heads * seqlen_q, seqlen_q, 1),
            ),
        )
        mSeqlens = cute.make_tensor(seqlens_ptr, cute.make_layout((batch,)))
        mBlockTable = cute.make_tensor(
            block_table_ptr, cute.make_layout((batch, max_pages), stride=(block_table_stride_b, 1))
        )
        # KV tiles per cache row's slots: a page holds page_size / N whole tiles (paged).
        tiles_per_page = cache_len // N

        k_major = LayoutEnum.ROW_MAJOR
        v_major = LayoutEnum.COL_MAJOR
        op = self.op_dtype
        if cutlass.const_expr(self.swap_rows > 0):
            # S^T = K Q^T (A: the K tile, K-major; B: q's rows, K-major) and O^T = V^T P^T (A: the
            # V tile read as (d, keys), MN-major; B: P^T in shared memory, K-major). The K and V
            # stages are the same swizzled (keys, d) / (d, keys) tiles as below.
            qk_tiler = (N, M, D)
            pv_tiler = (D, M, N)
            qk_mma = sm90_utils.make_trivial_tiled_mma(
                op, op, k_major.sm90_mma_major_mode(), k_major.sm90_mma_major_mode(), Float32, (1, 1, 1), (64, M),
            )
            pv_mma = sm90_utils.make_trivial_tiled_mma(
                op, op, v_major.sm90_mma_major_mode(), k_major.sm90_mma_major_mode(), Float32, (1, 1, 1), (64, M),
            )
            q_layout = sm90_utils.make_smem_layout_b(k_major, qk_tiler, op, 1)
            k_layout = sm90_utils.make_smem_layout_a(k_major, qk_tiler, op, self.operand_stages)
            v_layout = sm90_utils.make_smem_layout_a(v_major, pv_tiler, op, self.operand_stages)
            p_layout = sm90_utils.make_smem_layout_b(k_major, pv_tiler, op, 1)
        else:
            qk_tiler = (M, N, D)
            pv_tiler = (M, D, N)
            qk_mma = sm90_utils.make_trivial_tiled_mma(
                op, op, k_major.sm90_mma_major_mode(), k_major.sm90_mma_major_mode(), Float32, (1, 1, 1),
                qk_tiler[:2],
            )
            pv_mma = sm90_utils.make_trivial_tiled_mma(
                op, op, cute.nvgpu.OperandMajorMode.K, v_major.sm90_mma_major_mode(),
                Float32, (1, 1, 1), pv_tiler[:2], warpgroup.OperandSource.RMEM,
            )
            q_layout = sm90_utils.make_smem_layout_a(k_major, qk_tiler, op, 1)
            k_layout = sm90_utils.make_smem_layout_b(k_major, qk_tiler, op, self.operand_stages)
            v_layout = sm90_utils.make_smem_layout_b(v_major, pv_tiler, op, self.operand_stages)
            p_layout = q_layout  # (unused: P stays in registers)
        # What the loads land: the operand stages themselves (16-bit TMA), or plain (unswizzled,
        # d contiguous: one key row = D contiguous elements) staging slots that the consumer
        # converts (fp8) or copies (gathered rows) into the operand buffers.
        k_load_layout, v_load_layout = k_layout, v_layout
        if cutlass.const_expr(self.staged):
            k_load_layout = cute.make_layout((N, D, self.stages), stride=(D, 1, N * D))
            v_load_layout = cute.make_layout((D, N, self.stages), stride=(1, D, N * D))

        if cutlass.const_expr(self.gather_pages):
            # No TMA: a bulk-copy atom of one key row (D elements), and the caches themselves.
            row_bits = D * self.kv_dtype.width
            tma_k = cute.make_copy_atom(cpasync.CopyBulkG2SOp(), self.kv_dtype, num_bits_per_copy=row_bits)
            tma_v = cute.make_copy_atom(cpasync.CopyBulkG2SOp(), self.kv_dtype, num_bits_per_copy=row_bits)
            mK_tma, mV_tma = mK, mV
        elif cutlass.const_expr(self.subtile_page > 0):
            # One TMA box per page: P keys of a stage, rows [j*P, (j+1)*P) (P a multiple of 8, so
            # every box starts on a 1024-byte swizzle atom of the 16-bit stage).
            P = self.subtile_page
            k_box_layout = cute.slice_(
                cute.flat_divide(cute.slice_(k_load_layout, (None, None, 0)), (P, D)), (None, None, 0, 0)
            )
            v_box_layout = cute.slice_(
                cute.flat_divide(cute.slice_(v_load_layout, (None, None, 0)), (D, P)), (None, None, 0, 0)
            )
            tma_k, mK_tma = cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileG2SOp(), mK, k_box_layout, (P, D))
            tma_v, mV_tma = cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileG2SOp(), mV, v_box_layout, (D, P))
        else:
            tma_k, mK_tma = cpasync.make_tiled_tma_atom(
                cpasync.CopyBulkTensorTileG2SOp(), mK, cute.slice_(k_load_layout, (None, None, 0)), (N, D)
            )
            tma_v, mV_tma = cpasync.make_tiled_tma_atom(
                cpasync.CopyBulkTensorTileG2SOp(), mV, cute.slice_(v_load_layout, (None, None, 0)), (D, N)
            )
        self.k_tx_bytes = cute.size_in_bytes(self.kv_dtype, cute.slice_(k_load_layout, (None, None, 0)))
        self.v_tx_bytes = cute.size_in_bytes(self.kv_dtype, cute.slice_(v_load_layout, (None, None, 0)))

        merge = self.merge
        if cutlass.const_expr(self.staged):
            scaled_q = self.scaled_q

            @cute.struct
            class SharedStorage:
                sQ: cute.struct.Align[cute.struct.MemRange[op, cute.cosize(q_layout)], 1024]
                sK: cute.struct.Align[cute.struct.MemRange[op, cute.cosize(k_layout)], 1024]
                sV: cute.struct.Align[cute.struct.MemRange[op, cute.cosize(v_layout)], 1024]
                sK8: cute.struct.Align[cute.struct.MemRange[self.kv_dtype, cute.cosize(k_load_layout)], 1024]
                sV8: cute.struct.Align[cute.struct.MemRange[self.kv_dtype, cute.cosize(v_load_layout)], 1024]
                kv_mbar: cute.struct.MemRange[cutlass.Int64, self.stages * 2]
                if cutlass.const_expr(scaled_q):  # each q row's score scale (fp16 operands)
                    row_scale: cute.struct.MemRange[Float32, M]
                if cutlass.const_expr(merge):  # the arrival count, broadcast to the consumer warps
                    ticket: cute.struct.MemRange[Int32, 4]

        elif cutlass.const_expr(self.swap_rows > 0):

            @cute.struct
            class SharedStorage:
                sQ: cute.struct.Align[cute.struct.MemRange[op, cute.cosize(q_layout)], 1024]
                sK: cute.struct.Align[cute.struct.MemRange[op, cute.cosize(k_layout)], 1024]
                sV: cute.struct.Align[cute.struct.MemRange[op, cute.cosize(v_layout)], 1024]
                sP: cute.struct.Align[cute.struct.MemRange[op, cute.cosize(p_layout)], 1024]
                kv_mbar: cute.struct.MemRange[cutlass.Int64, self.stages * 2]
                red: cute.struct.MemRange[Float32, 4 * M]  # per consumer warp, per q row
                if cutlass.const_expr(merge):  # the arrival count, broadcast to the consumer warps
                    ticket: cute.struct.MemRange[Int32, 4]

        else:

            @cute.struct
            class SharedStorage:
                sQ: cute.struct.Align[cute.struct.MemRange[op, cute.cosize(q_layout)], 1024]
                sK: cute.struct.Align[cute.struct.MemRange[op, cute.cosize(k_layout)], 1024]
                sV: cute.struct.Align[cute.struct.MemRange[op, cute.cosize(v_layout)], 1024]
                kv_mbar: cute.struct.MemRange[cutlass.Int64, self.stages * 2]
                if cutlass.const_expr(merge):  # the arrival count, broadcast to the consumer warps
                    ticket: cute.struct.MemRange[Int32, 4]

        mKDescale = None
        mVDescale = None
        if cutlass.const_expr(self.fp8):
            mKDescale = cute.make_tensor(
                k_descale_ptr, cute.make_layout((batch, num_heads_kv), stride=(k_descale_stride_b, k_descale_stride_h))
            )
            mVDescale = cute.make_tensor(
                v_descale_ptr, cute.make_layout((batch, num_heads_kv), stride=(v_descale_stride_b, v_descale_stride_h))
            )

        mOut = None
        mOutLSE = None
        mArrivals = None
        if cutlass.const_expr(self.merge):
            mOut = cute.make_tensor(
                out_ptr,
                cute.make_layout(
                    (batch, seqlen_q, num_heads, D),
                    stride=(cute.assume(out_stride_b, divby=8), cute.assume(out_stride_l, divby=8),
                            cute.assume(out_stride_h, divby=8), 1),
                ),
            )
            mOutLSE = cute.make_tensor(
                out_lse_ptr,
                cute.make_layout((batch, num_heads, seqlen_q), stride=(num_heads * seqlen_q, seqlen_q, 1)),
            )
            mArrivals = cute.make_tensor(arrivals_ptr, cute.make_layout((batch * num_heads_kv * row_blocks,)))

        self.shared_storage = SharedStorage

        self.kernel(
            qk_mma, pv_mma, tma_k, mK_tma, tma_v, mV_tma, mQ, mO, mLSE, mSeqlens, mBlockTable,
            q_layout, k_layout, v_layout, p_layout, seqlen_q, seqlen_k, group, row_blocks, num_splits, tiles_per_page,
            softmax_scale_log2, mKDescale, mVDescale, k_load_layout, v_load_layout, mOut, mOutLSE, mArrivals,
        ).launch(
            grid=[num_splits, batch, num_heads_kv * row_blocks],
            block=[self.num_threads, 1, 1],
            stream=stream,
            min_blocks_per_mp=self.units_per_sm,
            # The whole unified L1/smem as shared memory (percent); given explicitly, it also
            # spares the compiler a device query, so the kernel compiles on a machine without a GPU.
            preferred_smem_carveout=100,
        )

    # ------------------------------------------------------------------------------------------
    # Device side.
    # ------------------------------------------------------------------------------------------
    @cute.kernel
    def kernel(
        self,
        qk_mma: cute.TiledMma,
        pv_mma: cute.TiledMma,
        tma_k: cute.CopyAtom,
        mK_tma: cute.Tensor,
        tma_v: cute.CopyAtom,
        mV_tma: cute.Tensor,
        mQ: cute.Tensor,
        mO: cute.Tensor,
        mLSE: cute.Tensor,
        mSeqlens: cute.Tensor,
        mBlockTable: cute.Tensor,
        q_layout: cute.ComposedLayout,
        k_layout: cute.ComposedLayout,
        v_layout: cute.ComposedLayout,
        p_layout: cute.ComposedLayout,
        seqlen_q: Int32,
        seqlen_k: Int32,
        group: Int32,
        row_blocks: Int32,
        num_splits: Int32,
        tiles_per_page: Int32,
        softmax_scale_log2: Float32,
        mKDescale: cute.Tensor | None,
        mVDescale: cute.Tensor | None,
        k_load_layout,
        v_load_layout,
        mOut: cute.Tensor | None,
        mOutLSE: cute.Tensor | None,
        mArrivals: cute.Tensor | None,
    ):
        tidx, _, _ = cute.arch.thread_idx()
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        split_idx, batch_idx, z_idx = cute.arch.block_idx()
        kvh = z_idx // row_blocks
        row_block = z_idx % row_blocks

        smem = SmemAllocator()
        storage = smem.allocate(self.shared_storage)
        kv_pipeline = self.make_kv_pipeline(storage.kv_mbar.data_ptr(), self.k_tx_bytes + self.v_tx_bytes)

        sQ = storage.sQ.get_tensor(q_layout.outer, swizzle=q_layout.inner)
        sK = storage.sK.get_tensor(k_layout.outer, swizzle=k_layout.inner)
        sV = storage.sV.get_tensor(v_layout.outer, swizzle=v_layout.inner)
        sRowScale = None  # scaled q: each q row's score scale (1 / its power-of-two factor)
        if cutlass.const_expr(self.scaled_q):
            sRowScale = storage.row_scale.get_tensor(cute.make_layout((self.block_m,)))
        # What the loads write: the operand stages, or the staging slots.
        sK_load, sV_load = sK, sV
        if cutlass.const_expr(self.staged):
            sK_load = storage.sK8.get_tensor(k_load_layout)
            sV_load = storage.sV8.get_tensor(v_load_layout)

        # This CTA's keys, with exactly the rule of flashsplit.plan.
        n_keys = split_rule.load_seqlen(mSeqlens, batch_idx, seqlen_k)
        start, end = split_rule.row_split_range(n_keys, split_idx, num_splits)
        num_tiles = Int32(0)
        if start < end:
            num_tiles = (end - start + self.tile_n - 1) // self.tile_n
        first_tile = start // self.tile_n

        cute.arch.mbarrier_init_fence()
        cute.arch.sync_threads()

        if warp_idx == self.producer_warp:
            if cutlass.const_expr(self.gather_pages):
                self.load_gather(tma_k, mK_tma, tma_v, mV_tma, mBlockTable, sK_load, sV_load, kv_pipeline,
                                 batch_idx, kvh, first_tile, num_tiles, end)
            elif cutlass.const_expr(self.subtile_page > 0):
                self.load_subtile(tma_k, mK_tma, tma_v, mV_tma, mBlockTable, sK_load, sV_load, kv_pipeline,
                                  batch_idx, kvh, first_tile, num_tiles, end)
            else:
                self.load(tma_k, mK_tma, tma_v, mV_tma, mBlockTable, sK_load, sV_load, kv_pipeline,
                          batch_idx, kvh, first_tile, num_tiles, tiles_per_page)
        if warp_idx < self.producer_warp:
            if cutlass.const_expr(self.swap_rows > 0):
                self.mma_softmax_epilogue_swap(
                    qk_mma, pv_mma, mQ, mO, mLSE, sQ, sK, sV, storage.sP.get_tensor(p_layout.outer, swizzle=p_layout.inner),
                    storage.red.get_tensor(cute.make_layout((4 * self.block_m,))), kv_pipeline, tidx, split_idx,
                    batch_idx, kvh, row_block, seqlen_q, group, n_keys, end, num_tiles, first_tile, softmax_scale_log2,
                )
            elif cutlass.const_expr(self.fp8):
                # k_descale folds into the (log2) softmax scale, v_descale into the output.
                self.mma_softmax_epilogue(
                    qk_mma, pv_mma, mQ, mO, mLSE, sQ, sK, sV, kv_pipeline, tidx, split_idx, batch_idx, kvh,
                    row_block, seqlen_q, group, n_keys, start, end, num_tiles, first_tile,
                    softmax_scale_log2 * mKDescale[batch_idx, kvh], sK_load, sV_load, mVDescale[batch_idx, kvh],
                    sRowScale,
                )
            elif cutlass.const_expr(self.staged):  # gathered 16-bit rows: staged, no scales
                self.mma_softmax_epilogue(
                    qk_mma, pv_mma, mQ, mO, mLSE, sQ, sK, sV, kv_pipeline, tidx, split_idx, batch_idx, kvh,
                    row_block, seqlen_q, group, n_keys, start, end, num_tiles, first_tile, softmax_scale_log2,
                    sK_load, sV_load, None, None,
                )
            else:
                self.mma_softmax_epilogue(
                    qk_mma, pv_mma, mQ, mO, mLSE, sQ, sK, sV, kv_pipeline, tidx, split_idx, batch_idx, kvh,
                    row_block, seqlen_q, group, n_keys, start, end, num_tiles, first_tile, softmax_scale_log2,
                    None, None, None, None,
                )
            if cutlass.const_expr(self.merge):
                self.merge_if_last(mO, mLSE, mOut, mOutLSE, mArrivals, storage.ticket.get_tensor(cute.make_layout((4,))),
                                   tidx, batch_idx, z_idx, kvh, row_block, seqlen_q, group, num_splits)

    def make_kv_pipeline(self, mbar_ptr, tx_bytes):
        """Full/empty mbarriers of ``stages`` stages that each receive ``tx_bytes`` (K+V, or K or
        V alone): one TMA thread produces, 4 consumer warps release."""
        return pipeline.PipelineTmaAsync.create(
            barrier_storage=mbar_ptr,
            num_stages=self.stages,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, self.num_consumer_threads // 32),
            tx_count=tx_bytes,
            defer_sync=True,
        )

    @cute.jit
    def load(self, tma_k, mK_tma, tma_v, mV_tma, mBlockTable, sK, sV, kv_pipeline, batch_idx, kvh, first_tile,
             num_tiles, tiles_per_page):
        """Producer warp: one K tile and one V tile per stage, by TMA.

        Tile ``t`` of this row is TMA tile ``(tile in cache row, cache row)``: ``(t, b)`` dense,
        ``(t % tiles_per_page, block_table[b, t // tiles_per_page])`` paged. The page id of the
        next tile is loaded before waiting for a free stage, so its latency hides behind that
        wait; only entries of tiles this split loads are read (never past the row's last page).
        """
        cpasync.prefetch_descriptor(tma_k)
        cpasync.prefetch_descriptor(tma_v)
        # (N, D, tiles, cache rows) and (D, N, tiles, cache rows) views of this kv head.
        gK = cute.local_tile(mK_tma[None, None, kvh, None], (self.tile_n, self.head_dim), (None, 0, None))
        gV = cute.local_tile(mV_tma[None, None, kvh, None], (self.head_dim, self.tile_n), (0, None, None))
        tKsK, tKgK = cpasync.tma_partition(
            tma_k, 0, cute.make_layout(1), cute.group_modes(sK, 0, 2), cute.group_modes(gK, 0, 2)
        )
        tVsV, tVgV = cpasync.tma_partition(
            tma_v, 0, cute.make_layout(1), cute.group_modes(sV, 0, 2), cute.group_modes(gV, 0, 2)
        )
        next_row = batch_idx
        if cutlass.const_expr(self.paged):
            if num_tiles > 0:
                next_row = mBlockTable[batch_idx, first_tile // tiles_per_page]
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
        for i in cutlass.range(num_tiles, unroll=1):
            tile = first_tile + i
            row = next_row
            if cutlass.const_expr(self.paged):
                tile = tile % tiles_per_page
                if i + 1 < num_tiles:
                    next_row = mBlockTable[batch_idx, (first_tile + i + 1) // tiles_per_page]
            kv_pipeline.producer_acquire(state)
            bar = kv_pipeline.producer_get_barrier(state)
            cute.copy(tma_k, tKgK[(None, tile, row)], tKsK[(None, state.index)], tma_bar_ptr=bar)
            cute.copy(tma_v, tVgV[(None, tile, row)], tVsV[(None, state.index)], tma_bar_ptr=bar)
            kv_pipeline.producer_commit(state)
            state.advance()

    @cute.jit
    def load_subtile(self, tma_k, mK_tma, tma_v, mV_tma, mBlockTable, sK, sV, kv_pipeline, batch_idx, kvh,
                     first_tile, num_tiles, end):
        """Producer warp, pages of P < tile_n keys: tile ``t`` is ``tile_n / P`` TMA boxes per
        tensor, box ``j`` (keys ``[t*N + j*P, t*N + (j+1)*P)``) from slot 0 of page
        ``block_table[b, t * N / P + j]`` into rows ``[j*P, (j+1)*P)`` of the stage; all land on
        the stage's full mbarrier (same transaction bytes as one whole-tile box).

        The page ids of the next tile are loaded before waiting for a free stage. Only entries of
        pages holding keys ``< end`` are read (never past the row's last page): a box past
        ``end`` in the last tile reloads the tile's first page instead, into rows the consumer
        masks (scores) and zeroes (V), so the stage still receives its full byte count.
        """
        D, P = self.head_dim, self.subtile_page
        boxes = self.boxes_per_tile
        cpasync.prefetch_descriptor(tma_k)
        cpasync.prefetch_descriptor(tma_v)
        # (P, D, pages) and (D, P, pages): a page holds one box (the slot mode is P long).
        gK = cute.local_tile(mK_tma[None, None, kvh, None], (P, D), (0, 0, None))
        gV = cute.local_tile(mV_tma[None, None, kvh, None], (D, P), (0, 0, None))
        # Stages as (P, D, boxes, 1, stages) and (D, P, 1, boxes, stages).
        sKb = cute.flat_divide(sK, (P, D))
        sVb = cute.flat_divide(sV, (D, P))
        tKsK, tKgK = cpasync.tma_partition(
            tma_k, 0, cute.make_layout(1), cute.group_modes(sKb, 0, 2), cute.group_modes(gK, 0, 2)
        )
        tVsV, tVgV = cpasync.tma_partition(
            tma_v, 0, cute.make_layout(1), cute.group_modes(sVb, 0, 2), cute.group_modes(gV, 0, 2)
        )
        next_pages = cute.make_rmem_tensor((boxes,), Int32)
        pages = cute.make_rmem_tensor((boxes,), Int32)
        if num_tiles > 0:
            self.read_pages(mBlockTable, next_pages, batch_idx, first_tile, end)
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
        for i in cutlass.range(num_tiles, unroll=1):
            for j in cutlass.range_constexpr(boxes):
                pages[j] = next_pages[j]
            if i + 1 < num_tiles:
                self.read_pages(mBlockTable, next_pages, batch_idx, first_tile + i + 1, end)
            kv_pipeline.producer_acquire(state)
            bar = kv_pipeline.producer_get_barrier(state)
            for j in cutlass.range_constexpr(boxes):
                cute.copy(tma_k, tKgK[(None, pages[j])], tKsK[(None, j, 0, state.index)], tma_bar_ptr=bar)
            for j in cutlass.range_constexpr(boxes):
                cute.copy(tma_v, tVgV[(None, pages[j])], tVsV[(None, 0, j, state.index)], tma_bar_ptr=bar)
            kv_pipeline.producer_commit(state)
            state.advance()

    @cute.jit
    def load_gather(self, row_k, mK, row_v, mV, mBlockTable, sK, sV, kv_pipeline, batch_idx, kvh, first_tile,
                    num_tiles, end):
        """Producer warp, gathered paging (any page size P, a runtime value): key ``n`` of tile
        ``t`` is slot ``(t*N + n) % P`` of page ``block_table[b, (t*N + n) // P]``; each lane
        copies its keys' K and V rows (D contiguous elements each, ``cp.async.bulk``) into the
        stage's staging slots, completing on the stage's full mbarrier (the same byte count as
        a TMA tile). Keys ``>= end`` of the last tile copy the tile's first key instead (rows the
        consumer masks and zeroes), so the table is never read past the row's pages."""
        N = self.tile_n
        page_size = mK.shape[0]
        lane = cute.arch.lane_idx()
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
        for i in cutlass.range(num_tiles, unroll=1):
            tile_start = (first_tile + i) * N
            # Every lane waits for the free stage here before it issues copies into it.
            kv_pipeline.producer_acquire(state)
            bar = kv_pipeline.producer_get_barrier(state)
            for n in cutlass.range(lane, N, 32, unroll=1):
                key = tile_start + n
                if key >= end:
                    key = tile_start
                page = mBlockTable[batch_idx, key // page_size]
                slot = key % page_size
                cute.copy(row_k, mK[slot, None, kvh, page], sK[n, None, state.index], mbar_ptr=bar)
                cute.copy(row_v, mV[None, slot, kvh, page], sV[None, n, state.index], mbar_ptr=bar)
            kv_pipeline.producer_commit(state)
            state.advance()

    @cute.jit
    def read_pages(self, mBlockTable, pages, batch_idx, tile, end):
        """Page ids of the boxes of ``tile`` (its first key is ``< end``); a box whose first key
        is ``>= end`` takes the tile's first page (never reads the entry past the row's pages)."""
        boxes = self.boxes_per_tile
        first = mBlockTable[batch_idx, tile * boxes]
        pages[0] = first
        for j in cutlass.range_constexpr(1, boxes):
            pages[j] = first
            if tile * self.tile_n + j * self.subtile_page < end:
                pages[j] = mBlockTable[batch_idx, tile * boxes + j]

    @cute.jit
    def pow2_scale(self, amax):
        """``(2^s, 2^-s)`` with ``amax * 2^s`` in [2^13, 2^14) (fp32 bit patterns:
        exact); ``(1, 1)`` for 0 (an all-zero or masked row) or a denormal, ``s`` clamped to +-100."""
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

    @cute.jit
    def load_q(self, mQ, sQ, sRowScale, tidx, batch_idx, kvh, row_block, seqlen_q, group):
        """Consumer warpgroup: gather the packed Q rows into the swizzled A-operand tile.

        fp16 operands (bf16 q): each row is multiplied by the power of two that brings its
        largest magnitude into [2^13, 2^14) (exact in fp16, whose mantissa holds bf16's) and
        ``sRowScale[row]`` gets the inverse, which the softmax applies to the row's scores. A
        row's ``D / 8`` chunks are consecutive lanes of one warp: its max is a butterfly shuffle.
        """
        D, M = self.head_dim, self.block_m
        chunks_per_row = D // 8
        num_rows = seqlen_q * group
        chunks = M * chunks_per_row  # (swapped operands, 8 rows at d = 64: 64 chunks, half the threads)
        T = self.num_consumer_threads
        for i in cutlass.range_constexpr((chunks + T - 1) // T):
            chunk = tidx + i * T
            row = chunk // chunks_per_row
            col = (chunk % chunks_per_row) * 8
            r = row_block * M + row
            frag = cute.make_rmem_tensor((8,), self.dtype)
            frag.fill(0.0)
            if cutlass.const_expr(chunks % T != 0):
                if chunk >= chunks:
                    r = num_rows  # past the tile: load nothing (and store nothing below)
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
                for o in cutlass.range_constexpr(chunks_per_row.bit_length() - 1):  # offsets 1, 2, ...
                    amax = cute.arch.fmax(amax, cute.arch.shuffle_sync_bfly(amax, offset=1 << o))
                scale, inverse = self.pow2_scale(amax)
                for j in cutlass.range_constexpr(8):
                    sQ[row, col + j, 0] = (frag[j].to(Float32) * scale).to(self.op_dtype)
                if chunk % chunks_per_row == 0:
                    sRowScale[row] = inverse
            elif cutlass.const_expr(chunks % T != 0):
                if chunk < chunks:
                    for j in cutlass.range_constexpr(8):
                        sQ[row, col + j, 0] = frag[j]
            else:
                for j in cutlass.range_constexpr(8):
                    sQ[row, col + j, 0] = frag[j]
        # Generic-proxy smem writes must be visible to wgmma (async proxy) before it reads sQ.
        cute.arch.fence_proxy("async.shared", space="cta")
        cute.arch.barrier(barrier_id=self.q_barrier_id, number_of_threads=self.num_consumer_threads)

    @cute.jit
    def zero_tail_v(self, sV, stage, valid, tidx):
        """Zero V rows ``>= valid`` of one stage: cache slots past the live length may hold NaN,
        and 0 * NaN would poison O even though P is 0 there."""
        D, N = self.head_dim, self.tile_n
        for idx in cutlass.range(tidx, (N - valid) * D, self.num_consumer_threads, unroll=1):
            sV[idx % D, valid + idx // D, stage] = self.op_dtype(0.0)
        cute.arch.fence_proxy("async.shared", space="cta")
        cute.arch.barrier(barrier_id=self.q_barrier_id, number_of_threads=self.num_consumer_threads)

    @cute.jit
    def convert_kv(self, sK8, sV8, sK, sV, stage, valid, tidx):
        """fp8 staging slot ``stage`` -> the 16-bit K and V operand buffers (swizzled wgmma
        layouts), 16 fp8 values (one 16-byte chunk along d) per thread and step. V rows
        ``>= valid`` are written as 0 (cache slots past the live length may hold NaN)."""
        D, N = self.head_dim, self.tile_n
        chunks_per_row = D // 16
        for i in cutlass.range_constexpr(N * chunks_per_row // self.num_consumer_threads):
            chunk = tidx + i * self.num_consumer_threads
            n = chunk // chunks_per_row
            c = chunk % chunks_per_row
            k8 = cute.make_rmem_tensor((16,), self.kv_dtype)
            cute.autovec_copy(cute.local_tile(sK8[n, None, stage], (16,), (c,)), k8)
            k16 = cute.make_rmem_tensor((16,), self.op_dtype)
            k16.store(k8.load().to(self.op_dtype))
            cute.autovec_copy(k16, cute.local_tile(sK[n, None, 0], (16,), (c,)))
            v16 = cute.make_rmem_tensor((16,), self.op_dtype)
            v16.fill(0.0)
            if n < valid:
                v8 = cute.make_rmem_tensor((16,), self.kv_dtype)
                cute.autovec_copy(cute.local_tile(sV8[None, n, stage], (16,), (c,)), v8)
                v16.store(v8.load().to(self.op_dtype))
            cute.autovec_copy(v16, cute.local_tile(sV[None, n, 0], (16,), (c,)))
        # Generic-proxy smem writes must be visible to wgmma (async proxy) before it reads them.
        cute.arch.fence_proxy("async.shared", space="cta")
        cute.arch.barrier(barrier_id=self.q_barrier_id, number_of_threads=self.num_consumer_threads)

    @cute.jit
    def mma_softmax_epilogue(
        self, qk_mma, pv_mma, mQ, mO, mLSE, sQ, sK, sV, kv_pipeline, tidx, split_idx, batch_idx, kvh,
        row_block, seqlen_q, group, n_keys, start, end, num_tiles, first_tile, softmax_scale_log2,
        sK8, sV8, v_scale, sRowScale,
    ):
        D, N, M = self.head_dim, self.tile_n, self.block_m
        self.load_q(mQ, sQ, sRowScale, tidx, batch_idx, kvh, row_block, seqlen_q, group)

        qk_thr = qk_mma.get_slice(tidx)
        pv_thr = pv_mma.get_slice(tidx)
        tSrQ = qk_mma.make_fragment_A(qk_thr.partition_A(sQ))
        tSrK = qk_mma.make_fragment_B(qk_thr.partition_B(sK))
        tOrV = pv_mma.make_fragment_B(pv_thr.partition_B(sV))
        acc_s_shape = qk_thr.partition_shape_C((M, N))
        acc_o = pv_thr.make_fragment_C(pv_thr.partition_shape_C((M, D)))
        acc_o.fill(0.0)

        # Accumulator element (c, r, v) of a thread sits at row warp*16 + lane/4 + 8r and
        # column (lane%4)*2 + c + 8v of the 64 x n tile (the wgmma C layout).
        lane = tidx % 32
        warp = tidx // 32
        row_max = cute.make_rmem_tensor((2,), Float32)
        row_sum = cute.make_rmem_tensor((2,), Float32)
        key_limit = cute.make_rmem_tensor((2,), Int32)  # first key a row may not see
        row_qk_scale = cute.make_rmem_tensor((2,), Float32)  # log2 score scale of the row
        for r in cutlass.range_constexpr(2):
            row_qk_scale[r] = softmax_scale_log2
            if cutlass.const_expr(self.scaled_q):  # times 1 / the q row's power of two
                row_qk_scale[r] = softmax_scale_log2 * sRowScale[warp * 16 + lane // 4 + 8 * r]
            row_max[r] = -Float32.inf
            row_sum[r] = 0.0
            key_limit[r] = end
            if cutlass.const_expr(self.causal):
                packed = row_block * M + warp * 16 + lane // 4 + 8 * r
                m = packed // group
                key_limit[r] = cutlass.min(end, n_keys - seqlen_q + m + 1)

        warp_uniform = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        rows_here = self.tile_rows(seqlen_q, group, row_block)
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
        for i in cutlass.range(num_tiles, unroll=1):
            tile_start = (first_tile + i) * N
            kv_pipeline.consumer_wait(state)
            op_stage = state.index
            if cutlass.const_expr(self.staged):
                op_stage = 0
                # Every consumer warp has waited on its wgmmas of the previous tile (they read
                # the operand buffers) before any overwrites them.
                cute.arch.barrier(barrier_id=self.q_barrier_id, number_of_threads=self.num_consumer_threads)
                self.convert_kv(sK8, sV8, sK, sV, state.index, end - tile_start, tidx)
                # The staging slot is consumed: hand it back to the producer now.
                kv_pipeline.consumer_release(state)
            else:
                if tile_start + N > end:
                    self.zero_tail_v(sV, state.index, end - tile_start, tidx)

            acc_s = cute.make_rmem_tensor(acc_s_shape, Float32)
            warpgroup.fence()
            for kb in cutlass.range_constexpr(cute.size(tSrQ, mode=[2])):
                qk_mma.set(warpgroup.Field.ACCUMULATE, kb != 0)
                cute.gemm(qk_mma, acc_s, tSrQ[None, None, kb, 0], tSrK[None, None, kb, op_stage], acc_s)
            warpgroup.commit_group()
            warpgroup.wait_group(0)

            # Mask by selection (garbage keys may be NaN: never multiply them by 0), then the
            # online-softmax update in log2 units. A warp whose 8-row half holds only padding
            # rows (past L_q x group) skips it (SplitConfig); those rows are never written.
            for r in cutlass.range_constexpr(2):
                if warp_uniform * 16 + 8 * r < rows_here:
                    self.softmax_rows(acc_s, acc_o, row_max, row_sum, row_qk_scale, key_limit, r, tile_start, lane)

            # P (fp32 C layout) -> 16-bit A-operand registers; same element order per thread.
            tOrP = cute.make_rmem_tensor(self.p_layout(acc_s.layout), self.op_dtype)
            tOrP_as_acc = cute.make_tensor(tOrP.iterator, acc_s.layout)
            # (Skipped halves convert their raw scores; only padding rows read them.)
            tOrP_as_acc.store(acc_s.load().to(self.op_dtype))

            warpgroup.fence()
            pv_mma.set(warpgroup.Field.ACCUMULATE, True)
            for kb in cutlass.range_constexpr(cute.size(tOrP, mode=[2])):
                cute.gemm(pv_mma, acc_o, tOrP[None, None, kb], tOrV[None, None, kb, op_stage], acc_o)
            warpgroup.commit_group()
            warpgroup.wait_group(0)
            if cutlass.const_expr(not self.staged):
                kv_pipeline.consumer_release(state)
            state.advance()

        if cutlass.const_expr(self.signals_combine):
            cute.arch.griddepcontrol_launch_dependents()  # every tile done: only the stores remain
        self.epilogue(acc_o, row_max, row_sum, mO, mLSE, tidx, split_idx, batch_idx, kvh, row_block,
                      seqlen_q, group, num_tiles, v_scale)

    @cute.jit
    def mma_softmax_epilogue_swap(
        self, qk_mma, pv_mma, mQ, mO, mLSE, sQ, sK, sV, sP, sRed, kv_pipeline, tidx, split_idx, batch_idx, kvh,
        row_block, seqlen_q, group, n_keys, end, num_tiles, first_tile, softmax_scale_log2,
    ):
        """Consumer warpgroup with swapped operands (``swap_rows`` = R q rows): per KV tile
        ``S^T = K Q^T`` (M = keys, N = R), the softmax down each column (q row), P^T into shared
        memory, ``O^T += V^T P^T`` (M = head dim, N = R), then the epilogue.

        Accumulator element ``i`` of a thread sits at row :meth:`acc_row` (a key of S^T, a
        head-dim index of O^T) and column ``2 (lane % 4) + i % 2`` (a q row): each thread holds two
        columns, whose softmax state (running max, its own partial sum) it keeps in
        ``row_max``/``row_sum``.
        """
        D, N, R = self.head_dim, self.tile_n, self.block_m
        self.load_q(mQ, sQ, None, tidx, batch_idx, kvh, row_block, seqlen_q, group)

        qk_thr = qk_mma.get_slice(tidx)
        pv_thr = pv_mma.get_slice(tidx)
        tSrK = qk_mma.make_fragment_A(qk_thr.partition_A(sK))
        tSrQ = qk_mma.make_fragment_B(qk_thr.partition_B(sQ))
        tOrV = pv_mma.make_fragment_A(pv_thr.partition_A(sV))
        tOrP = pv_mma.make_fragment_B(pv_thr.partition_B(sP))
        acc_s_shape = qk_thr.partition_shape_C((N, R))
        acc_o = pv_thr.make_fragment_C(pv_thr.partition_shape_C((D, R)))
        acc_o.fill(0.0)

        lane = tidx % 32
        warp = tidx // 32
        row_max = cute.make_rmem_tensor((2,), Float32)
        row_sum = cute.make_rmem_tensor((2,), Float32)
        key_limit = cute.make_rmem_tensor((2,), Int32)  # first key a column may not see
        for c in cutlass.range_constexpr(2):
            row_max[c] = -Float32.inf
            row_sum[c] = 0.0
            key_limit[c] = end
            if cutlass.const_expr(self.causal):
                m = (row_block * R + (lane % 4) * 2 + c) // group
                key_limit[c] = cutlass.min(end, n_keys - seqlen_q + m + 1)

        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
        for i in cutlass.range(num_tiles, unroll=1):
            tile_start = (first_tile + i) * N
            kv_pipeline.consumer_wait(state)
            if tile_start + N > end:
                self.zero_tail_v(sV, state.index, end - tile_start, tidx)

            acc_s = cute.make_rmem_tensor(acc_s_shape, Float32)
            warpgroup.fence()
            for kb in cutlass.range_constexpr(cute.size(tSrQ, mode=[2])):
                qk_mma.set(warpgroup.Field.ACCUMULATE, kb != 0)
                cute.gemm(qk_mma, acc_s, tSrK[None, None, kb, state.index], tSrQ[None, None, kb, 0], acc_s)
            warpgroup.commit_group()
            warpgroup.wait_group(0)

            self.softmax_columns(acc_s, acc_o, row_max, row_sum, key_limit, sRed, softmax_scale_log2, tile_start,
                                 lane, warp)
            # P^T -> the B operand in shared memory. Every warp has passed the column-max barrier
            # in softmax_columns, so all are done with the previous tile's P V wgmma (reading sP).
            for j in cutlass.range_constexpr(cute.size(acc_s)):
                sP[(lane % 4) * 2 + j % 2, self.acc_row(j, warp, lane), 0] = acc_s[j].to(self.op_dtype)
            # Generic-proxy smem writes must be visible to wgmma (async proxy) before it reads sP.
            cute.arch.fence_proxy("async.shared", space="cta")
            cute.arch.barrier(barrier_id=self.q_barrier_id, number_of_threads=self.num_consumer_threads)

            warpgroup.fence()
            pv_mma.set(warpgroup.Field.ACCUMULATE, True)
            for kb in cutlass.range_constexpr(cute.size(tOrP, mode=[2])):
                cute.gemm(pv_mma, acc_o, tOrV[None, None, kb, state.index], tOrP[None, None, kb, 0], acc_o)
            warpgroup.commit_group()
            warpgroup.wait_group(0)
            kv_pipeline.consumer_release(state)
            state.advance()

        if cutlass.const_expr(self.signals_combine):
            cute.arch.griddepcontrol_launch_dependents()  # every tile done: only the stores remain
        self.epilogue_swap(acc_o, row_max, row_sum, mO, mLSE, sRed, tidx, split_idx, batch_idx, kvh, row_block,
                           seqlen_q, group, num_tiles)

    @staticmethod
    def acc_row(i, warp, lane):
        """Row of a thread's wgmma accumulator element ``i`` = ``(c, r, t)`` = ``(i % 2, i // 2 % 2,
        i // 4)`` when N is 8 (swapped operands): ``64 t + 16 warp + lane / 4 + 8 r``, the ``t``-th
        64-row M block."""
        return (i // 4) * 64 + warp * 16 + lane // 4 + 8 * ((i // 2) % 2)

    @cute.jit
    def column_sums_across_warps(self, x, sRed, lane, warp, reduce):
        """``x`` (2 columns of this thread) reduced by ``reduce`` over every thread holding the
        same columns: the lanes ``l, l ^ 4, ...`` of a warp by shuffles, then the four warps
        through ``sRed`` (``[warp * R + column]``, fp32) and one consumer barrier."""
        R = self.block_m
        for c in cutlass.range_constexpr(2):
            for o in cutlass.range_constexpr(3):
                x[c] = reduce(x[c], cute.arch.shuffle_sync_bfly(x[c], offset=4 << o))
            if lane < 4:
                sRed[warp * R + lane * 2 + c] = x[c]
        cute.arch.barrier(barrier_id=self.q_barrier_id, number_of_threads=self.num_consumer_threads)
        for c in cutlass.range_constexpr(2):
            col = (lane % 4) * 2 + c
            x[c] = sRed[col]
            for w in cutlass.range_constexpr(1, self.num_consumer_threads // 32):
                x[c] = reduce(x[c], sRed[w * R + col])

    @cute.jit
    def softmax_columns(self, acc_s, acc_o, row_max, row_sum, key_limit, sRed, softmax_scale_log2, tile_start,
                        lane, warp):
        """One S^T tile (swapped operands): scale, mask keys at or past each column's limit (by
        selection: garbage keys may be NaN), the columns' new max over all four warps, ``acc_s``
        -> P, this thread's partial sums and ``acc_o`` rescaled."""
        tile_max = cute.make_rmem_tensor((2,), Float32)
        for c in cutlass.range_constexpr(2):
            tile_max[c] = -Float32.inf
        for j in cutlass.range_constexpr(cute.size(acc_s)):
            c = j % 2
            key = tile_start + self.acc_row(j, warp, lane)
            s = acc_s[j] * softmax_scale_log2
            if key >= key_limit[c]:
                s = -Float32.inf
            acc_s[j] = s
            tile_max[c] = cute.arch.fmax(tile_max[c], s)
        self.column_sums_across_warps(tile_max, sRed, lane, warp, cute.arch.fmax)
        safe_max = cute.make_rmem_tensor((2,), Float32)
        rescale = cute.make_rmem_tensor((2,), Float32)
        tile_sum = cute.make_rmem_tensor((2,), Float32)
        for c in cutlass.range_constexpr(2):
            safe_max[c], rescale[c] = self.raise_max(row_max, c, tile_max[c])
            tile_sum[c] = 0.0
        for j in cutlass.range_constexpr(cute.size(acc_s)):
            p = cute.math.exp2(acc_s[j] - safe_max[j % 2], fastmath=True)
            acc_s[j] = p
            tile_sum[j % 2] += p
        for c in cutlass.range_constexpr(2):
            row_sum[c] = row_sum[c] * rescale[c] + tile_sum[c]
        for j in cutlass.range_constexpr(cute.size(acc_o)):
            acc_o[j] = acc_o[j] * rescale[j % 2]

    @cute.jit
    def epilogue_swap(self, acc_o, row_max, row_sum, mO, mLSE, sRed, tidx, split_idx, batch_idx, kvh, row_block,
                      seqlen_q, group, num_tiles):
        """Swapped operands: the columns' sums over all threads, then O (= O^T's columns,
        normalized) and the natural-log LSE of each real q row, straight from registers."""
        R = self.block_m
        lane = tidx % 32
        warp = tidx // 32
        # sRed's last readers (the last tile's column max) are past the barrier before its P V.
        self.column_sums_across_warps(row_sum, sRed, lane, warp, lambda x, y: x + y)
        num_rows = seqlen_q * group
        out_split = split_idx
        if cutlass.const_expr(not self.write_partials):
            out_split = 0
        for c in cutlass.range_constexpr(2):
            total = row_sum[c]
            lse = -Float32.inf
            inv = Float32(0.0)
            if total > 0.0:
                lse = (row_max[c] + cute.math.log2(total, fastmath=False)) * LN_2
                inv = 1.0 / total
            packed = row_block * R + (lane % 4) * 2 + c
            if packed < num_rows:
                m = packed // group
                hq = kvh * group + packed % group
                if tidx < 4:
                    mLSE[out_split, batch_idx, hq, m] = lse
                # Partials of an empty split are never read: write only their LSE.
                # (acc_o element c + 2 j: this column's j-th value)
                if cutlass.const_expr(self.write_partials):
                    if num_tiles > 0:
                        for j in cutlass.range_constexpr(cute.size(acc_o) // 2):
                            d = self.acc_row(c + 2 * j, warp, lane)
                            mO[out_split, batch_idx, m, hq, d] = acc_o[c + 2 * j] * inv
                else:
                    for j in cutlass.range_constexpr(cute.size(acc_o) // 2):
                        d = self.acc_row(c + 2 * j, warp, lane)
                        mO[out_split, batch_idx, m, hq, d] = (acc_o[c + 2 * j] * inv).to(mO.element_type)

    def tile_rows(self, seqlen_q, group, row_block):
        """The real (not padding) packed rows of row tile ``row_block``: 1..64."""
        return cutlass.min(seqlen_q * group - row_block * self.block_m, self.block_m)

    @cute.jit
    def merge_if_last(self, mO, mLSE, mOut, mOutLSE, mArrivals, sTicket, tidx, batch_idx, z_idx, kvh, row_block,
                      seqlen_q, group, num_splits):
        """``merge``: count this CTA's split as done on its row tile's arrival counter; the last
        of the tile's ``num_splits`` CTAs merges the partials of the tile's real rows into
        ``mOut``/``mOutLSE`` (warp ``w`` takes rows ``w, w + 4, ...``) and zeroes the counter.

        Ordering (the pattern of a split-K semaphore): every consumer thread's partial stores
        precede the named barrier, and thread 0's gpu-scope acq_rel atomic follows it (release:
        the other CTAs see these stores once they see the count); the last CTA's atomic
        acquires every other CTA's release, and the second barrier orders its warps' loads after
        it. The next launch on the stream starts after this kernel ends, with the counter at 0.
        """
        M = self.block_m
        counter = batch_idx * cute.arch.grid_dim()[2] + z_idx
        cute.arch.barrier(barrier_id=self.q_barrier_id, number_of_threads=self.num_consumer_threads)
        if tidx == 0:
            sTicket[0] = cute.arch.atomic_add(mArrivals.iterator + counter, Int32(1), sem="acq_rel", scope="gpu")
        cute.arch.barrier(barrier_id=self.q_barrier_id, number_of_threads=self.num_consumer_threads)
        if sTicket[0] == num_splits - 1:
            if tidx == 0:
                mArrivals[counter] = Int32(0)
            C = self.row_merge.cols_per_lane
            warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
            lane = tidx % 32
            rows = self.tile_rows(seqlen_q, group, row_block)
            acc = cute.make_rmem_tensor((C,), Float32)
            out = cute.make_rmem_tensor((C,), self.dtype)
            for r in cutlass.range(warp, rows, self.num_consumer_threads // 32, unroll=1):
                packed = row_block * M + r
                m = packed // group
                hq = kvh * group + packed % group
                lse = self.row_merge.warp_sum(mO, mLSE, acc, num_splits, batch_idx, m, hq, 0, lane)
                out.store(acc.load().to(self.dtype))
                cute.autovec_copy(out, cute.local_tile(mOut[batch_idx, m, hq, None], (C,), (lane,)))
                if lane == 0:
                    mOutLSE[batch_idx, hq, m] = lse

    @cute.jit
    def softmax_rows(self, acc_s, acc_o, row_max, row_sum, row_qk_scale, key_limit, r, tile_start, lane):
        """Row ``r`` (0 or 1) of this thread's two S rows: scale, mask, online-softmax update of
        ``row_max``/``row_sum``, ``acc_s`` -> P, ``acc_o`` rescaled (the wgmma C layout)."""
        D, N = self.head_dim, self.tile_n
        limit = key_limit[r] - tile_start
        tile_max = -Float32.inf
        for v in cutlass.range_constexpr(N // 8):
            for c in cutlass.range_constexpr(2):
                idx = c + 2 * r + 4 * v
                col = (lane % 4) * 2 + c + 8 * v
                s = acc_s[idx] * row_qk_scale[r]
                if col >= limit:
                    s = -Float32.inf
                acc_s[idx] = s
                tile_max = cute.arch.fmax(tile_max, s)
        tile_max = cute.arch.fmax(tile_max, cute.arch.shuffle_sync_bfly(tile_max, offset=1))
        tile_max = cute.arch.fmax(tile_max, cute.arch.shuffle_sync_bfly(tile_max, offset=2))
        safe_max, rescale = self.raise_max(row_max, r, tile_max)
        tile_sum = Float32(0.0)
        for v in cutlass.range_constexpr(N // 8):
            for c in cutlass.range_constexpr(2):
                idx = c + 2 * r + 4 * v
                p = cute.math.exp2(acc_s[idx] - safe_max, fastmath=True)
                acc_s[idx] = p
                tile_sum += p
        row_sum[r] = row_sum[r] * rescale + tile_sum
        for v in cutlass.range_constexpr(D // 8):
            for c in cutlass.range_constexpr(2):
                acc_o[c + 2 * r + 4 * v] = acc_o[c + 2 * r + 4 * v] * rescale

    @cute.jit
    def raise_max(self, row_max, i, tile_max):
        """Online softmax: ``row_max[i] = max(row_max[i], tile_max)`` (log2 units); returns the
        max to subtract from this tile's scores and the factor that rescales the old sum and O.
        A row (or column) that has seen no key yet keeps max -inf and subtracts 0 (no -inf - -inf)."""
        new_max = cute.arch.fmax(row_max[i], tile_max)
        safe_max = new_max
        if new_max == -Float32.inf:
            safe_max = 0.0
        rescale = cute.math.exp2(row_max[i] - safe_max, fastmath=True)
        row_max[i] = new_max
        return safe_max, rescale

    @staticmethod
    def p_layout(acc_layout):
        """Register layout of P as the A operand of m64nXk16 wgmma, from the S accumulator layout.

        The accumulator of one thread is ((2 cols, 2 rows, n/8 col-groups), 1, 1); a k16 A block
        holds (2, 2, 2) of those values, so P is ((2, 2, 2), 1, n/16) with the same strides.
        """
        return cute.make_layout(
            ((2, 2, 2), 1, cute.size(acc_layout.shape[0][2]) // 2),
            stride=((1, 2, 4), 0, 8),
        )

    @cute.jit
    def epilogue(self, acc_o, row_max, row_sum, mO, mLSE, tidx, split_idx, batch_idx, kvh, row_block,
                 seqlen_q, group, num_tiles, v_scale):
        """Normalize and write O and the natural-log LSE straight from registers (an fp8 cache:
        O times ``v_scale``, the V descale)."""
        D, M = self.head_dim, self.block_m
        lane = tidx % 32
        warp = tidx // 32
        num_rows = seqlen_q * group
        for r in cutlass.range_constexpr(2):
            total = row_sum[r]
            total += cute.arch.shuffle_sync_bfly(total, offset=1)
            total += cute.arch.shuffle_sync_bfly(total, offset=2)
            lse = -Float32.inf
            inv = Float32(0.0)
            if total > 0.0:
                lse = (row_max[r] + cute.math.log2(total, fastmath=False)) * LN_2
                if cutlass.const_expr(self.fp8):
                    inv = v_scale / total
                else:
                    inv = 1.0 / total
            packed = row_block * M + warp * 16 + lane // 4 + 8 * r
            if packed < num_rows:
                m = packed // group
                hq = kvh * group + packed % group
                out_split = split_idx
                if cutlass.const_expr(not self.write_partials):
                    out_split = 0
                if lane % 4 == 0:
                    mLSE[out_split, batch_idx, hq, m] = lse
                # Partials of an empty split are never read: write only their LSE.
                if cutlass.const_expr(self.write_partials):
                    if num_tiles > 0:
                        for v in cutlass.range_constexpr(D // 8):
                            for c in cutlass.range_constexpr(2):
                                col = (lane % 4) * 2 + c + 8 * v
                                mO[out_split, batch_idx, m, hq, col] = acc_o[c + 2 * r + 4 * v] * inv
                else:
                    for v in cutlass.range_constexpr(D // 8):
                        for c in cutlass.range_constexpr(2):
                            col = (lane % 4) * 2 + c + 8 * v
                            mO[out_split, batch_idx, m, hq, col] = (acc_o[c + 2 * r + 4 * v] * inv).to(
                                mO.element_type
                            )
