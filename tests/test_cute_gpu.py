"""CuTe backend on a Hopper GPU: parity with ``flashsplit.reference``, split by split.

Skipped cleanly without CUDA, without compute capability 9.0 or without nvidia-cutlass-dsl.
The cross-backend matrix lives elsewhere; these cases aim at what is specific to this kernel:
GQA packing (groups 1/4/5/8 and several 64-row blocks), every head dim (64, 96, 128, 256; d = 96
also with Phi-3-mini's 32/32 heads and with 32/8), the last partial KV tile (lengths
1/127/129), empty rows and splits (length 0, 17 splits of a short row), NaN in cache slots
past the live length (TMA loads them), the compile cache, and paged caches (page sizes that are
multiples of the KV tile: shuffled and shared pages, NaN in unused pages, garbage page ids past
each row's last page, a block table rewritten between CUDA-graph replays), and fp8 caches
(e4m3/e5m2 with a bf16/fp16 q, scalar and per-(row, KV head) descales, dense and paged).

Run as a script for a small benchmark (device microseconds per call, CUDA-graph replay):
``python tests/test_cute_gpu.py``; ``python tests/test_cute_gpu.py smoke`` prints errors only.
"""

from __future__ import annotations

import math

import pytest
import torch

from flashsplit.call import DecodeTensors

from flashsplit.plan import split_bounds
from flashsplit.reference import attention_ref, split_partials_ref
from flashsplit.testing import (
    DecodeCase,
    check_against_reference,
    check_lse,
    make_inputs,
)

from conftest import CUTE_GPU_MARKS

pytestmark = CUTE_GPU_MARKS

# One batch row per regime: empty, one key, a tile minus one, a tile plus one, many tiles.
LENGTHS = (0, 1, 127, 129, 1000)
SEQLEN_K = 1024


def _backend():
    from flashsplit.cute.backend import CuteBackend

    return CuteBackend()


@pytest.fixture
def counter_merge(monkeypatch):
    """Splits merged through the counter at every launch size and span: the cluster rule
    (``choice.merges_in_cluster``) takes a second kernel for small launches over short spans,
    which a test of one kernel across runtime shapes must not count."""
    from flashsplit.cute import choice
    from flashsplit.registry import invalidate

    monkeypatch.setattr(choice, "CLUSTER_MERGE", False)
    invalidate()
    yield
    invalidate()


def _decode(q, k, v, seqlens, num_splits, scale, causal, out, lse, block_table=None, k_descale=None,
            v_descale=None, backend=None, **tile):
    """What ``CuteBackend.decode`` runs (the two-CTA tile, merge and swapped operands as the rules
    say), or with ``tile`` (``one_per_sm``, ``one_wave``, ``swap``) that kernel variant instead."""
    from flashsplit.call import DecodeOptions, DecodeTensors
    from flashsplit.cute import choice
    from flashsplit.cute.launcher import PreparedCuteDecode
    from flashsplit.validation import check_decode_inputs

    backend = backend or _backend()
    tensors = DecodeTensors(q, k, v, out, lse, seqlens, block_table, k_descale, v_descale)
    problem = check_decode_inputs(tensors, DecodeOptions(causal=causal, num_splits=num_splits))
    variant = choice.choose(problem, num_splits, problem.num_sms, backend.merge_max_splits,
                            **{"one_per_sm": False, "one_wave": False, **tile})
    PreparedCuteDecode(backend.launcher, variant, num_splits, scale, causal)(tensors)


@pytest.fixture
def merge_every_split_count(monkeypatch):
    """Every launch of several splits merges in the split kernel's tail (no combine kernel):
    ``CuteBackend.merge_max_splits`` = MAX_SPLITS; cached backend choices are dropped before and after."""
    from flashsplit.cute.backend import CuteBackend
    from flashsplit.plan import MAX_SPLITS
    from flashsplit.registry import invalidate

    monkeypatch.setattr(CuteBackend, "merge_max_splits", MAX_SPLITS)
    invalidate()
    yield
    invalidate()


def _cases():
    cases = []
    for head_dim in (64, 96, 128, 256):
        for seqlen_q, group in ((1, 1), (1, 4), (1, 5), (4, 8), (4, 5), (16, 8)):
            for num_splits in (1, 3, 17):
                causal = seqlen_q > 1
                cases.append(DecodeCase(len(LENGTHS), seqlen_q, SEQLEN_K, 2, group, head_dim, torch.bfloat16,
                                        LENGTHS, num_splits, causal))
    # fp16, a non-causal multi-query case and a full-length (cache_seqlens=None) case.
    cases.append(DecodeCase(len(LENGTHS), 1, SEQLEN_K, 2, 4, 128, torch.float16, LENGTHS, 3))
    cases.append(DecodeCase(len(LENGTHS), 4, SEQLEN_K, 2, 4, 128, torch.bfloat16, LENGTHS, 3, causal=False))
    cases.append(DecodeCase(2, 1, 700, 2, 4, 128, torch.bfloat16, None, 5))
    return cases


def _decode_and_check(case, **tile):
    """Decode ``case`` (NaN-poisoned outputs) with :func:`_decode`, against the reference."""
    torch.manual_seed(0)
    q, k, v, seqlens = make_inputs(case, "cuda")
    scale = 1.0 / math.sqrt(case.head_dim)
    out = torch.full_like(q, float("nan"))
    lse = torch.full((case.batch, case.num_heads, case.seqlen_q), float("nan"), device="cuda")
    _decode(q, k, v, seqlens, case.num_splits, scale, case.causal, out, lse, **tile)
    torch.cuda.synchronize()
    check_against_reference(out, lse, q, k, v, seqlens, case.causal, scale)


@pytest.mark.parametrize("case", _cases(), ids=str)
def test_decode_matches_reference(case):
    _decode_and_check(case)


# The one-CTA-per-SM tile (configs.ONE_PER_SM_TILE: dense 16-bit caches at d = 128, 3 stages).
@pytest.mark.parametrize("case", [c for c in _cases() if c.head_dim == 128], ids=str)
def test_one_per_sm_decode_matches_reference(case):
    """The d = 128 decode matrix (1/3/5/17 splits, L_q 1-16, groups 1-8, empty rows, NaN tails,
    fp16, full length) on the one-CTA-per-SM tile; launches of <= 16 splits merge in its tail."""
    _decode_and_check(case, one_per_sm=True)


def test_one_per_sm_cuda_graph_capture():
    case = DecodeCase(2, 1, 4096, 2, 4, 128, torch.bfloat16, (4000, 100), 9)
    q, k, v, seqlens = make_inputs(case, "cuda")
    out = torch.empty_like(q)
    backend = _backend()
    _decode(q, k, v, seqlens, 9, 0.1, False, out, None, backend=backend, one_per_sm=True)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _decode(q, k, v, seqlens, 9, 0.1, False, out, None, backend=backend, one_per_sm=True)
    seqlens.copy_(torch.tensor([50, 3000], dtype=torch.int32))
    graph.replay()
    torch.cuda.synchronize()
    check_against_reference(out, None, q, k, v, seqlens, False, 0.1)


@pytest.mark.parametrize("batch,seqlen_k,heads_kv", [(16, 4096, 8), (4, 131072, 8), (4, 4096, 32), (16, 40960, 8),
                                                     (1, 4096, 8), (2, 16384, 32)])
def test_one_per_sm_through_decode(batch, seqlen_k, heads_kv):
    """Through decode(), cute plans these problems on one CTA per SM and matches the reference:
    the deep tile (one split of 4k or 40k keys, no merge; 4 splits merged in the kernel's tail)
    and the swapped-operand kernel (B = 1: 16 splits merged in the kernel; 32/32 heads B = 2: 2)."""
    import flashsplit

    plan = flashsplit.plan(batch, seqlen_k, 32, heads_kv, 128, backend="cute")
    assert (plan.backend, plan.units_per_sm) == ("cute", 1), plan
    gen = torch.Generator().manual_seed(batch)
    q = torch.randn(batch, 1, 32, 128, generator=gen).to("cuda", torch.bfloat16)
    k = torch.randn(batch, seqlen_k, heads_kv, 128, generator=gen).to("cuda", torch.bfloat16)
    v = torch.randn(batch, seqlen_k, heads_kv, 128, generator=gen).to("cuda", torch.bfloat16)
    lens = torch.randint(seqlen_k // 2, seqlen_k + 1, (batch,), generator=gen, dtype=torch.int32).to("cuda")
    out, lse = flashsplit.decode(q, k, v, cache_seqlens=lens, return_lse=True, backend="cute")
    torch.cuda.synchronize()
    check_against_reference(out, lse, q, k, v, lens, False, 1.0 / math.sqrt(128))


@pytest.mark.parametrize("head_dim", [64, 96, 128, 256])
@pytest.mark.parametrize("seqlen_q,group,causal", [(1, 4, False), (4, 5, True)])
def test_partials_match_reference_split_by_split(head_dim, seqlen_q, group, causal):
    case = DecodeCase(len(LENGTHS), seqlen_q, SEQLEN_K, 2, group, head_dim, torch.bfloat16, LENGTHS, 17, causal)
    torch.manual_seed(1)
    q, k, v, seqlens = make_inputs(case, "cuda")
    scale = 1.0 / math.sqrt(head_dim)
    out_p, lse_p = _backend().forward_partials(q, k, v, seqlens, case.num_splits, scale, causal)
    torch.cuda.synchronize()
    ref_p, ref_lse_p = split_partials_ref(q, k, v, seqlens, case.num_splits, causal, scale)
    for s in range(case.num_splits):
        check_lse(lse_p[s], ref_lse_p[s])
        live = ~torch.isneginf(ref_lse_p[s]).permute(0, 2, 1)  # [B, L_q, H]
        got, want = out_p[s][live], ref_p[s].to(out_p.device)[live]
        assert not torch.isnan(got).any(), f"split {s}: NaN in a live partial"
        err = (got - want).abs().max().item() if got.numel() else 0.0
        assert err < 3e-2, f"split {s}: max error {err:.3g}"
    # Splits past the end of a short row are empty: LSE -inf, exactly as the plan says.
    for b, n in enumerate(LENGTHS):
        for s, (start, end) in enumerate(split_bounds(n, case.num_splits)):
            if start >= end:
                assert torch.isneginf(lse_p[s, b]).all(), (b, s)


@pytest.mark.parametrize("head_dim", [128, 96])
def test_combine_all_empty_and_mixed(head_dim):
    """All splits -inf gives O = 0, LSE = -inf; NaN in an empty split's O is never read (d = 96:
    a lane's columns 32 apart)."""
    from flashsplit.reference import combine_ref

    S, B, L, H, D = 5, 2, 1, 4, head_dim
    out_p = torch.randn(S, B, L, H, D, device="cuda")
    lse_p = torch.randn(S, B, H, L, device="cuda")
    lse_p[:, 0] = float("-inf")
    lse_p[2:, 1] = float("-inf")
    out_p[2:, 1] = float("nan")
    out = torch.empty(B, L, H, D, device="cuda", dtype=torch.bfloat16)
    lse = torch.empty(B, H, L, device="cuda")
    _backend().combine(out_p, lse_p, out, lse)
    torch.cuda.synchronize()
    ref, ref_lse = combine_ref(out_p, lse_p)
    assert torch.equal(out[0].float(), torch.zeros_like(out[0].float()))
    torch.testing.assert_close(out.double(), ref.to(out.device), atol=2e-2, rtol=2e-2)
    check_lse(lse, ref_lse)


# Paged caches whose page size is a multiple of the KV tile (d=64: 128 keys; d=96/128/256: 64).
PAGED_CASES = [(128, 64), (128, 128), (128, 256), (64, 128), (64, 256), (256, 64), (256, 128), (96, 64), (96, 128)]


def _paged_lengths(page_size: int) -> tuple[int, ...]:
    """Rows 0 and 1 share their first page (to_paged); a page boundary +-1 and a tile's end; empty."""
    return (1000, 2 * page_size + 1, page_size - 1, 129, 1, 0)


@pytest.mark.parametrize("head_dim,page_size", PAGED_CASES)
@pytest.mark.parametrize("seqlen_q,group,causal,num_splits", [(1, 4, False, 1), (1, 5, False, 3), (4, 8, True, 17)])
def test_paged_decode_matches_reference(head_dim, page_size, seqlen_q, group, causal, num_splits):
    """Shuffled pages, a page shared by rows 0 and 1, NaN in every slot no row uses and garbage
    block_table entries (10^6) past each row's last page: none of them may reach the output."""
    from flashsplit.testing import to_paged

    lengths = _paged_lengths(page_size)
    case = DecodeCase(len(lengths), seqlen_q, SEQLEN_K, 2, group, head_dim, torch.bfloat16, lengths, num_splits,
                      causal)
    gen = torch.Generator().manual_seed(page_size + head_dim)
    q, k, v, seqlens = make_inputs(case, "cuda", gen)
    k_pages, v_pages, table, k, v = to_paged(k, v, list(lengths), page_size, gen)
    assert int(table[0, 0]) == int(table[1, 0]), "rows 0 and 1 should share a page"
    _decode_paged_and_check(case, q, k, v, seqlens, k_pages, v_pages, table, num_splits, causal,
                            f"paged {page_size} {case}")


@pytest.mark.parametrize("page_size", [64, 256])
def test_paged_full_capacity_and_partials(page_size):
    """cache_seqlens=None: every row spans max_pages * page_size keys; partials split by split."""
    from flashsplit.testing import to_paged

    seqlen_k = 4 * page_size
    case = DecodeCase(3, 1, seqlen_k, 2, 4, 128, torch.bfloat16, None, 5)
    gen = torch.Generator().manual_seed(7)
    q, k, v, _ = make_inputs(case, "cuda", gen)
    k_pages, v_pages, table, k, v = to_paged(k, v, [seqlen_k] * 3, page_size, gen)
    scale = 1.0 / math.sqrt(128)
    out = torch.full_like(q, float("nan"))
    _backend().decode(q, k_pages, v_pages, None, 5, scale, False, out, None, block_table=table)
    out_p, lse_p = _backend().forward_partials(q, k_pages, v_pages, None, 5, scale, False, block_table=table)
    torch.cuda.synchronize()
    check_against_reference(out, None, q, k, v, None, False, scale)
    ref_p, ref_lse_p = split_partials_ref(q, k, v, None, 5, False, scale)
    for s in range(5):  # 4 pages x page_size keys in 5 splits: the last ones may be empty
        check_lse(lse_p[s], ref_lse_p[s])
        live = ~torch.isneginf(ref_lse_p[s]).permute(0, 2, 1)  # [B, L_q, H]
        got, want = out_p[s][live], ref_p[s].to(out_p.device)[live]
        err = (got - want).abs().max().item() if got.numel() else 0.0
        assert not torch.isnan(got).any() and err < 3e-2, f"split {s}: max error {err:.3g}"


def test_paged_compile_cache_and_graph_replay_with_new_table():
    """Page sizes and page counts are runtime values (one paged kernel per key), and a captured
    decode follows a block_table / cache_seqlens rewritten between replays (a serving step)."""
    _check_one_kernel_across_pages([(64, (300, 70), 1024), (128, (900, 5), 1024), (256, (1024, 0), 1024)], 128)


def _decode_paged_and_check(case, q, k, v, seqlens, k_pages, v_pages, table, num_splits, causal, what,
                            **tile) -> None:
    """cute decode over the paged cache into NaN-poisoned outputs, against the dense reference."""
    scale = 1.0 / math.sqrt(case.head_dim)
    out = torch.full_like(q, float("nan"))
    lse = torch.full((case.batch, case.num_heads, case.seqlen_q), float("nan"), device="cuda")
    _decode(q, k_pages, v_pages, seqlens, num_splits, scale, causal, out, lse, block_table=table, **tile)
    torch.cuda.synchronize()
    check_against_reference(out, lse, q, k, v, seqlens, causal, scale, what=what)


def _check_one_kernel_across_pages(cases, replay_page_size: int) -> None:
    """Decode paged caches of ``(page_size, lengths, seqlen_k)`` cases (runtime values of one
    compiled kernel), each against the reference with no new compile after the first; then a
    graph replay over pages of ``replay_page_size`` with a rewritten table."""
    from flashsplit.cute import compile_cache_size
    from flashsplit.testing import to_paged

    backend = _backend()
    sizes = []
    for page_size, lengths, seqlen_k in cases:
        case = DecodeCase(2, 1, seqlen_k, 2, 4, 128, torch.bfloat16, lengths, 3)
        gen = torch.Generator().manual_seed(page_size + seqlen_k)
        q, k, v, seqlens = make_inputs(case, "cuda", gen)
        k_pages, v_pages, table, k, v = to_paged(k, v, list(lengths), page_size, gen)
        out = torch.empty_like(q)
        backend.decode(q, k_pages, v_pages, seqlens, 3, 0.1, False, out, None, block_table=table)
        torch.cuda.synchronize()
        check_against_reference(out, None, q, k, v, seqlens, False, 0.1, what=f"pages of {page_size}")
        sizes.append(compile_cache_size())
    assert len(set(sizes)) == 1, sizes
    _check_graph_replay_with_swapped_table(backend, replay_page_size)


def _check_graph_replay_with_swapped_table(backend, page_size: int) -> None:
    """A captured decode over pages of ``page_size`` keys follows a block_table / cache_seqlens
    rewritten in place between replays (a serving step): the rows swap their page lists."""
    from flashsplit.testing import to_paged

    case = DecodeCase(2, 1, 1024, 2, 4, 128, torch.bfloat16, (1024, 1024), 9, nan_tail=False)
    gen = torch.Generator().manual_seed(3)
    q, k, v, _ = make_inputs(case, "cuda", gen)
    k_pages, v_pages, table, k, v = to_paged(k, v, [1024, 1024], page_size, gen, share_first_page=False)
    seqlens = torch.tensor([600, 200], dtype=torch.int32, device="cuda")
    out = torch.empty_like(q)
    backend.decode(q, k_pages, v_pages, seqlens, 9, 0.1, False, out, None, block_table=table)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        backend.decode(q, k_pages, v_pages, seqlens, 9, 0.1, False, out, None, block_table=table)
    table.copy_(table.flip(0).clone())
    seqlens.copy_(torch.tensor([1000, 50], dtype=torch.int32))
    graph.replay()
    torch.cuda.synchronize()
    check_against_reference(out, None, q, k.flip(0), v.flip(0), seqlens, False, 0.1)


def test_compile_cache_reused_across_runtime_shapes(counter_merge):
    from flashsplit.cute import compile_cache_size

    backend = _backend()
    sizes = []
    for batch, seqlen_k, lengths, num_splits in ((1, 512, (300,), 3), (3, 2048, (5, 2000, 0), 7), (2, 256, None, 2)):
        case = DecodeCase(batch, 1, seqlen_k, 2, 4, 128, torch.bfloat16, lengths, num_splits)
        q, k, v, seqlens = make_inputs(case, "cuda")
        out = torch.empty_like(q)
        backend.decode(q, k, v, seqlens, num_splits, 0.1, False, out, None)
        sizes.append(compile_cache_size())
    assert sizes[0] == sizes[1] == sizes[2], sizes


@pytest.mark.parametrize("head_dim", [128, 96])
def test_cuda_graph_capture(head_dim):
    case = DecodeCase(2, 1, 4096, 2, 4, head_dim, torch.bfloat16, (4000, 100), 9)
    q, k, v, seqlens = make_inputs(case, "cuda")
    out = torch.empty_like(q)
    backend = _backend()
    backend.decode(q, k, v, seqlens, 9, 0.1, False, out, None)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        backend.decode(q, k, v, seqlens, 9, 0.1, False, out, None)
    seqlens.copy_(torch.tensor([50, 3000], dtype=torch.int32))
    graph.replay()
    torch.cuda.synchronize()
    check_against_reference(out, None, q, k, v, seqlens, False, 0.1)


def bench(batch=1, seqlen_k=131072, heads=32, heads_kv=8, head_dim=128, splits=(0,), reps=20):
    """Device microseconds per decode call from CUDA-graph replay (KV far larger than L2)."""
    from flashsplit.plan import choose_num_splits

    backend = _backend()
    q = torch.randn(batch, 1, heads, head_dim, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(batch, seqlen_k, heads_kv, head_dim, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    seqlens = torch.full((batch,), seqlen_k, dtype=torch.int32, device="cuda")
    out = torch.empty_like(q)
    rows = []
    for s in splits:
        if s == 0:
            s, _ = choose_num_splits(batch * heads_kv, seqlen_k, 132, 2)
        backend.decode(q, k, v, seqlens, s, 0.1, False, out, None)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(reps):
                backend.decode(q, k, v, seqlens, s, 0.1, False, out, None)
        times = []
        for _ in range(10):
            t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            t0.record()
            graph.replay()
            t1.record()
            torch.cuda.synchronize()
            times.append(t0.elapsed_time(t1) * 1e3 / reps)
        us = sorted(times)[len(times) // 2]
        tbps = 2 * k.numel() * 2 / (us * 1e-6) / 1e12
        rows.append((batch, seqlen_k, heads, heads_kv, head_dim, s, us, tbps))
    return rows


def smoke():
    """Print errors (no asserts) for a few cases: the first thing to run on a new machine."""
    import sys
    import traceback

    from flashsplit.testing import max_abs_err

    for case in (DecodeCase(1, 1, 1024, 1, 4, 128, torch.bfloat16, (1000,), 1, nan_tail=False),
                 DecodeCase(5, 1, 1024, 2, 4, 128, torch.bfloat16, LENGTHS, 3),
                 DecodeCase(5, 4, 1024, 2, 5, 64, torch.bfloat16, LENGTHS, 17, True),
                 DecodeCase(5, 1, 1024, 2, 8, 256, torch.float16, LENGTHS, 3)):
        try:
            q, k, v, seqlens = make_inputs(case, "cuda")
            out = torch.full_like(q, float("nan"))
            lse = torch.full((case.batch, case.num_heads, case.seqlen_q), float("nan"), device="cuda")
            _backend().decode(q, k, v, seqlens, case.num_splits, 0.1, case.causal, out, lse)
            torch.cuda.synchronize()
            ref, ref_lse = attention_ref(q, k, v, seqlens, case.causal, 0.1)
            err = (out.double() - ref).abs().nan_to_num(99).amax(dim=(1, 2, 3))
            print(case, "out err per row", err.tolist(), "lse err", max_abs_err(lse, ref_lse), flush=True)
            if case.num_splits > 1:
                op, lp = _backend().forward_partials(q, k, v, seqlens, case.num_splits, 0.1, case.causal)
                rp, rl = split_partials_ref(q, k, v, seqlens, case.num_splits, case.causal, 0.1)
                print("  partial lse err", max_abs_err(lp, rl.cuda()), flush=True)
        except Exception:
            traceback.print_exc(file=sys.stdout)


if __name__ == "__main__":
    import sys

    if sys.argv[1:] == ["smoke"]:
        smoke()
        raise SystemExit
    for args in (dict(seqlen_k=131072, splits=(0, 16, 32, 48, 66, 99)), dict(seqlen_k=16384, splits=(0, 16, 33)),
                 dict(seqlen_k=4096), dict(batch=4, seqlen_k=131072), dict(batch=16, seqlen_k=16384),
                 dict(batch=64, seqlen_k=1024), dict(seqlen_k=131072, head_dim=64), dict(seqlen_k=65536, head_dim=256)):
        for row in bench(**args):
            print("B=%d Lk=%d H=%d/%d d=%d splits=%d: %.1f us, %.2f TB/s" % row, flush=True)


# fp8 caches: (head_dim, q dtype, fp8 dtype, per-(row, KV head) descales, seqlen_q, group, causal).
FP8_CASES = [
    (64, torch.bfloat16, torch.float8_e4m3fn, False, 1, 4, False),
    (128, torch.bfloat16, torch.float8_e4m3fn, True, 1, 5, False),
    (128, torch.float16, torch.float8_e5m2, True, 4, 8, True),
    (256, torch.float16, torch.float8_e4m3fn, False, 1, 4, False),
    (256, torch.bfloat16, torch.float8_e5m2, True, 4, 5, True),
    (64, torch.float16, torch.float8_e5m2, True, 1, 1, False),
    (128, torch.bfloat16, torch.float8_e5m2, False, 1, 8, False),
] + [
    # d = 96: fp16 operands (bf16 q: each q row's 12 chunks on a 16-lane run) and fp16 q.
    (96, torch.bfloat16, torch.float8_e4m3fn, True, 1, 4, False),
    (96, torch.float16, torch.float8_e5m2, True, 4, 8, True),
    (96, torch.bfloat16, torch.float8_e5m2, False, 1, 1, False),
]


def _fp8_inputs(case, fp8, per_head, seed):
    from flashsplit.testing import quantize_fp8

    gen = torch.Generator().manual_seed(seed)
    q, k, v, seqlens = make_inputs(case, "cuda", gen)  # NaN past each row's length
    k8, k_descale = quantize_fp8(k, fp8, per_head)
    v8, v_descale = quantize_fp8(v, fp8, per_head)
    return q, k8, v8, k_descale, v_descale, seqlens, gen


def _check_fp8(out, lse, q, k8, v8, k_descale, v_descale, seqlens, causal, scale, what):
    from flashsplit.reference import dequantize

    k_ref, v_ref = dequantize(k8, k_descale), dequantize(v8, v_descale)  # what the kernel attends to
    check_against_reference(out, lse, q, k_ref, v_ref, seqlens, causal, scale, what=what)


def _decode_fp8_and_check(head_dim, dtype, fp8, per_head, seqlen_q, group, causal, num_splits, **tile) -> None:
    """Dense fp8 K/V (NaN past each row's length, including the converted tail of the last
    tile), lengths 0/1/tile-1/tile+1/many, against attention over ``cache * descale``; with
    ``tile`` (:func:`_decode`'s), that kernel variant."""
    lengths = (0, 1, 63, 65, 127, 129, 1000)
    case = DecodeCase(len(lengths), seqlen_q, SEQLEN_K, 2, group, head_dim, dtype, lengths, num_splits, causal)
    q, k8, v8, k_descale, v_descale, seqlens, _ = _fp8_inputs(case, fp8, per_head, head_dim + num_splits)
    scale = 1.0 / math.sqrt(head_dim)
    out = torch.full_like(q, float("nan"))
    lse = torch.full((case.batch, case.num_heads, case.seqlen_q), float("nan"), device="cuda")
    if tile:
        _decode(q, k8, v8, seqlens, num_splits, scale, causal, out, lse, k_descale=k_descale, v_descale=v_descale,
                **tile)
    else:
        _backend().decode(q, k8, v8, seqlens, num_splits, scale, causal, out, lse,
                          k_descale=k_descale, v_descale=v_descale)
    torch.cuda.synchronize()
    _check_fp8(out, lse, q, k8, v8, k_descale, v_descale, seqlens, causal, scale, f"fp8 {fp8} {case} {tile}")


@pytest.mark.parametrize("head_dim,dtype,fp8,per_head,seqlen_q,group,causal", FP8_CASES, ids=str)
@pytest.mark.parametrize("num_splits", [1, 3, 17])
def test_fp8_decode_matches_reference(head_dim, dtype, fp8, per_head, seqlen_q, group, causal, num_splits):
    """e4m3/e5m2 with bf16 q (fp16 wgmma operands: q rows scaled by powers of two) and fp16 q."""
    _decode_fp8_and_check(head_dim, dtype, fp8, per_head, seqlen_q, group, causal, num_splits)


@pytest.mark.parametrize("head_dim,dtype,fp8,per_head,seqlen_q,group,causal",
                         [c for c in FP8_CASES if c[0] % 64 == 0 and c[4] * c[5] <= 8], ids=str)
@pytest.mark.parametrize("num_splits", [1, 3, 17])
def test_fp8_few_rows_on_both_consumers(head_dim, dtype, fp8, per_head, seqlen_q, group, causal, num_splits):
    """1-8 packed rows of an fp8 cache on the swapped-operand consumer (what a one-wave launch
    runs: staged tiles converted into its operand buffers, a bf16 q's row scales per column) and
    on the 64-row kernel (what a launch of several waves runs)."""
    _decode_fp8_and_check(head_dim, dtype, fp8, per_head, seqlen_q, group, causal, num_splits, swap=True)
    _decode_fp8_and_check(head_dim, dtype, fp8, per_head, seqlen_q, group, causal, num_splits, swap=False)


@pytest.mark.parametrize("head_dim,page_size", [(128, 64), (64, 128), (256, 128), (96, 64)])
@pytest.mark.parametrize("fp8", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_fp8_paged_decode_matches_reference(head_dim, page_size, fp8):
    """Paged fp8 caches (shuffled and shared pages, NaN in unused pages, garbage page ids)."""
    lengths = (1000, 2 * page_size + 1, page_size - 1, 129, 1, 0)
    _decode_fp8_paged_and_check(head_dim, page_size, fp8, lengths, page_size, f"paged fp8 {page_size}")


def _decode_fp8_paged_and_check(head_dim, page_size, fp8, lengths, seed, what) -> None:
    """cute decode (3 splits) over a paged fp8 cache of rows ``lengths`` (per-head descales),
    against the reference on the dequantized cache."""
    from flashsplit.testing import to_paged

    case = DecodeCase(len(lengths), 1, SEQLEN_K, 2, 4, head_dim, torch.bfloat16, lengths, 3)
    q, k8, v8, k_descale, v_descale, seqlens, gen = _fp8_inputs(case, fp8, True, seed)
    k_pages, v_pages, table, k8, v8 = to_paged(k8, v8, list(lengths), page_size, gen)
    scale = 1.0 / math.sqrt(head_dim)
    out = torch.full_like(q, float("nan"))
    _backend().decode(q, k_pages, v_pages, seqlens, 3, scale, False, out, None, block_table=table,
                      k_descale=k_descale, v_descale=v_descale)
    torch.cuda.synchronize()
    _check_fp8(out, None, q, k8, v8, k_descale, v_descale, seqlens, False, scale, what)


@pytest.mark.parametrize("head_dim,swap", [(64, True), (128, True), (256, True), (64, False), (96, False),
                                           (128, False), (256, False)])
def test_fp16_operands_scale_q_rows_of_any_magnitude(head_dim, swap):
    """Rows of q far above and below 1 (2^12, 2^-12, beyond fp16's range unscaled: 3e5 * d^0.5
    scores), and an all-zero row, through the per-row power-of-two scaling of the fp16 operands
    (bf16 q, e4m3 cache), on the swapped-operand consumer (8 packed rows: each column its own
    scale) and on the 64-row kernel."""
    case = DecodeCase(3, 2, 1024, 2, 4, head_dim, torch.bfloat16, (1024, 300, 65), 3)
    q, k8, v8, k_descale, v_descale, seqlens, _ = _fp8_inputs(case, torch.float8_e4m3fn, True, 7)
    q[:, :, 0] *= 4096.0
    q[:, :, 1] *= 1.0 / 4096.0
    q[0, 0, 2] = 0.0
    q[1, 1, 3] = 3e5
    scale = 1.0 / math.sqrt(head_dim) / 64.0  # keep the 3e5 row's softmax finite in the reference
    out = torch.full_like(q, float("nan"))
    lse = torch.full((case.batch, case.num_heads, case.seqlen_q), float("nan"), device="cuda")
    _decode(q, k8, v8, seqlens, 3, scale, False, out, lse, k_descale=k_descale, v_descale=v_descale, swap=swap)
    torch.cuda.synchronize()
    _check_fp8(out, lse, q, k8, v8, k_descale, v_descale, seqlens, False, scale, f"fp16 operands, scaled rows, {swap=}")


@pytest.mark.parametrize("head_dim,page_size", [(128, 64), (128, 16), (64, 24), (256, 5), (96, 16), (96, 24)])
def test_fp16_operands_fp8_paged(head_dim, page_size):
    """Whole-tile, sub-tile and gathered pages with fp16 operands (bf16 q, e4m3, per-head descales)."""
    lengths = (1000, 2 * page_size + 1, 129, 1, 0)
    _decode_fp8_paged_and_check(head_dim, page_size, torch.float8_e4m3fn, lengths, page_size + 11,
                                f"fp16 operands, pages of {page_size}")


def test_fp8_through_decode_api():
    """``flashsplit.decode(backend="cute")`` on an fp8 cache, scalar descales, several splits."""
    import flashsplit

    case = DecodeCase(3, 1, 2048, 2, 4, 128, torch.bfloat16, (2048, 700, 0), 0)
    q, k8, v8, k_descale, v_descale, seqlens, _ = _fp8_inputs(case, torch.float8_e4m3fn, False, 3)
    out, lse = flashsplit.decode(q, k8, v8, cache_seqlens=seqlens, k_descale=k_descale, v_descale=v_descale,
                                 backend="cute", return_lse=True)
    torch.cuda.synchronize()
    _check_fp8(out, lse, q, k8, v8, k_descale, v_descale, seqlens, False, 1.0 / math.sqrt(128), "decode api")


# Pages smaller than the KV tile (sub-tile paging: tile_n / P TMA boxes per K/V tile).
SUBTILE_CASES = [(128, 8), (128, 16), (128, 32), (64, 8), (64, 16), (64, 32), (64, 64), (256, 8), (256, 16),
                 (256, 32), (96, 8), (96, 16), (96, 32)]


def _subtile_lengths(page_size: int, tile_n: int) -> tuple[int, ...]:
    """Rows 0 and 1 share their first page; lengths around a page (P-1, P+1, 2P+1), inside a
    tile's last box, a tile -1 and a tile plus a partial page; 1 and 0 keys."""
    return (1000, 2 * page_size + 1, page_size - 1, page_size + 1, tile_n - 1, tile_n + page_size + 3, 129, 1, 0)


def _subtile_inputs(head_dim, page_size, seqlen_q, group, causal, num_splits, seed, dtype=torch.bfloat16,
                    seqlen_k=SEQLEN_K):
    from flashsplit.cute.configs import split_tile
    from flashsplit.testing import to_paged

    lengths = _subtile_lengths(page_size, split_tile(head_dim)[0])
    case = DecodeCase(len(lengths), seqlen_q, seqlen_k, 2, group, head_dim, dtype, lengths, num_splits, causal)
    gen = torch.Generator().manual_seed(seed)
    q, k, v, seqlens = make_inputs(case, "cuda", gen)
    k_pages, v_pages, table, k, v = to_paged(k, v, list(lengths), page_size, gen)
    assert int(table[0, 0]) == int(table[1, 0]), "rows 0 and 1 should share a page"
    return case, q, k, v, seqlens, k_pages, v_pages, table


@pytest.mark.parametrize("head_dim,page_size", SUBTILE_CASES)
@pytest.mark.parametrize("seqlen_q,group,causal,num_splits", [(1, 4, False, 1), (1, 5, False, 3), (4, 8, True, 17)])
def test_subtile_paged_decode_matches_reference(head_dim, page_size, seqlen_q, group, causal, num_splits):
    """Pages of 8/16/32 (d=64 also 64) keys: shuffled pages, a page shared by rows 0 and 1, NaN
    in every slot no row uses and garbage block_table entries (10^6) past each row's last page."""
    case, q, k, v, seqlens, k_pages, v_pages, table = _subtile_inputs(
        head_dim, page_size, seqlen_q, group, causal, num_splits, page_size + head_dim + num_splits)
    _decode_paged_and_check(case, q, k, v, seqlens, k_pages, v_pages, table, num_splits, causal,
                            f"subtile paged {page_size} {case}")


@pytest.mark.parametrize("head_dim,page_size", [(128, 8), (128, 32), (64, 16), (256, 16), (96, 16)])
def test_subtile_paged_partials_split_by_split(head_dim, page_size):
    case, q, k, v, seqlens, k_pages, v_pages, table = _subtile_inputs(head_dim, page_size, 1, 4, False, 17, 11)
    scale = 1.0 / math.sqrt(head_dim)
    out_p, lse_p = _backend().forward_partials(q, k_pages, v_pages, seqlens, 17, scale, False, block_table=table)
    torch.cuda.synchronize()
    ref_p, ref_lse_p = split_partials_ref(q, k, v, seqlens, 17, False, scale)
    for s in range(17):
        check_lse(lse_p[s], ref_lse_p[s])
        live = ~torch.isneginf(ref_lse_p[s]).permute(0, 2, 1)  # [B, L_q, H]
        got, want = out_p[s][live], ref_p[s].to(out_p.device)[live]
        err = (got - want).abs().max().item() if got.numel() else 0.0
        assert not torch.isnan(got).any() and err < 3e-2, f"split {s}: max error {err:.3g}"


@pytest.mark.parametrize("page_size", [8, 16, 32])
def test_subtile_paged_narrow_table_full_capacity(page_size):
    """A block table exactly as wide as the longest row's pages (its last tile is partial, so a
    kernel reading entries of boxes past the row's end would read past the table), the long row
    last in memory; and cache_seqlens=None (every row spans the table)."""
    head_dim, lengths = 128, (300, 1000 + page_size // 2)
    max_pages = -(-max(lengths) // page_size)
    case = DecodeCase(2, 1, max_pages * page_size, 2, 4, head_dim, torch.bfloat16, lengths, 3)
    gen = torch.Generator().manual_seed(page_size)
    q, k, v, seqlens = make_inputs(case, "cuda", gen)
    from flashsplit.testing import to_paged

    k_pages, v_pages, table, k, v = to_paged(k, v, list(lengths), page_size, gen, share_first_page=False)
    assert table.shape[1] == max_pages and int(table[1, -1]) != 10**6
    scale = 1.0 / math.sqrt(head_dim)
    out = torch.full_like(q, float("nan"))
    _backend().decode(q, k_pages, v_pages, seqlens, 3, scale, False, out, None, block_table=table)
    torch.cuda.synchronize()
    check_against_reference(out, None, q, k, v, seqlens, False, scale, what=f"narrow table {page_size}")

    # Full capacity: fill row 0's remaining pages too, then attend over every slot of both rows.
    full = [max_pages * page_size] * 2
    case = DecodeCase(2, 1, max_pages * page_size, 2, 4, head_dim, torch.bfloat16, None, 5)
    q, k, v, _ = make_inputs(case, "cuda", gen)
    k_pages, v_pages, table, k, v = to_paged(k, v, full, page_size, gen, share_first_page=False)
    out = torch.full_like(q, float("nan"))
    _backend().decode(q, k_pages, v_pages, None, 5, scale, False, out, None, block_table=table)
    torch.cuda.synchronize()
    check_against_reference(out, None, q, k, v, None, False, scale, what=f"full capacity {page_size}")


@pytest.mark.parametrize("head_dim,page_size", [
    pytest.param(128, 16, id="subtile-128-16"), pytest.param(64, 8, id="subtile-64-8"),
    pytest.param(256, 32, id="subtile-256-32"), pytest.param(128, 1, id="gather-128-1"),
    pytest.param(64, 48, id="gather-64-48"), pytest.param(256, 7, id="gather-256-7"),
    pytest.param(96, 16, id="subtile-96-16"), pytest.param(96, 24, id="gather-96-24"),
])
@pytest.mark.parametrize("fp8", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_small_page_fp8_paged_decode_matches_reference(head_dim, page_size, fp8):
    """fp8 caches with pages smaller than the tile: sub-boxes (8/16/32 keys) or gathered rows
    (any other size) into the fp8 staging slots."""
    from flashsplit.cute.configs import split_tile

    lengths = _subtile_lengths(page_size, split_tile(head_dim)[0])
    _decode_fp8_paged_and_check(head_dim, page_size, fp8, lengths, page_size + head_dim, f"fp8 pages of {page_size}")


def test_subtile_compile_cache_and_graph_replay_with_new_table(counter_merge):
    """One kernel per sub-tile page size (page counts stay runtime values), and a captured decode
    follows a block_table / cache_seqlens rewritten between replays."""
    _check_one_kernel_across_pages([(16, (300, 70), 512), (16, (900, 5), 1024), (16, (1024, 0), 2048)], 8)


def test_subtile_through_decode_api():
    """``flashsplit.decode(backend="cute")`` on 16-key pages."""
    import flashsplit
    from flashsplit.testing import to_paged

    lengths = (2048, 700, 0)
    case = DecodeCase(3, 1, 2048, 2, 4, 128, torch.bfloat16, lengths, 0)
    gen = torch.Generator().manual_seed(5)
    q, k, v, seqlens = make_inputs(case, "cuda", gen)
    k_pages, v_pages, table, k, v = to_paged(k, v, list(lengths), 16, gen)
    out, lse = flashsplit.decode(q, k_pages, v_pages, cache_seqlens=seqlens, block_table=table, backend="cute",
                                 return_lse=True)
    torch.cuda.synchronize()
    check_against_reference(out, lse, q, k, v, seqlens, False, 1.0 / math.sqrt(128), what="subtile decode api")


# Pages the cute kernel gathers row by row (neither whole-tile nor sub-tile sizes: one bulk copy
# per key row into the staging slots).
GATHER_CASES = [(128, 1), (128, 3), (128, 24), (128, 48), (128, 96), (64, 5), (64, 48), (64, 200), (256, 7),
                (256, 40), (96, 5), (96, 24)]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("head_dim,page_size", GATHER_CASES)
@pytest.mark.parametrize("seqlen_q,group,causal,num_splits", [(1, 4, False, 1), (1, 5, False, 3), (4, 8, True, 17)])
def test_gather_paged_decode_matches_reference(dtype, head_dim, page_size, seqlen_q, group, causal, num_splits):
    """Shuffled pages of any size, a page shared by rows 0 and 1, NaN in every slot no row uses
    and garbage block_table entries (10^6) past each row's last page."""
    case, q, k, v, seqlens, k_pages, v_pages, table = _subtile_inputs(
        head_dim, page_size, seqlen_q, group, causal, num_splits, page_size + head_dim + num_splits, dtype)
    _decode_paged_and_check(case, q, k, v, seqlens, k_pages, v_pages, table, num_splits, causal,
                            f"gathered paged {page_size} {case}")


def test_gather_one_kernel_for_every_page_size_and_graph_replay():
    """The gathered kernel's page size is a runtime value (pages of 1, 3, 24 and 48 share one
    compiled kernel), and a captured decode follows a rewritten block table."""
    _check_one_kernel_across_pages([(p, (700, 65), 1024) for p in (1, 3, 24, 48)], 5)


# The split kernel's last-CTA merge: launches of 2..CuteBackend.merge_max_splits splits merge
# by default; merge_every_split_count makes every launch of several splits below one kernel.
@pytest.mark.parametrize("case", [c for c in _cases() if c.num_splits > 1], ids=str)
def test_merge_decode_matches_reference(case, merge_every_split_count):
    """The decode matrix with 3, 5 and 17 splits: empty rows and empty splits (lengths 0/1),
    1-128 packed rows per KV head (one warp merges rows w, w + 4, ...; two row tiles at 16 x 8)."""
    _decode_and_check(case)


@pytest.mark.parametrize("head_dim", [64, 96, 128, 256])
@pytest.mark.parametrize("num_splits", [32, 64, 256])
def test_merge_many_splits(head_dim, num_splits, merge_every_split_count):
    """Split counts past one register chunk (d = 128: 16 splits a round trip) and past the 32
    LSEs a lane holds per register; the longest row fills all 256 splits of 128 keys."""
    lengths = (32768, 5000, 129)
    case = DecodeCase(len(lengths), 1, 32768, 2, 4, head_dim, torch.bfloat16, lengths, num_splits)
    _decode_and_check(case)


def test_merge_counters_reset_between_calls_and_streams():
    """The last CTA sets each arrival counter back to 0: back-to-back calls (new inputs, other
    split counts, another stream) all match the reference."""
    backend = _backend()
    side = torch.cuda.Stream()
    for i, (num_splits, stream) in enumerate([(3, None), (3, None), (7, None), (3, side), (7, side), (3, None)]):
        case = DecodeCase(3, 1, 2048, 2, 4, 128, torch.bfloat16, (2000, 700, 1), num_splits)
        q, k, v, seqlens = make_inputs(case, "cuda", torch.Generator().manual_seed(i))
        out = torch.full_like(q, float("nan"))
        with torch.cuda.stream(stream or torch.cuda.current_stream()):
            backend.decode(q, k, v, seqlens, num_splits, 0.1, False, out, None)
        torch.cuda.synchronize()
        check_against_reference(out, None, q, k, v, seqlens, False, 0.1, what=f"call {i}")


@pytest.mark.parametrize("head_dim,dtype,fp8,per_head,seqlen_q,group,causal",
                         FP8_CASES[:4] + [c for c in FP8_CASES if c[0] == 96][:2], ids=str)
@pytest.mark.parametrize("num_splits", [3, 17])
def test_merge_fp8(head_dim, dtype, fp8, per_head, seqlen_q, group, causal, num_splits, merge_every_split_count):
    _decode_fp8_and_check(head_dim, dtype, fp8, per_head, seqlen_q, group, causal, num_splits)


@pytest.mark.parametrize("head_dim", [128, 96])
@pytest.mark.parametrize("page_size", [128, 16, 48])
def test_merge_paged(head_dim, page_size, merge_every_split_count):
    """Whole-tile, sub-tile and gathered pages with the merge (17 splits, 4 x 8 packed rows)."""
    case, q, k, v, seqlens, k_pages, v_pages, table = _subtile_inputs(head_dim, page_size, 4, 8, True, 17,
                                                                      page_size)
    _decode_paged_and_check(case, q, k, v, seqlens, k_pages, v_pages, table, 17, True, f"merged pages of {page_size}")


def test_merge_through_decode_api(merge_every_split_count):
    """flashsplit.decode(backend="cute") with the heuristic's split count (B = 1, 32 splits at 8k
    keys for 8 KV heads) and lse returned."""
    import flashsplit

    gen = torch.Generator().manual_seed(11)
    q = torch.randn(1, 1, 32, 128, generator=gen).to("cuda", torch.bfloat16)
    k = torch.randn(1, 8192, 8, 128, generator=gen).to("cuda", torch.bfloat16)
    v = torch.randn(1, 8192, 8, 128, generator=gen).to("cuda", torch.bfloat16)
    assert flashsplit.plan(1, 8192, 32, 8, 128, has_cache_seqlens=False, backend="cute").num_splits > 4
    out, lse = flashsplit.decode(q, k, v, backend="cute", return_lse=True)
    torch.cuda.synchronize()
    check_against_reference(out, lse, q, k, v, None, False, 1.0 / math.sqrt(128))


# The one-CTA-per-SM tile over TMA pages (whole-tile and sub-tile).
@pytest.mark.parametrize("page_size", [128, 64, 16, 8])
@pytest.mark.parametrize("seqlen_q,group,causal,num_splits", [(1, 4, False, 1), (1, 5, False, 3), (4, 8, True, 17)])
def test_one_per_sm_paged(page_size, seqlen_q, group, causal, num_splits):
    case, q, k, v, seqlens, k_pages, v_pages, table = _subtile_inputs(128, page_size, seqlen_q, group, causal,
                                                                      num_splits, page_size + num_splits)
    _decode_paged_and_check(case, q, k, v, seqlens, k_pages, v_pages, table, num_splits, causal,
                            f"one CTA per SM, pages of {page_size}", one_per_sm=True)


# Three stages for merging launches in one wave (configs.ONE_WAVE_STAGES; the rule in
# choice.one_wave_merge): the d = 128 matrix's merging launches (3 and 5 splits: empty
# splits and rows, partial last tiles of 1/127/129 keys, L_q 1-16, groups 1-8) on that kernel.
@pytest.mark.parametrize("case", [c for c in _cases() if c.head_dim == 128 and 1 < c.num_splits <= 16], ids=str)
def test_one_wave_decode_matches_reference(case):
    _decode_and_check(case, one_wave=True)


def test_one_wave_through_prepare_and_graph_replay():
    """B = 4, 8 KV heads, 4k keys: the plan's 4 splits (128 CTAs, the swapped-operand kernel at
    one CTA per SM) take the 3-stage kernel and merge in its tail; a captured decode follows new
    cache_seqlens (NaN past each row's longest length)."""
    import flashsplit
    from flashsplit.cute import choice
    from flashsplit.cute.backend import CuteBackend
    from flashsplit.plan import device_num_sms

    case = DecodeCase(4, 1, 4096, 8, 4, 128, torch.bfloat16, (4000, 3000, 129, 1), 0)
    problem = case.problem()
    backend = CuteBackend()
    num_sms = device_num_sms("cuda")
    splits = choice.planned_split(problem, problem.work_units(64), backend.units_per_sm(problem), num_sms)[0]
    assert splits == 4 and choice.one_wave_merge(problem, splits, num_sms)
    q, k, v, seqlens = make_inputs(case, "cuda", torch.Generator().manual_seed(3))
    prepared = backend.prepare(problem, splits, 0.1)
    assert prepared.tile.one_wave and prepared.tile.merge
    out = torch.full_like(q, float("nan"))
    prepared(DecodeTensors(q, k, v, out, None, seqlens))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        prepared(DecodeTensors(q, k, v, out, None, seqlens))
    for lengths in ((4000, 3000, 129, 1), (1, 0, 128, 1), (3999, 2999, 0, 0)):
        seqlens.copy_(torch.tensor(lengths, dtype=torch.int32))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        check_against_reference(out, None, q, k, v, seqlens, False, 0.1, what=f"lengths {lengths}")
    out2 = flashsplit.decode(q, k, v, cache_seqlens=seqlens, backend="cute")
    torch.cuda.synchronize()
    check_against_reference(out2, None, q, k, v, seqlens, False, 1.0 / math.sqrt(128))


@pytest.mark.parametrize("head_dim", [64, 96, 128, 256])
@pytest.mark.parametrize("num_splits", [32, 33, 64, 256])
def test_combine_many_splits(head_dim, num_splits):
    """The combine kernel at split counts past the splits a row holds in flight (32; 64 at
    d = 64): further chunks, and LSEs past one register per lane; empty rows and splits."""
    lengths = (32768, 5000, 129, 0)
    case = DecodeCase(len(lengths), 1, 32768, 2, 4, head_dim, torch.bfloat16, lengths, num_splits)
    _decode_and_check(case)


# Swapped operands for 1-8 packed rows (configs.SplitConfig.swap_rows: S^T = K Q^T, O^T = V^T P^T),
# which the launches below take where choice.swaps (one wave) says.
def _swap_cases():
    """1-8 packed rows (L_q x group): one query with groups 1/4/5/8, causal L_q 2-8 with groups
    1-4 (bottom-right masks differ per column), every head dim, 1/3/17 splits, the shared
    lengths (0, 1, tile +- 1, ..., NaN past them)."""
    cases = []
    for head_dim in (64, 128, 256):
        for seqlen_q, group in ((1, 1), (1, 4), (1, 5), (1, 8), (2, 4), (4, 2), (8, 1), (3, 2)):
            for num_splits in (1, 3, 17):
                cases.append(DecodeCase(len(LENGTHS), seqlen_q, SEQLEN_K, 2, group, head_dim, torch.bfloat16,
                                        LENGTHS, num_splits, seqlen_q > 1))
    cases.append(DecodeCase(len(LENGTHS), 1, SEQLEN_K, 2, 4, 128, torch.float16, LENGTHS, 3))
    cases.append(DecodeCase(len(LENGTHS), 4, SEQLEN_K, 2, 2, 128, torch.bfloat16, LENGTHS, 3, causal=False))
    cases.append(DecodeCase(2, 1, 700, 2, 4, 128, torch.bfloat16, None, 5))
    return cases


@pytest.mark.parametrize("case", _swap_cases(), ids=str)
def test_swap_decode_matches_reference(case):
    _decode_and_check(case)


@pytest.mark.parametrize("case", [c for c in _swap_cases() if c.head_dim == 128 and c.num_splits > 1][:6], ids=str)
def test_swap_one_wave_and_one_per_sm_tiles(case):
    _decode_and_check(case, one_wave=True)
    _decode_and_check(case, one_per_sm=True)


@pytest.mark.parametrize("head_dim,page_size", [(128, 128), (128, 64), (128, 16), (128, 8), (64, 128), (256, 16)])
@pytest.mark.parametrize("seqlen_q,group,causal,num_splits", [(1, 5, False, 3), (2, 4, True, 17)])
def test_swap_paged(head_dim, page_size, seqlen_q, group, causal, num_splits):
    """Whole-tile and sub-tile pages under the swapped-operand consumer."""
    case, q, k, v, seqlens, k_pages, v_pages, table = _subtile_inputs(head_dim, page_size, seqlen_q, group, causal,
                                                                      num_splits, page_size + num_splits + 2)
    _decode_paged_and_check(case, q, k, v, seqlens, k_pages, v_pages, table, num_splits, causal,
                            f"swapped operands, pages of {page_size}")


@pytest.mark.parametrize("case", [c for c in _cases() if c.seqlen_q * c.group <= 8], ids=str)
def test_64_row_kernel_for_few_rows(case):
    """1-8 packed rows on the 64-row kernel (what launches of several waves run)."""
    _decode_and_check(case, swap=False)


# Head dim 96 (Phi-3-mini: 32 q heads, 32 KV heads): the 64-row consumer for every row count (the
# swapped one needs whole 64-row M blocks of the head dim), 64-byte-swizzled tiles.
PHI3_HEADS = [(32, 1), (8, 4)]  # (KV heads, q heads per KV head): 32/32 and 32/8


@pytest.mark.parametrize("heads_kv,group", PHI3_HEADS, ids=["32-32", "32-8"])
@pytest.mark.parametrize("seqlen_q", [1, 4])
@pytest.mark.parametrize("num_splits", [1, 3, 17])
def test_head_dim_96_model_heads(heads_kv, group, seqlen_q, num_splits):
    """Phi-3-mini's heads (and a GQA 32/8 layout) at d = 96: empty rows, partial last tiles, NaN
    past each length; 3 splits merge in the kernel's tail, 17 go to the combine kernel."""
    lengths = (1000, 129, 1, 0)
    case = DecodeCase(len(lengths), seqlen_q, SEQLEN_K, heads_kv, group, 96, torch.bfloat16, lengths, num_splits,
                      seqlen_q > 1)
    _decode_and_check(case)


@pytest.mark.parametrize("heads_kv,group", PHI3_HEADS, ids=["32-32", "32-8"])
@pytest.mark.parametrize("page_size", [16, 24, 64])
def test_head_dim_96_model_heads_paged(heads_kv, group, page_size):
    """Sub-tile (16), gathered (24) and whole-tile (64) pages at d = 96 with Phi-3-mini's heads."""
    from flashsplit.testing import to_paged

    lengths = (1000, 2 * page_size + 1, 1, 0)
    case = DecodeCase(len(lengths), 1, SEQLEN_K, heads_kv, group, 96, torch.bfloat16, lengths, 3)
    gen = torch.Generator().manual_seed(page_size)
    q, k, v, seqlens = make_inputs(case, "cuda", gen)
    k_pages, v_pages, table, k, v = to_paged(k, v, list(lengths), page_size, gen)
    _decode_paged_and_check(case, q, k, v, seqlens, k_pages, v_pages, table, 3, False, f"d96 pages of {page_size}")


def test_head_dim_96_swapped_operands_refused():
    """d = 96 with 1-8 packed rows runs the 64-row consumer (the launch choice never swaps), and
    asking for the swapped consumer is a clear error, not a wrong answer."""
    from flashsplit.cute import choice

    case = DecodeCase(2, 1, 1024, 8, 4, 96, torch.bfloat16, (1000, 5), 3)
    assert not choice.choose(case.problem(), 3, 132).swap
    q, k, v, seqlens = make_inputs(case, "cuda")
    out = torch.full_like(q, float("nan"))
    with pytest.raises(ValueError, match="swap_rows"):
        _decode(q, k, v, seqlens, 3, 0.1, False, out, None, swap=True)


def test_head_dim_96_through_the_api_and_graph_replay():
    """``flashsplit.decode`` at d = 96 (cute named, and auto), 16-key pages, then a captured
    decode that follows a rewritten block table and new lengths."""
    import flashsplit
    from flashsplit.testing import to_paged

    lengths = (2048, 700, 0)
    case = DecodeCase(3, 1, 2048, 32, 1, 96, torch.bfloat16, lengths, 0)
    gen = torch.Generator().manual_seed(96)
    q, k, v, seqlens = make_inputs(case, "cuda", gen)
    k_pages, v_pages, table, k, v = to_paged(k, v, list(lengths), 16, gen, share_first_page=False)
    scale = 1.0 / math.sqrt(96)
    for backend in ("cute", "auto"):
        out, lse = flashsplit.decode(q, k_pages, v_pages, cache_seqlens=seqlens, block_table=table, backend=backend,
                                     return_lse=True)
        torch.cuda.synchronize()
        check_against_reference(out, lse, q, k, v, seqlens, False, scale, what=f"d96 {backend}")
    out = torch.full_like(q, float("nan"))
    kwargs = dict(cache_seqlens=seqlens, block_table=table, backend="cute", out=out, num_splits=5)
    flashsplit.decode(q, k_pages, v_pages, **kwargs)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        flashsplit.decode(q, k_pages, v_pages, **kwargs)
    table.copy_(table[[2, 0, 1]].clone())
    seqlens.copy_(torch.tensor([0, 2000, 650], dtype=torch.int32, device="cuda"))
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    check_against_reference(out, None, q, k[[2, 0, 1]], v[[2, 0, 1]], seqlens, False, scale, what="d96 replay")


def _launch_switch_inputs(gen, batch, seqlen_k, heads, head_dim, seqlen_q, lengths, page_size):
    """``(q, k, v, lens, caches, table)`` in bf16 on the GPU for the launch-switch tests below:
    ``caches`` the dense k/v, or (``page_size``) their pages with ``table`` (``k``/``v`` then the
    dense cache the pages hold, for the reference)."""
    from flashsplit.testing import to_paged

    q = torch.randn(batch, seqlen_q, heads[0], head_dim, generator=gen).to("cuda", torch.bfloat16)
    k = torch.randn(batch, seqlen_k, heads[1], head_dim, generator=gen).to("cuda", torch.bfloat16)
    v = torch.randn(batch, seqlen_k, heads[1], head_dim, generator=gen).to("cuda", torch.bfloat16)
    lens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    caches, table = (k, v), None
    if page_size:
        k_pages, v_pages, table, k, v = to_paged(k, v, lengths, page_size, gen)
        caches, table = (k_pages, v_pages), table.cuda()
    return q, k, v, lens, caches, table


def _same_bits_both_ways(monkeypatch, switch: str, decode_once) -> None:
    """``decode_once(setting) -> (out, lse)`` with ``choice.<switch>`` False, then True (the
    prepared launchers dropped around each): both outputs bitwise equal."""
    from flashsplit.cute import choice
    from flashsplit.registry import invalidate

    results = []
    for setting in (False, True):
        monkeypatch.setattr(choice, switch, setting)
        invalidate()
        results.append(decode_once(setting))
    invalidate()
    assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1])


# CTAs launched KV heads first (choice.HEADS_FIRST): one split, merged splits (two CTAs per SM,
# one per SM, swapped operands), splits past the merge (the combine), batch-invariant runs of
# splits, TMA pages.
@pytest.mark.parametrize("batch, seqlen_k, heads, num_splits, extra", [
    (3, 3000, (32, 8), 1, {}), (3, 3000, (32, 8), 6, {}), (1, 8192, (32, 8), 32, {}),
    (3, 3000, (32, 4), 6, {}), (2, 20000, (16, 16), 4, {}), (3, 3000, (32, 8), 0, {"batch_invariant": True}),
    (3, 3072, (32, 8), 6, {"page_size": 16}), (3, 3072, (32, 8), 6, {"page_size": 128}),
])
def test_heads_first_gives_the_same_bits(batch, seqlen_k, heads, num_splits, extra, monkeypatch):
    """The launch order changes which CTAs run together, never what each computes: out and lse
    are bitwise those of splits first, and right against the reference."""
    import flashsplit

    extra = dict(extra)
    gen = torch.Generator().manual_seed(5)
    q, k, v, lens, caches, table = _launch_switch_inputs(gen, batch, seqlen_k, heads, 128, 1,
                                                         [seqlen_k, seqlen_k // 3, 1][:batch],
                                                         extra.pop("page_size", 0))

    def decode_once(heads_first):
        out = torch.full_like(q, float("nan"))
        _, lse = flashsplit.decode(q, *caches, cache_seqlens=lens, block_table=table, num_splits=num_splits,
                                   out=out, return_lse=True, backend="cute", **extra)
        torch.cuda.synchronize()
        check_against_reference(out, lse, q, k, v, lens, False, 128 ** -0.5)
        return out, lse

    _same_bits_both_ways(monkeypatch, "HEADS_FIRST", decode_once)


# Splits merged through one thread-block cluster (choice.CLUSTER_MERGE): B = 1 and 2 at 32/8
# heads (16 and 8 splits), causal queries filling the 8 swapped rows, sinks, d = 64, TMA pages,
# 1k and 64k keys in 8 splits (the rule's cells: choice.cluster_split_cap), and the attention and
# cache the rule leaves to the counter until these pass: a window, softcap, an e4m3 cache.
@pytest.mark.parametrize("batch, seqlen_k, heads, head_dim, seqlen_q, num_splits, extra", [
    (1, 4096, (32, 8), 128, 1, 16, {}), (2, 3000, (32, 8), 128, 1, 8, {}), (1, 5000, (32, 8), 128, 2, 2, {}),
    (1, 4096, (64, 8), 64, 1, 16, {}), (1, 4096, (32, 8), 128, 1, 16, {"sinks": True}),
    (1, 4096, (32, 8), 128, 1, 16, {"page_size": 16}), (1, 1024, (32, 8), 128, 1, 8, {}),
    (1, 1024, (32, 8), 64, 1, 8, {"sinks": True}), (1, 65536, (32, 8), 128, 1, 8, {}),
    (1, 4096, (32, 8), 128, 1, 8, {"window_size": (700, 0)}), (1, 1024, (32, 8), 128, 1, 8, {"softcap": 30.0}),
    (1, 4096, (32, 8), 128, 1, 8, {"fp8": True}), (2, 3000, (32, 8), 128, 1, 8, {"fp8": True}),
])
def test_cluster_merge_gives_the_same_bits(batch, seqlen_k, heads, head_dim, seqlen_q, num_splits, extra,
                                           monkeypatch):
    """The leader's merge of its cluster's slots computes what the last CTA's merge of global
    partials computes: out and lse bitwise equal, and right against the reference."""
    import flashsplit
    from flashsplit import dispatch

    extra = dict(extra)
    gen = torch.Generator().manual_seed(7)
    q, k, v, lens, caches, table = _launch_switch_inputs(gen, batch, seqlen_k, heads, head_dim, seqlen_q,
                                                         [seqlen_k, seqlen_k // 5][:batch],
                                                         extra.pop("page_size", 0))
    sinks = torch.randn(heads[0], generator=gen).cuda() if extra.pop("sinks", False) else None
    descales = {}
    if extra.pop("fp8", False):  # descales of 2: the reference reads the stored values times 2
        caches = tuple(c.to(torch.float8_e4m3fn) for c in caches)
        k, v = (2 * c.float() for c in caches)
        two = torch.full((1,), 2.0, device="cuda")
        descales = dict(k_descale=two, v_descale=two)
    causal = seqlen_q > 1
    variant = {**extra, **({"sinks": sinks} if sinks is not None else {})}

    def decode_once(cluster):
        out = torch.full_like(q, float("nan"))
        _, lse = flashsplit.decode(q, *caches, cache_seqlens=lens, block_table=table, num_splits=num_splits,
                                   causal=causal, out=out, return_lse=True, backend="cute", **descales, **variant)
        torch.cuda.synchronize()
        assert dispatch._PREPARED.last[1].tile.cluster is cluster  # the launch the case is about
        check_against_reference(out, lse, q, k, v, lens, causal, head_dim ** -0.5, **variant)
        return out, lse

    _same_bits_both_ways(monkeypatch, "CLUSTER_MERGE", decode_once)
