"""Property-based tests (hypothesis): decode and combine on drawn inputs against the float64
reference, and every bad argument refused with a TypeError/ValueError that names it.

Drawn: shapes (GQA groups, head dims, 1-6 query tokens with and without causal), layouts
(head-major views, sliced heads, padded storage, outputs in any of those), dense and paged
caches (shuffled pages, pages shared between rows, garbage page ids past each row's pages,
strided and shared table rows), lengths 0, 1, full and anything between (and out of range,
clamped on the device), split counts {0, 1, 3, 17, 256}, fp8 caches with either descale
shape in any layout, softmax scales of either sign. Every slot no row may read holds NaN
(cache tails, unused pages, the padding of every view) and outputs start as NaN, so an
unmasked read or a missed write fails. The rule is
flashsplit.testing's: at most 2x PyTorch's own error in the same dtype plus a small atol.

On the CPU only the Triton backend runs (the interpreter; fp16, its bf16 dots are wrong); on a
CUDA machine every backend runs, in bf16 too. The default run draws a fixed, reproducible set
of examples (``derandomize``); ``--full`` draws many more.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings, strategies as st

import flashsplit
from flashsplit import api, dispatch
from flashsplit.call import DecodeOptions, DecodeTensors
from flashsplit.plan import cdiv
from flashsplit.problem import DecodeProblem
from flashsplit.validation import check_decode_inputs
from flashsplit.reference import combine_ref, dequantize, gather_paged
from flashsplit.registry import get, names
from flashsplit.testing import check_against_reference, check_lse, check_output

from conftest import DEVICE, HAS_CUDA, torch_notice_silenced

DTYPES = [torch.float16, torch.bfloat16] if HAS_CUDA else [torch.float16]
FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
NAN = float("nan")

_SETTINGS = dict(derandomize=True, deadline=None, database=None, print_blob=True,
                 suppress_health_check=list(HealthCheck))


def examples(n: int):
    """Hypothesis settings for ``n`` examples, reproducible run to run."""
    return settings(max_examples=n, **_SETTINGS)


@pytest.fixture
def full_run(request):
    """Skips a test unless the suite runs with ``--full``."""
    if not request.config.getoption("--full", default=False):
        pytest.skip("runs under --full only")


def _runs_here(backend: str) -> str | None:
    """Why ``backend`` runs nothing on this machine, or None."""
    problem = DecodeProblem(batch=1, seqlen_q=1, seqlen_k=256, num_heads=8, num_heads_kv=2, head_dim=128,
                            dtype=DTYPES[-1], causal=False, has_cache_seqlens=True, device_type=DEVICE)
    return get(backend).supports(problem)


BACKENDS = [pytest.param(b, marks=pytest.mark.skipif(_runs_here(b) is not None, reason=f"{b}: {_runs_here(b)}"))
            for b in names()]


# -- Layouts ----------------------------------------------------------------------------------

LAYOUTS = ("contiguous", "head_major", "sliced_heads", "padded")


def _view(shape, layout: str, dtype, device=DEVICE):
    """A NaN-filled ``[a, b, c, d]`` tensor in ``layout``, and its storage: ``head_major`` is a
    ``[a, c, b, d]`` buffer transposed, ``sliced_heads`` every other dim-2 slice of a buffer of
    twice the heads, ``padded`` a window of a buffer padded in dims 0, 1 and 3."""
    a, b, c, d = shape
    if layout == "contiguous":
        storage = torch.full((a, b, c, d), NAN, dtype=dtype, device=device)
        return storage, storage
    if layout == "head_major":
        storage = torch.full((a, c, b, d), NAN, dtype=dtype, device=device)
        return storage.transpose(1, 2), storage
    if layout == "sliced_heads":
        storage = torch.full((a, b, 2 * c, d), NAN, dtype=dtype, device=device)
        return storage[:, :, 1::2], storage
    storage = torch.full((a + 1, b + 2, c, d + 8), NAN, dtype=dtype, device=device)
    return storage[1:, 1:b + 1, :, 8:d + 8], storage


def _untouched_outside(view: torch.Tensor, storage: torch.Tensor) -> bool:
    """Whether every element of ``storage`` outside ``view`` is still NaN (nothing written there)."""
    marker = torch.zeros(storage.shape, dtype=torch.bool, device=storage.device)
    marker.as_strided(view.shape, view.stride(), view.storage_offset() - storage.storage_offset()).fill_(True)
    return bool(torch.isnan(storage.float()[~marker]).all())


def _descale(kind: str, batch: int, heads_kv: int, g: torch.Generator) -> torch.Tensor:
    """fp32 dequantization scales: one element (0-d or [1]) or [B, H_kv] in some layout."""
    values = torch.rand(batch, heads_kv, generator=g) + 0.5
    made = {
        "0d": lambda: values[0, 0].clone(),
        "one": lambda: values[0, :1].clone(),
        "rows": lambda: values,
        "rows_transposed": lambda: values.t().contiguous().t(),
        "rows_expanded": lambda: values[:, :1].expand(batch, heads_kv),
        "rows_strided": lambda: torch.stack([values, torch.full_like(values, NAN)], dim=-1)[..., 0],
    }[kind]()
    return made.to(DEVICE)


# -- Drawn decode problems --------------------------------------------------------------------

@st.composite
def decode_cases(draw, backend: str, max_keys: int = 300):
    """A dict of every choice of one decode example (hypothesis prints it on failure)."""
    batch = draw(st.integers(1, 3))
    heads_kv = draw(st.integers(1, 3))
    seqlen_q = draw(st.integers(1, 6))
    group = draw(st.sampled_from([1, 2, 3, 4, 8]))
    head_dim = draw(st.sampled_from([64, 128] if backend == "cute" else [8, 16, 24, 32, 64]))
    page_size = draw(st.sampled_from([0, 0, 1, 3, 16, 48, 64]))
    if page_size:
        max_pages = draw(st.integers(0, max_keys // page_size))
        capacity = max_pages * page_size
    else:
        max_pages, capacity = 0, draw(st.integers(0, max_keys))
    length = st.one_of(st.just(0), st.just(min(1, capacity)), st.just(capacity), st.integers(0, capacity))
    lengths = draw(st.none() | st.lists(length, min_size=batch, max_size=batch).map(tuple))
    small = batch * heads_kv == 1 and seqlen_q * group <= 16  # 256 splits are slow in the interpreter
    fp8 = draw(st.sampled_from([None, None, *FP8]))
    return dict(
        dtype=draw(st.sampled_from(DTYPES)), batch=batch, seqlen_q=seqlen_q, heads_kv=heads_kv, group=group,
        head_dim=head_dim, page_size=page_size, max_pages=max_pages, capacity=capacity, lengths=lengths,
        strided_seqlens=batch == 1 and lengths is not None and draw(st.booleans()),
        wild_seqlens=lengths is not None and draw(st.booleans()),
        q_layout=draw(st.sampled_from(LAYOUTS)), k_layout=draw(st.sampled_from(LAYOUTS)),
        v_layout=draw(st.sampled_from(LAYOUTS)), out_layout=draw(st.sampled_from((None,) + LAYOUTS)),
        lse=draw(st.sampled_from(["none", "returned", "given"])),
        table=draw(st.sampled_from(["contiguous", "wide", "shared_row"])) if page_size else None,
        share_first_page=draw(st.booleans()), spare_pages=draw(st.integers(0, 3)),
        causal=draw(st.booleans()),
        num_splits=draw(st.sampled_from([0, 1, 3, 17] + [256] * small)),
        softmax_scale=draw(st.sampled_from([None, None, 0.0, -0.25, 0.1, 1.0, 3.0])),
        fp8=fp8,
        k_descale=draw(st.sampled_from(["0d", "one", "rows", "rows_transposed", "rows_expanded", "rows_strided"])),
        v_descale=draw(st.sampled_from(["0d", "one", "rows", "rows_transposed", "rows_strided"])),
        seed=draw(st.integers(0, 2**31 - 1)),
    )


def _wild(lengths, capacity: int, g) -> list[int]:
    """Lengths outside ``[0, capacity]`` that clamp to ``lengths``: an empty row's below 0, a
    full row's past the capacity (decode clamps them on the device; check_inputs reports them)."""
    below, past = [-1, -7, -(2**31)], [1, 9, 2**31 - 1 - capacity]
    pick = torch.randint(0, 3, (len(lengths),), generator=g).tolist()
    return [-abs(below[i]) if n == 0 else capacity + past[i] if n == capacity else n for n, i in zip(lengths, pick)]


def _cache_values(shape, fp8, dtype, g, dead):
    """Random cache values in the cache's dtype, NaN where ``dead`` (a mask over leading dims)."""
    values = torch.randn(*shape, generator=g)
    values[dead] = NAN
    return values.to(fp8 or dtype).to(DEVICE)


def build_decode(case: dict):
    """Tensors of one drawn example: ``(q, k, v, kwargs, k_ref, v_ref, seqlens)``; ``k_ref``/``v_ref``
    are the dense (dequantized) caches the reference attends to, ``seqlens`` contiguous or None."""
    g = torch.Generator().manual_seed(case["seed"])
    dtype, fp8 = case["dtype"], case["fp8"]
    kv_dtype = fp8 or dtype
    batch, seqlen_q, heads_kv, head_dim = case["batch"], case["seqlen_q"], case["heads_kv"], case["head_dim"]
    num_heads = heads_kv * case["group"]
    q, _ = _view((batch, seqlen_q, num_heads, head_dim), case["q_layout"], dtype)
    q.copy_(torch.randn(q.shape, generator=g).to(dtype))
    capacity = case["capacity"]
    lengths = case["lengths"] if case["lengths"] is not None else (capacity,) * batch
    kwargs = dict(causal=case["causal"], num_splits=case["num_splits"], softmax_scale=case["softmax_scale"])
    seqlens = None
    if case["lengths"] is not None:
        seqlens = torch.tensor(lengths, dtype=torch.int32, device=DEVICE)
        given = _wild(lengths, capacity, g) if case["wild_seqlens"] else list(lengths)
        given = torch.tensor([[n, 10**6] for n in given], dtype=torch.int32, device=DEVICE)
        # stride 2 where drawn (B = 1 only: a strided [B] with B > 1 is refused)
        kwargs["cache_seqlens"] = given[:, 0] if case["strided_seqlens"] else given[:, 0].contiguous()
    if case["page_size"]:
        k, v, table = _paged_cache(case, lengths, kv_dtype, g)
        kwargs["block_table"] = table
        k_dense, v_dense = (gather_paged(t.float() if fp8 else t, table) for t in (k, v))
    else:
        k, _ = _view((batch, capacity, heads_kv, head_dim), case["k_layout"], kv_dtype)
        v, _ = _view((batch, capacity, heads_kv, head_dim), case["v_layout"], kv_dtype)
        past_length = torch.arange(capacity)[None, :] >= torch.tensor(lengths)[:, None]
        for t in (k, v):
            t.copy_(_cache_values(t.shape, fp8, dtype, g, past_length))
        k_dense, v_dense = (t.float() if fp8 else t for t in (k, v))
    if fp8:
        kwargs["k_descale"] = _descale(case["k_descale"], batch, heads_kv, g)
        kwargs["v_descale"] = _descale(case["v_descale"], batch, heads_kv, g)
        k_dense, v_dense = dequantize(k_dense, kwargs["k_descale"]), dequantize(v_dense, kwargs["v_descale"])
    return q, k, v, kwargs, k_dense, v_dense, seqlens


def _paged_cache(case, lengths, kv_dtype, g):
    """Shuffled pages (a row's first page shared with row 0's where drawn), garbage ids past each
    row's pages, NaN in every page slot no row reads; the table contiguous, a window of a wider
    one (strided rows) or one row for all (stride 0)."""
    batch, page_size, max_pages = case["batch"], case["page_size"], case["max_pages"]
    used = [cdiv(n, page_size) for n in lengths]
    if case["table"] == "shared_row":
        used_rows = [max(used)]
    else:
        used_rows = used
    num_pages = sum(used_rows) + case["spare_pages"] if max_pages else case["spare_pages"]
    num_pages = max(num_pages, 1 if max_pages else 0)
    order = torch.randperm(num_pages, generator=g).tolist()
    garbage = [-1, -(2**31), num_pages, 2**31 - 1, 10**6]
    rows = torch.tensor([[garbage[int(i)] for i in torch.randint(0, 5, (max_pages,), generator=g)]
                         for _ in used_rows], dtype=torch.int32).reshape(len(used_rows), max_pages)
    taken = 0
    for r, n in enumerate(used_rows):
        rows[r, :n] = torch.tensor(order[taken:taken + n], dtype=torch.int32)
        taken += n
        if case["share_first_page"] and r > 0 and n and used_rows[0]:
            rows[r, 0] = rows[0, 0]
    if case["table"] == "shared_row":
        table = rows.to(DEVICE).expand(batch, max_pages)
    elif case["table"] == "wide":
        wide = torch.full((batch, max_pages + 3), -5, dtype=torch.int32)
        wide[:, :max_pages] = rows
        table = wide.to(DEVICE)[:, :max_pages]
    else:
        table = rows.to(DEVICE)
    live = torch.zeros(num_pages, page_size, dtype=torch.bool)
    table_rows = table.cpu()
    for b, n in enumerate(lengths):
        for key in range(n):
            live[int(table_rows[b, key // page_size]), key % page_size] = True
    shape = (num_pages, page_size, case["heads_kv"], case["head_dim"])
    caches = []
    for layout in (case["k_layout"], case["v_layout"]):
        pages, _ = _view(shape, layout, kv_dtype)
        pages.copy_(_cache_values(shape, case["fp8"], case["dtype"], g, ~live))
        caches.append(pages)
    return caches[0], caches[1], table


def check_decode(backend: str, case: dict):
    q, k, v, kwargs, k_ref, v_ref, seqlens = build_decode(case)
    problem = check_decode_inputs(
        DecodeTensors(q, k, v, None, None, kwargs.get("cache_seqlens"), kwargs.get("block_table"),
                      kwargs.get("k_descale"), kwargs.get("v_descale")),
        DecodeOptions(causal=case["causal"], num_splits=case["num_splits"]))
    assume(get(backend).supports(problem) is None)  # (cute: head dims, alignment)
    given = kwargs.get("cache_seqlens")
    if given is not None and not torch.equal(given.cpu(), seqlens.cpu()):  # lengths out of range
        with pytest.raises(ValueError, match="cache_seqlens: row"):
            flashsplit.check_inputs(q, k, v, **kwargs)
    else:
        flashsplit.check_inputs(q, k, v, **kwargs)  # every value in range: nothing to report
    for _ in range(2 if HAS_CUDA else 1):  # on a GPU the second call replays the prepared launch
        out, lse = _run_decode(backend, case, q, k, v, kwargs)
        check_against_reference(out, lse, q, k_ref, v_ref, seqlens, case["causal"], case["softmax_scale"],
                                what=f"out[{backend}]")


def _run_decode(backend, case, q, k, v, kwargs):
    """Decode the drawn way: into a fresh or a given ``out`` (any layout; nothing outside its view
    written), returning or writing a given ``lse`` or none."""
    want_lse = case["lse"] != "none"
    if case["out_layout"] is None and case["lse"] != "given":
        result = flashsplit.decode(q, k, v, return_lse=want_lse, backend=backend, **kwargs)
        return result if want_lse else (result, None)
    out, storage = _view(q.shape, case["out_layout"] or "contiguous", q.dtype)
    lse = None
    if case["lse"] == "given":
        lse = torch.full((q.shape[0], q.shape[2], q.shape[1]), NAN, device=DEVICE)
        api.decode_into(q, k, v, out, lse, backend=backend, **kwargs)
    else:
        result = flashsplit.decode(q, k, v, out=out, return_lse=want_lse, backend=backend, **kwargs)
        result, lse = result if want_lse else (result, None)
        assert result is out
    assert _untouched_outside(out, storage), "decode wrote outside out's view"
    return out, lse


@pytest.mark.parametrize("backend", BACKENDS)
@given(data=st.data())
@examples(15)
def test_decode_matches_reference(backend, data):
    check_decode(backend, data.draw(decode_cases(backend)))


@pytest.mark.full
@pytest.mark.parametrize("backend", BACKENDS)
@given(data=st.data())
@examples(600)
def test_decode_matches_reference_full(backend, data, full_run):
    check_decode(backend, data.draw(decode_cases(backend, max_keys=700)))


# -- Drawn combines ---------------------------------------------------------------------------

@st.composite
def combine_cases(draw, backend: str):
    num_splits = draw(st.sampled_from([1, 2, 3, 17, 256]))
    return dict(
        num_splits=num_splits, batch=draw(st.integers(1, 3)), seqlen_q=draw(st.integers(1, 4)),
        num_heads=draw(st.integers(1, 6)),
        head_dim=draw(st.sampled_from([64, 128] if backend == "cute" else [1, 3, 8, 32, 64])),
        layout=draw(st.sampled_from(["contiguous", "head_major", "padded"])),
        out=draw(st.sampled_from([None, "contiguous", "padded"])),
        out_dtype=draw(st.sampled_from([None] + DTYPES + [torch.float32])),
        empty=draw(st.floats(0.0, 1.0)), offset=draw(st.sampled_from([0.0, 1e4, -1e4])),
        seed=draw(st.integers(0, 2**31 - 1)),
    )


def check_combine(backend: str, case: dict):
    g = torch.Generator().manual_seed(case["seed"])
    s, b, m, h, d = (case[n] for n in ("num_splits", "batch", "seqlen_q", "num_heads", "head_dim"))
    lse_p = (torch.randn(s, b, h, m, generator=g) * 4 + case["offset"])
    lse_p[torch.rand(s, b, h, m, generator=g) < case["empty"]] = float("-inf")
    o_p = torch.randn(s, b, m, h, d, generator=g)
    dead = torch.isneginf(lse_p).permute(0, 1, 3, 2)  # [S, B, L_q, H]
    o_p[dead] = torch.tensor([NAN, float("inf")])[torch.randint(0, 2, (int(dead.sum()),), generator=g)][:, None]
    if case["layout"] == "head_major":  # partials [S, B, H, L_q, D] viewed as [S, B, L_q, H, D]
        out_partial = o_p.permute(0, 1, 3, 2, 4).contiguous().permute(0, 1, 3, 2, 4)
        lse_partial = lse_p.clone()
    elif case["layout"] == "padded":
        out_partial = torch.full((s, b + 1, m, h, d + 5), NAN)[:, 1:, :, :, 2:d + 2]
        out_partial.copy_(o_p)
        lse_partial = torch.full((s, b, h, m + 3), NAN)[..., 1:m + 1]
        lse_partial.copy_(lse_p)
    else:
        out_partial, lse_partial = o_p, lse_p
    out_partial, lse_partial = out_partial.to(DEVICE), lse_partial.to(DEVICE)
    dtype = case["out_dtype"] or torch.float32
    problem = DecodeProblem(batch=b, seqlen_q=m, seqlen_k=0, num_heads=h, num_heads_kv=h, head_dim=d, dtype=dtype,
                            causal=False, has_cache_seqlens=False, device_type=DEVICE)
    assume(get(backend).supports(problem) is None)
    if case["out"] is None:
        out, lse = flashsplit.combine(out_partial, lse_partial, out_dtype=case["out_dtype"], backend=backend)
    else:
        given, storage = _view((b, m, h, d), case["out"], dtype)
        out, lse = flashsplit.combine(out_partial, lse_partial, out=given, out_dtype=case["out_dtype"],
                                      backend=backend)
        assert out is given and _untouched_outside(given, storage)
    ref, ref_lse = combine_ref(o_p, lse_p)
    assert out.dtype == dtype
    check_output(out.cpu(), ref, _combine_fp32(o_p, lse_p).to(dtype), dtype)
    check_lse(lse.cpu(), ref_lse, atol=1e-5, rtol=1e-6)


def _combine_fp32(out_partial, lse_partial):
    """PyTorch's merge in fp32 (the error yardstick): its weights ``exp(lse_s - lse)`` carry the
    rounding of LSEs as large as the partials'."""
    lse = torch.logsumexp(lse_partial, dim=0)
    weights = torch.exp(lse_partial - torch.where(torch.isneginf(lse), 0.0, lse)).permute(0, 1, 3, 2)[..., None]
    return torch.where(weights > 0, weights * out_partial, 0.0).sum(0)


@pytest.mark.parametrize("backend", BACKENDS)
@given(data=st.data())
@examples(30)
def test_combine_matches_reference(backend, data):
    check_combine(backend, data.draw(combine_cases(backend)))


@pytest.mark.full
@pytest.mark.parametrize("backend", BACKENDS)
@given(data=st.data())
@examples(1000)
def test_combine_matches_reference_full(backend, data, full_run):
    check_combine(backend, data.draw(combine_cases(backend)))


# -- Bad arguments ----------------------------------------------------------------------------

def _names_in(message: str) -> set[str]:
    """The argument names a message starts with: ``"k_cache/v_cache: ..."`` -> {k_cache, v_cache}."""
    return set(re.split(r"/| and ", message.split(":")[0].strip()))


def _imag_of_conj(t: torch.Tensor) -> torch.Tensor:
    """``t``'s values as a negated view, as public ops make one (``z.conj().imag``; fp16 and fp32,
    other dtypes as fp32)."""
    t = t if t.dtype in (torch.float16, torch.float32) else t.float()
    with torch_notice_silenced("ComplexHalf support is experimental"):  # the complex tensor only carries the negation
        return torch.complex(torch.zeros_like(t), -t).conj().imag


def _heads(t: torch.Tensor, n: int) -> torch.Tensor:
    """``t`` with ``n`` KV heads (its first, expanded)."""
    return t[:, :, :1].expand(t.shape[0], t.shape[1], n, t.shape[3])


DROP = object()  # a maker's "leave this argument out"


def _strided_last(t: torch.Tensor) -> torch.Tensor:
    return torch.cat([t, t], dim=-1)[..., ::2]


def _expanded_rows(t: torch.Tensor) -> torch.Tensor:
    return t[:1].expand(t.shape)


# Each maker takes the base arguments (a dict) and returns the bad arguments it replaces and
# the names a right error may start with. A maker returning None does not apply to this base.
DECODE_MAKERS = {
    "q not a tensor": lambda a: (dict(q=np.zeros(tuple(a["q"].shape), dtype=np.float16)), {"q"}),
    "q a list": lambda a: (dict(q=a["q"].tolist()), {"q"}),
    "q rank 3": lambda a: (dict(q=a["q"][0]), {"q"}),
    "q rank 5": lambda a: (dict(q=a["q"][None]), {"q"}),
    "q fp32": lambda a: (dict(q=a["q"].float()), {"q"}),
    "q int": lambda a: (dict(q=a["q"].to(torch.int16)), {"q"}),
    "q fp8": lambda a: (dict(q=a["q"].to(torch.float8_e4m3fn)), {"q"}),
    "q complex": lambda a: (dict(q=a["q"].to(torch.complex64)), {"q"}),
    "q sparse": lambda a: (dict(q=a["q"].to_sparse()), {"q"}),
    "q negated": lambda a: (dict(q=_imag_of_conj(a["q"])), {"q"}),
    "q last dim strided": lambda a: (dict(q=_strided_last(a["q"])), {"q"}),
    "q no tokens": lambda a: (dict(q=a["q"][:, :0]), {"q"}),
    "q head dim": lambda a: (dict(q=a["q"][..., :8] if a["q"].shape[-1] > 8 else torch.cat([a["q"]] * 2, -1)),
                             {"k_cache", "v_cache"}),
    "q heads": lambda a: None if a["k_cache"].shape[2] == 1 else (
        dict(q=torch.cat([a["q"], a["q"][:, :, :1]], dim=2)), {"q"}),
    "q on meta": lambda a: (dict(q=a["q"].to("meta")), {"q", "k_cache", "block_table"}),
    "k not a tensor": lambda a: (dict(k_cache=None), {"k_cache"}),
    "v a list": lambda a: (dict(v_cache=[1.0]), {"v_cache"}),
    "k rank": lambda a: (dict(k_cache=a["k_cache"][0]), {"k_cache"}),
    "k fp32": lambda a: (dict(k_cache=a["k_cache"].float(), v_cache=a["v_cache"].float()), {"k_cache"}),
    "k int8": lambda a: (dict(k_cache=a["k_cache"].to(torch.int8), v_cache=a["v_cache"].to(torch.int8)),
                         {"k_cache"}),
    "k/v dtypes differ": lambda a: (dict(v_cache=a["v_cache"].to(
        torch.float8_e5m2 if a["v_cache"].dtype != torch.float8_e5m2 else torch.float16)), {"k_cache", "v_cache"}),
    "k/v 16-bit other than q": lambda a: None if a["k_cache"].dtype in FP8 else (
        dict(k_cache=a["k_cache"].to(_other(a["q"].dtype)), v_cache=a["v_cache"].to(_other(a["q"].dtype))),
        {"k_cache", "v_cache"}),
    "k/v shapes differ": lambda a: (dict(v_cache=a["v_cache"][:, :, :, :8] if a["v_cache"].shape[-1] > 8
                                         else torch.cat([a["v_cache"]] * 2, -1)), {"k_cache", "v_cache"}),
    "k last dim strided": lambda a: (dict(k_cache=_strided_last(a["k_cache"]), v_cache=_strided_last(a["v_cache"])),
                                     {"k_cache"}),
    "k sparse": lambda a: (dict(k_cache=a["k_cache"].float().to_sparse()), {"k_cache"}),
    "v negated": lambda a: (dict(v_cache=_imag_of_conj(a["v_cache"])), {"v_cache"}),
    "k on meta": lambda a: (dict(k_cache=a["k_cache"].to("meta")), {"k_cache"}),
    "heads not a multiple": lambda a: (dict(k_cache=_heads(a["k_cache"], a["q"].shape[2] + 1),
                                            v_cache=_heads(a["v_cache"], a["q"].shape[2] + 1)), {"q", "k_cache"}),
    "dense batch": lambda a: None if "block_table" in a else (
        dict(k_cache=torch.cat([a["k_cache"]] * 2)[:len(a["q"]) + 1],
             v_cache=torch.cat([a["v_cache"]] * 2)[:len(a["q"]) + 1]), {"k_cache"}),
    "seqlens int64": lambda a: (dict(cache_seqlens=_lengths_of(a).long()), {"cache_seqlens"}),
    "seqlens float": lambda a: (dict(cache_seqlens=_lengths_of(a).float()), {"cache_seqlens"}),
    "seqlens a list": lambda a: (dict(cache_seqlens=_lengths_of(a).tolist()), {"cache_seqlens"}),
    "seqlens a number": lambda a: (dict(cache_seqlens=5), {"cache_seqlens"}),
    "seqlens too long": lambda a: (dict(cache_seqlens=torch.cat([_lengths_of(a)] * 2)), {"cache_seqlens"}),
    "seqlens 2-d": lambda a: (dict(cache_seqlens=_lengths_of(a)[:, None]), {"cache_seqlens"}),
    "seqlens 0-d": lambda a: (dict(cache_seqlens=_lengths_of(a)[0]), {"cache_seqlens"}),
    "seqlens strided": lambda a: None if len(a["q"]) == 1 else (
        dict(cache_seqlens=torch.stack([_lengths_of(a)] * 2, dim=1)[:, 0]), {"cache_seqlens"}),
    "seqlens expanded": lambda a: None if len(a["q"]) == 1 else (
        dict(cache_seqlens=_lengths_of(a)[:1].expand(len(a["q"]))), {"cache_seqlens"}),
    "seqlens sparse": lambda a: (dict(cache_seqlens=_lengths_of(a).to_sparse()), {"cache_seqlens"}),
    "seqlens on meta": lambda a: (dict(cache_seqlens=_lengths_of(a).to("meta")), {"cache_seqlens"}),
    "table int64": lambda a: _paged(a, block_table=lambda t: t.long()),
    "table rank 1": lambda a: _paged(a, block_table=lambda t: t[0]),
    "table rows": lambda a: _paged(a, block_table=lambda t: torch.cat([t, t[:1]])),
    "table columns strided": lambda a: _paged(a, block_table=lambda t: None if t.shape[1] < 2 else
                                              torch.stack([t, t], dim=-1).flatten(1)[:, ::2]),
    "table a list": lambda a: _paged(a, block_table=lambda t: t.tolist()),
    "table sparse": lambda a: _paged(a, block_table=lambda t: t.to_sparse()),
    "table on meta": lambda a: _paged(a, block_table=lambda t: t.to("meta")),
    "table and its alias": lambda a: None if "block_table" not in a else (
        dict(page_table=a["block_table"]), {"page_table"}),
    "no pages": lambda a: None if "block_table" not in a or a["block_table"].shape[1] == 0 else (
        dict(k_cache=a["k_cache"][:0], v_cache=a["v_cache"][:0]), {"k_cache"}),
    "no page size": lambda a: None if "block_table" not in a else (
        dict(k_cache=a["k_cache"][:, :0], v_cache=a["v_cache"][:, :0]), {"k_cache"}),
    "descale missing": lambda a: _fp8(a, dict(k_descale=DROP), "k_descale"),
    "descale fp16": lambda a: _fp8(a, dict(v_descale=a.get("v_descale", torch.ones(1)).half()), "v_descale"),
    "descale shape": lambda a: _fp8(a, dict(k_descale=torch.ones(len(a["q"]) + 1, a["k_cache"].shape[2])),
                                    "k_descale"),
    "descale a float": lambda a: _fp8(a, dict(k_descale=1.0), "k_descale"),
    "descale sparse": lambda a: _fp8(a, dict(k_descale=torch.ones(len(a["q"]), a["k_cache"].shape[2]).to_sparse()),
                                     "k_descale"),
    "descale negated": lambda a: _fp8(a, dict(k_descale=_imag_of_conj(torch.ones(len(a["q"]),
                                                                                 a["k_cache"].shape[2]))), "k_descale"),
    "descale on meta": lambda a: _fp8(a, dict(v_descale=torch.ones(1, device="meta")), "v_descale"),
    "descale for a 16-bit cache": lambda a: None if a["k_cache"].dtype in FP8 else (
        dict(k_descale=torch.ones(1)), {"k_descale"}),
    "scale a str": lambda a: (dict(softmax_scale="0.1"), {"softmax_scale"}),
    "scale a list": lambda a: (dict(softmax_scale=[0.1]), {"softmax_scale"}),
    "scale a bool": lambda a: (dict(softmax_scale=True), {"softmax_scale"}),
    "scale complex": lambda a: (dict(softmax_scale=0.1j), {"softmax_scale"}),
    "scale a tensor": lambda a: (dict(softmax_scale=torch.tensor(0.1)), {"softmax_scale"}),
    "scale nan": lambda a: (dict(softmax_scale=NAN), {"softmax_scale"}),
    "scale inf": lambda a: (dict(softmax_scale=-float("inf")), {"softmax_scale"}),
    "scale past 2**64": lambda a: (dict(softmax_scale=1e37), {"softmax_scale"}),
    "scale a huge int": lambda a: (dict(softmax_scale=-(10**30)), {"softmax_scale"}),
    "causal an int": lambda a: (dict(causal=1), {"causal"}),
    "causal None": lambda a: (dict(causal=None), {"causal"}),
    "causal numpy": lambda a: (dict(causal=np.bool_(True)), {"causal"}),
    "splits < 0": lambda a: (dict(num_splits=-1), {"num_splits"}),
    "splits > 256": lambda a: (dict(num_splits=257), {"num_splits"}),
    "splits float": lambda a: (dict(num_splits=3.0), {"num_splits"}),
    "splits None": lambda a: (dict(num_splits=None), {"num_splits"}),
    "splits bool": lambda a: (dict(num_splits=True), {"num_splits"}),
    "return_lse None": lambda a: (dict(return_lse=None), {"return_lse"}),
    "out a list": lambda a: (dict(out=a["q"].tolist()), {"out"}),
    "out shape": lambda a: (dict(out=torch.cat([a["q"], a["q"]], dim=2)), {"out"}),
    "out dtype": lambda a: (dict(out=a["q"].float()), {"out"}),
    "out last dim strided": lambda a: (dict(out=_strided_last(a["q"].clone())), {"out"}),
    "out expanded": lambda a: None if len(a["q"]) == 1 else (dict(out=_expanded_rows(a["q"].clone())), {"out"}),
    "out sparse": lambda a: (dict(out=a["q"].to_sparse()), {"out"}),
    "out negated": lambda a: (dict(out=_imag_of_conj(a["q"].clone())), {"out"}),
    "out on meta": lambda a: (dict(out=a["q"].to("meta")), {"out"}),
    "backend unknown": lambda a: (dict(backend="nope"), {"backend"}),
    "backend an int": lambda a: (dict(backend=3), {"backend"}),
}


def _other(dtype):
    return torch.bfloat16 if dtype == torch.float16 else torch.float16


def _lengths_of(a):
    return a.get("cache_seqlens", torch.ones(len(a["q"]), dtype=torch.int32))


def _paged(a, block_table):
    if "block_table" not in a:
        return None
    bad = block_table(a["block_table"])
    return None if bad is None else (dict(block_table=bad), {"block_table"})


def _fp8(a, change: dict, name: str):
    return None if a["k_cache"].dtype not in FP8 else (change, {name})


@st.composite
def decode_bases(draw):
    """Valid decode arguments of tiny shapes, dense or paged, 16-bit or fp8 (never launched)."""
    batch, heads_kv, group = draw(st.integers(1, 3)), draw(st.integers(1, 2)), draw(st.integers(1, 4))
    seqlen_q, head_dim = draw(st.integers(1, 3)), draw(st.sampled_from([8, 16, 64]))
    dtype = draw(st.sampled_from(DTYPES))
    q = torch.randn(batch, seqlen_q, heads_kv * group, head_dim).to(DEVICE, dtype)
    args = dict(q=q)
    if draw(st.booleans()):
        page_size, max_pages = draw(st.sampled_from([1, 16])), draw(st.integers(0, 3))
        k = torch.randn(batch * max_pages + 1, page_size, heads_kv, head_dim)
        args["block_table"] = torch.randint(0, len(k), (batch, max_pages), dtype=torch.int32).to(DEVICE)
        capacity = page_size * max_pages
    else:
        capacity = draw(st.integers(0, 40))
        k = torch.randn(batch, capacity, heads_kv, head_dim)
    fp8 = draw(st.sampled_from([None, *FP8]))
    args["k_cache"], args["v_cache"] = (k.to(DEVICE, fp8 or dtype) for _ in range(2))
    if fp8:
        args["k_descale"] = torch.rand(batch, heads_kv).to(DEVICE) + 0.5
        args["v_descale"] = torch.ones(1, device=DEVICE)
    if draw(st.booleans()):
        args["cache_seqlens"] = torch.randint(0, capacity + 1, (batch,), dtype=torch.int32).to(DEVICE)
    return args


def _decode_call(args: dict):
    a = dict(args)
    return flashsplit.decode(a.pop("q"), a.pop("k_cache"), a.pop("v_cache"), **a)


def _key(args: dict):
    """The per-signature cache key decode computes for ``args`` (None: never cached)."""
    a = dict(args)
    if ("page_table" in a and "block_table" in a) or not isinstance(a.get("return_lse", False), bool):
        return None  # decode refuses these before it computes a key
    q = a["q"]
    out = a.get("out")
    try:
        out = torch.empty_like(q) if out is None else out
    except Exception:  # noqa: BLE001  (an odd q: decode allocates nothing either)
        return None
    tensors = DecodeTensors(q, a["k_cache"], a["v_cache"], out, None, a.get("cache_seqlens"),
                            a.get("block_table", a.get("page_table")), a.get("k_descale"), a.get("v_descale"))
    options = DecodeOptions(a.get("softmax_scale"), a.get("causal", False), a.get("num_splits", 0),
                            a.get("backend", "auto"))
    return dispatch.signature(tensors, options, "out" not in a)


def check_bad_decode(base: dict, maker: str, made: tuple):
    change, expected = made
    check_decode_inputs(DecodeTensors(base["q"], base["k_cache"], base["v_cache"], None, None,
                                      base.get("cache_seqlens"), base.get("block_table"), base.get("k_descale"),
                                      base.get("v_descale")))  # the base is valid
    bad = {n: a for n, a in (base | change).items() if a is not DROP}
    with pytest.raises((TypeError, ValueError)) as caught:
        _decode_call(bad)
    assert _names_in(str(caught.value)) & expected, f"{maker}: {caught.value}"
    # A call signature never serves a validated launch to an argument validation refuses.
    key = _key(bad)
    assert key is None or key != _key(base), maker
    check_keys = ("q", "k_cache", "v_cache", "cache_seqlens", "block_table", "page_table", "k_descale",
                  "v_descale", "causal", "num_splits", "out", "softmax_scale")
    if not set(change) - set(check_keys):  # check_inputs refuses it too
        a = {n: bad[n] for n in check_keys if n in bad}
        with pytest.raises((TypeError, ValueError)) as caught:
            flashsplit.check_inputs(a.pop("q"), a.pop("k_cache"), a.pop("v_cache"), **a)
        assert _names_in(str(caught.value)) & expected, f"check_inputs, {maker}: {caught.value}"


@given(base=decode_bases(), maker=st.sampled_from(sorted(DECODE_MAKERS)))
@examples(1000)
def test_bad_decode_arguments_are_refused(base, maker):
    made = DECODE_MAKERS[maker](base)
    assume(made is not None)
    check_bad_decode(base, maker, made)


@pytest.mark.full
@given(base=decode_bases(), maker=st.sampled_from(sorted(DECODE_MAKERS)))
@examples(20000)
def test_bad_decode_arguments_are_refused_full(base, maker, full_run):
    made = DECODE_MAKERS[maker](base)
    assume(made is not None)
    check_bad_decode(base, maker, made)


def test_every_bad_decode_argument_is_drawn():
    """Every maker applies to some base (none is dead code in the property above)."""
    q = torch.randn(2, 1, 4, 16).half()
    dense = dict(q=q, k_cache=torch.randn(2, 8, 2, 16).half(), v_cache=torch.randn(2, 8, 2, 16).half(),
                 cache_seqlens=torch.tensor([3, 8], dtype=torch.int32))
    paged = dict(q=q, k_cache=torch.randn(5, 4, 2, 16).to(torch.float8_e4m3fn),
                 v_cache=torch.randn(5, 4, 2, 16).to(torch.float8_e4m3fn),
                 block_table=torch.tensor([[0, 1], [2, 3]], dtype=torch.int32),
                 k_descale=torch.ones(2, 2), v_descale=torch.ones(1))
    for maker in DECODE_MAKERS:
        made = [(base, DECODE_MAKERS[maker](base)) for base in (dense, paged)]
        assert any(m is not None for _, m in made), maker
        for base, m in made:
            if m is not None:
                check_bad_decode(base, maker, m)


COMBINE_MAKERS = {
    "out_partial not a tensor": lambda a: (dict(out_partial=a["out_partial"].tolist()), {"out_partial"}),
    "out_partial fp16": lambda a: (dict(out_partial=a["out_partial"].half()), {"out_partial"}),
    "out_partial rank": lambda a: (dict(out_partial=a["out_partial"][0]), {"out_partial"}),
    "out_partial last dim strided": lambda a: None if a["out_partial"].shape[-1] == 1 else (
        dict(out_partial=_strided_last(a["out_partial"])), {"out_partial"}),
    "out_partial sparse": lambda a: (dict(out_partial=a["out_partial"].to_sparse()), {"out_partial"}),
    "out_partial negated": lambda a: (dict(out_partial=_imag_of_conj(a["out_partial"])), {"out_partial"}),
    "out_partial on meta": lambda a: (dict(out_partial=a["out_partial"].to("meta")), {"lse_partial"}),
    "too many splits": lambda a: (dict(out_partial=a["out_partial"][:1].expand(257, *a["out_partial"].shape[1:]),
                                       lse_partial=a["lse_partial"][:1].expand(257, *a["lse_partial"].shape[1:])),
                                  {"out_partial"}),
    "lse_partial shape": lambda a: (dict(lse_partial=a["lse_partial"][:, :, :, :0]), {"lse_partial"}),
    "lse_partial int": lambda a: (dict(lse_partial=a["lse_partial"].int()), {"lse_partial"}),
    "lse_partial last dim strided": lambda a: None if a["lse_partial"].shape[-1] == 1 else (
        dict(lse_partial=_strided_last(a["lse_partial"])[..., :a["lse_partial"].shape[-1]]), {"lse_partial"}),
    "lse_partial csr": lambda a: (dict(lse_partial=a["lse_partial"].flatten(1).to_sparse_csr()), {"lse_partial"}),
    "out a list": lambda a: (dict(out=[0.0]), {"out"}),
    "out shape": lambda a: (dict(out=torch.zeros(1, device=DEVICE)), {"out"}),
    "out int": lambda a: (dict(out=_out_like(a, torch.int32)), {"out"}),
    "out fp8": lambda a: (dict(out=_out_like(a, torch.float8_e4m3fn)), {"out"}),
    "out float64": lambda a: (dict(out=_out_like(a, torch.float64)), {"out"}),
    "out last dim strided": lambda a: None if a["out_partial"].shape[-1] == 1 else (
        dict(out=_strided_last(_out_like(a, torch.float32))), {"out"}),
    "out expanded": lambda a: None if a["out_partial"].shape[1] == 1 else (
        dict(out=_expanded_rows(_out_like(a, torch.float32))), {"out"}),
    "out sparse": lambda a: (dict(out=_out_like(a, torch.float32).to_sparse()), {"out"}),
    "out on meta": lambda a: (dict(out=_out_like(a, torch.float32).to("meta")), {"out"}),
    "out_dtype int64": lambda a: (dict(out_dtype=torch.int64), {"out_dtype"}),
    "out_dtype fp8": lambda a: (dict(out_dtype=torch.float8_e5m2), {"out_dtype"}),
    "out_dtype float64": lambda a: (dict(out_dtype=torch.float64), {"out_dtype"}),
    "out_dtype a str": lambda a: (dict(out_dtype="float16"), {"out_dtype"}),
    "out_dtype numpy": lambda a: (dict(out_dtype=np.float16), {"out_dtype"}),
    "out_dtype disagrees": lambda a: (dict(out=_out_like(a, torch.float32), out_dtype=torch.float16), {"out_dtype"}),
    "backend unknown": lambda a: (dict(backend="x"), {"backend"}),
    "backend None": lambda a: (dict(backend=None), {"backend"}),
}


def _out_like(a, dtype):
    s, b, m, h, d = a["out_partial"].shape
    return torch.zeros(b, m, h, d, device=DEVICE).to(dtype)


@st.composite
def combine_bases(draw):
    s, b, m = draw(st.integers(1, 4)), draw(st.integers(1, 3)), draw(st.integers(1, 3))
    h, d = draw(st.integers(1, 4)), draw(st.sampled_from([1, 8, 32]))
    return dict(out_partial=torch.randn(s, b, m, h, d, device=DEVICE),
                lse_partial=torch.randn(s, b, h, m, device=DEVICE))


def check_bad_combine(base: dict, maker: str, made: tuple):
    change, expected = made
    a = base | change
    with pytest.raises((TypeError, ValueError)) as caught:
        flashsplit.combine(a.pop("out_partial"), a.pop("lse_partial"), **a)
    assert _names_in(str(caught.value)) & expected, f"{maker}: {caught.value}"


@given(base=combine_bases(), maker=st.sampled_from(sorted(COMBINE_MAKERS)))
@examples(300)
def test_bad_combine_arguments_are_refused(base, maker):
    made = COMBINE_MAKERS[maker](base)
    assume(made is not None)
    check_bad_combine(base, maker, made)


def test_every_bad_combine_argument_is_drawn():
    base = dict(out_partial=torch.randn(3, 2, 2, 4, 8, device=DEVICE),
                lse_partial=torch.randn(3, 2, 4, 2, device=DEVICE))
    for maker in COMBINE_MAKERS:
        made = COMBINE_MAKERS[maker](base)
        assert made is not None, maker
        check_bad_combine(base, maker, made)


# -- plan -------------------------------------------------------------------------------------

PLAN_BAD = {
    "batch": [-1, "2", 2.0, True, None], "seqlen_k": [-5, 1.5], "num_heads": [0, 7, "8"],
    "num_heads_kv": [0, -2, 3.0], "head_dim": [0, 12, 264, 128.0], "seqlen_q": [0, -1, "1"],
    "dtype": [torch.float32, torch.int8, "bfloat16", None], "causal": [1, None, "no"],
    "has_cache_seqlens": [0, "yes"], "page_size": [-16, 1.0, 48], "kv_dtype": [torch.int8, torch.float32, "fp8"],
    "num_splits": [-1, 257, 2.5, None], "num_sms": [0, -3, 1.5, "132"], "device": ["gpu7", 3.5, [0]],
    "backend": ["nope", None, 1],
}


@given(batch=st.integers(1, 64), seqlen_k=st.sampled_from([0, 128, 1024, 4096]), heads_kv=st.sampled_from([1, 2, 8]),
       group=st.integers(1, 8), head_dim=st.sampled_from([64, 128]), seqlen_q=st.integers(1, 6),
       dtype=st.sampled_from([torch.float16, torch.bfloat16]), page_size=st.sampled_from([0, 16, 64]),
       kv_dtype=st.sampled_from([None, *FP8]), num_splits=st.sampled_from([0, 1, 3, 17, 256]),
       arg=st.sampled_from(sorted(PLAN_BAD)), pick=st.integers(0, 4))
@examples(300)
def test_plan_accepts_what_decode_takes_and_refuses_the_rest(batch, seqlen_k, heads_kv, group, head_dim, seqlen_q,
                                                              dtype, page_size, kv_dtype, num_splits, arg, pick):
    """A valid description plans (on the GPU backends' model, with no GPU needed); each bad
    argument raises a TypeError/ValueError naming it."""
    kwargs = dict(seqlen_q=seqlen_q, dtype=dtype, page_size=page_size, kv_dtype=kv_dtype, num_splits=num_splits,
                  num_sms=132, device="cuda", backend="triton")
    shape = dict(batch=batch, seqlen_k=seqlen_k, num_heads=heads_kv * group, num_heads_kv=heads_kv,
                 head_dim=head_dim)
    p = flashsplit.plan(*shape.values(), **kwargs)
    assert p.num_splits == num_splits or num_splits == 0
    bad = PLAN_BAD[arg][pick % len(PLAN_BAD[arg])]
    if arg == "page_size" and bad == 48 and seqlen_k % 48 == 0:
        bad = -16
    if arg == "num_heads" and bad == 7 and 7 % heads_kv == 0:
        bad = 0
    args = shape | kwargs | {arg: bad}
    positional = [args.pop(n) for n in shape]
    with pytest.raises((TypeError, ValueError)) as caught:
        flashsplit.plan(*positional, **args)
    # A page size that does not divide the capacity is refused as the capacity's fault:
    # "seqlen_k: expected a multiple of page_size (48) ...".
    named = {arg, "seqlen_k"} if arg == "page_size" and bad == 48 else {arg}
    assert named & _names_in(str(caught.value)), str(caught.value)


def test_plan_of_an_empty_batch():
    """decode() of batch 0 returns before planning; plan() of batch 0 (documented as valid) plans
    one split (no work to spread)."""
    p = flashsplit.plan(0, 1024, 8, 2, 128, num_sms=132, device="cuda", backend="triton")
    assert (p.num_splits, p.work_units) == (1, 0) and "no work" in p.split_reason


def test_softmax_scale_bound_is_what_fp16_scores_can_carry():
    """The documented reasoning behind MAX_SOFTMAX_SCALE, as arithmetic: the largest fp16 q.k
    (head dim 256) times 2^64 * log2(e) stays finite in fp32; 1e37 * log2(e) * 35 does not."""
    from flashsplit.validation import MAX_SOFTMAX_SCALE

    largest_qk = 256 * 65504.0**2
    assert math.isfinite(float(torch.tensor(MAX_SOFTMAX_SCALE * math.log2(math.e) * largest_qk,
                                            dtype=torch.float32)))
    assert math.isinf(float(torch.tensor(1e37 * math.log2(math.e), dtype=torch.float32) * 35))
