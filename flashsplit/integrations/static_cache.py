"""A transformers ``StaticCache`` for compiled decoding of sliding-window models.

transformers' sliding-window cache layer (``StaticSlidingWindowLayer``, Mistral, Gemma 2/3,
gpt-oss) keeps the last ``window`` tokens by rolling its buffer, and counts the tokens it has seen
in a Python int. The mask offsets come from that int, which changes at every step: a compiled
forward recompiles at each new value, then (automatic dynamic shapes) records a new CUDA graph
for each one, whatever the attention. :func:`full_length_static_cache` gives every layer a
full-length buffer instead: no roll, no changing int, one graph; the window stays in the mask and
in the ``sliding_window`` the model passes its attention, so flashsplit reads only the window's
keys. The cost is memory: a sliding layer holds the whole context, as a full-attention layer does.
"""

from __future__ import annotations


def full_length_static_cache(config, max_cache_len: int, **kwargs):
    """A ``transformers.StaticCache`` for ``config`` whose every layer holds ``max_cache_len``
    tokens (``[B, H_kv, max_cache_len, D]`` keys and values each, allocated at the first update).
    ``kwargs`` go to ``StaticCache`` (``offloading``, ...). Pass it to ``generate`` as
    ``past_key_values`` (or to your own compiled decode loop)."""
    from transformers import StaticCache
    from transformers.cache_utils import StaticLayer, StaticSlidingWindowLayer

    if isinstance(max_cache_len, bool) or not isinstance(max_cache_len, int) or max_cache_len < 1:
        raise ValueError(f"max_cache_len: expected a positive int, got {max_cache_len!r}")
    cache = StaticCache(config=config, max_cache_len=max_cache_len, **kwargs)
    cache.layers = [StaticLayer(max_cache_len=max_cache_len) if isinstance(layer, StaticSlidingWindowLayer) else layer
                    for layer in cache.layers]
    return cache
