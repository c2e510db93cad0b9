"""Random decode inputs, several sets per case so timed loops can rotate through them.

Cache formats (see :class:`~.cases.Case`):

- dense: k/v ``[B, L_k, H_kv, D]``;
- paged: k/v ``[B * pages_per_row, page_size, H_kv, D]`` with the pages of all rows in one
  shuffled physical order (:func:`shuffled_block_table`), the way a serving engine's allocator
  leaves them; one ``block_table`` serves every rotation set (as one table serves every layer
  of a model);
- fp8: the cache quantized from 16-bit normal values with one fp32 scale per (row, KV head)
  (:func:`flashsplit.testing.quantize_fp8`), passed as ``k_descale`` / ``v_descale``.

A case with ``sinks`` also gets one fp32 sink logit per q head, N(:data:`~.cases.SINK_MEAN`, 1),
shared by every set (learned weights, like the block table, do not change between calls). A case
with an ``append`` gets new keys and values per set ``[B, append, H_kv, D]``, its rows holding
``seqlen_k - append`` keys before the call, and with ``rotary`` RoPE tables ``[capacity, D / 2]``
(fp32, shared; a few rows more where the last of several queries is rotated past the capacity);
each call writes the same new keys into the same slots. q holds ``seqlen_q`` queries per row.

Paged and fp8 caches are written in chunks of batch rows straight into their final tensors,
so no dense 16-bit copy of the whole cache is ever held; the reference check gathers and
dequantizes the rows it checks (:meth:`InputSets.reference_kv`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..reference import dequantize, gather_paged, quantize_ref, rotary_ref
from ..testing import quantize_fp8
from ..testing_kvcache import rotary_tables
from .cases import SINK_MEAN, Case

#: Largest fp32 chunk of cache rows generated at once for a paged or fp8 cache (quantizing
#: takes a few fp32 temporaries of this size).
GEN_CHUNK_BYTES = 1 << 30


@dataclass
class InputSets:
    """``len(q)`` input sets of one case, on one device.

    ``q[i]`` ``[B, L_q, H, D]``; ``k[i]``/``v[i]`` the cache in the case's format: dense
    ``[B, L_k, H_kv, D]`` (flashsplit's and FlashAttention's layout) or paged ``[num_pages,
    page_size, H_kv, D]`` with ``block_table`` int32 ``[B, pages_per_row]`` (shared by every
    set); for fp8 ``k_descale[i]``/``v_descale[i]`` fp32 ``[B, H_kv]``. ``cache_seqlens`` int32
    ``[B]`` (every row full, or full but for an append's keys). ``sinks`` fp32 ``[H]`` when the
    case has sinks (shared by every set). With an append ``k_new[i]``/``v_new[i]`` ``[B, append,
    H_kv, D]`` in q's dtype, and with rotary ``rotary_cos``/``rotary_sin`` fp32 ``[rotary_positions,
    D / 2]`` (:attr:`~.cases.Case.rotary_positions`).
    """

    case: Case
    q: list[torch.Tensor]
    k: list[torch.Tensor]
    v: list[torch.Tensor]
    cache_seqlens: torch.Tensor
    block_table: torch.Tensor | None = None
    k_descale: list[torch.Tensor] | None = None
    v_descale: list[torch.Tensor] | None = None
    sinks: torch.Tensor | None = None
    k_new: list[torch.Tensor] | None = None
    v_new: list[torch.Tensor] | None = None
    rotary_cos: torch.Tensor | None = None
    rotary_sin: torch.Tensor | None = None
    #: float64 reference outputs of set 0, by batch row (filled by :mod:`.check`, shared by
    #: every contender and every num_splits of a sweep).
    ref_cache: dict = field(default_factory=dict, repr=False)

    def __len__(self) -> int:
        return len(self.q)

    def cache_kwargs(self, i: int) -> dict:
        """``flashsplit.decode`` keyword arguments for set ``i``'s cache format (``block_table``,
        ``k_descale``, ``v_descale``; empty for a dense 16-bit cache)."""
        kwargs = {}
        if self.block_table is not None:
            kwargs["block_table"] = self.block_table
        if self.k_descale is not None:
            kwargs["k_descale"] = self.k_descale[i]
            kwargs["v_descale"] = self.v_descale[i]
        return kwargs

    def variant_kwargs(self) -> dict:
        """``flashsplit.decode`` keyword arguments for the case's attention variant
        (``window_size``, ``softcap``, ``sinks``, ``batch_invariant``, and ``causal`` for several
        queries per row; empty for plain attention at ``L_q = 1``, so a plain cell times exactly
        the plain call)."""
        case, kwargs = self.case, {}
        if case.causal:
            kwargs["causal"] = True
        if case.window >= 0:
            kwargs["window_size"] = case.window_size
        if case.softcap > 0:
            kwargs["softcap"] = case.softcap
        if self.sinks is not None:
            kwargs["sinks"] = self.sinks
        if case.batch_invariant:
            kwargs["batch_invariant"] = True
        return kwargs

    #: The rotary convention of the bench's calls (Llama's GPT-NeoX halves).
    ROTARY_INTERLEAVED = False

    def append_kwargs(self, i: int) -> dict:
        """``flashsplit.decode`` / ``flash_attn_with_kvcache`` keyword arguments of set ``i``'s
        append (``k``, ``v``, and the rotary tables; empty without an append)."""
        if self.k_new is None:
            return {}
        kwargs = {"k": self.k_new[i], "v": self.v_new[i]}
        if self.rotary_cos is not None:
            kwargs.update(rotary_cos=self.rotary_cos, rotary_sin=self.rotary_sin,
                          rotary_interleaved=self.ROTARY_INTERLEAVED)
        return kwargs

    def reference_q(self, b: int) -> torch.Tensor:
        """Batch row ``b`` of set 0's q ``[1, L_q, H, D]`` as the call attends with it: query i
        rotated at the row's length + i (FlashAttention's convention for a causal call, and at
        ``L_q = 1`` for any call)."""
        q = self.q[0][b:b + 1]
        if self.rotary_cos is None:
            return q
        steps = torch.arange(q.shape[1], device=q.device)
        positions = self.cache_seqlens[b:b + 1].long()[:, None] + steps[None, :]
        return rotary_ref(q, self.rotary_cos, self.rotary_sin, positions, self.ROTARY_INTERLEAVED).to(q.dtype)

    def reference_kv(self, b: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Batch row ``b`` of set 0 as a dense ``[1, L_k, H_kv, D]`` k, v: gathered from its pages
        and dequantized (fp32) where the cache is paged / fp8; what the reference attends to."""
        out = []
        for cache, descale in ((self.k[0], self.k_descale), (self.v[0], self.v_descale)):
            if self.block_table is not None:  # bytewise (fp8 indexing need not be a device kernel)
                row = gather_paged(cache.view(torch.uint8), self.block_table[b:b + 1]).view(cache.dtype)
                row = row[:, :self.case.seqlen_k]
            else:
                row = cache[b:b + 1]
            if descale is not None:
                row = dequantize(row, descale[0][b:b + 1])
            out.append(row)
        if self.k_new is not None:  # the appended keys as the call stores them
            start, count = int(self.cache_seqlens[b]), self.case.append
            new_k, new_v = self.k_new[0][b:b + 1], self.v_new[0][b:b + 1]
            if self.rotary_cos is not None:
                positions = start + torch.arange(count, device=new_k.device)[None, :]
                new_k = rotary_ref(new_k, self.rotary_cos, self.rotary_sin, positions, self.ROTARY_INTERLEAVED)
            for j, (new, descale) in enumerate(((new_k, self.k_descale), (new_v, self.v_descale))):
                scale = None if descale is None else descale[0][b:b + 1]
                stored = quantize_ref(new, self.case.cache_torch_dtype, scale)
                out[j] = out[j].clone()
                out[j][:, start:start + count] = dequantize(stored, scale) if scale is not None else stored
        return out[0], out[1]


def shuffled_block_table(batch: int, pages_per_row: int, generator: torch.Generator | None = None,
                         device: str | torch.device = "cpu") -> torch.Tensor:
    """int32 ``[batch, pages_per_row]``: the ``batch * pages_per_row`` physical pages in a random
    order, each used once (row b's n-th page is ``table[b, n]``)."""
    n = batch * pages_per_row
    return torch.randperm(n, generator=generator, device=device).to(torch.int32).view(batch, pages_per_row)


def scatter_pages(dense: torch.Tensor, table_rows: torch.Tensor, pages: torch.Tensor) -> None:
    """Write dense rows ``[b, L, H_kv, D]`` into their pages: row r's keys ``[n * ps, (n+1) * ps)``
    go to ``pages[table_rows[r, n]]`` (one vectorised index_put, no Python loop over pages).

    ``table_rows`` is ``[b, P]`` with ``P * ps >= L``; the slots of a last, partial page are NaN.
    The copy is bytewise (uint8 views), so it needs no indexing kernel for fp8 dtypes.
    """
    if dense.dtype != pages.dtype:
        raise TypeError(f"dense: expected the pages' dtype {pages.dtype}, got {dense.dtype}")
    rows, seqlen = dense.shape[:2]
    page_size = pages.shape[1]
    num = table_rows.shape[1]
    pad = num * page_size - seqlen
    if pad < 0:
        raise ValueError(f"table_rows: {num} pages of {page_size} keys cannot hold {seqlen} keys")
    raw = dense.contiguous().view(torch.uint8)  # [b, L, H_kv, D * itemsize]
    if pad:
        filler = torch.full((rows, pad, *dense.shape[2:]), float("nan"), dtype=torch.float32, device=dense.device)
        raw = torch.cat([raw, filler.to(dense.dtype).view(torch.uint8)], dim=1)
    pages.view(torch.uint8)[table_rows.reshape(-1).long()] = raw.reshape(rows * num, page_size, *raw.shape[2:])


def to_paged(dense: torch.Tensor, page_size: int, generator: torch.Generator | None = None,
             table: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """A dense ``[B, L, H_kv, D]`` cache as shuffled pages: ``(pages [B * P, page_size, H_kv, D],
    block_table int32 [B, P])`` with ``P = ceil(L / page_size)``, such that
    :func:`flashsplit.reference.gather_paged` gives ``dense`` back (the first ``L`` keys)."""
    batch, seqlen = dense.shape[:2]
    num = -(-seqlen // page_size)
    if table is None:
        table = shuffled_block_table(batch, num, generator, dense.device)
    pages = torch.empty((batch * num, page_size, *dense.shape[2:]), dtype=dense.dtype, device=dense.device)
    scatter_pages(dense, table, pages)
    return pages, table


def _rows_per_chunk(case: Case) -> int:
    return max(1, GEN_CHUNK_BYTES // max(1, case.seqlen_k * case.num_heads_kv * case.head_dim * 4))


def make_cache(case: Case, randn, table: torch.Tensor | None, device) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One K or V cache in ``case``'s format from ``randn(shape)`` (16-bit normal values), and its
    fp32 ``[B, H_kv]`` descale (None for a 16-bit cache). Rows are made and converted in chunks."""
    kv_shape = (case.batch, case.seqlen_k, case.num_heads_kv, case.head_dim)
    if not case.paged and not case.fp8:
        return randn(kv_shape), None
    cache_dtype = case.cache_torch_dtype
    if case.paged:
        cache = torch.empty((case.batch * case.pages_per_row, case.page_size, *kv_shape[2:]), dtype=cache_dtype,
                            device=device)
    else:
        cache = torch.empty(kv_shape, dtype=cache_dtype, device=device)
    descale = torch.empty((case.batch, case.num_heads_kv), dtype=torch.float32, device=device) if case.fp8 else None
    step = _rows_per_chunk(case)
    for r0 in range(0, case.batch, step):
        r1 = min(case.batch, r0 + step)
        rows = randn((r1 - r0, *kv_shape[1:]))
        if case.fp8:
            rows, scale = quantize_fp8(rows, cache_dtype, per_head=True)
            descale[r0:r1] = scale
        if case.paged:
            scatter_pages(rows, table[r0:r1], cache)
        else:
            cache[r0:r1] = rows
        del rows
    return cache, descale


def make_inputs(case: Case, num_sets: int, device: str | torch.device = "cuda", seed: int = 0) -> InputSets:
    """``num_sets`` independent standard-normal input sets for ``case`` (a dense 16-bit case
    draws exactly what it always did for a given seed; the sinks are drawn after the sets, so a
    case with sinks has the q, k and v of the same case without)."""
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    dtype = case.torch_dtype
    q_shape = (case.batch, case.seqlen_q, case.num_heads, case.head_dim)

    def randn(shape):
        return torch.randn(shape, generator=gen, device=device, dtype=dtype)

    table = shuffled_block_table(case.batch, case.pages_per_row, gen, device) if case.paged else None
    qs, ks, vs, k_scales, v_scales = [], [], [], [], []
    for _ in range(num_sets):
        qs.append(randn(q_shape))
        k, k_scale = make_cache(case, randn, table, device)
        v, v_scale = make_cache(case, randn, table, device)
        ks.append(k)
        vs.append(v)
        k_scales.append(k_scale)
        v_scales.append(v_scale)
    lens = torch.full((case.batch,), case.seqlen_k - case.append, dtype=torch.int32, device=device)
    sinks = None
    if case.sinks:
        sinks = torch.randn((case.num_heads,), generator=gen, device=device, dtype=torch.float32) + SINK_MEAN
    k_new = v_new = cos = sin = None
    if case.append:  # drawn after the sets: the cache is that of the same case without an append
        new_shape = (case.batch, case.append, case.num_heads_kv, case.head_dim)
        k_new = [randn(new_shape) for _ in range(num_sets)]
        v_new = [randn(new_shape) for _ in range(num_sets)]
        if case.rotary:
            cos, sin = rotary_tables(case.rotary_positions, case.head_dim, torch.float32, device)
    return InputSets(case, qs, ks, vs, lens, block_table=table,
                     k_descale=k_scales if case.fp8 else None, v_descale=v_scales if case.fp8 else None, sinks=sinks,
                     k_new=k_new, v_new=v_new, rotary_cos=cos, rotary_sin=sin)
