"""Attention variants: sliding windows, softcap, sinks and batch-invariant decode.

Against the float64 reference written from the semantics (flashsplit.reference.attention_ref):
query i of a row of S keys sits at p = S - L_q + i and sees keys p - left .. p + right; softcap
caps scores as softcap * tanh(s / softcap) before the mask; a sink joins the denominator once.
Every backend that supports a problem runs it (on the CPU: Triton through the interpreter, fp16;
on a GPU: bf16 too). Cache slots no query may see hold NaN.
"""

import pytest
import torch
from conftest import DEVICE, HAS_CUDA

import flashsplit
from flashsplit.call import DecodeOptions, DecodeTensors
from flashsplit.plan import BATCH_INVARIANT_MIN_SPLIT, first_key, split_bounds
from flashsplit.validation import check_decode_inputs
from flashsplit.reference import combine_ref, dequantize
from flashsplit.registry import get
from flashsplit.testing import POISON, DecodeCase, check_against_reference, make_inputs, quantize_fp8, to_paged

DTYPES = [torch.float16, torch.bfloat16] if HAS_CUDA else [torch.float16]


def _backends(tensors, options):
    """The registered backends that support the problem (``cute`` only where it runs it)."""
    problem = check_decode_inputs(tensors, options)
    return [name for name in flashsplit.backends() if get(name).supports(problem) is None]


def _hide_unseen(k, v, seqlens, seqlen_q, window_left):
    """NaN in every cache slot no query of its row may see (before the window, past the end)."""
    keys = torch.arange(k.shape[1], device=k.device)[None, :]
    lengths = seqlens.long()[:, None]
    hidden = keys >= lengths
    if window_left >= 0:
        hidden |= keys < lengths - seqlen_q - window_left
    k, v = k.clone(), v.clone()
    k[hidden] = float("nan")
    v[hidden] = float("nan")
    return k, v


def _decode_and_check(q, k, v, seqlens, *, backend=None, k_ref=None, v_ref=None, **kwargs):
    variant = {name: kwargs[name] for name in ("window_size", "softcap", "sinks") if name in kwargs}
    out = torch.full_like(q, POISON)
    result, lse = flashsplit.decode(q, k, v, cache_seqlens=seqlens, return_lse=True, out=out, backend=backend or "auto",
                                    **kwargs)
    check_against_reference(result, lse, q, k if k_ref is None else k_ref, v if v_ref is None else v_ref, seqlens,
                            kwargs.get("causal", False), kwargs.get("softmax_scale"), what=f"{backend} {kwargs}",
                            **variant)
    return result, lse


FULL = pytest.mark.full
# Windows on regime boundaries for 64-key Triton tiles and 128-key granules: 0, 1, tile +- 1,
# granule +- 1, larger than every row; the default run takes one of each kind.
WINDOWS = [(0, -1), pytest.param((1, -1), marks=FULL), pytest.param((63, -1), marks=FULL), (64, -1),
           pytest.param((65, -1), marks=FULL), (127, 0), pytest.param((129, -1), marks=FULL), (5000, -1), (40, 3),
           pytest.param((0, 0), marks=FULL)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("seqlen_q, causal", [(1, False), (3, True), pytest.param(3, False, marks=FULL),
                                              pytest.param(8, True, marks=FULL)])
def test_sliding_window(dtype, window, seqlen_q, causal, generator):
    if causal and window[1] > 0:
        pytest.skip("right > 0 contradicts causal (an error case, tested below)")
    case = DecodeCase(batch=3, seqlen_q=seqlen_q, seqlen_k=700, num_heads_kv=2, group=4, head_dim=64, dtype=dtype,
                      lengths=(700, 300, 2), num_splits=3)
    q, k, v, seqlens = make_inputs(case, DEVICE, generator)
    k, v = _hide_unseen(k, v, seqlens, seqlen_q, window[0])
    tensors = DecodeTensors(q, k, v, q, None, seqlens)
    for backend in _backends(tensors, DecodeOptions(causal=causal, window_size=window)):
        for num_splits in (0, 3):
            _decode_and_check(q, k, v, seqlens, backend=backend, causal=causal, window_size=window,
                              num_splits=num_splits)


def test_window_plan_covers_only_reachable_keys():
    """A 4k window over a 128k cache is split like a 4k(+L_q) cache; the boundaries start at the
    granule below the first key query 0 can see."""
    windowed = flashsplit.plan(1, 131072, 32, 8, 128, gpu="h200", backend="triton", window_size=(4096, 0))
    short = flashsplit.plan(1, 4096 + 128, 32, 8, 128, gpu="h200", backend="triton")
    assert (windowed.span, windowed.num_splits) == (4224, short.num_splits)
    assert "window of 4096 keys" in str(windowed)
    bounds = windowed.boundaries(100000)
    assert bounds[0][0] == first_key(100000, 1, 4096) == (100000 - 1 - 4096) // 128 * 128
    assert bounds[-1][1] == 100000 or bounds[-1][1] <= bounds[-1][0]
    assert bounds == split_bounds(100000, windowed.num_splits, window_left=4096)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("softcap, scale", [(30.0, 1.0), (2.0, 4.0), (0.5, 0.125)])
def test_softcap(dtype, softcap, scale, generator):
    """Large logits (scale 4: many scores past the cap) and small ones (scale 1/8)."""
    case = DecodeCase(batch=2, seqlen_q=2, seqlen_k=300, num_heads_kv=2, group=2, head_dim=64, dtype=dtype,
                      lengths=(300, 77))
    q, k, v, seqlens = make_inputs(case, DEVICE, generator)
    tensors = DecodeTensors(q, k, v, q, None, seqlens)
    for backend in _backends(tensors, DecodeOptions(softcap=softcap)):
        for num_splits in (0, 1, 3):
            _decode_and_check(q, k, v, seqlens, backend=backend, softcap=softcap, softmax_scale=scale * 64 ** -0.5,
                              causal=True, num_splits=num_splits)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("sink_scale", [8.0, -8.0, 1.0])  # a sink that dominates, a negligible one, a fair one
@pytest.mark.parametrize("sink_dtype", [torch.float32, pytest.param(torch.bfloat16, marks=FULL)])
def test_sinks(dtype, sink_scale, sink_dtype, generator):
    """Sinks join the softmax once whatever the split count (one split: the split kernel; several:
    the in-kernel merge or the combine); an empty row and a query that sees no key (L_q 3 over a
    1-key row) get O = 0 and LSE = the sink."""
    case = DecodeCase(batch=3, seqlen_q=3, seqlen_k=600, num_heads_kv=2, group=4, head_dim=64, dtype=dtype,
                      lengths=(600, 1, 0))
    q, k, v, seqlens = make_inputs(case, DEVICE, generator)
    sinks = (sink_scale * (1 + torch.rand(8, generator=generator))).to(DEVICE, sink_dtype)
    tensors = DecodeTensors(q, k, v, q, None, seqlens, sinks=sinks)
    for backend in _backends(tensors, DecodeOptions(causal=True)):
        for num_splits in (0, 1, 5):
            out, lse = _decode_and_check(q, k, v, seqlens, backend=backend, sinks=sinks, causal=True,
                                         num_splits=num_splits)
            assert torch.equal(out[2], torch.zeros_like(out[2]))
            assert torch.allclose(lse[2], sinks.float()[:, None].expand(8, 3), atol=1e-5)
            assert torch.allclose(lse[1, :, 0], sinks.float(), atol=1e-5)  # query 0 at position -2: no key


@pytest.mark.parametrize("page_size, fp8", [(0, None), (16, torch.float8_e4m3fn),
                                           pytest.param(16, None, marks=FULL), pytest.param(0, torch.float8_e4m3fn, marks=FULL)])
def test_every_feature_with_paged_and_fp8_caches(page_size, fp8, generator):
    case = DecodeCase(batch=3, seqlen_q=2, seqlen_k=900, num_heads_kv=2, group=4, head_dim=64, dtype=DTYPES[-1],
                      lengths=(900, 333, 64))
    q, k_dense, v_dense, seqlens = make_inputs(case, DEVICE, generator)
    window = (200, -1)
    sinks = torch.randn(8, generator=generator).to(DEVICE)
    for kwargs in (dict(window_size=window, causal=True), dict(softcap=3.0), dict(sinks=sinks),
                   dict(window_size=window, softcap=3.0, sinks=sinks, causal=True)):
        k, v = _hide_unseen(k_dense, v_dense, seqlens, 2, kwargs.get("window_size", (-1, -1))[0])
        extra = {}
        if fp8 is not None:
            k, extra["k_descale"] = quantize_fp8(k, fp8, per_head=True)
            v, extra["v_descale"] = quantize_fp8(v, fp8, per_head=True)
        k_ref, v_ref = dequantize(k, extra.get("k_descale")), dequantize(v, extra.get("v_descale"))
        if page_size:  # (no shared page: rows have scales of their own)
            k, v, extra["block_table"], _, _ = to_paged(k, v, list(case.lengths), page_size, generator,
                                                        share_first_page=False)
        _decode_and_check(q, k, v, seqlens, k_ref=k_ref, v_ref=v_ref, num_splits=3, **extra, **kwargs)


@pytest.mark.parametrize("page_size", [0, 48])
@pytest.mark.parametrize("fp8", [torch.float8_e5m2, pytest.param(torch.float8_e4m3fn, marks=FULL)])
@pytest.mark.parametrize("window, causal", [((40, 0), False), ((-1, -1), True), pytest.param((40, -1), False, marks=FULL)])
def test_fp8_masks_over_a_full_row_tile(page_size, fp8, window, causal, generator):
    """Masked scores over an fp8 cache with 64-row tiles (16 queries x 5 q heads per KV head,
    head dim 64): the shape where reading V as int16 pairs went wrong on sm_90."""
    case = DecodeCase(batch=3, seqlen_q=16, seqlen_k=288, num_heads_kv=1, group=5, head_dim=64, dtype=DTYPES[-1],
                      lengths=(116, 81, 227))
    q, k, v, seqlens = make_inputs(case, DEVICE, generator)
    k, v = _hide_unseen(k, v, seqlens, 16, window[0])
    extra = {}
    k, extra["k_descale"] = quantize_fp8(k, fp8, per_head=False)
    v, extra["v_descale"] = quantize_fp8(v, fp8, per_head=False)
    k_ref, v_ref = dequantize(k, extra["k_descale"]), dequantize(v, extra["v_descale"])
    if page_size:
        k, v, extra["block_table"], _, _ = to_paged(k, v, list(case.lengths), page_size, generator,
                                                    share_first_page=False)
    _decode_and_check(q, k, v, seqlens, k_ref=k_ref, v_ref=v_ref, backend="triton", window_size=window,
                      causal=causal, **extra)


@pytest.mark.parametrize("page_size", [0, pytest.param(16, marks=FULL)])
@pytest.mark.parametrize("seqlen_q", [1, pytest.param(4, marks=FULL)])
def test_batch_invariance(page_size, seqlen_q, generator):
    """A row decoded alone, in a batch of 16 with other lengths (and another cache capacity), and
    at another position in that batch gives bitwise equal outputs and LSEs, per backend."""
    dtype = DTYPES[-1]
    heads, dim, length, capacity = (8, 2), 64, 700, 1100
    window = (300, -1)

    def rand(*shape):
        return torch.randn(*shape, generator=generator).to(DEVICE, dtype)

    q_row, k_row, v_row = rand(1, seqlen_q, heads[0], dim), rand(1, length, heads[1], dim), rand(1, length, heads[1], dim)
    lengths = [int(n) for n in torch.randint(0, capacity, (16,), generator=generator)]
    batch_q, batch_k, batch_v = (rand(16, seqlen_q, heads[0], dim), rand(16, capacity, heads[1], dim),
                                 rand(16, capacity, heads[1], dim))

    def decode(q, k, v, lens, backend, **kwargs):
        lens = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
        extra = {}
        if page_size:
            k, v, extra["block_table"], _, _ = to_paged(k, v, [int(n) for n in lens], page_size, generator)
        return flashsplit.decode(q, k, v, cache_seqlens=lens, return_lse=True, batch_invariant=True, causal=True,
                                 backend=backend, **extra, **kwargs)

    tensors = DecodeTensors(q_row, k_row, v_row, q_row, None, torch.tensor([length], dtype=torch.int32, device=DEVICE))
    for backend in _backends(tensors, DecodeOptions(causal=True, batch_invariant=True)):
        for kwargs in (dict(), dict(window_size=window)):
            alone = decode(q_row, k_row, v_row, [length], backend, **kwargs)
            for position in (3, 11):
                q, k, v, lens = batch_q.clone(), batch_k.clone(), batch_v.clone(), list(lengths)
                q[position], k[position, :length], v[position, :length], lens[position] = q_row[0], k_row[0], v_row[0], length
                batched = decode(q, k, v, lens, backend, **kwargs)
                assert torch.equal(alone[0][0], batched[0][position]), (backend, kwargs, position)
                assert torch.equal(alone[1][0], batched[1][position]), (backend, kwargs, position)
            check_against_reference(alone[0], alone[1], q_row, k_row, v_row,
                                    torch.tensor([length], dtype=torch.int32, device=DEVICE), True, **kwargs)
    p = flashsplit.plan(16, capacity, 8, 2, 64, device=DEVICE, batch_invariant=True, backend="triton")
    assert (p.num_splits, p.tokens_per_split) == (-(-capacity // BATCH_INVARIANT_MIN_SPLIT), BATCH_INVARIANT_MIN_SPLIT)
    long = flashsplit.plan(16, 131072, 8, 2, 64, device=DEVICE, batch_invariant=True, backend="triton")
    assert (long.num_splits, long.tokens_per_split) == (32, 4096)  # 32 splits of a long row


def test_partials_with_a_window_combine_like_the_reference(generator):
    """forward_partials cuts windowed rows at the plan's boundaries; any backend's combine merges
    them, and combine(sinks=...) adds the sinks once."""
    case = DecodeCase(batch=2, seqlen_q=2, seqlen_k=800, num_heads_kv=2, group=2, head_dim=64, dtype=torch.float16,
                      lengths=(800, 150))
    q, k, v, seqlens = make_inputs(case, DEVICE, generator)
    from flashsplit.problem import Variant
    from flashsplit.reference import split_partials_ref

    window = (300, -1)
    out_p, lse_p = get("triton").forward_partials(q, k, v, seqlens, 3, 64 ** -0.5, True, variant=Variant(300, 0))
    ref_p, ref_lse_p = split_partials_ref(q, torch.nan_to_num(k), torch.nan_to_num(v), seqlens, 3, True,
                                          window_size=window)
    ref_p, ref_lse_p = ref_p.cpu(), ref_lse_p.cpu()
    live = torch.isfinite(ref_lse_p)
    assert torch.equal(torch.isfinite(lse_p).cpu(), live)
    torch.testing.assert_close(lse_p.cpu()[live], ref_lse_p[live], atol=1e-4, rtol=1e-4)
    sinks = torch.randn(4, generator=generator).to(DEVICE)
    out, lse = flashsplit.combine(out_p, lse_p, sinks=sinks)
    ref_out, ref_lse = combine_ref(ref_p, ref_lse_p, sinks.cpu())
    torch.testing.assert_close(out.double().cpu(), ref_out, atol=2e-3, rtol=2e-3)
    torch.testing.assert_close(lse.cpu(), ref_lse, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("kwargs, error, needle", [
    (dict(window_size=(-2, -1)), ValueError, "window_size: expected each bound >= -1"),
    (dict(window_size=(4, 1), causal=True), ValueError, "contradicts causal=True"),
    (dict(window_size=(4,)), TypeError, "window_size: expected a \\(left, right\\) pair"),
    (dict(window_size=(4.0, 0)), TypeError, "window_size: expected a \\(left, right\\) pair"),
    (dict(softcap=-1.0), ValueError, "softcap: expected a finite value >= 0"),
    (dict(softcap=float("nan")), ValueError, "softcap: expected a finite value >= 0"),
    (dict(softcap="1"), TypeError, "softcap: expected a float"),
    (dict(sinks=torch.zeros(3)), ValueError, r"sinks: expected shape \[8\]"),
    (dict(sinks=torch.zeros(8, dtype=torch.int32)), TypeError, "sinks: expected dtype float32"),
    (dict(sinks=lambda: torch.zeros(16, device=DEVICE)[::2]), ValueError, "sinks: expected a contiguous tensor"),
    (dict(sinks=[0.0] * 8), TypeError, "sinks: expected a torch.Tensor"),
    (dict(batch_invariant=1), TypeError, "batch_invariant: expected a bool"),
    (dict(batch_invariant=True, num_splits=4), ValueError, "batch_invariant=True splits each row by its own length"),
])
def test_bad_variant_arguments(kwargs, error, needle):
    q = torch.randn(2, 1, 8, 64, device=DEVICE).half()
    k = torch.randn(2, 64, 2, 64, device=DEVICE).half()
    if callable(kwargs.get("sinks")):  # a view that must be made on the device
        kwargs = dict(kwargs, sinks=kwargs["sinks"]())
    elif isinstance(kwargs.get("sinks"), torch.Tensor):
        kwargs = dict(kwargs, sinks=kwargs["sinks"].to(DEVICE))
    with pytest.raises(error, match=needle):
        flashsplit.decode(q, k, k, **kwargs)


def test_a_cache_of_no_keys_gives_the_sinks():
    """Capacity 0: O = 0 and LSE = the sink of each q head (no kernel runs)."""
    q = torch.randn(2, 3, 8, 64, device=DEVICE).half()
    k = torch.empty(2, 0, 2, 64, device=DEVICE).half()
    sinks = torch.randn(8, device=DEVICE)
    out, lse = flashsplit.decode(q, k, k, sinks=sinks, return_lse=True)
    assert torch.equal(out, torch.zeros_like(out))
    assert torch.equal(lse, sinks[None, :, None].expand(2, 8, 3))
