"""GPU parity matrix for every registered backend, at real sizes (skipped without CUDA).

Every backend that supports a case runs the same inputs and is judged against the float64
reference by the same rule (flashsplit.testing); a backend that does not support a case is
skipped with its reason, never counted as a pass. Also: NaN in unused cache slots, a cache of
more than 2^31 elements, CUDA-graph capture and replay with new ``cache_seqlens``, and
mix-and-match combines (each backend's combine over another backend's partials).
"""

import itertools

import pytest
import torch

import flashsplit
from flashsplit.call import DecodeOptions, DecodeTensors
from flashsplit.validation import check_decode_inputs
from flashsplit.reference import attention_ref, split_partials_ref
from flashsplit.registry import get, names
from flashsplit.testing import (
    POISON,
    DecodeCase,
    check_against_reference,
    check_lse,
    make_inputs,
    run_and_check,
)

pytestmark = pytest.mark.gpu

BACKENDS = names()


def _seqlen_for(batch: int, i: int) -> int:
    # Long caches only at small batch: the float64 reference holds the whole cache.
    choices = {1: [1000, 4096, 16384, 131072], 3: [777, 4096, 32768, 131072], 16: [1000, 4096, 16384], 64: [513, 2048, 4096]}
    return choices[batch][i % len(choices[batch])]


def _lengths_for(batch: int, seqlen_k: int, i: int) -> tuple[int, ...]:
    # Row lengths on regime boundaries: empty, one key, tile +/- 1, granule +/- 1, full.
    special = [0, 1, 63, 65, 127, 129, seqlen_k - 1, seqlen_k]
    return tuple(special[(i + r) % len(special)] if r < len(special) else seqlen_k - 7 * r for r in range(batch))


def _matrix():
    cases = []
    axes = itertools.product([torch.bfloat16, torch.float16], [1, 4, 5, 8], [64, 96, 128, 256], [1, 3, 17, 0])
    for i, (dtype, group, head_dim, num_splits) in enumerate(axes):
        batch = [1, 3, 16, 64][i % 4]
        seqlen_k = _seqlen_for(batch, i // 4)
        seqlen_q = [1, 1, 4, 2, 5][i % 5]
        cases.append(DecodeCase(
            batch=batch, seqlen_q=seqlen_q, seqlen_k=seqlen_k, num_heads_kv=[8, 2, 1][i % 3], group=group,
            head_dim=head_dim, dtype=dtype, lengths=None if i % 7 == 0 else _lengths_for(batch, seqlen_k, i),
            num_splits=num_splits, causal=seqlen_q > 1 and i % 2 == 0,
        ))
    return cases


MATRIX = _matrix()


def _decoder(backend):
    def call(*args, **kwargs):
        return flashsplit.decode(*args, backend=backend, **kwargs)
    return call


def _skip_unless_supported(backend, q, k, v, seqlens, causal=False):
    _skip_unless(backend, check_decode_inputs(DecodeTensors(q, k, v, None, None, seqlens), DecodeOptions(causal=causal)))


def _skip_unless(backend, problem):
    reason = get(backend).supports(problem)
    if reason is not None:
        pytest.skip(f"{backend}: {reason}")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", MATRIX, ids=str)
def test_matrix(backend, case, generator):
    _skip_unless(backend, case.problem("cuda"))
    run_and_check(case, _decoder(backend), "cuda", generator)


@pytest.mark.parametrize("backend", BACKENDS)
def test_cache_over_2_31_elements(backend, generator):
    """5 x 2^19 keys x 8 heads x 128 = 2.7e9 elements per cache: row offsets overflow int32."""
    batch, seqlen_k, heads_kv, dim = 5, 1 << 19, 8, 128
    k = torch.empty(batch, seqlen_k, heads_kv, dim, dtype=torch.bfloat16, device="cuda").normal_()
    v = torch.empty_like(k).normal_()
    q = torch.randn(batch, 1, 32, dim, dtype=torch.bfloat16, device="cuda")
    assert k.numel() > 2**31
    lengths = torch.tensor([3000, 5, 1, 4000, seqlen_k], dtype=torch.int32, device="cuda")
    _skip_unless_supported(backend, q, k, v, lengths)
    out, lse = flashsplit.decode(q, k, v, cache_seqlens=lengths, num_splits=7, return_lse=True, backend=backend)
    # Check the short rows against the reference on the live prefix, the full row on its tail.
    short = slice(0, 4)
    check_against_reference(out[short], lse[short], q[short], k[short, :4000], v[short, :4000], lengths[short],
                            what="out[rows 0-3]")
    full_ref, full_lse = attention_ref(q[4:], k[4:], v[4:])
    torch.testing.assert_close(out[4:].double(), full_ref, atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(lse[4:], full_lse, atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("backend", BACKENDS)
def test_nan_in_unused_slots_never_reaches_output(backend, generator):
    case = DecodeCase(batch=4, seqlen_q=1, seqlen_k=4096, num_heads_kv=8, group=4, head_dim=128,
                      dtype=torch.bfloat16, lengths=(4095, 129, 1, 0), num_splits=0)
    q, k, v, seqlens = make_inputs(case, "cuda", generator)
    _skip_unless_supported(backend, q, k, v, seqlens)
    assert torch.isnan(k[1, 129:]).all()
    out = flashsplit.decode(q, k, v, cache_seqlens=seqlens, backend=backend)
    assert not torch.isnan(out).any()
    assert (out[3] == 0).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_cuda_graph_replay_with_new_seqlens(backend, generator):
    case = DecodeCase(batch=3, seqlen_q=1, seqlen_k=16384, num_heads_kv=8, group=4, head_dim=128,
                      dtype=torch.bfloat16, lengths=(16384, 5000, 1), nan_tail=False)
    q, k, v, seqlens = make_inputs(case, "cuda", generator)
    _skip_unless_supported(backend, q, k, v, seqlens)
    out = torch.empty_like(q)
    lse = None

    def step():
        return flashsplit.decode(q, k, v, cache_seqlens=seqlens, out=out, return_lse=True, backend=backend)[1]

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()  # warm-up: compile outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        lse = step()
    for new_lengths in ([100, 16384, 0], [8191, 129, 12000], [1, 1, 16384]):
        seqlens.copy_(torch.tensor(new_lengths, dtype=torch.int32))
        q.normal_()
        graph.replay()
        torch.cuda.synchronize()
        eager, eager_lse = flashsplit.decode(q, k, v, cache_seqlens=seqlens, return_lse=True, backend=backend)
        assert torch.equal(out, eager), f"graph replay differs from eager for lengths {new_lengths}"
        torch.testing.assert_close(lse, eager_lse, atol=0, rtol=0)
        check_against_reference(out, None, q, k, v, seqlens, what=f"graph out {new_lengths}")


@pytest.mark.parametrize("producer, merger", list(itertools.product(BACKENDS, BACKENDS)))
def test_mix_and_match_combines(producer, merger, generator):
    """One backend's combine over another's partials equals the producer's own result."""
    case = DecodeCase(batch=3, seqlen_q=2, seqlen_k=9000, num_heads_kv=2, group=4, head_dim=128,
                      dtype=torch.bfloat16, lengths=(9000, 130, 0), causal=True)
    q, k, v, seqlens = make_inputs(case, "cuda", generator)
    for name in {producer, merger}:
        _skip_unless_supported(name, q, k, v, seqlens, causal=True)
    out_p, lse_p = get(producer).forward_partials(q, k, v, seqlens, 17, 128 ** -0.5, True)
    ref_p, ref_lse_p = split_partials_ref(q, k, v, seqlens, 17, causal=True)
    check_lse(lse_p, ref_lse_p)
    live = ~torch.isneginf(ref_lse_p).permute(0, 1, 3, 2)[..., None].expand_as(ref_p)
    torch.testing.assert_close(out_p[live], ref_p[live].cuda(), atol=2e-2, rtol=2e-2)
    own = torch.empty(q.shape, dtype=torch.float32, device="cuda")  # fp32: agreement to fp32 rounding
    get(producer).combine(out_p, lse_p, own, None)
    mixed = torch.empty_like(own)
    mixed_lse = torch.empty((3, 8, 2), dtype=torch.float32, device="cuda")
    get(merger).combine(out_p, lse_p, mixed, mixed_lse)
    torch.testing.assert_close(mixed, own, atol=1e-5, rtol=1e-5)


# -- cache formats (paged, fp8) at real sizes, every backend that supports them -------------------

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("page_size", [1, 16, 48, 64, 128, 256])
@pytest.mark.parametrize("fp8", [None, torch.float8_e4m3fn, torch.float8_e5m2])
def test_paged_and_fp8_matrix(backend, page_size, fp8, generator):
    from flashsplit.reference import dequantize
    from flashsplit.testing import quantize_fp8, to_paged

    group = {1: 3, 16: 5, 48: 7, 64: 16, 128: 32, 256: 4}[page_size]
    lengths = (20000, 4097, 129, 0)
    case = DecodeCase(batch=4, seqlen_q=1, seqlen_k=20000, num_heads_kv=2, group=group, head_dim=128,
                      dtype=torch.bfloat16, lengths=lengths)
    q, k, v, seqlens = make_inputs(case, "cuda", generator)
    scales = {}
    if fp8 is not None:
        k, k_descale = quantize_fp8(k, fp8, per_head=page_size % 2 == 0)
        v, v_descale = quantize_fp8(v, fp8, per_head=page_size % 2 == 0)
        scales = dict(k_descale=k_descale, v_descale=v_descale)
    k_pages, v_pages, table, k, v = to_paged(k, v, list(lengths), page_size, generator)
    problem = check_decode_inputs(DecodeTensors(q, k_pages, v_pages, None, None, seqlens, table, *scales.values()))
    _skip_unless(backend, problem)
    out, lse = flashsplit.decode(q, k_pages, v_pages, block_table=table, cache_seqlens=seqlens, return_lse=True,
                                 backend=backend, **scales)
    k_ref = dequantize(k, scales.get("k_descale"))
    v_ref = dequantize(v, scales.get("v_descale"))
    check_against_reference(out, lse, q, k_ref, v_ref, seqlens, what=f"paged {page_size} {fp8}")


@pytest.mark.gpu
@pytest.mark.parametrize("page_size", [1, 16, 48])
@pytest.mark.parametrize("fp8", [None, torch.float8_e4m3fn])
def test_triton_paged_splits_longer_than_a_chunk(page_size, fp8, generator):
    """One split over 20000 keys: the Triton paged loop walks many chunks of page ids (512 or
    2048 keys each), some starting mid-page."""
    from flashsplit.reference import dequantize
    from flashsplit.testing import quantize_fp8, to_paged

    lengths = (20000, 2049, 0)
    case = DecodeCase(batch=3, seqlen_q=1, seqlen_k=20000, num_heads_kv=2, group=4, head_dim=128,
                      dtype=torch.bfloat16, lengths=lengths)
    q, k, v, seqlens = make_inputs(case, "cuda", generator)
    scales = {}
    if fp8 is not None:
        k, k_descale = quantize_fp8(k, fp8, per_head=True)
        v, v_descale = quantize_fp8(v, fp8, per_head=True)
        scales = dict(k_descale=k_descale, v_descale=v_descale)
    k_pages, v_pages, table, k, v = to_paged(k, v, list(lengths), page_size, generator)
    out, lse = flashsplit.decode(q, k_pages, v_pages, block_table=table, cache_seqlens=seqlens, num_splits=1,
                                 return_lse=True, backend="triton", **scales)
    check_against_reference(out, lse, q, dequantize(k, scales.get("k_descale")),
                            dequantize(v, scales.get("v_descale")), seqlens, what=f"paged {page_size} {fp8}")


def _paged(k, v, page_size, generator):
    """``k``/``v`` ``[B, L, H_kv, D]`` (L a multiple of ``page_size``) as pages in a shuffled
    order: ``(k_pages, v_pages, block_table)``; every slot keeps its value (NaN included)."""
    batch, capacity = k.shape[:2]
    pages = batch * (capacity // page_size)
    order = torch.randperm(pages, generator=generator).to(k.device)
    k_pages, v_pages = torch.empty_like(k).view(pages, page_size, *k.shape[2:]), torch.empty_like(v).view(
        pages, page_size, *v.shape[2:])
    k_pages[order] = k.reshape(pages, page_size, *k.shape[2:])
    v_pages[order] = v.reshape(pages, page_size, *v.shape[2:])
    return k_pages, v_pages, order.view(batch, -1).to(torch.int32)


@pytest.mark.parametrize("backend", ["auto", *BACKENDS])
def test_batch_invariant_row_alone_equals_the_row_in_any_batch(backend, generator):
    """With ``batch_invariant=True`` a row decoded alone (a dense cache of its own length) gives
    the same bits (out and lse) as in batches of 1, 4, 16 and 64 rows of random lengths at a
    random position, in an 8k-key cache dense and in pages of 16 and 48 keys (the short row also
    among 64 rows of a 512-key cache: one split, more programs than one wave), and alone in caches
    of other capacities: 32/8 heads, d = 128, bf16, slots past each row's length NaN. A short row
    (one split) and a long one (many); the row alone is the reference's."""
    heads, heads_kv, dim, capacity = 32, 8, 128, 8192
    dtype = torch.bfloat16

    def rand(*shape):
        return torch.randn(*shape, generator=generator).to("cuda", dtype)

    def decode(q, k, v, lens, block_table=None):
        lens = torch.tensor(lens, dtype=torch.int32, device="cuda")
        out = torch.full_like(q, POISON)
        return flashsplit.decode(q, k, v, cache_seqlens=lens, block_table=block_table, out=out, return_lse=True,
                                 batch_invariant=True, backend=backend)

    if backend != "auto":
        q = rand(1, 1, heads, dim)
        _skip_unless(backend, check_decode_inputs(DecodeTensors(q, rand(1, 256, heads_kv, dim), rand(
            1, 256, heads_kv, dim), None, None, torch.ones(1, dtype=torch.int32, device="cuda")),
            DecodeOptions(batch_invariant=True)))
    short, long = (int(torch.randint(1, 512, (1,), generator=generator)),
                   int(torch.randint(1024, capacity - 31, (1,), generator=generator)))  # fits pages of 48
    for length in (short, long):
        q_row, k_row, v_row = rand(1, 1, heads, dim), rand(1, length, heads_kv, dim), rand(1, length, heads_kv, dim)
        alone = decode(q_row, k_row, v_row, [length])
        seqlens = torch.tensor([length], dtype=torch.int32, device="cuda")
        check_against_reference(alone[0], alone[1], q_row, k_row, v_row, seqlens, what=f"alone, {length} keys")
        for other in (-(-length // 8) * 8 + 8, capacity, 3 * capacity):  # other capacities, NaN past the row
            k = torch.full((1, other, heads_kv, dim), POISON, dtype=dtype, device="cuda")
            v = torch.full_like(k, POISON)
            k[:, :length], v[:, :length] = k_row, v_row
            got = decode(q_row, k, v, [length])
            what = f"{backend}: a {length}-key row alone in a {other}-key cache"
            assert torch.equal(got[0], alone[0]) and torch.equal(got[1], alone[1]), what
        # (64 rows of a 512-key cache: one split, more programs than one wave holds)
        for batch, keys in [(1, capacity), (4, capacity), (16, capacity), (64, capacity)] + [(64, 512)] * (
                length <= 512):
            position = int(torch.randint(0, batch, (1,), generator=generator))
            lens = [int(n) for n in torch.randint(0, keys + 1, (batch,), generator=generator)]
            lens[position] = length
            q, k, v = rand(batch, 1, heads, dim), rand(batch, keys, heads_kv, dim), rand(batch, keys, heads_kv, dim)
            q[position], k[position, :length], v[position, :length] = q_row[0], k_row[0], v_row[0]
            for i, n in enumerate(lens):
                k[i, n:], v[i, n:] = POISON, POISON
            for page_size in (0, 16, 48):
                whole = keys // page_size * page_size if page_size else keys
                if whole < length:
                    continue
                if page_size:
                    k_pages, v_pages, table = _paged(k[:, :whole], v[:, :whole], page_size, generator)
                    got = decode(q, k_pages, v_pages, [min(n, whole) for n in lens], table)
                else:
                    got = decode(q, k, v, lens)
                what = f"{backend}: a {length}-key row at {position} of {batch} rows of {keys}, pages of {page_size}"
                assert torch.equal(got[0][position], alone[0][0]), what
                assert torch.equal(got[1][position], alone[1][0]), what
