"""The CuTe kernels' configuration lists: every split configuration the backend can select, the
compile check's list (those, the merge / tile / consumer / launch variants, the attention
variants) and every combine configuration.

Pure Python (no cutlass import), like :mod:`~flashsplit.cute.configs`, whose compile keys these
lists enumerate; the compile test (``tests/test_cute_compile.py``) builds them.
"""

from __future__ import annotations

from .configs import (COMBINE_OUT_DTYPES, DTYPES, GATHER_EXAMPLE_PAGE, HEAD_DIMS, KV_DTYPES, ONE_WAVE_STAGES,
                      SINK_DTYPES, SWAP_AB_ROWS, CombineConfig, SplitConfig, split_config, split_tile,
                      subtile_page_sizes)


def _gather_compile_pages(head_dim: int) -> tuple[int, ...]:
    """The page sizes that list the gathered compile keys (one, any head dim)."""
    return (GATHER_EXAMPLE_PAGE,)


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
    occurs (these modes change only the producer's loads and the staging); then the merge, tile
    and consumer variants and the attention variants. d = 96 builds every configuration of the
    d = 128 list at d = 96 (:func:`at_head_dim`), but those it has no kernel for (swapped
    operands, one CTA per SM, one-wave stages)."""
    base = _check_configs((64, 128, 256))
    at_96 = (at_head_dim(c, 96) for c in base if c.head_dim == 128)
    return list(dict.fromkeys(base + [c for c in at_96 if c is not None]))


def at_head_dim(config: SplitConfig, head_dim: int) -> SplitConfig | None:
    """``config``'s problem at another head dim, with that head dim's tile (``split_config``'s
    choice; page sizes and flags kept), or None where ``split_config`` refuses it."""
    page_size = None
    if config.paged:
        page_size = config.subtile_page or (GATHER_EXAMPLE_PAGE if config.gather_pages else split_tile(head_dim)[0])
    one_per_sm = config.head_dim == 128 and config.units_per_sm == 1 and not config.cluster
    one_wave = (config.head_dim == 128 and config.merge and not config.paged and not config.staged
                and not one_per_sm and config.stages == ONE_WAVE_STAGES)
    try:
        return split_config(config.dtype, head_dim, config.causal, config.write_partials, config.paged,
                            config.kv_dtype, page_size, config.merge, one_per_sm, one_wave, config.swap_rows,
                            left_bound=config.left_bound, right_bound=config.right_bound, softcap=config.softcap,
                            sinks=config.sinks, invariant=config.invariant, leftpad=config.leftpad,
                            heads_first=config.heads_first, cluster=config.cluster)
    except ValueError:
        return None


def _check_configs(head_dims: tuple[int, ...]) -> list[SplitConfig]:
    """:func:`compile_check_configs`'s list at ``head_dims``."""
    configs = [c for c in all_split_configs(subtile=False) if c.head_dim in head_dims]
    combos = [(dtype, causal, wp) for dtype in DTYPES for causal in (False, True) for wp in (False, True)]
    i = 0
    for pages_of in (subtile_page_sizes, _gather_compile_pages):
        for kv_dtype in KV_DTYPES:
            for head_dim in head_dims:
                for page_size in pages_of(head_dim):
                    dtype, causal, wp = combos[i % len(combos)]
                    configs.append(split_config(dtype, head_dim, causal, wp, True, kv_dtype, page_size))
                    i += 1
    # The last-CTA merge (a partials launch's tail; the loads before it do not matter): every
    # (cache type, head dim) dense with dtype and causal cycled, and whole-tile, sub-tile and
    # gathered pages once per head dim.
    for j, (kv_dtype, head_dim) in enumerate((kv, d) for kv in KV_DTYPES for d in head_dims):
        configs.append(split_config(DTYPES[j % 2], head_dim, j % 3 == 1, True, False, kv_dtype, merge=True))
    for head_dim, page_size in zip(head_dims, (GATHER_EXAMPLE_PAGE, 128, 16)):
        configs.append(split_config("bfloat16", head_dim, False, True, True, "same", page_size, merge=True))
    # The one-CTA-per-SM tile (dense 16-bit, d = 128): every dtype x causal x output, and merging.
    configs += [split_config(dtype, 128, causal, wp, one_per_sm=True)
                for dtype in DTYPES for causal in (False, True) for wp in (False, True)]
    configs.append(split_config("float16", 128, True, True, merge=True, one_per_sm=True))
    configs += [split_config("bfloat16", 128, False, True, True, page_size=p, merge=True, one_per_sm=True)
                for p in (128, 16)]  # TMA pages: whole-tile and sub-tile
    # Three stages for one-wave merging launches (dense 16-bit, d = 128): dtype x causal.
    configs += [split_config(dtype, 128, causal, True, merge=True, one_wave=True)
                for dtype in DTYPES for causal in (False, True)]
    # Swapped operands for 1-8 packed rows: every dtype x head dim x causal x output dense, whole-
    # tile and sub-tile pages per head dim, merging on each tile (two CTAs, one wave, one per SM).
    swap = SWAP_AB_ROWS
    configs += [split_config(dtype, head_dim, causal, wp, swap_rows=swap)
                for dtype in DTYPES for head_dim in head_dims for causal in (False, True) for wp in (False, True)]
    configs += [split_config(DTYPES[j % 2], head_dim, j % 2 == 0, True, True, page_size=p, swap_rows=swap)
                for j, (head_dim, p) in enumerate((d, p) for d in head_dims for p in (split_tile(d)[0], 16))]
    configs += [split_config(DTYPES[j % 2], head_dim, j % 2 == 1, True, merge=True, swap_rows=swap)
                for j, head_dim in enumerate(head_dims)]
    # fp8 caches on the swapped consumer (staged, converted): each fp8 type at each head dim, dense
    # with dtype, causal and output cycled (bf16 q: fp16 operands), merging, and in TMA pages.
    fp8_types = [kv for kv in KV_DTYPES if kv != "same"]
    configs += [split_config(DTYPES[(j + 1) % 2], head_dim, j % 3 == 0, j % 3 != 2, False, kv_dtype, swap_rows=swap)
                for j, (kv_dtype, head_dim) in enumerate((kv, d) for kv in fp8_types for d in head_dims)]
    configs += [split_config("bfloat16", head_dim, False, True, False, fp8_types[0], merge=True, swap_rows=swap)
                for head_dim in head_dims]
    configs += [split_config("bfloat16", 128, True, True, True, fp8_types[0], p, merge=True, swap_rows=swap)
                for p in (split_tile(128)[0], 16)]
    configs.append(split_config("bfloat16", 128, False, True, merge=True, one_wave=True, swap_rows=swap))
    configs += [split_config("float16", 128, True, wp, one_per_sm=True, swap_rows=swap) for wp in (False, True)]
    configs.append(split_config("bfloat16", 128, False, True, True, page_size=16, merge=True, one_per_sm=True,
                                swap_rows=swap))
    # CTAs launched KV heads first: one split, partials for a combine and merged in the tail on
    # the two-CTA tile, the one-CTA-per-SM tile merging in TMA pages, swapped operands merging,
    # batch-invariant partials (each reads its coordinates and its merge counter by the order).
    configs += [split_config("bfloat16", 128, False, wp, merge=merge, heads_first=True)
                for wp, merge in ((False, False), (True, False), (True, True))]
    configs.append(split_config("float16", 128, True, True, True, page_size=16, merge=True, one_per_sm=True,
                                heads_first=True))
    configs.append(split_config("bfloat16", 64, False, True, merge=True, swap_rows=swap, heads_first=True))
    configs.append(split_config("bfloat16", 128, False, True, invariant=True, heads_first=True))
    # Splits merged through one cluster (swapped operands, one CTA per SM): the smallest and the
    # largest cluster, causal fp16, d = 64, TMA pages, an fp8 cache.
    configs += [split_config("bfloat16", 128, False, True, merge=True, swap_rows=swap, cluster=c) for c in (2, 16)]
    configs.append(split_config("bfloat16", 128, False, True, kv_dtype="float8_e4m3fn", merge=True, swap_rows=swap,
                                cluster=8))
    configs.append(split_config("float16", 128, True, True, merge=True, swap_rows=swap, cluster=16))
    configs.append(split_config("bfloat16", 64, False, True, merge=True, swap_rows=swap, cluster=8))
    configs.append(split_config("bfloat16", 128, False, True, True, page_size=16, merge=True, swap_rows=swap,
                                cluster=16))
    # The attention variants (windows, softcap, sinks, batch invariance), each on every consumer,
    # load mode, cache type and output, and together.
    from .variant_configs import variant_check_configs

    return configs + variant_check_configs()


def all_combine_configs() -> list[CombineConfig]:
    """Every combine configuration: each output dtype and head dim, without sinks and with sinks
    of each dtype."""
    return [CombineConfig(dtype, head_dim, sinks) for sinks in ("",) + SINK_DTYPES for dtype in COMBINE_OUT_DTYPES
            for head_dim in HEAD_DIMS]
