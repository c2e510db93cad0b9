"""The split kernel's cluster merge (``SplitConfig.cluster``): one launch, no partials in global
memory, no arrival counter.

The ``S`` split CTAs of a row tile are one thread-block cluster along the grid's split axis, so
the tile's split ``s`` is the cluster's rank ``s``. Each CTA's epilogue writes its partial rows
(fp32 O and the natural-log LSE of the tile's real q rows) into slot ``s`` of its own shared
memory, then its consumer threads copy that slot into the same slot of the leader's (rank 0)
shared memory through distributed shared memory (``st.shared::cluster``; the leader copies onto
itself). After one cluster barrier (arrive with release, wait with acquire) the leader's
consumer warps merge the slots as the merge tail merges global partials
(:meth:`~flashsplit.cute.merge_tail.MergeTail.merge_rows`) and write ``out``/``lse``. After the
last split's epilogue the chain is then SM-to-SM stores and one cluster barrier, where the
arrival counter's is stores to L2, a gpu-scope fence, an atomic round trip and loads from L2.

Ordering: every thread arrives on the cluster barrier (relaxed) once the stage barriers are
initialized and waits on it before its first remote store (a CTA may touch another's shared
memory only once that CTA runs; the producer warp waits once its loads are issued); the second
arrive/wait follows the stores. Only for swapped-operand tiles (at most ``SWAP_AB_ROWS`` rows):
each CTA holds ``S x rows x (D + 1)`` fp32 of slots.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import dsl_user_op

from .warp_roles import NUM_CONSUMER_WARPS, consumer_barrier

_CONSUMER_THREADS = NUM_CONSUMER_WARPS * 32


@dsl_user_op
def store_to_cluster(address: Int32, value: Float32, *, loc=None, ip=None) -> None:
    """``st.shared::cluster.f32``: ``value`` to a distributed-shared-memory byte ``address``
    (``cute.arch.map_dsmem_ptr(...).toint()`` plus an offset)."""
    llvm.inline_asm(None, [Int32(address).ir_value(loc=loc, ip=ip), Float32(value).ir_value(loc=loc, ip=ip)],
                    "st.shared::cluster.f32 [$0], $1;", "r,f", has_side_effects=True, loc=loc, ip=ip)


class ClusterMerge:
    """The cluster merge of one configuration (``SplitConfig.cluster`` splits per cluster)."""

    def __init__(self, config):
        self.splits = config.cluster
        self.rows = config.rows
        self.head_dim = config.head_dim

    def partials(self, storage, work):
        """``(o, lse)``: this CTA's slots as the epilogue writes and the merge reads partials,
        by the global partials' coordinates ``[S, B, L_q, H, D]`` / ``[S, B, H, L_q]``: split ``s``
        is slot ``s``, a q row is the tile's packed row ``m * group + hq - kvh * group`` (the
        views start ``kvh * group`` rows before the slots), the batch row picks nothing (a
        cluster holds one batch row's tile)."""
        R, D, S = self.rows, self.head_dim, self.splits
        group, first_row = work.group, work.kvh * work.group
        o = cute.make_tensor(storage.cluster_o.data_ptr() + (-first_row * D),
                             cute.make_layout((S, 1, work.seqlen_q, first_row + group, D),
                                              stride=(R * D, 0, group * D, D, 1)))
        lse = cute.make_tensor(storage.cluster_lse.data_ptr() + (-first_row),
                               cute.make_layout((S, 1, first_row + group, work.seqlen_q), stride=(R, 0, 1, group)))
        return o, lse

    @staticmethod
    def started():
        """Every thread, once the stage barriers are initialized: this CTA runs."""
        cute.arch.cluster_arrive_relaxed()

    @staticmethod
    def before_stores():
        """Every thread, before its first store to another CTA (the producer warp once its loads
        are issued): every CTA of the cluster runs."""
        cute.arch.cluster_wait()

    @cute.jit
    def send(self, storage, work):
        """The consumer threads, after the epilogue: copy this CTA's slot (split ``s``: every
        row, written or not; the merge reads only real rows of splits with keys) into slot
        ``s`` of the leader's."""
        R, D = self.rows, self.head_dim
        tidx, s = work.tidx, work.split_idx
        consumer_barrier()  # the slot's rows are all written
        ClusterMerge.before_stores()
        o_local = storage.cluster_o.get_tensor(cute.make_layout((self.splits * R * D,)))
        lse_local = storage.cluster_lse.get_tensor(cute.make_layout((self.splits * R,)))
        o_leader = cute.arch.map_dsmem_ptr(storage.cluster_o.data_ptr(), 0).toint()
        lse_leader = cute.arch.map_dsmem_ptr(storage.cluster_lse.data_ptr(), 0).toint()
        first = s * (R * D)
        for i in cutlass.range_constexpr(R * D // _CONSUMER_THREADS):
            element = first + i * _CONSUMER_THREADS + tidx
            store_to_cluster(o_leader + element * 4, o_local[element])
        if tidx < R:
            store_to_cluster(lse_leader + (s * R + tidx) * 4, lse_local[s * R + tidx])

    @staticmethod
    def after_stores():
        """Every thread, after its stores: the leader's slots are full once this returns."""
        cute.arch.cluster_arrive()
        cute.arch.cluster_wait()
