"""The Triton backend against the reference, on whatever machine runs the tests.

Without CUDA this runs the kernels through the Triton interpreter in fp16 (the interpreter's
bf16 ``tl.dot`` is wrong, triton-lang/triton#11584; bf16 is covered on the GPU). The matrix is a covering design over the
axes rather than their full product (864 cells x lengths would take hours in the interpreter):
every (L_q, group, D, num_splits) combination once, with batch, causal, KV heads and row lengths
rotating through their values. The default run takes a quarter of it that still holds every
pair of those four axes and every row length (``pytest --full`` runs all of it).
"""

import itertools

import pytest
import torch
from conftest import DEVICE

import flashsplit
import triton
import triton.language as tl
from flashsplit.triton.split_kernel import program_work
from flashsplit.call import DecodeTensors
from flashsplit.testing import (
    POISON,
    DecodeCase,
    check_against_reference,
    check_lse,
    make_inputs,
    run_and_check,
)

BLOCK_N = 64  # the Triton kernel's key tile
LENGTHS = [0, 1, BLOCK_N - 1, BLOCK_N + 1, 127, 129, 300, 517]
SPLITS = [1, 3, 17, 0]


AXES = {"seqlen_q": [1, 2, 5], "group": [1, 4, 5], "head_dim": [64, 96, 128], "num_splits": SPLITS}


def _matrix():
    """(case, in_default_run) pairs: the default run takes the cells whose axis indices sum to a
    multiple of 4, which fixes no pair of axes (the other two indices reach every residue)."""
    cases = []
    lengths = itertools.cycle(LENGTHS)
    indices = itertools.product(*(range(len(values)) for values in AXES.values()))
    for i, idx in enumerate(indices):
        seqlen_q, group, head_dim, num_splits = (values[j] for values, j in zip(AXES.values(), idx))
        batch = (1, 3)[i % 2]
        rows = tuple(next(lengths) for _ in range(batch))
        cases.append((DecodeCase(
            batch=batch, seqlen_q=seqlen_q, seqlen_k=max(rows) + 3, num_heads_kv=1 + i % 2, group=group,
            head_dim=head_dim, dtype=torch.float16, lengths=rows, num_splits=num_splits, causal=i % 3 != 0,
        ), sum(idx) % 4 == 0))
    return cases


MATRIX = _matrix()
DEFAULT_CELLS = [case for case, default in MATRIX if default]


def _covers_the_boundaries(cases) -> bool:
    """Every value of every axis, every pair of the four main axes, both batch sizes, every row
    length (0, 1, tile +- 1, ...), and causal both with one query and with several."""
    pairs_ok = all({(getattr(c, a), getattr(c, b)) for c in cases} == set(itertools.product(AXES[a], AXES[b]))
                   for a, b in itertools.combinations(AXES, 2))
    return (pairs_ok and {c.batch for c in cases} == {1, 3} and {n for c in cases for n in c.lengths} == set(LENGTHS)
            and {(c.causal, c.seqlen_q > 1) for c in cases} == set(itertools.product([False, True], repeat=2)))


# The design of the matrix, checked where it is defined (a failed check stops collection).
assert _covers_the_boundaries([case for case, _ in MATRIX]) and _covers_the_boundaries(DEFAULT_CELLS)


def triton_decode(*args, **kwargs):
    return flashsplit.decode(*args, backend="triton", **kwargs)


@pytest.mark.parametrize("case", [pytest.param(case, marks=() if default else pytest.mark.full, id=str(case))
                                  for case, default in MATRIX])
def test_matrix(case, generator):
    run_and_check(case, triton_decode, DEVICE, generator)


@pytest.mark.parametrize("num_splits", [1, 4])
def test_full_cache_without_seqlens(num_splits, generator):
    case = DecodeCase(batch=2, seqlen_q=1, seqlen_k=700, num_heads_kv=2, group=4, head_dim=64,
                      dtype=torch.float16, num_splits=num_splits)
    run_and_check(case, triton_decode, DEVICE, generator)


def test_many_rows_take_several_row_blocks(generator):
    # 16 queries x 8 q heads per KV head = 128 packed rows: two 64-row tiles.
    case = DecodeCase(batch=1, seqlen_q=16, seqlen_k=200, num_heads_kv=1, group=8, head_dim=64,
                      dtype=torch.float16, lengths=(190,), num_splits=2, causal=True)
    run_and_check(case, triton_decode, DEVICE, generator)


def test_return_lse_false_and_fresh_out(generator):
    case = DecodeCase(batch=2, seqlen_q=1, seqlen_k=300, num_heads_kv=2, group=4, head_dim=64,
                      dtype=torch.float16, lengths=(300, 41), num_splits=3)
    q, k, v, seqlens = make_inputs(case, DEVICE, generator)
    out = flashsplit.decode(q, k, v, cache_seqlens=seqlens, num_splits=3, backend="triton")
    assert isinstance(out, torch.Tensor) and out.shape == q.shape and out.dtype == q.dtype
    check_against_reference(out, None, q, k, v, seqlens)


def test_strided_inputs_and_output(generator):
    """Only the last dim must be contiguous: caches carved out of a larger buffer, q and out
    transposed views."""
    g = generator
    big = torch.randn(2, 400, 3, 2, 64, generator=g).half().to(DEVICE)  # [B, L, H_kv, (k|v), D]
    k, v = big[:, :, :, 0], big[:, :, :, 1]
    q = torch.randn(2, 6, 2, 64, generator=g).half().to(DEVICE).transpose(1, 2)  # [B, L_q=2, H=6, D], heads outer
    assert not q.is_contiguous() and not k.is_contiguous()
    seqlens = torch.tensor([400, 130], dtype=torch.int32, device=DEVICE)
    out_buf = torch.full((2, 6, 2, 64), POISON, dtype=torch.float16, device=DEVICE)
    out = out_buf.transpose(1, 2)
    result, lse = flashsplit.decode(q, k, v, cache_seqlens=seqlens, num_splits=3, out=out, return_lse=True,
                                    backend="triton")
    check_against_reference(result, lse, q, k, v, seqlens)


def test_softmax_scale(generator):
    case = DecodeCase(batch=1, seqlen_q=1, seqlen_k=200, num_heads_kv=1, group=4, head_dim=64, dtype=torch.float16)
    q, k, v, _ = make_inputs(case, DEVICE, generator)
    out, lse = flashsplit.decode(q, k, v, softmax_scale=0.3, num_splits=2, return_lse=True, backend="triton")
    check_against_reference(out, lse, q, k, v, softmax_scale=0.3)


@pytest.mark.parametrize("num_splits", [3, pytest.param(17, marks=pytest.mark.full)])
def test_partials_match_reference_split_by_split(num_splits, generator):
    from flashsplit.reference import split_partials_ref
    from flashsplit.registry import get

    case = DecodeCase(batch=3, seqlen_q=2, seqlen_k=600, num_heads_kv=2, group=4, head_dim=64,
                      dtype=torch.float16, lengths=(600, 129, 0), causal=True)
    q, k, v, seqlens = make_inputs(case, DEVICE, generator)
    out_p, lse_p = get("triton").forward_partials(q, k, v, seqlens, num_splits, 0.125, True)
    ref_p, ref_lse_p = split_partials_ref(q, k, v, seqlens, num_splits, causal=True, softmax_scale=0.125)
    check_lse(lse_p, ref_lse_p)
    live = ~torch.isneginf(ref_lse_p).permute(0, 1, 3, 2)[..., None].expand_as(ref_p)
    torch.testing.assert_close(out_p[live], ref_p[live], atol=2e-3, rtol=2e-3)


def test_empty_cache_and_empty_batch():
    q = torch.randn(2, 1, 4, 64, device=DEVICE).half()
    k = torch.empty(2, 0, 2, 64, dtype=torch.float16, device=DEVICE)
    out, lse = flashsplit.decode(q, k, k, return_lse=True, backend="triton")
    assert (out == 0).all() and torch.isneginf(lse).all()
    q0 = torch.randn(0, 1, 4, 64, device=DEVICE).half()
    k0 = torch.randn(0, 10, 2, 64, device=DEVICE).half()
    out0, lse0 = flashsplit.decode(q0, k0, k0, return_lse=True)
    assert out0.shape == (0, 1, 4, 64) and lse0.shape == (0, 4, 1)


@pytest.mark.parametrize("head_dim", [8, 40, 200, 256])
def test_other_head_dims(head_dim, generator):
    """Every multiple of 8 up to 256: the smallest, a non-power of two below and above 128, the largest."""
    case = DecodeCase(batch=2, seqlen_q=3, seqlen_k=300, num_heads_kv=2, group=7, head_dim=head_dim,
                      dtype=torch.float16, lengths=(300, 129), num_splits=3, causal=True)
    run_and_check(case, triton_decode, DEVICE, generator)


def test_tile_stages_follow_the_h200_sweep():
    """2 pipeline stages only for a single-split launch with many programs (docs/architecture.md)."""
    from flashsplit.triton.backend import choose_tiles

    assert choose_tiles(4, 128, num_splits=1, programs=512).num_stages == 2  # B = 64, 8 KV heads
    assert choose_tiles(4, 128, num_splits=1, programs=256).num_stages == 3  # B = 32: one wave of 2 per SM
    assert choose_tiles(4, 128, num_splits=1, programs=265).num_stages == 2
    assert choose_tiles(4, 128, num_splits=1, programs=256, num_sms=100).num_stages == 2
    assert choose_tiles(4, 128, num_splits=1, programs=128).num_stages == 3  # B = 16
    assert choose_tiles(4, 128, num_splits=32, programs=256).num_stages == 3  # split launches
    assert choose_tiles(4, 128).block_m == 16 and choose_tiles(40, 64).block_m == 64
    # 32-key tiles when every split is one 128-key granule (B = 1, 4k keys, 32 splits)
    assert choose_tiles(4, 128, num_splits=32, programs=256, split_keys=128).block_n == 32
    assert choose_tiles(4, 128, num_splits=32, programs=256, split_keys=512).block_n == 64
    assert choose_tiles(4, 128, num_splits=1, programs=8, split_keys=128).block_n == 64
    # fp8 caches (dense or paged alike): 128-key tiles once a split holds 2048 keys
    assert choose_tiles(4, 128, num_splits=32, programs=256, split_keys=4096, fp8_cache=True).block_n == 128
    assert choose_tiles(4, 128, num_splits=32, programs=256, split_keys=512, fp8_cache=True).block_n == 64


# (5, 64): merged in one chunk of 8 splits; (8, 256): in 4 chunks of 2. Rows of one split, full
# rows and empty rows; the default run takes each tile shape once.
@pytest.mark.parametrize("group, head_dim, lengths", [
    (5, 64, (600, 129, 0)),
    *(pytest.param(g, d, lengths, marks=pytest.mark.full) for g, d, lengths in [
        (8, 256, (600, 600, 600)), (5, 64, (600, 600, 600)), (5, 64, (0, 0, 0)), (8, 256, (600, 129, 0)), (8, 256, (0, 0, 0))]),
])
def test_last_split_merge_matches_the_combine_kernel(group, head_dim, lengths, generator, monkeypatch):
    """The split kernel's last-program merge and the separate combine kernel give
    the same out and lse (fp32 rounding), rows of one split, full rows and empty rows alike, and
    every arrival counter is back at zero after the launch."""
    from flashsplit.registry import get, invalidate
    from flashsplit.triton.backend import PreparedDecode, TritonBackend

    case = DecodeCase(batch=3, seqlen_q=2, seqlen_k=600, num_heads_kv=2, group=group, head_dim=head_dim,
                      dtype=torch.float16, lengths=lengths, causal=True)
    q, k, v, seqlens = make_inputs(case, DEVICE, generator)
    results = {}
    for merge in (True, False):
        monkeypatch.setattr(TritonBackend, "merge_max_splits", 256 if merge else 0)
        invalidate()
        out, lse = flashsplit.decode(q, k, v, cache_seqlens=seqlens, num_splits=5, causal=True, return_lse=True,
                                     backend="triton")
        check_against_reference(out, lse, q, k, v, seqlens, True)
        results[merge] = (out, lse)
    invalidate()
    torch.testing.assert_close(results[True][0], results[False][0], atol=2e-3, rtol=1e-3)
    torch.testing.assert_close(results[True][1], results[False][1], atol=1e-5, rtol=1e-5)
    # The counters: one launch with a known buffer, which must end all zeros.
    backend = get("triton")
    arrivals = torch.zeros(3 * 2 * 10, dtype=torch.int32, device=DEVICE)
    monkeypatch.setattr(backend, "arrivals_for", lambda q: arrivals)
    monkeypatch.setattr(TritonBackend, "merge_max_splits", 256)
    out = torch.full_like(q, POISON)
    PreparedDecode(backend, 5, head_dim ** -0.5, True)(DecodeTensors(q, k, v, out, None, seqlens))
    check_against_reference(out, None, q, k, v, seqlens, True, head_dim ** -0.5)
    assert int(arrivals.abs().sum()) == 0


# Splits merged by the last program (3), by the combine kernel (7), one split; a paged cache.
@pytest.mark.parametrize("num_splits, page_size", [(3, 0), (7, 0), (1, 0), (3, 16)])
def test_heads_first_launch_order_gives_the_same_bits(num_splits, page_size, generator, monkeypatch):
    """Launching the split programs KV heads first (``TritonBackend.heads_first``) changes which
    programs run together, never what they compute: the same out and lse, bit for bit, as the
    splits-first order, right against the reference, with two row tiles per KV head (80 packed
    rows), rows of one split and an empty row."""
    from flashsplit.registry import invalidate
    from flashsplit.testing import to_paged
    from flashsplit.triton.backend import TritonBackend

    lengths = (300, 40, 0)
    case = DecodeCase(batch=3, seqlen_q=5, seqlen_k=300, num_heads_kv=2, group=16, head_dim=64,
                      dtype=torch.float16, lengths=lengths, causal=True)
    q, k, v, seqlens = make_inputs(case, DEVICE, generator)
    caches, table = (k, v), None
    if page_size:
        k_pages, v_pages, table, k, v = to_paged(k, v, list(lengths), page_size, generator)
        caches, table = (k_pages, v_pages), table.to(DEVICE)
    results = {}
    for heads_first in (False, True):
        monkeypatch.setattr(TritonBackend, "heads_first", heads_first)
        invalidate()
        out = torch.full_like(q, POISON)
        _, lse = flashsplit.decode(q, *caches, cache_seqlens=seqlens, block_table=table, num_splits=num_splits,
                                   causal=True, return_lse=True, out=out, backend="triton")
        check_against_reference(out, lse, q, k, v, seqlens, True)
        results[heads_first] = (out, lse)
    invalidate()
    assert torch.equal(results[True][0], results[False][0])
    assert torch.equal(results[True][1], results[False][1])


def test_heads_first_rule():
    """Split programs run KV heads first from 32 KV heads and 64 batch rows, unless forced."""
    from flashsplit.triton.backend import TritonBackend, launches_heads_first

    assert TritonBackend.heads_first is None
    assert launches_heads_first(32, 64) and launches_heads_first(64, 128)
    assert not launches_heads_first(32, 63) and not launches_heads_first(8, 64) and not launches_heads_first(16, 256)


@triton.jit
def _program_work_probe(VISITS, TILES, B, Z, HEADS_FIRST: tl.constexpr):
    """Counts each program's work item and records its row tile's counter index."""
    split, b, z, tile_index = program_work(HEADS_FIRST)
    item = (split * B + b) * Z + z
    tl.atomic_add(VISITS + item, 1)
    tl.store(TILES + item, tile_index)


@pytest.mark.parametrize("heads_first", [False, True])
def test_program_work_reaches_every_work_item_once(heads_first):
    """Each launch order's programs cover every (split, batch row, KV head x row block) once,
    and each row tile's arrival counter index is ``b * Z + z`` (what the merge relies on: one
    counter per row tile, shared by its splits alone)."""
    splits, batch, z = 3, 4, 5
    visits = torch.zeros(splits, batch, z, dtype=torch.int32, device=DEVICE)
    tiles = torch.full((splits, batch, z), -1, dtype=torch.int64, device=DEVICE)
    grid = (z, splits, batch) if heads_first else (splits, batch, z)
    _program_work_probe[grid](visits, tiles, batch, z, heads_first)
    assert torch.equal(visits, torch.ones_like(visits))
    expected = (torch.arange(batch)[:, None] * z + torch.arange(z)[None, :]).expand(splits, batch, z)
    assert torch.equal(tiles.cpu(), expected)


def test_arrival_counters_are_zeroed_once_per_stream():
    from flashsplit.workspace import ArrivalCounters

    counters = ArrivalCounters()
    a = counters.get(torch.device(DEVICE), 10)
    assert a.dtype == torch.int32 and a.numel() >= 10 and int(a.abs().sum()) == 0
    if DEVICE == "cuda":  # the stream's buffer is reused (its kernels leave it zero)
        assert counters.get(torch.device(DEVICE), 10).data_ptr() == a.data_ptr()


def test_merge_tiles_and_when_the_last_split_merges():
    """The merge loads the real rows only and as many splits per chunk as 64 registers a thread
    hold; the last split merges up to merge_max_splits splits, more take the combine kernel."""
    from flashsplit.registry import get
    from flashsplit.triton.backend import MergeTiles, PreparedDecode, merge_tiles

    assert merge_tiles(4, 128, 32) == merge_tiles(4, 128, 29) == MergeTiles(rows=4, splits=32, chunk=16)
    assert merge_tiles(1, 128, 8) == MergeTiles(1, 8, 8)  # MHA: one chunk
    assert merge_tiles(80, 128, 4) == MergeTiles(64, 4, 1)  # full 64-row tiles: a split per chunk
    assert merge_tiles(20, 256, 3) == merge_tiles(32, 256, 4)  # padded to powers of two
    backend = get("triton")
    limit = backend.merge_max_splits
    assert PreparedDecode(backend, limit, 0.1, False).merge and not PreparedDecode(backend, limit + 1, 0.1, False).merge
