"""The MLA split kernel's shared-memory struct, per configuration.

(No ``from __future__ import annotations`` here: ``cute.struct`` reads the field annotations
as objects.)
"""

import cutlass
import cutlass.cute as cute
from cutlass import Float32

from .mla_configs import CONSUMER_WARPGROUPS, ROWS, STAGES, MLAConfig


def mla_shared_storage(config: MLAConfig, op, kv, q_layout, k_layout, p_layout, load_layout):
    """The CTA's shared memory (``MLAConfig.smem_bytes`` counts the same): the Q tile, the K
    operand stages (fp8: one buffer), the stages' full/empty mbarrier pairs, the shared P tile,
    the warpgroups' row maxima / sums and an fp8 cache's staging slots."""
    fp8 = config.fp8

    @cute.struct
    class SharedStorage:
        sQ: cute.struct.Align[cute.struct.MemRange[op, cute.cosize(q_layout)], 1024]
        sK: cute.struct.Align[cute.struct.MemRange[op, cute.cosize(k_layout)], 1024]
        kv_mbar: cute.struct.MemRange[cutlass.Int64, STAGES * 2]
        sP: cute.struct.Align[cute.struct.MemRange[op, cute.cosize(p_layout)], 1024]
        red: cute.struct.MemRange[Float32, CONSUMER_WARPGROUPS * ROWS]
        if fp8:
            sK8: cute.struct.Align[cute.struct.MemRange[kv, cute.cosize(load_layout)], 1024]

    return SharedStorage
