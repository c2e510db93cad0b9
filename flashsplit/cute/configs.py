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

    @property
    def smem_bytes(self) -> int:
        """Shared memory of one CTA, as the kernel's struct lays it out: the Q tile, the K and V
        stages (each 1 KiB aligned, all multiples of 1 KiB) and one full/empty mbarrier pair per
        stage. The dynamic shared memory base is 1 KiB aligned, so nothing else is added."""
        itemsize = 2
        q = 64 * self.head_dim * itemsize
        kv = 2 * self.stages * self.tile_n * self.head_dim * itemsize
        return q + kv + 16 * self.stages


@dataclass(frozen=True)
class CombineConfig:
    """Compile key of the combine kernel."""

    dtype: str
    head_dim: int


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


def split_config(dtype: str, head_dim: int, causal: bool, write_partials: bool, paged: bool = False) -> SplitConfig:
    tile_n, stages, units = split_tile(head_dim)
    return SplitConfig(dtype, head_dim, tile_n, stages, causal, write_partials, units, paged)


#: The paged kernel compiles (checked in CI) but has not yet run on a GPU. Until an H200 run of
#: ``pytest tests/test_cute_gpu.py tests/test_gpu.py -k paged`` passes (those tests switch this on
#: for themselves), ``supports()`` refuses paged problems so ``"auto"`` keeps them on Triton.
PAGED_VERIFIED_ON_GPU = False


def paged_supported(page_size: int, head_dim: int) -> bool:
    """Whether the paged kernel can read pages of ``page_size`` keys: each KV tile must lie
    inside one page, so one TMA box per tile still works.

    >>> paged_supported(128, 128), paged_supported(16, 128), paged_supported(64, 64)
    (True, False, False)
    """
    return page_size > 0 and page_size % split_tile(head_dim)[0] == 0


def all_split_configs() -> list[SplitConfig]:
    """Every split-kernel configuration the backend can select (what the compile check builds)."""
    return [
        split_config(dtype, head_dim, causal, write_partials, paged)
        for dtype in DTYPES
        for head_dim in HEAD_DIMS
        for causal in (False, True)
        for write_partials in (False, True)
        for paged in (False, True)
    ]


def all_combine_configs() -> list[CombineConfig]:
    return [CombineConfig(dtype, head_dim) for dtype in COMBINE_OUT_DTYPES for head_dim in HEAD_DIMS]


def check_smem(config: SplitConfig) -> None:
    per_sm = config.units_per_sm * (config.smem_bytes + SMEM_RESERVED_PER_CTA)
    assert config.smem_bytes <= SMEM_PER_CTA_MAX and per_sm <= SMEM_PER_SM, (config, per_sm)
