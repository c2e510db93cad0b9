"""Correctness gate: a contender's output against :func:`flashsplit.reference.attention_ref`.

The reference runs in float64 on a few batch rows only (the first and the last): a float64
copy of a whole 34 GB cache would not fit, and a wrong kernel is wrong on every row anyway.
For a paged or fp8 cache it attends to those rows gathered from their pages and dequantized
(:meth:`~.inputs.InputSets.reference_kv`): the attention the kernel is asked for. The reference
computes the case's attention variant too (window, softcap, sinks, the appended keys, rotary)
and, for several queries per row, the causal mask (bottom-right aligned), so a contender that
ignores one fails the check wherever it changes the result by more than the tolerance. Over a
long cache the causal mask hides too few keys to move the result past the tolerance, so with
several queries the output must also be closer to the causal reference than to the one without
the mask.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..reference import attention_ref
from .inputs import InputSets

#: Largest relative Frobenius error accepted. With N(0, 1) inputs the output is an average of
#: many values and close to 0, so an absolute tolerance would pass a kernel returning zeros;
#: a relative one does not (zeros give 1.0). bf16 rounding of O alone is ~2e-3.
REL_TOLERANCE = {"bf16": 2e-2, "fp16": 1e-2}


@dataclass(frozen=True)
class CheckResult:
    ok: bool
    rel_err: float
    detail: str


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """``||out - ref|| / ||ref||`` in float64 (inf when ``out`` holds NaN/inf)."""
    out64, ref64 = out.double(), ref.double()
    if not torch.isfinite(out64).all():
        return float("inf")
    denom = torch.linalg.vector_norm(ref64).item()
    num = torch.linalg.vector_norm(out64 - ref64).item()
    return num / denom if denom > 0 else num


def reference_row(inputs: InputSets, b: int, unmasked: bool = False) -> torch.Tensor:
    """float64 ``[1, L_q, H, D]`` reference output of batch row ``b`` of input set 0 (memoized):
    the case's attention, or with ``unmasked`` (a causal case's) the same attention without the
    causal mask (a window's right bound lifted too: ``(window, -1)``)."""
    case = inputs.case
    unmasked = unmasked and case.causal
    key = (b, "unmasked") if unmasked else b
    if key not in inputs.ref_cache:
        k, v = inputs.reference_kv(b)
        window = (case.window, -1) if unmasked and case.window >= 0 else case.window_size
        ref, _ = attention_ref(inputs.reference_q(b), k, v, inputs.cache_seqlens[b:b + 1] + case.append,
                               causal=case.causal and not unmasked, upcast=True, window_size=window,
                               softcap=case.softcap, sinks=inputs.sinks)
        inputs.ref_cache[key] = ref
    return inputs.ref_cache[key]


def check_output(out_bshd: torch.Tensor, inputs: InputSets, rows: list[int] | None = None) -> CheckResult:
    """Compare ``out_bshd`` ``[B, L_q, H, D]`` (computed on input set 0) with the float64 reference
    (for a causal case: and that it is closer to it than to the reference without the mask)."""
    case = inputs.case
    expected_shape = (case.batch, case.seqlen_q, case.num_heads, case.head_dim)
    if tuple(out_bshd.shape) != expected_shape:
        return CheckResult(False, float("inf"), f"output shape {list(out_bshd.shape)}, expected {list(expected_shape)}")
    if rows is None:
        rows = sorted({0, case.batch - 1})
    tol = REL_TOLERANCE[case.dtype]
    worst, worst_row = 0.0, rows[0]
    for b in rows:
        err = relative_error(out_bshd[b:b + 1], reference_row(inputs, b))
        if err > worst:
            worst, worst_row = err, b
    ok = worst <= tol
    detail = f"rel err {worst:.2e} (batch row {worst_row}, tolerance {tol:.0e})"
    if ok and case.causal:
        unmasked = unmasked_row(out_bshd, inputs, rows)
        if unmasked is not None:
            return CheckResult(False, worst, f"{detail}, but closer to attention without the causal mask "
                                             f"(rel err {unmasked[1]:.2e}, batch row {unmasked[0]})")
    return CheckResult(ok, worst, detail)


def unmasked_row(out_bshd: torch.Tensor, inputs: InputSets, rows: list[int]) -> tuple[int, float] | None:
    """The first of ``rows`` (and its error) whose output is at least as close to the reference
    without the causal mask as to the causal one; None when every row is closer to the causal one."""
    for b in rows:
        causal = relative_error(out_bshd[b:b + 1], reference_row(inputs, b))
        unmasked = relative_error(out_bshd[b:b + 1], reference_row(inputs, b, unmasked=True))
        if unmasked <= causal:
            return b, unmasked
    return None
