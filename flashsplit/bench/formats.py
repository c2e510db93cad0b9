"""``--compare-formats``: paged and fp8 caches against their dense / 16-bit baselines.

Pure functions over :class:`~.rows.BenchRow` s (no GPU): for each contender, grid cell and
attention variant,

- a paged format (page size p, cache dtype k) is compared with the dense cache of dtype k:
  ``ratio`` = paged time / dense time (the cost of paging);
- an fp8 format (layout p) is compared with the 16-bit cache of layout p: ``speedup`` =
  16-bit time / fp8 time (the gain of reading half the bytes).

Where the performance targets set a goal, the comparison carries it (``target``) and whether
it was met: paged with 16-key pages within 10% of dense, 1-key pages within 25%, fp8 at least
1.7x faster than bf16 at L_k = 128k (set for an H200 at B in {1, 16}, L_k in {16k, 128k},
32/8 heads, d = 128; the bench applies them to any shape it runs, as a yardstick).
"""

from __future__ import annotations

import re

from .rows import OK, SKIPPED, BenchRow, FormatComparison

#: Largest paged / dense time ratio the targets accept, by page size.
PAGED_TARGETS = {16: 1.10, 1: 1.25}
#: Smallest 16-bit / fp8 speedup the targets ask for, and from which L_k on.
FP8_SPEEDUP_TARGET = 1.7
FP8_TARGET_MIN_SEQLEN = 131072


def _cell(r: BenchRow) -> tuple:
    """Contender, cell (its queries per row too) and attention variant: what a format and its baseline share."""
    return (r.contender, r.batch, r.seqlen_k, r.seqlen_q, r.num_heads, r.num_heads_kv, r.head_dim, r.dtype,
            r.variant)


def _timed(r: BenchRow) -> bool:
    return r.status == OK and r.device_us is not None and r.device_us > 0


def _untimed(r: BenchRow, what: str) -> str:
    return f"{what} not timed ({r.status}{': ' + r.note if r.note else ''})"


def _backend(r: BenchRow) -> str | None:
    """The flashsplit backend a row ran on, from its note (``"backend triton"``)."""
    m = re.search(r"\bbackend (\w+)", r.note)
    return m.group(1) if m else None


def compare(kind: str, row: BenchRow, base: BenchRow) -> FormatComparison:
    """One comparison of ``row`` (the format) with ``base`` (its baseline), same contender and cell."""
    c = FormatComparison(row.contender, row.batch, row.seqlen_k, row.num_heads, row.num_heads_kv, row.head_dim,
                         row.dtype, kind, page_size=row.page_size, kv_dtype=row.kv, window=row.window,
                         softcap=row.softcap, sinks=row.sinks, batch_invariant=row.batch_invariant,
                         append=row.append, rotary=row.rotary, seqlen_q=row.seqlen_q,
                         base_page_size=base.page_size, base_kv_dtype=base.kv)
    if kind == "paged" and row.page_size in PAGED_TARGETS:
        c.target = f"paged/dense <= {PAGED_TARGETS[row.page_size]:.2f}"
    elif kind == "fp8" and row.seqlen_k >= FP8_TARGET_MIN_SEQLEN:
        c.target = f"speedup >= {FP8_SPEEDUP_TARGET:.2f}"
    missing = [_untimed(r, what) for r, what in ((row, "format"), (base, "baseline")) if not _timed(r)]
    if missing:
        c.note = "; ".join(missing)
        return c
    c.us, c.base_us = row.device_us, base.device_us
    if _backend(row) != _backend(base):  # e.g. "auto": cute on the dense cache, triton on the paged one
        c.note = f"backends differ: {_backend(row)} vs {_backend(base)}"
    c.ratio = row.device_us / base.device_us
    c.speedup = base.device_us / row.device_us
    if kind == "paged" and row.page_size in PAGED_TARGETS:
        c.met = c.ratio <= PAGED_TARGETS[row.page_size]
    elif c.target:
        c.met = c.speedup >= FP8_SPEEDUP_TARGET
    return c


def compare_formats(rows: list[BenchRow]) -> list[FormatComparison]:
    """Every comparison the rows allow, in row order: each paged row against the dense row of
    its cache dtype, each fp8 row against the 16-bit row of its layout (same contender and
    cell). A format whose baseline was not run gets no comparison; one whose baseline (or
    itself) ran but was not timed gets a comparison without numbers and a note saying why. A
    format the contender skipped (it cannot take it: the rows say why) is not compared."""
    by_format: dict[tuple, dict[tuple[int, str], BenchRow]] = {}
    for r in rows:
        by_format.setdefault(_cell(r), {})[(r.page_size, r.kv)] = r
    out: list[FormatComparison] = []
    for r in rows:
        formats = by_format[_cell(r)]
        if formats.get((r.page_size, r.kv)) is not r or r.status == SKIPPED:
            continue  # a repeated (contender, cell, format): only the last counts
        if r.page_size > 0 and (0, r.kv) in formats:
            out.append(compare("paged", r, formats[(0, r.kv)]))
        if r.kv != r.dtype and (r.page_size, r.dtype) in formats:
            out.append(compare("fp8", r, formats[(r.page_size, r.dtype)]))
    return out
