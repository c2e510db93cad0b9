"""Which path a transformers attention call takes through the integration: a decode step through
:func:`flashsplit.decode` (:func:`decode_blocker` says why not), or the prefill path
(:func:`prefill_attention`). Shared by the dense (:mod:`.transformers`) and the paged
(:mod:`.transformers_paged`) attention functions.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import torch

from .flex_prefill import flex_prefill
from .prefill_mask import PrefillMask

#: Query tokens per row up to which a step counts as decode (speculative drafts included).
DEFAULT_MAX_DECODE_QUERIES = 16
#: Activation dtypes flashsplit decodes (others go to SDPA / eager).
DECODE_DTYPES = (torch.float16, torch.bfloat16)


@dataclass(frozen=True)
class DecodeSettings:
    """How a registered implementation decodes: flashsplit's ``backend`` and the largest query
    block per row that still counts as a decode step."""

    backend: str = "auto"
    max_decode_queries: int = DEFAULT_MAX_DECODE_QUERIES


def decode_blocker(module, query, key, value, attention_mask, dropout, settings: DecodeSettings,
                   kwargs: dict) -> str | None:
    """Why this call does not run through flashsplit (None: it does). Reads static facts only
    (shapes, dtypes, module flags), so it costs no host sync and traces under torch.compile."""
    seqlen_q, seqlen_k = query.shape[2], key.shape[2]
    if seqlen_q > settings.max_decode_queries:
        return f"{seqlen_q} query tokens: prefill"
    if seqlen_q > 1 and (attention_mask is None or seqlen_k <= seqlen_q):
        return "a query block with no cache before it: prefill"
    if query.dtype not in DECODE_DTYPES or key.dtype != query.dtype or value.dtype != query.dtype:
        return f"dtype {query.dtype}: flashsplit decodes fp16 and bf16"
    head_dim = query.shape[-1]
    if key.shape[-1] != head_dim or value.shape[-1] != head_dim or head_dim % 8 or head_dim > 256:
        return f"head dims q/k/v {head_dim}/{key.shape[-1]}/{value.shape[-1]}: flashsplit takes one of 8..256"
    if attention_mask is not None and (not isinstance(attention_mask, torch.Tensor)
                                       or attention_mask.dtype != torch.bool):
        return "a mask that is not boolean (an additive bias)"
    if module.training and dropout:
        return "dropout in training"
    if not kwargs.get("is_causal", getattr(module, "is_causal", True)):
        return "bidirectional attention"
    return None


def prefill_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """What a step flashsplit does not decode runs: transformers' SDPA; for a layer with a softcap
    or sinks (SDPA has neither), FlexAttention (:func:`~flashsplit.integrations.flex_prefill.flex_prefill`,
    O(L) memory) under a :class:`~flashsplit.integrations.prefill_mask.PrefillMask` (its block
    mask), a boolean mask or none, else the model's own eager attention (an additive mask, dropout
    in training)."""
    softcap, sinks = kwargs.get("softcap"), kwargs.get("s_aux")
    if softcap or sinks is not None:
        lazy = isinstance(attention_mask, PrefillMask)
        flex_mask = lazy or attention_mask is None or (isinstance(attention_mask, torch.Tensor)
                                                       and attention_mask.dtype == torch.bool)
        if flex_mask and not (module.training and dropout):
            out = flex_prefill(query, key, value, None if lazy else attention_mask, scaling=scaling,
                               sliding_window=kwargs.get("sliding_window"), softcap=softcap,
                               sinks=None if sinks is None else sinks.detach(),
                               block_mask=attention_mask.block_mask(query.device) if lazy else None)
            return out, None
    if isinstance(attention_mask, PrefillMask):
        attention_mask = attention_mask.dense()
    if softcap or sinks is not None:
        eager = getattr(sys.modules.get(type(module).__module__), "eager_attention_forward", None)
        if eager is None:
            raise ValueError(f"{type(module).__name__}: a layer with a softcap or sinks needs its model's "
                             f"eager_attention_forward for an additive mask, and {type(module).__module__} has none")
        if isinstance(attention_mask, torch.Tensor) and attention_mask.dtype == torch.bool:
            attention_mask = additive_mask(attention_mask, query.dtype)
        return eager(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout,
                                  **kwargs)


def additive_mask(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean mask (True: attend) as the additive one eager attention adds to its scores."""
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, torch.finfo(dtype).min)
