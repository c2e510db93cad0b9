"""The attention mask of a prefill forward, built only in the form its layers read.

transformers builds each layer type's mask once per forward, through the implementation's mask
function, before any layer runs. SDPA's boolean mask is ``[B, 1, L_q, L_k]`` bytes (16 GiB per
row at a 128k prompt, and the sliding-window pattern briefly takes three times that), while a
FlexAttention layer (softcap, sinks) needs only a block mask of ``L_q x L_k / 128^2`` entries. So
a forward with more than ``max_decode_queries`` queries gets a :class:`PrefillMask`, which keeps
transformers' arguments (the mask pattern, the 2D padding mask, the offsets) and builds the dense
mask (SDPA layers) or the block mask (FlexAttention layers) on first use, once per forward.
Decode steps get SDPA's boolean mask as before (``split_kv_mask``).
"""

from __future__ import annotations

import torch

from .flex_prefill import block_mask_from

try:
    from torch.nn.attention.flex_attention import BlockMask as _MaskBase
except ImportError:  # torch before FlexAttention: no prefill goes through it
    _MaskBase = object


def make_mask_function(max_decode_queries: int):
    """The mask function to register in transformers' ``AttentionMaskInterface``: ``sdpa_mask``'s
    boolean mask for a decode forward, a :class:`PrefillMask` for a longer one."""

    def split_kv_mask(batch_size: int, q_length: int, kv_length: int, **kwargs):
        if q_length > max_decode_queries:
            # The mask is built after the first layer's cache update, which advances a StaticCache's
            # length in place; ``q_offset`` is that very tensor once the cache holds tokens (a
            # second prompt, a continued chat, a chunked prefill): snapshot the tensors now.
            kwargs = {key: value.clone() if isinstance(value, torch.Tensor) else value
                      for key, value in kwargs.items()}
            return PrefillMask(dict(kwargs, batch_size=batch_size, q_length=q_length, kv_length=kv_length))
        from transformers.masking_utils import sdpa_mask

        return sdpa_mask(batch_size=batch_size, q_length=q_length, kv_length=kv_length, **kwargs)

    return split_kv_mask


class PrefillMask(_MaskBase):
    """One layer type's mask for a prefill forward: ``sdpa_mask``'s arguments, and the masks built
    from them so far (every layer of the type shares this object).

    It passes for a 4D mask where transformers checks one (a ``BlockMask`` subclass with a
    ``shape``): static-cache ``generate`` builds the masks before the forward, which then takes a
    4D mask as already prepared. It holds none of a BlockMask's tensors; only this integration's
    attention reads it, through :meth:`dense` and :meth:`block_mask`.
    """

    def __init__(self, mask_kwargs: dict) -> None:  # noqa: D107  (no BlockMask state: see the class)
        self.mask_kwargs = mask_kwargs
        self._dense = self._block = None
        self._dense_built = False

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """``(B, 1, L_q, L_k)``, as the dense mask's."""
        kw = self.mask_kwargs
        return kw["batch_size"], 1, kw["q_length"], kw["kv_length"]

    def __repr__(self) -> str:
        return f"PrefillMask(shape={self.shape})"

    def dense(self):
        """SDPA's boolean ``[B, 1, L_q, L_k]`` mask (True: attend), or None where SDPA's
        ``is_causal`` covers it: what ``sdpa_mask`` returns."""
        if not self._dense_built:
            from transformers.masking_utils import sdpa_mask

            self._dense, self._dense_built = sdpa_mask(**self.mask_kwargs), True
        return self._dense

    def block_mask(self, device: torch.device):
        """The same pattern as a FlexAttention ``BlockMask``: the mask function, the padding and
        the offsets evaluated per key block (compiled on a GPU), never as a dense tensor."""
        if self._block is None:
            from transformers.masking_utils import (add_offsets_to_mask_function, and_masks, padding_mask_function,
                                                    prepare_padding_mask)

            kw = self.mask_kwargs
            q_offset, kv_offset = kw.get("q_offset", 0), kw.get("kv_offset", 0)
            mask_function, batch = kw["mask_function"], None
            if kw.get("attention_mask") is not None:
                padding = prepare_padding_mask(kw["attention_mask"].bool(), kw["kv_length"], kv_offset)
                mask_function, batch = and_masks(mask_function, padding_mask_function(padding)), kw["batch_size"]
            mask_function = add_offsets_to_mask_function(mask_function, q_offset, kv_offset)
            self._block = block_mask_from(mask_function, batch, kw["q_length"], kw["kv_length"], device)
        return self._block
