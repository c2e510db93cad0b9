"""Bottom-right causal masks for the torch contenders' calls with several queries per row.

With ``L_q > 1`` the bench's step is causal, bottom-right aligned (FlashAttention's
``causal=True``): query i of ``L_q`` sits at key position ``L_k - L_q + i`` and sees the keys up
to it. SDPA's ``is_causal`` aligns top-left instead (query i sees keys ``<= i``), so it is never
used; the masks here say what the bench means. ``L_k`` is the cell's ``seqlen_k``: these
contenders run only on full rows (no append), so every row has that many keys.
"""

from __future__ import annotations

import torch

from .cases import Case


def bottom_right_visible(seqlen_q: int, seqlen_k: int, device=None) -> torch.Tensor:
    """Bool ``[L_q, L_k]``: query i, at key position ``L_k - L_q + i``, sees the keys up to it."""
    return torch.ones(seqlen_q, seqlen_k, dtype=torch.bool, device=device).tril(seqlen_k - seqlen_q)


def sdpa_causal_mask(backend_attr: str, case: Case, device) -> tuple[object, str]:
    """SDPA's ``attn_mask`` for ``case``'s queries and a note naming it; ``(None, "")`` at ``L_q = 1``.

    The flash backend takes no mask tensor: it gets torch's ``causal_lower_right`` bias, which
    runs flash's own causal kernel (bottom-right aligned). Other backends (``backend_attr``, an
    ``SDPBackend`` name) get an additive ``[L_q, L_k]`` mask in q's dtype (0 / -inf), built once
    here so no mask conversion runs inside a timed call (SDPA converts a bool mask per call).
    """
    if not case.causal:
        return None, ""
    if backend_attr == "FLASH_ATTENTION":
        from torch.nn.attention.bias import causal_lower_right

        return causal_lower_right(case.seqlen_q, case.seqlen_k), "bottom-right causal: causal_lower_right"
    visible = bottom_right_visible(case.seqlen_q, case.seqlen_k, device)
    mask = torch.zeros(visible.shape, dtype=case.torch_dtype, device=device).masked_fill(~visible, float("-inf"))
    return mask, f"bottom-right causal: additive [{case.seqlen_q}, {case.seqlen_k}] mask"


def sdpa_refused(e: BaseException) -> bool:
    """Whether an SDPA error says no enabled kernel takes the call (CUDA: "No available kernel";
    CPU: "No viable backend")."""
    return "No available kernel" in str(e) or "No viable backend" in str(e)


def flex_block_mask(case: Case, device):
    """FlexAttention's ``block_mask`` for ``case``'s queries: query i sees keys ``<= L_k - L_q + i``;
    None at ``L_q = 1`` (no mask: the plain FlexDecoding call)."""
    if not case.causal:
        return None
    from torch.nn.attention.flex_attention import create_block_mask

    offset = case.seqlen_k - case.seqlen_q

    def bottom_right(b, h, q_idx, kv_idx):
        return kv_idx <= q_idx + offset

    return create_block_mask(bottom_right, None, None, case.seqlen_q, case.seqlen_k, device=device)
