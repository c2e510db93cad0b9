"""One decode call's arguments, bundled once, as they travel from the public API to the kernels.

:func:`flashsplit.decode` builds a :class:`DecodeTensors` and a :class:`DecodeOptions`; the
validation (:func:`flashsplit.validation.check_decode_inputs`), the signature cache
(:mod:`flashsplit.dispatch`), the torch.compile operator (:mod:`flashsplit.torch_ops`, whose
schema is generated from these fields) and every backend's prepared launcher take the same two
bundles, so an argument is named in one order, here.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class DecodeTensors(NamedTuple):
    """The tensors of one decode call (shapes for a dense cache; see :func:`flashsplit.decode`)."""

    q: torch.Tensor  #: ``[B, L_q, H_q, D]`` fp16/bf16
    k_cache: torch.Tensor  #: ``[B, L_k, H_kv, D]``, or ``[num_pages, page_size, H_kv, D]`` with a block table
    v_cache: torch.Tensor  #: like ``k_cache``
    out: torch.Tensor  #: ``[B, L_q, H_q, D]`` in q's dtype, written
    lse: torch.Tensor | None = None  #: fp32 ``[B, H_q, L_q]``, written when given
    cache_seqlens: torch.Tensor | None = None  #: int32 ``[B]``
    block_table: torch.Tensor | None = None  #: int32 ``[B, max_pages_per_row]``
    k_descale: torch.Tensor | None = None  #: fp32, one element or ``[B, H_kv]`` (fp8 caches)
    v_descale: torch.Tensor | None = None  #: like ``k_descale``
    sinks: torch.Tensor | None = None  #: fp32 or bf16 ``[H_q]``: a learned logit per q head
    #: ``[B, L_new, H_kv, D]`` in q's dtype: new keys written into the cache before the attention
    k_new: torch.Tensor | None = None
    v_new: torch.Tensor | None = None  #: like ``k_new``: new values
    rotary_cos: torch.Tensor | None = None  #: ``[L_ro, rotary_dim / 2]``: rotary table for the new keys and q
    rotary_sin: torch.Tensor | None = None  #: like ``rotary_cos``
    cache_batch_idx: torch.Tensor | None = None  #: int32 ``[B]``: the dense cache row each batch row uses
    cache_leftpad: torch.Tensor | None = None  #: int32 ``[B]``: the first key of each row


class DecodeOptions(NamedTuple):
    """The non-tensor arguments of one decode call (static: part of its signature)."""

    softmax_scale: float | None = None
    causal: bool = False
    num_splits: int = 0
    backend: str = "auto"
    window_size: tuple[int, int] = (-1, -1)
    softcap: float = 0.0
    batch_invariant: bool = False
    #: GPT-J pairs (True) or GPT-NeoX halves (False) for ``rotary_cos``/``rotary_sin``.
    rotary_interleaved: bool = True


#: Tensors the call writes (the operator's schema marks them mutated).
WRITTEN = ("out", "lse")
#: Tensors a call with new keys (``k_new``/``v_new``) also writes.
APPENDED = ("k_cache", "v_cache")
#: Tensors every call has (the others may be None).
REQUIRED = ("q", "k_cache", "v_cache", "out")
#: Schema types of the options (torch.library), in field order.
OPTION_TYPES = {"softmax_scale": "float?", "causal": "bool", "num_splits": "int", "backend": "str",
                "window_size": "int[]", "softcap": "float", "batch_invariant": "bool", "rotary_interleaved": "bool"}


def operator_schema(appends: bool = False) -> str:
    """The ``torch.library`` schema of ``flashsplit::decode_into`` (``appends``: of
    ``flashsplit::decode_append_into``, which also writes the caches), from the fields above."""
    written = WRITTEN + APPENDED if appends else WRITTEN
    tensors = []
    for i, name in enumerate(DecodeTensors._fields):
        alias = f"({chr(ord('a') + written.index(name))}!)" if name in written else ""
        optional = "" if name in REQUIRED else "?"
        tensors.append(f"Tensor{alias}{optional} {name}")
    options = [f"{OPTION_TYPES[name]} {name}" for name in DecodeOptions._fields]
    return "(" + ", ".join(tensors + options) + ") -> ()"


def cache_capacity(k_cache: torch.Tensor, block_table: torch.Tensor | None) -> int:
    """Keys a row can hold: the dense cache's dim 1, or pages per row x page size."""
    return k_cache.shape[1] if block_table is None else block_table.shape[1] * k_cache.shape[1]
