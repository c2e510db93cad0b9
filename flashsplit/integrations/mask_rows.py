"""Each batch row's live keys, read from a boolean attention mask on the device (no host sync).

A decode step in transformers hands its attention a mask ``[B, 1, L_q, L_k]`` (True: the query
may attend to the key) over the cache it returns: a DynamicCache's live tensor, or a
StaticCache's whole buffer, where only the mask says which slots hold tokens and left padding
leaves pads at the front of every row. When generating, a row's visible keys are one run
``[first, last]`` per query (causal, maybe windowed), so the union over the queries of a row is
``[leftpad, seqlen)``: the ``cache_leftpad`` and ``cache_seqlens`` :func:`flashsplit.decode`
takes, with the queries at the row's last ``L_q`` positions (bottom-right causal alignment).
"""

from __future__ import annotations

import torch


def rows_from_mask(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(cache_seqlens, cache_leftpad)``, int32 ``[B]`` each, of a boolean ``mask`` ``[B, 1, L_q, L_k]``
    (or ``[B, L_q, L_k]``; any strides, a broadcast batch or query dim included).

    ``cache_seqlens[b]`` is one past the last key any query of row b sees, ``cache_leftpad[b]``
    the first such key; a row that sees no key gets ``(0, 0)``. Tensor ops only: capturable
    in a CUDA graph, traceable by torch.compile.
    """
    if mask.dtype != torch.bool:
        raise TypeError(f"mask: expected a bool tensor, got {mask.dtype}")
    if mask.dim() == 4:
        if mask.shape[1] != 1:
            raise ValueError(f"mask: expected one head ([B, 1, L_q, L_k]), got shape {tuple(mask.shape)}")
        mask = mask[:, 0]
    if mask.dim() != 3:
        raise ValueError(f"mask: expected [B, 1, L_q, L_k] or [B, L_q, L_k], got shape {tuple(mask.shape)}")
    seen = mask.any(dim=1)  # [B, L_k]: keys some query of the row sees
    slots = torch.arange(1, seen.shape[-1] + 1, dtype=torch.int32, device=seen.device)
    ends = torch.where(seen, slots, 0).amax(dim=-1)  # one past the last seen key; 0 for none
    starts = torch.where(seen, slots - 1, seen.shape[-1]).amin(dim=-1)
    starts = torch.minimum(starts, ends)  # a row with no key: (0, 0)
    return ends.to(torch.int32), starts.to(torch.int32)
