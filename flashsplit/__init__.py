"""flashsplit: split-KV ("Flash-Decoding") attention for LLM decode on Hopper GPUs.

    out = flashsplit.decode(q, k_cache, v_cache, cache_seqlens=seqlens)

See :func:`decode`, :func:`combine` and :func:`plan`.
"""

from .api import combine, decode, plan
from .debug import check_inputs
from .plan import MAX_SPLITS, SPLIT_GRANULE, SplitPlan, split_bounds
from .registry import names as backends

__all__ = ["decode", "combine", "plan", "check_inputs", "SplitPlan", "split_bounds", "backends", "MAX_SPLITS", "SPLIT_GRANULE"]
__version__ = "0.1.0"
