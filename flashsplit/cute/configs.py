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
HEAD_DIMS = (64, 128, 256)
DTYPES = ("float16", "bfloat16")
#: The combine also writes fp32 (flashsplit.combine's default, and mix-and-match checks).
COMBINE_OUT_DTYPES = DTYPES + ("float32",)
#: KV cache element types of the split kernel: "same" (q's 16-bit dtype) or an fp8 cache that
#: the consumer converts to q's dtype in shared memory (wgmma runs in 16 bits).
KV_DTYPES = ("same", "float8_e4m3fn", "float8_e5m2")


@dataclass(frozen=True)
class SplitConfig:
    """Compile key of the split kernel."""

    dtype: str  # "float16" | "bfloat16"
    head_dim: int
    tile_n: int  # keys per KV tile; divides the 128-key split granule
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
    #: fp8 cache with a bf16 q: the wgmma operands (q, the converted K/V tiles, P) are fp16, each
    #: q row scaled by a power of two into (2^13, 2^14] (exact: bf16's 8-bit mantissa fits fp16's
    #: 11) and the score scale divided by it; e4m3/e5m2 -> fp16 is one conversion per pair where
    #: -> bf16 takes four instructions (``FP16_OPERANDS_VERIFIED_ON_GPU``).
    fp16_operands: bool = False
    #: Partials (``write_partials``) merged in the kernel's tail: each CTA counts its finished
    #: split on an int32 arrival counter of its row tile (gpu-scope acq_rel atomic), and the last
    #: CTA to arrive merges the tile's real rows (one warp per row, ``flashsplit.cute.merge``),
    #: writes ``out``/``lse`` in q's dtype and sets the counter back to 0. One launch, no combine.
    merge: bool = False
    #: A warp's 8-row half whose rows are all padding (packed rows past L_q x group: 60 of the 64
    #: with 4 q heads per KV head and one query) skips the softmax (scale, mask, max, exp2, sum,
    #: O rescale); its O rows are never written, so the PV wgmma may multiply its raw scores. With
    #: 4 real rows, 7 of the 8 halves skip: ~7/8 of the tile's exp2 work (the compiler keeps the
    #: P conversion unconditional). Gated by ``SKIP_PADDING_VERIFIED_ON_GPU``.
    skip_padding: bool = False
    #: e4m3 cache: ``S = Q K^T`` as e4m3 wgmma straight from the TMA'd (swizzled) fp8 K stage,
    #: q as three e4m3 terms of its power-of-two-scaled rows (~12 significant bits); only V is
    #: converted (half the conversions of a tile). Dense or whole-tile pages; fp16 PV operands
    #: (a bf16 q needs ``fp16_operands``). Gated by ``FP8_QK_VERIFIED_ON_GPU``.
    fp8_qk: bool = False
    #: Where each CTA signals ``griddepcontrol.launch_dependents`` for a combine launched as a
    #: programmatic dependent (``CuteBackend.combine_pdl``): "none" (the grid's end), "entry"
    #: or "epilogue" (after the last tile, before the partials are written).
    launch_dependents: str = "none"
    #: K and V tiles complete on mbarriers of their own (16-bit TMA loads: dense or TMA pages),
    #: FA3's pipeline: ``S = Q K^T`` and the softmax run while the stage's V tile is still in
    #: flight, and a K stage goes back to the producer after its S wgmma. False: one full/empty
    #: pair per K+V stage. Default ``SPLIT_KV_BARRIERS``.
    split_barriers: bool = False
    #: Swapped operands for few packed rows (0: off; ``SWAP_AB_ROWS``): ``S^T = K Q^T`` with the
    #: K tile as the wgmma A operand (M = keys) and q's rows as N = 8, then ``O^T = V^T P^T`` with
    #: V^T as A (M = head dim) and P^T from shared memory as B. The tensor work of a tile is 8/64
    #: of the 64-row kernel's (which pads 1-8 rows to wgmma's M = 64); the softmax runs down the
    #: columns, its max shared across the four consumer warps through shared memory once per
    #: tile. 16-bit TMA loads (dense or TMA pages), one K+V barrier per stage.
    swap_rows: int = 0

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
    def smem_bytes(self) -> int:
        """Shared memory of one CTA, as the kernel's struct lays it out: the Q tile, the K and V
        stages (each 1 KiB aligned, all multiples of 1 KiB; fp8: the fp8 staging slots plus one
        16-bit K and V operand buffer) and one full/empty mbarrier pair per stage. The dynamic
        shared memory base is 1 KiB aligned, so nothing else is added."""
        itemsize = 2
        tile = self.tile_n * self.head_dim
        q = self.rows * self.head_dim * (3 if self.fp8_qk else itemsize)  # fp8 Q K^T: three e4m3 terms
        if self.staged:
            operand_tiles = 1 if self.fp8_qk else 2  # 16-bit V (and K) operand buffers
            kv = 2 * self.stages * tile * (1 if self.fp8 else itemsize) + operand_tiles * tile * itemsize
        else:
            kv = 2 * self.stages * tile * itemsize
        row_scales = 64 * 4 if self.fp16_operands or self.fp8_qk else 0  # fp32 per q row, after the mbarriers
        ticket = 16 if self.merge else 0  # the arrival count's broadcast slot (int32, padded)
        barriers = 16 * self.stages * (2 if self.split_barriers else 1)  # full + empty, 8 bytes each
        # swapped operands: P^T (1 KiB aligned) and the four warps' column maxima / sums (fp32)
        swap = self.swap_rows * self.tile_n * itemsize + 4 * self.swap_rows * 4 if self.swap_rows else 0
        return q + kv + barriers + row_scales + ticket + swap


@dataclass(frozen=True)
class CombineConfig:
    """Compile key of the combine kernel."""

    dtype: str
    head_dim: int
    #: Launched as a programmatic dependent of the split kernel (``CuteBackend.combine_pdl``).
    pdl: bool = False


def split_tile(head_dim: int) -> tuple[int, int, int]:
    """``(tile_n, stages, units_per_sm)`` for a head dim.

    Decode is bandwidth bound, so the tile is sized for two CTAs per SM (one's prologue and
    epilogue hide behind the other's loads) with 2-3 K+V stages each: >= 128 KiB of loads in
    flight per SM, far above the ~40 KiB per SM that Little's law asks at 4.8 TB/s and ~1 us.
    (d = 128 with three 32 KiB stages would need 2 x 115.7 KiB, at the 228 KiB limit.)
    d = 256 needs 64 KiB per K+V stage, so it runs one CTA per SM.

    >>> split_tile(128)
    (64, 2, 2)
    """
    if head_dim == 64:
        return 128, 3, 2
    if head_dim == 128:
        return 64, 2, 2
    if head_dim == 256:
        return 64, 3, 1
    raise ValueError(f"head_dim: expected one of {HEAD_DIMS}, got {head_dim}")


#: One CTA per SM with a deeper pipeline, for 16-bit caches at d = 128 (``split_config(...,
#: one_per_sm=True)``; dense, or TMA pages behind ``ONE_PER_SM_PAGED_VERIFIED_ON_GPU``): 64-key
#: tiles, 3 stages (96 KiB of loads in flight, 113 KiB of shared memory). Where a problem's CTAs
#: fit one wave at one per SM it needs half the splits (or none: no merge) and each CTA streams
#: twice the keys. H200, 32/8 heads, same runs (fifth session, calls 6 and 8), us, vs the two-CTA
#: tile: B = 16 4k 64.5 vs 68.3, 16k 240.3 vs 247.1; B = 4 128k 476.5 vs 484.5; B = 1 128k 126.4
#: vs 127.5; but B = 16 128k 1950.0 vs 1923.2, B = 1 16k 24.2 vs 23.8, B = 4 4k 24.2 vs 23.6,
#: B = 64 4k 247.6 vs 245.1 (``CuteBackend.one_cta_per_sm`` picks it).
ONE_PER_SM_TILE = (64, 3, 1)

#: K+V stages of the two-CTA d = 128 tile (64 keys) in a launch that merges in the kernel and
#: whose CTAs fit one wave at two per SM (``split_config(..., one_wave=True)``,
#: ``CuteBackend.one_wave_merge``): 3 instead of 2 (2 x 113 KiB of shared memory per SM, 96 KiB
#: of loads in flight per CTA). H200, 32/8 heads, bf16, same runs (tenth session, calls 1-3), us,
#: 3 vs 2 stages (Triton): B = 4 x 4k (8 splits) 22.09-22.13 vs 22.81-22.87 (21.93-22.12), B = 4
#: x 16k 65.68-66.32 vs 66.12-66.41 (65.70-66.21), B = 16 x 128k (2 splits) 1855.0-1855.1 vs
#: 1862.7-1863.0 (1883.1-1883.6). Not taken where it was slower: two waves (B = 64 x 4k, one
#: split, 239.7-239.8 vs 237.8-237.9) and 32 combined splits (B = 1 x 128k 123.7-124.3 vs
#: 123.1-123.6; B = 1 x 4k and 16k tied).
ONE_WAVE_STAGES = 3


def fp8_stages(head_dim: int) -> int:
    """fp8 staging slots per CTA (same tile and CTAs/SM as the 16-bit kernel). An fp8 slot is
    half a 16-bit stage, and the 16-bit operand buffers take one 16-bit stage's room, so: d=64
    4 slots (104 KiB, 2 CTAs/SM), d=128 4 slots (112 KiB, 2 CTAs/SM), d=256 3 slots (192 KiB).

    >>> fp8_stages(128)
    4
    """
    split_tile(head_dim)  # validates head_dim
    return 3 if head_dim == 256 else 4


#: 16-bit staging slots of a gathered-paging CTA: two (d=64 104 KiB, d=128 112 KiB at two CTAs
#: per SM; d=256 224 KiB at one).
GATHER_STAGES = 2


def split_config(dtype: str, head_dim: int, causal: bool, write_partials: bool, paged: bool = False,
                 kv_dtype: str = "same", page_size: int | None = None,
                 fp16_operands: bool | None = None, merge: bool = False, one_per_sm: bool = False,
                 skip_padding: bool | None = None, fp8_qk: bool | None = None,
                 combine_pdl: str | None = None, one_wave: bool = False,
                 split_barriers: bool | None = None, swap_rows: int = 0) -> SplitConfig:
    """The compile key for a problem. ``page_size`` (paged only) picks the load mode: a multiple
    of the tile (one TMA box per tile; the page size a runtime value), a sub-tile size
    (``subtile_page``: tile_n / P TMA boxes), or anything else (``gather_pages``: one bulk copy
    per key row; the page size a runtime value). ``fp16_operands`` (fp8 cache, bf16 q only)
    defaults to ``FP16_OPERANDS_VERIFIED_ON_GPU``. ``merge`` (partials only): the last CTA of each
    row tile merges the partials (no combine kernel). ``one_per_sm`` (16-bit caches at d = 128,
    dense or in TMA pages): :data:`ONE_PER_SM_TILE` instead of :func:`split_tile`'s.
    ``skip_padding`` defaults to ``SKIP_PADDING_VERIFIED_ON_GPU``, ``fp8_qk`` (e4m3 caches, dense
    or whole-tile pages) to ``FP8_QK_VERIFIED_ON_GPU``. ``combine_pdl`` (default ``COMBINE_PDL``):
    how the combine after a partials launch that does not merge is launched, "off" or where the
    split CTAs signal it (``SplitConfig.launch_dependents``). ``one_wave`` (merging launches of
    dense 16-bit caches at d = 128 on the two-CTA tile): :data:`ONE_WAVE_STAGES`. ``split_barriers`` (default
    ``SPLIT_KV_BARRIERS``): K and V on their own mbarriers where the loads are 16-bit TMA tiles
    (``SplitConfig.split_barriers``; ignored for staged loads). ``swap_rows`` (0 or
    ``SWAP_AB_ROWS``): the swapped-operand consumer (``SplitConfig.swap_rows``), for 16-bit
    caches read by whole TMA tiles or sub-tile boxes, with one K+V barrier per stage."""
    if kv_dtype not in KV_DTYPES:
        raise ValueError(f"kv_dtype: expected one of {KV_DTYPES}, got {kv_dtype!r}")
    eligible = kv_dtype != "same" and dtype == "bfloat16"
    if fp16_operands is None:
        fp16_operands = eligible and FP16_OPERANDS_VERIFIED_ON_GPU
    elif fp16_operands and not eligible:
        raise ValueError(f"fp16_operands: only for an fp8 cache with a bfloat16 q, got {dtype}/{kv_dtype}")
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
    if skip_padding is None:
        skip_padding = SKIP_PADDING_VERIFIED_ON_GPU
    qk_eligible = kv_dtype == "float8_e4m3fn" and not subtile_page and not gather and (
        dtype == "float16" or fp16_operands)
    if fp8_qk is None:
        fp8_qk = qk_eligible and FP8_QK_VERIFIED_ON_GPU
    elif fp8_qk and not qk_eligible:
        raise ValueError("fp8_qk: only for an e4m3 cache, dense or in whole-tile pages, with fp16 wgmma "
                         f"operands (fp16 q, or bf16 q with fp16_operands); got {dtype}/{kv_dtype}, "
                         f"fp16_operands={fp16_operands}, page_size={page_size}")
    if combine_pdl is None:
        combine_pdl = COMBINE_PDL
    if combine_pdl != "off" and combine_pdl not in LAUNCH_DEPENDENTS:
        raise ValueError(f"combine_pdl: expected 'off' or one of {LAUNCH_DEPENDENTS}, got {combine_pdl!r}")
    # A combine kernel follows a partials launch that does not merge: signal it where combine_pdl says.
    launch_dependents = combine_pdl if write_partials and not merge and combine_pdl != "off" else "none"
    if split_barriers is None:
        split_barriers = SPLIT_KV_BARRIERS
    split_barriers = split_barriers and kv_dtype == "same" and not gather  # staged loads keep one pair
    if swap_rows not in (0, SWAP_AB_ROWS):
        raise ValueError(f"swap_rows: expected 0 or {SWAP_AB_ROWS}, got {swap_rows}")
    if swap_rows and (kv_dtype != "same" or gather or split_barriers):
        raise ValueError(f"swap_rows: only for 16-bit caches in TMA tiles with one K+V barrier per stage, got "
                         f"kv_dtype {kv_dtype}, gathered pages {gather}, split_barriers {split_barriers}")
    return SplitConfig(dtype, head_dim, tile_n, stages, causal, write_partials, units, paged, kv_dtype,
                       subtile_page, gather, fp16_operands, merge, skip_padding, fp8_qk, launch_dependents,
                       split_barriers, swap_rows)


#: Packed q rows (L_q x group) of the swapped-operand kernel (``SplitConfig.swap_rows``): wgmma's
#: smallest N, so it takes problems of 1-8 rows per KV head.
SWAP_AB_ROWS = 8

#: K+V stages of the swapped-operand kernel on the two-CTA d = 128 tile. Its small q tile (8 rows,
#: 2 KiB) would let three 2-stage CTAs share an SM (68 KiB each), which breaks the two-per-SM
#: waves the plan counts on; 3 stages (100 KiB) keep two, and deepen the pipeline.
SWAP_AB_STAGES = 3

#: The swapped-operand kernel for 1-8 packed rows (``CuteBackend.swap_ab``) passed ``pytest
#: tests/test_cute_gpu.py -k "swap or other_rows"`` on an H200 (eleventh session, call 6: 123 tests:
#: d 64/128/256, L_q 1-8 x groups 1-8 with bottom-right causal masks, 1/3/17 splits, lengths 0, 1,
#: tile +- 1 and NaN past them, whole-tile and sub-tile pages, one-wave and one-CTA-per-SM tiles,
#: graph replay). False: every problem runs the 64-row kernel.
SWAP_AB_VERIFIED_ON_GPU = True


def swap_ab_applies(packed_rows: int, kv_dtype: str, page_size: int | None, head_dim: int,
                    split_barriers: bool) -> bool:
    """Whether a problem of ``packed_rows`` rows per KV head (L_q x group) can take the swapped-
    operand kernel: at most ``SWAP_AB_ROWS`` rows, a 16-bit cache, dense (``page_size`` None) or
    in pages the TMA reads as whole tiles or sub-tile boxes, one K+V barrier per stage.

    >>> swap_ab_applies(4, "same", None, 128, False), swap_ab_applies(16, "same", None, 128, False)
    (True, False)
    """
    if packed_rows > SWAP_AB_ROWS or kv_dtype != "same" or split_barriers:
        return False
    return page_size is None or tma_pages(page_size, head_dim)


#: Where a split CTA may signal its programmatic dependents (``SplitConfig.launch_dependents``).
LAUNCH_DEPENDENTS = ("none", "entry", "epilogue")

#: The combine kernel is a programmatic dependent (PDL) of the split kernel, whose CTAs signal it
#: after their last tile ("epilogue"); "off": a plain launch. H200, 32/8 heads, d = 128, bf16,
#: graph replay, three rounds in one process (ninth session, call 7), us, plain -> PDL signalled
#: at the epilogue / at the grid's end ("none") / on entry: B = 1 x 4k 12.05 -> 11.71 / 12.27 /
#: 13.43, 16k 23.30 -> 22.83 / 23.62 / 24.12 (Triton 22.83 there). Signalled on entry, the
#: combine's CTAs sit on the SMs while the split CTAs work, and the call got slower (why was not
#: profiled): the second and seventh sessions' PDL attempts signalled there and were reverted.
COMBINE_PDL = "epilogue"

#: K and V tiles on mbarriers of their own (``SplitConfig.split_barriers``), where the loads
#: are 16-bit TMA tiles.
SPLIT_KV_BARRIERS = False


#: The paged kernel passed ``pytest tests/test_cute_gpu.py tests/test_gpu.py`` on an H200
#: (2026-11-29: the paged parity matrix, page sizes 64/128/256). Setting this to False makes
#: ``supports()`` refuse paged problems again (they then run on Triton).
PAGED_VERIFIED_ON_GPU = True

#: The fp8-cache kernel passed ``pytest tests/test_cute_gpu.py -k fp8`` on an H200 (2026-11-29,
#: e4m3/e5m2, dense and paged). False makes ``supports()`` refuse fp8 caches (Triton takes them).
FP8_VERIFIED_ON_GPU = True

#: fp16 wgmma operands for fp8 caches with a bf16 q (``SplitConfig.fp16_operands``): passed
#: ``pytest tests/test_cute_gpu.py -k fp16_operands`` on an H200 (2026-11-29, fifth session: 19 tests,
#: q rows of 2^12 / 2^-12 / 3e5 / 0, whole-tile, sub-tile and gathered pages). False compiles the
#: bf16-operand kernel for such problems again.
FP16_OPERANDS_VERIFIED_ON_GPU = True

#: The one-CTA-per-SM tile for paged 16-bit caches whose pages are TMA boxes (whole-tile or
#: sub-tile) passed ``pytest tests/test_cute_gpu.py -k one_per_sm_paged`` on an H200 (sixth session,
#: call 1: 12 tests, pages of 128/64/16/8 at 1/3/17 splits) and was faster where the rule takes it
#: (B = 16, 32/8 heads, same run, us: pages of 16 4k 65.5 vs 67.2 on the two-CTA tile, 16k 248.1
#: vs 247.5; pages of 128 4k 64.4 vs 67.5, 16k 242.0 vs 245.8). False: dense caches only.
ONE_PER_SM_PAGED_VERIFIED_ON_GPU = True

#: fp8 Q K^T (``SplitConfig.fp8_qk``) stays off. H200, sixth session: 19 of its 21 GPU tests
#: passed; q rows of 3e5 (scores ~1e4) gave an LSE 1e-3 to 2.4e-3 off in relative terms (the
#: three e4m3 q terms), beyond the 1e-3 the fp16-operand kernel meets. And it did not pay once
#: padding warps skip the softmax (call 2, same run, e4m3, 32/8 heads, us): B = 1 x 128k 113.8
#: with it vs 105.2 without, B = 16 x 128k 1552.4 vs 1547.8, 16k 207.8 vs 204.8.
FP8_QK_VERIFIED_ON_GPU = False

#: Padding warps skip the softmax (``SplitConfig.skip_padding``): passed ``pytest
#: tests/test_cute_gpu.py -k skip_padding`` on an H200 (sixth session, call 1: 83 tests, the decode
#: matrix with 1-128 packed rows, fp8, pages of 128/16/48, the one-CTA-per-SM tile, graph replay).
#: Same run, 32/8 heads, d = 128, us: bf16 B = 1 x 4k 12.1 vs 12.6, B = 16 x 128k 1908.6 vs
#: 1921.4 (0.1-4% in every cell of B {1, 4, 16} x {4k, 16k, 128k}); e4m3 (call 2 vs call 1) B = 1 x
#: 128k 105.2 vs 119.5, B = 16 x 128k 1547.8 vs 1799.3. False: every configuration keeps the full
#: softmax.
SKIP_PADDING_VERIFIED_ON_GPU = True

#: The split kernel's last-CTA merge (``SplitConfig.merge``) passed ``pytest tests/test_cute_gpu.py
#: -k merge`` on an H200 (fifth session: 62 tests, 3-256 splits, d 64/128/256, 1-128 packed rows,
#: fp8, paged, graph replay, counters reused across calls and streams). False keeps the combine
#: kernel for every launch of several splits (``CuteBackend.merge_max_splits`` picks which merge).
MERGE_VERIFIED_ON_GPU = True

#: Pages smaller than the KV tile (``subtile_page_sizes``): ``pytest tests/test_cute_gpu.py -k subtile``
#: passed on an H200 (2026-11-29 session 2: 45 tests, page sizes 8/16/32 (and 64 at d = 64), 16-bit
#: and fp8, graph replay with a new block table). False makes ``supports()`` refuse them again.
SUBTILE_PAGES_VERIFIED_ON_GPU = True

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
    that divide ``tile_n`` (d=64: 8/16/32/64; d=128/256: 8/16/32), 16-bit or fp8 caches.

    >>> subtile_page_sizes(128), subtile_page_sizes(64)
    ((8, 16, 32), (8, 16, 32, 64))
    """
    tile_n = split_tile(head_dim)[0]
    return tuple(p for p in range(SUBTILE_MIN_PAGE, tile_n, SUBTILE_MIN_PAGE) if tile_n % p == 0)


#: The gathered kernel's page size is a runtime value: any page size that takes it names the
#: same compile key (this one lists it).
GATHER_EXAMPLE_PAGE = 1


def _gather_compile_pages(head_dim: int) -> tuple[int, ...]:
    """The page sizes that list the gathered compile keys (one, any head dim)."""
    return (GATHER_EXAMPLE_PAGE,)


#: Gathered paging (``gather_pages``: page sizes that are neither multiples of the tile nor
#: sub-tile sizes) passed ``pytest tests/test_cute_gpu.py -k gather`` on an H200 (67 tests,
#: fourth session); switching this off makes ``supports()`` refuse such pages again.
GATHER_PAGES_VERIFIED_ON_GPU = True


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


def all_split_configs(subtile: bool = True) -> list[SplitConfig]:
    """Every split-kernel configuration the backend can select: 48 with 16-bit caches and 96
    with fp8 caches (two fp8 types), then (``subtile``) the sub-tile paged ones, 80 per cache
    type (d=64: 4 page sizes, d=128/256: 3, times dtype, causal, partials), and the gathered
    paged ones, 24 per cache type (one for every page size). Each partials configuration also
    has a merging twin (``merge=True``, launches of up to ``CuteBackend.merge_max_splits``
    splits), which differs only in the tail: :func:`compile_check_configs` builds one per cache
    type, head dim and load mode; and dense 16-bit d = 128 configurations have a one-CTA-per-SM
    twin (``ONE_PER_SM_TILE``), all of which the compile check builds."""
    configs = [
        split_config(dtype, head_dim, causal, write_partials, paged, kv_dtype)
        for kv_dtype in KV_DTYPES
        for dtype in DTYPES
        for head_dim in HEAD_DIMS
        for causal in (False, True)
        for write_partials in (False, True)
        for paged in (False, True)
    ]
    if subtile:
        # Paged only: the sub-tile page sizes, then one gathered key (any other page size).
        configs += [
            split_config(dtype, head_dim, causal, write_partials, True, kv_dtype, page_size)
            for pages_of in (subtile_page_sizes, _gather_compile_pages)
            for kv_dtype in KV_DTYPES
            for dtype in DTYPES
            for head_dim in HEAD_DIMS
            for causal in (False, True)
            for write_partials in (False, True)
            for page_size in pages_of(head_dim)
        ]
    return configs


def compile_check_configs() -> list[SplitConfig]:
    """What the CPU compile check builds: every whole-tile configuration, one sub-tile
    configuration per (cache type, head dim, page size) and one gathered configuration per
    (cache type, head dim), with dtype, causal and partials cycled so each of their combinations
    occurs (these modes change only the producer's loads and the staging)."""
    configs = all_split_configs(subtile=False)
    combos = [(dtype, causal, wp) for dtype in DTYPES for causal in (False, True) for wp in (False, True)]
    i = 0
    for pages_of in (subtile_page_sizes, _gather_compile_pages):
        for kv_dtype in KV_DTYPES:
            for head_dim in HEAD_DIMS:
                for page_size in pages_of(head_dim):
                    dtype, causal, wp = combos[i % len(combos)]
                    configs.append(split_config(dtype, head_dim, causal, wp, True, kv_dtype, page_size))
                    i += 1
    # fp8 cache with a bf16 q: the operand type FP16_OPERANDS_VERIFIED_ON_GPU does not select
    # (above: the one it does) for every (fp8 type, head dim), dense with causal/partials cycled,
    # and paged (whole-tile, sub-tile and gathered pages) once per head dim.
    other = not FP16_OPERANDS_VERIFIED_ON_GPU
    for j, (kv_dtype, head_dim) in enumerate((kv, d) for kv in KV_DTYPES[1:] for d in HEAD_DIMS):
        configs.append(split_config("bfloat16", head_dim, j % 2 == 1, j % 3 != 2, False, kv_dtype,
                                    fp16_operands=other))
    for head_dim, page_size in zip(HEAD_DIMS, (128, 16, GATHER_EXAMPLE_PAGE)):
        configs.append(split_config("bfloat16", head_dim, False, True, True, "float8_e4m3fn", page_size,
                                    fp16_operands=other))
    # The last-CTA merge (a partials launch's tail; the loads before it do not matter): every
    # (cache type, head dim) dense with dtype and causal cycled, and whole-tile, sub-tile and
    # gathered pages once per head dim.
    for j, (kv_dtype, head_dim) in enumerate((kv, d) for kv in KV_DTYPES for d in HEAD_DIMS):
        configs.append(split_config(DTYPES[j % 2], head_dim, j % 3 == 1, True, False, kv_dtype, merge=True))
    for head_dim, page_size in zip(HEAD_DIMS, (GATHER_EXAMPLE_PAGE, 128, 16)):
        configs.append(split_config("bfloat16", head_dim, False, True, True, "same", page_size, merge=True))
    # The one-CTA-per-SM tile (dense 16-bit, d = 128): every dtype x causal x output, and merging.
    configs += [split_config(dtype, 128, causal, wp, one_per_sm=True)
                for dtype in DTYPES for causal in (False, True) for wp in (False, True)]
    configs.append(split_config("float16", 128, True, True, merge=True, one_per_sm=True))
    configs += [split_config("bfloat16", 128, False, True, True, page_size=p, merge=True, one_per_sm=True)
                for p in (128, 16)]  # TMA pages (ONE_PER_SM_PAGED_VERIFIED_ON_GPU)
    # Padding warps skipping the softmax, the side SKIP_PADDING_VERIFIED_ON_GPU does not select:
    # every (cache type, head dim) dense with dtype/causal/partials cycled, pages, both tiles.
    skip = not SKIP_PADDING_VERIFIED_ON_GPU
    for j, (kv_dtype, head_dim) in enumerate((kv, d) for kv in KV_DTYPES for d in HEAD_DIMS):
        configs.append(split_config(DTYPES[j % 2], head_dim, j % 2 == 0, j % 3 != 0, False, kv_dtype,
                                    skip_padding=skip))
    configs.append(split_config("bfloat16", 128, False, True, True, page_size=16, skip_padding=skip))
    configs.append(split_config("bfloat16", 128, False, True, merge=True, one_per_sm=True, skip_padding=skip))
    # fp8 Q K^T (e4m3 caches): every head dim with both q dtypes, causal/partials cycled; pages.
    qk = not FP8_QK_VERIFIED_ON_GPU
    for j, (dtype, head_dim) in enumerate((dt, d) for dt in DTYPES for d in HEAD_DIMS):
        configs.append(split_config(dtype, head_dim, j % 2 == 1, j % 3 != 2, False, "float8_e4m3fn", fp8_qk=qk))
    configs.append(split_config("bfloat16", 128, False, True, True, "float8_e4m3fn", 128, fp8_qk=qk))
    # Three stages for one-wave merging launches (dense 16-bit, d = 128): dtype x causal.
    configs += [split_config(dtype, 128, causal, True, merge=True, one_wave=True)
                for dtype in DTYPES for causal in (False, True)]
    # The K/V barrier layout SPLIT_KV_BARRIERS does not select: every head dim dense (final and
    # partials output), TMA pages (whole-tile and sub-tile), one CTA per SM, one-wave stages.
    other = not SPLIT_KV_BARRIERS
    configs += [split_config(DTYPES[j % 2], head_dim, j % 2 == 1, wp, split_barriers=other)
                for j, head_dim in enumerate(HEAD_DIMS) for wp in (False, True)]
    configs += [split_config("bfloat16", 128, False, True, True, page_size=p, split_barriers=other) for p in (128, 16)]
    configs.append(split_config("float16", 128, True, True, merge=True, one_per_sm=True, split_barriers=other))
    configs.append(split_config("bfloat16", 128, False, True, merge=True, one_wave=True, split_barriers=other))
    # Swapped operands for 1-8 packed rows: every dtype x head dim x causal x output dense, whole-
    # tile and sub-tile pages per head dim, merging on each tile (two CTAs, one wave, one per SM).
    swap = SWAP_AB_ROWS
    configs += [split_config(dtype, head_dim, causal, wp, swap_rows=swap)
                for dtype in DTYPES for head_dim in HEAD_DIMS for causal in (False, True) for wp in (False, True)]
    configs += [split_config(DTYPES[j % 2], head_dim, j % 2 == 0, True, True, page_size=p, swap_rows=swap)
                for j, (head_dim, p) in enumerate((d, p) for d in HEAD_DIMS for p in (split_tile(d)[0], 16))]
    configs += [split_config(DTYPES[j % 2], head_dim, j % 2 == 1, True, merge=True, swap_rows=swap)
                for j, head_dim in enumerate(HEAD_DIMS)]
    configs.append(split_config("bfloat16", 128, False, True, merge=True, one_wave=True, swap_rows=swap))
    configs += [split_config("float16", 128, True, wp, one_per_sm=True, swap_rows=swap) for wp in (False, True)]
    configs.append(split_config("bfloat16", 128, False, True, True, page_size=16, merge=True, one_per_sm=True,
                                swap_rows=swap))
    return configs


def all_combine_configs() -> list[CombineConfig]:
    return [CombineConfig(dtype, head_dim, pdl=COMBINE_PDL != "off") for dtype in COMBINE_OUT_DTYPES
            for head_dim in HEAD_DIMS]


def check_smem(config: SplitConfig) -> None:
    per_sm = config.units_per_sm * (config.smem_bytes + SMEM_RESERVED_PER_CTA)
    assert config.smem_bytes <= SMEM_PER_CTA_MAX and per_sm <= SMEM_PER_SM, (config, per_sm)
