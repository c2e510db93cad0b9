"""The split kernel's producer warp: K and V tiles into the pipeline's stages.

Three load modes, one per compile key (:class:`~flashsplit.cute.configs.SplitConfig`):

- TMA tiles (dense, or pages that are multiples of the tile): the cache is viewed as ``(slot,
  d, kv_head, cache row)`` and tile ``t`` of batch row ``b`` is TMA tile ``(tile in row, cache
  row)``: dense ``(t, b)``; paged ``(t % tiles_per_page, block_table[b, t // tiles_per_page])``,
  the page id read one tile ahead; a tile never straddles a page.
- Sub-tile boxes (``subtile_page = P``, pages of P < tile_n keys, P a multiple of 8): each tile
  is ``tile_n / P`` TMA boxes of P keys, box ``j`` from page ``block_table[b, t * tile_n / P + j]``
  into rows ``[j*P, (j+1)*P)`` of the stage, all on the stage's mbarrier.
- Gathered rows (``gather_pages``, any other page size): one bulk copy per key row of K and of
  V into plain staging slots, from page ``block_table[b, key // P]``, slot ``key % P``.

Every mode completes a stage on its full mbarrier with the bytes of one K and one V tile
(``PipelineTmaAsync``); the consumer warpgroup releases it.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass import Int32
from cutlass.cute.nvgpu import cpasync

from . import timeline
from .configs import SplitConfig
from .warp_roles import NUM_CONSUMER_WARPS, ElementTypes


def make_kv_pipeline(mbar_ptr, stages: int, tx_bytes):
    """Full/empty mbarriers of ``stages`` K+V stages that each receive ``tx_bytes``: one thread
    of the producer warp produces, the consumer warps release."""
    return pipeline.PipelineTmaAsync.create(
        barrier_storage=mbar_ptr,
        num_stages=stages,
        producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
        consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, NUM_CONSUMER_WARPS),
        tx_count=tx_bytes,
        defer_sync=True,
    )


class KVProducer:
    """The producer warp of one split-kernel configuration (see the module docstring)."""

    def __init__(self, config: SplitConfig):
        self.head_dim = config.head_dim
        self.tile_n = config.tile_n
        self.stages = config.stages
        self.paged = config.paged
        self.subtile_page = config.subtile_page
        self.boxes_per_tile = config.tile_n // config.subtile_page if config.subtile_page else 1
        self.gather_pages = config.gather_pages
        self.kv_dtype = ElementTypes(config).kv

    # ------------------------------------------------------------------ host side
    @cute.jit
    def copy_atoms(self, mK: cute.Tensor, mV: cute.Tensor, k_load_layout, v_load_layout):
        """``(copy_k, mK_src, copy_v, mV_src)``: the TMA atoms of the mode and the tensors they
        read (the caches themselves for gathered rows, whose bulk copy moves one key row)."""
        D, N = self.head_dim, self.tile_n
        if cutlass.const_expr(self.gather_pages):
            row_bits = D * self.kv_dtype.width
            copy_k = cute.make_copy_atom(cpasync.CopyBulkG2SOp(), self.kv_dtype, num_bits_per_copy=row_bits)
            copy_v = cute.make_copy_atom(cpasync.CopyBulkG2SOp(), self.kv_dtype, num_bits_per_copy=row_bits)
            mK_src, mV_src = mK, mV
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
            copy_k, mK_src = cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileG2SOp(), mK, k_box_layout, (P, D))
            copy_v, mV_src = cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileG2SOp(), mV, v_box_layout, (D, P))
        else:
            copy_k, mK_src = cpasync.make_tiled_tma_atom(
                cpasync.CopyBulkTensorTileG2SOp(), mK, cute.slice_(k_load_layout, (None, None, 0)), (N, D)
            )
            copy_v, mV_src = cpasync.make_tiled_tma_atom(
                cpasync.CopyBulkTensorTileG2SOp(), mV, cute.slice_(v_load_layout, (None, None, 0)), (D, N)
            )
        return copy_k, mK_src, copy_v, mV_src

    # ------------------------------------------------------------------ device side
    @cute.jit
    def prefetch_descriptors(self, copy_k, copy_v):
        """Start fetching the TMA descriptors (called on entry: the first load finds them
        cached); gathered rows use bulk copies, which have none."""
        if cutlass.const_expr(not self.gather_pages):
            cpasync.prefetch_descriptor(copy_k)
            cpasync.prefetch_descriptor(copy_v)

    @cute.jit
    def run(self, copy_k, mK, copy_v, mV, mBlockTable, sK, sV, kv_pipeline, batch_idx, kvh, first_tile, num_tiles,
            end, tiles_per_page):
        """Load this split's ``num_tiles`` tiles from ``first_tile`` on (keys below ``end``) into
        ``sK``/``sV`` (the operand stages, or the staging slots), in the configuration's mode."""
        if cutlass.const_expr(self.gather_pages):
            self.load_gather(copy_k, mK, copy_v, mV, mBlockTable, sK, sV, kv_pipeline, batch_idx, kvh, first_tile,
                             num_tiles, end)
        elif cutlass.const_expr(self.subtile_page > 0):
            self.load_subtile(copy_k, mK, copy_v, mV, mBlockTable, sK, sV, kv_pipeline, batch_idx, kvh, first_tile,
                              num_tiles, end)
        else:
            self.load_tiles(copy_k, mK, copy_v, mV, mBlockTable, sK, sV, kv_pipeline, batch_idx, kvh, first_tile,
                            num_tiles, tiles_per_page)

    @cute.jit
    def load_tiles(self, tma_k, mK_tma, tma_v, mV_tma, mBlockTable, sK, sV, kv_pipeline, batch_idx, kvh, first_tile,
                   num_tiles, tiles_per_page):
        """One K tile and one V tile per stage, by TMA. The page id of the next tile is loaded
        before waiting for a free stage, so its latency hides behind that wait; only entries of
        tiles this split loads are read (never past the row's last page)."""
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
            if i == 0 and cute.arch.lane_idx() == 0:
                timeline.stamp("tma_issued")

    @cute.jit
    def load_subtile(self, tma_k, mK_tma, tma_v, mV_tma, mBlockTable, sK, sV, kv_pipeline, batch_idx, kvh,
                     first_tile, num_tiles, end):
        """Pages of P < tile_n keys: tile ``t`` is ``tile_n / P`` TMA boxes per tensor, box ``j``
        (keys ``[t*N + j*P, t*N + (j+1)*P)``) from slot 0 of page ``block_table[b, t * N / P + j]``
        into rows ``[j*P, (j+1)*P)`` of the stage; all land on the stage's full mbarrier (same
        transaction bytes as one whole-tile box).

        The page ids of the next tile are loaded before waiting for a free stage. Only entries of
        pages holding keys ``< end`` are read (never past the row's last page): a box past
        ``end`` in the last tile reloads the tile's first page instead, into rows the consumer
        masks (scores) and zeroes (V), so the stage still receives its full byte count.
        """
        D, P = self.head_dim, self.subtile_page
        boxes = self.boxes_per_tile
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
    def load_gather(self, row_k, mK, row_v, mV, mBlockTable, sK, sV, kv_pipeline, batch_idx, kvh, first_tile,
                    num_tiles, end):
        """Gathered paging (any page size P, a runtime value): key ``n`` of tile ``t`` is slot
        ``(t*N + n) % P`` of page ``block_table[b, (t*N + n) // P]``; each lane copies its keys'
        K and V rows (D contiguous elements each, ``cp.async.bulk``) into the stage's staging
        slots, completing on the stage's full mbarrier (the same byte count as a TMA tile). Keys
        ``>= end`` of the last tile copy the tile's first key instead (rows the consumer masks
        and zeroes), so the table is never read past the row's pages."""
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
                # Clamped into the cache: a wrong page id (unchecked without a host sync) reads a
                # wrong page, never stray memory.
                page = cutlass.min(cutlass.max(mBlockTable[batch_idx, key // page_size], Int32(0)), mK.shape[3] - 1)
                slot = key % page_size
                cute.copy(row_k, mK[slot, None, kvh, page], sK[n, None, state.index], mbar_ptr=bar)
                cute.copy(row_v, mV[None, slot, kvh, page], sV[None, n, state.index], mbar_ptr=bar)
            kv_pipeline.producer_commit(state)
            state.advance()
