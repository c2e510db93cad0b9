"""The split kernel's CTA: its warp roles, the consumer warpgroup's barrier, its element types.

160 threads: warps 0-3 are the consumer warpgroup (Q load, wgmma, softmax, epilogue, merge
tail), warp 4 the producer (K/V loads). No ``setmaxnreg``: with one producer warp (not a
warpgroup) two CTAs per SM already leave the consumer ~200 registers, more than it needs.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute

from .configs import SplitConfig

NUM_CONSUMER_THREADS = 128
NUM_CONSUMER_WARPS = NUM_CONSUMER_THREADS // 32
PRODUCER_WARP = 4
NUM_THREADS = NUM_CONSUMER_THREADS + 32
#: The consumer warpgroup's named barrier (0 is ``__syncthreads``).
CONSUMER_BARRIER_ID = 1


def consumer_barrier() -> None:
    """Every consumer thread reaches this point before any goes on (the producer never waits)."""
    cute.arch.barrier(barrier_id=CONSUMER_BARRIER_ID, number_of_threads=NUM_CONSUMER_THREADS)


def publish_smem_writes() -> None:
    """Generic-proxy shared-memory writes become visible to wgmma (the async proxy) and to every
    consumer thread: a proxy fence, then the consumer barrier."""
    cute.arch.fence_proxy("async.shared", space="cta")
    consumer_barrier()


class ElementTypes:
    """The CuTe element types of a :class:`SplitConfig`: ``dtype`` (q's, the output's), ``kv``
    (the cache's) and ``op`` (the wgmma operands': q's, or fp16 for an fp8 cache with a bf16
    q, ``SplitConfig.fp16_operands``)."""

    def __init__(self, config: SplitConfig):
        self.dtype = cutlass.Float16 if config.dtype == "float16" else cutlass.BFloat16
        self.kv = {"same": self.dtype, "float8_e4m3fn": cutlass.Float8E4M3FN,
                   "float8_e5m2": cutlass.Float8E5M2}[config.kv_dtype]
        self.op = cutlass.Float16 if config.fp16_operands else self.dtype
