"""Online softmax in log2 units, shared by the 64-row and the swapped-operand consumers.

Scores arrive scaled by ``softmax_scale * log2(e)`` (times a q row's 1 / 2^s with fp16
operands), so ``exp2`` replaces ``exp``. Each row (a column, with swapped operands) keeps its
running max and sum; a tile raises the max (:func:`raise_max`), rescales the old sum and O by
``exp2(old - new)`` and adds its own ``exp2(s - max)``. The epilogue turns the final max and sum
into the natural-log LSE and O's normalizer (:func:`finalize`). A softcap transforms the scaled
scores before the mask (:func:`cap_score`); a sink joins a finished softmax where a final result
is written (:func:`add_sink`).
"""

from __future__ import annotations

import math

import cutlass
import cutlass.cute as cute
from cutlass import Float32

LN_2 = math.log(2.0)
LOG2_E = math.log2(math.e)


@cute.jit
def raise_max(row_max, i, tile_max):
    """``row_max[i] = max(row_max[i], tile_max)``; returns the max to subtract from this tile's
    scores and the factor that rescales the old sum and O. A row (or column) that has seen no
    key yet keeps max -inf and subtracts 0 (no -inf - -inf)."""
    new_max = cute.arch.fmax(row_max[i], tile_max)
    safe_max = new_max
    if new_max == -Float32.inf:
        safe_max = 0.0
    rescale = cute.math.exp2(row_max[i] - safe_max, fastmath=True)
    row_max[i] = new_max
    return safe_max, rescale


@cute.jit
def finalize(row_max, i, total, o_scale=None):
    """``(lse, inv)`` of row ``i`` from its max (log2 units) and its full sum ``total``: the
    natural-log LSE and the factor that normalizes O (``o_scale / total``: an fp8 cache's V
    descale, or 1). A row that saw no key gets LSE -inf and factor 0. The log is ``lg2.approx``
    (~2^-22 relative error, as the merges' exp and log): the accurate sequence is ~25 dependent
    instructions on the path from the last tile to the stores."""
    lse = -Float32.inf
    inv = Float32(0.0)
    if total > 0.0:
        lse = (row_max[i] + cute.math.log2(total, fastmath=True)) * LN_2
        if cutlass.const_expr(o_scale is None):
            inv = 1.0 / total
        else:
            inv = o_scale / total
    return lse, inv


@cute.jit
def cap_score(s, softcap_log2, doubled_inverse):
    """``softcap_log2 * tanh(s / softcap_log2)`` of a score ``s`` in log2 units, as ``c (1 - 2 /
    (2^(s k) + 1))`` with ``k = doubled_inverse = 2 log2(e) / softcap_log2`` (exact limits +-c at
    +-inf; NaN stays NaN, for the mask to replace). ``ex2.approx`` and ``rcp.approx`` (~2^-22
    relative error each): an accurate division per score would cost ~10 instructions more."""
    e = cute.math.exp2(s * doubled_inverse, fastmath=True)
    return softcap_log2 * (1.0 - 2.0 * cute.arch.rcp_approx(e + 1.0))


@cute.jit
def add_sink(lse, sink):
    """A learned sink logit ``sink`` (natural log) joins a finished softmax of natural-log LSE
    ``lse``: returns ``lse' = log(exp(lse) + exp(sink))`` and the factor ``exp(lse - lse')`` that
    scales O (the sink adds to the denominator only). A row that saw no key (``lse = -inf``)
    gets ``lse' = sink`` and factor 0."""
    top = cute.arch.fmax(lse, sink)
    shift = top
    if top == -Float32.inf:
        shift = Float32(0.0)
    total = cute.math.exp(lse - shift, fastmath=False) + cute.math.exp(sink - shift, fastmath=False)
    lse_sink = shift + cute.math.log(total, fastmath=False)
    factor = Float32(0.0)
    if lse > -Float32.inf:
        factor = cute.math.exp(lse - lse_sink, fastmath=False)
    return lse_sink, factor
