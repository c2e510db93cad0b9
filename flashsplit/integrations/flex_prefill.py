"""Prefill of attention layers with a softcap or sinks through PyTorch's FlexAttention: O(L) memory.

SDPA has neither a softcap (Gemma 2) nor sinks (gpt-oss), and a model's eager attention builds
``[B, H, L_q, L_k]`` scores, which at a 16k prompt no longer fit beside the model. FlexAttention
computes the same attention in one fused kernel over the blocks that a block mask keeps:

- the softcap is a ``score_mod`` on the scaled scores: ``softcap * tanh(score / softcap)``;
- sinks (one logit per head that takes part in the softmax but has no value) rescale the output
  with the log-sum-exp FlexAttention returns: ``out * sigmoid(lse - sink)``;
- the mask is the boolean one transformers builds (True: attend; causal, windowed, left padding),
  or, when it builds none, causal with the queries at the last keys, within the window;
- GQA runs on the KV heads in place (``enable_gqa``).

On a GPU the kernel is compiled once per shape (``torch.compile`` of ``flex_attention``); inside an
outer ``torch.compile`` the call traces with the rest. Elsewhere FlexAttention runs eagerly.
"""

from __future__ import annotations

import contextlib
import warnings

import torch

_COMPILED = {}


def flex_prefill(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask, scaling=None,
                 sliding_window=None, softcap=None, sinks=None, block_mask=None, compiled: bool | None = None
                 ) -> torch.Tensor:
    """Attention of ``query`` ``[B, H, L_q, D]`` over ``key``/``value`` ``[B, H_kv, L_k, D]``
    (``H`` a multiple of ``H_kv``) under ``attention_mask`` (bool ``[B or 1, 1, L_q, L_k]``, True:
    attend; or None: causal, the queries at the last ``L_q`` keys, within ``sliding_window`` keys
    counting the query's own), scores scaled by ``scaling`` (default ``D ** -0.5``), capped by
    ``softcap`` (0/None: none), with ``sinks`` (float ``[H]``, or None). ``block_mask``: a
    FlexAttention ``BlockMask`` to use instead of ``attention_mask`` (which must then be None).
    ``compiled``: run the compiled kernels (default: on a GPU, outside an outer torch.compile).
    Returns ``[B, L_q, H, D]`` in the query's dtype; a query that sees no key gets zeros."""
    from torch.nn.attention.flex_attention import AuxRequest

    batch, num_heads, seqlen_q, head_dim = query.shape
    seqlen_k = key.shape[2]
    if compiled is None:
        compiled = query.is_cuda and not torch.compiler.is_compiling()
    if block_mask is None:
        mask_mod = _mask_mod(attention_mask, seqlen_q, seqlen_k, sliding_window)
        mask_batch = None if attention_mask is None or attention_mask.shape[0] == 1 else batch
        block_mask = block_mask_from(mask_mod, mask_batch, seqlen_q, seqlen_k, query.device, compiled)
    elif attention_mask is not None:
        raise ValueError("attention_mask: expected None with a block_mask")
    score_mod = _softcap_mod(float(softcap)) if softcap else None
    with warnings.catch_warnings(), _no_recompile_limit(compiled):
        # Off the GPU FlexAttention runs unfused and says so on every call; the result is the same.
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
        out, aux = _compiled("flex_attention", compiled)(
            query, key, value, score_mod=score_mod, block_mask=block_mask, scale=scaling,
            enable_gqa=key.shape[1] != num_heads, return_aux=AuxRequest(lse=True))
    lse = aux.lse  # [B, H, L_q], natural log
    if sinks is not None:
        # softmax over the keys and the sink: the keys' share is exp(lse) / (exp(lse) + exp(sink)).
        share = torch.sigmoid(lse.float() - sinks.float()[None, :, None])  # [B, H, L_q]
        out = (out.float() * share[..., None]).to(query.dtype)
    return out.transpose(1, 2)


def block_mask_from(mask_mod, batch, seqlen_q: int, seqlen_k: int, device: torch.device,
                    compiled: bool | None = None):
    """FlexAttention's ``BlockMask`` of ``mask_mod`` over ``[batch (None: any), L_q, L_k]``;
    ``compiled`` (default: on a GPU, outside an outer torch.compile) evaluates it per block in a
    compiled kernel (the eager evaluation builds the dense ``[B, H, L_q, L_k]`` mask first)."""
    if compiled is None:
        compiled = torch.device(device).type == "cuda" and not torch.compiler.is_compiling()
    with _no_recompile_limit(compiled):
        return _compiled("create_block_mask", compiled)(mask_mod, batch, None, seqlen_q, seqlen_k, device=device)


def _compiled(name: str, compiled: bool):
    """``flex_attention`` or ``create_block_mask``, through one ``torch.compile`` wrapper per
    process when ``compiled`` (uncompiled, both evaluate the dense scores or mask)."""
    from torch.nn.attention import flex_attention as flex

    function = getattr(flex, name)
    if not compiled:
        return function
    if name not in _COMPILED:
        _COMPILED[name] = torch.compile(function)  # as transformers and torch compile both
    return _COMPILED[name]


def _no_recompile_limit(compiled: bool):
    """Every mask pattern, window and prompt length is a new specialization of the same two
    functions; past torch.compile's recompile limit (8) a call would run uncompiled, with dense
    ``L_q x L_k`` scores. The limit is lifted around these calls (as FlexAttention does itself)."""
    from torch._dynamo import utils

    lift = getattr(utils, "disable_cache_limit", None)
    return lift() if compiled and lift is not None else contextlib.nullcontext()


def _mask_mod(attention_mask, seqlen_q: int, seqlen_k: int, sliding_window):
    if attention_mask is not None:
        if attention_mask.dtype != torch.bool or attention_mask.dim() != 4:
            raise ValueError(f"attention_mask: expected a bool [B, 1, L_q, L_k] tensor or None, got "
                             f"{attention_mask.dtype} of shape {tuple(attention_mask.shape)}")
        mask = attention_mask[:, 0]
        if mask.shape[0] == 1:
            mask = mask[0]
            return lambda b, h, q, k: mask[q, k]
        return lambda b, h, q, k: mask[b, q, k]
    offset = seqlen_k - seqlen_q  # bottom-right alignment: query i sits at key offset + i
    if sliding_window:
        window = int(sliding_window)
        return lambda b, h, q, k: (k <= q + offset) & (k > q + offset - window)
    return lambda b, h, q, k: k <= q + offset


def _softcap_mod(softcap: float):
    def softcapped(score, b, h, q, k):
        return softcap * torch.tanh(score / softcap)

    return softcapped
