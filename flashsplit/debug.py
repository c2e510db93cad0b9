"""``check_inputs``: the value checks ``decode`` cannot make without a host sync.

``decode`` validates shapes, dtypes, devices and layouts only, so it never waits for the GPU
and can be captured in a CUDA graph. Values it trusts: ``cache_seqlens`` within the cache's
capacity (with the new keys of an append), page ids within the paged cache, finite positive fp8
scales, left padding within each row, cache rows within the cache. This helper checks those
too, explicitly, by copying them to the host: call it while debugging, not per step.
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
    k: torch.Tensor | None = None,
    v: torch.Tensor | None = None,
    rotary_cos: torch.Tensor | None = None,
    rotary_sin: torch.Tensor | None = None,
    cache_batch_idx: torch.Tensor | None = None,
    cache_leftpad: torch.Tensor | None = None,
    window_size: tuple[int, int] = (-1, -1),
) -> None:
    """Raise ``ValueError``/``TypeError`` for anything :func:`flashsplit.decode` would reject,
    and for the values it cannot check (this synchronizes with the device):

    - ``cache_seqlens[b]`` in ``[0, capacity]`` (``L_k``, or ``max_pages * page_size``), and with
      new keys ``k``/``v`` of ``L_new`` tokens, ``cache_seqlens[b] + L_new <= capacity``;
    - for a paged cache, every page id a row uses (the first ``ceil(n / page_size)`` entries of
      its ``block_table`` row, ``n`` its keys after the append) in ``[0, num_pages)``;
    - ``cache_leftpad[b]`` in ``[0, cache_seqlens[b]]``; ``cache_batch_idx[b]`` in ``[0,
      k_cache.shape[0])``, distinct when ``k`` writes into those rows;
    - with rotary tables, every rotary position (of the new keys, and of q) within the tables;
    - fp8 scales finite and positive, and ``|softmax_scale| * k_descale`` within the bound
      decode puts on ``softmax_scale`` alone (2^64: an fp8 cache's scores are ``softmax_scale *
      k_descale * q . k`` in fp32, see :func:`flashsplit.validation.check_softmax_scale`).
    """
    if page_table is not None:
        if block_table is not None:
            raise ValueError("page_table: an alias of block_table; pass one of them, not both")
        block_table = page_table
    problem = check_decode_inputs(
        DecodeTensors(q, k_cache, v_cache, out, None, cache_seqlens, block_table, k_descale, v_descale, None,
                      k, v, rotary_cos, rotary_sin, cache_batch_idx, cache_leftpad),
        DecodeOptions(causal=causal, num_splits=num_splits, window_size=window_size))
    scale = check_softmax_scale(softmax_scale, problem.head_dim)
    capacity, new = problem.seqlen_k, problem.seqlen_new
    lengths = [capacity] * problem.batch if cache_seqlens is None else cache_seqlens.tolist()
    for b, n in enumerate(lengths):
        if not 0 <= n <= capacity:
            raise ValueError(f"cache_seqlens: row {b} has {n} keys, outside [0, {capacity}] (the cache's capacity)")
        if n + new > capacity:
            raise ValueError(f"cache_seqlens: row {b} has {n} keys and {new} new ones from k, past the cache's "
                             f"capacity {capacity}")
    pads = [0] * problem.batch if cache_leftpad is None else cache_leftpad.tolist()
    for b, (pad, n) in enumerate(zip(pads, lengths)):
        if not 0 <= pad <= n:
            raise ValueError(f"cache_leftpad: row {b} starts at key {pad}, outside [0, {n}] (its cache_seqlens)")
    _check_rows(cache_batch_idx, k_cache.shape[0], new > 0)
    if rotary_cos is not None:
        q_span = problem.seqlen_q if problem.rotary_q_per_token else 1
        for b, (pad, n) in enumerate(zip(pads, lengths)):
            last = n - pad + max(new, q_span) - 1
            if last >= rotary_cos.shape[0]:
                raise ValueError(f"rotary_cos: row {b} rotates position {last}, past the tables' "
                                 f"{rotary_cos.shape[0]} positions")
    lengths = [n + new for n in lengths]
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


def _check_rows(cache_batch_idx: torch.Tensor | None, cache_rows: int, written: bool) -> None:
    """``cache_batch_idx`` within the cache's ``cache_rows`` rows, and distinct when ``written``."""
    if cache_batch_idx is None:
        return
    rows = cache_batch_idx.tolist()
    for b, row in enumerate(rows):
        if not 0 <= row < cache_rows:
            raise ValueError(f"cache_batch_idx: row {b} uses cache row {row}, outside [0, {cache_rows})")
    if written and len(set(rows)) != len(rows):
        raise ValueError(f"cache_batch_idx: rows share a cache row ({rows}) while k and v write into them")
