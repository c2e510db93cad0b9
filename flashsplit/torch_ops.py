"""``torch.ops.flashsplit.decode_into``: decode as a PyTorch custom operator, for torch.compile.

Dynamo cannot trace through Triton's or CuteDSL's launchers, so under ``torch.compile``
:func:`flashsplit.decode` allocates its outputs in the graph and calls this operator, which
the compiler treats as one opaque node (no graph break). Eager calls do not go through the
dispatcher at all: its per-call cost would count against the decode step's host time.
"""

from __future__ import annotations

import torch


@torch.library.custom_op("flashsplit::decode_into", mutates_args=("out", "lse"))
def decode_into(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_seqlens: torch.Tensor | None,
    block_table: torch.Tensor | None,
    k_descale: torch.Tensor | None,
    v_descale: torch.Tensor | None,
    out: torch.Tensor,
    lse: torch.Tensor | None,
    softmax_scale: float | None,
    causal: bool,
    num_splits: int,
    backend: str,
) -> None:
    """Write ``decode(q, k_cache, v_cache, ...)`` into ``out`` ``[B, L_q, H_q, D]`` and, when
    given, its log-sum-exp into ``lse`` fp32 ``[B, H_q, L_q]``. Validates like ``decode``."""
    from .api import decode_into as eager_decode_into

    eager_decode_into(q, k_cache, v_cache, out, lse, cache_seqlens=cache_seqlens, block_table=block_table,
                      k_descale=k_descale, v_descale=v_descale, softmax_scale=softmax_scale, causal=causal,
                      num_splits=num_splits, backend=backend)


@decode_into.register_fake
def _decode_into_fake(q, k_cache, v_cache, cache_seqlens, block_table, k_descale, v_descale, out, lse,
                      softmax_scale, causal, num_splits, backend) -> None:
    return None
