"""``check_inputs``: the value checks ``decode`` cannot make without a host sync.

``decode`` validates shapes, dtypes, devices and layouts only, so it never waits for the GPU
and can be captured in a CUDA graph. Values it trusts: ``cache_seqlens`` within the cache's
capacity, page ids within the paged cache, finite positive fp8 scales. This helper checks
those too, explicitly, by copying them to the host: call it while debugging, not per step.
"""

from __future__ import annotations

import torch

from .call import DecodeOptions, DecodeTensors
from .plan import cdiv
from .validation import MAX_SOFTMAX_SCALE, check_decode_inputs, check_softmax_scale


def check_inputs(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    *,
    cache_seqlens: torch.Tensor | None = None,
    block_table: torch.Tensor | None = None,
    page_table: torch.Tensor | None = None,
    k_descale: torch.Tensor | None = None,
    v_descale: torch.Tensor | None = None,
    causal: bool = False,
    num_splits: int = 0,
    out: torch.Tensor | None = None,
    softmax_scale: float | None = None,
) -> None:
    """Raise ``ValueError``/``TypeError`` for anything :func:`flashsplit.decode` would reject,
    and for the values it cannot check (this synchronizes with the device):

    - ``cache_seqlens[b]`` in ``[0, capacity]`` (``L_k``, or ``max_pages * page_size``);
    - for a paged cache, every page id a row uses (the first ``ceil(cache_seqlens[b] /
      page_size)`` entries of its ``block_table`` row) in ``[0, num_pages)``;
    - fp8 scales finite and positive, and ``|softmax_scale| * k_descale`` within the bound
      decode puts on ``softmax_scale`` alone (2^64: an fp8 cache's scores are ``softmax_scale *
      k_descale * q . k`` in fp32, see :func:`flashsplit.validation.check_softmax_scale`).
    """
    if page_table is not None:
        if block_table is not None:
            raise ValueError("page_table: an alias of block_table; pass one of them, not both")
        block_table = page_table
    problem = check_decode_inputs(
        DecodeTensors(q, k_cache, v_cache, out, None, cache_seqlens, block_table, k_descale, v_descale),
        DecodeOptions(causal=causal, num_splits=num_splits))
    scale = check_softmax_scale(softmax_scale, problem.head_dim)
    capacity = problem.seqlen_k
    lengths = [capacity] * problem.batch if cache_seqlens is None else cache_seqlens.tolist()
    for b, n in enumerate(lengths):
        if not 0 <= n <= capacity:
            raise ValueError(f"cache_seqlens: row {b} has {n} keys, outside [0, {capacity}] (the cache's capacity)")
    if block_table is not None:
        table = block_table.cpu()
        num_pages = k_cache.shape[0]
        for b, n in enumerate(lengths):
            used = table[b, : cdiv(n, problem.page_size)]
            bad = ((used < 0) | (used >= num_pages)).nonzero()
            if len(bad):
                i = int(bad[0])
                raise ValueError(
                    f"block_table: row {b} entry {i} is page {int(used[i])}, outside [0, {num_pages}) "
                    f"(the row's {n} keys use its first {len(used)} entries)"
                )
    for name, descale in (("k_descale", k_descale), ("v_descale", v_descale)):
        if descale is not None and not bool(torch.all(torch.isfinite(descale) & (descale > 0))):
            raise ValueError(f"{name}: expected finite positive scales, got {descale.flatten()[:8].tolist()}")
    if k_descale is not None and k_descale.numel() and abs(scale) * float(k_descale.max()) > MAX_SOFTMAX_SCALE:
        raise ValueError(f"k_descale: |softmax_scale| * k_descale reaches {abs(scale) * float(k_descale.max()):.3g}, "
                         f"past 2**64: fp32 scores could overflow")
