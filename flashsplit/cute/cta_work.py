"""What one split CTA works on: its grid coordinates and its keys, read by every warp role."""

from __future__ import annotations

from dataclasses import dataclass, replace

import cutlass.cute as cute
from cutlass import Int32

from . import split_rule


def launch_grid(split_ctas, batch, row_tiles, heads_first: bool) -> list:
    """The split kernel's grid: ``(split_ctas, batch, row_tiles)``, or with ``heads_first``
    (``SplitConfig.heads_first``) ``(row_tiles, split_ctas, batch)``; ``row_tiles`` = KV heads x
    row blocks."""
    if heads_first:
        return [row_tiles, split_ctas, batch]
    return [split_ctas, batch, row_tiles]


def grid_coords(heads_first: bool):
    """This CTA's ``(split CTA, batch row, row tile)`` in the :func:`launch_grid` of that order,
    and the grid's ``(split CTAs, row tiles)``: the extents a CTA's run of splits and its row
    tile's arrival counter ``batch row x row tiles + row tile`` count with."""
    bx, by, bz = cute.arch.block_idx()
    gx, gy, gz = cute.arch.grid_dim()
    if heads_first:
        return by, bz, bx, gy, gx
    return bx, by, bz, gx, gz


@dataclass(frozen=True)
class CtaWork:
    """Grid ``(split, batch row, KV head x row block)``: CTA ``(split_idx, batch_idx, z_idx)``
    owns the keys ``[start, end)`` of its split (``flashsplit.cute.split_rule``; the row holds
    ``n_keys``), which are ``num_tiles`` KV tiles from ``first_tile`` on, and row tile
    ``row_block`` of KV head ``kvh``'s ``seqlen_q * group`` packed q rows. A windowed
    configuration also carries its runtime bounds (``window_left``, ``window_right``; None where
    off) and, with a left bound or left padding, ``cta_first``: the first key any query of the
    CTA sees (the CTA's tiles start at the tile holding it; V rows before it are zeroed); with
    left padding, ``leftpad``: the row's first key. A batch-invariant CTA runs ``split_count``
    consecutive splits from ``split_idx`` on (its keys ``[start, end)`` and tiles are theirs
    together; :func:`split_work` gives each one's), from the row's first key ``first``."""

    tidx: Int32
    split_idx: Int32
    batch_idx: Int32
    z_idx: Int32
    kvh: Int32
    row_block: Int32
    seqlen_q: Int32
    group: Int32
    num_splits: Int32
    n_keys: Int32
    start: Int32
    end: Int32
    first_tile: Int32
    num_tiles: Int32
    window_left: Int32 | None = None
    window_right: Int32 | None = None
    cta_first: Int32 | None = None
    leftpad: Int32 | None = None
    first: Int32 | None = None
    split_count: Int32 | None = None


def split_work(work: CtaWork, split: Int32, tile_n: int) -> CtaWork:
    """``work`` narrowed to one of its splits, ``split``: that split's keys and tiles alone, as a
    CTA of that one split would own them (:func:`flashsplit.cute.split_rule.split_tiles`)."""
    start, end, first_tile, num_tiles = split_rule.split_tiles(work.n_keys, work.first, split, work.num_splits,
                                                               work.cta_first, tile_n, True)
    return replace(work, split_idx=split, start=start, end=end, first_tile=first_tile, num_tiles=num_tiles)


def output_row(mO, mLSE, work: CtaWork, packed, write_partials: bool):
    """Where the epilogue writes packed q row ``packed`` of ``work``'s row tile: ``(real, out,
    lse)``, whether it is a real row (not padding), its ``(D,)`` row of ``mO`` (the split's
    partial slot, or with ``write_partials`` off the final output) and its ``(1,)`` slot of
    ``mLSE``. Address arithmetic only (the division by the GQA group, the 64-bit offsets), which
    the consumers run before their first tile."""
    out_split = work.split_idx if write_partials else 0
    m = packed // work.group
    hq = work.kvh * work.group + packed % work.group
    lse = cute.local_tile(mLSE[out_split, work.batch_idx, hq, None], (1,), (m,))
    return packed < work.seqlen_q * work.group, mO[out_split, work.batch_idx, m, hq, None], lse
