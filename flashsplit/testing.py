"""Parity helpers shared by the test suites of every backend (and by the benchmark's checks).

The rule (FlashAttention's test rule): a kernel's error against the float64 reference may be at
most ``ERR_FACTOR`` x the error of PyTorch computing the same attention in the same low
precision, plus a small ``atol``. NaN never passes; outputs are poisoned before each run so an
unwritten element fails.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .problem import DecodeProblem
from .reference import attention_ref

ERR_FACTOR = 2.0
#: Absolute slack per dtype, for rows where PyTorch's own error happens to be ~0.
ATOL = {torch.float16: 2e-3, torch.bfloat16: 1e-2, torch.float32: 1e-5}
POISON = float("nan")


@dataclass(frozen=True)
class DecodeCase:
    """One decode configuration of the parity matrix."""

    batch: int
    seqlen_q: int
    seqlen_k: int
    num_heads_kv: int
    group: int
    head_dim: int
    dtype: torch.dtype
    lengths: tuple[int, ...] | None = None  # cache_seqlens; None = full capacity
    num_splits: int = 0
    causal: bool = False
    nan_tail: bool = True  # fill cache slots past each row's length with NaN

    @property
    def num_heads(self) -> int:
        return self.num_heads_kv * self.group

    def problem(self, device_type: str = "cuda") -> DecodeProblem:
        """The static problem this case poses (what backends' ``supports`` judge)."""
        return DecodeProblem(
            batch=self.batch, seqlen_q=self.seqlen_q, seqlen_k=self.seqlen_k, num_heads=self.num_heads,
            num_heads_kv=self.num_heads_kv, head_dim=self.head_dim, dtype=self.dtype, causal=self.causal,
            has_cache_seqlens=self.lengths is not None, device_type=device_type,
        )

    def __str__(self) -> str:
        dt = str(self.dtype).replace("torch.", "")
        return (f"B{self.batch}-Lq{self.seqlen_q}-Lk{self.seqlen_k}-H{self.num_heads}/{self.num_heads_kv}-D{self.head_dim}"
                f"-{dt}-len{list(self.lengths) if self.lengths is not None else 'full'}-S{self.num_splits}"
                f"{'-causal' if self.causal else ''}")


def make_inputs(case: DecodeCase, device: str | torch.device, generator: torch.Generator | None = None):
    """Fresh random ``q, k_cache, v_cache, cache_seqlens`` for ``case`` (never zeros).

    Slots past each row's live length hold NaN when ``case.nan_tail``: a kernel that lets them
    reach the output fails.
    """
    def rand(*shape):
        return torch.randn(*shape, generator=generator, dtype=torch.float32).to(device=device, dtype=case.dtype)

    q = rand(case.batch, case.seqlen_q, case.num_heads, case.head_dim)
    k = rand(case.batch, case.seqlen_k, case.num_heads_kv, case.head_dim)
    v = rand(case.batch, case.seqlen_k, case.num_heads_kv, case.head_dim)
    seqlens = None
    if case.lengths is not None:
        assert len(case.lengths) == case.batch and max(case.lengths) <= case.seqlen_k
        seqlens = torch.tensor(case.lengths, dtype=torch.int32, device=device)
        if case.nan_tail:
            dead = torch.arange(case.seqlen_k, device=device)[None, :] >= seqlens[:, None]
            k[dead] = float("nan")
            v[dead] = float("nan")
    return q, k, v, seqlens


def max_abs_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| over finite and infinite entries alike; NaN anywhere gives inf."""
    a, b = a.double(), b.double()
    same_inf = torch.isinf(a) & torch.isinf(b) & (torch.sign(a) == torch.sign(b))
    diff = torch.where(same_inf, torch.zeros_like(a), (a - b).abs())
    return float("inf") if torch.isnan(diff).any() else (float(diff.max()) if diff.numel() else 0.0)


def _where(err_map: torch.Tensor) -> str:
    idx = tuple(int(i) for i in torch.nonzero(err_map == err_map.max())[0])
    return f"at index {idx}"


def check_output(out: torch.Tensor, ref: torch.Tensor, ref_lowp: torch.Tensor, dtype: torch.dtype, what: str = "out") -> float:
    """Assert ``out`` is within the error rule of the float64 ``ref``; returns the error.

    ``ref_lowp`` is PyTorch's result in the same low precision (the error budget's yardstick).
    """
    assert out.shape == ref.shape, f"{what}: shape {tuple(out.shape)} != reference {tuple(ref.shape)}"
    assert not torch.isnan(out).any(), f"{what}: NaN {_where(torch.isnan(out).double())} (unwritten or poisoned)"
    err = max_abs_err(out, ref)
    budget = ERR_FACTOR * max_abs_err(ref_lowp, ref) + ATOL[dtype]
    if err > budget:
        diff = (out.double() - ref.double()).abs().nan_to_num(0)
        raise AssertionError(f"{what}: max error {err:.3g} > budget {budget:.3g} {_where(diff)}")
    return err


def check_lse(lse: torch.Tensor, ref_lse: torch.Tensor, atol: float = 1e-3, rtol: float = 1e-3) -> None:
    """LSE agrees with the reference, with -inf exactly where the reference has -inf."""
    assert not torch.isnan(lse).any(), "lse: NaN"
    ref_lse = ref_lse.to(lse.device)
    empty = torch.isneginf(ref_lse)
    assert torch.equal(torch.isneginf(lse), empty), "lse: -inf pattern differs from the reference"
    finite = ~empty
    if finite.any():
        torch.testing.assert_close(lse[finite], ref_lse[finite].float(), atol=atol, rtol=rtol)


def check_against_reference(out, lse, q, k, v, cache_seqlens=None, causal=False, softmax_scale=None,
                            what: str = "out", **variant) -> float:
    """Judge ``out`` (and ``lse`` unless None) against :func:`attention_ref` by the error rule;
    returns out's error. ``k``/``v`` may be a dequantized (fp32) cache: PyTorch's low-precision
    yardstick then runs on it cast to q's dtype. ``variant``: ``window_size``, ``softcap``,
    ``sinks`` as :func:`attention_ref` takes them."""
    ref, ref_lse = attention_ref(q, k, v, cache_seqlens, causal, softmax_scale, **variant)
    ref_lowp, _ = attention_ref(q, k.to(q.dtype), v.to(q.dtype), cache_seqlens, causal, softmax_scale, upcast=False,
                                **variant)
    err = check_output(out, ref.to(out.device), ref_lowp.to(out.device), q.dtype, what)
    if lse is not None:
        check_lse(lse, ref_lse)
    return err


def run_and_check(case: DecodeCase, decode_fn, device, generator=None) -> dict:
    """Run ``decode_fn(q, k, v, cache_seqlens=..., causal=..., num_splits=..., return_lse=True, out=...)``
    on fresh inputs, poisoned output, and check ``out`` and ``lse`` against the reference.
    Returns the inputs and the error, for callers that compare backends further."""
    q, k, v, seqlens = make_inputs(case, device, generator)
    out = torch.full_like(q, POISON)
    result, lse = decode_fn(q, k, v, cache_seqlens=seqlens, causal=case.causal, num_splits=case.num_splits,
                            return_lse=True, out=out)
    assert result.data_ptr() == out.data_ptr(), "decode did not write into out="
    err = check_against_reference(out, lse, q, k, v, seqlens, case.causal, what=f"out[{case}]")
    return {"q": q, "k": k, "v": v, "cache_seqlens": seqlens, "out": out, "lse": lse, "err": err}


def to_paged(k: torch.Tensor, v: torch.Tensor, lengths: list[int], page_size: int, generator=None,
             share_first_page: bool = True):
    """A dense ``[B, L, H_kv, D]`` cache as a paged one the way a serving engine holds it.

    Physical pages are shuffled; with ``share_first_page`` rows 0 and 1 share their first page
    (row 1's first ``page_size`` keys are set to row 0's, as for a common prefix); pages that
    hold no live key are NaN, and ``block_table`` entries past each row's last page hold a
    garbage id (10^6) that a kernel must never read. Returns ``(k_pages, v_pages,
    block_table, k, v)`` with ``k``/``v`` the (possibly edited) dense cache to check against.
    """
    batch, seqlen_k = k.shape[:2]
    max_pages = -(-seqlen_k // page_size)
    pad = max_pages * page_size - seqlen_k
    if pad:
        k = torch.cat([k, k.new_full((batch, pad, *k.shape[2:]), float("nan"))], dim=1)
        v = torch.cat([v, v.new_full((batch, pad, *v.shape[2:]), float("nan"))], dim=1)
    share = share_first_page and batch > 1 and min(lengths[0], lengths[1]) >= page_size
    if share:
        k, v = k.clone(), v.clone()
        k[1, :page_size] = k[0, :page_size]
        v[1, :page_size] = v[0, :page_size]
    num_pages = batch * max_pages + 3  # a few spare pages that nobody uses
    order = torch.randperm(num_pages, generator=generator).tolist()
    table = torch.full((batch, max_pages), 10**6, dtype=torch.int32)
    k_pages = k.new_full((num_pages, page_size, *k.shape[2:]), float("nan"))
    v_pages = v.new_full((num_pages, page_size, *v.shape[2:]), float("nan"))
    for b in range(batch):
        for p in range(-(-lengths[b] // page_size)):
            phys = order[b * max_pages + p]
            if share and b == 1 and p == 0:
                phys = int(table[0, 0])
            table[b, p] = phys
            k_pages[phys] = k[b, p * page_size:(p + 1) * page_size]
            v_pages[phys] = v[b, p * page_size:(p + 1) * page_size]
    return k_pages, v_pages, table.to(k.device), k, v


def quantize_fp8(cache: torch.Tensor, dtype: torch.dtype, per_head: bool, generator=None):
    """``(cache_fp8, descale)`` with ``cache_fp8 * descale ~= cache``: one scale, or one per
    (row, KV head) (``[B, H_kv]``), fp32; NaN stays NaN."""
    finite = torch.nan_to_num(cache.float(), nan=0.0).abs()
    limit = torch.finfo(dtype).max / 4
    if per_head:
        amax = finite.amax(dim=(1, 3)).clamp_min(1e-3)  # [B, H_kv]
        descale = (amax / limit).float()
        scaled = cache.float() / descale[:, None, :, None]
    else:
        descale = (finite.max().clamp_min(1e-3) / limit).float().reshape(1)
        scaled = cache.float() / descale
    return scaled.to(dtype), descale.to(cache.device)
