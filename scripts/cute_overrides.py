"""Development overrides of the cute backend's compile keys, for measuring a tile before a rule
takes it (``scripts/b1_latency.py`` and ``scripts/cute_timeline.py`` use them).

    with swapped_stages(5):     # launches on the swapped-operand kernel: 5 K+V stages, one CTA per SM
        graph = capture(...)
    with swapped_stages(3, tile_n=128):   # ... 3 stages of 128-key tiles
"""

from __future__ import annotations

import contextlib
import dataclasses

import flashsplit.registry
from flashsplit.cute import configs


@contextlib.contextmanager
def swapped_stages(stages: int, tile_n: int = 0):
    """Every split config with swapped operands that compiles or is prepared inside the block
    takes ``stages`` K+V stages at one CTA per SM (the shared memory of more than three d = 128
    stages leaves room for one), and with ``tile_n`` tiles of that many keys (64 or 128: a
    divisor of the split granule; each barrier and wait of a tile then serves ``tile_n`` keys);
    prepared launchers are dropped on entry and exit, so the next call builds its config again.
    The plan still sizes the split count and grid for the rule's own tile: a launch of more
    CTAs than SMs (a forced ``cute:s32:stN``, a batch planned at two CTAs per SM) then runs in
    waves of one CTA per SM, and its time is not that of the tile in one wave; the default
    B = 1, 32/8 cells plan one CTA per SM already."""
    original = configs.split_config

    def deeper(*args, **kwargs):
        config = original(*args, **kwargs)
        if config.swap_rows:
            config = dataclasses.replace(config, stages=stages, units_per_sm=1, tile_n=tile_n or config.tile_n)
            configs.check_smem(config)
        return config

    configs.split_config = deeper
    flashsplit.registry.invalidate()
    try:
        yield
    finally:
        configs.split_config = original
        flashsplit.registry.invalidate()
