"""Static configurations of the CuTe kernels: the compile keys, and the tile choice per head dim.

Pure Python (no cutlass import): the backend, the dispatcher and the compile test all read it.
Everything here is a compile-time fact; batch, lengths, head counts and split counts are
runtime arguments of the compiled kernels.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Shared memory per SM on H100/H200 (228 KiB) and the most one CTA may take (227 KiB).
SMEM_PER_SM = 228 * 1024
SMEM_PER_CTA_MAX = 227 * 1024
#: Each resident CTA also reserves 1 KiB of shared memory for the system.
SMEM_RESERVED_PER_CTA = 1024
#: Head dims with a tile. d = 96 (Phi-3-mini) rows are 192 bytes: its K, V and Q tiles take the
#: 64-byte swizzle (32-column atoms, three TMA boxes per tile) where 64/128/256 take the 128-byte one.
HEAD_DIMS = (64, 96, 128, 256)
DTYPES = ("float16", "bfloat16")
#: The combine also writes fp32 (flashsplit.combine's default, and mix-and-match checks).
COMBINE_OUT_DTYPES = DTYPES + ("float32",)
#: KV cache element types of the split kernel: "same" (q's 16-bit dtype) or an fp8 cache that
#: the consumer converts to q's dtype in shared memory (wgmma runs in 16 bits).
KV_DTYPES = ("same", "float8_e4m3fn", "float8_e5m2")


@dataclass(frozen=True)
class SplitConfig:
    """Compile key of the split kernel.

    Every kernel also skips the softmax of a warp's 8-row half whose rows are all padding
    (packed rows past L_q x group: 60 of the 64 with 4 q heads per KV head and one query); their
    O rows are never written, so the PV wgmma may multiply their raw scores. With 4 real rows, 7
    of the 8 halves skip (~7/8 of the tile's exp2 work). H200, 32/8 heads, d = 128, us, with vs
    without: bf16 B = 1 x 4k 12.1 vs 12.6, B = 16 x 128k 1908.6 vs 1921.4 (0.1-4% in every cell
    of B {1, 4, 16} x {4k, 16k, 128k}); e4m3 B = 1 x 128k 105.2 vs 119.5, B = 16 x 128k 1547.8
    vs 1799.3.
    """

    dtype: str  # "float16" | "bfloat16"
    head_dim: int
    tile_n: int  # keys per KV tile; divides the split granule (flashsplit.plan.SPLIT_GRANULE)
    stages: int  # K+V stages in the TMA pipeline
    causal: bool
    write_partials: bool  # fp32 partials (num_splits > 1) or the final out/lse (one split)
    units_per_sm: int  # CTAs per SM the tile was sized for (launch bound)
    #: K/V tiles addressed through a block_table (page size a multiple of tile_n); the page size
    #: and page counts stay runtime values.
    paged: bool = False
    #: "same": K/V in q's dtype, loaded by TMA straight into the wgmma operand stages. An fp8
    #: name: TMA loads fp8 tiles into ``stages`` staging slots and the consumer converts each
    #: tile into one 16-bit K and one 16-bit V operand buffer.
    kv_dtype: str = "same"
    #: Sub-tile paging: 0 (dense, or pages that are multiples of tile_n), or the page size P of
    #: a paged cache whose pages are smaller than the tile (P divides tile_n, a multiple of 8):
    #: each K/V tile is then loaded as tile_n / P TMA boxes of P keys, box j from page
    #: ``block_table[b, t * tile_n / P + j]``. A compile-time value only in this mode.
    subtile_page: int = 0
    #: Gathered paging, for page sizes neither whole-tile nor sub-tile (1-7 keys, 24, 48, 96, ...):
    #: the producer copies each key's K and V row (``cp.async.bulk``, one row per copy, completing
    #: on the stage's mbarrier) into ``stages`` plain staging slots, from page
    #: ``block_table[b, key // page_size]``, slot ``key % page_size`` (the page size stays a
    #: runtime value); the consumer copies (or, fp8, converts) each tile into the swizzled
    #: operand buffers, as for fp8 caches.
    gather_pages: bool = False
    #: Partials (``write_partials``) merged in the kernel's tail: each CTA counts its finished
    #: split on an int32 arrival counter of its row tile (gpu-scope acq_rel atomic), and the last
    #: CTA to arrive merges the tile's real rows (one warp per row, ``flashsplit.cute.merge``),
    #: writes ``out``/``lse`` in q's dtype and sets the counter back to 0. One launch, no combine.
    merge: bool = False
    #: Swapped operands for few packed rows (0: off; ``SWAP_AB_ROWS``): ``S^T = K Q^T`` with the
    #: K tile as the wgmma A operand (M = keys) and q's rows as N = 8, then ``O^T = V^T P^T`` with
    #: V^T as A (M = head dim) and P^T from shared memory as B. The tensor work of a tile is 8/64
    #: of the 64-row kernel's (which pads 1-8 rows to wgmma's M = 64); the softmax runs down the
    #: columns, its max shared across the four consumer warps through shared memory once per
    #: tile. TMA loads (dense or TMA pages) of 16-bit tiles, or of fp8 tiles that the consumer
    #: converts into one 16-bit operand buffer per tile, as the 64-row kernel does.
    swap_rows: int = 0
    #: Sliding window (runtime bounds ``window_left`` / ``window_right``): query ``m`` at position
    #: ``p = n - L_q + m`` of a row of ``n`` keys sees keys ``p - window_left .. p + window_right``.
    #: ``left_bound``: the row's splits start at ``flashsplit.plan.first_key``, a CTA skips the
    #: tiles before its first query's window and zeroes the V rows before it; ``right_bound``: a
    #: right bound other than causal's 0 (``causal`` is the bound 0).
    left_bound: bool = False
    right_bound: bool = False
    #: Scores (log2 units) become ``softcap_log2 * tanh(s / softcap_log2)`` before the mask.
    softcap: bool = False
    #: The sinks' dtype name ("" none): each q head's logit joins its softmax where a final
    #: result is written (one split's epilogue, the merge tail), never in partials.
    sinks: str = ""
    #: Batch-invariant decode: each row's splits follow its own length
    #: (``flashsplit.plan.tokens_per_split(..., invariant=True)``); partials only, never merged.
    invariant: bool = False
    #: Left padding (``cache_leftpad``, a runtime ``[B]`` tensor): row b's keys start at
    #: ``leftpad[b]``; its splits start at that key's granule, a CTA skips the tiles before it and
    #: the mask hides the keys before it (as a left window bound does, and with one: the later).
    leftpad: bool = False
    #: Launch order of the CTAs: False, splits fastest (grid ``(split CTAs, B, H_kv x row
    #: blocks)``); True, KV head x row block fastest (grid ``(H_kv x row blocks, split CTAs,
    #: B)``): the CTAs of one batch row's KV heads start side by side and read the same key rows
    #: together, where splits first runs mostly one KV head's CTAs at a time, each reading its
    #: ``D``-wide slice of every key row. What each CTA computes is the same in both orders.
    heads_first: bool = False
    #: Splits per thread-block cluster (0: none): the merge (``merge``) of a swapped-operand tile
    #: through distributed shared memory instead of global partials and an arrival counter. The
    #: row tile's ``cluster`` split CTAs (the launch's split count) form one cluster along the
    #: split axis; each stores its partial rows into the leader's shared memory, and after one
    #: cluster barrier the leader merges them (``flashsplit.cute.cluster_merge``).
    cluster: int = 0

    @property
    def variant(self) -> bool:
        """Any attention variant (window, softcap, sinks, batch invariance, left padding) is on."""
        return (self.left_bound or self.right_bound or self.softcap or bool(self.sinks) or self.invariant
                or self.leftpad)

    @property
    def first_bound(self) -> bool:
        """Rows may start past key 0 (a left window bound or left padding): the CTA skips tiles,
        zeroes the V rows before its first key and masks scores before each row's."""
        return self.left_bound or self.leftpad

    @property
    def rows(self) -> int:
        """Packed q rows per CTA: ``swap_rows``, or wgmma's M = 64."""
        return self.swap_rows or 64

    @property
    def fp8(self) -> bool:
        return self.kv_dtype != "same"

    @property
    def staged(self) -> bool:
        """Tiles land in plain staging slots and the consumer writes the operand buffers."""
        return self.fp8 or self.gather_pages

    @property
    def fp16_operands(self) -> bool:
        """fp8 cache with a bf16 q: the wgmma operands (q, the converted K/V tiles, P) are fp16,
        each q row scaled by a power of two into (2^13, 2^14] (exact: bf16's 8-bit mantissa fits
        fp16's 11) and the score scale divided by it; e4m3/e5m2 -> fp16 is one conversion per
        pair where -> bf16 takes four instructions."""
        return self.fp8 and self.dtype == "bfloat16"

    @property
    def signals_combine(self) -> bool:
        """A partials launch that a combine kernel follows (no merge in the tail): each CTA signals
        ``griddepcontrol.launch_dependents`` after its last tile, before it writes the partials,
        and the combine is launched as its programmatic dependent (PDL). H200, 32/8 heads, d =
        128, bf16, graph replay, us, plain launch -> PDL signalled after the last tile / at the
        grid's end / on entry: B = 1 x 4k 12.05 -> 11.71 / 12.27 / 13.43, 16k 23.30 -> 22.83 /
        23.62 / 24.12. Signalled on entry, the combine's CTAs sit on the SMs while the split CTAs
        work, and the call got slower."""
        return self.write_partials and not self.merge

    @property
    def smem_bytes(self) -> int:
        """Shared memory of one CTA, as the kernel's struct (:mod:`~flashsplit.cute.shared_storage`)
        lays it out: 1 KiB aligned tiles (the Q tile, the K and V stages; fp8: one 16-bit K and V
        operand buffer, then the fp8 staging slots; swapped operands: P^T), then the small fields
        (a full/empty mbarrier pair per stage, the swapped consumer's column reductions, the q row
        scales, the merge's arrival ticket, a cluster leader's 16-byte aligned slots), the whole
        rounded up to the struct's 1 KiB alignment."""
        itemsize = 2
        tile = self.tile_n * self.head_dim
        tiles = [self.rows * self.head_dim * itemsize]  # sQ
        if self.staged:
            tiles += [tile * itemsize] * 2 + [self.stages * tile * (1 if self.fp8 else itemsize)] * 2
        else:
            tiles += [self.stages * tile * itemsize] * 2
        if self.swap_rows:
            tiles.append(self.rows * self.tile_n * itemsize)  # sP
        small = 16 * self.stages  # full + empty mbarriers, 8 bytes each
        small += 4 * 4 * self.rows if self.swap_rows else 0  # fp32 per consumer warp and q row
        small += 4 * self.rows if self.fp16_operands else 0  # fp32 score scale per q row
        small += 16 if self.merge else 0  # the arrival count's broadcast slot (int32, padded)
        if self.cluster:
            slots = self.cluster * self.rows
            small = _round_up(small, 16) + slots * self.head_dim * 4 + slots * 4
        return _round_up(sum(_round_up(t, 1024) for t in tiles) + small, 1024)


def _round_up(x: int, multiple: int) -> int:
    return -(-x // multiple) * multiple


@dataclass(frozen=True)
class CombineConfig:
    """Compile key of the combine kernel (launched as a programmatic dependent of the split
    kernel: ``SplitConfig.signals_combine``)."""

    dtype: str
    head_dim: int
    #: The sinks' dtype name ("" none): each q head's logit joins the merged softmax once.
    sinks: str = ""


#: Element types a ``sinks`` tensor may have (validated by ``flashsplit.validation.check_sinks``).
SINK_DTYPES = ("float32", "bfloat16", "float16")


def split_tile(head_dim: int) -> tuple[int, int, int]:
    """``(tile_n, stages, units_per_sm)`` for a head dim.

    Decode is bandwidth bound, so the tile is sized for two CTAs per SM (one's prologue and
    epilogue hide behind the other's loads) with 2-3 K+V stages each: >= 128 KiB of loads in
    flight per SM, far above the ~40 KiB per SM that Little's law asks at 4.8 TB/s and ~1 us.
    (d = 128 with three 32 KiB stages would need 2 x 115.7 KiB, at the 228 KiB limit.)
    d = 96 takes d = 128's 64-key tile (the same sub-tile page sizes and split granule): a K+V
    stage is 24 KiB and the Q tile 12 KiB, so three stages (84 KiB, 72 KiB of loads in flight per
    CTA, between d = 128's two- and three-stage tiles) leave room for two CTAs per SM; four would
    fit too (108 KiB), but at d = 128 a deeper pipeline lost in two-wave launches (ONE_WAVE_STAGES).
    d = 256 needs 64 KiB per K+V stage, so it runs one CTA per SM.

    >>> split_tile(128)
    (64, 2, 2)
    """
    if head_dim == 64:
        return 128, 3, 2
    if head_dim == 96:
        return 64, 3, 2
    if head_dim == 128:
        return 64, 2, 2
    if head_dim == 256:
        return 64, 3, 1
    raise ValueError(f"head_dim: expected one of {HEAD_DIMS}, got {head_dim}")


#: One CTA per SM with a deeper pipeline, for 16-bit caches at d = 128 (``split_config(...,
#: one_per_sm=True)``; dense, or in pages the TMA reads as whole tiles or sub-tile boxes): 64-key
#: tiles, 3 stages (96 KiB of loads in flight, 113 KiB of shared memory). Where a problem's CTAs
#: fit one wave at one per SM it needs half the splits (or none: no merge) and each CTA streams
#: twice the keys. H200, 32/8 heads, same runs, us, vs the two-CTA
#: tile: B = 16 4k 64.5 vs 68.3, 16k 240.3 vs 247.1; B = 4 128k 476.5 vs 484.5; B = 1 128k 126.4
#: vs 127.5; but B = 16 128k 1950.0 vs 1923.2, B = 1 16k 24.2 vs 23.8, B = 4 4k 24.2 vs 23.6,
#: B = 64 4k 247.6 vs 245.1 (``choice.one_cta_per_sm`` picks it).
ONE_PER_SM_TILE = (64, 3, 1)

#: K+V stages of the two-CTA d = 128 tile (64 keys) in a launch that merges in the kernel and
#: whose CTAs fit one wave at two per SM (``split_config(..., one_wave=True)``,
#: ``choice.one_wave_merge``): 3 instead of 2 (2 x 113 KiB of shared memory per SM, 96 KiB
#: of loads in flight per CTA). H200, 32/8 heads, bf16, same runs, us,
#: 3 vs 2 stages (Triton): B = 4 x 4k (8 splits) 22.09-22.13 vs 22.81-22.87 (21.93-22.12), B = 4
#: x 16k 65.68-66.32 vs 66.12-66.41 (65.70-66.21), B = 16 x 128k (2 splits) 1855.0-1855.1 vs
#: 1862.7-1863.0 (1883.1-1883.6). Not taken where it was slower: two waves (B = 64 x 4k, one
#: split, 239.7-239.8 vs 237.8-237.9) and 32 combined splits (B = 1 x 128k 123.7-124.3 vs
#: 123.1-123.6; B = 1 x 4k and 16k tied).
ONE_WAVE_STAGES = 3


def fp8_stages(head_dim: int) -> int:
    """fp8 staging slots per CTA (same tile and CTAs/SM as the 16-bit kernel). An fp8 slot is
    half a 16-bit stage, and the 16-bit operand buffers take one 16-bit stage's room, so: d=64
    4 slots (104 KiB, 2 CTAs/SM), d=96 4 slots (84 KiB, 2 CTAs/SM), d=128 4 slots (112 KiB,
    2 CTAs/SM), d=256 3 slots (192 KiB).

    >>> fp8_stages(128)
    4
    """
    split_tile(head_dim)  # validates head_dim
    return 3 if head_dim == 256 else 4


#: 16-bit staging slots of a gathered-paging CTA: two (d=64 104 KiB, d=96 84 KiB, d=128 112 KiB
#: at two CTAs per SM; d=256 224 KiB at one).
GATHER_STAGES = 2


def split_config(dtype: str, head_dim: int, causal: bool, write_partials: bool, paged: bool = False,
                 kv_dtype: str = "same", page_size: int | None = None, merge: bool = False,
                 one_per_sm: bool = False, one_wave: bool = False, swap_rows: int = 0, *, left_bound: bool = False,
                 right_bound: bool = False, softcap: bool = False, sinks: str = "",
                 invariant: bool = False, leftpad: bool = False, heads_first: bool = False,
                 cluster: int = 0) -> SplitConfig:
    """The compile key for a problem. ``page_size`` (paged only) picks the load mode: a multiple
    of the tile (one TMA box per tile; the page size a runtime value), a sub-tile size
    (``subtile_page``: tile_n / P TMA boxes), or anything else (``gather_pages``: one bulk copy
    per key row; the page size a runtime value). ``merge`` (partials only): the last CTA of each
    row tile merges the partials (no combine kernel). ``one_per_sm`` (16-bit caches at d = 128,
    dense or in TMA pages): :data:`ONE_PER_SM_TILE` instead of :func:`split_tile`'s.
    ``one_wave`` (merging launches of dense 16-bit caches at d = 128 on the two-CTA tile):
    :data:`ONE_WAVE_STAGES`. ``swap_rows`` (0 or ``SWAP_AB_ROWS``): the swapped-operand consumer
    (``SplitConfig.swap_rows``), for caches read by whole TMA tiles or sub-tile boxes.
    ``left_bound``, ``right_bound``, ``softcap``, ``sinks``, ``invariant``, ``leftpad``: the
    attention variants (:class:`SplitConfig`'s fields of those names); ``heads_first``: the CTAs'
    launch order (``SplitConfig.heads_first``); ``cluster``: splits merged through one cluster
    (``SplitConfig.cluster``; merging swapped-operand launches at d = 64 and 128, splits first,
    one CTA per SM)."""
    _check_variant(causal, write_partials, merge, one_per_sm, one_wave, swap_rows, right_bound, sinks, invariant)
    if kv_dtype not in KV_DTYPES:
        raise ValueError(f"kv_dtype: expected one of {KV_DTYPES}, got {kv_dtype!r}")
    if merge and not write_partials:
        raise ValueError("merge: only for a launch that writes partials (write_partials=True)")
    if one_per_sm and (head_dim != 128 or kv_dtype != "same"):
        raise ValueError(f"one_per_sm: only for 16-bit caches at head_dim 128 (dense or TMA pages), got head_dim "
                         f"{head_dim}, kv_dtype {kv_dtype}")
    if one_wave and (head_dim != 128 or kv_dtype != "same" or paged or one_per_sm or not merge):
        raise ValueError(f"one_wave: only for merging launches of dense 16-bit caches at head_dim 128 on the "
                         f"two-CTA tile, got head_dim {head_dim}, kv_dtype {kv_dtype}, paged={paged}, "
                         f"one_per_sm={one_per_sm}, merge={merge}")
    tile_n, stages, units = ONE_PER_SM_TILE if one_per_sm else split_tile(head_dim)
    if one_wave:
        stages = ONE_WAVE_STAGES
    if swap_rows and not one_per_sm and head_dim == 128:
        stages = max(stages, SWAP_AB_STAGES)
    subtile_page, gather = 0, False
    if paged and page_size is not None and not paged_supported(page_size, head_dim):
        if page_size < 1:
            raise ValueError(f"page_size: expected a positive int, got {page_size}")
        if page_size in subtile_page_sizes(head_dim):
            subtile_page = page_size
        elif one_per_sm:
            raise ValueError(f"one_per_sm: not for gathered pages (page_size {page_size}: neither a multiple of "
                             f"{tile_n} nor one of {subtile_page_sizes(head_dim)})")
        else:
            gather = True
            stages = GATHER_STAGES
    if kv_dtype != "same":
        stages = fp8_stages(head_dim)
    if swap_rows not in (0, SWAP_AB_ROWS):
        raise ValueError(f"swap_rows: expected 0 or {SWAP_AB_ROWS}, got {swap_rows}")
    if swap_rows and head_dim % 64 != 0:
        raise ValueError(f"swap_rows: the swapped consumer's O^T = V^T P^T takes the head dim as wgmma's M, in "
                         f"blocks of 64; head_dim {head_dim} is not a multiple of 64")
    if swap_rows and gather:
        raise ValueError(f"swap_rows: only for caches read in TMA tiles, got gathered pages of {page_size} keys")
    if cluster:
        _check_cluster(cluster, merge, swap_rows, head_dim, one_wave, heads_first)
        units = 1  # the leader's slots leave room for one CTA per SM
    return SplitConfig(dtype, head_dim, tile_n, stages, causal, write_partials, units, paged, kv_dtype,
                       subtile_page, gather, merge, swap_rows, left_bound, right_bound, softcap, sinks, invariant,
                       leftpad, heads_first, cluster)


#: Splits one cluster may hold: the largest (non-portable) thread-block cluster on Hopper.
MAX_CLUSTER = 16


def _check_cluster(cluster, merge, swap_rows, head_dim, one_wave, heads_first) -> None:
    """What :func:`split_config` refuses of a cluster merge: a size outside 2..MAX_CLUSTER, and
    any launch but a merging swapped-operand one at d = 64 or 128 (d = 256's slots would not fit
    beside its stages), splits first, without one-wave stages."""
    if not 2 <= cluster <= MAX_CLUSTER:
        raise ValueError(f"cluster: expected 0 or 2..{MAX_CLUSTER} splits, got {cluster}")
    if not merge or not swap_rows or head_dim not in (64, 128) or one_wave or heads_first:
        raise ValueError(f"cluster: only for merging swapped-operand launches at head_dim 64 or 128, splits first, "
                         f"without one-wave stages; got merge={merge}, swap_rows={swap_rows}, head_dim {head_dim}, "
                         f"one_wave={one_wave}, heads_first={heads_first}")


def _check_variant(causal, write_partials, merge, one_per_sm, one_wave, swap_rows, right_bound, sinks,
                   invariant) -> None:
    """What :func:`split_config` refuses among the variants: a right bound beside causal's, an
    unknown sinks dtype or sinks in partials, and batch-invariant launches other than the two-CTA tile's partials (its
    split count or tile must not follow the batch: no merge, one-wave stages, one CTA per SM or
    swapped operands)."""
    if right_bound and causal:
        raise ValueError("right_bound: a right window bound other than causal's 0, so not with causal=True")
    if sinks not in ("",) + SINK_DTYPES:
        raise ValueError(f"sinks: expected '' (none) or one of {SINK_DTYPES}, got {sinks!r}")
    if sinks and write_partials and not merge:
        raise ValueError("sinks: only where the kernel writes a final result (one split, or merge=True); a "
                         "combine adds them to partials")
    if invariant and (not write_partials or merge or one_per_sm or one_wave or swap_rows):
        raise ValueError(f"invariant: only for partials on the two-CTA tile (no merge, one_per_sm, one_wave or "
                         f"swap_rows), got write_partials={write_partials}, merge={merge}, one_per_sm={one_per_sm}, "
                         f"one_wave={one_wave}, swap_rows={swap_rows}")


#: Packed q rows (L_q x group) of the swapped-operand kernel (``SplitConfig.swap_rows``): wgmma's
#: smallest N, so it takes problems of 1-8 rows per KV head.
SWAP_AB_ROWS = 8

#: K+V stages of the swapped-operand kernel on the two-CTA d = 128 tile. Its small q tile (8 rows,
#: 2 KiB) would let three 2-stage CTAs share an SM (68 KiB each), which breaks the two-per-SM
#: waves the plan counts on; 3 stages (100 KiB) keep two, and deepen the pipeline.
SWAP_AB_STAGES = 3


def swap_ab_applies(packed_rows: int, kv_dtype: str, page_size: int | None, head_dim: int) -> bool:
    """Whether a problem of ``packed_rows`` rows per KV head (L_q x group) can take the swapped-
    operand kernel: at most ``SWAP_AB_ROWS`` rows, a 16-bit or fp8 cache, dense (``page_size``
    None) or in pages the TMA reads as whole tiles or sub-tile boxes, and a head dim in whole
    64-row wgmma M blocks (``O^T``'s rows; d = 96 runs the 64-row consumer).

    >>> swap_ab_applies(4, "same", None, 128), swap_ab_applies(16, "same", None, 128)
    (True, False)
    >>> swap_ab_applies(4, "float8_e4m3fn", None, 128), swap_ab_applies(4, "same", None, 96)
    (True, False)
    """
    if packed_rows > SWAP_AB_ROWS or kv_dtype not in KV_DTYPES or head_dim % 64 != 0:
        return False
    return page_size is None or tma_pages(page_size, head_dim)


#: TMA with SWIZZLE_128B writes whole 1024-byte swizzle atoms: a sub-box must start at a
#: multiple of 8 key rows of 128 bytes in the swizzled 16-bit stage (K: (8 keys, 64 d) atoms;
#: V: (64 d, 8 keys) atoms), so sub-tile pages are multiples of 8 keys that divide the tile.
SUBTILE_MIN_PAGE = 8


def paged_supported(page_size: int, head_dim: int) -> bool:
    """Whether the paged kernel can read pages of ``page_size`` keys: each KV tile must lie
    inside one page, so one TMA box per tile still works.

    >>> paged_supported(128, 128), paged_supported(16, 128), paged_supported(64, 64)
    (True, False, False)
    """
    return page_size > 0 and page_size % split_tile(head_dim)[0] == 0


def subtile_page_sizes(head_dim: int) -> tuple[int, ...]:
    """Page sizes smaller than the tile that the sub-tile paged kernel reads: the multiples of 8
    that divide ``tile_n`` (d=64: 8/16/32/64; d=96/128/256: 8/16/32), 16-bit or fp8 caches.

    >>> subtile_page_sizes(128), subtile_page_sizes(64)
    ((8, 16, 32), (8, 16, 32, 64))
    """
    tile_n = split_tile(head_dim)[0]
    return tuple(p for p in range(SUBTILE_MIN_PAGE, tile_n, SUBTILE_MIN_PAGE) if tile_n % p == 0)


#: The gathered kernel's page size is a runtime value: any page size that takes it names the
#: same compile key (this one lists it).
GATHER_EXAMPLE_PAGE = 1


def subtile_paged_supported(page_size: int, head_dim: int) -> bool:
    """Whether ``page_size`` takes the sub-tile paged kernel (several TMA boxes per tile).

    >>> subtile_paged_supported(16, 128), subtile_paged_supported(24, 128), subtile_paged_supported(64, 128)
    (True, False, False)
    """
    return page_size in subtile_page_sizes(head_dim)


def tma_pages(page_size: int, head_dim: int) -> bool:
    """Whether the TMA loads pages of ``page_size`` keys (whole tiles or sub-tile boxes), where
    other page sizes take the gathered-row kernel.

    >>> tma_pages(128, 128), tma_pages(16, 128), tma_pages(48, 128)
    (True, True, False)
    """
    return paged_supported(page_size, head_dim) or subtile_paged_supported(page_size, head_dim)


def check_smem(config: SplitConfig) -> None:
    per_sm = config.units_per_sm * (config.smem_bytes + SMEM_RESERVED_PER_CTA)
    assert config.smem_bytes <= SMEM_PER_CTA_MAX and per_sm <= SMEM_PER_SM, (config, per_sm)
