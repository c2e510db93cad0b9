"""What to benchmark: model-shape presets, option parsers and the (batch x seqlen_k) grid.

Pure Python; no GPU needed. A :class:`Case` is one cell of the grid: one decode step
(``L_q = 1``) over a full KV cache of ``seqlen_k`` keys per batch row, in one cache format
(dense or paged, 16-bit or fp8).
"""

from __future__ import annotations

import argparse
import math
import re
from dataclasses import dataclass

import torch

#: bench dtype names -> torch dtypes.
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}

#: ``--kv-dtype`` names -> the cache's torch dtype (None: q's dtype).
KV_DTYPES = {"same": None, "fp8e4m3": torch.float8_e4m3fn, "fp8e5m2": torch.float8_e5m2}
SAME_KV = "same"
#: The baseline cache format: dense, in q's dtype.
DENSE_FORMAT = (0, SAME_KV)

#: Default grid (the brief's): batch {1, 4, 16, 64} x seqlen_k {1k, 4k, 16k, 64k, 128k}.
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
}
DEFAULT_PRESET = "llama-3-8b"


def kv_name(dtype: str, kv_dtype: str) -> str:
    """The cache dtype's bench name: ``kv_dtype``, or q's ``dtype`` for ``"same"``."""
    return dtype if kv_dtype == SAME_KV else kv_dtype


def format_label(page_size: int, kv: str) -> str:
    """A cache format in a few characters: ``"dense bf16"``, ``"paged/16 fp8e4m3"``."""
    return f"{'dense' if page_size == 0 else f'paged/{page_size}'} {kv}"


@dataclass(frozen=True)
class Case:
    """One grid cell: q ``[batch, 1, num_heads, head_dim]``; a dense cache k/v ``[batch, seqlen_k,
    num_heads_kv, head_dim]``, or with ``page_size`` > 0 a paged one ``[num_pages, page_size,
    num_heads_kv, head_dim]`` with an int32 ``block_table`` ``[batch, pages_per_row]``; with an
    fp8 ``kv_dtype`` the cache is fp8 with fp32 descales per (row, KV head)."""

    batch: int
    seqlen_k: int
    num_heads: int
    num_heads_kv: int
    head_dim: int
    dtype: str = "bf16"
    page_size: int = 0          # 0: dense
    kv_dtype: str = SAME_KV     # a KV_DTYPES name; "same": q's dtype

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
    def meta_bytes(self) -> int:
        """Bytes of the block table (int32) and the fp32 k/v descales ``[B, H_kv]`` a call reads."""
        table = 4 * self.batch * self.pages_per_row
        descales = 2 * 4 * self.batch * self.num_heads_kv if self.fp8 else 0
        return table + descales

    @property
    def q_bytes(self) -> int:
        return self.batch * self.num_heads * self.head_dim * self.itemsize

    @property
    def moved_bytes(self) -> int:
        """KV read + block table / descales read + q read + output written: the bytes a GB/s figure counts."""
        return self.kv_bytes + self.meta_bytes + 2 * self.q_bytes

    @property
    def heads(self) -> str:
        return f"{self.num_heads}/{self.num_heads_kv}"

    def label(self) -> str:
        fmt = (f" paged/{self.page_size}" if self.paged else "") + (f" kv={self.kv}" if self.fp8 else "")
        return f"B={self.batch} L_k={format_seqlen(self.seqlen_k)} H={self.heads} d={self.head_dim} {self.dtype}{fmt}"


@dataclass(frozen=True)
class SkippedCell:
    """A grid cell left out, and why (a sentence)."""

    case: Case
    reason: str


# -- option parsers (argparse ``type=`` callables: they raise ArgumentTypeError) --------------

_SEQLEN_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kKmM]?)\s*$")


def parse_seqlen(text: str) -> int:
    """``"16k"`` -> 16384, ``"1m"`` -> 1048576, ``"4096"`` -> 4096 (k = 1024: cache sizes are binary)."""
    match = _SEQLEN_RE.match(str(text))
    if not match:
        raise argparse.ArgumentTypeError(f"expected a key count like 4096, 16k or 1m, got {text!r}")
    number, suffix = float(match.group(1)), match.group(2).lower()
    value = number * {"": 1, "k": 1024, "m": 1024 * 1024}[suffix]
    if value != int(value) or value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive whole number of keys, got {text!r}")
    return int(value)


def format_seqlen(n: int) -> str:
    """Inverse of :func:`parse_seqlen` where exact: 16384 -> ``"16k"``, 1000 -> ``"1000"``."""
    if n >= 1024 * 1024 and n % (1024 * 1024) == 0:
        return f"{n // (1024 * 1024)}m"
    if n >= 1024 and n % 1024 == 0:
        return f"{n // 1024}k"
    return str(n)


def _split_list(text: str) -> list[str]:
    parts = [p for p in re.split(r"[,\s]+", str(text).strip()) if p]
    if not parts:
        raise argparse.ArgumentTypeError(f"expected a non-empty list, got {text!r}")
    return parts


def parse_seqlen_list(text: str) -> list[int]:
    """``"1k,16k"`` -> ``[1024, 16384]`` (use with ``nargs="+"``; lists are flattened later)."""
    return [parse_seqlen(p) for p in _split_list(text)]


def parse_positive_int(text: str) -> int:
    try:
        value = int(str(text).strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def parse_int_list(text: str) -> list[int]:
    """``"1,4,16"`` -> ``[1, 4, 16]``."""
    return [parse_positive_int(p) for p in _split_list(text)]


def parse_splits(text: str) -> list[int]:
    """num_splits list for ``--sweep-splits``: ``"1-64"``, ``"1..64"`` or ``"1,2,4,30"``."""
    out: list[int] = []
    for part in _split_list(text):
        m = re.match(r"^(\d+)\s*(?:-|\.\.)\s*(\d+)$", part)
        if m:
            lo, hi = int(m.group(1)), int(m.group(2))
            if lo < 1 or hi < lo:
                raise argparse.ArgumentTypeError(f"expected a range lo-hi with 1 <= lo <= hi, got {part!r}")
            out.extend(range(lo, hi + 1))
        else:
            out.append(parse_positive_int(part))
    from ..plan import MAX_SPLITS

    if max(out) > MAX_SPLITS:
        raise argparse.ArgumentTypeError(f"num_splits above {MAX_SPLITS} are not supported, got {max(out)}")
    return sorted(set(out))


def parse_heads(text: str) -> tuple[int, int]:
    """``"32/8"`` -> ``(32, 8)``; q heads must be a multiple of KV heads."""
    m = re.match(r"^\s*(\d+)\s*/\s*(\d+)\s*$", str(text))
    if not m:
        raise argparse.ArgumentTypeError(f"expected Q/KV heads like 32/8, got {text!r}")
    q, kv = int(m.group(1)), int(m.group(2))
    if q < 1 or kv < 1 or q % kv:
        raise argparse.ArgumentTypeError(f"expected q heads a positive multiple of KV heads, got {text!r}")
    return q, kv


def parse_head_dim(text: str) -> int:
    from ..problem import MAX_HEAD_DIM

    value = parse_positive_int(text)
    if value % 8 or value > MAX_HEAD_DIM:
        raise argparse.ArgumentTypeError(f"expected a head dim that is a multiple of 8 up to {MAX_HEAD_DIM}, got {text!r}")
    return value


def parse_page_size(text: str) -> int:
    """``--page-size``: keys per page, 0 for a dense cache."""
    try:
        value = int(str(text).strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a page size (keys per page, 0 = dense), got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a page size >= 0 (0 = dense), got {text!r}")
    return value


def parse_page_size_list(text: str) -> list[int]:
    """``"0,1,16"`` -> ``[0, 1, 16]``."""
    return [parse_page_size(p) for p in _split_list(text)]


def parse_kv_dtype_list(text: str) -> list[str]:
    """``"same,fp8e4m3"`` -> ``["same", "fp8e4m3"]`` (names of :data:`KV_DTYPES`)."""
    out = []
    for part in _split_list(text):
        name = part.lower()
        if name not in KV_DTYPES:
            raise argparse.ArgumentTypeError(f"expected a KV dtype among {', '.join(KV_DTYPES)}, got {part!r}")
        out.append(name)
    return out


def flatten(lists) -> list[int]:
    """Flatten ``nargs="+"`` values of list-typed options, keeping order, dropping repeats."""
    seen: list[int] = []
    for item in lists:
        for v in item if isinstance(item, (list, tuple)) else [item]:
            if v not in seen:
                seen.append(v)
    return seen


# -- grid ------------------------------------------------------------------------------------

def rotation_count(set_bytes: int, l2_bytes: int = DEFAULT_L2_BYTES, mem_cap_bytes: float = math.inf,
                   factor: float = L2_FACTOR) -> int:
    """How many input sets a timed loop cycles through so the KV is never served from L2.

    The smallest ``R`` with ``R * set_bytes > factor * l2_bytes``, capped by how many sets fit
    in ``mem_cap_bytes`` (never below 1: a single set bigger than 3x the L2 cannot stay cached).

    Worked example, 60 MiB L2: B = 1, 32/8 heads, d = 128, 1k keys is a 4.2 MB set, so
    R = floor(188.7 MB / 4.2 MB) + 1 = 45; at 16k keys (67 MB) R = 3; at 128k keys R = 1.
    """
    if set_bytes <= 0:
        raise ValueError(f"set_bytes: expected a positive byte count, got {set_bytes}")
    wanted = int(factor * l2_bytes // set_bytes) + 1
    fits = int(mem_cap_bytes // set_bytes) if math.isfinite(mem_cap_bytes) else wanted
    return max(1, min(wanted, fits))


def set_bytes(case: Case) -> int:
    """Device bytes of one input set (K, V, q, descales; pages are rounded up to whole pages)."""
    kv = case.kv_bytes * case.capacity // case.seqlen_k if case.seqlen_k else 0
    return kv + case.meta_bytes + case.q_bytes


def format_list(page_sizes=(0,), kv_dtypes=(SAME_KV,), baseline: bool = False) -> list[tuple[int, str]]:
    """Every (page_size, kv_dtype) pair, in order; with ``baseline`` the dense q-dtype format
    (and for an fp8 format, its 16-bit twin of the same page size) is added first where missing,
    so each format has what it is compared with."""
    formats = [(p, k) for p in page_sizes for k in kv_dtypes]
    if baseline:
        wanted = [DENSE_FORMAT] + [(p, SAME_KV) for p, k in formats if k != SAME_KV]
        formats = wanted + formats
    return list(dict.fromkeys(formats))


def build_grid(batches, seqlens, shape: Shape, dtype: str = "bf16", mem_cap_bytes: float = DEFAULT_MEM_CAP_GB * 1e9,
               l2_bytes: int = DEFAULT_L2_BYTES, formats=(DENSE_FORMAT,)) -> tuple[list[Case], list[SkippedCell]]:
    """The cells to run (batch-major, then seqlen, then cache format) and the cells skipped by
    the memory cap.

    ``formats`` are ``(page_size, kv_dtype)`` pairs (see :func:`format_list`). A cell is skipped
    when its KV times its rotation count exceeds ``mem_cap_bytes`` (the rotation count is
    capped by memory, so this means one set alone does not fit).
    """
    if dtype not in DTYPES:
        raise ValueError(f"dtype: expected one of {sorted(DTYPES)}, got {dtype!r}")
    for page_size, kv_dtype in formats:
        if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 0:
            raise ValueError(f"page_size: expected an int >= 0 (0 = dense), got {page_size!r}")
        if kv_dtype not in KV_DTYPES:
            raise ValueError(f"kv_dtype: expected one of {list(KV_DTYPES)}, got {kv_dtype!r}")
    cases: list[Case] = []
    skipped: list[SkippedCell] = []
    for batch in batches:
        for seqlen in seqlens:
            for page_size, kv_dtype in formats:
                case = Case(batch, seqlen, shape.num_heads, shape.num_heads_kv, shape.head_dim, dtype, page_size,
                            kv_dtype)
                nbytes = set_bytes(case)
                sets = rotation_count(nbytes, l2_bytes, mem_cap_bytes)
                if nbytes * sets > mem_cap_bytes:
                    skipped.append(SkippedCell(case, f"KV {case.kv_bytes / 1e9:.1f} GB x {sets} set(s) exceeds the "
                                                     f"{mem_cap_bytes / 1e9:.0f} GB memory cap (--mem-cap-gb)"))
                else:
                    cases.append(case)
    return cases, skipped
