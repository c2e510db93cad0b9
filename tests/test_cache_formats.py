"""Inference cache formats through the Triton backend: paged KV, fp8 KV, any GQA ratio.

Runs on the CPU through the Triton interpreter (fp16 q: the interpreter's bf16 ``tl.dot`` is
wrong) and on a GPU in bf16 too. Paged caches are shuffled, share a page between rows, hold NaN
in every slot no row uses, and have garbage page ids past each row's last page. Cells marked
``full`` repeat a regime the default run already covers (``pytest --full`` runs them).
"""

import itertools

import pytest
import torch
from conftest import DEVICE, HAS_CUDA

import flashsplit
from flashsplit.reference import dequantize, gather_paged
from flashsplit.testing import (
    POISON,
    DecodeCase,
    check_against_reference,
    make_inputs,
    quantize_fp8,
    to_paged,
)

DTYPES = [torch.float16, torch.bfloat16] if HAS_CUDA else [torch.float16]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("page_size, lengths, num_splits, causal", [
    (1, (37, 5, 0), 3, False),
    (16, (300, 129, 16), 0, True),
    (48, (290, 100, 47), 17, False),
    (256, (600, 257, 1), 2, True),
    # Splits longer than the page ids one chunk loads (page 1: 1024 ids; 48: 64 ids = 3072 keys;
    # 16: 256 ids = 4096 keys), chunks starting mid-page (48 does not divide 2048).
    (1, (1100, 513, 3), 1, False),
    (48, (4400, 2049, 100), 1, True),
    pytest.param(16, (9000, 4500, 7), 2, False, marks=pytest.mark.full),
])
def test_paged_matches_dense(dtype, page_size, lengths, num_splits, causal, generator):
    case = DecodeCase(batch=3, seqlen_q=2, seqlen_k=max(lengths) + 5, num_heads_kv=2, group=4, head_dim=64,
                      dtype=dtype, lengths=lengths, num_splits=num_splits, causal=causal)
    q, k, v, seqlens = make_inputs(case, DEVICE, generator)
    k_pages, v_pages, table, k, v = to_paged(k, v, list(lengths), page_size, generator)
    assert k_pages.shape[1] == page_size
    out = torch.full_like(q, POISON)
    result, lse = flashsplit.decode(q, k_pages, v_pages, block_table=table, cache_seqlens=seqlens, causal=causal,
                                    num_splits=num_splits, return_lse=True, out=out)
    check_against_reference(result, lse, q, k, v, seqlens, causal)
    # The reference's own view of the paged cache agrees with the dense one it came from.
    live = torch.arange(k.shape[1], device=k.device)[None, :] < seqlens[:, None]
    assert torch.equal(gather_paged(k_pages, table)[live], k[live])


def test_page_table_alias_and_plan(generator):
    case = DecodeCase(batch=2, seqlen_q=1, seqlen_k=64, num_heads_kv=1, group=4, head_dim=64,
                      dtype=torch.float16, lengths=(64, 33))
    q, k, v, seqlens = make_inputs(case, DEVICE, generator)
    k_pages, v_pages, table, k, v = to_paged(k, v, [64, 33], 16, generator)
    a = flashsplit.decode(q, k_pages, v_pages, page_table=table, cache_seqlens=seqlens, num_splits=1)
    b = flashsplit.decode(q, k_pages, v_pages, block_table=table, cache_seqlens=seqlens, num_splits=1)
    assert torch.equal(a, b)
    # 24-key pages are no multiple of the 8-key rows cute's TMA boxes start on: cute gathers them
    # row by row, measured slower than Triton, so auto plans Triton (on a CPU: cute needs CUDA).
    p = flashsplit.plan(2, table.shape[1] * 24, 4, 1, 64, page_size=24, device=DEVICE)
    assert p.backend == "triton", p.backend_reason
    if DEVICE == "cuda" and "cute" in flashsplit.backends():
        assert "also able: cute" in p.backend_reason, p.backend_reason


def _fp8_cells():
    """Every q dtype x fp8 format x scale layout x length regime. The default run takes 6 cells in
    which each dtype and each format meets every layout and both regimes. fp8 caches run their
    dots in fp16 whatever q's dtype, so bf16 q is exact on the CPU too. The long regime has
    splits of 2048+ keys: dense 128-key tiles."""
    f16, bf16, e4m3, e5m2 = torch.float16, torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2
    layouts = {"per-tensor": (False, 0), "per-head": (True, 0), "per-head-paged": (True, 16)}
    regimes = {"short": ((200, 129, 0), 3), "long": ((2300, 2049, 5), 1)}
    default = {(f16, e4m3, "per-tensor", "short"), (bf16, e5m2, "per-tensor", "long"),
               (bf16, e4m3, "per-head", "short"), (f16, e5m2, "per-head", "long"),
               (bf16, e5m2, "per-head-paged", "short"), (f16, e4m3, "per-head-paged", "long")}
    # bf16 cells run on a GPU only: decode refuses bf16 CPU tensors (the interpreter rounds bf16 wrongly).
    return [pytest.param(dtype, fp8, *layouts[layout], *regimes[regime],
                         marks=(() if (dtype, fp8, layout, regime) in default else (pytest.mark.full,))
                         + ((pytest.mark.gpu,) if dtype == bf16 else ()),
                         id=f"{str(dtype)[6:]}-{str(fp8)[6:]}-{layout}-{regime}")
            for dtype, fp8, layout, regime in itertools.product([f16, bf16], [e4m3, e5m2], layouts, regimes)]


@pytest.mark.parametrize("dtype, fp8, per_head, page_size, lengths, num_splits", _fp8_cells())
def test_fp8_cache(dtype, fp8, per_head, page_size, lengths, num_splits, generator):
    case = DecodeCase(batch=3, seqlen_q=1, seqlen_k=max(lengths) + 3, num_heads_kv=2, group=4, head_dim=64,
                      dtype=dtype, lengths=lengths, num_splits=num_splits)
    q, k, v, seqlens = make_inputs(case, DEVICE, generator)
    k8, k_descale = quantize_fp8(k, fp8, per_head)
    v8, v_descale = quantize_fp8(v, fp8, per_head)
    assert k8.dtype == fp8 and k_descale.dtype == torch.float32
    extra = {}
    if page_size:
        k8_pages, v8_pages, table, k8, v8 = to_paged(k8, v8, list(lengths), page_size, generator,
                                                     share_first_page=False)
        extra = dict(block_table=table)
    k_ref, v_ref = dequantize(k8, k_descale), dequantize(v8, v_descale)  # what the kernel must attend to
    if page_size:
        k8, v8 = k8_pages, v8_pages
    out, lse = flashsplit.decode(q, k8, v8, cache_seqlens=seqlens, k_descale=k_descale, v_descale=v_descale,
                                 num_splits=num_splits, return_lse=True, **extra)
    assert out.dtype == dtype
    check_against_reference(out, lse, q, k_ref, v_ref, seqlens, False)


@pytest.mark.parametrize("head_dim, page_size", [(96, 0), pytest.param(128, 0, marks=pytest.mark.full), (128, 16)])
def test_fp8_cache_unmasked_tiles_with_causal_diagonal_and_tails(head_dim, page_size, generator):
    """Triton's fp8 kernel runs the tiles wholly inside a split's visible keys without masks
    (``TritonBackend.full_tiles_fp8``) and the rest masked: partial last tiles, a causal diagonal
    that crosses tiles (L_q = 3), a head dim below its tile (96 of 128: columns still masked),
    rows shorter than one tile, NaN past every row's end, and pages."""
    lengths = (1088, 256, 131, 3)  # 1088, 256: the causal diagonal ends a whole tile
    case = DecodeCase(batch=4, seqlen_q=3, seqlen_k=1104, num_heads_kv=2, group=2, head_dim=head_dim,
                      dtype=torch.float16, lengths=lengths, num_splits=3, causal=True)
    q, k, v, seqlens = make_inputs(case, DEVICE, generator)
    k8, k_descale = quantize_fp8(k, torch.float8_e4m3fn, True)
    v8, v_descale = quantize_fp8(v, torch.float8_e4m3fn, True)
    k_ref, v_ref = dequantize(k8, k_descale), dequantize(v8, v_descale)
    extra = {}
    if page_size:
        k8, v8, table, k_ref8, v_ref8 = to_paged(k8, v8, list(lengths), page_size, generator, share_first_page=False)
        k_ref, v_ref = dequantize(k_ref8, k_descale), dequantize(v_ref8, v_descale)
        extra = dict(block_table=table)
    out, lse = flashsplit.decode(q, k8, v8, cache_seqlens=seqlens, k_descale=k_descale, v_descale=v_descale,
                                 causal=True, num_splits=3, return_lse=True, backend="triton", **extra)
    check_against_reference(out, lse, q, k_ref, v_ref, seqlens, True)


@pytest.mark.parametrize("layout, pairs", [
    ("contiguous", True), pytest.param("odd address", False, marks=pytest.mark.full), ("odd strides", False)])
def test_fp8_v_read_as_pairs_where_it_can_be(layout, pairs, generator):
    """Triton reads an fp8 V cache as int16 pairs of adjacent columns when its address and strides
    allow (16-byte aligned, even strides), and byte by byte otherwise; both agree with the
    reference. On the CPU the pairs are split by integer casts, on a GPU by PTX ``cvt``."""
    from flashsplit.triton.backend import _v_pairs

    lengths = (300, 131, 64)
    case = DecodeCase(batch=3, seqlen_q=1, seqlen_k=304, num_heads_kv=2, group=4, head_dim=64,
                      dtype=torch.float16, lengths=lengths, num_splits=2)
    q, k, v, seqlens = make_inputs(case, DEVICE, generator)
    k8, k_descale = quantize_fp8(k, torch.float8_e5m2, True)
    v8, v_descale = quantize_fp8(v, torch.float8_e5m2, True)
    if layout == "odd address":  # the same values one byte into a wider buffer
        wide = torch.empty(*v8.shape[:3], 65, dtype=torch.uint8, device=DEVICE)
        wide[..., 1:] = v8.view(torch.uint8)
        v8 = wide.view(torch.float8_e5m2)[..., 1:]
    elif layout == "odd strides":  # heads 65 bytes apart
        wide = torch.empty(*v8.shape[:3], 65, dtype=torch.float8_e5m2, device=DEVICE)
        wide[..., :64] = v8
        v8 = wide[..., :64]
    assert _v_pairs(v8) is pairs
    out, lse = flashsplit.decode(q, k8, v8, cache_seqlens=seqlens, k_descale=k_descale, v_descale=v_descale,
                                 num_splits=2, return_lse=True, backend="triton")
    check_against_reference(out, lse, q, dequantize(k8, k_descale), dequantize(v8, v_descale), seqlens, False)


@pytest.mark.parametrize("dtype, big", [(torch.float16, 3e4), pytest.param(torch.bfloat16, 1e7, marks=pytest.mark.gpu)])
def test_fp8_cache_with_q_rows_of_any_magnitude(dtype, big, generator):
    """q rows far outside fp16's comfortable range (and far below it) in one tile: each row is
    scaled into fp16 by its own power of two, so none overflows and none loses precision."""
    case = DecodeCase(batch=2, seqlen_q=1, seqlen_k=300, num_heads_kv=1, group=4, head_dim=64, dtype=dtype,
                      lengths=(300, 77), num_splits=2)
    q, k, v, seqlens = make_inputs(case, DEVICE, generator)
    q = (q.double() * torch.tensor([1e-4, 1.0, big / 4, 3.0], dtype=torch.float64, device=DEVICE)[:, None]).to(dtype)
    k8, k_descale = quantize_fp8(k, torch.float8_e4m3fn, True)
    v8, v_descale = quantize_fp8(v, torch.float8_e4m3fn, True)
    out, lse = flashsplit.decode(q, k8, v8, cache_seqlens=seqlens, k_descale=k_descale, v_descale=v_descale,
                                 num_splits=2, return_lse=True, backend="triton")
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()
    check_against_reference(out, lse, q, dequantize(k8, k_descale), dequantize(v8, v_descale), seqlens, False)


@pytest.mark.parametrize("group, seqlen_q", [
    (3, 1), (7, 3), (32, 4), (64, 1),
    *(pytest.param(g, lq, marks=pytest.mark.full) for g, lq in [(5, 2), (6, 1), (16, 4)]),
])
def test_any_gqa_ratio(group, seqlen_q, generator):
    """Non-powers of two, and groups whose packed rows (L_q x group) fill one 64-row tile (64)
    or need several (128)."""
    case = DecodeCase(batch=2, seqlen_q=seqlen_q, seqlen_k=300, num_heads_kv=1, group=group, head_dim=64,
                      dtype=torch.float16, lengths=(300, 77), num_splits=3, causal=seqlen_q > 1)
    q, k, v, seqlens = make_inputs(case, DEVICE, generator)
    out, lse = flashsplit.decode(q, k, v, cache_seqlens=seqlens, causal=case.causal, num_splits=3, return_lse=True)
    check_against_reference(out, lse, q, k, v, seqlens, case.causal)


def _paged_inputs():
    q = torch.randn(2, 1, 8, 64, device=DEVICE).half()
    pages = torch.randn(10, 16, 2, 64, device=DEVICE).half()
    table = torch.arange(8, dtype=torch.int32, device=DEVICE).reshape(2, 4)
    return q, pages, table


@pytest.mark.parametrize("mutate, exc, match", [
    (lambda q, p, t: dict(block_table=t.long()), TypeError, "block_table: expected dtype int32"),
    (lambda q, p, t: dict(block_table=t[0]), ValueError, r"block_table: expected shape \[2, max_pages_per_row\]"),
    (lambda q, p, t: dict(block_table=t.to("meta")), ValueError, "block_table: expected q's device"),
    (lambda q, p, t: dict(block_table=t, page_table=t), ValueError, "page_table: an alias"),
    (lambda q, p, t: dict(block_table=t, k_cache=p[:, :0], v_cache=p[:, :0]), ValueError, "page_size"),
    (lambda q, p, t: dict(block_table=t, k_cache=p[0], v_cache=p[0]), ValueError,
     r"k_cache: expected 4 dims \[num_pages, page_size"),
    (lambda q, p, t: dict(), ValueError, "pass block_table for a paged cache"),
    (lambda q, p, t: dict(block_table=t, k_cache=p.to(torch.float8_e4m3fn), v_cache=p.to(torch.float8_e4m3fn)),
     ValueError, "k_descale: required for an fp8 cache"),
    (lambda q, p, t: dict(block_table=t, k_cache=p.to(torch.float8_e4m3fn), v_cache=p.to(torch.float8_e4m3fn),
                          k_descale=torch.ones(3, device=DEVICE), v_descale=torch.ones(1, device=DEVICE)),
     ValueError, r"k_descale: expected a scalar tensor or shape \[2, 2\]"),
    (lambda q, p, t: dict(block_table=t, k_cache=p.to(torch.float8_e4m3fn), v_cache=p.to(torch.float8_e4m3fn),
                          k_descale=torch.ones(1, device=DEVICE, dtype=torch.float64), v_descale=torch.ones(1)),
     TypeError, "k_descale: expected dtype float32"),
    (lambda q, p, t: dict(block_table=t, k_descale=torch.ones(1, device=DEVICE)), ValueError,
     "k_descale: only meaningful for an fp8 cache"),
    (lambda q, p, t: dict(block_table=t, q=q.to(torch.float8_e4m3fn)), TypeError, "q: expected dtype float16"),
    (lambda q, p, t: dict(block_table=t, v_cache=p.to(torch.float8_e5m2)), TypeError, "k_cache/v_cache: expected one dtype"),
])
def test_cache_format_errors(mutate, exc, match):
    q, pages, table = _paged_inputs()
    kwargs = dict(q=q, k_cache=pages, v_cache=pages)
    kwargs.update(mutate(q, pages, table))
    with pytest.raises(exc, match=match):
        flashsplit.decode(kwargs.pop("q"), kwargs.pop("k_cache"), kwargs.pop("v_cache"), **kwargs)


def test_check_inputs_finds_what_decode_cannot():
    q, pages, table = _paged_inputs()
    seqlens = torch.tensor([64, 20], dtype=torch.int32, device=DEVICE)
    flashsplit.check_inputs(q, pages, pages, block_table=table, cache_seqlens=seqlens)  # all fine
    bad = table.clone()
    bad[1, 1] = 10  # row 1 uses 2 pages (20 keys); its second is out of range
    with pytest.raises(ValueError, match=r"block_table: row 1 entry 1 is page 10, outside \[0, 10\)"):
        flashsplit.check_inputs(q, pages, pages, block_table=bad, cache_seqlens=seqlens)
    bad[1, 2] = -5  # past row 1's pages: never read, not an error
    bad[1, 1] = 3
    flashsplit.check_inputs(q, pages, pages, block_table=bad, cache_seqlens=seqlens)
    with pytest.raises(ValueError, match=r"cache_seqlens: row 0 has 65 keys, outside \[0, 64\]"):
        flashsplit.check_inputs(q, pages, pages, block_table=table,
                                cache_seqlens=torch.tensor([65, 1], dtype=torch.int32, device=DEVICE))
    k8 = pages.to(torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="k_descale: expected finite positive"):
        flashsplit.check_inputs(q, k8, k8, block_table=table, k_descale=torch.zeros(1, device=DEVICE),
                                v_descale=torch.ones(1, device=DEVICE))


def test_out_of_range_values_never_leave_the_cache(generator):
    """Values decode cannot check without a host sync: lengths past the capacity or negative are
    clamped to [0, capacity]; page ids outside the cache are clamped into it (a wrong page,
    never an illegal access). check_inputs reports both."""
    case = DecodeCase(batch=3, seqlen_q=1, seqlen_k=200, num_heads_kv=2, group=4, head_dim=64,
                      dtype=torch.float16, lengths=(200, 150, 10), nan_tail=False)
    q, k, v, _ = make_inputs(case, DEVICE, generator)
    wild = torch.tensor([10**6, -5, 200], dtype=torch.int32, device=DEVICE)
    clamped = torch.tensor([200, 0, 200], dtype=torch.int32, device=DEVICE)
    for num_splits in (1, 3):
        got = flashsplit.decode(q, k, v, cache_seqlens=wild, num_splits=num_splits)
        want = flashsplit.decode(q, k, v, cache_seqlens=clamped, num_splits=num_splits)
        assert torch.equal(got, want)
    k_pages, v_pages, table, _, _ = to_paged(k, v, [200, 200, 200], 16, generator, share_first_page=False)
    table[0, 3] = 10**6
    table[2, 0] = -3
    out = flashsplit.decode(q, k_pages, v_pages, block_table=table, cache_seqlens=clamped, num_splits=3)
    assert out.shape == q.shape
    with pytest.raises(ValueError, match="block_table: row 0 entry 3 is page 1000000"):
        flashsplit.check_inputs(q, k_pages, v_pages, block_table=table, cache_seqlens=clamped)


@pytest.mark.parametrize("seqlen_q, group, window, causal, pairs", [
    (1, 4, (-1, -1), False, True),  # the decode step: 4 packed rows, a 16-row tile
    (1, 4, (100, -1), False, False),  # a window's left bound
    (4, 4, (-1, -1), True, False),  # causal with several queries (and a 16-row tile)
    (8, 4, (-1, -1), False, False),  # 32 packed rows
])
def test_fp8_v_pairs_only_on_unmasked_16_row_tiles(seqlen_q, group, window, causal, pairs, generator, monkeypatch):
    """The split kernel gets V as int16 pairs only for 16-row tiles whose scores take no window or
    causal mask (``_pairs_for_tile``); every launch still matches the reference."""
    from flashsplit.triton import backend as triton_backend

    seen = []
    real_launch = triton_backend.launch

    def spy(kernel, grid, tensors, tail, options):
        if kernel is triton_backend.split_kv_kernel:
            seen.append(tensors[2].dtype)
        return real_launch(kernel, grid, tensors, tail, options)

    monkeypatch.setattr(triton_backend, "launch", spy)
    case = DecodeCase(batch=2, seqlen_q=seqlen_q, seqlen_k=300, num_heads_kv=1, group=group, head_dim=64,
                      dtype=torch.float16, lengths=(300, 77))
    q, k, v, seqlens = make_inputs(case, DEVICE, generator)
    k8, k_descale = quantize_fp8(k, torch.float8_e5m2, True)
    v8, v_descale = quantize_fp8(v, torch.float8_e5m2, True)
    out, lse = flashsplit.decode(q, k8, v8, cache_seqlens=seqlens, k_descale=k_descale, v_descale=v_descale,
                                 window_size=window, causal=causal, num_splits=2, return_lse=True, backend="triton")
    assert seen == [torch.int16 if pairs else torch.float8_e5m2]
    check_against_reference(out, lse, q, dequantize(k8, k_descale), dequantize(v8, v_descale), seqlens, causal,
                            window_size=window)
