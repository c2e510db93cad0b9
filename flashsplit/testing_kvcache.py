"""Parity helpers for decode calls that update the cache: new-token append, left padding,
``cache_batch_idx``, rotary (shared by the CPU and GPU test suites).

:func:`make_kvcache_inputs` builds a call's arguments the way an engine holds them (dense, paged
with shuffled pages, or rows of a larger cache; fp8 with descales; NaN in every slot a row does
not use); :func:`expected_caches` writes the new keys by the float64 reference semantics
(:mod:`flashsplit.reference`); :func:`check_kvcache_call` judges a call's ``out``, LSE and caches
against them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .reference import append_ref, dequantize, gather_paged, rotary_ref
from .testing import POISON, check_against_reference, quantize_fp8, to_paged

#: Relative tolerance of a rotated key in the cache (the kernel rotates in fp32, the reference
#: in float64): one step of the cache's format.
ROTATED_RTOL = {torch.float16: 2.0 ** -10, torch.bfloat16: 2.0 ** -7, torch.float8_e4m3fn: 2.0 ** -3,
                torch.float8_e5m2: 2.0 ** -2}


@dataclass(frozen=True)
class KVCacheCase:
    """One call of the cache-update matrix; ``lengths`` are ``cache_seqlens`` before the append."""

    batch: int = 3
    seqlen_k: int = 300  # capacity (rounded up to whole pages when paged)
    num_heads_kv: int = 2
    group: int = 4
    head_dim: int = 64
    dtype: torch.dtype = torch.float16
    lengths: tuple[int, ...] = (200, 37, 0)
    seqlen_new: int = 1  # 0: no append
    seqlen_q: int = 0  # 0: seqlen_new (1 without an append)
    leftpad: tuple[int, ...] | None = None
    page_size: int = 0
    kv_dtype: torch.dtype | None = None  # an fp8 cache
    per_head_scale: bool = False
    batch_idx: str | None = None  # "permutation" or "subset" (of a larger cache)
    rotary_dim: int = 0
    rotary_interleaved: bool = True
    rotary_dtype: torch.dtype = torch.float32
    causal: bool = False
    window_size: tuple[int, int] = (-1, -1)
    softcap: float = 0.0
    sinks: bool = False
    num_splits: int = 0
    batch_invariant: bool = False

    @property
    def num_heads(self) -> int:
        return self.num_heads_kv * self.group

    @property
    def queries(self) -> int:
        return self.seqlen_q or max(self.seqlen_new, 1)

    @property
    def rotary_q_per_token(self) -> bool:
        return self.causal or tuple(self.window_size) != (-1, -1)

    def options(self) -> dict:
        """The keyword options of the call (besides the tensors)."""
        return dict(causal=self.causal, window_size=self.window_size, softcap=self.softcap,
                    num_splits=self.num_splits, rotary_interleaved=self.rotary_interleaved,
                    batch_invariant=self.batch_invariant)


def rotary_tables(positions: int, rotary_dim: int, dtype, device):
    """RoPE tables ``[positions, rotary_dim / 2]``: angle ``p / 10000^(2j / rotary_dim)``."""
    inv_freq = 10000.0 ** (-torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim)
    angles = torch.arange(positions, dtype=torch.float64)[:, None] * inv_freq[None, :]
    return angles.cos().to(device, dtype), angles.sin().to(device, dtype)


def make_kvcache_inputs(case: KVCacheCase, device, generator: torch.Generator | None = None) -> dict:
    """The tensors of one call (``decode``'s keyword names): ``q``, ``k_cache``, ``v_cache``,
    ``k``, ``v``, ``cache_seqlens`` and, as the case asks, ``cache_leftpad``,
    ``cache_batch_idx``, ``block_table``, ``k_descale``/``v_descale``, ``rotary_cos``/``rotary_sin``,
    ``sinks``. Slots past each row's length (where the new keys go) and before its padding hold NaN."""
    def rand(*shape):
        return torch.randn(*shape, generator=generator, dtype=torch.float32).to(case.dtype)

    batch, heads_kv, dim = case.batch, case.num_heads_kv, case.head_dim
    assert len(case.lengths) == batch
    capacity = case.seqlen_k
    if case.page_size:
        capacity = -(-capacity // case.page_size) * case.page_size
    k = rand(batch, capacity, heads_kv, dim)
    v = rand(batch, capacity, heads_kv, dim)
    keys = torch.arange(capacity)[None, :]
    lengths = torch.tensor(case.lengths, dtype=torch.int32)
    dead = keys >= lengths[:, None].long()
    pads = None
    if case.leftpad is not None:
        pads = torch.tensor(case.leftpad, dtype=torch.int32)
        dead |= keys < pads[:, None].long()
    k[dead] = float("nan")
    v[dead] = float("nan")
    args = {"q": rand(batch, case.queries, case.num_heads, dim)}
    if case.seqlen_new:
        args["k"] = rand(batch, case.seqlen_new, heads_kv, dim).to(device)
        args["v"] = rand(batch, case.seqlen_new, heads_kv, dim).to(device)
    if case.kv_dtype is not None:
        k, args["k_descale"] = quantize_fp8(k, case.kv_dtype, case.per_head_scale)
        v, args["v_descale"] = quantize_fp8(v, case.kv_dtype, case.per_head_scale)
    if case.page_size:
        used = [min(n + case.seqlen_new, capacity) for n in case.lengths]
        k, v, args["block_table"], _, _ = to_paged(k, v, used, case.page_size, generator, share_first_page=False)
    elif case.batch_idx is not None:
        rows = batch if case.batch_idx == "permutation" else batch + 2
        index = torch.randperm(rows, generator=generator)[:batch]
        k_rows = torch.randn(rows, *k.shape[1:], generator=generator).to(k.dtype)  # rows nobody uses: kept as they are
        v_rows = torch.randn(rows, *v.shape[1:], generator=generator).to(v.dtype)
        k_rows[index], v_rows[index] = k, v
        k, v = k_rows, v_rows
        args["cache_batch_idx"] = index.to(torch.int32)
    args.update(k_cache=k, v_cache=v, cache_seqlens=lengths)
    if pads is not None:
        args["cache_leftpad"] = pads
    if case.rotary_dim:
        # Every position a key or a query can take: queries past the new keys reach further.
        positions = capacity + max(0, case.queries - case.seqlen_new)
        args["rotary_cos"], args["rotary_sin"] = rotary_tables(positions, case.rotary_dim, case.rotary_dtype, "cpu")
    if case.sinks:
        args["sinks"] = torch.randn(case.num_heads, generator=generator, dtype=torch.float32)
    return {name: t.to(device) for name, t in args.items()}


def _positions(case: KVCacheCase, args: dict, count: int, per_token: bool = True) -> torch.Tensor:
    """Rotary positions ``[B, count]``: ``cache_seqlens - cache_leftpad (+ t when per_token)``, the
    leftpad clamped into ``[0, cache_seqlens + L_new]`` (that clamped into the capacity), as the
    attention range clamps it."""
    start = args["cache_seqlens"].cpu().long()
    if "cache_leftpad" in args:
        capacity = -(-case.seqlen_k // case.page_size) * case.page_size if case.page_size else case.seqlen_k
        length = (start + case.seqlen_new).clamp(0, capacity)
        start = start - torch.minimum(args["cache_leftpad"].cpu().long().clamp(min=0), length)
    steps = torch.arange(count) if per_token else torch.zeros(count, dtype=torch.long)
    return start[:, None] + steps[None, :]


def expected_caches(case: KVCacheCase, args: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(k_cache, v_cache, appended)`` after the call by the reference semantics; ``appended``
    bool ``[cache rows or pages, slots]`` marks the slots the new keys land in."""
    k_cache, v_cache = args["k_cache"].cpu(), args["v_cache"].cpu()
    if not case.seqlen_new:
        return k_cache, v_cache, torch.zeros(k_cache.shape[:2], dtype=torch.bool)
    k_new, v_new = args["k"].cpu(), args["v"].cpu()
    if case.rotary_dim:
        k_new = rotary_ref(k_new, args["rotary_cos"].cpu(), args["rotary_sin"].cpu(),
                           _positions(case, args, case.seqlen_new), case.rotary_interleaved)
    where = dict(block_table=_cpu(args.get("block_table")), cache_batch_idx=_cpu(args.get("cache_batch_idx")))
    lengths = args["cache_seqlens"].cpu()
    k_after, v_after = append_ref(k_cache, v_cache, k_new, v_new, lengths, k_descale=_cpu(args.get("k_descale")),
                                  v_descale=_cpu(args.get("v_descale")), **where)
    marks = torch.zeros(*k_cache.shape[:2], 1, 1)
    appended, _ = append_ref(marks, marks, torch.ones(case.batch, case.seqlen_new, 1, 1),
                             torch.ones(case.batch, case.seqlen_new, 1, 1), lengths, **where)
    return k_after, v_after, appended[:, :, 0, 0] > 0


def _cpu(t):
    return None if t is None else t.cpu()


def dense_view(case: KVCacheCase, args: dict, k_cache: torch.Tensor, v_cache: torch.Tensor):
    """The logical dense ``[B, capacity, H_kv, D]`` caches (dequantized for fp8) row b attends to."""
    if "block_table" in args:
        table = args["block_table"].cpu()
        k_cache, v_cache = gather_paged(k_cache, table), gather_paged(v_cache, table)
    elif "cache_batch_idx" in args:
        index = args["cache_batch_idx"].cpu().long()
        k_cache, v_cache = k_cache[index], v_cache[index]
    if case.kv_dtype is not None:
        return (dequantize(k_cache, _cpu(args["k_descale"])), dequantize(v_cache, _cpu(args["v_descale"])))
    return k_cache, v_cache


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """``[rows, slots, bytes]``: a cache's raw bytes per slot (NaN compares as its bits)."""
    return t.contiguous().view(torch.uint8).reshape(t.shape[0], t.shape[1], -1)


def check_caches(case: KVCacheCase, k_cache, v_cache, expected: tuple) -> None:
    """The caches after a call: every slot but the appended ones unchanged, bit for bit; the
    appended ones as the reference wrote them (bit for bit, or within a step of the cache's
    format for a rotated key)."""
    k_expected, v_expected, appended = expected
    for name, got, want in (("k_cache", k_cache.cpu(), k_expected), ("v_cache", v_cache.cpu(), v_expected)):
        same = (_bytes(got) == _bytes(want)).all(dim=-1)
        stray = ~same & ~appended
        assert not stray.any(), f"{name}: slots {stray.nonzero()[:4].tolist()} changed, outside the appended keys"
        if case.rotary_dim and name == "k_cache":
            torch.testing.assert_close(got[appended].float(), want[appended].float(), equal_nan=False,
                                       rtol=ROTATED_RTOL[got.dtype], atol=1e-6, msg=f"{name}: appended keys")
        else:
            assert same[appended].all(), f"{name}: appended slots {(~same & appended).nonzero()[:4].tolist()} differ"


def run_kvcache_case(case: KVCacheCase, decode_fn, device, generator=None, args: dict | None = None) -> dict:
    """Call ``decode_fn(**tensors, **options, return_lse=True, out=poisoned)`` on fresh inputs
    (or ``args``) and check the caches, ``out`` and the LSE against the reference; returns the
    arguments (the caches as updated) and the results."""
    args = make_kvcache_inputs(case, device, generator) if args is None else args
    expected = expected_caches(case, args)
    out = torch.full_like(args["q"], POISON)
    result, lse = decode_fn(**args, **case.options(), return_lse=True, out=out)
    assert result.data_ptr() == out.data_ptr(), "decode did not write into out="
    check_caches(case, args["k_cache"], args["v_cache"], expected)
    check_kvcache_attention(case, args, expected, result, lse)
    return {**args, "out": result, "lse": lse}


def check_kvcache_attention(case: KVCacheCase, args: dict, expected: tuple, out, lse) -> float:
    """``out``/``lse`` against the float64 attention over the reference's caches: q rotated as the
    call rotates it, ``cache_seqlens + L_new`` keys from ``cache_leftpad`` on."""
    q = args["q"].cpu()
    if case.rotary_dim:
        positions = _positions(case, args, case.queries, case.rotary_q_per_token)
        q = rotary_ref(q, args["rotary_cos"].cpu(), args["rotary_sin"].cpu(), positions,
                       case.rotary_interleaved).to(q.dtype)
    k, v = dense_view(case, args, expected[0], expected[1])
    lengths = (args["cache_seqlens"].cpu() + case.seqlen_new).clamp(max=k.shape[1])
    variant = dict(window_size=tuple(case.window_size), softcap=case.softcap, sinks=_cpu(args.get("sinks")),
                   cache_leftpad=_cpu(args.get("cache_leftpad")))
    return check_against_reference(out.cpu(), lse.cpu(), q, k, v, lengths, case.causal, what=f"out[{case}]",
                                   **variant)
