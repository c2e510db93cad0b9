"""The cute backend's launch choices for a problem: which kernel variant runs, and why.

Pure Python (no cutlass import), so a plan can be made for a named GPU from a machine without
one: every rule takes the :class:`~flashsplit.problem.DecodeProblem` and the machine's SM count.
Each threshold sits beside the measurement behind it. :func:`choose` resolves one launch into a
:class:`LaunchChoice`; :func:`units_per_sm` is what the plan divides the machine by. Which
backend ``auto`` runs is :mod:`flashsplit.selection`'s rule (it asks these functions).
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import plan
from ..plan import BUSY_FRACTION
from ..problem import FP8_DTYPES, DecodeProblem
from ..target import KNOWN_GPUS
from . import configs

#: Packed q rows of the 64-row kernel's work units (the plan's ``block_m``).
BLOCK_M = 64

#: Launches of 2..MERGE_MAX_SPLITS splits merge in the split kernel's tail (one launch), more
#: keep the combine kernel. H200, 32/8 heads, d = 128, same runs, merged vs combine kernel:
#: 2 splits 67.7 vs 68.9 us (B = 16, 4k),
#: 8 splits 23.4 vs 24.7 (B = 4, 4k), 16 splits 15.4 vs 16.1 (B = 2, 4k) and 38.3 vs 39.0
#: (16k); 32 splits 13.1 vs 12.7 (B = 1, 4k) and 126.1 vs 125.5 (128k): one warp per row walks
#: 32 splits in two register chunks, where the combine's 32 CTAs take one round trip each.
MERGE_MAX_SPLITS = 16

#: Keys per CTA (as the plan splits at one CTA per SM) from which :func:`one_cta_per_sm` takes
#: the one-CTA-per-SM tile: one split of >= 2k keys, or several of >= 16k. H200, same runs, us:
#: won at one split (B = 16 x 4k 64.4-64.6 vs 66.3-67.4 for Triton, B = 16 x 16k 238.9-240.8 vs
#: 241.8-246.0; 32/32 heads, B = 4 x 4k/16k 63.9/238.0 vs 64.8/239.7) and at 4 splits of 32k
#: (B = 4 x 128k 469.9-476.7 vs 475.1-485.1); mixed at 4-16 splits of 4k-8k keys (B = 1 x 128k
#: 126.1-126.7 vs 124.9-127.3, B = 4 x 16k 67.7-67.8 vs 66.7-68.0). Longer CTAs, interleaved
#: in one process against the two-CTA tile's plan: one split B = 16 x 64k / 128k / 256k 941.0 /
#: 1880.3 / 3759.5 vs 954.8 / 1902.6 / 3796.2 (two splits each); 40/8 and 64/8 heads B = 16 x 64k
#: 940.1 / 940.9 vs 956.1 / 956.5; 32/32 heads B = 4 x 64k / 128k 943.7 / 1884.3 vs 955.6 /
#: 1889.2; two splits of 64k (B = 8 x 128k) 943.8 vs 958.1 (four on the two-CTA tile).
ONE_PER_SM_MIN_KEYS = 2048
ONE_PER_SM_MIN_SPLIT_KEYS = 16384

#: Spans up to this many keys whose work units fill one CTA per SM (FA3's busy fraction of the
#: SMs) run unsplit on the two-CTA tile: the plan counts one CTA per SM for them (two would split
#: them in two and add the merge). H200, one run, 1 vs 2 splits, us: 32/8 heads, d = 128, B = 16 x
#: 512 / 1k keys 11.3 / 19.0 vs 13.2 / 21.3, B = 14 x 1k 17.2 vs 20.0; 32/32 heads B = 4 x 1k 18.8
#: vs 20.8; d = 64, 64/8 heads B = 16 x 1k 11.3 vs 14.6; d = 96, 32/8 B = 16 x 1k 17.0 vs 18.8;
#: d = 256 (whose tile holds one CTA per SM anyway), 16/8 B = 16 x 1k 34.0 vs 42.8. (Triton's
#: split kernel gains from the second split at 1k keys there: 20.4 vs 22.1 at B = 14.)
UNSPLIT_MAX_SPAN = 1024

#: Launches of at least this many KV heads and batch rows run their split CTAs KV heads first
#: (``SplitConfig.heads_first``): the CTAs of one batch row's heads then read the same key rows
#: side by side. H200, bf16, d = 128, splits first -> KV heads first, us: 32/32 heads B = 64 x
#: 1k / 4k / 16k 247.6 / 965.6 / 3837.8 -> 242.0 / 948.1 / 3793.8, B = 16 x 4k 244.2 -> 243.1;
#: with 8 KV heads within 0.5% either way (B = 64 x 4k 243.3 -> 242.4, 16k 960.9 -> 960.2,
#: B = 16 x 128k 1878.3 -> 1883.0), and B = 4 x 1k at 32/32 heads 18.59 -> 18.73.
HEADS_FIRST_MIN_KV_HEADS = 32
HEADS_FIRST_MIN_BATCH = 16

#: Forces the launch order of every launch (True: KV heads first, False: splits first); None:
#: :func:`launches_heads_first` decides.
HEADS_FIRST: bool | None = None

#: Launches of at most this many CTAs merge their splits through one thread-block cluster per
#: row tile (``SplitConfig.cluster``) where :func:`clusters` allows it, instead of the arrival
#: counter, over spans of at most :func:`cluster_max_span` keys. H200, bf16, B = 1 x 1k keys, 8
#: splits (64 CTAs), counter -> cluster, us: 32/8 heads d = 128 7.14 -> 6.56 (another run 7.10 ->
#: 6.54), 64/8 7.96 -> 7.30, 32/8 d = 64 6.21 -> 5.81. Every launch of 128 CTAs measured was
#: 1.38-1.54x slower with it: 32/8 heads B = 1 x 2k / 4k / 16k / 128k at 16 splits, B = 2 x 1k /
#: 4k at 8, 32/32 heads B = 1 x 1k at 4.
CLUSTER_MAX_CTAS = 64
#: Spans up to which a launch merges through a cluster (:func:`cluster_max_span`): on the H200
#: measured to 4k keys (32/8 heads B = 1, 8 splits with the cluster vs the plan's 16 with the
#: counter: 2k 7.66 vs 8.03 us, 4k 9.63 vs 9.73), on the H100 to 128k (same cells, interleaved:
#: 2k 7.68 vs 8.10, 4k 10.47 vs 10.78, 8k 16.28 vs 16.33, 16k 27.29 vs 27.98, 32k 47.74 vs 48.75,
#: 64k 90.95 vs 92.38, 128k 176.55 vs 176.99).
CLUSTER_MAX_SPAN = 4096
CLUSTER_MAX_SPAN_BY_GPU = {KNOWN_GPUS["h100"].name: 131072}

#: Splits of a launch whose row tiles take one cluster of this many splits each where the plan
#: would make more (:func:`cluster_split_cap`): 8 row tiles x 8 splits fill ``CLUSTER_MAX_CTAS``.
#: H100, interleaved, the plan's splits with the counter vs 8 with the cluster, us: 64/8 heads
#: B = 1 x 4k 11.49 vs 11.17 (32 splits), 16k 28.79 vs 27.82; 40/8 B = 1 x 4k 11.23 vs 10.97;
#: 32/8 d = 64 B = 1 x 4k 8.39 vs 7.87; 16/2 heads B = 4 x 4k 11.49 vs 11.29; 32/8 in pages of
#: 16, B = 1 x 4k, 11.42 vs 10.84; and the 32/8 B = 1 cells above. With fewer
#: row tiles the cluster's CTAs leave SMs idle: 28/4 heads B = 1 x 4k (32 CTAs) 9.48 vs 8.46.
#: Against the H100 table's earlier cells (separate runs, Triton's times as the drift's yardstick)
#: it lost by 1-5% at d = 64 with more than 4 packed rows over 4k-64k keys (40/8 heads B = 1 x
#: 4k: 8.44 -> 8.90 us, Triton 9.03 -> 9.09; 64/8, 16/2 at B = 4, 28/4 at B = 2 alike; at 128k
#: it won) and by up to 2% in pages at 128k keys (pages of 16: 185.4 -> 188.2 us, Triton 191.6
#: -> 190.8): those keep the plan's count.
CLUSTER_SPLITS = 8
CLUSTER_SPLITS_MAX_ROWS_D64 = 4
CLUSTER_SPLITS_MAX_PAGED_SPAN = 16384

#: Forces the merge of every launch that :func:`clusters` allows (True: through a cluster,
#: False: the arrival counter); None: :func:`merges_in_cluster` decides.
CLUSTER_MERGE: bool | None = None

#: Packed q rows per KV head up to which the swapped-operand kernel planned at one CTA per SM
#: may merge its splits in the kernel (:func:`swaps_one_per_sm`: with 5-8 rows it lost).
MERGE_ROWS_ONE_PER_SM = 4


@dataclass(frozen=True)
class LaunchChoice:
    """The kernel variant of one launch: the one-CTA-per-SM tile (``configs.ONE_PER_SM_TILE``)
    or the two-CTA one, ``configs.ONE_WAVE_STAGES`` (merging launches only), the last-CTA merge
    instead of a combine kernel, swapped operands (``SplitConfig.swap_rows``); ``split_ctas``: CTAs
    per row tile, each running a run of consecutive splits (batch-invariant decode,
    :func:`invariant_split_ctas`; 0: one CTA per split); ``heads_first``: the CTAs' launch order
    (``SplitConfig.heads_first``); ``cluster``: the merge runs through one cluster of the
    launch's splits (``SplitConfig.cluster``)."""

    one_per_sm: bool
    one_wave: bool
    merge: bool
    swap: bool
    split_ctas: int = 0
    heads_first: bool = False
    cluster: bool = False


def invariant_split_ctas(units: int, num_splits: int, units_per_sm: int, num_sms: int) -> int:
    """CTAs per row tile of a batch-invariant launch of ``num_splits`` fixed-length splits over
    ``units`` row tiles: the most that fit one wave (at least 1), each CTA running
    ``ceil(num_splits / ctas)`` consecutive splits. A CTA computes each of its splits exactly
    as a CTA of one split would, so this follows the batch without changing any result: at B =
    16 x 16k keys (32/8 heads) the 32 splits of 512 keys of a row run on 2 CTAs, not 32.

    >>> invariant_split_ctas(8, 32, 2, 132), invariant_split_ctas(32, 32, 2, 132), invariant_split_ctas(512, 32, 2, 132)
    (32, 8, 1)
    """
    per_cta = -(-num_splits // max(1, units_per_sm * num_sms // units))
    return -(-num_splits // per_cta)


def kv_dtype_name(problem: DecodeProblem) -> str:
    """The compile key's cache type: "same" (q's 16-bit dtype) or the fp8 dtype's name."""
    return str(problem.cache_dtype).removeprefix("torch.") if problem.cache_dtype in FP8_DTYPES else "same"


def dense_16bit_d128(problem: DecodeProblem) -> bool:
    """A dense (not paged) cache in q's 16-bit dtype at d = 128: where the measured dispatch rules
    for the two-CTA tile apply."""
    return problem.head_dim == 128 and problem.cache_dtype == problem.dtype and not problem.paged


def fits_one_wave(ctas: int, units_per_sm: int, num_sms: int) -> bool:
    """Whether ``ctas`` CTAs run in one wave at ``units_per_sm`` per SM of ``num_sms`` SMs."""
    return ctas <= units_per_sm * num_sms


def planned_split(problem: DecodeProblem, units: int, units_per_sm: int, num_sms: int) -> tuple[int, int]:
    """(splits, keys per split) the shared plan gives ``problem``'s ``units`` work units at
    ``units_per_sm`` CTAs per SM: what the rules below judge a tile choice by."""
    return plan.planned_split(problem.span, units, num_sms, units_per_sm)


def merges(num_splits: int, max_splits: int = MERGE_MAX_SPLITS) -> bool:
    """Whether a launch of ``num_splits`` splits merges them in the split kernel's tail
    (2..``max_splits``) instead of a combine."""
    return 1 < num_splits <= max_splits


def swaps(packed_rows: int, kv_dtype: str, page_size: int | None, head_dim: int, ctas: int, units_per_sm: int,
          num_sms: int) -> bool:
    """Whether a launch of ``ctas`` CTAs (``units_per_sm`` per SM) takes the swapped-operand
    kernel: ``configs.swap_ab_applies``, and one wave. H200, 32/8 heads, d = 128,
    bf16, same run, us, swapped / 64 rows / Triton: one wave, B = 1
    x 4k 9.69 / 10.80 / 10.29, 16k 21.30 / 22.03 / 22.82, B = 4 x 4k 21.31 / 21.65 / 22.18, B = 16
    x 128k 1906.5 / 1917.5 / 1906.3 (32/32 heads: B = 1 x 4k 20.65 / 21.42 / 21.48, B = 4 x 4k
    62.6 / 63.8 / 65.6); two waves, where each CTA streams its keys and the tensor work hides
    behind the loads anyway: B = 64 x 4k 245.3 / 244.9 / 243.9, 16k 962.0 / 961.4 / 962.5."""
    if not configs.swap_ab_applies(packed_rows, kv_dtype, page_size, head_dim):
        return False
    return fits_one_wave(ctas, units_per_sm, num_sms)


def one_cta_per_sm(problem: DecodeProblem, num_sms: int) -> bool:
    """Whether the one-CTA-per-SM tile (``configs.ONE_PER_SM_TILE``) serves ``problem``: a
    16-bit cache at d = 128, dense or in TMA pages, whose (batch row, KV head, row block) units
    fit one wave of one CTA per SM, split as the plan splits them there into one split of at
    least ``ONE_PER_SM_MIN_KEYS`` keys per CTA, or several of at least
    ``ONE_PER_SM_MIN_SPLIT_KEYS`` (where it was measured faster); never for a batch-invariant
    decode (the rule follows the batch)."""
    if problem.head_dim != 128 or problem.cache_dtype != problem.dtype or problem.batch_invariant:
        return False
    if problem.paged and not configs.tma_pages(problem.page_size, 128):
        return False
    units = problem.work_units(BLOCK_M)
    if not fits_one_wave(units, configs.ONE_PER_SM_TILE[2], num_sms):
        return False
    splits, keys = planned_split(problem, units, configs.ONE_PER_SM_TILE[2], num_sms)
    return keys >= (ONE_PER_SM_MIN_KEYS if splits == 1 else ONE_PER_SM_MIN_SPLIT_KEYS)


def one_wave_merge(problem: DecodeProblem, num_splits: int, num_sms: int, max_splits: int = MERGE_MAX_SPLITS) -> bool:
    """Whether a launch of ``num_splits`` splits takes ``configs.ONE_WAVE_STAGES``: a dense
    16-bit cache at d = 128 on the two-CTA tile, whose 2..``max_splits`` splits merge in the
    kernel and whose CTAs fit one wave at two per SM (where 3 stages measured faster)."""
    if not (dense_16bit_d128(problem) and merges(num_splits, max_splits)) or one_cta_per_sm(problem, num_sms):
        return False
    ctas = problem.work_units(BLOCK_M) * num_splits
    return fits_one_wave(ctas, configs.split_tile(128)[2], num_sms)


def fills_unsplit(problem: DecodeProblem, num_sms: int) -> bool:
    """Whether ``problem`` (a dense 16-bit cache, where it was measured) spans at most
    ``UNSPLIT_MAX_SPAN`` keys and its work units on cute's 64-row tile fill one CTA per SM but
    not the two-CTA tile's slots (where the plan would split them): then it runs unsplit
    (:func:`units_per_sm`)."""
    if problem.cache_dtype != problem.dtype or problem.paged or problem.span > UNSPLIT_MAX_SPAN:
        return False
    return BUSY_FRACTION * num_sms <= problem.work_units(BLOCK_M) < BUSY_FRACTION * num_sms * _tile_units(problem)


def swaps_one_per_sm(problem: DecodeProblem, num_sms: int) -> bool:
    """Whether ``problem`` runs on the swapped-operand two-CTA tile planned at one CTA per SM
    (:func:`units_per_sm` 1: half the splits of two per SM): a dense 16-bit cache at d = 128 with
    1-8 packed rows per KV head (``configs.swap_ab_applies``), not batch-invariant, whose CTAs,
    split as the plan splits them at one CTA per SM, fit one CTA per SM (the plan may fill two
    waves of one there, which the two-CTA tile runs as one wave of two: then it plans two per SM,
    as before); with more than ``MERGE_ROWS_ONE_PER_SM`` packed rows only where those splits still
    go to the combine kernel (more than ``MERGE_MAX_SPLITS``).

    H200, bf16, interleaved graph replays in one process, us, one vs two CTAs per SM: 32/8 heads
    B = 1 x 4k 9.59 vs 9.80 (16 vs 32 splits), 16k 21.10 vs 21.49, 64k 65.05 vs 66.44, 128k
    123.85 vs 124.76; B = 4 x 4k 20.91 vs 21.25 (4 vs 8), 16k 64.00 vs 64.78; B = 8 x 1k / 4k /
    16k 13.38 / 35.30 / 121.72 vs 13.44 / 35.84 / 122.24 (2 vs 4); 32/32 heads B = 1 x 4k 20.56 vs
    20.78 (4 vs 8), B = 2 x 4k 34.80 vs 35.16 (2 vs 4); combined splits, 28/4 heads B = 1 x 16k /
    128k 13.24 / 64.34 vs 13.85 / 65.76 (32 vs 64), 16/2 B = 1 x 128k 36.30 vs 37.69 (64 vs 128),
    8/1 B = 1 x 300k 42.95 vs 44.95. With 5-8 rows, 16 splits merged in the kernel lost to 32
    combined: 40/8 / 48/8 / 64/8 heads B = 1 x 4k 10.57 / 10.53 / 10.64 vs 9.85 / 9.89 / 9.95,
    16k (40/8, 64/8) 22.27 / 22.34 vs 21.58 / 21.77."""
    if not dense_16bit_d128(problem) or problem.batch_invariant:
        return False
    if not configs.swap_ab_applies(problem.packed_rows, "same", None, 128):
        return False
    units = problem.work_units(BLOCK_M)
    splits = planned_split(problem, units, 1, num_sms)[0]
    if problem.packed_rows > MERGE_ROWS_ONE_PER_SM and merges(splits):
        return False
    return units * splits <= num_sms


def _tile_units(problem: DecodeProblem) -> int:
    """CTAs per SM of the two-CTA tile at ``problem``'s head dim (1 where cute has no tile)."""
    return configs.split_tile(problem.head_dim)[2] if problem.head_dim in configs.HEAD_DIMS else 1


def units_per_sm(problem: DecodeProblem, num_sms: int) -> int:
    """CTAs per SM the plan divides the machine by: the tile's (``problem`` runs on the
    one-CTA-per-SM tile, or on the two-CTA one), but one for a short span that fills one CTA per
    SM (:func:`fills_unsplit`: unsplit, on the two-CTA tile) and for the swapped-operand kernel
    in one wave of one CTA per SM (:func:`swaps_one_per_sm`)."""
    if one_cta_per_sm(problem, num_sms):
        return configs.ONE_PER_SM_TILE[2]
    if fills_unsplit(problem, num_sms) or swaps_one_per_sm(problem, num_sms):
        return 1
    return _tile_units(problem)


def choose(problem: DecodeProblem, num_splits: int, num_sms: int, max_splits: int = MERGE_MAX_SPLITS, *,
           one_per_sm: bool | None = None, one_wave: bool | None = None, swap: bool | None = None,
           heads_first: bool | None = None, cluster: bool | None = None) -> LaunchChoice:
    """The kernel variant of a launch of ``num_splits`` splits: each of ``one_per_sm``,
    ``one_wave``, ``swap``, ``heads_first`` and ``cluster`` as its rule above decides (None) or
    as given (a cluster where :func:`clusters` refuses it is not taken; it takes splits first
    and no one-wave stages). The merge follows
    the split count (:func:`merges`); one-wave stages apply to merging launches only; swapped
    operands are judged on the tile's CTAs per SM. A batch-invariant decode always takes the
    two-CTA tile with the combine kernel, unswapped: each of these rules follows the launch's
    size, which follows the batch (its CTAs' runs of splits follow it too, but change no result)."""
    forced_order = one_wave is True or heads_first is True  # a rule's cluster never overrides these
    if heads_first is None:
        heads_first = launches_heads_first(problem) if HEADS_FIRST is None else HEADS_FIRST
    if problem.batch_invariant:
        ctas = invariant_split_ctas(problem.work_units(BLOCK_M), num_splits, configs.split_tile(problem.head_dim)[2],
                                    num_sms) if problem.head_dim in configs.HEAD_DIMS else 0
        return LaunchChoice(one_per_sm=False, one_wave=False, merge=False, swap=False, split_ctas=ctas,
                            heads_first=heads_first)
    merge = merges(num_splits, max_splits)
    if one_per_sm is None:
        one_per_sm = one_cta_per_sm(problem, num_sms)
    if one_wave is None:
        one_wave = not one_per_sm and one_wave_merge(problem, num_splits, num_sms, max_splits)
    one_wave = one_wave and merge
    if swap is None and problem.head_dim not in configs.HEAD_DIMS:
        swap = False  # (no cute tile: supports() refuses such a problem)
    if swap is None:
        tile_units = configs.ONE_PER_SM_TILE[2] if one_per_sm else configs.split_tile(problem.head_dim)[2]
        ctas = problem.batch * problem.num_heads_kv * num_splits
        swap = swaps(problem.packed_rows, kv_dtype_name(problem), problem.page_size or None, problem.head_dim, ctas,
                     tile_units, num_sms)
    if cluster is None:
        cluster = (not forced_order and merges_in_cluster(problem, num_splits)) if CLUSTER_MERGE is None \
            else CLUSTER_MERGE
    cluster = cluster and clusters(problem, num_splits, num_sms, merge, swap)
    if cluster:
        one_wave = heads_first = False
    return LaunchChoice(one_per_sm, one_wave, merge, swap, heads_first=heads_first, cluster=cluster)


def merges_in_cluster(problem: DecodeProblem, num_splits: int) -> bool:
    """Whether a launch that :func:`clusters` allows merges through the cluster by the rule:
    ``CLUSTER_MAX_CTAS`` and :func:`cluster_max_span`, for the attention the cluster merge's GPU tests
    run bit for bit against the counter (a 16-bit cache, causal or not, sinks, pages; no window,
    softcap, ``cache_leftpad`` or ``cache_batch_idx``)."""
    v = problem.variant
    # (causal, right bound 0, masks nothing for a single query)
    no_right_bound = v.window_right < 0 or (v.window_right == 0 and problem.seqlen_q == 1)
    tested = (kv_dtype_name(problem) == "same" and v.window_left < 0 and no_right_bound and not v.softcap
              and not v.has_leftpad and not v.has_batch_idx)
    return (tested and problem.batch * problem.num_heads_kv * num_splits <= CLUSTER_MAX_CTAS
            and problem.span <= cluster_max_span(problem))


def cluster_max_span(problem: DecodeProblem) -> int:
    """The longest span whose launch merges through a cluster by the rule on ``problem``'s GPU:
    ``CLUSTER_MAX_SPAN_BY_GPU``'s where measured further, else ``CLUSTER_MAX_SPAN``."""
    target = problem.target
    return CLUSTER_MAX_SPAN_BY_GPU.get(target.name if target is not None else "", CLUSTER_MAX_SPAN)


def cluster_split_cap(problem: DecodeProblem, num_sms: int) -> int | None:
    """``CLUSTER_SPLITS`` where the plan should stop at that many splits so that each row tile's
    splits merge through one cluster: a problem whose row tiles times ``CLUSTER_SPLITS`` are
    exactly ``CLUSTER_MAX_CTAS`` CTAs and whose launch of that many splits :func:`choose` merges
    through a cluster, at d = 64 with at most ``CLUSTER_SPLITS_MAX_ROWS_D64`` packed rows, in
    pages over at most ``CLUSTER_SPLITS_MAX_PAGED_SPAN`` keys; None otherwise (the plan's own
    count stands).

    >>> def b1(heads, heads_kv):
    ...     return DecodeProblem(batch=1, seqlen_q=1, seqlen_k=4096, num_heads=heads, num_heads_kv=heads_kv,
    ...                          head_dim=128, dtype=None, causal=False, has_cache_seqlens=True, device_type="cuda")
    >>> cluster_split_cap(b1(32, 8), 132), cluster_split_cap(b1(28, 4), 132)
    (8, None)
    """
    if problem.work_units(BLOCK_M) * CLUSTER_SPLITS != CLUSTER_MAX_CTAS:
        return None
    if problem.head_dim == 64 and problem.packed_rows > CLUSTER_SPLITS_MAX_ROWS_D64:
        return None
    if problem.paged and problem.span > CLUSTER_SPLITS_MAX_PAGED_SPAN:
        return None
    return CLUSTER_SPLITS if choose(problem, CLUSTER_SPLITS, num_sms).cluster else None


def launches_heads_first(problem: DecodeProblem) -> bool:
    """Whether a launch runs its split CTAs KV heads first (``HEADS_FIRST_MIN_KV_HEADS`` and
    ``HEADS_FIRST_MIN_BATCH``): wide key rows (many KV heads) read by many batch rows at once."""
    return problem.num_heads_kv >= HEADS_FIRST_MIN_KV_HEADS and problem.batch >= HEADS_FIRST_MIN_BATCH


def clusters(problem: DecodeProblem, num_splits: int, num_sms: int, merge: bool, swap: bool) -> bool:
    """Whether a launch can merge its splits through one cluster per row tile
    (``SplitConfig.cluster``): a merging swapped-operand launch at d = 64 or 128 whose CTAs
    fit one wave at one CTA per SM (the leader's slots leave room for one), with 2 to
    ``configs.MAX_CLUSTER`` splits.

    >>> p = DecodeProblem(batch=1, seqlen_q=1, seqlen_k=4096, num_heads=32, num_heads_kv=8, head_dim=128,
    ...                   dtype=None, causal=False, has_cache_seqlens=True, device_type="cuda")
    >>> clusters(p, 16, 132, True, True), clusters(p, 32, 132, True, True), clusters(p, 16, 100, True, True)
    (True, False, False)
    """
    ctas = problem.batch * problem.num_heads_kv * num_splits
    return (merge and swap and problem.head_dim in (64, 128) and 2 <= num_splits <= configs.MAX_CLUSTER
            and ctas <= num_sms)
