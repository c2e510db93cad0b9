"""Which MLA backend ``backend="auto"`` runs: the rules, in order, first match wins.

=================  ========  ==================================================================
rule               backend   when
=================  ========  ==================================================================
``hopper``         cute      the cute kernel can run the problem (sm_90, nvidia-cutlass-dsl, a
                             layout it loads by TMA): its warpgroup MMAs over 576 and 512
                             features are what the compute-bound cells (H_q = 128) need.
``default``        triton    everything else (other GPUs, the CPU interpreter, page sizes or
                             dtypes the cute kernel does not take).
=================  ========  ==================================================================

If the backend a rule names cannot run the problem, the first able backend runs it.
"""

from __future__ import annotations

from typing import Sequence

from .problem import MlaProblem

#: (rule, backend, why), in order; the last one always applies.
RULES = (
    ("hopper", "cute", "the Hopper kernel (TMA loads, warpgroup MMA) runs this problem"),
    ("default", "triton", "the portable kernel"),
)


def choose(problem: MlaProblem, able: Sequence) -> tuple[object, str, str]:
    """``(backend, rule, why)`` among the ``able`` backends (those whose ``supports`` accepted)."""
    by_name = {b.name: b for b in able}
    for rule, name, why in RULES:
        if name in by_name:
            return by_name[name], rule, why
    return able[0], "fallback", f"the only able backend ({able[0].name})"
