"""The swapped-operand consumer warpgroup for 1-8 packed rows (``SplitConfig.swap_rows`` = R).

Per KV tile ``S^T = K Q^T`` (wgmma M = keys, N = R: the K tile is the A operand), the softmax
down each column (a q row), P^T into shared memory, ``O^T += V^T P^T`` (M = head dim, N = R:
the V stage read as a transposed A), then the epilogue. The tensor work of a tile is 8/64 of
the 64-row consumer's, which pads 1-8 rows to wgmma's M = 64. An fp8 cache's tiles land in
staging slots and are converted into one 16-bit K and V operand buffer
(:meth:`~flashsplit.cute.kv_operands.KVOperands.convert`), with q's rows scaled into fp16 as
for the 64-row consumer (:mod:`~flashsplit.cute.q_tile`).

Accumulator element ``i`` of a thread sits at row :func:`acc_row` (a key of S^T, a head-dim
index of O^T) and column ``2 (lane % 4) + i % 2`` (a q row): each thread holds two columns,
whose softmax state (running max, its own partial sum) it keeps; a column's max and sum are
shared across the four consumer warps through shared memory (``sRed``).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass import Float32, Int32
from cutlass.cute.nvgpu import warpgroup

from . import softmax, timeline
from .configs import SplitConfig
from .cta_work import output_row
from .kv_operands import KVOperands
from .mask import KeyMask
from .q_tile import QTile
from .warp_roles import NUM_CONSUMER_WARPS, ElementTypes, consumer_barrier, publish_smem_writes


def column_row(work, rows, lane, c):
    """The packed q row (of the CTA's ``rows``-row tile) of a thread's column ``c`` (0 or 1)."""
    return work.row_block * rows + (lane % 4) * 2 + c


def acc_row(i, warp, lane):
    """Row of a thread's wgmma accumulator element ``i`` = ``(c, r, t)`` = ``(i % 2, i // 2 % 2,
    i // 4)`` when N is 8: ``64 t + 16 warp + lane / 4 + 8 r``, the ``t``-th 64-row M block."""
    return (i // 4) * 64 + warp * 16 + lane // 4 + 8 * ((i // 2) % 2)


class SwapConsumer:
    """The swapped-operand consumer of one configuration (16-bit TMA stages, or staged fp8)."""

    def __init__(self, config: SplitConfig):
        self.head_dim = config.head_dim
        self.tile_n = config.tile_n
        self.block_m = config.rows
        self.stages = config.stages
        self.write_partials = config.write_partials
        self.signals_combine = config.signals_combine
        self.op_dtype = ElementTypes(config).op
        self.scaled_q = config.fp16_operands  # per-row q scale in sRowScale
        self.q_tile = QTile(config)
        self.kv_operands = KVOperands(config)
        self.mask = KeyMask(config.causal, config.left_bound, config.right_bound)
        self.first_bound = config.first_bound  # a left window bound or left padding
        self.softcap = config.softcap

    @cute.jit
    def run(self, qk_mma, pv_mma, mO, mLSE, sQ, sK, sV, sP, sRed, kv_pipeline, work, softmax_scale_log2,
            softcap_log2=None, mSinks=None, sK8=None, sV8=None, v_scale=None, sRowScale=None):
        """Every KV tile of the split (q is already in ``sQ``, with fp16 operands its row scales
        in ``sRowScale``), then O and the LSE. ``sK``/``sV``: the operand stages, or (staged) the
        one operand buffer the staging slots ``sK8``/``sV8`` are converted into; an fp8 cache's
        ``softmax_scale_log2`` already holds k_descale and ``v_scale`` is v_descale.
        ``softcap_log2`` (softcap configs) caps the scores, ``mSinks`` (sinks configs, one split)
        joins the final softmax."""
        D, N, R = self.head_dim, self.tile_n, self.block_m
        tidx, end = work.tidx, work.end

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
        key_first = None  # first key a column sees (left window bound, left padding)
        if cutlass.const_expr(self.first_bound):
            key_first = cute.make_rmem_tensor((2,), Int32)
        cap_k = None  # softcap: 2 log2(e) / softcap_log2 (softmax.cap_score)
        if cutlass.const_expr(self.softcap):
            cap_k = 2.0 * softmax.LOG2_E / softcap_log2
        row_sink = None  # each column's (q row's) sink, loaded ahead of the keys
        if cutlass.const_expr(mSinks is not None):
            row_sink = cute.make_rmem_tensor((2,), Float32)
        column_scale = None  # fp16 operands: each column's score scale (1 / its q row's power of two)
        if cutlass.const_expr(self.scaled_q):
            column_scale = cute.make_rmem_tensor((2,), Float32)
        for c in cutlass.range_constexpr(2):
            if cutlass.const_expr(self.scaled_q):
                column_scale[c] = softmax_scale_log2 * sRowScale[(lane % 4) * 2 + c]
            if cutlass.const_expr(mSinks is not None):  # (packed % group: a real head of this KV head)
                packed = column_row(work, R, lane, c)
                row_sink[c] = mSinks[work.kvh * work.group + packed % work.group].to(Float32)
            row_max[c] = -Float32.inf
            row_sum[c] = 0.0
            self.mask.set_limit(key_limit, c, end, work.n_keys, work.seqlen_q, work.group,
                                lambda: column_row(work, R, lane, c), work.window_right)
            if cutlass.const_expr(self.first_bound):
                self.mask.set_first(key_first, c, work.n_keys, work.seqlen_q, work.group,
                                    lambda: column_row(work, R, lane, c), work.window_left,
                                    work.leftpad)

        # Where the epilogue writes, computed while the first tile is in flight: after the last
        # tile only the sums, the normalizer and the stores remain.
        out_rows = self.output_rows(mO, mLSE, work, lane)

        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
        for i in cutlass.range(work.num_tiles, unroll=1):
            tile_start = (work.first_tile + i) * N
            kv_pipeline.consumer_wait(state)
            if i == 0 and tidx == 0:
                timeline.stamp("first_tile")
            op_stage = self.kv_operands.ready(kv_pipeline, state, sK8, sV8, sK, sV, tile_start, work, tidx)

            acc_s = cute.make_rmem_tensor(acc_s_shape, Float32)
            warpgroup.fence()
            for kb in cutlass.range_constexpr(cute.size(tSrQ, mode=[2])):
                qk_mma.set(warpgroup.Field.ACCUMULATE, kb != 0)
                cute.gemm(qk_mma, acc_s, tSrK[None, None, kb, op_stage], tSrQ[None, None, kb, 0], acc_s)
            warpgroup.commit_group()
            warpgroup.wait_group(0)

            self.softmax_columns(acc_s, acc_o, row_max, row_sum, key_limit, sRed, softmax_scale_log2, tile_start,
                                 lane, warp, key_first, softcap_log2, cap_k, column_scale)
            # P^T -> the B operand in shared memory. Every warp has passed the column-max barrier
            # in softmax_columns, so all are done with the previous tile's P V wgmma (reading sP).
            for j in cutlass.range_constexpr(cute.size(acc_s)):
                sP[(lane % 4) * 2 + j % 2, acc_row(j, warp, lane), 0] = acc_s[j].to(self.op_dtype)
            publish_smem_writes()

            warpgroup.fence()
            pv_mma.set(warpgroup.Field.ACCUMULATE, True)
            for kb in cutlass.range_constexpr(cute.size(tOrP, mode=[2])):
                cute.gemm(pv_mma, acc_o, tOrV[None, None, kb, op_stage], tOrP[None, None, kb, 0], acc_o)
            warpgroup.commit_group()
            warpgroup.wait_group(0)
            self.kv_operands.release(kv_pipeline, state)
            state.advance()

        if tidx == 0:
            timeline.stamp("tiles_done")
        if cutlass.const_expr(self.signals_combine):
            cute.arch.griddepcontrol_launch_dependents()  # every tile done: only the stores remain
        self.epilogue(acc_o, row_max, row_sum, out_rows, sRed, work, row_sink, v_scale)
        if tidx == 0:
            timeline.stamp("epilogue")

    @cute.jit
    def output_rows(self, mO, mLSE, work, lane):
        """For each of the thread's two columns (packed q rows), where the epilogue writes it
        (:func:`~flashsplit.cute.cta_work.output_row`)."""
        rows = []
        for c in cutlass.range_constexpr(2):
            rows.append(output_row(mO, mLSE, work, column_row(work, self.block_m, lane, c), self.write_partials))
        return rows

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
        consumer_barrier()
        for c in cutlass.range_constexpr(2):
            col = (lane % 4) * 2 + c
            x[c] = sRed[col]
            for w in cutlass.range_constexpr(1, NUM_CONSUMER_WARPS):
                x[c] = reduce(x[c], sRed[w * R + col])

    @cute.jit
    def softmax_columns(self, acc_s, acc_o, row_max, row_sum, key_limit, sRed, softmax_scale_log2, tile_start,
                        lane, warp, key_first=None, softcap_log2=None, cap_k=None, column_scale=None):
        """One S^T tile: scale (by ``column_scale[c]`` where each column has its own), cap
        (softcap), mask keys at or past each column's limit (or before its first key), the
        columns' new max over all four warps, ``acc_s`` -> P, this thread's partial sums and
        ``acc_o`` rescaled."""
        tile_max = cute.make_rmem_tensor((2,), Float32)
        for c in cutlass.range_constexpr(2):
            tile_max[c] = -Float32.inf
        for j in cutlass.range_constexpr(cute.size(acc_s)):
            c = j % 2
            key = tile_start + acc_row(j, warp, lane)
            scale = softmax_scale_log2
            if cutlass.const_expr(column_scale is not None):
                scale = column_scale[c]
            s = acc_s[j] * scale
            if cutlass.const_expr(cap_k is not None):
                s = softmax.cap_score(s, softcap_log2, cap_k)
            first = None
            if cutlass.const_expr(key_first is not None):
                first = key_first[c]
            s = self.mask.apply(s, key, key_limit[c], first)
            acc_s[j] = s
            tile_max[c] = cute.arch.fmax(tile_max[c], s)
        self.column_sums_across_warps(tile_max, sRed, lane, warp, cute.arch.fmax)
        safe_max = cute.make_rmem_tensor((2,), Float32)
        rescale = cute.make_rmem_tensor((2,), Float32)
        tile_sum = cute.make_rmem_tensor((2,), Float32)
        for c in cutlass.range_constexpr(2):
            safe_max[c], rescale[c] = softmax.raise_max(row_max, c, tile_max[c])
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
    def epilogue(self, acc_o, row_max, row_sum, out_rows, sRed, work, row_sink=None, v_scale=None):
        """The columns' sums over all threads, then O (= O^T's columns, normalized; an fp8 cache:
        times ``v_scale``, the V descale) and the natural-log LSE of each real q row, straight
        from registers into ``out_rows`` (:meth:`output_rows`). Partials of an empty split are
        never read: only their LSE is written. ``row_sink`` (one split: the final result): the
        thread's two columns' sinks, each joins its q row's softmax (:func:`softmax.add_sink`)."""
        tidx = work.tidx
        lane = tidx % 32
        warp = tidx // 32
        # sRed's last readers (the last tile's column max) are past the barrier before its P V.
        self.column_sums_across_warps(row_sum, sRed, lane, warp, lambda x, y: x + y)
        for c in cutlass.range_constexpr(2):
            real, g_out, g_lse = out_rows[c]
            lse, inv = softmax.finalize(row_max, c, row_sum[c], v_scale)
            if real:
                if cutlass.const_expr(row_sink is not None):
                    lse, factor = softmax.add_sink(lse, row_sink[c])
                    inv = inv * factor
                if tidx < 4:
                    g_lse[0] = lse
                # (acc_o element c + 2 j: this column's j-th value)
                if cutlass.const_expr(self.write_partials):
                    if work.num_tiles > 0:
                        for j in cutlass.range_constexpr(cute.size(acc_o) // 2):
                            g_out[acc_row(c + 2 * j, warp, lane)] = acc_o[c + 2 * j] * inv
                else:
                    for j in cutlass.range_constexpr(cute.size(acc_o) // 2):
                        g_out[acc_row(c + 2 * j, warp, lane)] = (acc_o[c + 2 * j] * inv).to(g_out.element_type)
