"""The shared split plan: how many splits, and where each split starts and ends.

Every backend takes its split count from :func:`choose_num_splits` and its per-row boundaries
from :func:`split_bounds` (mirrored on the device, token for token). Backends pick their own
tile sizes, never their own split boundaries; that is what makes their partials comparable
split by split and lets one backend's combine merge another backend's partials.

Split boundaries (for one batch row of live length ``n`` keys, ``S`` splits, granule ``G``)::

    tokens_per_split(n) = ceil(ceil(n / G) / S) * G      # a whole number of granules
    split s covers keys  [s * tokens_per_split(n), min((s + 1) * tokens_per_split(n), n))
    splits_used(n)      = ceil(n / tokens_per_split(n))   # 0 when n == 0

Splits are contiguous from the row's first key, so an empty split only ever follows the row's
last key: no split is empty while the row has keys left. The first key is 0, or with a left
window bound (``window_left = w``) the first key any of the ``L_q`` queries can see, rounded down
to the granule: ``first = floor(max(n - L_q - w, 0) / G) * G``, and the splits divide the
``n - first`` keys from there (a 4k window over a 128k cache is split like a 4k cache). A
batch-invariant decode divides each row's span into :data:`BATCH_INVARIANT_SPLITS` splits of at
least :data:`BATCH_INVARIANT_MIN_SPLIT` keys instead of the launch's split count, so a row's splits
depend on its own length only, never on the batch it is decoded in. A left-padded row
(``cache_leftpad``: its keys are ``[leftpad, n)``) is split as the row of its ``n - leftpad`` real
keys, shifted by ``leftpad``. Worked example, ``G = 128``, ``S = 4``,
``n = 1000``: ceil(1000 / 128) = 8 granules, 2 per split, 256 tokens per split; the splits
cover [0, 256), [256, 512), [512, 768), [768, 1000). With ``n = 300``: 3 granules, 1 per
split; [0, 128), [128, 256), [256, 300) and split 3 is empty (LSE = -inf).

MLA decode (:mod:`flashsplit.mla.plan`) is the MQA case of this plan (every packed row shares
one latent KV head), with compute-bound rows (H_q = 128) split less.

The split count is chosen from static shapes only (cache capacity, never live lengths), so a
CUDA graph captured once stays valid for any ``cache_seqlens``.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

#: Split boundaries are multiples of this many keys. Every backend's KV tile divides it, so a
#: split never starts in the middle of a tile.
SPLIT_GRANULE = 128
#: The most splits ``decode`` accepts (and the combine kernels are built for).
MAX_SPLITS = 256
#: A batch-invariant decode (``decode(..., batch_invariant=True)``) cuts each row into this many
#: splits of at least ``BATCH_INVARIANT_MIN_SPLIT`` keys, from the row's own length alone, so its
#: result is the same bit for bit in any batch. 32 splits are what the heuristic picks for B = 1 with
#: 8 KV heads on 132 SMs at two CTAs per SM (16k keys: 32 of 512; 128k: 32 of 4096), so a lone
#: row loses nothing.
#: With a fixed 512-key split, B = 1 x 128k took 174.8 us vs 127.6 (H200, 32/8 heads, bf16).
BATCH_INVARIANT_SPLITS = 32
BATCH_INVARIANT_MIN_SPLIT = 512
#: SM count used when planning for a device that has none (the CPU interpreter, dry runs): an H200's.
DEFAULT_NUM_SMS = 132
#: FA3's rule: with this fraction of the machine already busy without splitting, do not split.
BUSY_FRACTION = 0.8
#: Take the smallest split count whose wave efficiency is within this of the best. FA3 uses 0.85;
#: on the H200 the fuller last wave paid: B = 1, 32/8 heads, 32 splits (0.97 of a wave) vs 29
#: (0.88), same run, us: 64k / 128k keys Triton 67.5 / 127.5 vs 67.7 / 128.3, cute 68.6 / 128.1
#: vs 69.4 / 129.2, pages of 16 Triton 71.3 / 134.6 vs 76.8 / 146.0, cute 69.2 / 129.1 vs
#: 69.3 / 130.7 (docs/architecture.md, "Decisions the measurements settled").
_EFFICIENCY_SLACK = 0.95


@functools.lru_cache(maxsize=None)
def device_num_sms(device_type: str, index: int | None = None) -> int:
    """SMs of CUDA device ``index`` (the current one when None), the machine size the heuristic
    plans for; :data:`DEFAULT_NUM_SMS` for another device type or without CUDA."""
    import torch

    if device_type != "cuda" or not torch.cuda.is_available():
        return DEFAULT_NUM_SMS
    return torch.cuda.get_device_properties(index if index is not None else torch.cuda.current_device()).multi_processor_count


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def tokens_per_split(seqlen: int, num_splits: int, granule: int = SPLIT_GRANULE, invariant: bool = False) -> int:
    """Keys per split for a row whose splits cover ``seqlen`` keys (a multiple of ``granule``; 0
    if empty). ``invariant`` (batch-invariant decode): from the row's length alone, as
    :data:`BATCH_INVARIANT_SPLITS` splits of at least :data:`BATCH_INVARIANT_MIN_SPLIT` keys.

    >>> tokens_per_split(1000, 4), tokens_per_split(131072, 2, invariant=True), tokens_per_split(1000, 2, invariant=True)
    (256, 4096, 512)
    """
    if invariant:
        return max(BATCH_INVARIANT_MIN_SPLIT, cdiv(cdiv(seqlen, granule), BATCH_INVARIANT_SPLITS) * granule)
    return cdiv(cdiv(seqlen, granule), num_splits) * granule


def first_key(seqlen: int, seqlen_q: int = 1, window_left: int = -1, granule: int = SPLIT_GRANULE) -> int:
    """The first key of a row's splits: 0, or with ``window_left >= 0`` the first key query 0 can
    see, rounded down to ``granule``.

    >>> first_key(10000, 1, 4096)
    5888
    """
    if window_left < 0:
        return 0
    return max(seqlen - seqlen_q - window_left, 0) // granule * granule


def row_start(seqlen: int, seqlen_q: int = 1, window_left: int = -1, granule: int = SPLIT_GRANULE,
              leftpad: int = 0) -> int:
    """The first key of the splits of a row whose keys are ``[leftpad, seqlen)``: ``leftpad``
    (clamped into ``[0, seqlen]``, as the kernels do) plus :func:`first_key` of its real keys.

    >>> row_start(10000, 1, 4096, leftpad=100)
    5860
    """
    leftpad = min(max(leftpad, 0), max(seqlen, 0))
    return leftpad + first_key(seqlen - leftpad, seqlen_q, window_left, granule)


def split_bounds(seqlen: int, num_splits: int, granule: int = SPLIT_GRANULE, *, seqlen_q: int = 1,
                 window_left: int = -1, invariant: bool = False, leftpad: int = 0) -> list[tuple[int, int]]:
    """``[(start, end), ...]`` for each of the ``num_splits`` splits of a row of ``seqlen`` keys
    (end <= start: empty); ``seqlen_q`` / ``window_left`` place the row's first key
    (:func:`first_key`), ``invariant``: the batch-invariant split length (:func:`tokens_per_split`);
    ``leftpad``: the row's keys are ``[leftpad, seqlen)`` (:func:`row_start`).

    >>> split_bounds(1000, 4)
    [(0, 256), (256, 512), (512, 768), (768, 1000)]
    >>> split_bounds(300, 4)
    [(0, 128), (128, 256), (256, 300), (384, 300)]
    >>> split_bounds(1000, 2, window_left=300)
    [(640, 896), (896, 1000)]
    >>> split_bounds(1000, 2, leftpad=100)
    [(100, 612), (612, 1000)]
    """
    first = row_start(seqlen, seqlen_q, window_left, granule, leftpad)
    tps = tokens_per_split(seqlen - first, num_splits, granule, invariant)
    return [(first + s * tps, min(first + (s + 1) * tps, seqlen)) for s in range(num_splits)]


def splits_used(seqlen: int, num_splits: int, granule: int = SPLIT_GRANULE, *, seqlen_q: int = 1,
                window_left: int = -1, invariant: bool = False, leftpad: int = 0) -> int:
    """How many of the splits hold at least one key of a row of ``seqlen`` keys (``leftpad``: its
    keys start there)."""
    span = seqlen - row_start(seqlen, seqlen_q, window_left, granule, leftpad)
    if span <= 0:
        return 0
    return cdiv(span, tokens_per_split(span, num_splits, granule, invariant))


def planned_span(capacity: int, seqlen_q: int = 1, window_left: int = -1, granule: int = SPLIT_GRANULE) -> int:
    """The most keys a row's splits can cover (static: what the split count is chosen for): the
    capacity, or with a left window bound the keys the ``L_q`` queries can reach plus the
    granule alignment of the first key, ``min(capacity, window_left + L_q + granule - 1)``.

    >>> planned_span(131072, 1, 4096)
    4224
    """
    if window_left < 0:
        return capacity
    return min(capacity, window_left + seqlen_q + granule - 1)


def wave_efficiency(work_units: int, num_splits: int, slots: int) -> float:
    """Fraction of the last wave that is busy: ``w / ceil(w)`` with ``w = units * splits / slots``."""
    waves = work_units * num_splits / slots
    return waves / math.ceil(waves)


@functools.lru_cache(maxsize=4096)  # pure; decode calls it every step, so keep it off the hot path
def choose_num_splits(
    work_units: int,
    seqlen_k: int,
    num_sms: int,
    units_per_sm: int = 1,
    granule: int = SPLIT_GRANULE,
    max_splits: int = MAX_SPLITS,
) -> tuple[int, str]:
    """The split count for ``work_units`` CTAs of work per split, and a sentence saying why.

    FA3's wave-efficiency rule (flash-attention ``hopper/heuristics.h``) with the backend's
    occupancy as an input and a tighter slack (0.95 instead of 0.85: measured): the machine runs
    ``slots = num_sms * units_per_sm`` CTAs at once.

    - ``work_units = batch * num_heads_kv * row_blocks`` (GQA packed: the q heads of one KV head
      and the query positions share a CTA, so one KV head's keys are read once).
    - No split when the work already fills ``0.8 * slots`` or the cache holds <= 2 granules.
    - Otherwise the smallest ``s`` in ``1..min(max_splits, n_granules)`` whose wave efficiency is
      at least 0.95 x the best, among the counts that the boundary rule really uses at full
      capacity (so no split is empty when every row is full).

    Worked example, 132 SMs, 2 units per SM (264 slots), batch 1, 32/8 heads, 32k keys:
    work_units = 8, n_granules = 256; s = 32 gives 8 * 32 / 264 = 0.97 of a wave, the first
    within 0.95 of the best (s = 33, exactly one wave, is no candidate: 8 granules per split
    fill only 32), so 32 splits of 256 / 32 = 8 granules.
    """
    n_granules = max(1, cdiv(seqlen_k, granule))
    slots = num_sms * units_per_sm
    if work_units == 0:
        return 1, "no work units (an empty batch): no work to spread"
    if work_units >= BUSY_FRACTION * slots:
        return 1, f"{work_units} work units already fill {work_units / slots:.0%} of {slots} CTA slots"
    if n_granules <= 2:
        return 1, f"only {n_granules} granule(s) of {granule} keys: splitting cannot pay"
    # Only counts that the boundary rule really uses at full capacity (FA2's rule): 7 splits of
    # 8 granules would take 2 granules each and leave 3 splits empty, so 7 is not a candidate.
    counts = range(1, min(max_splits, n_granules) + 1)
    efficiencies = {s: wave_efficiency(work_units, s, slots) for s in counts}
    best = max(efficiencies.values())
    candidates = [s for s in counts if cdiv(n_granules, cdiv(n_granules, s)) == s]
    good = [s for s in candidates if efficiencies[s] >= _EFFICIENCY_SLACK * best]
    used = good[0] if good else max(candidates, key=efficiencies.__getitem__)
    return used, (
        f"{work_units} work units on {slots} CTA slots ({num_sms} SMs x {units_per_sm}): "
        f"{used} splits fill {wave_efficiency(work_units, used, slots):.0%} of the last wave"
    )


def planned_split(span: int, work_units: int, num_sms: int, units_per_sm: int) -> tuple[int, int]:
    """``(splits, keys per split)`` that :func:`choose_num_splits` and :func:`tokens_per_split`
    give ``work_units`` over ``span`` keys at ``units_per_sm`` CTAs per SM: what a backend's
    occupancy rule judges a choice by."""
    splits = choose_num_splits(work_units, span, num_sms, units_per_sm)[0]
    return splits, tokens_per_split(span, splits)


@dataclass(frozen=True)
class SplitPlan:
    """What :func:`flashsplit.decode` will do for a problem; pure data, built without a GPU.

    ``grid`` is the split kernel's launch grid ``(num_splits, batch, num_heads_kv * row_blocks)``;
    ``span`` the most keys a row's splits cover (the capacity, or what a left window bound lets
    the queries reach: :func:`planned_span`); ``tokens_per_split`` the split length at that span
    (rows with fewer keys use fewer, shorter splits, see :func:`split_bounds`).
    """

    backend: str
    #: The selection rule that picked ``backend`` (:mod:`flashsplit.selection`; "requested" for a
    #: named backend).
    rule: str
    backend_reason: str
    num_splits: int
    split_reason: str
    granule: int
    tokens_per_split: int
    block_m: int
    row_blocks: int
    work_units: int
    grid: tuple[int, int, int]
    num_sms: int
    units_per_sm: int
    runs_combine: bool
    #: The GPU planned for (``"cpu"`` for the Triton interpreter, which splits as a GPU of
    #: ``num_sms`` SMs would).
    gpu: str = "cpu"
    span: int = 0
    seqlen_q: int = 1
    window_left: int = -1
    #: Batch-invariant decode: each row's splits follow from its own length (:func:`tokens_per_split`).
    batch_invariant: bool = False

    def boundaries(self, seqlen: int, leftpad: int = 0) -> list[tuple[int, int]]:
        """Per-split ``(start, end)`` key ranges for a row holding keys ``[leftpad, seqlen)``."""
        return split_bounds(seqlen, self.num_splits, self.granule, seqlen_q=self.seqlen_q,
                            window_left=self.window_left, invariant=self.batch_invariant, leftpad=leftpad)

    def __str__(self) -> str:
        combine = "then a combine kernel" if self.runs_combine else "no combine (one split)"
        window = f" (a window of {self.window_left} keys: splits cover {self.span})" if self.window_left >= 0 else ""
        where, split_reason = f"on {self.gpu}", self.split_reason
        if self.gpu == "cpu":
            where = "on the CPU (Triton interpreter)"
            if not self.batch_invariant and split_reason != "requested":
                # The interpreter has no SMs: it runs the splits the heuristic gives a GPU of this size.
                split_reason = f"split as for a {self.num_sms}-SM GPU, whose programs the interpreter runs one by one"
        return (
            f"{where}: backend {self.backend} ({self.backend_reason}); {self.num_splits} split(s) of up to "
            f"{self.tokens_per_split} keys{window} ({split_reason}); grid {self.grid}, "
            f"{self.block_m}-row tiles x {self.row_blocks}; {combine}"
        )
