"""What to benchmark: model-shape presets and the (batch x seqlen_k x seqlen_q) grid.

Pure Python; no GPU needed. A :class:`Case` is one cell of the grid: one decode step of
``seqlen_q`` queries per batch row (1, or several for speculative decoding: causal, bottom-right
aligned) over a full KV cache of ``seqlen_k`` keys per row, in one cache format (dense or paged,
16-bit or fp8) and one attention :class:`Variant` (plain, or a sliding window, softcap, sinks,
batch-invariant decode, new keys appended by the call, rotary, alone or combined). The option
parsers live in :mod:`.options`, below this module.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from .options import KV_DTYPE_NAMES, SAME_KV, format_seqlen

#: bench dtype names -> torch dtypes.
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}

#: ``--kv-dtype`` names -> the cache's torch dtype (None: q's dtype).
KV_DTYPES = {SAME_KV: None, "fp8e4m3": torch.float8_e4m3fn, "fp8e5m2": torch.float8_e5m2}
assert tuple(KV_DTYPES) == KV_DTYPE_NAMES, "options.KV_DTYPE_NAMES and KV_DTYPES name the same dtypes"
#: The baseline cache format: dense, in q's dtype.
DENSE_FORMAT = (0, SAME_KV)

#: Default grid: batch {1, 4, 16, 64} x seqlen_k {1k, 4k, 16k, 64k, 128k}.
DEFAULT_BATCHES = (1, 4, 16, 64)
DEFAULT_SEQLENS = (1024, 4096, 16384, 65536, 131072)

#: Default cap on the KV bytes held at once (all rotation sets of one cell). An H200 has
#: 141 GB; 80 GB leaves room for the float64 reference check, partial buffers and a contender
#: that makes its own layout copy.
DEFAULT_MEM_CAP_GB = 80.0

#: The H200's L2 (60 MiB), used when no GPU says otherwise (dry runs).
DEFAULT_L2_BYTES = 60 * 1024 * 1024

#: The KV of all rotation sets must exceed this multiple of the L2 size, so a replayed call
#: never finds its KV still cached by an earlier call.
L2_FACTOR = 3.0


@dataclass(frozen=True)
class Shape:
    """Attention heads of one model: ``num_heads`` q heads, ``num_heads_kv`` KV heads, ``head_dim``."""

    num_heads: int
    num_heads_kv: int
    head_dim: int
    model: str = ""

    @property
    def heads(self) -> str:
        return f"{self.num_heads}/{self.num_heads_kv}"


#: Presets named after real models (their published configs).
PRESETS: dict[str, Shape] = {
    "llama-3-8b": Shape(32, 8, 128, "Llama-3-8B (GQA 4)"),
    "llama-2-7b": Shape(32, 32, 128, "Llama-2-7B (MHA)"),
    "group5": Shape(40, 8, 128, "Qwen2.5-14B (GQA 5, a non-power-of-two group)"),
    "d64": Shape(32, 8, 64, "Llama-3.2-1B (d = 64)"),
    "d256": Shape(16, 8, 256, "Gemma-2-9B (d = 256)"),
    "gpt-oss-20b": Shape(64, 8, 64, "gpt-oss-20b (GQA 8, d = 64; a 128-key window on alternate layers, sinks)"),
}
DEFAULT_PRESET = "llama-3-8b"


def kv_name(dtype: str, kv_dtype: str) -> str:
    """The cache dtype's bench name: ``kv_dtype``, or q's ``dtype`` for ``"same"``."""
    return dtype if kv_dtype == SAME_KV else kv_dtype


def format_label(page_size: int, kv: str) -> str:
    """A cache format in a few characters: ``"dense bf16"``, ``"paged/16 fp8e4m3"``."""
    return f"{'dense' if page_size == 0 else f'paged/{page_size}'} {kv}"


#: Mean of the ``--sinks`` logits (drawn N(SINK_MEAN, 1), fp32, one per q head). With N(0, 1)
#: q and k a score is about N(0, 1), so a 129-key window's log-sum-exp is about 5.4 and a sink
#: of 3 takes ~9% of the softmax: a visible share, as gpt-oss's learned sinks take.
SINK_MEAN = 3.0


def variant_label(window: int = -1, softcap: float = 0.0, sinks: bool = False, batch_invariant: bool = False,
                  append: int = 0, rotary: bool = False) -> str:
    """An attention variant in a few words: ``"plain"``, ``"window 128 + sinks"``, ``"append 1 + rotary"``."""
    parts = [f"window {window}"] if window >= 0 else []
    parts += [f"softcap {softcap:g}"] if softcap > 0 else []
    parts += ["sinks"] if sinks else []
    parts += ["batch-invariant"] if batch_invariant else []
    parts += [f"append {append}"] if append else []
    parts += ["rotary"] if rotary else []
    return " + ".join(parts) or "plain"


@dataclass(frozen=True)
class Variant:
    """An attention variant of a decode step: ``window`` keys left of the query (-1: none; passed
    as ``window_size=(window, 0)``, the causal sliding window, which at ``L_q = 1`` sees the same
    keys as ``(window, -1)``), ``softcap`` (0: off), ``sinks`` (one fp32 logit per q head),
    ``batch_invariant`` decode, ``append`` new keys and values per row that the call writes into
    the cache first (``k``/``v``; 0: none) and ``rotary`` embedding of them and of q (full
    ``rotary_dim``, GPT-NeoX halves; only with an append)."""

    window: int = -1
    softcap: float = 0.0
    sinks: bool = False
    batch_invariant: bool = False
    append: int = 0
    rotary: bool = False

    @property
    def plain(self) -> bool:
        return self == PLAIN

    @property
    def label(self) -> str:
        return variant_label(self.window, self.softcap, self.sinks, self.batch_invariant, self.append, self.rotary)


#: The baseline variant: full attention, no softcap, no sinks, the split heuristic.
PLAIN = Variant()


@dataclass(frozen=True)
class Case:
    """One grid cell: q ``[batch, seqlen_q, num_heads, head_dim]``; a dense cache k/v ``[batch, seqlen_k,
    num_heads_kv, head_dim]``, or with ``page_size`` > 0 a paged one ``[num_pages, page_size,
    num_heads_kv, head_dim]`` with an int32 ``block_table`` ``[batch, pages_per_row]``; with an
    fp8 ``kv_dtype`` the cache is fp8 with fp32 descales per (row, KV head); the
    :class:`Variant` fields (``window``, ``softcap``, ``sinks``, ``batch_invariant``, ``append``,
    ``rotary``) say which attention the step computes. With ``append`` each row holds ``seqlen_k -
    append`` keys and the call appends the rest, so it attends to ``seqlen_k`` keys, as the plain
    step of the cell does (every replay writes the same keys to the same slots). With ``seqlen_q``
    > 1 (keyword-only) the step is causal, bottom-right aligned (FlashAttention's ``causal=True``):
    query i sits at key position ``seqlen_k - seqlen_q + i`` and sees the keys up to it."""

    batch: int
    seqlen_k: int
    seqlen_q: int = field(default=1, kw_only=True)  # queries per row (> 1: causal)
    num_heads: int
    num_heads_kv: int
    head_dim: int
    dtype: str = "bf16"
    page_size: int = 0          # 0: dense
    kv_dtype: str = SAME_KV     # a KV_DTYPES name; "same": q's dtype
    window: int = -1            # keys left of the query; -1: no window
    softcap: float = 0.0        # 0: off
    sinks: bool = False         # one fp32 sink logit per q head
    batch_invariant: bool = False
    append: int = 0             # new keys per row written by the call (0: none)
    rotary: bool = False        # rotary embedding of the new keys and q

    @property
    def variant(self) -> Variant:
        return Variant(self.window, self.softcap, self.sinks, self.batch_invariant, self.append, self.rotary)

    @property
    def causal(self) -> bool:
        """Several queries per row: they attend causally (at ``L_q = 1`` causal is a no-op, left off)."""
        return self.seqlen_q > 1

    @property
    def window_size(self) -> tuple[int, int]:
        """``flashsplit.decode``'s ``window_size``: ``(window, 0)``, or ``(-1, -1)`` without a window."""
        return (self.window, 0) if self.window >= 0 else (-1, -1)

    @property
    def visible_keys(self) -> int:
        """Keys the queries of a full row see together: ``seqlen_k``, or ``window + seqlen_q`` under a
        shorter window (query i sees the ``window + 1`` keys up to its position)."""
        return min(self.seqlen_k, self.window + self.seqlen_q) if self.window >= 0 else self.seqlen_k

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def cache_torch_dtype(self) -> torch.dtype:
        return KV_DTYPES[self.kv_dtype] or self.torch_dtype

    @property
    def kv(self) -> str:
        """The cache dtype's name (``"bf16"``, ``"fp8e4m3"``...)."""
        return kv_name(self.dtype, self.kv_dtype)

    @property
    def paged(self) -> bool:
        return self.page_size > 0

    @property
    def fp8(self) -> bool:
        return KV_DTYPES[self.kv_dtype] is not None

    @property
    def format(self) -> tuple[int, str]:
        return (self.page_size, self.kv_dtype)

    @property
    def format_label(self) -> str:
        return format_label(self.page_size, self.kv)

    @property
    def pages_per_row(self) -> int:
        return -(-self.seqlen_k // self.page_size) if self.paged else 0

    @property
    def capacity(self) -> int:
        """Keys a row can hold (``seqlen_k``, rounded up to whole pages): the plan's ``seqlen_k``."""
        return self.pages_per_row * self.page_size if self.paged else self.seqlen_k

    @property
    def itemsize(self) -> int:
        """Bytes per element of q and the output."""
        return torch.empty((), dtype=self.torch_dtype).element_size()

    @property
    def kv_itemsize(self) -> int:
        """Bytes per element of the cache (1 for fp8)."""
        return torch.empty((), dtype=self.cache_torch_dtype).element_size()

    @property
    def kv_bytes(self) -> int:
        """Bytes of K and V (what one decode step must read at least), in the cache's dtype."""
        return 2 * self.batch * self.seqlen_k * self.num_heads_kv * self.head_dim * self.kv_itemsize

    @property
    def read_kv_bytes(self) -> int:
        """Bytes of K and V the queries can see (``kv_bytes``, or the window's keys only)."""
        return self.kv_bytes * self.visible_keys // self.seqlen_k if self.seqlen_k else 0

    @property
    def meta_bytes(self) -> int:
        """Bytes of the block table (int32), the fp32 k/v descales ``[B, H_kv]`` and the fp32
        sinks ``[H_q]`` a call reads."""
        table = 4 * self.batch * self.pages_per_row
        descales = 2 * 4 * self.batch * self.num_heads_kv if self.fp8 else 0
        sinks = 4 * self.num_heads if self.sinks else 0
        return table + descales + sinks

    @property
    def q_bytes(self) -> int:
        """Bytes of q ``[B, L_q, H, D]`` (and of the output, its shape)."""
        return self.batch * self.seqlen_q * self.num_heads * self.head_dim * self.itemsize

    @property
    def rotary_positions(self) -> int:
        """Rows of the rotary tables: the capacity, plus the queries past the new keys (a query
        ``i`` rotates at ``cache_seqlens + i``, FlashAttention's causal convention), which is
        what decode asks of a table."""
        return self.capacity + max(0, self.seqlen_q - self.append)

    @property
    def append_bytes(self) -> int:
        """Bytes of an append: the new keys and values read (q's dtype) and written (the cache's),
        and the rotary tables' rows read (fp32 cos and sin, ``head_dim / 2`` each)."""
        new = 2 * self.batch * self.append * self.num_heads_kv * self.head_dim
        tables = 2 * 4 * self.batch * self.append * self.head_dim // 2 if self.rotary else 0
        return new * (self.itemsize + self.kv_itemsize) + tables

    @property
    def moved_bytes(self) -> int:
        """KV the queries see + block table / descales / sinks + q read + output written (+ an
        append's bytes): the bytes a GB/s figure counts (under a window, the window's keys only:
        all a decode must read; q and the output ``L_q`` times)."""
        return self.read_kv_bytes + self.meta_bytes + 2 * self.q_bytes + self.append_bytes

    @property
    def heads(self) -> str:
        return f"{self.num_heads}/{self.num_heads_kv}"

    def label(self) -> str:
        fmt = (f" paged/{self.page_size}" if self.paged else "") + (f" kv={self.kv}" if self.fp8 else "")
        variant = "" if self.variant.plain else f" {self.variant.label}"
        queries = f" L_q={self.seqlen_q}" if self.seqlen_q > 1 else ""
        return (f"B={self.batch} L_k={format_seqlen(self.seqlen_k)}{queries} H={self.heads} d={self.head_dim} "
                f"{self.dtype}{fmt}{variant}")


@dataclass(frozen=True)
class SkippedCell:
    """A grid cell left out, and why (a sentence)."""

    case: Case
    reason: str


# -- grid ------------------------------------------------------------------------------------

def rotation_count(set_bytes: int, l2_bytes: int = DEFAULT_L2_BYTES, mem_cap_bytes: float = math.inf,
                   factor: float = L2_FACTOR, touched_bytes: int | None = None) -> int:
    """How many input sets a timed loop cycles through so the KV is never served from L2.

    The smallest ``R`` with ``R * touched_bytes > factor * l2_bytes`` (``touched_bytes``: what one
    call reads of a set, by default all ``set_bytes``), capped by how many sets of ``set_bytes``
    fit in ``mem_cap_bytes`` (never below 1: a single set bigger than 3x the L2 cannot stay cached).

    Worked example, 60 MiB L2: B = 1, 32/8 heads, d = 128, 1k keys is a 4.2 MB set, so
    R = floor(188.7 MB / 4.2 MB) + 1 = 45; at 16k keys (67 MB) R = 3; at 128k keys (537 MB)
    R = 1. A 128-key window over those 128k keys reads 0.54 MB of each set: R = 352, or the 149
    sets that fit in 80 GB.
    """
    if set_bytes <= 0:
        raise ValueError(f"set_bytes: expected a positive byte count, got {set_bytes}")
    touched = set_bytes if touched_bytes is None else touched_bytes
    if touched <= 0:
        raise ValueError(f"touched_bytes: expected a positive byte count, got {touched_bytes}")
    wanted = int(factor * l2_bytes // touched) + 1
    fits = int(mem_cap_bytes // set_bytes) if math.isfinite(mem_cap_bytes) else wanted
    return max(1, min(wanted, fits))


def set_bytes(case: Case) -> int:
    """Device bytes of one input set (K, V, q, descales, sinks; pages are rounded up to whole pages)."""
    kv = case.kv_bytes * case.capacity // case.seqlen_k if case.seqlen_k else 0
    return kv + case.meta_bytes + case.q_bytes


def touched_bytes(case: Case) -> int:
    """Bytes of one input set a call reads: all of it, or under a window the window's keys only."""
    if case.window < 0:
        return set_bytes(case)
    return case.read_kv_bytes + case.meta_bytes + case.q_bytes


def case_rotation(case: Case, l2_bytes: int = DEFAULT_L2_BYTES, mem_cap_bytes: float = math.inf) -> int:
    """:func:`rotation_count` for ``case``: enough sets that the bytes its calls read exceed 3x
    the L2, as many as fit in ``mem_cap_bytes``."""
    return rotation_count(set_bytes(case), l2_bytes, mem_cap_bytes, touched_bytes=touched_bytes(case))


def rotation_note(case: Case, sets: int, l2_bytes: int = DEFAULT_L2_BYTES) -> str:
    """A warning when the memory cap left too few sets: their read bytes do not exceed 3x the L2
    (a short window over a long cache), so calls may read some KV from L2 ("" when they do)."""
    read = sets * touched_bytes(case)
    if read > L2_FACTOR * l2_bytes:
        return ""
    return (f"{sets} set(s) read {read / 1e6:.0f} MB per rotation, under {L2_FACTOR:g}x the "
            f"{l2_bytes / 2**20:.0f} MiB L2 (memory cap): some KV may be served from L2")


def variant_list(windows=(-1,), softcaps=(0.0,), sinks=(False,), batch_invariant=(False,),
                 baseline: bool = False, appends=(0,), rotary=(False,)) -> list[Variant]:
    """Every combination of the values, in order (window outermost), rotary only with an
    append; with ``baseline`` the plain variant comes first, so each variant has what it is
    compared with."""
    variants = [Variant(w, float(c), s, b, a, r) for w in windows for c in softcaps for s in sinks
                for b in batch_invariant for a in appends for r in rotary if a or not r]
    return list(dict.fromkeys(([PLAIN] if baseline else []) + variants))


def format_list(page_sizes=(0,), kv_dtypes=(SAME_KV,), baseline: bool = False) -> list[tuple[int, str]]:
    """Every (page_size, kv_dtype) pair, in order; with ``baseline`` the dense q-dtype format
    (and for an fp8 format, its 16-bit twin of the same page size) is added first where missing,
    so each format has what it is compared with."""
    formats = [(p, k) for p in page_sizes for k in kv_dtypes]
    if baseline:
        wanted = [DENSE_FORMAT] + [(p, SAME_KV) for p, k in formats if k != SAME_KV]
        formats = wanted + formats
    return list(dict.fromkeys(formats))


def skip_reason(case: Case, l2_bytes: int = DEFAULT_L2_BYTES, mem_cap_bytes: float = math.inf) -> str | None:
    """Why :func:`build_grid` leaves ``case`` out (None: it runs): an append or queries the cache
    cannot hold, or KV times its rotation count over ``mem_cap_bytes`` (the rotation count is
    capped by memory, so this means one set alone does not fit)."""
    if case.append >= case.seqlen_k:
        return f"an append of {case.append} keys needs a cache of more keys"
    if case.seqlen_q > case.seqlen_k:
        return f"{case.seqlen_q} queries per row need a cache of at least as many keys"
    sets = case_rotation(case, l2_bytes, mem_cap_bytes)
    if set_bytes(case) * sets > mem_cap_bytes:
        return (f"KV {case.kv_bytes / 1e9:.1f} GB x {sets} set(s) exceeds the {mem_cap_bytes / 1e9:.0f} GB memory "
                f"cap (--mem-cap-gb)")
    return None


def build_grid(batches, seqlens, shape: Shape, dtype: str = "bf16", mem_cap_bytes: float = DEFAULT_MEM_CAP_GB * 1e9,
               l2_bytes: int = DEFAULT_L2_BYTES, formats=(DENSE_FORMAT,), variants=(PLAIN,),
               seqlens_q=(1,)) -> tuple[list[Case], list[SkippedCell]]:
    """The cells to run (batch-major, then seqlen_k, then seqlen_q, then cache format, then
    variant) and the cells skipped (:func:`skip_reason`).

    ``formats`` are ``(page_size, kv_dtype)`` pairs (see :func:`format_list`), ``variants``
    :class:`Variant` s (see :func:`variant_list`), ``seqlens_q`` queries per row (ints >= 1).
    """
    if dtype not in DTYPES:
        raise ValueError(f"dtype: expected one of {sorted(DTYPES)}, got {dtype!r}")
    for page_size, kv_dtype in formats:
        if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 0:
            raise ValueError(f"page_size: expected an int >= 0 (0 = dense), got {page_size!r}")
        if kv_dtype not in KV_DTYPES:
            raise ValueError(f"kv_dtype: expected one of {list(KV_DTYPES)}, got {kv_dtype!r}")
    for v in variants:
        if not isinstance(v, Variant):
            raise TypeError(f"variants: expected Variant instances, got {type(v).__name__}")
    for n in seqlens_q:
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"seqlens_q: expected ints >= 1 (queries per row), got {n!r}")
    cases: list[Case] = []
    skipped: list[SkippedCell] = []
    for batch, seqlen, seqlen_q in ((b, n, q) for b in batches for n in seqlens for q in seqlens_q):
        for (page_size, kv_dtype), v in ((f, v) for f in formats for v in variants):
            case = Case(batch, seqlen, shape.num_heads, shape.num_heads_kv, shape.head_dim, dtype, page_size,
                        kv_dtype, v.window, v.softcap, v.sinks, v.batch_invariant, v.append, v.rotary,
                        seqlen_q=seqlen_q)
            reason = skip_reason(case, l2_bytes, mem_cap_bytes)
            if reason is None:
                cases.append(case)
            else:
                skipped.append(SkippedCell(case, reason))
    return cases, skipped
