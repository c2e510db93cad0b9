"""The split plan of an MLA decode: MLA is the shared plan's MQA case, weighed for compute.

All ``seqlen_q x H_q`` packed rows of a batch row share the one latent KV head, so a work unit
(one CTA of one split) is a batch row's block of packed rows, ``work_units = B x row_blocks``,
and :func:`flashsplit.plan.choose_num_splits` (FA3's wave rule) spreads those units over the
SMs as it does GQA's. Split boundaries are :func:`flashsplit.plan.split_bounds`' (granule 128).

Compute-bound rows. GQA decode reads 2 x D bytes per key for 2 x group x 2D flops: bound by
memory. An MLA key is 1152 bytes (bf16) for ``2 x rows x (576 + 512)`` flops: at 128 packed rows
(H_q = 128) 242 flops per byte, at the H100's ridge (989 dense bf16 TFLOPS / 3.35 TB/s = 295).
From :data:`COMPUTE_BOUND_ROWS` packed rows a tile keeps its tensor cores busy by itself, so a
split buys parallelism only for SMs that would otherwise idle, and every split adds ``rows x 512``
fp32 partials per batch row, written and read back by the combine (128 rows: 256 KB, the bytes
of 228 keys). Such problems therefore split only while their work units fill less than
:data:`COMPUTE_BUSY_FRACTION` of the CTA slots (GQA: 0.8), and never into splits under
:data:`COMPUTE_MIN_SPLIT_KEYS` keys. (A floor of 1024 keys left B = 1 x 1k at H_q = 128 in one
split: its few CTAs, each a chain of dependent key tiles, took 101 us on an H100.)
"""

from __future__ import annotations

from ..plan import SPLIT_GRANULE, SplitPlan, cdiv, choose_num_splits, tokens_per_split
from .problem import MlaProblem

#: Packed rows (``seqlen_q x H_q``) from which the plan treats an MLA problem as compute-bound.
COMPUTE_BOUND_ROWS = 64
#: A compute-bound problem is not split once its work units fill this fraction of the CTA slots.
COMPUTE_BUSY_FRACTION = 0.5
#: Nor into splits of fewer keys than this (two granules).
COMPUTE_MIN_SPLIT_KEYS = 256


def mla_num_splits(problem: MlaProblem, block_m: int, units_per_sm: int) -> tuple[int, str]:
    """``(splits, why)`` for ``problem`` on a backend of ``block_m``-row tiles running
    ``units_per_sm`` CTAs per SM; the caller's ``num_splits`` when it gave one."""
    if problem.num_splits:
        return problem.num_splits, f"num_splits={problem.num_splits} requested"
    units, num_sms = problem.work_units(block_m), problem.num_sms
    if problem.packed_rows < COMPUTE_BOUND_ROWS:
        splits, why = choose_num_splits(units, problem.capacity, num_sms, units_per_sm)
        return splits, f"memory-bound ({problem.packed_rows} packed rows per key): {why}"
    slots = num_sms * units_per_sm
    head = f"compute-bound ({problem.packed_rows} packed rows per key)"
    if units >= COMPUTE_BUSY_FRACTION * slots:
        return 1, f"{head}: {units} work units fill {units / slots:.0%} of {slots} CTA slots"
    max_splits = max(1, problem.capacity // COMPUTE_MIN_SPLIT_KEYS)
    splits, why = choose_num_splits(units, problem.capacity, num_sms, units_per_sm, max_splits=max_splits)
    return splits, f"{head}, splits of >= {COMPUTE_MIN_SPLIT_KEYS} keys: {why}"


def make_mla_plan(problem: MlaProblem, backend, rule: str, reason: str) -> SplitPlan:
    """The :class:`~flashsplit.plan.SplitPlan` that ``backend`` runs ``problem`` with (``grid``:
    ``(splits, batch, row_blocks)``, one KV head)."""
    block_m, per_sm = backend.block_m(problem), backend.units_per_sm(problem)
    splits, why = mla_num_splits(problem, block_m, per_sm)
    row_blocks = cdiv(problem.packed_rows, block_m)
    target = problem.target
    return SplitPlan(
        backend=backend.name, rule=rule, backend_reason=reason, num_splits=splits, split_reason=why,
        granule=SPLIT_GRANULE, tokens_per_split=tokens_per_split(problem.capacity, splits), block_m=block_m,
        row_blocks=row_blocks, work_units=problem.work_units(block_m), grid=(splits, problem.batch, row_blocks),
        num_sms=problem.num_sms, units_per_sm=per_sm, runs_combine=splits > 1,
        gpu=target.name if target is not None else "cpu", span=problem.capacity, seqlen_q=problem.seqlen_q)

