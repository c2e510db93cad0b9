"""The MLA split kernel's consumer warpgroups: ``S = Q K^T`` over 576, online softmax, ``O += P V``.

A CTA's 64 packed q rows (``r = m * H_q + h``: query token ``m``, q head ``h``) attend its
split's 64-key tiles. O is 64 x 512 fp32: 256 registers a thread in one warpgroup, too many, so
two warpgroups each own 256 of its columns, ``O[:, half] += P V[:, half]``, V read from the K
stage itself (the first 512 features of the key rows, an MN-major view of the same swizzled
bytes). ``S`` is split by keys: warpgroup ``w`` computes it for keys ``[32 w, 32 w + 32)`` of
the tile; the two exchange their row maxima through shared memory (a barrier), each writes its P
columns into one shared 64 x 64 P tile (a barrier), and both read it as the A operand of their PV
wgmmas. Each keeps the sum of its own keys' P (the same max sequence in both: the two add up at
the end). (Each warpgroup computing the whole 64 x 64 ``S`` itself, P in registers and nothing
exchanged, is 1.5x the tensor work: on the H100, bf16, H_q = 128, B = 32, 2 splits, 127.5 vs
119.7 us at 4k keys, 393.9 vs 357.4 us at 16k.)

Accumulator element ``(c, r, v)`` of a thread sits at row ``16 warp + lane / 4 + 8 r`` and
column ``2 (lane % 4) + c + 8 v`` of its tile (the wgmma C layout): each thread keeps the
softmax state of two rows.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass import Float32, Int32
from cutlass.cute.nvgpu import warpgroup

from . import softmax
from .mla_configs import CONSUMER_THREADS, HEAD_DIM, HEAD_DIM_V, ROWS, STAGES, TILE_N

#: Named barriers (0 is ``__syncthreads``): both consumer warpgroups, then one per warpgroup.
CONSUMERS_BARRIER_ID = 1
WARPGROUP_BARRIER_ID = 2
COLS = HEAD_DIM_V // 2  # O columns a warpgroup owns
KEYS = TILE_N // 2  # S columns (keys of a tile) a warpgroup computes


def consumers_barrier() -> None:
    """Every thread of both consumer warpgroups reaches this point before any goes on."""
    cute.arch.barrier(barrier_id=CONSUMERS_BARRIER_ID, number_of_threads=CONSUMER_THREADS)


def publish_to_consumers() -> None:
    """Generic-proxy shared-memory writes (the Q tile) become visible to both warpgroups' wgmmas."""
    cute.arch.fence_proxy("async.shared", space="cta")
    consumers_barrier()


def publish_to_warpgroup(wg) -> None:
    """Generic-proxy shared-memory writes of one warpgroup become visible to its own wgmmas."""
    cute.arch.fence_proxy("async.shared", space="cta")
    cute.arch.barrier(barrier_id=WARPGROUP_BARRIER_ID + wg, number_of_threads=128)


class MLAConsumer:
    """One consumer warpgroup of the MLA split kernel (``causal``: bottom-right aligned mask;
    ``kv_dtype``: the cache's element type, q's ``dtype`` or e4m3)."""

    def __init__(self, causal: bool, dtype, kv_dtype):
        self.causal = causal
        self.dtype = dtype
        self.kv_dtype = kv_dtype
        self.fp8 = kv_dtype is not dtype

    @cute.jit
    def load_q(self, mQ, sQ, tidx, batch_idx, row_block, seqlen_q, num_heads):
        """Both warpgroups gather the CTA's 64 packed q rows into the swizzled wgmma A tile
        ``sQ`` (8 elements per load; rows past ``seqlen_q * num_heads`` are zero). Every load is
        issued before the first store, so their latencies overlap."""
        chunks_per_row = HEAD_DIM // 8
        num_rows = seqlen_q * num_heads
        steps = ROWS * chunks_per_row // CONSUMER_THREADS
        frags = []
        for i in cutlass.range_constexpr(steps):
            chunk = tidx + i * CONSUMER_THREADS
            r = row_block * ROWS + chunk // chunks_per_row
            frag = cute.make_rmem_tensor((8,), self.dtype)
            frag.fill(0.0)
            if r < num_rows:
                col = (chunk % chunks_per_row) * 8
                gsrc = cute.local_tile(mQ[r // num_heads, r % num_heads, None, batch_idx], (8,), (col // 8,))
                cute.autovec_copy(gsrc, frag)
            frags.append(frag)
        for i in cutlass.range_constexpr(steps):
            chunk = tidx + i * CONSUMER_THREADS
            col = (chunk % chunks_per_row) * 8
            cute.autovec_copy(frags[i], cute.local_tile(sQ[chunk // chunks_per_row, None, 0], (8,), (col // 8,)))
        publish_to_consumers()

    @cute.jit
    def run(self, qk_mma, pv_mma, mO, mLSE, sQ, sK, sV, sP, sRed, kv_pipeline, wg, wtidx, batch_idx, split_idx,
            row_block, seqlen_q, num_heads, n_keys, end, first_tile, num_tiles, scale_log2, sK_all=None, sK8=None,
            v_scale=None):
        """Every tile of the split (q already in ``sQ``), then this warpgroup's half of O and (the
        first warpgroup) the LSE. ``sK``: this warpgroup's 32 keys of the K stages; ``sV``: its
        ``(256, keys, stages)`` view of them; ``sP``: the shared P tile; ``sRed``: ``(2, 64)``
        fp32, each warpgroup's row maxima, then sums; ``wtidx``: the thread's index in its
        warpgroup. fp8: ``sK8`` the staging slots, converted into the one operand buffer
        ``sK_all`` (stage 0); ``scale_log2`` holds the descale, ``v_scale`` is it."""
        lane = wtidx % 32
        warp = wtidx // 32
        qk_thr = qk_mma.get_slice(wtidx)
        pv_thr = pv_mma.get_slice(wtidx)
        tSrQ = qk_mma.make_fragment_A(qk_thr.partition_A(sQ))
        tSrK = qk_mma.make_fragment_B(qk_thr.partition_B(sK))
        tOrV = pv_mma.make_fragment_B(pv_thr.partition_B(sV))
        tOrP = pv_mma.make_fragment_A(pv_thr.partition_A(sP))
        acc_o = pv_thr.make_fragment_C(pv_thr.partition_shape_C((ROWS, COLS)))
        acc_s_shape = qk_thr.partition_shape_C((ROWS, KEYS))
        acc_o.fill(0.0)

        row_max = cute.make_rmem_tensor((2,), Float32)
        row_sum = cute.make_rmem_tensor((2,), Float32)
        tile_max = cute.make_rmem_tensor((2,), Float32)
        key_limit = cute.make_rmem_tensor((2,), Int32)  # the first key a row may not see
        for r in cutlass.range_constexpr(2):
            row_max[r] = -Float32.inf
            row_sum[r] = 0.0
            key_limit[r] = end
            if cutlass.const_expr(self.causal):
                m = (row_block * ROWS + warp * 16 + lane // 4 + 8 * r) // num_heads
                key_limit[r] = cutlass.min(end, n_keys - seqlen_q + m + 1)
        rows_here = cutlass.min(seqlen_q * num_heads - row_block * ROWS, ROWS)

        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, STAGES)
        for i in cutlass.range(num_tiles, unroll=1):
            tile_start = (first_tile + i) * TILE_N
            kv_pipeline.consumer_wait(state)
            stage = state.index  # the operand stage the wgmmas read
            if cutlass.const_expr(self.fp8):
                stage = 0
                consumers_barrier()  # both warpgroups' wgmmas of the last tile read the buffer: done
                self.convert(sK8, sK_all, state.index, end - tile_start, wg * 128 + wtidx)
                publish_to_consumers()
                kv_pipeline.consumer_release(state)
            elif tile_start + TILE_N > end:
                # Slots past the split's end may hold anything (NaN): P is 0 there, but 0 * NaN
                # is not, so this warpgroup zeroes its V columns of those rows (their scores are
                # masked by selection, whatever the other warpgroup's S reads).
                self.zero_tail_v(sV, state.index, end - tile_start, wtidx, wg)

            acc_s = cute.make_rmem_tensor(acc_s_shape, Float32)
            warpgroup.fence()
            for kb in cutlass.range_constexpr(cute.size(tSrQ, mode=[2])):
                qk_mma.set(warpgroup.Field.ACCUMULATE, kb != 0)
                cute.gemm(qk_mma, acc_s, tSrQ[None, None, kb, 0], tSrK[None, None, kb, stage], acc_s)
            warpgroup.commit_group()
            warpgroup.wait_group(0)

            # A warp's 8-row half of padding rows (past seqlen_q x H_q) skips the softmax: its O
            # rows are never written (it still meets the other warpgroup at every barrier).
            col_start = tile_start + wg * KEYS  # this warpgroup's first key
            for r in cutlass.range_constexpr(2):
                if warp * 16 + 8 * r < rows_here:
                    self.mask_row(acc_s, tile_max, key_limit, r, col_start, lane, scale_log2)
                    if lane % 4 == 0:
                        sRed[wg, warp * 16 + lane // 4 + 8 * r] = tile_max[r]
            consumers_barrier()  # both warpgroups' row maxima are in sRed
            for r in cutlass.range_constexpr(2):
                if warp * 16 + 8 * r < rows_here:
                    other = sRed[1 - wg, warp * 16 + lane // 4 + 8 * r]
                    tile_max[r] = cute.arch.fmax(tile_max[r], other)
                    self.exp_row(acc_s, acc_o, row_max, row_sum, tile_max, r)

            self.store_p(acc_s, sP, wg, warp, lane)
            publish_to_consumers()  # the whole P tile, to both warpgroups' wgmmas
            warpgroup.fence()
            pv_mma.set(warpgroup.Field.ACCUMULATE, True)
            for kb in cutlass.range_constexpr(cute.size(tOrP, mode=[2])):
                cute.gemm(pv_mma, acc_o, tOrP[None, None, kb, 0], tOrV[None, None, kb, stage], acc_o)
            warpgroup.commit_group()
            warpgroup.wait_group(0)
            if cutlass.const_expr(not self.fp8):
                kv_pipeline.consumer_release(state)
            state.advance()

        for r in cutlass.range_constexpr(2):
            total = row_sum[r]
            total += cute.arch.shuffle_sync_bfly(total, offset=1)
            total += cute.arch.shuffle_sync_bfly(total, offset=2)
            row_sum[r] = total
        # Each warpgroup summed its own keys' P: the row's sum is both. (The last tile's maxima in
        # sRed were read before the P barrier that every thread has passed.)
        for r in cutlass.range_constexpr(2):
            if lane % 4 == 0:
                sRed[wg, warp * 16 + lane // 4 + 8 * r] = row_sum[r]
        consumers_barrier()
        for r in cutlass.range_constexpr(2):
            row_sum[r] = row_sum[r] + sRed[1 - wg, warp * 16 + lane // 4 + 8 * r]
        self.epilogue(acc_o, row_max, row_sum, mO, mLSE, wg, lane, warp, batch_idx, split_idx, row_block, seqlen_q,
                      num_heads, v_scale)

    @cute.jit
    def convert(self, sK8, sK, slot, valid, tidx):
        """fp8 staging slot ``slot`` -> the 16-bit operand buffer (its swizzled wgmma layout), 16
        features per step, by both warpgroups (``tidx`` 0..255); key rows ``>= valid`` (past the
        split's end: anything, NaN included) are written as 0."""
        chunks_per_row = HEAD_DIM // 16
        for i in cutlass.range_constexpr(TILE_N * chunks_per_row // CONSUMER_THREADS):
            chunk = tidx + i * CONSUMER_THREADS
            n = chunk // chunks_per_row
            c = chunk % chunks_per_row
            k16 = cute.make_rmem_tensor((16,), self.dtype)
            k16.fill(0.0)
            if n < valid:
                k8 = cute.make_rmem_tensor((16,), self.kv_dtype)
                cute.autovec_copy(cute.local_tile(sK8[n, None, slot], (16,), (c,)), k8)
                k16.store(k8.load().to(self.dtype))
            cute.autovec_copy(k16, cute.local_tile(sK[n, None, 0], (16,), (c,)))

    @cute.jit
    def zero_tail_v(self, sV, stage, valid, wtidx, wg):
        """Zero rows ``>= valid`` of this warpgroup's 256 V columns of one stage."""
        for idx in cutlass.range(wtidx, (TILE_N - valid) * COLS, 128, unroll=1):
            sV[idx % COLS, valid + idx // COLS, stage] = self.dtype(0.0)
        publish_to_warpgroup(wg)

    @cute.jit
    def mask_row(self, acc_s, tile_max, key_limit, r, col_start, lane, scale_log2):
        """Row ``r`` (0 or 1) of the thread's S rows, whose first column is key ``col_start``:
        scale, mask keys at or past the row's limit by selection; ``tile_max[r]`` = their max."""
        limit = key_limit[r] - col_start
        top = -Float32.inf
        for v in cutlass.range_constexpr(KEYS // 8):
            for c in cutlass.range_constexpr(2):
                idx = c + 2 * r + 4 * v
                s = acc_s[idx] * scale_log2
                if (lane % 4) * 2 + c + 8 * v >= limit:
                    s = -Float32.inf
                acc_s[idx] = s
                top = cute.arch.fmax(top, s)
        top = cute.arch.fmax(top, cute.arch.shuffle_sync_bfly(top, offset=1))
        tile_max[r] = cute.arch.fmax(top, cute.arch.shuffle_sync_bfly(top, offset=2))

    @cute.jit
    def exp_row(self, acc_s, acc_o, row_max, row_sum, tile_max, r):
        """Online-softmax update of row ``r`` with the tile's max ``tile_max[r]``: ``acc_s`` -> P,
        the thread's part of the row's sum, ``acc_o`` rescaled where the max rose."""
        safe_max, rescale = softmax.raise_max(row_max, r, tile_max[r])
        tile_sum = Float32(0.0)
        for v in cutlass.range_constexpr(KEYS // 8):
            for c in cutlass.range_constexpr(2):
                idx = c + 2 * r + 4 * v
                p = cute.math.exp2(acc_s[idx] - safe_max, fastmath=True)
                acc_s[idx] = p
                tile_sum += p
        row_sum[r] = row_sum[r] * rescale + tile_sum
        if rescale < 1.0:  # the max rose (else the factor is exactly 1: 64 multiplies saved)
            for v in cutlass.range_constexpr(COLS // 8):
                for c in cutlass.range_constexpr(2):
                    acc_o[c + 2 * r + 4 * v] = acc_o[c + 2 * r + 4 * v] * rescale

    @cute.jit
    def store_p(self, acc_s, sP, wg, warp, lane):
        """This warpgroup's 32 P columns (16-bit) into the shared P tile."""
        for r in cutlass.range_constexpr(2):
            row = warp * 16 + lane // 4 + 8 * r
            for v in cutlass.range_constexpr(KEYS // 8):
                pair = cute.make_rmem_tensor((2,), self.dtype)  # two adjacent keys: one 4-byte store
                for c in cutlass.range_constexpr(2):
                    pair[c] = acc_s[c + 2 * r + 4 * v].to(self.dtype)
                cute.autovec_copy(pair, cute.local_tile(sP[row, None, 0], (2,), (wg * (KEYS // 2) + lane % 4 + 4 * v,)))

    @cute.jit
    def epilogue(self, acc_o, row_max, row_sum, mO, mLSE, wg, lane, warp, batch_idx, split_idx, row_block, seqlen_q,
                 num_heads, v_scale=None):
        """Normalize and write this warpgroup's 256 columns of each real row's fp32 partial and
        (the first warpgroup) its natural-log LSE, from the rows' full sums ``row_sum``. A row
        that saw no key of the split (an empty split, or a causal row whose keys all lie past
        it) writes LSE -inf and zeros. ``v_scale``: an fp8 cache's descale (O's factor)."""
        for r in cutlass.range_constexpr(2):
            lse, inv = softmax.finalize(row_max, r, row_sum[r], v_scale)
            packed = row_block * ROWS + warp * 16 + lane // 4 + 8 * r
            if packed < seqlen_q * num_heads:
                m = packed // num_heads
                h = packed % num_heads
                if wg == 0:
                    if lane % 4 == 0:
                        mLSE[split_idx, batch_idx, h, m] = lse
                g_out = mO[split_idx, batch_idx, m, h, None]
                for v in cutlass.range_constexpr(COLS // 8):
                    pair = cute.make_rmem_tensor((2,), Float32)  # two adjacent columns: one 8-byte store
                    for c in cutlass.range_constexpr(2):
                        pair[c] = acc_o[c + 2 * r + 4 * v] * inv
                    cute.autovec_copy(pair, cute.local_tile(g_out, (2,), (wg * (COLS // 2) + lane % 4 + 4 * v,)))
