"""What one split CTA works on: its grid coordinates and its keys, read by every warp role."""

from __future__ import annotations

from dataclasses import dataclass

from cutlass import Int32


@dataclass(frozen=True)
class CtaWork:
    """Grid ``(split, batch row, KV head x row block)``: CTA ``(split_idx, batch_idx, z_idx)``
    owns the keys ``[start, end)`` of its split (``flashsplit.cute.split_rule``; the row holds
    ``n_keys``), which are ``num_tiles`` KV tiles from ``first_tile`` on, and row tile
    ``row_block`` of KV head ``kvh``'s ``seqlen_q * group`` packed q rows. A windowed
    configuration also carries its runtime bounds (``window_left``, ``window_right``; None where
    off) and, with a left bound or left padding, ``cta_first``: the first key any query of the
    CTA sees (the CTA's tiles start at the tile holding it; V rows before it are zeroed); with
    left padding, ``leftpad``: the row's first key."""

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
