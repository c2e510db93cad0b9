"""A development probe of the split kernel's timeline: when each CTA reaches each step.

Off by default, and then no instruction of it is compiled. ``scripts/cute_timeline.py`` sets
:data:`ADDRESS` to an int64 device buffer of ``[CTAs, PAIRS_PER_CTA, 2]`` before any split kernel
compiles in its process; each CTA then writes the GPU's ``%globaltimer`` (ns, comparable across
SMs) and its SM's ``%clock64`` (cycles, finer) into its row at the steps below, from the thread
that reaches them (slots of steps a CTA skips keep what was there):

- ``entry``: thread 0 on entry;
- ``tma_issued``: the producer's first K/V tile issued (TMA tiles only);
- ``first_tile``: consumer thread 0 past the wait for the first tile (swapped operands only);
- ``tiles_done``: consumer thread 0 past the last tile's ``P V``;
- ``epilogue``: consumer thread 0 after its partial or final stores;
- ``ticket``: consumer thread 0 with the arrival count back (merging configurations; a cluster
  merge: the leader's thread 0 past the cluster barrier after the slots' copies);
- ``merged``: consumer thread 0 of the merging CTA after its merge.

A last pair after the steps holds the CTA's SM (``%smid``, written with ``entry``), so a script can
tell whether the same SMs finish late call after call.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int64
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T

EVENTS = ("entry", "tma_issued", "first_tile", "tiles_done", "epilogue", "ticket", "merged")
#: int64 pairs per CTA: one per step, then (SM id, 0).
PAIRS_PER_CTA = len(EVENTS) + 1
#: Device address of the ``[CTAs, PAIRS_PER_CTA, 2]`` int64 buffer; 0 compiles no probe.
ADDRESS = 0


def _read(register: str) -> Int64:
    return Int64(llvm.inline_asm(T.i64(), [], f"mov.u64 $0, %{register};", "=l", has_side_effects=True))


@cute.jit
def stamp(step: cutlass.Constexpr[str]):
    """Write the times into this CTA's slots of ``step`` (one of :data:`EVENTS`; call it from one
    thread). Compiles to nothing while :data:`ADDRESS` is 0."""
    if cutlass.const_expr(ADDRESS != 0):
        bx, by, bz = cute.arch.block_idx()
        gx, gy, _ = cute.arch.grid_dim()
        cta = bx + gx * (by + gy * bz)
        slots = cute.make_tensor(cute.make_ptr(Int64, ADDRESS, cute.AddressSpace.gmem, assumed_align=8),
                                 cute.make_layout((1 << 26,)))
        slot = (cta * PAIRS_PER_CTA + EVENTS.index(step)) * 2
        slots[slot] = _read("globaltimer")
        slots[slot + 1] = _read("clock64")
        if cutlass.const_expr(step == "entry"):
            sm = llvm.inline_asm(T.i32(), [], "mov.u32 $0, %smid;", "=r", has_side_effects=True)
            slots[(cta * PAIRS_PER_CTA + len(EVENTS)) * 2] = Int64(cutlass.Int32(sm))
