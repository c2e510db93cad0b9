"""The MLA split kernel for Hopper (sm_90a), in CuTeDSL: host setup, the producer warp, roles.

One CTA per (split ``s``, batch row ``b``, row block): the keys ``[start, end)`` of its split,
computed on the device from ``cache_seqlens[b]`` with the shared rule of :mod:`flashsplit.plan`
(:mod:`~flashsplit.cute.split_rule`), and 64 packed q rows ``r = m * H_q + h`` of the
``seqlen_q x H_q`` rows that all share the one latent KV head. 384 threads:

- warpgroup 2, the producer (its first warp; the warpgroup gives its registers up): one TMA
  load per 64-key tile of all 576 features (nine 64-column boxes) into a ring of two
  shared-memory stages (full/empty mbarrier pairs, ``PipelineTmaAsync``); a paged cache's page id
  comes from the block table, read one tile ahead;
- warps 0-7, two consumer warpgroups (:class:`~flashsplit.cute.mla_consumer.MLAConsumer`): K is
  the stage read K-major (the B operand of ``S = Q K^T``), V the same stage's first 512 features
  read MN-major (the B operand of ``O += P V``): each key tile is loaded once.

An e4m3 cache (``MLAConfig.kv_dtype``) lands in two fp8 staging slots; per tile the consumers
convert it into one 16-bit operand buffer (exact: e4m3 values are bf16 and fp16 values) and hand
the slot back at once, and the descale (per tensor or per batch row) multiplies the scores and
the output.

The caches are viewed as ``(slot, 576, cache row)``: a dense ``[B, L, 1, 576]`` cache has cache
row = batch row, a paged ``[num_pages, page, 1, 576]`` one cache row = page (its page size a
multiple of 64: a tile never straddles a page).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import Float32, Int32, Int64
from cutlass.cute.nvgpu import cpasync, warpgroup
from cutlass.memory import SmemAllocator
from cutlass.tensor_utils import LayoutEnum

from . import split_rule
from .mla_configs import (CONSUMER_REGISTERS, CONSUMER_WARPGROUPS, HEAD_DIM, HEAD_DIM_V, PRODUCER_REGISTERS,
                          PRODUCER_WARP, ROWS, STAGES, THREADS, TILE_N, MLAConfig)
from .mla_consumer import COLS, KEYS, MLAConsumer
from .mla_storage import mla_shared_storage


class MLASplitKernel:
    """One compiled MLA split kernel (see :class:`~flashsplit.cute.mla_configs.MLAConfig`)."""

    def __init__(self, config: MLAConfig):
        self.config = config
        self.dtype = cutlass.Float16 if config.dtype == "float16" else cutlass.BFloat16
        self.paged = config.paged
        self.fp8 = config.fp8
        self.kv_dtype = cutlass.Float8E4M3FN if config.fp8 else self.dtype
        # 16-bit operand stages: the TMA stages, or one buffer the consumers convert fp8 tiles into.
        self.operand_stages = 1 if config.fp8 else STAGES
        self.consumer = MLAConsumer(config.causal, self.dtype, self.kv_dtype)

    # ------------------------------------------------------------------ host side
    @cute.jit
    def __call__(
        self,
        q_ptr: cute.Pointer,
        kv_ptr: cute.Pointer,
        o_ptr: cute.Pointer,
        lse_ptr: cute.Pointer,
        seqlens_ptr: cute.Pointer,
        block_table_ptr: cute.Pointer,
        batch: Int32,
        seqlen_q: Int32,
        num_heads: Int32,
        num_splits: Int32,
        cache_rows: Int32,
        cache_len: Int32,
        capacity: Int32,
        max_pages: Int32,
        block_table_stride_b: Int64,
        q_stride_b: Int64,
        q_stride_l: Int64,
        q_stride_h: Int64,
        kv_stride_b: Int64,
        kv_stride_l: Int64,
        o_stride_s: Int64,
        o_stride_b: Int64,
        o_stride_l: Int64,
        o_stride_h: Int64,
        lse_stride_s: Int64,
        lse_stride_b: Int64,
        lse_stride_h: Int64,
        lse_stride_l: Int64,
        softmax_scale_log2: Float32,
        descale_ptr: cute.Pointer,
        descale_stride_b: Int64,
        stream,
    ):
        """Launch on raw pointers; sizes and strides are runtime values.

        q ``[batch, seqlen_q, num_heads, 576]`` (strides multiples of 8 elements); the cache
        ``[cache_rows, cache_len, 1, 576]`` (dense: ``cache_rows = batch``, ``cache_len = L``;
        paged: ``cache_rows = num_pages``, ``cache_len`` = the page size, and the int32
        ``block_table`` is ``[batch, max_pages]``, never read when dense); ``capacity``: a row's
        keys at most (lengths are clamped to it). Writes the fp32 partials ``o`` ``[num_splits,
        batch, seqlen_q, num_heads, 512]`` (16-byte aligned, strides multiples of 4) and ``lse``
        ``[num_splits, batch, num_heads, seqlen_q]``. ``softmax_scale_log2``: the softmax scale times log2(e). An fp8 cache's
        fp32 ``descale`` (row ``b``'s at ``b * descale_stride_b``: stride 0 for one element)
        scales the scores and the output (16-bit: never read).
        """
        row_blocks = (seqlen_q * num_heads + ROWS - 1) // ROWS
        mQ = cute.make_tensor(
            q_ptr,
            cute.make_layout((seqlen_q, num_heads, HEAD_DIM, batch),
                             stride=(cute.assume(q_stride_l, divby=8), cute.assume(q_stride_h, divby=8), 1,
                                     cute.assume(q_stride_b, divby=8))),
        )
        mK = cute.make_tensor(
            kv_ptr, cute.make_layout((cache_len, HEAD_DIM, cache_rows), stride=(kv_stride_l, 1, kv_stride_b))
        )
        mO = cute.make_tensor(
            o_ptr,
            cute.make_layout((num_splits, batch, seqlen_q, num_heads, HEAD_DIM_V),
                             stride=(*(cute.assume(x, divby=4) for x in (o_stride_s, o_stride_b, o_stride_l,
                                                                          o_stride_h)), 1)),
        )
        mLSE = cute.make_tensor(
            lse_ptr,
            cute.make_layout((num_splits, batch, num_heads, seqlen_q),
                             stride=(lse_stride_s, lse_stride_b, lse_stride_h, lse_stride_l)),
        )
        mSeqlens = cute.make_tensor(seqlens_ptr, cute.make_layout((batch,)))
        mBlockTable = cute.make_tensor(
            block_table_ptr, cute.make_layout((batch, max_pages), stride=(block_table_stride_b, 1))
        )
        tiles_per_page = cache_len // TILE_N

        op = self.dtype
        k_major = LayoutEnum.ROW_MAJOR
        # S per warpgroup: its half of the keys. P: the shared P tile, K-major like Q.
        qk_mma = sm90_utils.make_trivial_tiled_mma(
            op, op, k_major.sm90_mma_major_mode(), k_major.sm90_mma_major_mode(), Float32, (1, 1, 1), (ROWS, KEYS),
        )
        pv_mma = sm90_utils.make_trivial_tiled_mma(
            op, op, cute.nvgpu.OperandMajorMode.K, LayoutEnum.COL_MAJOR.sm90_mma_major_mode(), Float32, (1, 1, 1),
            (ROWS, COLS), warpgroup.OperandSource.SMEM,
        )
        q_layout = sm90_utils.make_smem_layout_a(k_major, (ROWS, TILE_N, HEAD_DIM), op, 1)
        p_layout = sm90_utils.make_smem_layout_a(k_major, (ROWS, COLS, TILE_N), op, 1)
        k_layout = sm90_utils.make_smem_layout_b(k_major, (ROWS, TILE_N, HEAD_DIM), op, self.operand_stages)
        load_layout = k_layout
        if cutlass.const_expr(self.fp8):
            # fp8 staging slots: plain 64-byte rows of 64-feature blocks (nine TMA boxes a tile).
            load_layout = cute.make_layout((TILE_N, (64, HEAD_DIM // 64), STAGES),
                                           stride=(64, (1, 64 * TILE_N), TILE_N * HEAD_DIM))
        tma_k, mK_tma = cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileG2SOp(), mK, cute.slice_(load_layout, (None, None, 0)), (TILE_N, HEAD_DIM)
        )
        tx_bytes = cute.size_in_bytes(self.kv_dtype, cute.slice_(load_layout, (None, None, 0)))
        mDescale = None
        if cutlass.const_expr(self.fp8):
            mDescale = cute.make_tensor(descale_ptr, cute.make_layout((batch,), stride=(descale_stride_b,)))
        self.shared_storage = mla_shared_storage(self.config, op, self.kv_dtype, q_layout, k_layout, p_layout,
                                                 load_layout)
        self.tx_bytes = tx_bytes

        self.kernel(qk_mma, pv_mma, tma_k, mK_tma, mQ, mO, mLSE, mSeqlens, mBlockTable, q_layout, k_layout, p_layout,
                    load_layout, seqlen_q, num_heads, num_splits, capacity, tiles_per_page, softmax_scale_log2,
                    mDescale).launch(
            grid=[num_splits, batch, row_blocks],
            block=[THREADS, 1, 1],
            stream=stream,
            min_blocks_per_mp=1,
            # Given explicitly, the carveout also spares the compiler a device query (CPU compiles).
            preferred_smem_carveout=100,
        )

    def v_view(self, storage, k_layout):
        """The K stages' first 512 features as V: ``(512, keys, stages)``, d contiguous (MN-major
        for the PV wgmma's B operand). The K stage's swizzled (keys, 576) layout puts feature
        ``d`` of key ``n`` at the same place as this view's ``(d, n)``: 64-feature blocks of
        8-key atoms, the 64 x 64 blocks ``64 * 64`` elements apart."""
        stage_stride = TILE_N * HEAD_DIM
        outer = cute.make_layout(
            ((64, HEAD_DIM_V // 64), (8, TILE_N // 8), (1, self.operand_stages)),
            stride=((1, 64 * TILE_N), (64, 512), (0, stage_stride)),
        )
        return storage.sK.get_tensor(outer, swizzle=k_layout.inner)

    # ------------------------------------------------------------------ device side
    @cute.kernel
    def kernel(self, qk_mma: cute.TiledMma, pv_mma: cute.TiledMma, tma_k: cute.CopyAtom, mK_tma: cute.Tensor,
               mQ: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor, mSeqlens: cute.Tensor, mBlockTable: cute.Tensor,
               q_layout: cute.ComposedLayout, k_layout: cute.ComposedLayout, p_layout: cute.ComposedLayout,
               load_layout, seqlen_q: Int32, num_heads: Int32, num_splits: Int32, capacity: Int32,
               tiles_per_page: Int32, softmax_scale_log2: Float32, mDescale: cute.Tensor | None):
        tidx, _, _ = cute.arch.thread_idx()
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        split_idx, batch_idx, row_block = cute.arch.block_idx()
        if warp_idx == PRODUCER_WARP:
            cpasync.prefetch_descriptor(tma_k)
        smem = SmemAllocator()
        storage = smem.allocate(self.shared_storage)
        kv_pipeline = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.kv_mbar.data_ptr(),
            num_stages=STAGES,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            # Lane 0 of each consumer warp releases a stage.
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 4 * CONSUMER_WARPGROUPS),
            tx_count=self.tx_bytes,
            defer_sync=True,
        )
        cute.arch.mbarrier_init_fence()
        cute.arch.sync_threads()

        sQ = storage.sQ.get_tensor(q_layout.outer, swizzle=q_layout.inner)
        sK = storage.sK.get_tensor(k_layout.outer, swizzle=k_layout.inner)
        sK8 = None  # the loads' destination: the operand stages, or the fp8 staging slots
        if cutlass.const_expr(self.fp8):
            sK8 = storage.sK8.get_tensor(load_layout)

        n_keys = split_rule.load_seqlen(mSeqlens, batch_idx, capacity)
        start, end, first_tile, num_tiles = split_rule.split_tiles(n_keys, None, split_idx, num_splits, None, TILE_N)

        if warp_idx >= PRODUCER_WARP:
            cute.arch.setmaxregister_decrease(PRODUCER_REGISTERS)
        if warp_idx == PRODUCER_WARP:
            self.produce(tma_k, mK_tma, mBlockTable, sK8 if cutlass.const_expr(self.fp8) else sK, kv_pipeline,
                         batch_idx, first_tile, num_tiles, tiles_per_page)
        if warp_idx < PRODUCER_WARP:
            cute.arch.setmaxregister_increase(CONSUMER_REGISTERS)
            self.consumer.load_q(mQ, sQ, tidx, batch_idx, row_block, seqlen_q, num_heads)
            wg = warp_idx // 4
            # This warpgroup's 256 V columns: the second's start 4 feature blocks further on.
            sV = cute.flat_divide(self.v_view(storage, k_layout), (COLS,))[None, wg, None, None]
            # This warpgroup's 32 keys of each K stage: S's B operand.
            sS_K = cute.flat_divide(sK, (KEYS,))[None, wg, None, None]
            sP = storage.sP.get_tensor(p_layout.outer, swizzle=p_layout.inner)
            sRed = storage.red.get_tensor(cute.make_layout((CONSUMER_WARPGROUPS, ROWS), stride=(ROWS, 1)))
            qk_scale = softmax_scale_log2
            v_scale = None
            if cutlass.const_expr(self.fp8):  # the descale multiplies every score and the output
                qk_scale = softmax_scale_log2 * mDescale[batch_idx]
                v_scale = mDescale[batch_idx]
            self.consumer.run(qk_mma, pv_mma, mO, mLSE, sQ, sS_K, sV, sP, sRed, kv_pipeline, wg, tidx % 128,
                              batch_idx, split_idx, row_block, seqlen_q, num_heads, n_keys, end, first_tile, num_tiles,
                              qk_scale, sK, sK8, v_scale)

    @cute.jit
    def produce(self, tma_k, mK_tma, mBlockTable, sK, kv_pipeline, batch_idx, first_tile, num_tiles, tiles_per_page):
        """One TMA tile of 64 keys x 576 features per stage, tiles ``first_tile ..`` of the row.
        Paged: tile ``t`` is tile ``t % tiles_per_page`` of page ``block_table[b, t //
        tiles_per_page]``, the id loaded before waiting for a free stage (its latency hides behind
        that wait); only entries of tiles this split loads are read."""
        gK = cute.local_tile(mK_tma, (TILE_N, HEAD_DIM), (None, 0, None))  # (N, D, tiles, cache rows)
        tKsK, tKgK = cpasync.tma_partition(
            tma_k, 0, cute.make_layout(1), cute.group_modes(sK, 0, 2), cute.group_modes(gK, 0, 2)
        )
        next_row = batch_idx
        if cutlass.const_expr(self.paged):
            if num_tiles > 0:
                next_row = mBlockTable[batch_idx, first_tile // tiles_per_page]
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, STAGES)
        for i in cutlass.range(num_tiles, unroll=1):
            tile = first_tile + i
            row = next_row
            if cutlass.const_expr(self.paged):
                tile = tile % tiles_per_page
                if i + 1 < num_tiles:
                    next_row = mBlockTable[batch_idx, (first_tile + i + 1) // tiles_per_page]
            kv_pipeline.producer_acquire(state)
            cute.copy(tma_k, tKgK[(None, tile, row)], tKsK[(None, state.index)],
                      tma_bar_ptr=kv_pipeline.producer_get_barrier(state))
            kv_pipeline.producer_commit(state)
            state.advance()
