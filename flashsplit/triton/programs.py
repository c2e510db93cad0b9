"""How many split-kernel programs per SM the Triton plan counts (the plan's ``units_per_sm``).

The plan divides the machine by this number (:func:`flashsplit.plan.planned_split`): at two
programs per SM it makes twice as many, shorter splits as at one. Two is the default; the rules
below take one where one was measured faster.
"""

from __future__ import annotations

from ..plan import SPLIT_GRANULE, planned_split
from ..problem import FP8_DTYPES, DecodeProblem
from ..target import KNOWN_GPUS

#: Programs per SM the plan counts for the split kernel: 2 beat FA3's 1 on the H200 (32/8 heads:
#: B = 1 x 128k 30 splits 10% faster than FA3's 15; B = 16 x 16k 2 splits 6% faster than its 1);
#: :func:`~flashsplit.triton.backend.choose_tiles` keeps 3 stages while a launch fits one such wave.
PROGRAMS_PER_SM = 2

#: The fewest one-granule splits a dense cache's plan at two programs per SM may have before
#: :func:`programs_per_sm` halves them (measured at 32; at 8 and 16 halving was mixed).
HALVED_MIN_SPLITS = 32

#: GPUs (by the name CUDA reports) on which a dense fp8 cache's splits are halved once the halved
#: splits hold at least ``FP8_HALVED_MIN_KEYS`` keys each; see :func:`programs_per_sm`.
FP8_ONE_PROGRAM_PER_SM_GPUS = frozenset({KNOWN_GPUS["h100"].name})
FP8_HALVED_MIN_KEYS = 4096


def programs_per_sm(problem: DecodeProblem, block_m: int) -> int:
    """Programs per SM the plan divides the machine by: ``PROGRAMS_PER_SM``, but one for

    - a dense cache whose plan at two per SM has at least ``HALVED_MIN_SPLITS`` splits of a
      single granule (one key tile each, nothing to pipeline): half as many programs then read
      two granules each, pipelined, and the last one merges half the partials;
    - on the GPUs of ``FP8_ONE_PROGRAM_PER_SM_GPUS``, a dense fp8 cache whose plan at one
      program per SM has fewer splits, each of at least ``FP8_HALVED_MIN_KEYS`` keys.

    Interleaved graph replays, 32 vs 16 splits, us: H100, 32/8 heads, B = 1 x 4k, bf16 11.80 vs
    11.22, e4m3 10.51 vs 9.99; 64/8 heads bf16 11.98 vs 11.34, e4m3 10.48 vs 10.05; H200, 32/8,
    e4m3, 10.01 vs 9.53. Where halving leaves fewer splits it was mixed (H100, bf16 / e4m3:
    32/8 B = 2 x 2k, 16 vs 8 splits, 12.19 / 9.92 vs 11.53 / 10.05; 32/32 B = 1 x 1k, 8 vs 4,
    11.13 / 9.52 vs 11.25 / 9.31) or lost on both (32/8 B = 4 x 1k, 8 vs 4, 11.75 / 10.11 vs
    12.50 / 10.99); it lost in pages of 16 (32/8 B = 1 x 4k, 13.24 / 10.88 vs 14.38 / 11.63).
    Halving more splits (H100, bf16): 16/2 heads B = 1 x 16k, 128 vs 64, 16.72 vs 12.02 (d =
    256: 24.71 vs 23.08); 28/4 B = 1 x 8k, 64 vs 32, 12.35 vs 12.30.

    Splits of several granules, e4m3, two per SM vs one: on the H200 two won (B = 1 x 16k 16.60
    vs 19.53 us, 128k 71.44 vs 87.06); on the H100 one won once its splits held 4k keys or more
    (B = 1 x 64k 56.94 vs 55.06, 128k 102.54 vs 97.83; 64/8 heads 103.85 vs 99.26; d = 64 69.59
    vs 68.55; B = 8 x 128k 749.04 vs 719.27; B = 16 x 128k 1489.92 vs 1425.74) and lost with 2k
    (B = 1 x 32k 31.46 vs 32.00) and in pages of 16 (B = 1 x 128k 106.67 vs 109.25). A GPU with
    more bandwidth per SM wants more bytes in flight, so the default stays two per SM."""
    if problem.paged or problem.batch_invariant:
        return PROGRAMS_PER_SM
    span, units, num_sms = problem.span, problem.work_units(block_m), problem.num_sms
    splits, keys = planned_split(span, units, num_sms, PROGRAMS_PER_SM)
    if splits >= HALVED_MIN_SPLITS and keys <= SPLIT_GRANULE:
        return 1
    target = problem.target
    if problem.cache_dtype in FP8_DTYPES and target is not None and target.name in FP8_ONE_PROGRAM_PER_SM_GPUS:
        halved_splits, halved_keys = planned_split(span, units, num_sms, 1)
        if halved_splits < splits and halved_keys >= FP8_HALVED_MIN_KEYS:
            return 1
    return PROGRAMS_PER_SM
