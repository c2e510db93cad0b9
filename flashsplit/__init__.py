"""flashsplit: split-KV ("Flash-Decoding") attention for LLM decode on Hopper GPUs.

    out = flashsplit.decode(q, k_cache, v_cache, cache_seqlens=seqlens)

See :func:`decode`, :func:`combine` and :func:`plan`; :func:`flash_attn_with_kvcache` takes
FlashAttention's signature (new-token append, left padding, rotary). :func:`mla_decode` decodes
multi-head latent attention (DeepSeek-V3 family); :func:`flash_mla_with_kvcache` takes FlashMLA's.
"""

from .api import combine, decode, plan
from .debug import check_inputs
from .kvcache import flash_attn_with_kvcache
from .mla import flash_mla_with_kvcache, get_mla_metadata, mla_decode, mla_plan
from .plan import MAX_SPLITS, SPLIT_GRANULE, SplitPlan, split_bounds
from .registry import names as backends

__all__ = ["decode", "combine", "plan", "check_inputs", "flash_attn_with_kvcache", "mla_decode", "mla_plan",
           "get_mla_metadata", "flash_mla_with_kvcache", "SplitPlan", "split_bounds", "backends", "MAX_SPLITS", "SPLIT_GRANULE"]
__version__ = "0.1.0"
