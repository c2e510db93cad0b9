"""Static configuration of the MLA split kernel: its compile key, tile and what it supports.

Multi-head Latent Attention decode (DeepSeek-V3 family): every q head attends one shared latent
KV head of :data:`HEAD_DIM` = 576 features (512 latent + 64 rope); V is the first
:data:`HEAD_DIM_V` = 512 features of the same cache row. Pure Python (no cutlass import): the
launcher and the compile check read it. Batch, lengths, head count, query count, split count,
page size and page count are runtime values of the compiled kernel.
"""

from __future__ import annotations

from dataclasses import dataclass

from .configs import DTYPES, SMEM_PER_CTA_MAX

#: The cache's element type: q's ("same") or e4m3 with a per-tensor descale.
KV_DTYPES = ("same", "float8_e4m3fn")

#: Features of a q row and of a latent cache row (K), and the leading ones V takes.
HEAD_DIM = 576
HEAD_DIM_V = 512
#: Keys per KV tile (one TMA tile of 576 features: 72 KiB in 16 bits), packed q rows per CTA
#: (wgmma's M) and K tiles in flight: Q (72 KiB), 2 stages (144 KiB) and P (8 KiB) fit 227 KiB.
TILE_N = 64
ROWS = 64
STAGES = 2
#: Query tokens per row (multi-token prediction, speculative decoding) and q heads.
MAX_SEQLEN_Q = 4
MIN_HEADS_Q, MAX_HEADS_Q = 1, 128
#: Threads: two consumer warpgroups (each owns 256 of O's 512 columns), then a producer
#: warpgroup whose first warp issues the loads. A whole producer warpgroup lets the CTA move
#: registers to the consumers (``setmaxnreg``): 384 threads start at 168 registers each (a
#: quarter of the SM's registers over 3 warps), 256 + 128 x 32 + 256 x 112 would spill.
CONSUMER_WARPGROUPS = 2
CONSUMER_THREADS = 128 * CONSUMER_WARPGROUPS
PRODUCER_WARP = CONSUMER_THREADS // 32
THREADS = CONSUMER_THREADS + 128
#: Registers per thread after ``setmaxnreg``: 128 x 40 + 256 x 232 <= 65536.
PRODUCER_REGISTERS = 40
CONSUMER_REGISTERS = 232


@dataclass(frozen=True)
class MLAConfig:
    """Compile key of the MLA split kernel: q's and the cache's 16-bit ``dtype``, whether the
    cache is ``paged`` (``[num_pages, page, 1, 576]``, page a runtime multiple of
    :data:`TILE_N`) or dense (``[B, L, 1, 576]``), the bottom-right ``causal`` mask and the
    cache's element type."""

    dtype: str
    paged: bool
    causal: bool
    #: "same" (q's dtype) or "float8_e4m3fn": fp8 tiles land by TMA in staging slots and the
    #: consumers convert each into one 16-bit operand buffer (a per-tensor descale).
    kv_dtype: str = "same"

    def __post_init__(self):
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype: expected one of {DTYPES}, got {self.dtype!r}")
        if self.kv_dtype not in KV_DTYPES:
            raise ValueError(f"kv_dtype: expected one of {KV_DTYPES}, got {self.kv_dtype!r}")

    @property
    def fp8(self) -> bool:
        return self.kv_dtype != "same"

    @property
    def smem_bytes(self) -> int:
        """Shared memory of one CTA: the Q tile, the K stages (fp8: one 16-bit operand buffer
        and the fp8 staging slots), their mbarrier pairs, the P tile and the two warpgroups' row
        maxima."""
        tile = TILE_N * HEAD_DIM
        stages = tile * 2 + STAGES * tile if self.fp8 else STAGES * tile * 2
        fixed = ROWS * HEAD_DIM * 2 + stages + STAGES * 2 * 8
        return fixed + ROWS * TILE_N * 2 + CONSUMER_WARPGROUPS * ROWS * 4


def all_mla_configs() -> list[MLAConfig]:
    """Every configuration the launcher can compile."""
    return [MLAConfig(d, p, c, kv) for d in DTYPES for p in (False, True) for c in (False, True) for kv in KV_DTYPES]


def mla_supports(*, dtype, kv_dtype, head_dim, head_dim_v, num_heads_q, seqlen_q, paged, page_size) -> str | None:
    """Why the MLA split kernel cannot run a problem, or None when it can. ``dtype`` /
    ``kv_dtype``: q's and the cache's dtype names (``"bfloat16"``, ...); ``page_size``: keys per
    page (ignored when not ``paged``)."""
    if dtype not in DTYPES:
        return f"q dtype {dtype} is not one of {DTYPES}"
    if kv_dtype not in (dtype, "float8_e4m3fn"):
        return f"the cache dtype {kv_dtype} is neither q's {dtype} nor float8_e4m3fn"
    if head_dim != HEAD_DIM or head_dim_v != HEAD_DIM_V:
        return f"head dims {head_dim}/{head_dim_v} are not {HEAD_DIM}/{HEAD_DIM_V}"
    if not MIN_HEADS_Q <= num_heads_q <= MAX_HEADS_Q:
        return f"{num_heads_q} q heads: expected {MIN_HEADS_Q}..{MAX_HEADS_Q}"
    if not 1 <= seqlen_q <= MAX_SEQLEN_Q:
        return f"seqlen_q {seqlen_q}: expected 1..{MAX_SEQLEN_Q}"
    if paged and (page_size <= 0 or page_size % TILE_N != 0):
        return f"page size {page_size} is not a multiple of {TILE_N}"
    return None


assert max(c.smem_bytes for c in all_mla_configs()) <= SMEM_PER_CTA_MAX
