"""The 64-row consumer warpgroup: ``S = Q K^T``, online softmax by rows, ``O += P V``, epilogue.

wgmma's M = 64 packed q rows per CTA (rows past ``L_q x group`` are padding), both S operands
in shared memory, P from registers for the PV wgmma. Accumulator element ``(c, r, v)`` of a
thread sits at row ``16 warp + lane / 4 + 8 r`` and column ``2 (lane % 4) + c + 8 v`` of the
64 x n tile (the wgmma C layout): each thread holds two rows, whose softmax state it keeps.

A warp's 8-row half whose rows are all padding skips the softmax (its O rows are never written,
so the PV wgmma may multiply its raw scores): with 4 real rows, 7 of the 8 halves skip.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass import Float32, Int32
from cutlass.cute.nvgpu import warpgroup

from . import softmax
from .configs import SplitConfig
from .cta_work import output_row, split_work
from .kv_operands import KVOperands
from .mask import KeyMask
from .q_tile import QTile, tile_rows
from .warp_roles import ElementTypes


def tile_row(warp, lane, r):
    """The row of the 64-row tile of a thread's row ``r`` (0 or 1): the wgmma C layout's."""
    return warp * 16 + lane // 4 + 8 * r


def thread_row(work, rows, warp, lane, r):
    """The packed q row of a thread's row ``r`` in the CTA's ``rows``-row tile."""
    return work.row_block * rows + tile_row(warp, lane, r)


class RowConsumer:
    """The 64-row consumer of one configuration (16-bit TMA stages, or staged fp8 / gathered)."""

    def __init__(self, config: SplitConfig):
        self.head_dim = config.head_dim
        self.tile_n = config.tile_n
        self.block_m = config.rows
        self.stages = config.stages
        self.write_partials = config.write_partials
        self.scaled_q = config.fp16_operands  # per-row q scale in sRowScale
        self.signals_combine = config.signals_combine
        self.op_dtype = ElementTypes(config).op
        self.q_tile = QTile(config)
        self.kv_operands = KVOperands(config)
        self.mask = KeyMask(config.causal, config.left_bound, config.right_bound)
        self.first_bound = config.first_bound  # a left window bound or left padding
        self.softcap = config.softcap
        self.invariant = config.invariant  # a run of splits per CTA (CtaWork.split_count)

    @cute.jit
    def run(self, qk_mma, pv_mma, mO, mLSE, sQ, sK, sV, kv_pipeline, work, softmax_scale_log2, sK8, sV8,
            v_scale, sRowScale, softcap_log2=None, mSinks=None):
        """Every KV tile of the split (q is already in ``sQ``, its row scales in ``sRowScale``;
        ``sK``/``sV``: the operand stages, or with staging the one operand buffer ``sK8``/``sV8``
        are converted into), then O and the LSE. fp8: ``softmax_scale_log2`` already holds
        k_descale, ``v_scale`` is v_descale. ``softcap_log2`` (softcap configs) caps the scores,
        ``mSinks`` (sinks configs, one split) joins the final softmax. A batch-invariant CTA runs
        its ``work.split_count`` consecutive splits one after another, each exactly as a CTA of its
        own would (state reset, its own partial written), while the producer streams their tiles
        without a break."""
        M = self.block_m
        tidx = work.tidx

        qk_thr = qk_mma.get_slice(tidx)
        pv_thr = pv_mma.get_slice(tidx)
        tSrQ = qk_mma.make_fragment_A(qk_thr.partition_A(sQ))
        tSrK = qk_mma.make_fragment_B(qk_thr.partition_B(sK))
        tOrV = pv_mma.make_fragment_B(pv_thr.partition_B(sV))
        acc_o = pv_thr.make_fragment_C(pv_thr.partition_shape_C((M, self.head_dim)))

        lane = tidx % 32
        warp = tidx // 32
        row_max = cute.make_rmem_tensor((2,), Float32)
        row_sum = cute.make_rmem_tensor((2,), Float32)
        key_limit = cute.make_rmem_tensor((2,), Int32)  # first key a row may not see
        key_first = None  # first key a row sees (left window bound, left padding)
        if cutlass.const_expr(self.first_bound):
            key_first = cute.make_rmem_tensor((2,), Int32)
        row_qk_scale = cute.make_rmem_tensor((2,), Float32)  # log2 score scale of the row
        cap_k = None  # softcap: 2 log2(e) / softcap_log2 (softmax.cap_score)
        if cutlass.const_expr(self.softcap):
            cap_k = 2.0 * softmax.LOG2_E / softcap_log2
        row_sink = None  # each row's sink, loaded ahead of the keys (off the epilogue's critical path)
        if cutlass.const_expr(mSinks is not None):
            row_sink = cute.make_rmem_tensor((2,), Float32)
        for r in cutlass.range_constexpr(2):
            if cutlass.const_expr(mSinks is not None):  # (packed % group: a real head of this KV head)
                packed = thread_row(work, M, warp, lane, r)
                row_sink[r] = mSinks[work.kvh * work.group + packed % work.group].to(Float32)
            row_qk_scale[r] = softmax_scale_log2
            if cutlass.const_expr(self.scaled_q):  # times 1 / the q row's power of two
                row_qk_scale[r] = softmax_scale_log2 * sRowScale[tile_row(warp, lane, r)]
            if cutlass.const_expr(self.first_bound):
                self.mask.set_first(key_first, r, work.n_keys, work.seqlen_q, work.group,
                                    lambda: thread_row(work, M, warp, lane, r), work.window_left,
                                    work.leftpad)

        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
        if cutlass.const_expr(self.invariant):
            for j in cutlass.range(work.split_count, unroll=1):
                state = self.attend_split(split_work(work, work.split_idx + j, self.tile_n), state, qk_mma, pv_mma,
                                          mO, mLSE, sK, sV, kv_pipeline, sK8, sV8, v_scale, tSrQ, tSrK, tOrV, acc_o,
                                          row_max, row_sum, key_limit, key_first, row_qk_scale, softcap_log2, cap_k,
                                          row_sink)
            if cutlass.const_expr(self.signals_combine):
                cute.arch.griddepcontrol_launch_dependents()  # every split written
        else:
            state = self.attend_split(work, state, qk_mma, pv_mma, mO, mLSE, sK, sV, kv_pipeline, sK8, sV8, v_scale,
                                      tSrQ, tSrK, tOrV, acc_o, row_max, row_sum, key_limit, key_first, row_qk_scale,
                                      softcap_log2, cap_k, row_sink)

    @cute.jit
    def attend_split(self, work, state, qk_mma, pv_mma, mO, mLSE, sK, sV, kv_pipeline, sK8, sV8, v_scale, tSrQ,
                     tSrK, tOrV, acc_o, row_max, row_sum, key_limit, key_first, row_qk_scale, softcap_log2, cap_k,
                     row_sink):
        """One split's ``work.num_tiles`` tiles from the pipeline at ``state``, from a fresh
        softmax state, then its epilogue; returns the advanced pipeline state."""
        N, M = self.tile_n, self.block_m
        tidx, end = work.tidx, work.end
        lane = tidx % 32
        warp = tidx // 32
        qk_thr = qk_mma.get_slice(tidx)
        acc_s_shape = qk_thr.partition_shape_C((M, N))
        acc_o.fill(0.0)
        for r in cutlass.range_constexpr(2):
            row_max[r] = -Float32.inf
            row_sum[r] = 0.0
            self.mask.set_limit(key_limit, r, end, work.n_keys, work.seqlen_q, work.group,
                                lambda: thread_row(work, M, warp, lane, r), work.window_right)

        warp_uniform = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        rows_here = tile_rows(work.seqlen_q, work.group, work.row_block, M)
        # Where the epilogue writes, computed before the split's first tile arrives.
        out_rows = self.output_rows(mO, mLSE, work, lane, warp)
        for i in cutlass.range(work.num_tiles, unroll=1):
            tile_start = (work.first_tile + i) * N
            kv_pipeline.consumer_wait(state)
            op_stage = self.kv_operands.ready(kv_pipeline, state, sK8, sV8, sK, sV, tile_start, work, tidx)

            acc_s = cute.make_rmem_tensor(acc_s_shape, Float32)
            warpgroup.fence()
            for kb in cutlass.range_constexpr(cute.size(tSrQ, mode=[2])):
                qk_mma.set(warpgroup.Field.ACCUMULATE, kb != 0)
                cute.gemm(qk_mma, acc_s, tSrQ[None, None, kb, 0], tSrK[None, None, kb, op_stage], acc_s)
            warpgroup.commit_group()
            warpgroup.wait_group(0)

            # Mask, then the online-softmax update; a warp whose 8-row half holds only padding
            # rows (past L_q x group) skips both.
            for r in cutlass.range_constexpr(2):
                if warp_uniform * 16 + 8 * r < rows_here:
                    self.softmax_rows(acc_s, acc_o, row_max, row_sum, row_qk_scale, key_limit, r, tile_start, lane,
                                      key_first, softcap_log2, cap_k)

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
            self.kv_operands.release(kv_pipeline, state)
            state.advance()

        if cutlass.const_expr(self.signals_combine and not self.invariant):
            cute.arch.griddepcontrol_launch_dependents()  # every tile done: only the stores remain
        self.epilogue(acc_o, row_max, row_sum, out_rows, work, v_scale, row_sink)
        return state

    @cute.jit
    def output_rows(self, mO, mLSE, work, lane, warp):
        """For each of the thread's two rows, where the epilogue writes it
        (:func:`~flashsplit.cute.cta_work.output_row`)."""
        rows = []
        for r in cutlass.range_constexpr(2):
            rows.append(output_row(mO, mLSE, work, thread_row(work, self.block_m, warp, lane, r), self.write_partials))
        return rows

    @cute.jit
    def softmax_rows(self, acc_s, acc_o, row_max, row_sum, row_qk_scale, key_limit, r, tile_start, lane,
                     key_first=None, softcap_log2=None, cap_k=None):
        """Row ``r`` (0 or 1) of this thread's two S rows: scale, cap (softcap), mask, online-
        softmax update of ``row_max``/``row_sum``, ``acc_s`` -> P, ``acc_o`` rescaled."""
        D, N = self.head_dim, self.tile_n
        limit = key_limit[r] - tile_start
        first = None
        if cutlass.const_expr(key_first is not None):
            first = key_first[r] - tile_start
        tile_max = -Float32.inf
        for v in cutlass.range_constexpr(N // 8):
            for c in cutlass.range_constexpr(2):
                idx = c + 2 * r + 4 * v
                col = (lane % 4) * 2 + c + 8 * v
                s = acc_s[idx] * row_qk_scale[r]
                if cutlass.const_expr(cap_k is not None):
                    s = softmax.cap_score(s, softcap_log2, cap_k)
                s = self.mask.apply(s, col, limit, first)
                acc_s[idx] = s
                tile_max = cute.arch.fmax(tile_max, s)
        tile_max = cute.arch.fmax(tile_max, cute.arch.shuffle_sync_bfly(tile_max, offset=1))
        tile_max = cute.arch.fmax(tile_max, cute.arch.shuffle_sync_bfly(tile_max, offset=2))
        safe_max, rescale = softmax.raise_max(row_max, r, tile_max)
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
    def epilogue(self, acc_o, row_max, row_sum, out_rows, work, v_scale, row_sink=None):
        """Normalize and write O and the natural-log LSE straight from registers into
        ``out_rows`` (:meth:`output_rows`; an fp8 cache: O times ``v_scale``, the V descale).
        Partials of an empty split are never read: only their LSE is written. ``row_sink`` (one
        split: the final result): the thread's two rows' sinks, each joins its row's softmax
        (:func:`softmax.add_sink`)."""
        D = self.head_dim
        lane = work.tidx % 32
        for r in cutlass.range_constexpr(2):
            total = row_sum[r]
            total += cute.arch.shuffle_sync_bfly(total, offset=1)
            total += cute.arch.shuffle_sync_bfly(total, offset=2)
            lse, inv = softmax.finalize(row_max, r, total, v_scale)  # (v_scale: None unless fp8)
            real, g_out, g_lse = out_rows[r]
            if real:
                if cutlass.const_expr(row_sink is not None):
                    lse, factor = softmax.add_sink(lse, row_sink[r])
                    inv = inv * factor
                if lane % 4 == 0:
                    g_lse[0] = lse
                if cutlass.const_expr(self.write_partials):
                    if work.num_tiles > 0:
                        for v in cutlass.range_constexpr(D // 8):
                            for c in cutlass.range_constexpr(2):
                                g_out[(lane % 4) * 2 + c + 8 * v] = acc_o[c + 2 * r + 4 * v] * inv
                else:
                    for v in cutlass.range_constexpr(D // 8):
                        for c in cutlass.range_constexpr(2):
                            g_out[(lane % 4) * 2 + c + 8 * v] = (acc_o[c + 2 * r + 4 * v] * inv).to(g_out.element_type)
