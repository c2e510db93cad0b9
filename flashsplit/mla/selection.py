"""Which MLA backend ``backend="auto"`` runs: the rules, in order, first match wins.

=================  ========  ==================================================================
rule               backend   when
=================  ========  ==================================================================
``one-short-row``  triton    one row of one query token, at most 4096 keys, a bf16/fp16 cache:
                             too little work to hide the cute kernel's longer start (an H100,
                             page 64: 12.7 against 14.0 us at H_q = 16, 18.2 against 22.0 at
                             H_q = 128; at 16k keys cute is ahead, 22.0 against 22.7 and 30.5
                             against 38.4).
``hopper``         cute      the cute kernel can run the problem (sm_90, nvidia-cutlass-dsl, a
                             layout it loads by TMA): its warpgroup MMAs over 576 and 512
                             features are what the compute-bound cells (H_q = 128) need.
``default``        triton    everything else (other GPUs, the CPU interpreter, page sizes or
                             dtypes the cute kernel does not take).
=================  ========  ==================================================================

If the backend a rule names cannot run the problem, the next rule is tried; the first able
backend runs what no rule takes.
"""

from __future__ import annotations

from typing import Sequence

from .problem import MlaProblem

#: The most keys of a single-token row the ``one-short-row`` rule sends to Triton.
SHORT_ROW_KEYS = 4096


def _one_short_row(problem: MlaProblem) -> bool:
    return (problem.batch == 1 and problem.seqlen_q == 1 and problem.capacity <= SHORT_ROW_KEYS
            and not problem.fp8)


#: (rule, backend, applies to a problem, why), in order; the last one always applies.
RULES = (
    ("one-short-row", "triton", _one_short_row,
     f"one row of one query token and at most {SHORT_ROW_KEYS} keys: the Triton kernel starts sooner"),
    ("hopper", "cute", lambda problem: True, "the Hopper kernel (TMA loads, warpgroup MMA) runs this problem"),
    ("default", "triton", lambda problem: True, "the portable kernel"),
)


def choose(problem: MlaProblem, able: Sequence) -> tuple[object, str, str]:
    """``(backend, rule, why)`` among the ``able`` backends (those whose ``supports`` accepted)."""
    by_name = {b.name: b for b in able}
    for rule, name, applies, why in RULES:
        if name in by_name and applies(problem):
            return by_name[name], rule, why
    return able[0], "fallback", f"the only able backend ({able[0].name})"
