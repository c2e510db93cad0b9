"""Split-KV decode forward for Hopper (sm_90a), written in CuTeDSL: host setup and role dispatch.

One CTA per (split ``s``, batch row ``b``, KV head ``kvh`` x row block). The CTA owns the keys
``[start, end)`` of its split, computed on the device from ``cache_seqlens[b]`` with the shared
rule of :mod:`flashsplit.plan` (:mod:`~flashsplit.cute.split_rule`), and one row tile of the
GQA-packed query rows of its KV head (:mod:`~flashsplit.cute.q_tile`). With a left window bound
its tiles start at the one holding the first key its first query sees (earlier tiles hold no
key any of its rows sees); a configuration's attention variants (window, softcap, sinks,
batch-invariant splits, :class:`~flashsplit.cute.configs.SplitConfig`) take runtime values that
only their kernels receive.

This module builds, on the host, the tensors, wgmma atoms, shared-memory layouts, copy atoms and
grid of one :class:`~flashsplit.cute.configs.SplitConfig`, and hands the warp roles out on the
device (:mod:`~flashsplit.cute.warp_roles`):

- warp 4, the producer: :class:`~flashsplit.cute.kv_producer.KVProducer` (TMA tiles, sub-tile
  boxes or gathered rows into the pipeline's stages);
- warps 0-3, the consumer warpgroup: :class:`~flashsplit.cute.row_consumer.RowConsumer` (64 q
  rows, wgmma M = 64) or :class:`~flashsplit.cute.swap_consumer.SwapConsumer` (1-8 rows as
  wgmma's N), both on :mod:`~flashsplit.cute.softmax`, :mod:`~flashsplit.cute.mask` and
  :mod:`~flashsplit.cute.kv_operands`; then, for a merging configuration,
  :class:`~flashsplit.cute.merge_tail.MergeTail`.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import Float32, Int32, Int64
from cutlass.cute.nvgpu import warpgroup
from cutlass.memory import SmemAllocator
from cutlass.tensor_utils import LayoutEnum

from ..plan import SPLIT_GRANULE
from . import split_rule, timeline
from .configs import HEAD_DIMS, SplitConfig
from .cluster_merge import ClusterMerge
from .cta_work import CtaWork, grid_coords, launch_grid
from .kv_producer import KVProducer, make_kv_pipeline
from .merge_tail import MergeTail
from .shared_storage import shared_storage
from .row_consumer import RowConsumer
from .swap_consumer import SwapConsumer
from .warp_roles import NUM_CONSUMER_WARPS, NUM_THREADS, PRODUCER_WARP, ElementTypes


class SplitKVDecodeKernel:
    """One compiled split kernel (see :class:`SplitConfig`): static configuration and roles."""

    def __init__(self, config: SplitConfig):
        self.config = config
        types = ElementTypes(config)
        self.kv_dtype, self.op_dtype = types.kv, types.op
        self.head_dim = config.head_dim
        self.tile_n = config.tile_n
        self.stages = config.stages
        self.units_per_sm = config.units_per_sm
        self.fp8 = config.fp8
        self.staged = config.staged
        # 16-bit operand stages: the TMA stages, or one buffer the consumer converts (fp8) or
        # copies (gathered 16-bit rows) each staged tile into.
        self.operand_stages = 1 if config.staged else config.stages
        self.scaled_q = config.fp16_operands  # per-row q scale in shared memory
        self.merge = config.merge
        self.swap_rows = config.swap_rows
        self.block_m = config.rows  # packed q rows per CTA
        self.producer = KVProducer(config)
        self.consumer = SwapConsumer(config) if config.swap_rows else RowConsumer(config)
        self.merge_tail = MergeTail(config) if config.merge else None
        self.cluster_merge = ClusterMerge(config) if config.cluster else None

    @staticmethod
    def can_implement(head_dim: int, tile_n: int) -> str | None:
        if head_dim not in HEAD_DIMS:
            return f"head_dim {head_dim} is not one of {HEAD_DIMS}"
        if SPLIT_GRANULE % tile_n != 0 or tile_n % 64 != 0:
            return f"tile_n {tile_n} must be a multiple of 64 dividing the {SPLIT_GRANULE}-key split granule"
        return None

    # ------------------------------------------------------------------------------------------
    # Host side: tensors, wgmma atoms, shared-memory layouts, copy atoms, grid.
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
        split_ctas: Int32,
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
        window_left: Int32,
        window_right: Int32,
        softcap_log2: Float32,
        sinks_ptr: cute.Pointer,
        leftpad_ptr: cute.Pointer,
        stream,
    ):
        """Launch on raw pointers; sizes and strides are runtime values.

        ``seqlen_k`` is the capacity of a row in keys (lengths are clamped to it). The grid has
        ``split_ctas`` CTAs per row tile: ``num_splits``, or for a batch-invariant config fewer,
        each then running a run of consecutive splits (the results are the same for any count).
        The caches are ``[cache_rows, cache_len, num_heads_kv, D]``: dense ``cache_rows = batch`` and
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
        The variants' runtime values (read only where the config turns the variant on):
        ``window_left`` / ``window_right`` (keys before / after a query's position it sees),
        ``softcap_log2`` (softcap * log2(e)), ``sinks`` ``[num_heads]`` (the config's dtype) and
        the int32 ``leftpad`` ``[batch]`` (row b's first key).
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
        if cutlass.const_expr(self.merge and not self.merge_tail.row_merge.strided):
            # The workspace's partials: every stride a multiple of D, so the merge's loads of a
            # lane's D / 32 columns are vectors (d = 96: a lane's 3 columns are 32 apart, scalars).
            o_strides = tuple(cute.assume(x, divby=self.merge_tail.row_merge.cols_per_lane) for x in o_strides)
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


        qk_mma, pv_mma, q_layout, k_layout, v_layout, p_layout = self._operands()
        k_load_layout, v_load_layout = self._load_layouts(k_layout, v_layout)
        tma_k, mK_tma, tma_v, mV_tma = self.producer.copy_atoms(mK, mV, k_load_layout, v_load_layout)
        self.k_tx_bytes = cute.size_in_bytes(self.kv_dtype, cute.slice_(k_load_layout, (None, None, 0)))
        self.v_tx_bytes = cute.size_in_bytes(self.kv_dtype, cute.slice_(v_load_layout, (None, None, 0)))
        self.shared_storage = shared_storage(self.config, q_layout, k_layout, v_layout, p_layout, k_load_layout,
                                             v_load_layout)

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

        # The variants' values: None where a variant is off, so its kernel takes no argument for it.
        left, right, cap, mSinks, mLeftpad = None, None, None, None, None
        if cutlass.const_expr(self.config.left_bound):
            left = window_left
        if cutlass.const_expr(self.config.right_bound):
            right = window_right
        if cutlass.const_expr(self.config.softcap):
            cap = softcap_log2
        if cutlass.const_expr(bool(self.config.sinks)):
            mSinks = cute.make_tensor(sinks_ptr, cute.make_layout((num_heads,)))
        if cutlass.const_expr(self.config.leftpad):
            mLeftpad = cute.make_tensor(leftpad_ptr, cute.make_layout((batch,)))

        self.kernel(
            qk_mma, pv_mma, tma_k, mK_tma, tma_v, mV_tma, mQ, mO, mLSE, mSeqlens, mBlockTable,
            q_layout, k_layout, v_layout, p_layout, seqlen_q, seqlen_k, group, row_blocks, num_splits, tiles_per_page,
            softmax_scale_log2, mKDescale, mVDescale, k_load_layout, v_load_layout, mOut, mOutLSE, mArrivals,
            left, right, cap, mSinks, mLeftpad,
        ).launch(
            grid=launch_grid(split_ctas, batch, num_heads_kv * row_blocks, self.config.heads_first),
            block=[NUM_THREADS, 1, 1],
            stream=stream,
            min_blocks_per_mp=self.units_per_sm,
            # The whole unified L1/smem as shared memory (percent); given explicitly, it also
            # spares the compiler a device query, so the kernel compiles on a machine without a GPU.
            preferred_smem_carveout=100,
            # A cluster merge: the row tile's splits (the launch's, config.cluster of them) are one cluster.
            **({"cluster": [self.config.cluster, 1, 1]} if self.config.cluster else {}),
        )

    def _operands(self):
        """``(qk_mma, pv_mma, q_layout, k_layout, v_layout, p_layout)``: the two wgmma atoms and
        the swizzled shared-memory layouts of their operands (``p_layout``: swapped operands
        only, where P^T goes through shared memory)."""
        D, N, M = self.head_dim, self.tile_n, self.block_m
        k_major = LayoutEnum.ROW_MAJOR
        v_major = LayoutEnum.COL_MAJOR
        op = self.op_dtype
        if self.swap_rows > 0:
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
        return qk_mma, pv_mma, q_layout, k_layout, v_layout, p_layout

    def _load_layouts(self, k_layout, v_layout):
        """What the loads land: the operand stages themselves (16-bit TMA), or plain (unswizzled,
        d contiguous: one key row = D contiguous elements) staging slots that the consumer
        converts (fp8) or copies (gathered rows) into the operand buffers."""
        D, N = self.head_dim, self.tile_n
        if not self.staged:
            return k_layout, v_layout
        return (cute.make_layout((N, D, self.stages), stride=(D, 1, N * D)),
                cute.make_layout((D, N, self.stages), stride=(1, D, N * D)))

    # ------------------------------------------------------------------------------------------
    # Device side: the CTA's keys and smem, then the warp roles.
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
        window_left: Int32 | None,
        window_right: Int32 | None,
        softcap_log2: Float32 | None,
        mSinks: cute.Tensor | None,
        mLeftpad: cute.Tensor | None,
    ):
        tidx, _, _ = cute.arch.thread_idx()
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        split_idx, batch_idx, z_idx, split_ctas, _ = grid_coords(self.config.heads_first)
        # Sinks join a final result: the one-split epilogue's (the consumers), or the merge tail's.
        final_sinks = mSinks
        if cutlass.const_expr(self.config.write_partials):
            final_sinks = None
        kvh = z_idx // row_blocks
        row_block = z_idx % row_blocks

        if tidx == 0:
            timeline.stamp("entry")
        # The TMA descriptors are fetched while the row's length is loaded: the first tile's
        # load waits on that length, not on a descriptor fetch after it.
        if warp_idx == PRODUCER_WARP:
            self.producer.prefetch_descriptors(tma_k, tma_v)
        smem = SmemAllocator()
        storage = smem.allocate(self.shared_storage)
        kv_pipeline = make_kv_pipeline(storage.kv_mbar.data_ptr(), self.stages, self.k_tx_bytes + self.v_tx_bytes)
        # The barriers are initialized before anything waits on memory, so each role goes on
        # alone after its own loads (no CTA barrier behind the length load).
        cute.arch.mbarrier_init_fence()
        cute.arch.sync_threads()
        if cutlass.const_expr(self.cluster_merge is not None):
            ClusterMerge.started()

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
        if warp_idx < PRODUCER_WARP:
            # q does not depend on the length: its loads overlap the length's.
            self.consumer.q_tile.load(mQ, sQ, sRowScale, tidx, batch_idx, kvh, row_block, seqlen_q, group)
        pad = None  # the row's first key (left padding)
        if cutlass.const_expr(self.config.leftpad):
            pad = split_rule.load_leftpad(mLeftpad, batch_idx, n_keys)
        first = None  # the row's first key, where it is not 0 or batch-invariant splits count from it
        if cutlass.const_expr(self.config.first_bound or self.config.invariant):
            first = Int32(0)
            if cutlass.const_expr(self.config.first_bound):
                first = split_rule.row_first_key(n_keys, seqlen_q, window_left, pad)
        cta_first = None
        if cutlass.const_expr(self.config.first_bound):
            # The tiles before the one holding the first key this CTA's first query sees (its
            # row block's first packed row; at the row's padding at the earliest) hold no key any
            # of its rows sees: skipped.
            if cutlass.const_expr(self.config.left_bound):
                cta_first = n_keys - seqlen_q + row_block * self.block_m // group - window_left
                if cutlass.const_expr(self.config.leftpad):
                    cta_first = cutlass.max(cta_first, pad)
            else:
                cta_first = pad
        first_split, split_count = split_idx, None
        if cutlass.const_expr(self.config.invariant):
            # A run of consecutive splits per CTA, as many as the grid leaves each: their tiles
            # are contiguous, so the producer streams them as one range.
            per_cta = (num_splits + split_ctas - 1) // split_ctas
            first_split = split_idx * per_cta
            split_count = cutlass.min(per_cta, num_splits - first_split)
            start, _, first_tile, _ = split_rule.split_tiles(n_keys, first, first_split, num_splits, cta_first,
                                                             self.tile_n, True)
            _, end, _, _ = split_rule.split_tiles(n_keys, first, first_split + split_count - 1, num_splits, None,
                                                  self.tile_n, True)
            num_tiles = Int32(0)
            if first_tile * self.tile_n < end:
                num_tiles = (end - first_tile * self.tile_n + self.tile_n - 1) // self.tile_n
        else:
            start, end, first_tile, num_tiles = split_rule.split_tiles(n_keys, first, split_idx, num_splits, cta_first,
                                                                       self.tile_n)
        work = CtaWork(tidx, first_split, batch_idx, z_idx, kvh, row_block, seqlen_q, group, num_splits, n_keys, start,
                       end, first_tile, num_tiles, window_left, window_right, cta_first, pad, first, split_count)

        merge_sink = None  # the merge tail's first sink, loaded ahead of the keys
        if cutlass.const_expr(self.merge and bool(self.config.sinks)):
            merge_sink = self.merge_tail.first_sink(mSinks, work)

        if warp_idx == PRODUCER_WARP:
            self.producer.run(tma_k, mK_tma, tma_v, mV_tma, mBlockTable, sK_load, sV_load, kv_pipeline, batch_idx, kvh,
                              first_tile, num_tiles, end, tiles_per_page)
            if cutlass.const_expr(self.cluster_merge is not None):
                ClusterMerge.before_stores()  # (its phase: the consumers wait before their stores)
        if warp_idx < PRODUCER_WARP:
            # fp8: k_descale folds into the (log2) softmax scale, v_descale into the output.
            qk_scale = softmax_scale_log2
            v_scale = None
            if cutlass.const_expr(self.fp8):
                qk_scale = softmax_scale_log2 * mKDescale[batch_idx, kvh]
                v_scale = mVDescale[batch_idx, kvh]
            if cutlass.const_expr(self.swap_rows > 0):
                sP = storage.sP.get_tensor(p_layout.outer, swizzle=p_layout.inner)
                sRed = storage.red.get_tensor(cute.make_layout((NUM_CONSUMER_WARPS * self.block_m,)))
                partials_o, partials_lse = mO, mLSE
                if cutlass.const_expr(self.cluster_merge is not None):
                    partials_o, partials_lse = self.cluster_merge.partials(storage, work)  # this CTA's slots
                self.consumer.run(qk_mma, pv_mma, partials_o, partials_lse, sQ, sK, sV, sP, sRed, kv_pipeline, work,
                                  qk_scale, softcap_log2, final_sinks, sK_load, sV_load, v_scale, sRowScale)
                if cutlass.const_expr(self.cluster_merge is not None):
                    self.cluster_merge.send(storage, work)  # the slot to the leader's
            else:
                self.consumer.run(qk_mma, pv_mma, mO, mLSE, sQ, sK, sV, kv_pipeline, work, qk_scale, sK_load,
                                  sV_load, v_scale, sRowScale, softcap_log2, final_sinks)
            if cutlass.const_expr(self.merge and self.cluster_merge is None):
                self.merge_tail.run(mO, mLSE, mOut, mOutLSE, mArrivals, storage.ticket.get_tensor(cute.make_layout((4,))),
                                    work, mSinks, merge_sink)
        if cutlass.const_expr(self.cluster_merge is not None):
            ClusterMerge.after_stores()  # every thread: the leader's slots are full past this
            if warp_idx < PRODUCER_WARP:
                if split_idx == 0:  # the cluster's rank 0 (the cluster spans the row tile's splits)
                    if tidx == 0:
                        timeline.stamp("ticket")
                    slots_o, slots_lse = self.cluster_merge.partials(storage, work)
                    self.merge_tail.merge_rows(slots_o, slots_lse, mOut, mOutLSE, work, mSinks, merge_sink)
