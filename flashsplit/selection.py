"""Which backend ``backend="auto"`` runs: the rules, their thresholds and the measurements behind them.

The rules are tried in order; the first whose condition holds names the backend that was measured
faster for such problems. If that backend cannot run the problem here (``supports()`` refused
it: no Hopper GPU, cutlass missing, a head dim it lacks), the other able backend runs it.
:func:`flashsplit.plan` reports the rule that fired (``SplitPlan.rule``) and why.

On a GPU model with a measured table (:mod:`flashsplit.measured_table`: both backends timed over
a grid of head dims, head counts, batches, lengths, query rows, pages and fp8; the H200's and the
H100's (SXM, 80 GB) ship with flashsplit, ``flashsplit tune`` writes one for any GPU), the
measured rule decides every problem of a class it timed, after the rules about features the
table does not time. The hand rules after it decide the rest: fp8 pages, GPUs without a table.
Batch-invariant decodes are decided by the first rule, from no fact that follows the batch.

=====================  ========  ===================================================================
rule                   backend   when (all measured on an H200, 32/8 heads, bf16, CUDA-graph replay)
=====================  ========  ===================================================================
``batch-invariant``    triton    every batch-invariant decode: the promise (a row's bits do not
                                 follow the batch size, the other rows, the row's position, the
                                 capacity, dense or paged) holds per backend, so the choice
                                 between them may follow none of these either. No table times this
                                 path; one constant backend, the one that runs every head dim,
                                 dtype and page size at its usual speed (cute's gathered pages take
                                 1.7-2.4x its dense time). Measured against cute on the batch-
                                 invariant path (dense, d = 128): cute 0.96-1.01x Triton's time.
``cache-update``       triton    a call that appends new keys (``k``/``v``, with or without rotary),
                                 or reads rows through ``cache_leftpad`` or ``cache_batch_idx``:
                                 Triton writes the new keys inside its split kernel (one token
                                 adds 0.6-0.7 us at B = 1, 16k-128k, 0.3% at B = 16 x 16k), where
                                 cute runs a separate update kernel first; cute's padded and
                                 indexed rows are not timed.
``paged-gathered``     triton    paged KV whose page size the cute TMA cannot load (neither a
                                 multiple of its KV tile nor 8/16/32 keys): cute copies such pages
                                 row by row, 1.7-2.4x the dense time; Triton 1.11-1.18x.
``paged-tma``          cute      a paged 16-bit cache in TMA pages: cute reads them at dense speed
                                 (pages of 128 1.00x, of 16 1.00-1.01x), Triton 1.06-1.22x.
``short-span``         triton    a dense cache whose rows' splits cover at most :data:`SHORT_SPAN_KEYS`
                                 keys (a short cache, or a window of up to 128 keys at one query):
                                 cute's fixed start outweighs the keys (129-key cache, B = 1 5.9 vs
                                 7.1 us, B = 16 7.6 vs 8.8; a 128-key window over 4k keys, B = 1
                                 5.8 vs 7.4, over 16k, B = 16 7.2 vs 8.3); at 1k keys cute is
                                 ahead (B = 1 7.0 vs 7.9).
``measured``           either    a GPU with a measured table, a problem of a class it timed (head dim,
                                 16-bit or fp8, dense or paged), not batch-invariant: the faster
                                 backend of the problem's own measured cell, or else of the
                                 nearest cells (:func:`flashsplit.measured_table.vote`). On the
                                 H200 table the hand rules below picked the slower backend by more
                                 than 2% in 80 of 585 cells (up to 1.39x); the vote in 9 of 155
                                 cells measured off that grid (up to 1.115x), and with each of the
                                 table's 1151 cells left out in turn, in 87 (up to 1.39x). On the
                                 H100 the hand rules miss by more than 2% in 175 of the default
                                 grid's 907 cells (up to 1.30x); the vote misses in 14 of 155 cells
                                 off the grid (up to 1.07x), and left out in turn in 60 of 1261 (up
                                 to 1.30x).
``one-cta-per-sm``     cute      a dense (or TMA-paged) 16-bit cache at d = 128 whose CTAs fit one
                                 wave of one CTA per SM with >= 2k keys each (the cute deep-pipeline
                                 tile: B = 16 x 4k 64.4-64.6 vs Triton 66.3-67.4 us; 32/32 heads B =
                                 3 x 300k 3299 vs 3314); not batch-invariant (that tile follows the
                                 batch).
``swapped-operands``   cute      a dense 16-bit cache at d = 128 with 1-8 packed q rows per KV head
                                 in one wave (cute's swapped-operand kernel: B = 1 x 4k 9.69 vs
                                 10.29 us, 16k 21.30 vs 22.82, B = 4 x 4k 21.31 vs 22.18); not
                                 batch-invariant, which cute runs on its 64-row kernel.
``wide-rows``          triton    a dense 16-bit cache (d = 64, 96, 128, 256) with more than
                                 ``SWAP_AB_ROWS`` (8) packed rows, past the swapped-operand kernel,
                                 under :data:`FILL_UNITS` batch rows x KV heads: Triton's 16-row
                                 tile beat cute's 64-row one (32/8 heads, 4 causal queries: B = 1 x
                                 16k 23.2 vs 25.7 us, B = 4 x 4k 23.0 vs 28.1; 64/4 heads B = 4 x 4k
                                 1.40x); from 64 units cute led (64/4 heads B = 16 x 1k-16k by
                                 1.03-1.25x). At d = 64 and 256 too: in those 110 cells of each
                                 table cute took a median 1.02x Triton's time on the H200 (faster
                                 by over 2% in 44) and 1.05x on the H100 (in 13), up to 1.8x where
                                 the rule for d = 64 and 256 sent them to cute; with this rule, the
                                 hand rules' worst pick over each whole table fell from 1.80x to
                                 1.39x (H200) and 1.81x to 1.30x (H100), their mean excess over the
                                 faster backend from 2.3% to 1.7% and 2.1% to 1.1%.
``many-short-rows``    triton    a dense 16-bit cache at d = 128, >= :data:`MIN_PACKED_ROWS` packed
                                 rows, >= :data:`SHORT_ROWS_UNITS` work units, a span of at most
                                 :data:`SHORT_ROWS_SPAN` keys (B = 64 x 1k 62.8 vs 64.5 us; from 4k
                                 keys the two are within 0.2%).
``gqa-fills-machine``  cute      a dense 16-bit cache at d = 128, >= :data:`MIN_PACKED_ROWS` packed
                                 rows, >= :data:`FILL_UNITS` work units (B = 8 x 4k 38.0 vs 38.9 us,
                                 B = 64 x 16k 938.1 vs 940.8).
``long-splits``        cute      a dense 16-bit cache at d = 128, >= :data:`MIN_PACKED_ROWS` packed
                                 rows, splits of >= :data:`LONG_SPLIT_KEYS` keys (B = 1 x 128k 124.1
                                 vs 124.9 us; B = 1 x 16k, 512-key splits, 22.36 vs 22.71).
``short-gqa-d96``      cute      a dense 16-bit cache at d = 96, >= :data:`MIN_PACKED_ROWS` packed
                                 rows, fewer than :data:`FILL_UNITS` work units, a span of at most
                                 :data:`SHORT_SPAN_D96` keys (B = 1 x 4k 10.0 vs 10.7 us, 16k 19.5
                                 vs 20.8, B = 4 x 16k 55.2 vs 57.2; at 128k, or B >= 16, Triton
                                 was 1-18% faster; 32/32 heads: Triton), and at most
                                 ``SWAP_AB_ROWS`` (8) packed rows (with more, cute's 64-row tile
                                 took a median 1.20x Triton's time in the 33 such cells of the H200
                                 table and 1.15x in the H100's, up to 1.95x / 2.00x: 16/2 heads,
                                 4 causal queries, B = 1 x 1k, 9.46 vs 18.96 us on the H100); or,
                                 from :data:`FILL_UNITS`, work that cute runs unsplit
                                 (``cute.choice.fills_unsplit``; B = 16 x 1k 17.0 vs 20.0).
``mha-many-waves``     cute      a dense 16-bit cache at d = 128, fewer than :data:`MIN_PACKED_ROWS`
                                 packed rows (MHA), >= :data:`MHA_CUTE_UNITS` work units (32/32
                                 heads, B = 64: 1k 240.2 vs 245.8 us, 4k 935.3 vs 960.0, 16k 3777
                                 vs 3852, 64k 14943 vs 15155; at B = 16, 512 units, Triton led by
                                 0.2-1.9%).
``short-wide-d64``     triton    a dense 16-bit cache at d = 64, >= :data:`WIDE_GROUP_ROWS` packed
                                 rows, a span of at most :data:`SHORT_SPAN_D64` keys (64/8 heads at
                                 1k keys: B = 1 6.2 vs 7.0 us, B = 64 37.7 vs 38.3; from 4k keys
                                 cute leads), but for work that fills one CTA per SM and not two,
                                 which cute runs unsplit (``cute.choice.fills_unsplit``; B = 16 x
                                 1k: 11.3 vs Triton's 13.8).
``mha-d256-mid-batch`` triton    a dense 16-bit cache at d = 256, one packed row (MHA at L_q = 1),
                                 :data:`MHA_D256_UNITS` work units (16/16 heads, B = 16: 1k 67.5 vs
                                 69.8 us, 4k 244.2 vs 247.4, 128k 7679 vs 7746; at B = 1 and 64
                                 cute leads by up to 1.20x, and with two packed rows, 16/8 heads
                                 at B = 64 (512 units), by 1.08-1.16x; 32/32 heads at B = 16, 512
                                 units, took Triton 1.13-1.22x cute's time on the H200 at 1k-16k
                                 keys, 2375 vs 1948 us at 16k, and 1.10-1.13x on the H100).
``d64-d256``           cute      a dense 16-bit cache at d = 64 or 256: cute led in 58 of 71 cells
                                 (32/8, 32/32, 64/8 heads at d = 64; 16/2, 16/8, 16/16 at d = 256;
                                 B 1, 16, 64 x 1k-128k), by up to 1.46x (16/2 heads, B = 1 x 16k:
                                 14.4 vs 21.1 us; 32/8 d = 64 B = 16 x 128k 992 vs 1107), and
                                 outside the two rules above Triton led by at most 1.2%.
``default``            triton    everything else: fp8 caches (cute's swapped-operand consumer runs
                                 them at 0.99-1.03x Triton's time, its 64-row kernel at 1.05-1.14x:
                                 an H100, B = 1 x 4k-128k, B = 16 x 128k), other head dims, one q
                                 row per KV head in several waves (32/32 heads B = 16 x 16k: 935.6
                                 vs 957.7 us).
=====================  ========  ===================================================================
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from . import measured_table
from .plan import choose_num_splits, tokens_per_split
from .problem import DecodeProblem

#: ``short-span``: spans (keys a row's splits cover, :attr:`DecodeProblem.span`) up to this many:
#: two granules, what a 128-key window at one query spans.
SHORT_SPAN_KEYS = 256
#: ``many-short-rows``: from this many work units (B = 64 x 8 KV heads), spans up to this many keys.
SHORT_ROWS_UNITS = 512
SHORT_ROWS_SPAN = 1024
#: ``gqa-fills-machine``: from this many work units (batch rows x KV heads x row blocks of 64).
FILL_UNITS = 64
#: ``long-splits``: from this many keys per split, as the plan splits the problem for cute.
LONG_SPLIT_KEYS = 512
#: ``short-gqa-d96``: spans (keys a row's splits cover) up to this many.
SHORT_SPAN_D96 = 32768
#: ``mha-many-waves``: from this many work units (B = 64 x 32 KV heads).
MHA_CUTE_UNITS = 2048
#: ``short-wide-d64``: from this many packed rows (64/8 heads), spans up to this many keys.
WIDE_GROUP_ROWS = 8
SHORT_SPAN_D64 = 1024
#: ``mha-d256-mid-batch``: work units in this range (B = 16 x 16 KV heads: 256; at 512, cute led).
MHA_D256_UNITS = range(256, 512)
#: ``gqa-fills-machine`` / ``long-splits``: at least this many packed rows (L_q x q heads per KV head);
#: with fewer, the 64-row tile is mostly padding and Triton's 16-row tile was faster.
MIN_PACKED_ROWS = 4


@dataclass(frozen=True)
class Rule:
    """One selection rule: the first rule that ``applies`` to a problem picks ``backend``."""

    name: str
    backend: str
    why: str
    applies: Callable[[DecodeProblem], bool]

    def pick(self, problem: DecodeProblem) -> tuple[str, str] | None:
        """``(backend, why)`` if this rule decides ``problem``, else None."""
        return (self.backend, self.why) if self.applies(problem) else None


@dataclass(frozen=True)
class MeasuredRule:
    """The ``measured`` rule: the vote of the nearest cells of this GPU's measured table."""

    name: str = "measured"
    backend: str = "either"
    why: str = "the faster backend of the nearest cells measured on this GPU"

    def pick(self, problem: DecodeProblem) -> tuple[str, str] | None:
        vote = measured_table.vote(problem)
        return None if vote is None else (vote.backend, vote.describe())


def _dense_16bit(problem: DecodeProblem, head_dims: tuple[int, ...]) -> bool:
    return problem.head_dim in head_dims and problem.cache_dtype == problem.dtype and not problem.paged


def _dense_16bit_d128(problem: DecodeProblem) -> bool:
    return _dense_16bit(problem, (128,))


def _short_gqa_d96(problem: DecodeProblem) -> bool:
    from .cute import choice, configs

    if not (_dense_16bit(problem, (96,)) and problem.packed_rows >= MIN_PACKED_ROWS):
        return False
    return ((problem.work_units(64) < FILL_UNITS and problem.span <= SHORT_SPAN_D96
             and problem.packed_rows <= configs.SWAP_AB_ROWS)
            or choice.fills_unsplit(problem, problem.num_sms))


def _cute_units(problem: DecodeProblem) -> tuple[int, int, int]:
    """(work units, CTAs per SM, split count) as the plan splits ``problem`` on cute (its
    ``units_per_sm``: the two-CTA tile's, or one where cute runs the problem unsplit)."""
    from .cute import choice

    units = problem.work_units(choice.BLOCK_M)
    per_sm = choice.units_per_sm(problem, problem.num_sms)
    splits = choose_num_splits(units, problem.span, problem.num_sms, per_sm)[0]
    return units, per_sm, splits


def _paged_gathered(problem: DecodeProblem) -> bool:
    from .cute import configs

    return problem.paged and problem.head_dim in configs.HEAD_DIMS and not configs.tma_pages(problem.page_size,
                                                                                               problem.head_dim)


def _paged_tma(problem: DecodeProblem) -> bool:
    from .problem import FP8_DTYPES

    return problem.paged and problem.cache_dtype not in FP8_DTYPES


def _short_span(problem: DecodeProblem) -> bool:
    return not problem.paged and problem.span <= SHORT_SPAN_KEYS


def _one_cta_per_sm(problem: DecodeProblem) -> bool:
    from .cute import choice

    return choice.one_cta_per_sm(problem, problem.num_sms)


def _swapped_operands(problem: DecodeProblem) -> bool:
    from .cute import choice

    if not _dense_16bit_d128(problem):
        return False
    units, per_sm, splits = _cute_units(problem)
    return choice.swaps(problem.packed_rows, "same", None, 128, units * splits, per_sm, problem.num_sms)


def _wide_rows(problem: DecodeProblem) -> bool:
    from .cute import configs

    return (_dense_16bit(problem, configs.HEAD_DIMS) and problem.packed_rows > configs.SWAP_AB_ROWS
            and problem.batch * problem.num_heads_kv < FILL_UNITS)


def _many_short_rows(problem: DecodeProblem) -> bool:
    return (_dense_16bit_d128(problem) and problem.packed_rows >= MIN_PACKED_ROWS
            and problem.work_units(64) >= SHORT_ROWS_UNITS and problem.span <= SHORT_ROWS_SPAN)


def _gqa_fills_machine(problem: DecodeProblem) -> bool:
    return (_dense_16bit_d128(problem) and problem.packed_rows >= MIN_PACKED_ROWS
            and problem.work_units(64) >= FILL_UNITS)


def _long_splits(problem: DecodeProblem) -> bool:
    if not (_dense_16bit_d128(problem) and problem.packed_rows >= MIN_PACKED_ROWS):
        return False
    splits = _cute_units(problem)[2]
    return tokens_per_split(problem.span, splits) >= LONG_SPLIT_KEYS


def _mha_many_waves(problem: DecodeProblem) -> bool:
    return (_dense_16bit_d128(problem) and problem.packed_rows < MIN_PACKED_ROWS
            and problem.work_units(64) >= MHA_CUTE_UNITS)


def _short_wide_d64(problem: DecodeProblem) -> bool:
    from .cute import choice

    return (_dense_16bit(problem, (64,)) and problem.packed_rows >= WIDE_GROUP_ROWS
            and problem.span <= SHORT_SPAN_D64 and not choice.fills_unsplit(problem, problem.num_sms))


def _mha_d256_mid_batch(problem: DecodeProblem) -> bool:
    return (_dense_16bit(problem, (256,)) and problem.packed_rows == 1
            and problem.work_units(64) in MHA_D256_UNITS)


def _d64_d256(problem: DecodeProblem) -> bool:
    return _dense_16bit(problem, (64, 256))


def _batch_invariant(problem: DecodeProblem) -> bool:
    return problem.batch_invariant


def _cache_update(problem: DecodeProblem) -> bool:
    return problem.has_new_kv or problem.has_leftpad or problem.has_batch_idx


RULES: tuple[Rule | MeasuredRule, ...] = (
    Rule("batch-invariant", "triton", "batch-invariant decode: one backend whatever the batch, capacity or "
         "cache layout", _batch_invariant),
    Rule("cache-update", "triton", "new keys appended inside the split kernel (cute writes them in a kernel of "
         "their own)", _cache_update),
    Rule("paged-gathered", "triton", "pages cute cannot load by TMA (it would copy them row by row)",
         _paged_gathered),
    Rule("paged-tma", "cute", "a paged 16-bit cache in TMA pages (read at dense speed)", _paged_tma),
    Rule("short-span", "triton", f"splits covering <= {SHORT_SPAN_KEYS} keys (cute's fixed start outweighs them)",
         _short_span),
    MeasuredRule(),
    Rule("one-cta-per-sm", "cute", "one wave of one deep-pipeline CTA per SM", _one_cta_per_sm),
    Rule("swapped-operands", "cute", "1-8 packed q rows per KV head in one wave (swapped wgmma operands)",
         _swapped_operands),
    Rule("wide-rows", "triton", f"more packed rows than the swapped-operand kernel takes, < {FILL_UNITS} batch rows "
         "x KV heads (Triton's 16-row tile)", _wide_rows),
    Rule("many-short-rows", "triton", f">= {SHORT_ROWS_UNITS} work units over <= {SHORT_ROWS_SPAN} keys",
         _many_short_rows),
    Rule("gqa-fills-machine", "cute", f">= {MIN_PACKED_ROWS} packed rows and >= {FILL_UNITS} work units",
         _gqa_fills_machine),
    Rule("long-splits", "cute", f">= {MIN_PACKED_ROWS} packed rows and splits of >= {LONG_SPLIT_KEYS} keys",
         _long_splits),
    Rule("short-gqa-d96", "cute", f"d = 96, >= {MIN_PACKED_ROWS} packed rows, < {FILL_UNITS} work units, "
         f"<= {SHORT_SPAN_D96} keys, or work cute runs unsplit", _short_gqa_d96),
    Rule("mha-many-waves", "cute", f"< {MIN_PACKED_ROWS} packed rows and >= {MHA_CUTE_UNITS} work units",
         _mha_many_waves),
    Rule("short-wide-d64", "triton", f"d = 64, >= {WIDE_GROUP_ROWS} packed rows, <= {SHORT_SPAN_D64} keys, "
         "but work that fills one CTA per SM and not two (cute runs it unsplit)",
         _short_wide_d64),
    Rule("mha-d256-mid-batch", "triton", f"d = 256, one packed row (MHA), {MHA_D256_UNITS.start}-"
         f"{MHA_D256_UNITS.stop - 1} work units", _mha_d256_mid_batch),
    Rule("d64-d256", "cute", "a dense 16-bit cache at d = 64 or 256", _d64_d256),
    Rule("default", "triton", "measured as fast or faster for everything else", lambda problem: True),
)


def decide(problem: DecodeProblem) -> tuple[Rule | MeasuredRule, str, str]:
    """``(rule, backend, why)``: the first rule of :data:`RULES` that decides ``problem``."""
    for rule in RULES:
        picked = rule.pick(problem)
        if picked is not None:
            return rule, *picked
    raise AssertionError("the default rule decides every problem")


def rule_for(problem: DecodeProblem) -> Rule | MeasuredRule:
    """The first rule of :data:`RULES` that decides ``problem``."""
    return decide(problem)[0]


def choose(problem: DecodeProblem, able: Sequence) -> tuple[object, str, str]:
    """``(backend, rule name, reason)`` for ``problem`` among the backends in ``able`` (each with
    a ``name``; those whose ``supports()`` accepted the problem, best priority first)."""
    rule, backend, why = decide(problem)
    by_name = {b.name: b for b in able}
    if backend in by_name:
        return by_name[backend], rule.name, f"auto: {rule.name}: {why}"
    fallback = able[0]
    return fallback, rule.name, (f"auto: {rule.name} would take {backend}, which cannot run it here; "
                                 f"{fallback.name} can")
