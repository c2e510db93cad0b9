"""The attention variants' compile-check configurations (windows, softcap, sinks, batch invariance).

Pure Python (no cutlass import). A variant changes the consumer's scores and masks, the CTA's
keys and the final writes, not the loads: the list covers each variant on each consumer (64
rows, swapped operands), each load mode (dense, whole-tile, sub-tile and gathered pages), each
cache type and each output (final, partials, merge), and their combinations, rather than the
whole product. :func:`flashsplit.cute.config_lists.compile_check_configs` appends it.
"""

from __future__ import annotations

from .configs import GATHER_EXAMPLE_PAGE, SWAP_AB_ROWS, SplitConfig, split_config


def variant_check_configs() -> list[SplitConfig]:
    """Every variant alone on the 64-row and swapped consumers, in each load mode, cache type,
    tile and output it can take, then the variants together."""
    swap, gather = SWAP_AB_ROWS, GATHER_EXAMPLE_PAGE
    left, right, cap, inv = (dict(left_bound=True), dict(right_bound=True), dict(softcap=True),
                             dict(invariant=True))
    c = split_config
    configs = [
        # A left window bound: the CTA's first tile, the V rows before its first key, the mask.
        c("bfloat16", 128, True, False, **left), c("float16", 64, False, True, **left),
        c("bfloat16", 256, True, True, merge=True, **left),
        c("float16", 128, False, True, True, page_size=128, **left),
        c("bfloat16", 128, True, False, True, page_size=16, **left),
        c("float16", 64, True, True, True, page_size=gather, **left),
        c("bfloat16", 128, True, True, kv_dtype="float8_e4m3fn", **left),
        c("float16", 64, False, False, True, "float8_e5m2", 16, **left),
        c("bfloat16", 128, True, False, swap_rows=swap, **left), c("float16", 64, False, True, swap_rows=swap, **left),
        c("bfloat16", 256, True, True, True, page_size=16, merge=True, swap_rows=swap, **left),
        c("bfloat16", 128, True, True, merge=True, one_per_sm=True, **left),
        c("float16", 128, False, True, merge=True, one_wave=True, **left),
        # A right bound other than causal's.
        c("bfloat16", 128, False, False, **right), c("float16", 64, False, True, swap_rows=swap, **right),
        c("bfloat16", 256, False, True, True, page_size=gather, kv_dtype="float8_e4m3fn", **right),
        # Softcap.
        c("float16", 64, False, False, **cap), c("bfloat16", 128, True, True, kv_dtype="float8_e5m2", **cap),
        c("bfloat16", 128, False, False, swap_rows=swap, **cap), c("float16", 256, True, True, merge=True, **cap),
        c("bfloat16", 128, False, True, True, page_size=16, **cap),
        # Sinks where a final result is written: one split's epilogue, the merge tail.
        c("bfloat16", 128, True, False, sinks="float32"), c("float16", 64, False, False, swap_rows=swap,
                                                              sinks="bfloat16"),
        c("bfloat16", 128, False, True, merge=True, sinks="float16"),
        c("float16", 128, True, True, merge=True, swap_rows=swap, sinks="float32"),
        c("bfloat16", 64, False, False, kv_dtype="float8_e4m3fn", sinks="bfloat16"),
        c("float16", 256, False, True, True, page_size=gather, merge=True, sinks="float32"),
        # Batch-invariant splits (partials for the combine, on the two-CTA tile).
        c("bfloat16", 128, True, True, **inv), c("float16", 64, False, True, True, page_size=16, **inv),
        c("bfloat16", 128, False, True, kv_dtype="float8_e4m3fn", **inv),
        c("float16", 256, True, True, True, page_size=gather, **inv),
    ]
    # Left padding: the row's first key (splits, skipped tiles, V rows zeroed, the mask), alone
    # and beside a left window bound; gathered and whole pages are cache_batch_idx's dense rows.
    pad = dict(leftpad=True)
    configs += [
        c("bfloat16", 128, True, False, **pad), c("float16", 64, False, True, True, page_size=gather, **pad),
        c("bfloat16", 128, True, True, True, page_size=16, merge=True, swap_rows=swap, **pad),
        c("bfloat16", 128, False, True, kv_dtype="float8_e4m3fn", merge=True, swap_rows=swap, left_bound=True,
          **pad),
        c("bfloat16", 128, False, True, kv_dtype="float8_e4m3fn", invariant=True, **pad),
        c("float16", 128, True, True, True, page_size=128, left_bound=True, **pad),
        c("bfloat16", 128, True, True, merge=True, one_per_sm=True, **pad),
        c("float16", 128, False, True, merge=True, one_wave=True, left_bound=True, **pad),
        c("float16", 64, False, False, True, "float8_e5m2", 16, **pad),
    ]
    every = dict(left_bound=True, softcap=True)
    configs += [
        c("bfloat16", 128, True, False, sinks="bfloat16", **every),
        c("float16", 128, True, True, merge=True, swap_rows=swap, sinks="float32", **every),
        c("bfloat16", 64, False, False, kv_dtype="float8_e5m2", swap_rows=swap, sinks="bfloat16", right_bound=True,
          **every),
        c("bfloat16", 64, False, True, True, "float8_e4m3fn", 16, right_bound=True, invariant=True, **every),
        c("float16", 128, False, True, True, page_size=128, right_bound=True, invariant=True, **every),
    ]
    return configs
