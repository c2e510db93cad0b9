"""The split kernel's shared-memory struct, per configuration.

(No ``from __future__ import annotations`` here: ``cute.struct`` reads the field annotations
as objects.)
"""

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from .configs import SplitConfig
from .warp_roles import NUM_CONSUMER_WARPS, ElementTypes


def shared_storage(config: SplitConfig, q_layout, k_layout, v_layout, p_layout, k_load_layout, v_load_layout):
    """The CTA's shared memory (``SplitConfig.smem_bytes`` counts the same): the Q tile, the
    K/V operand stages (staged: one operand buffer each, then the staging slots; swapped: then
    P^T), one full/empty mbarrier pair per stage, the swapped consumer's column reductions, the
    q row scales (fp16 operands), the merge's arrival ticket and a cluster leader's partial
    slots."""
    types = ElementTypes(config)
    op, kv, M, stages = types.op, types.kv, config.rows, config.stages
    staged, swapped, merge, scaled_q = config.staged, config.swap_rows > 0, config.merge, config.fp16_operands
    slots = config.cluster * M  # partial rows a cluster leader holds (swapped operands only)

    @cute.struct
    class SharedStorage:
        sQ: cute.struct.Align[cute.struct.MemRange[op, cute.cosize(q_layout)], 1024]
        sK: cute.struct.Align[cute.struct.MemRange[op, cute.cosize(k_layout)], 1024]
        sV: cute.struct.Align[cute.struct.MemRange[op, cute.cosize(v_layout)], 1024]
        if staged:  # the plain slots the loads land in (fp8 tiles, gathered rows)
            sK8: cute.struct.Align[cute.struct.MemRange[kv, cute.cosize(k_load_layout)], 1024]
            sV8: cute.struct.Align[cute.struct.MemRange[kv, cute.cosize(v_load_layout)], 1024]
        if swapped:  # P^T, the B operand of O^T = V^T P^T
            sP: cute.struct.Align[cute.struct.MemRange[op, cute.cosize(p_layout)], 1024]
        kv_mbar: cute.struct.MemRange[cutlass.Int64, stages * 2]
        if swapped:  # the column maxima / sums, per consumer warp, per q row
            red: cute.struct.MemRange[Float32, NUM_CONSUMER_WARPS * M]
        if scaled_q:  # each q row's score scale (fp16 operands)
            row_scale: cute.struct.MemRange[Float32, M]
        if merge:  # the arrival count, broadcast to the consumer warps
            ticket: cute.struct.MemRange[Int32, 4]
        if slots:  # the cluster leader's slots: every split's partial O rows, then their LSEs
            cluster_o: cute.struct.Align[cute.struct.MemRange[Float32, slots * config.head_dim], 16]
            cluster_lse: cute.struct.MemRange[Float32, slots]

    return SharedStorage
