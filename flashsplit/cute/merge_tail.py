"""The split kernel's last-CTA merge (``SplitConfig.merge``): one launch, no combine kernel.

Each CTA counts its finished split on an int32 arrival counter of its row tile; the last of the
tile's ``num_splits`` CTAs merges the partials of the tile's real rows (one warp per row,
:class:`~flashsplit.cute.merge.RowMerge`, the combine kernel's per-warp code) into ``out`` and
``lse`` in q's dtype, and sets the counter back to 0.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from . import softmax, timeline
from .configs import SplitConfig
from .cta_work import grid_coords
from .merge import RowMerge
from .q_tile import tile_rows
from .warp_roles import NUM_CONSUMER_WARPS, ElementTypes, consumer_barrier


class MergeTail:
    """The merge tail of one merging configuration."""

    def __init__(self, config: SplitConfig):
        self.block_m = config.rows
        self.heads_first = config.heads_first
        self.dtype = ElementTypes(config).dtype
        # One warp per row, 64 fp32 of partials per lane in flight (d = 128: 16 splits a round trip).
        # The one-chunk path only where a CTA has the SM's registers: under the 168-register cap
        # of two CTAs per SM, ptxas spilled 8-64 bytes of its merge tail with it (none without).
        self.row_merge = RowMerge(config.head_dim, 1, 2048 // config.head_dim,
                                  one_chunk=config.units_per_sm == 1)

    @cute.jit
    def first_sink(self, mSinks, work):
        """The sink (fp32) of the first row this warp would merge (warp ``w`` merges rows ``w,
        w + 4, ...``): loaded with q, ahead of the keys, so that the merge does not wait on it."""
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        return mSinks[work.kvh * work.group + (work.row_block * self.block_m + warp) % work.group].to(Float32)

    @cute.jit
    def run(self, mO, mLSE, mOut, mOutLSE, mArrivals, sTicket, work, mSinks=None, first_sink=None):
        """Count this CTA's split as done on its row tile's arrival counter; the last of the
        tile's ``num_splits`` CTAs merges the partials of the tile's real rows into
        ``mOut``/``mOutLSE`` (warp ``w`` takes rows ``w, w + 4, ...``) and zeroes the counter.
        ``mSinks`` ``[H_q]``: each q head's sink joins its merged softmax (``softmax.add_sink``);
        ``first_sink``: the warp's first row's (:meth:`first_sink`), the others are loaded here.

        Ordering (the pattern of a split-K semaphore): every consumer thread's partial stores
        precede the named barrier, and thread 0's gpu-scope acq_rel atomic follows it (release:
        the other CTAs see these stores once they see the count); the last CTA's atomic
        acquires every other CTA's release, and the second barrier orders its warps' loads after
        it. The next launch on the stream starts after this kernel ends, with the counter at 0.
        """
        tidx, batch_idx, num_splits = work.tidx, work.batch_idx, work.num_splits
        counter = batch_idx * grid_coords(self.heads_first)[4] + work.z_idx
        consumer_barrier()
        if tidx == 0:
            sTicket[0] = cute.arch.atomic_add(mArrivals.iterator + counter, Int32(1), sem="acq_rel", scope="gpu")
        consumer_barrier()
        if tidx == 0:
            timeline.stamp("ticket")
        if sTicket[0] == num_splits - 1:
            if tidx == 0:
                mArrivals[counter] = Int32(0)
            self.merge_rows(mO, mLSE, mOut, mOutLSE, work, mSinks, first_sink)

    @cute.jit
    def merge_rows(self, mO, mLSE, mOut, mOutLSE, work, mSinks=None, first_sink=None):
        """Merge the ``work.num_splits`` partials of the tile's real rows (``mO`` ``[S, B, L_q,
        H, D]``, ``mLSE`` ``[S, B, H, L_q]``: the workspace's, or a cluster leader's slots,
        :meth:`~flashsplit.cute.cluster_merge.ClusterMerge.partials`) into ``mOut``/``mOutLSE``
        (warp ``w`` takes rows ``w, w + 4, ...``); sinks as :meth:`run` takes them."""
        M = self.block_m
        tidx, batch_idx, kvh, row_block = work.tidx, work.batch_idx, work.kvh, work.row_block
        seqlen_q, group, num_splits = work.seqlen_q, work.group, work.num_splits
        C = self.row_merge.cols_per_lane
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        lane = tidx % 32
        rows = tile_rows(seqlen_q, group, row_block, M)
        acc = cute.make_rmem_tensor((C,), Float32)
        out = cute.make_rmem_tensor((C,), self.dtype)
        for r in cutlass.range(warp, rows, NUM_CONSUMER_WARPS, unroll=1):
            packed = row_block * M + r
            m = packed // group
            hq = kvh * group + packed % group
            sink = None
            if cutlass.const_expr(mSinks is not None):
                sink = first_sink
                if r != warp:  # (issued ahead of the partials' loads)
                    sink = mSinks[hq].to(Float32)
            lse = self.row_merge.warp_sum(mO, mLSE, acc, num_splits, batch_idx, m, hq, 0, lane)
            if cutlass.const_expr(mSinks is not None):
                lse, factor = softmax.add_sink(lse, sink)
                for j in cutlass.range_constexpr(C):
                    acc[j] = acc[j] * factor
            out.store(acc.load().to(self.dtype))
            cute.autovec_copy(out, self.row_merge.lane_columns(mOut[batch_idx, m, hq, None], lane))
            if lane == 0:
                mOutLSE[batch_idx, hq, m] = lse
        if tidx == 0:
            timeline.stamp("merged")
