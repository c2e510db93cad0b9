"""Bad input to decode: each a clear TypeError/ValueError naming the argument."""

import pytest
import torch

import flashsplit
from flashsplit import dispatch
from flashsplit.call import DecodeTensors
from flashsplit.api import decode_into
from flashsplit.testing import check_against_reference, to_paged

from conftest import DEVICE, torch_notice_silenced


def _good(batch=2, seqlen_q=1, num_heads=8, num_heads_kv=2, seqlen_k=64, head_dim=64, dtype=torch.float16):
    q = torch.randn(batch, seqlen_q, num_heads, head_dim).to(dtype)
    k = torch.randn(batch, seqlen_k, num_heads_kv, head_dim).to(dtype)
    v = torch.randn(batch, seqlen_k, num_heads_kv, head_dim).to(dtype)
    return q, k, v


def _call(q=None, k=None, v=None, **kwargs):
    gq, gk, gv = _good()
    return flashsplit.decode(gq if q is None else q, gk if k is None else k, gv if v is None else v, **kwargs)


Q, K, V = _good()
CASES = [
    # (description, kwargs for _call, exception, message fragment)
    ("q rank", dict(q=Q[0]), ValueError, "q: expected 4 dims"),
    ("k rank", dict(k=K[..., None]), ValueError, "k_cache: expected 4 dims"),
    ("q not a tensor", dict(q=[1, 2]), TypeError, "q: expected a torch.Tensor"),
    ("head dim mismatch", dict(k=torch.randn(2, 64, 2, 32).half(), v=torch.randn(2, 64, 2, 32).half()),
     ValueError, "expected head_dim 64"),
    ("k/v shape mismatch", dict(v=torch.randn(2, 64, 1, 64).half()), ValueError, "k_cache and v_cache"),
    ("heads not a multiple", dict(k=torch.randn(2, 64, 3, 64).half(), v=torch.randn(2, 64, 3, 64).half()),
     ValueError, "multiple of num_heads_kv"),
    ("batch mismatch", dict(k=torch.randn(3, 64, 2, 64).half(), v=torch.randn(3, 64, 2, 64).half()),
     ValueError, "k_cache: expected batch 2"),
    ("dtype mismatch", dict(k=K.bfloat16(), v=V.bfloat16()), TypeError, "k_cache/v_cache: expected q's dtype"),
    ("fp32 q", dict(q=Q.float(), k=K.float(), v=V.float()), TypeError, "q: expected dtype float16 or bfloat16"),
    ("head dim not /8", dict(q=torch.randn(2, 1, 8, 20).half(), k=torch.randn(2, 64, 2, 20).half(),
                             v=torch.randn(2, 64, 2, 20).half()), ValueError, "multiple of 8"),
    ("head dim > 256", dict(q=torch.randn(2, 1, 8, 264).half(), k=torch.randn(2, 8, 2, 264).half(),
                            v=torch.randn(2, 8, 2, 264).half()), ValueError, "multiple of 8 in"),
    ("last dim strided", dict(k=torch.randn(2, 64, 2, 128).half()[..., ::2]), ValueError,
     "k_cache: the last dim must be contiguous"),
    ("seqlens dtype", dict(cache_seqlens=torch.tensor([3, 4])), TypeError, "cache_seqlens: expected dtype int32"),
    ("seqlens shape", dict(cache_seqlens=torch.tensor([3, 4, 5], dtype=torch.int32)), ValueError,
     r"cache_seqlens: expected shape \[2\]"),
    ("seqlens not a tensor", dict(cache_seqlens=[3, 4]), TypeError, "cache_seqlens: expected a torch.Tensor"),
    ("num_splits < 0", dict(num_splits=-1), ValueError, "num_splits: expected 0"),
    ("num_splits > 256", dict(num_splits=257), ValueError, "num_splits: expected 0"),
    ("num_splits float", dict(num_splits=2.0), TypeError, "num_splits: expected an int"),
    ("out shape", dict(out=torch.empty(2, 1, 8, 32).half()), ValueError, "out: expected q's shape"),
    ("out dtype", dict(out=torch.empty(2, 1, 8, 64)), TypeError, "out: expected q's dtype"),
    ("unknown backend", dict(backend="cuda-magic"), ValueError, r"backend: expected 'auto' or one of \["),
    ("causal not bool", dict(causal=1), TypeError, "causal: expected a bool"),
    ("bad softmax_scale", dict(softmax_scale="x"), TypeError, "softmax_scale: expected a finite float"),
    ("unhashable softmax_scale", dict(softmax_scale=[0.1]), TypeError, "softmax_scale: expected a finite float"),
    ("return_lse not bool", dict(return_lse=None), TypeError, "return_lse: expected a bool"),
]


@pytest.mark.parametrize("what, kwargs, exc, match", CASES, ids=[c[0] for c in CASES])
def test_bad_input_raises_clear_error(what, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        _call(**kwargs)


def test_zero_query_length_is_rejected():
    q = torch.randn(2, 0, 8, 64).half()
    with pytest.raises(ValueError, match="seqlen_q >= 1"):
        _call(q=q)


@pytest.mark.gpu
def test_tensors_on_different_devices():
    q, k, v = _good()
    with pytest.raises(ValueError, match="k_cache: expected q's device"):
        flashsplit.decode(q.cuda(), k, v.cuda())
    with pytest.raises(ValueError, match="cache_seqlens: expected q's device"):
        flashsplit.decode(q.cuda(), k.cuda(), v.cuda(), cache_seqlens=torch.tensor([1, 2], dtype=torch.int32))


def test_device_mismatch_on_meta():
    """The device check without a GPU: a 'meta' cache beside CPU tensors."""
    q, k, v = _good()
    with pytest.raises(ValueError, match="v_cache: expected q's device"):
        flashsplit.decode(q, k, v.to("meta"))


@pytest.mark.parametrize("q", [[1, 2], torch.randn(2, 8, 64)])
def test_bad_q_with_return_lse(q):
    """Outputs are allocated from q before validation; a bad q must still get the clear error."""
    _, k, v = _good()
    with pytest.raises((TypeError, ValueError), match="q: expected"):
        flashsplit.decode(q, k, v, return_lse=True)


# -- Layouts the kernels cannot index, refused at the public boundary -------------------------

def _lengths(*values):
    return torch.tensor(values, dtype=torch.int32, device=DEVICE)


def _poisoned_dense(generator, batch=2, seqlen_k=64, lengths=(10, 40), num_heads_kv=2, group=4, head_dim=64):
    q = torch.randn(batch, 1, num_heads_kv * group, head_dim, generator=generator).half()
    k = torch.randn(batch, seqlen_k, num_heads_kv, head_dim, generator=generator).half()
    v = torch.randn(batch, seqlen_k, num_heads_kv, head_dim, generator=generator).half()
    for b, n in enumerate(lengths):  # slots no row may read
        k[b, n:] = float("nan")
        v[b, n:] = float("nan")
    return q.to(DEVICE), k.to(DEVICE), v.to(DEVICE)


def test_noncontiguous_cache_seqlens_is_refused(generator):
    """A [B] view of stride 2 (a column of a [B, 2] table): the kernels read ``SEQLENS + b``."""
    q, k, v = _poisoned_dense(generator)
    table = _lengths(10, 0, 40, 0).view(2, 2)
    with pytest.raises(ValueError, match=r"cache_seqlens: expected a contiguous \[2\] tensor \(stride 1\), "
                                         r"got strides \(2,\); cache_seqlens.contiguous\(\) fixes it"):
        flashsplit.decode(q, k, v, cache_seqlens=table[:, 0])
    with pytest.raises(ValueError, match="cache_seqlens: expected a contiguous"):
        flashsplit.decode(q, k, v, cache_seqlens=_lengths(10).expand(2))  # stride 0
    out = flashsplit.decode(q, k, v, cache_seqlens=table[:, 0].contiguous())
    check_against_reference(out, None, q, k, v, _lengths(10, 40))


def test_cache_seqlens_of_one_row_may_have_any_stride(generator):
    q, k, v = _poisoned_dense(generator, batch=1, lengths=(25,))
    view = _lengths(25, 10**6).view(1, 2)[:, 0]
    assert view.stride() == (2,)
    out = flashsplit.decode(q, k, v, cache_seqlens=view, num_splits=3)
    check_against_reference(out, None, q, k, v, _lengths(25))


def test_strided_block_table_rows_and_descale_views_are_honoured(generator):
    """Both kernels take a block table's row stride and both strides of ``[B, H_kv]`` descales:
    a table sliced out of a wider one, descales that are a transposed view, an expanded view
    and a strided slice give the reference's answer."""
    from flashsplit.reference import dequantize

    q, k, v = _poisoned_dense(generator, batch=3, seqlen_k=48, lengths=(48, 17, 0))
    k8, v8 = k.to(torch.float8_e4m3fn), v.to(torch.float8_e4m3fn)
    k_pages, v_pages, table, k8, v8 = to_paged(k8, v8, [48, 17, 0], 16, generator)
    wide = torch.full((3, table.shape[1] + 5), -7, dtype=torch.int32, device=DEVICE)
    wide[:, :table.shape[1]] = table
    strided_table = wide[:, :table.shape[1]]
    assert strided_table.stride() == (table.shape[1] + 5, 1)
    per_head = torch.rand(3, 2, generator=generator).to(DEVICE) + 0.5
    layouts = {
        "transposed": per_head.t().contiguous().t(),
        "expanded": per_head[:, :1].expand(3, 2),
        "strided": torch.stack([per_head, torch.full_like(per_head, float("nan"))], dim=-1)[..., 0],
    }
    for name, k_descale in layouts.items():
        v_descale = layouts["transposed"]
        assert k_descale.stride() != (2, 1), name
        out, lse = flashsplit.decode(q, k_pages, v_pages, block_table=strided_table, cache_seqlens=_lengths(48, 17, 0),
                                     k_descale=k_descale, v_descale=v_descale, num_splits=2, return_lse=True)
        check_against_reference(out, lse, q, dequantize(k8, k_descale), dequantize(v8, v_descale), _lengths(48, 17, 0),
                                what=f"descale {name}")


def test_block_table_with_strided_columns_is_refused():
    q, k, v = _good()
    pages = torch.randn(4, 16, 2, 64).half()
    table = torch.zeros(4, 2, dtype=torch.int32).t()  # [2, 4], strides (1, 2)
    with pytest.raises(ValueError, match=r"block_table: the last dim must be contiguous, got strides \(1, 2\); "
                                         r"block_table.contiguous\(\) fixes it"):
        flashsplit.decode(q, pages, pages, block_table=table)


@pytest.mark.parametrize("lse, exc, match", [
    (torch.empty(2, 1, 8).transpose(1, 2), ValueError,
     r"lse: expected a contiguous tensor \(strides \(8, 1, 1\)\), got strides \(8, 1, 8\)"),
    (torch.empty(2, 8, 2)[..., :1], ValueError, "lse: expected a contiguous tensor"),
    (torch.empty(1, 1, 1).expand(2, 8, 1), ValueError, "lse: expected a contiguous tensor"),
    (torch.empty(2, 8, 1, dtype=torch.float64), TypeError, "lse: expected dtype float32"),
    (torch.empty(2, 8), ValueError, r"lse: expected shape \[2, 8, 1\]"),
    ([0.0], TypeError, "lse: expected a torch.Tensor"),
])
def test_lse_output_layouts(lse, exc, match):
    """A caller's lse: the cute kernels write it at compact strides, so any other is refused."""
    q, k, v = _good()
    with pytest.raises(exc, match=match):
        decode_into(q, k, v, torch.empty_like(q), lse)


SHARED_ELEMENTS = {
    "expanded heads": lambda dt: torch.empty(2, 1, 1, 64, dtype=dt).expand(2, 1, 8, 64),  # 8 heads, one row
    "expanded rows": lambda dt: torch.empty(1, 1, 8, 64, dtype=dt).expand(2, 1, 8, 64),
    "overlapping heads": lambda dt: torch.empty(2, 1, 8, 80, dtype=dt).as_strided((2, 1, 8, 64), (640, 640, 8, 1)),
}


@pytest.mark.parametrize("make", SHARED_ELEMENTS.values(), ids=SHARED_ELEMENTS.keys())
def test_out_whose_elements_share_memory_is_refused(make):
    with pytest.raises(ValueError, match="out: elements may share memory"):
        _call(out=make(torch.float16))
    with pytest.raises(ValueError, match="out: elements may share memory"):
        flashsplit.combine(torch.randn(2, 2, 1, 8, 64), torch.randn(2, 2, 8, 1), out=make(torch.float32))


# -- Paged caches without pages ---------------------------------------------------------------

def test_paged_cache_without_pages_is_refused():
    """A page-id clamp into [0, num_pages - 1] has no page to clamp to: refused as a shape fact."""
    q = torch.randn(1, 1, 8, 128).half()
    empty = torch.empty(0, 16, 8, 128).half()
    with pytest.raises(ValueError, match=r"k_cache: expected at least one page \(dim 0\) for a block_table of 4 "
                                         r"pages per row, got a cache of shape \[0, 16, 8, 128\]"):
        flashsplit.decode(q, empty, empty, block_table=torch.zeros(1, 4, dtype=torch.int32),
                          cache_seqlens=_lengths(5))
    with pytest.raises(ValueError, match="k_cache: expected at least one page"):
        flashsplit.check_inputs(q, empty, empty, block_table=torch.zeros(1, 4, dtype=torch.int32))


@pytest.mark.parametrize("num_pages", [0, 3])
@pytest.mark.parametrize("seqlens", [None, (5, 0)])
def test_block_table_of_no_columns_gives_empty_rows(num_pages, seqlens):
    """Capacity 0 (a table of 0 columns): every row is empty, O = 0 and LSE = -inf, as for a
    dense cache of no slots; lengths past that capacity are clamped to it."""
    q = torch.randn(2, 3, 8, 64, device=DEVICE).half()
    pages = torch.full((num_pages, 16, 2, 64), float("nan"), device=DEVICE).half()
    seqlens = None if seqlens is None else _lengths(*seqlens)
    out = torch.full_like(q, float("nan"))
    result, lse = flashsplit.decode(q, pages, pages, block_table=torch.empty(2, 0, dtype=torch.int32, device=DEVICE),
                                    cache_seqlens=seqlens, out=out, return_lse=True, causal=True)
    assert result is out
    assert torch.equal(out, torch.zeros_like(out)) and torch.isneginf(lse).all()


# -- combine validates like decode ------------------------------------------------------------

def _partials(num_splits=3, batch=2, seqlen_q=2, num_heads=4, head_dim=32):
    return (torch.randn(num_splits, batch, seqlen_q, num_heads, head_dim),
            torch.randn(num_splits, batch, num_heads, seqlen_q))


def _csr(t):
    with torch_notice_silenced("Sparse CSR tensor support is in beta state"):
        return t.to_sparse_csr()


COMBINE_CASES = [
    ("out not a tensor", dict(out=[0.0]), TypeError, "out: expected a torch.Tensor, got list"),
    ("out last dim strided", dict(out=torch.zeros(2, 2, 4, 64)[..., ::2]), ValueError,
     r"out: the last dim must be contiguous \(stride 1\), got strides \(512, 256, 64, 2\)"),
    ("out int", dict(out=torch.zeros(2, 2, 4, 32, dtype=torch.int32)), TypeError,
     "out: expected dtype float16, bfloat16 or float32, got torch.int32"),
    ("out fp8", dict(out=torch.zeros(2, 2, 4, 32).to(torch.float8_e4m3fn)), TypeError, "out: expected dtype float16"),
    ("out float64", dict(out=torch.zeros(2, 2, 4, 32, dtype=torch.float64)), TypeError, "out: expected dtype"),
    ("out sparse", dict(out=torch.zeros(2, 2, 4, 32).to_sparse()), TypeError,
     "out: expected a dense \\(strided\\) torch.Tensor, got a sparse_coo tensor"),
    ("out shape", dict(out=torch.zeros(2, 2, 4, 16)), ValueError, r"out: expected shape \[2, 2, 4, 32\]"),
    ("out device", dict(out=torch.zeros(2, 2, 4, 32, device="meta")), ValueError, "out: expected out_partial's device"),
    ("out_dtype int64", dict(out_dtype=torch.int64), TypeError,
     "out_dtype: expected float16, bfloat16 or float32, got torch.int64"),
    ("out_dtype fp8", dict(out_dtype=torch.float8_e5m2), TypeError, "out_dtype: expected float16"),
    ("out_dtype a str", dict(out_dtype="float16"), TypeError,
     "out_dtype: expected float16, bfloat16 or float32, got a str"),
    ("out_dtype disagrees", dict(out=torch.zeros(2, 2, 4, 32), out_dtype=torch.float16), TypeError,
     "out_dtype: torch.float16 disagrees with out's dtype torch.float32"),
    ("out_partial sparse", dict(out_partial=torch.randn(3, 2, 2, 4, 32).to_sparse()), TypeError,
     "out_partial: expected a dense"),
    ("out_partial last dim strided", dict(out_partial=torch.randn(3, 2, 2, 4, 64)[..., ::2]), ValueError,
     "out_partial: the last dim must be contiguous"),
    ("out_partial head_dim > 256", dict(out_partial=torch.randn(3, 2, 2, 4, 264), out=None), ValueError,
     r"out_partial: expected head_dim \(dim 4\) <= 256"),
    ("out_partial no splits", dict(out_partial=torch.randn(0, 2, 2, 4, 32), lse_partial=torch.randn(0, 2, 4, 2)),
     ValueError, "out_partial: expected 1..256 splits"),
    ("lse_partial csr", dict(lse_partial=_csr(torch.randn(6, 8))), TypeError,
     "lse_partial: expected a dense"),
    ("lse_partial last dim strided", dict(lse_partial=torch.randn(3, 2, 4, 4)[..., ::2]), ValueError,
     "lse_partial: the last dim must be contiguous"),
    ("lse_partial device", dict(lse_partial=torch.randn(3, 2, 4, 2, device="meta")), ValueError,
     "lse_partial: expected out_partial's device"),
    ("lse_partial fp16", dict(lse_partial=torch.randn(3, 2, 4, 2).half()), TypeError,
     "lse_partial: expected dtype float32"),
    ("backend", dict(backend=None), TypeError, "backend: expected a str"),
]


@pytest.mark.parametrize("what, kwargs, exc, match", COMBINE_CASES, ids=[c[0] for c in COMBINE_CASES])
def test_combine_rejects_bad_arguments(what, kwargs, exc, match):
    out_p, lse_p = _partials()
    args = dict(out_partial=out_p, lse_partial=lse_p) | kwargs
    with pytest.raises(exc, match=match):
        flashsplit.combine(args.pop("out_partial"), args.pop("lse_partial"), **args)


@pytest.mark.parametrize("out_dtype", [torch.float16, torch.float32])
def test_combine_honours_partial_strides(out_dtype, generator):
    """The partials may be any views with a contiguous last dim (both kernels take the other
    strides): head-major partials, padded storage, and an out of padded rows."""
    from flashsplit.reference import combine_ref

    out_p = torch.randn(3, 2, 4, 2, 40, generator=generator).to(DEVICE)[..., 4:36].transpose(2, 3)  # [S, B, L_q, H, D]
    lse_p = torch.randn(3, 2, 4, 5, generator=generator).to(DEVICE)[..., 1:3]  # [S, B, H, L_q]
    lse_p[1, 0, 2] = float("-inf")
    out_p[1, 0, :, 2] = float("nan")  # an empty split's O is never read
    out = torch.full((2, 2, 4, 48), float("nan"), dtype=out_dtype, device=DEVICE)
    result, lse = flashsplit.combine(out_p, lse_p, out=out[..., 8:40])
    ref, ref_lse = combine_ref(out_p, lse_p)
    torch.testing.assert_close(result.double(), ref, atol=2e-3, rtol=2e-3)
    torch.testing.assert_close(lse, ref_lse)
    assert torch.isnan(out[..., :8]).all() and torch.isnan(out[..., 40:]).all()  # nothing past the view written


# -- Sparse, nested and negated tensors, and the cached fast path -----------------------------

def _nested(t):
    with torch_notice_silenced("The PyTorch API of nested tensors is in prototype stage"):
        return torch.nested.nested_tensor([t[0], t[1]])


def _negated(t):
    """``t``'s values as a negated view (``is_neg()``: its memory holds ``-t``) of t's shape,
    strides and alignment, which only the private ``torch._neg_view`` makes."""
    view = torch._neg_view(-t)
    assert view.is_neg() and torch.equal(view, t) and view.stride() == t.stride()
    return view


def _imag_of_conj(t):
    """A negated view as public ops make it: the imaginary part of a conjugated complex tensor
    (strides twice t's), and a plain view of the same facts."""
    with torch_notice_silenced("ComplexHalf support is experimental"):  # z only carries the negation
        z = torch.complex(torch.zeros_like(t), -t)
    view, twin = z.conj().imag, torch.view_as_real(z)[..., 1]
    assert view.is_neg() and torch.equal(view, t) and not twin.is_neg()
    assert (view.stride(), view.data_ptr()) == (twin.stride(), twin.data_ptr())
    return view, twin


ODD_TENSORS = [
    ("q sparse", lambda q, k, sl: dict(q=q.to_sparse()), TypeError, "q: expected a dense"),
    ("q nested", lambda q, k, sl: dict(q=_nested(q)), TypeError, "q: expected a dense .* got a nested tensor"),
    ("q negated", lambda q, k, sl: dict(q=_imag_of_conj(q)[0]), ValueError,
     r"q: a negated view .* q.resolve_neg\(\)"),
    ("k_cache sparse", lambda q, k, sl: dict(k=k.to_sparse()), TypeError, "k_cache: expected a dense"),
    ("v_cache negated", lambda q, k, sl: dict(v=_imag_of_conj(k)[0]), ValueError,
     "v_cache: a negated view"),
    ("cache_seqlens sparse", lambda q, k, sl: dict(cache_seqlens=sl.to_sparse()), TypeError,
     "cache_seqlens: expected a dense .* got a sparse_coo tensor"),
    ("cache_seqlens jagged", lambda q, k, sl: dict(
        cache_seqlens=torch.nested.nested_tensor([sl, sl], layout=torch.jagged)), TypeError, "cache_seqlens: expected"),
    ("out sparse", lambda q, k, sl: dict(out=q.to_sparse()), TypeError, "out: expected a dense"),
    ("out negated", lambda q, k, sl: dict(out=_negated(q)), ValueError, "out: a negated view"),
    ("block_table sparse", lambda q, k, sl: dict(block_table=torch.zeros(2, 4, dtype=torch.int32).to_sparse()),
     TypeError, "block_table: expected a dense"),
]


@pytest.mark.parametrize("what, mutate, exc, match", ODD_TENSORS, ids=[c[0] for c in ODD_TENSORS])
def test_odd_tensors_are_refused(what, mutate, exc, match, generator):
    """Sparse, nested and negated tensors hold no strided memory of their values: refused at
    the boundary (decode and check_inputs), also after a valid call was validated and cached."""
    dispatch._PREPARED.clear()
    q, k, v = _poisoned_dense(generator, lengths=(64, 64))
    lens = _lengths(64, 30)
    kwargs = dict(q=q, k=k, v=v, cache_seqlens=lens, out=torch.empty_like(q)) | mutate(q, k, lens)
    args = [kwargs.pop(n) for n in ("q", "k", "v")]
    with pytest.raises(exc, match=match):
        flashsplit.decode(*args, **kwargs)
    if "block_table" not in kwargs:
        with pytest.raises(exc, match=match):
            flashsplit.check_inputs(*args, **kwargs)
    if "negated" not in what:  # (a view of another stride: another call signature anyway)
        flashsplit.decode(q, k, v, cache_seqlens=lens, out=torch.empty_like(q))  # validated and cached
        with pytest.raises(exc, match=match):
            flashsplit.decode(*args, **kwargs)


def test_negated_descale_is_refused_on_every_call(generator):
    """A [B, H_kv] descale may have any strides, so a public negated view has the call
    signature of a valid one: the cached fast path tells them apart."""
    q, k, v = _poisoned_dense(generator, lengths=(64, 64))
    k8 = k.to(torch.float8_e4m3fn)
    negated, twin = _imag_of_conj(torch.rand(2, 2, generator=generator).to(DEVICE) + 0.5)
    one = torch.ones(1, device=DEVICE)
    flashsplit.decode(q, k8, k8, k_descale=twin, v_descale=one)  # validated and cached
    for _ in range(2):
        with pytest.raises(ValueError, match="k_descale: a negated view"):
            flashsplit.decode(q, k8, k8, k_descale=negated, v_descale=one)


# -- softmax_scale ----------------------------------------------------------------------------

@pytest.mark.parametrize("scale, match", [
    (float("nan"), "softmax_scale: expected a finite float, got nan"),
    (float("inf"), "softmax_scale: expected a finite float, got inf"),
    (-float("inf"), "softmax_scale: expected a finite float"),
    (1e37, r"softmax_scale: expected \|softmax_scale\| <= 2\*\*64 \(fp32 scores must not overflow\), got 1e\+37"),
    (3e38, r"\|softmax_scale\| <= 2\*\*64"),
    (1e100, r"\|softmax_scale\| <= 2\*\*64"),
    (-1e20, r"\|softmax_scale\| <= 2\*\*64"),
    (2 ** 64 + 1, r"got an int of 65 bits"),
    (10 ** 400, r"got an int of 1329 bits"),
])
def test_softmax_scale_out_of_range_is_refused(scale, match):
    with pytest.raises(ValueError, match=match):
        _call(softmax_scale=scale)
    with pytest.raises(ValueError, match=match):
        flashsplit.check_inputs(*_good(), softmax_scale=scale)


@pytest.mark.parametrize("scale", [0.0, -0.3, 0, -1])
def test_zero_and_negative_softmax_scales_are_attention(scale, generator):
    q, k, v = _poisoned_dense(generator, lengths=(64, 23))
    lens = _lengths(64, 23)
    out, lse = flashsplit.decode(q, k, v, cache_seqlens=lens, softmax_scale=scale, num_splits=3, return_lse=True)
    check_against_reference(out, lse, q, k, v, lens, softmax_scale=scale)


@pytest.mark.parametrize("sign", [1, -1])
def test_largest_softmax_scale_gives_the_one_hot_softmax(sign, generator):
    """|scale| = 2^64: the softmax is one-hot on the key of the largest (smallest, for a negative
    scale) q.k; small integers keep q.k exact in fp16 and fp32, so the answer is V's row exactly."""
    q = torch.randint(-3, 4, (2, 1, 4, 16), generator=generator).half().to(DEVICE)
    k = torch.randint(-3, 4, (2, 40, 1, 16), generator=generator).half().to(DEVICE)
    v = torch.randn(2, 40, 1, 16, generator=generator).half().to(DEVICE)
    lens = _lengths(40, 17)
    k[1, 17:], v[1, 17:] = float("nan"), float("nan")
    out, lse = flashsplit.decode(q, k, v, cache_seqlens=lens, softmax_scale=sign * 2.0 ** 64, num_splits=2,
                                 return_lse=True)
    for b, n in enumerate((40, 17)):
        scores = sign * torch.einsum("hd,jd->hj", q[b, 0].float(), k[b, :n, 0].float())
        best = scores.max(dim=1)
        ties = (scores == best.values[:, None]).sum(dim=1)
        expected = torch.stack([v[b, :n, 0][scores[h] == best.values[h]].float().mean(0) for h in range(4)])
        torch.testing.assert_close(out[b, 0].float(), expected, atol=2e-3, rtol=2e-3)
        torch.testing.assert_close(lse[b, :, 0].double(), best.values.double() * 2.0 ** 64 + ties.double().log(),
                                   rtol=1e-6, atol=0)


def test_check_inputs_bounds_the_fp8_score_scale():
    q, k, v = _good()
    k8 = k.to(torch.float8_e4m3fn)
    big = torch.full((1,), 2.0 ** 60)
    flashsplit.check_inputs(q, k8, k8, k_descale=big, v_descale=torch.ones(1), softmax_scale=1.0)
    with pytest.raises(ValueError, match=r"k_descale: \|softmax_scale\| \* k_descale reaches 1.15e\+20"):
        flashsplit.check_inputs(q, k8, k8, k_descale=big, v_descale=torch.ones(1), softmax_scale=100.0)


# -- plan -------------------------------------------------------------------------------------

PLAN_CASES = [
    ("batch a str", dict(batch="2"), TypeError, "batch: expected an int, got str"),
    ("batch a float", dict(batch=2.0), TypeError, "batch: expected an int"),
    ("batch a bool", dict(batch=True), TypeError, "batch: expected an int"),
    ("heads 0", dict(num_heads_kv=0), ValueError, "num_heads_kv: expected a positive int"),
    ("head_dim not /8", dict(head_dim=20), ValueError, r"head_dim: expected a multiple of 8 in \[8, 256\]"),
    ("head_dim > 256", dict(head_dim=264), ValueError, "head_dim: expected a multiple of 8"),
    ("seqlen_q 0", dict(seqlen_q=0), ValueError, "seqlen_q: expected a positive int"),
    ("page_size < 0", dict(page_size=-16), ValueError, "page_size: expected a non-negative int"),
    ("capacity not in pages", dict(page_size=48), ValueError, r"seqlen_k: expected a multiple of page_size \(48\)"),
    ("dtype fp32", dict(dtype=torch.float32), TypeError, "dtype: expected torch.float16 or torch.bfloat16"),
    ("dtype a str", dict(dtype="bf16"), TypeError, "dtype: expected"),
    ("kv_dtype int8", dict(kv_dtype=torch.int8), TypeError, "kv_dtype: expected None"),
    ("causal an int", dict(causal=1), TypeError, "causal: expected a bool"),
    ("has_cache_seqlens None", dict(has_cache_seqlens=None), TypeError, "has_cache_seqlens: expected a bool"),
    ("num_sms 0", dict(num_sms=0), ValueError, "num_sms: expected None or a positive int"),
    ("num_sms a float", dict(num_sms=1.5), TypeError, "num_sms: expected None or a positive int"),
    ("device unknown", dict(device="gpu7"), ValueError, "device: expected a device"),
    ("device an int list", dict(device=[0]), TypeError, "device: expected a str, torch.device or CUDA index"),
    ("num_splits", dict(num_splits=300), ValueError, "num_splits"),
    ("backend", dict(backend=3), TypeError, "backend: expected a str"),
]


@pytest.mark.parametrize("what, kwargs, exc, match", PLAN_CASES, ids=[c[0] for c in PLAN_CASES])
def test_plan_rejects_what_decode_would(what, kwargs, exc, match):
    args = dict(batch=1, seqlen_k=1024, num_heads=32, num_heads_kv=8, head_dim=128) | kwargs
    with pytest.raises(exc, match=match):
        flashsplit.plan(args.pop("batch"), args.pop("seqlen_k"), args.pop("num_heads"), args.pop("num_heads_kv"),
                        args.pop("head_dim"), **args)


def test_check_inputs_refuses_both_table_names():
    q, k, v = _good()
    table = torch.zeros(2, 1, dtype=torch.int32)
    with pytest.raises(ValueError, match="page_table: an alias of block_table"):
        flashsplit.check_inputs(q, k, v, block_table=table, page_table=table)


# -- The same on the GPU, with every backend -------------------------------------------------

def _backend_or_skip(backend, q, k, v, seqlens, block_table=None, k_descale=None, v_descale=None):
    from flashsplit.validation import check_decode_inputs
    from flashsplit.registry import get

    reason = get(backend).supports(check_decode_inputs(
        DecodeTensors(q, k, v, None, None, seqlens, block_table, k_descale, v_descale)))
    if reason is not None:
        pytest.skip(f"{backend}: {reason}")


@pytest.mark.gpu
@pytest.mark.parametrize("backend", flashsplit.backends())
def test_gpu_cache_seqlens_layouts(backend, generator):
    """32/8 heads, d 128, B = 2 x 512 keys, lengths [100, 300] (NaN past them): the strided
    column of a [B, 2] table is refused; its contiguous copy, and a strided [1] view for one
    row, give the reference's answer."""
    from flashsplit.testing import DecodeCase, make_inputs

    case = DecodeCase(batch=2, seqlen_q=1, seqlen_k=512, num_heads_kv=8, group=4, head_dim=128,
                      dtype=torch.bfloat16, lengths=(100, 300))
    q, k, v, seqlens = make_inputs(case, "cuda", generator)
    _backend_or_skip(backend, q, k, v, seqlens)
    table = torch.stack([seqlens, torch.zeros_like(seqlens)], dim=1)
    with pytest.raises(ValueError, match="cache_seqlens: expected a contiguous"):
        flashsplit.decode(q, k, v, cache_seqlens=table[:, 0], backend=backend)
    out, lse = flashsplit.decode(q, k, v, cache_seqlens=table[:, 0].contiguous(), return_lse=True, backend=backend)
    check_against_reference(out, lse, q, k, v, seqlens)
    one = table[1:, 0]
    assert one.stride() == (2,)
    out, lse = flashsplit.decode(q[1:], k[1:], v[1:], cache_seqlens=one, return_lse=True, backend=backend)
    check_against_reference(out, lse, q[1:], k[1:], v[1:], seqlens[1:])


@pytest.mark.gpu
@pytest.mark.parametrize("backend", flashsplit.backends())
def test_gpu_strided_block_table_rows_and_descale_views(backend, generator):
    from flashsplit.reference import dequantize
    from flashsplit.testing import DecodeCase, make_inputs, quantize_fp8

    case = DecodeCase(batch=3, seqlen_q=1, seqlen_k=1000, num_heads_kv=2, group=4, head_dim=128,
                      dtype=torch.bfloat16, lengths=(1000, 257, 0))
    q, k, v, seqlens = make_inputs(case, "cuda", generator)
    k8, k_descale = quantize_fp8(k, torch.float8_e4m3fn, per_head=True)
    v8, v_descale = quantize_fp8(v, torch.float8_e4m3fn, per_head=True)
    k_pages, v_pages, table, k8, v8 = to_paged(k8, v8, list(case.lengths), 64, generator)
    wide = torch.full((3, table.shape[1] + 3), 10**6, dtype=torch.int32, device="cuda")
    wide[:, :table.shape[1]] = table
    table = wide[:, :table.shape[1]]
    k_descale = k_descale.t().contiguous().t()  # [B, H_kv], strides (1, B)
    v_descale = torch.stack([v_descale, torch.full_like(v_descale, float("nan"))], dim=-1)[..., 0]
    _backend_or_skip(backend, q, k_pages, v_pages, seqlens, table, k_descale, v_descale)
    out, lse = flashsplit.decode(q, k_pages, v_pages, block_table=table, cache_seqlens=seqlens, k_descale=k_descale,
                                 v_descale=v_descale, return_lse=True, backend=backend)
    check_against_reference(out, lse, q, dequantize(k8, k_descale), dequantize(v8, v_descale), seqlens)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", flashsplit.backends())
def test_gpu_paged_cache_without_pages(backend, generator):
    """Refused before any kernel runs (the device stays usable); a table of 0 columns gives
    empty rows."""
    from flashsplit.testing import DecodeCase, make_inputs

    case = DecodeCase(batch=1, seqlen_q=1, seqlen_k=64, num_heads_kv=8, group=4, head_dim=128,
                      dtype=torch.bfloat16, lengths=(5,))
    q, k, v, seqlens = make_inputs(case, "cuda", generator)
    k_pages, v_pages, table, k, v = to_paged(k, v, [5], 16, generator)
    _backend_or_skip(backend, q, k_pages, v_pages, seqlens, table)
    empty = k_pages[:0]
    with pytest.raises(ValueError, match="k_cache: expected at least one page"):
        flashsplit.decode(q, empty, empty, block_table=table, cache_seqlens=seqlens, backend=backend)
    out, lse = flashsplit.decode(q, k_pages, v_pages, block_table=table, cache_seqlens=seqlens, return_lse=True,
                                 backend=backend)
    torch.cuda.synchronize()
    check_against_reference(out, lse, q, k, v, seqlens)
    out, lse = flashsplit.decode(q, empty, empty, block_table=table[:, :0], cache_seqlens=seqlens, return_lse=True,
                                 backend=backend)
    assert torch.equal(out, torch.zeros_like(out)) and torch.isneginf(lse).all()


BF16_ON_THE_CPU = r"^q: bfloat16 is not supported on the CPU .*float16 works on the CPU, bfloat16 needs a CUDA GPU"


def test_bfloat16_decode_on_the_cpu_is_refused(generator):
    """The Triton interpreter's bfloat16 tl.dot is wrong (a 256-key decode gave outputs of 8e8):
    decode, decode_into, flash_attn_with_kvcache and check_inputs refuse bfloat16 CPU tensors,
    with a 16-bit or an fp8 cache, naming q (validation, on any machine: no kernel runs)."""
    q, k, v = (t.bfloat16() for t in _good(seqlen_k=256))
    with pytest.raises(TypeError, match=BF16_ON_THE_CPU):
        flashsplit.decode(q, k, v)
    with pytest.raises(TypeError, match=BF16_ON_THE_CPU):
        flashsplit.decode(q, k.to(torch.float8_e4m3fn), v.to(torch.float8_e4m3fn), k_descale=torch.ones(1),
                          v_descale=torch.ones(1))
    with pytest.raises(TypeError, match=BF16_ON_THE_CPU):
        decode_into(q, k, v, torch.empty_like(q), None)
    with pytest.raises(TypeError, match=BF16_ON_THE_CPU):
        flashsplit.flash_attn_with_kvcache(q, k, v, k=k[:, :1], v=v[:, :1], cache_seqlens=3)
    with pytest.raises(TypeError, match=BF16_ON_THE_CPU):
        flashsplit.check_inputs(q, k, v)


@pytest.mark.cpu
def test_bfloat16_combine_on_the_cpu_rounds_to_nearest(generator):
    """combine into a bfloat16 output on the CPU (the interpreter truncates fp32 to bfloat16) gives
    the float32 combine rounded to nearest even, as a GPU's; with bfloat16 sinks too."""
    out_partial = torch.randn(3, 2, 2, 4, 64, generator=generator)
    lse_partial = torch.randn(3, 2, 4, 2, generator=generator)
    lse_partial[1, 0] = float("-inf")  # an empty split
    sinks = torch.randn(4, generator=generator).bfloat16()
    for kwargs in (dict(), dict(sinks=sinks)):
        exact, exact_lse = flashsplit.combine(out_partial, lse_partial, out_dtype=torch.float32, **kwargs)
        out, lse = flashsplit.combine(out_partial, lse_partial, out_dtype=torch.bfloat16, **kwargs)
        assert torch.equal(out, exact.bfloat16()) and torch.equal(lse, exact_lse), kwargs
        given = torch.full((2, 2, 4, 64), float("nan"), dtype=torch.bfloat16)
        flashsplit.combine(out_partial, lse_partial, out=given, **kwargs)
        assert torch.equal(given, exact.bfloat16()), kwargs
