"""Multi-head latent attention (MLA) decode for the DeepSeek-V3 family (docs/mla.md).

    out = flashsplit.mla_decode(q, kv_cache, cache_seqlens, block_table=block_table)

Layers, as for ``decode``: api -> validation (an :class:`~flashsplit.mla.problem.MlaProblem`)
-> registry / selection (the backend) -> plan (the split count, MLA as the shared plan's MQA
case) -> backend (triton_backend, cute_backend) -> kernel (triton_kernel; the cute kernel lives
in ``flashsplit.cute``) and flashsplit's Triton combine.
"""

from .api import MlaMetadata, flash_mla_with_kvcache, get_mla_metadata, mla_decode, mla_plan
from .problem import MlaProblem

__all__ = ["mla_decode", "mla_plan", "get_mla_metadata", "flash_mla_with_kvcache", "MlaMetadata", "MlaProblem"]
