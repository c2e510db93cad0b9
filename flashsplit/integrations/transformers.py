"""flashsplit as an attention implementation of Hugging Face transformers.

    import flashsplit.integrations.transformers as fs_transformers
    name = fs_transformers.register()                     # "split_kv"
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation=name)
    model.generate(**inputs, cache_implementation="static")

What runs where:

- **Decode steps** (at most ``max_decode_queries`` query tokens over a cache) run through
  :func:`flashsplit.decode`. The keys and values are the cache transformers hands the attention
  after its update (a DynamicCache's live tensor, a StaticCache's whole buffer), read in place
  (``[B, H_kv, L_k, D]`` transposed, no copy); each row's live keys ``[leftpad, seqlen)`` come
  from the attention mask on the device (:func:`~flashsplit.integrations.mask_rows.rows_from_mask`,
  no host sync; once per mask, not per layer), so left-padded batches and a StaticCache's empty slots need nothing more. A
  layer's sliding window (Mistral, Gemma 2/3, gpt-oss), softcap (Gemma 2), sinks (gpt-oss) and
  scale go to flashsplit as ``window_size``, ``softcap``, ``sinks``, ``softmax_scale``.
- **Prefill** (more query tokens, or a query block with no cache before it) goes to PyTorch SDPA
  (transformers' ``sdpa_attention_forward``), or, for a layer with a softcap or sinks (which SDPA
  does not have), to FlexAttention (:mod:`~flashsplit.integrations.flex_prefill`, O(L) memory);
  the model's own eager attention only for an additive mask or dropout in training.
- Anything flashsplit does not run (fp32 activations, head dims that are not a multiple of 8 or
  exceed 256, key and value head dims that differ, dropout in training, an additive float mask,
  a bidirectional layer) also goes to that prefill path.

For compiled decoding of sliding-window models, :func:`full_length_static_cache` builds a
StaticCache whose sliding layers do not recompile the step at every token.

``register()`` also registers ``"paged|" + name`` for continuous batching
(``model.generate_batch``): :mod:`flashsplit.integrations.transformers_paged`.

The name must not contain ``"flash"`` (transformers would take it for a hub kernel), ``"sdpa"``
or ``"flex_attention"`` (it would apply those implementations' checks), ``"|"``, ``"/"`` or ``":"``.
transformers is imported only when :func:`register` is called: flashsplit imports without it.
"""

from __future__ import annotations

import torch

from ..api import decode
from .mask_rows import RowsCache
from .prefill_mask import make_mask_function
from .static_cache import full_length_static_cache  # noqa: F401  (public here)
from .transformers_paged import make_paged_attention
from .transformers_routing import DEFAULT_MAX_DECODE_QUERIES, DecodeSettings, decode_blocker, prefill_attention

#: The name :func:`register` uses by default.
DEFAULT_NAME = "split_kv"
#: Each mask's rows, read once per forward and layer type (eager).
MASK_ROWS = RowsCache()
_RESERVED = ("flash", "sdpa", "flex_attention", "|", "/", ":")
_INSTALL_HINT = "pip install 'flashsplit[transformers]'"


def register(name: str = DEFAULT_NAME, *, backend: str = "auto",
             max_decode_queries: int = DEFAULT_MAX_DECODE_QUERIES) -> str:
    """Register flashsplit with transformers' ``AttentionInterface`` and ``AttentionMaskInterface``
    as ``name`` (and ``"paged|" + name`` for continuous batching); returns ``name``, for
    ``from_pretrained(..., attn_implementation=name)`` or ``model.set_attn_implementation(name)``.

    ``backend``: flashsplit's backend for the decode steps (``"auto"``, ``"triton"``, ``"cute"``).
    ``max_decode_queries``: query tokens per row up to which a step runs through flashsplit
    (1 or more); longer blocks (prefill) go to SDPA. Registering again replaces the settings.
    Raises ``ImportError`` without transformers, ``TypeError``/``ValueError`` for a bad argument.
    """
    settings = _check_register_args(name, backend, max_decode_queries)
    try:
        from transformers import AttentionInterface, AttentionMaskInterface
    except ImportError as error:
        raise ImportError(f"flashsplit.integrations.transformers needs transformers ({_INSTALL_HINT})") from error

    AttentionInterface.register(name, make_attention(settings))
    # Decode steps read the live keys from SDPA's boolean mask (True: attend); a prefill forward's
    # mask is built only in the form its layers read (dense for SDPA, blocks for FlexAttention).
    AttentionMaskInterface.register(name, make_mask_function(settings.max_decode_queries))
    # Continuous batching switches a model to "paged|" + its implementation.
    AttentionInterface.register(f"paged|{name}", make_paged_attention(settings))
    return name


def _check_register_args(name, backend, max_decode_queries) -> DecodeSettings:
    if not isinstance(name, str) or not name:
        raise TypeError(f"name: expected a non-empty str, got {name!r}")
    reserved = [word for word in _RESERVED if word in name]
    if reserved or name == "eager":
        why = (f"contains {reserved[0]!r}, which transformers reads as another implementation or a hub kernel"
               if reserved else "is transformers' own implementation")
        raise ValueError(f"name: {name!r} {why}; pick another name (e.g. {DEFAULT_NAME!r})")
    if not isinstance(backend, str):
        raise TypeError(f"backend: expected a str, got {type(backend).__name__}")
    from ..registry import names

    if backend != "auto" and backend not in names():
        raise ValueError(f"backend: expected 'auto' or one of {sorted(names())}, got {backend!r}")
    if isinstance(max_decode_queries, bool) or not isinstance(max_decode_queries, int):
        raise TypeError(f"max_decode_queries: expected an int, got {type(max_decode_queries).__name__}")
    if max_decode_queries < 1:
        raise ValueError(f"max_decode_queries: expected >= 1, got {max_decode_queries}")
    return DecodeSettings(backend, max_decode_queries)


def make_attention(settings: DecodeSettings):
    """The attention function transformers calls for every layer (its ``AttentionInterface``
    signature), decoding through flashsplit with ``settings``."""

    def split_kv_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        """``query`` ``[B, H, L_q, D]``, ``key``/``value`` ``[B, H_kv, L_k, D]`` (the cache after its
        update), ``attention_mask`` bool ``[B, 1, L_q, L_k]`` or None -> (``[B, L_q, H, D]``, None)."""
        if decode_blocker(module, query, key, value, attention_mask, dropout, settings, kwargs) is not None:
            return prefill_attention(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout,
                                     **kwargs)
        return decode_attention(module, query, key, value, attention_mask, scaling, settings, **kwargs), None

    return split_kv_attention


def decode_attention(module, query, key, value, attention_mask, scaling, settings: DecodeSettings,
                     sliding_window=None, softcap=None, s_aux=None, **kwargs) -> torch.Tensor:
    """One decode step through :func:`flashsplit.decode`: ``[B, L_q, H, D]``."""
    batch, num_heads, seqlen_q, head_dim = query.shape
    cache_seqlens = cache_leftpad = None
    if attention_mask is not None:
        cache_seqlens, cache_leftpad = MASK_ROWS(attention_mask, batch)
    # transformers' sliding_window counts the query itself: keys (p - window, p].
    window = (sliding_window - 1, 0) if sliding_window else (-1, -1)
    if s_aux is not None and (s_aux.dim() != 1 or s_aux.shape[0] != num_heads):
        raise ValueError(f"s_aux: expected one sink logit per q head ([{num_heads}]), got shape {tuple(s_aux.shape)}")
    out = torch.empty((batch, seqlen_q, num_heads, head_dim), dtype=query.dtype, device=query.device)
    decode(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), out=out, cache_seqlens=cache_seqlens,
           cache_leftpad=cache_leftpad, softmax_scale=scaling, causal=seqlen_q > 1, window_size=window,
           softcap=float(softcap or 0.0), sinks=None if s_aux is None else s_aux.detach().contiguous(),
           backend=settings.backend)
    return out
