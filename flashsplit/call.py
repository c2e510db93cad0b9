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


class DecodeOptions(NamedTuple):
    """The non-tensor arguments of one decode call (static: part of its signature)."""

    softmax_scale: float | None = None
    causal: bool = False
    num_splits: int = 0
    backend: str = "auto"
    window_size: tuple[int, int] = (-1, -1)
    softcap: float = 0.0
    batch_invariant: bool = False


#: Tensors the call writes (the operator's schema marks them mutated).
WRITTEN = ("out", "lse")
#: Tensors every call has (the others may be None).
REQUIRED = ("q", "k_cache", "v_cache", "out")
#: Schema types of the options (torch.library), in field order.
OPTION_TYPES = {"softmax_scale": "float?", "causal": "bool", "num_splits": "int", "backend": "str",
                "window_size": "int[]", "softcap": "float", "batch_invariant": "bool"}


def operator_schema() -> str:
    """The ``torch.library`` schema of ``flashsplit::decode_into``, from the fields above."""
    tensors = []
    for i, name in enumerate(DecodeTensors._fields):
        alias = f"({chr(ord('a') + WRITTEN.index(name))}!)" if name in WRITTEN else ""
        optional = "" if name in REQUIRED else "?"
        tensors.append(f"Tensor{alias}{optional} {name}")
    options = [f"{OPTION_TYPES[name]} {name}" for name in DecodeOptions._fields]
    return "(" + ", ".join(tensors + options) + ") -> ()"
