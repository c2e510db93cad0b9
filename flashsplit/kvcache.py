"""``flash_attn_with_kvcache``: FlashAttention's decode entry point, on flashsplit.

A drop-in for FlashAttention-3's ``flash_attn_interface.flash_attn_with_kvcache`` (and FA2's
``flash_attn.flash_attn_with_kvcache``: ``block_table`` is accepted as FA2's name of
``page_table``) for the decode calls engines make: new-token append, paged caches, left padding,
``cache_batch_idx``, rotary, fp8 caches, windows, softcap. It maps onto :func:`flashsplit.decode`.
"""

from __future__ import annotations

import torch

from .api import decode

#: FlashAttention arguments flashsplit does not implement, with what each would need; they
#: raise a ``ValueError`` naming them unless left at their defaults.
UNIMPLEMENTED = {
    "qv": "a second query for an extra value head dimension (FlashAttention-3's MLA path)",
    "cu_seqlens_q": "variable-length (packed) queries",
    "cu_seqlens_k_new": "variable-length (packed) new keys",
    "rotary_seqlens": "explicit rotary positions",
    "q_descale": "an fp8 query",
    "alibi_slopes": "ALiBi biases",
}


def flash_attn_with_kvcache(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor | None = None,
    v: torch.Tensor | None = None,
    *,
    qv=None,
    rotary_cos: torch.Tensor | None = None,
    rotary_sin: torch.Tensor | None = None,
    cache_seqlens: int | torch.Tensor | None = None,
    cache_batch_idx: torch.Tensor | None = None,
    cache_leftpad: torch.Tensor | None = None,
    page_table: torch.Tensor | None = None,
    block_table: torch.Tensor | None = None,
    cu_seqlens_q=None,
    cu_seqlens_k_new=None,
    max_seqlen_q: int | None = None,
    rotary_seqlens=None,
    q_descale=None,
    k_descale: torch.Tensor | None = None,
    v_descale: torch.Tensor | None = None,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    attention_chunk: int = 0,
    softcap: float = 0.0,
    rotary_interleaved: bool = True,
    scheduler_metadata=None,
    num_splits: int = 0,
    pack_gqa: bool | None = None,
    sm_margin: int = 0,
    return_softmax_lse: bool = False,
    sinks: torch.Tensor | None = None,
    alibi_slopes=None,
    backend: str = "auto",
):
    """FlashAttention-3's ``flash_attn_with_kvcache``, with its semantics (its docstring is the
    contract), computed by :func:`flashsplit.decode`.

    ``q``, ``k_cache``, ``v_cache``, ``k``, ``v`` may be passed by position; the rest by name
    (FA2 and FA3 order their later parameters differently: FA3 puts ``qv`` sixth).

    - ``k``, ``v`` ``[B, L_new, H_kv, D]``: written into the caches in place at keys
      ``[cache_seqlens[b], cache_seqlens[b] + L_new)`` of row b (dense, through ``page_table``,
      or in cache row ``cache_batch_idx[b]``); the attention then covers those keys too, and
      ``cache_seqlens`` is not changed. An fp8 cache stores ``k / k_descale``.
    - ``cache_seqlens``: int32 ``[B]`` or an int (every row); default: full rows.
    - ``cache_leftpad`` int32 ``[B]``: row b's keys start there; positions (causal, window,
      rotary) count from it.
    - ``cache_batch_idx`` int32 ``[B]``: row b uses cache row ``cache_batch_idx[b]`` (dense caches).
    - ``rotary_cos``/``rotary_sin`` ``[L_ro, rotary_dim / 2]``: rotate the new keys at positions
      ``cache_seqlens - cache_leftpad + t``, and q at the same positions when causal or windowed,
      else at ``cache_seqlens - cache_leftpad``; ``rotary_interleaved`` picks GPT-J pairs (True)
      or GPT-NeoX halves. The caller's q is not changed. ``L_ro``: at least the cache's
      capacity, and ``capacity + L_q - L_new`` for more queries than new keys rotated per token
      (causal or windowed), as :func:`flashsplit.decode` says.
    - ``page_table`` (or FA2's ``block_table``) int32 ``[B, max_pages]`` for a paged cache
      ``[num_pages, page_size, H_kv, D]``, any page size.
    - ``k_descale``/``v_descale``: fp32, one element or ``[B, H_kv]``, for an fp8 cache (the
      query stays 16-bit: ``q_descale`` is not implemented).
    - ``softmax_scale``, ``causal`` (bottom-right aligned), ``window_size``, ``softcap``,
      ``num_splits`` (0: flashsplit's heuristic), ``sinks`` (fp32 ``[H_q]`` learned logits,
      gpt-oss) as in :func:`flashsplit.decode`; ``backend`` picks flashsplit's backend.
    - Accepted and ignored, as they only tune FlashAttention's own kernels: ``pack_gqa`` (flashsplit
      always packs the q heads of a KV head into one tile), ``sm_margin``, ``scheduler_metadata``
      (FlashAttention's precomputed split plan; flashsplit plans from static shapes, once per call
      signature), and ``max_seqlen_q`` (only meaningful with ``cu_seqlens_q``).
    - Not implemented, a ``ValueError`` naming them unless left at their defaults: ``qv``,
      ``cu_seqlens_q``, ``cu_seqlens_k_new``, ``rotary_seqlens``, ``q_descale``, ``alibi_slopes``
      and ``attention_chunk > 0``.

    Returns ``out`` ``[B, L_q, H_q, D]`` in q's dtype, or ``(out, softmax_lse)`` with
    ``return_softmax_lse`` (fp32 ``[B, H_q, L_q]``, natural log). A query that sees no key gets
    O = 0 and LSE = -inf (FA3 gives +inf). Graph-capturable, as :func:`flashsplit.decode`.
    """
    given = {"qv": qv, "cu_seqlens_q": cu_seqlens_q, "cu_seqlens_k_new": cu_seqlens_k_new,
             "rotary_seqlens": rotary_seqlens, "q_descale": q_descale, "alibi_slopes": alibi_slopes}
    for name, value in given.items():
        if value is not None:
            raise ValueError(f"{name}: not implemented by flashsplit ({UNIMPLEMENTED[name]}); expected None")
    if isinstance(attention_chunk, bool) or not isinstance(attention_chunk, int):
        raise TypeError(f"attention_chunk: expected an int, got {type(attention_chunk).__name__}")
    if attention_chunk != 0:
        raise ValueError(f"attention_chunk: chunked attention is not implemented by flashsplit; expected 0, "
                         f"got {attention_chunk}")
    if isinstance(cache_seqlens, bool):
        raise TypeError("cache_seqlens: expected an int or an int32 tensor, got a bool")
    if isinstance(cache_seqlens, int):
        if not -2 ** 31 <= cache_seqlens < 2 ** 31:
            raise ValueError(f"cache_seqlens: expected an int32 value, got {cache_seqlens}")
        if not isinstance(q, torch.Tensor) or q.dim() < 1:
            raise TypeError(f"q: expected a torch.Tensor [batch, seqlen_q, num_heads, head_dim], got "
                            f"{type(q).__name__}")
        cache_seqlens = torch.full((q.shape[0],), cache_seqlens, dtype=torch.int32, device=q.device)
    if not isinstance(return_softmax_lse, bool):
        raise TypeError(f"return_softmax_lse: expected a bool, got {type(return_softmax_lse).__name__}")
    return decode(q, k_cache, v_cache, k=k, v=v, rotary_cos=rotary_cos, rotary_sin=rotary_sin,
                  cache_seqlens=cache_seqlens, cache_batch_idx=cache_batch_idx, cache_leftpad=cache_leftpad,
                  page_table=page_table, block_table=block_table, k_descale=k_descale, v_descale=v_descale,
                  softmax_scale=softmax_scale, causal=causal, window_size=window_size, softcap=softcap,
                  rotary_interleaved=rotary_interleaved, num_splits=num_splits, return_lse=return_softmax_lse,
                  sinks=sinks, backend=backend)
