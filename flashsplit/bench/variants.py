"""``--compare-variants``: the cost of an attention variant against plain decode.

Pure functions over :class:`~.rows.BenchRow` s (no GPU): for each contender, grid cell and
cache format, every variant row (a window, softcap, sinks, batch-invariant decode, or a
combination) is compared with the plain row of the same cell: ``ratio`` = variant time /
plain time. A window of ``w`` keys is also compared with the plain decode of a ``w + L_q``-key
cache (the keys the window shows the cell's ``L_q`` queries; ``w + 1`` at ``L_q = 1``), where the
grid has that cell (``--seqlen`` lists ``w + L_q``): ``short_ratio`` = windowed time /
short-cache time, the overhead of finding the window in a long cache over reading a cache that
short.
"""

from __future__ import annotations

from .rows import OK, SKIPPED, BenchRow, VariantComparison


def _cell(r: BenchRow, seqlen_k: int | None = None) -> tuple:
    """Contender, cell (its queries per row too) and cache format: what a variant and its plain baseline share."""
    return (r.contender, r.batch, r.seqlen_k if seqlen_k is None else seqlen_k, r.seqlen_q, r.num_heads,
            r.num_heads_kv, r.head_dim, r.dtype, r.page_size, r.kv)


def _timed(r: BenchRow | None) -> bool:
    return r is not None and r.status == OK and r.device_us is not None and r.device_us > 0


def _untimed(r: BenchRow, what: str) -> str:
    return f"{what} not timed ({r.status}{': ' + r.note if r.note else ''})"


def compare(row: BenchRow, base: BenchRow, short: BenchRow | None = None) -> VariantComparison:
    """One comparison of variant ``row`` with the plain ``base`` of its cell (and for a window,
    ``short``: the plain row of ``window + L_q`` keys, or None where the grid has none)."""
    c = VariantComparison(row.contender, row.batch, row.seqlen_k, row.num_heads, row.num_heads_kv, row.head_dim,
                          row.dtype, page_size=row.page_size, kv_dtype=row.kv, window=row.window,
                          softcap=row.softcap, sinks=row.sinks, batch_invariant=row.batch_invariant,
                          append=row.append, rotary=row.rotary, seqlen_q=row.seqlen_q,
                          short_seqlen=row.window + row.seqlen_q if row.window >= 0 else 0)
    notes = [_untimed(r, what) for r, what in ((row, "variant"), (base, "plain")) if not _timed(r)]
    if short is not None and not _timed(short):
        notes.append(_untimed(short, f"plain {c.short_seqlen}-key cache"))
    c.note = "; ".join(notes)
    if not _timed(row):
        return c
    c.us = row.device_us
    if _timed(base):
        c.base_us, c.ratio = base.device_us, row.device_us / base.device_us
    if _timed(short):
        c.short_us, c.short_ratio = short.device_us, row.device_us / short.device_us
    return c


def compare_variants(rows: list[BenchRow]) -> list[VariantComparison]:
    """Every comparison the rows allow, in row order: each variant row against the plain row
    of its contender, cell and cache format. A variant whose plain row was not run gets no
    comparison; one whose plain row (or itself) ran but was not timed gets a comparison
    without that number and a note saying why. A variant the contender skipped (it cannot run
    it: the rows say why) is not compared. Of repeated rows, the last counts."""
    plain: dict[tuple, BenchRow] = {}
    last: dict[tuple, BenchRow] = {}
    for r in rows:
        last[(_cell(r), r.variant)] = r
        if r.variant.plain:
            plain[_cell(r)] = r
    out: list[VariantComparison] = []
    for r in rows:
        if r.variant.plain or r.status == SKIPPED or last[(_cell(r), r.variant)] is not r:
            continue
        base = plain.get(_cell(r))
        if base is None:
            continue
        seen = r.window + r.seqlen_q  # the keys the window shows the row's queries
        short = plain.get(_cell(r, seen)) if 0 <= r.window and seen < r.seqlen_k else None
        out.append(compare(r, base, short))
    return out
