"""The consumer warpgroup's side of a K/V stage: making it a clean wgmma operand.

Cache slots past a row's live length or before its window may hold anything (NaN included),
and ``0 * NaN`` would poison O even where P is 0, so the V rows no query of the CTA sees are
zeroed (their scores are masked by selection in the softmax). Staged loads (fp8 caches,
gathered pages) land in plain slots that the consumer converts (fp8 -> the 16-bit operand
type) or copies into the swizzled operand buffers, 16 elements (one 16-byte chunk along d) per
thread and step.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute

from .configs import SplitConfig
from .warp_roles import NUM_CONSUMER_THREADS, ElementTypes, consumer_barrier, publish_smem_writes


class KVOperands:
    """Consumer-side preparation of the K/V operand buffers of one configuration."""

    def __init__(self, config: SplitConfig):
        self.head_dim = config.head_dim
        self.tile_n = config.tile_n
        self.staged = config.staged
        self.first_bound = config.first_bound  # a left window bound or left padding
        types = ElementTypes(config)
        self.kv_dtype, self.op_dtype = types.kv, types.op

    @cute.jit
    def ready(self, kv_pipeline, state, sK8, sV8, sK, sV, tile_start, work, tidx):
        """The K/V operand stage a consumer's wgmmas read for the tile of pipeline stage
        ``state`` (already waited on), made clean: staged, the tile converted (or copied) into the
        one operand buffer (stage 0) and its staging slot handed back to the producer at once;
        else the TMA stage itself, with the V rows no query of the CTA sees zeroed."""
        op_stage = state.index
        if cutlass.const_expr(self.staged):
            op_stage = 0
            # Every consumer warp has waited on its wgmmas of the previous tile (they read the
            # operand buffers) before any overwrites them.
            consumer_barrier()
            head = None  # V rows before the CTA's first visible key (left window bound, left padding)
            if cutlass.const_expr(self.first_bound):
                head = work.cta_first - tile_start
            self.convert(sK8, sV8, sK, sV, state.index, work.end - tile_start, tidx, head)
            kv_pipeline.consumer_release(state)
        else:
            self.zero_invisible_v(sV, state.index, tile_start, work.end, work.cta_first, tidx)
        return op_stage

    @cute.jit
    def release(self, kv_pipeline, state):
        """After the tile's last wgmma has completed: hand a TMA stage back to the producer (a
        staged slot went back in :meth:`ready`, once converted)."""
        if cutlass.const_expr(not self.staged):
            kv_pipeline.consumer_release(state)

    @cute.jit
    def zero_tail_v(self, sV, stage, valid, tidx):
        """Zero V rows ``>= valid`` of one stage (a TMA stage read in place)."""
        D, N = self.head_dim, self.tile_n
        for idx in cutlass.range(tidx, (N - valid) * D, NUM_CONSUMER_THREADS, unroll=1):
            sV[idx % D, valid + idx // D, stage] = self.op_dtype(0.0)
        publish_smem_writes()

    @cute.jit
    def zero_head_v(self, sV, stage, rows, tidx):
        """Zero V rows ``< rows`` of one stage (keys before a window no query of the CTA sees)."""
        D = self.head_dim
        for idx in cutlass.range(tidx, rows * D, NUM_CONSUMER_THREADS, unroll=1):
            sV[idx % D, idx // D, stage] = self.op_dtype(0.0)
        publish_smem_writes()

    @cute.jit
    def zero_invisible_v(self, sV, stage, tile_start, end, cta_first, tidx):
        """Zero the V rows of the TMA stage of the tile at ``tile_start`` that no query of the CTA
        sees: keys ``>= end``, and with a left window bound (``cta_first`` not None) keys before
        ``cta_first``."""
        N = self.tile_n
        if cutlass.const_expr(cta_first is not None):
            if tile_start < cta_first:
                self.zero_head_v(sV, stage, cta_first - tile_start, tidx)
        if tile_start + N > end:
            self.zero_tail_v(sV, stage, end - tile_start, tidx)

    @cute.jit
    def convert(self, sK8, sV8, sK, sV, stage, valid, tidx, head=None):
        """Staging slot ``stage`` -> the 16-bit K and V operand buffers (swizzled wgmma layouts);
        V rows ``>= valid`` (and, given ``head``, rows ``< head``) are written as 0."""
        D, N = self.head_dim, self.tile_n
        chunks_per_row = D // 16
        for i in cutlass.range_constexpr(N * chunks_per_row // NUM_CONSUMER_THREADS):
            chunk = tidx + i * NUM_CONSUMER_THREADS
            n = chunk // chunks_per_row
            c = chunk % chunks_per_row
            k8 = cute.make_rmem_tensor((16,), self.kv_dtype)
            cute.autovec_copy(cute.local_tile(sK8[n, None, stage], (16,), (c,)), k8)
            k16 = cute.make_rmem_tensor((16,), self.op_dtype)
            k16.store(k8.load().to(self.op_dtype))
            cute.autovec_copy(k16, cute.local_tile(sK[n, None, 0], (16,), (c,)))
            v16 = cute.make_rmem_tensor((16,), self.op_dtype)
            v16.fill(0.0)
            visible = n < valid
            if cutlass.const_expr(head is not None):
                visible = visible & (n >= head)
            if visible:
                v8 = cute.make_rmem_tensor((16,), self.kv_dtype)
                cute.autovec_copy(cute.local_tile(sV8[None, n, stage], (16,), (c,)), v8)
                v16.store(v8.load().to(self.op_dtype))
            cute.autovec_copy(v16, cute.local_tile(sV[None, n, 0], (16,), (c,)))
        publish_smem_writes()
