"""CuTe backend attention variants on a Hopper GPU: sliding windows, softcap, sinks, batch invariance.

Against the float64 reference (:func:`flashsplit.testing.check_against_reference` with the
variant), on the 64-row and the swapped-operand consumers (each forced), dense and paged caches
(pages of 16: sub-tile TMA boxes; 128: whole TMA tiles; 5: gathered rows), 16-bit and fp8 e4m3,
head dims 128 and 96 (the 64-row consumer only: no swapped one there; 64 under ``--full``),
one split (the split kernel's epilogue) and 3 or 17 merged in the kernel's tail or by the combine.
Every cache slot no query of its row may see (before its window, past its length) holds NaN, and
outputs are NaN-poisoned. Windows sit on the 64-key tile and 128-key granule boundaries; rows of
0, 1-2 keys and 2 + a granule + a tile keys put a window's first key exactly on a boundary.

Skipped cleanly without CUDA, without compute capability 9.0 or without nvidia-cutlass-dsl. The
default run takes one split path of each kind per parametrization (~2 minutes, mostly compiles);
``pytest --full`` adds the rest of the matrix.
"""

from __future__ import annotations

import math

import pytest
import torch

from flashsplit.call import DecodeOptions, DecodeTensors
from flashsplit.plan import MAX_SPLITS, first_key
from flashsplit.problem import Variant
from flashsplit.reference import combine_ref, dequantize, split_partials_ref
from flashsplit.testing import POISON, DecodeCase, check_against_reference, make_inputs, quantize_fp8, to_paged

from conftest import CUTE_GPU_MARKS

pytestmark = CUTE_GPU_MARKS

FULL = pytest.mark.full
CAPACITY = 1024
# Rows: a full cache, many tiles, 257 = 1 + 2 granules (window 128 at L_q 1 starts on a granule),
# 193 = 1 + a granule + a tile (window 64 starts on a granule), 2 keys, empty.
LENGTHS = (1024, 700, 257, 193, 2, 0)
# (splits, merged in the kernel's tail): one split, and the two multi-split paths.
SPLIT_PATHS = [(1, False), (3, True), (17, False)]
MORE_SPLIT_PATHS = [(3, False), (17, True)]  # (pytest --full)


def _split_paths(request) -> list[tuple[int, bool]]:
    return SPLIT_PATHS + (MORE_SPLIT_PATHS if request.config.getoption("--full") else [])


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


def _inputs(seqlen_q, group, head_dim, lengths, window_left, generator, dtype=torch.bfloat16, capacity=CAPACITY):
    """q, k, v, cache_seqlens of ``lengths`` rows (2 KV heads), NaN where no query may look."""
    case = DecodeCase(len(lengths), seqlen_q, capacity, 2, group, head_dim, dtype, tuple(lengths))
    q, k, v, seqlens = make_inputs(case, "cuda", generator)
    k, v = _hide_unseen(k, v, seqlens, seqlen_q, window_left)
    return q, k, v, seqlens


def _cache(k, v, seqlens, fmt, generator):
    """``(k, v, k_ref, v_ref, extra)`` for a cache format: "dense", "pages16" (sub-tile TMA boxes),
    "pages128" (whole TMA tiles), "pages5" (gathered rows), "fp8" and "fp8-pages16" (e4m3, one
    descale per (row, KV head)); ``extra`` holds the block table and descales, the refs are the
    dense (dequantized) cache the reference reads."""
    extra, k_ref, v_ref = {}, k, v
    if fmt.startswith("fp8"):
        k, extra["k_descale"] = quantize_fp8(k, torch.float8_e4m3fn, per_head=True)
        v, extra["v_descale"] = quantize_fp8(v, torch.float8_e4m3fn, per_head=True)
        k_ref, v_ref = dequantize(k, extra["k_descale"]), dequantize(v, extra["v_descale"])
    page = int(fmt.rsplit("pages", 1)[1]) if "pages" in fmt else 0
    if page:  # shuffled pages, NaN in unused ones, garbage ids past each row's last page
        k, v, extra["block_table"], _, _ = to_paged(k, v, seqlens.tolist(), page, generator, share_first_page=False)
    return k, v, k_ref, v_ref, extra


def _run(q, k, v, seqlens, splits, *, swap=False, merge=False, causal=False, window=(-1, -1), softcap=0.0,
         sinks=None, scale=None, one_per_sm=False, one_wave=False, **extra):
    """One cute decode of ``splits`` splits into NaN-poisoned outputs, on the consumer and merge
    path asked for (``swap``: swapped operands; ``merge``: in the kernel's tail, else the
    combine), as ``CuteBackend.prepare`` would launch it otherwise."""
    from flashsplit.cute import choice
    from flashsplit.cute.backend import CuteBackend
    from flashsplit.cute.launcher import PreparedCuteDecode
    from flashsplit.validation import check_decode_inputs

    out = torch.full_like(q, POISON)
    lse = torch.full((q.shape[0], q.shape[2], q.shape[1]), POISON, device="cuda")
    tensors = DecodeTensors(q, k, v, out, lse, seqlens, extra.get("block_table"), extra.get("k_descale"),
                            extra.get("v_descale"), sinks)
    problem = check_decode_inputs(tensors, DecodeOptions(causal=causal, num_splits=splits, window_size=window,
                                                         softcap=softcap))
    tile = choice.choose(problem, splits, problem.num_sms, MAX_SPLITS if merge else 1, one_per_sm=one_per_sm,
                         one_wave=one_wave, swap=swap)
    assert (tile.swap, tile.merge) == (swap, merge and splits > 1), tile
    scale = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    PreparedCuteDecode(CuteBackend().launcher, tile, splits, scale, problem.causal, problem.variant)(tensors)
    torch.cuda.synchronize()
    return out, lse


def _check(out, lse, q, k_ref, v_ref, seqlens, what, causal=False, window=(-1, -1), softcap=0.0, sinks=None,
           scale=None):
    check_against_reference(out, lse, q, k_ref, v_ref, seqlens, causal, scale, what=what, window_size=window,
                            softcap=softcap, sinks=sinks)


def _group(seqlen_q: int) -> int:
    """q heads per KV head: 1-8 packed rows, so both consumers take the problem."""
    return 4 if seqlen_q == 1 else 2


# Windows on the 64-key tile (d = 128) and 128-key granule boundaries, one wider than any row,
# and right bounds (a query sees 3 keys past itself; 0: causal's mask without causal=True).
WINDOWS = [(0, -1), pytest.param((63, -1), marks=FULL), (64, -1), pytest.param((127, -1), marks=FULL), (128, -1),
           pytest.param((129, -1), marks=FULL), pytest.param((2000, -1), marks=FULL), (40, 3),
           pytest.param((0, 0), marks=FULL), pytest.param((-1, 1), marks=FULL)]


# (head dim, swapped operands): both consumers at d = 128 (and 64), the 64-row one at d = 96.
DIMS_AND_CONSUMERS = [pytest.param(128, False, id="d128-rows"), pytest.param(128, True, id="d128-swap"),
                      pytest.param(96, False, id="d96-rows")]


@pytest.mark.parametrize("head_dim, swap", DIMS_AND_CONSUMERS + [pytest.param(64, False, marks=FULL, id="d64-rows"),
                                                                 pytest.param(64, True, marks=FULL, id="d64-swap")])
@pytest.mark.parametrize("window", WINDOWS, ids=str)
@pytest.mark.parametrize("seqlen_q, causal", [(1, False), (3, True), (3, False)])
def test_window_matches_reference(swap, window, seqlen_q, causal, head_dim, generator, request):
    if causal and window[1] > 0:
        pytest.skip("right > 0 contradicts causal (validation refuses it)")
    q, k, v, seqlens = _inputs(seqlen_q, _group(seqlen_q), head_dim, LENGTHS, window[0], generator)
    for splits, merge in _split_paths(request):
        out, lse = _run(q, k, v, seqlens, splits, swap=swap, merge=merge, causal=causal, window=window)
        _check(out, lse, q, k, v, seqlens, f"window {window} S{splits} merge={merge}", causal, window)


@pytest.mark.parametrize("seqlen_q, causal, window", [(9, True, (100, 0)), (16, False, (70, 5)),
                                                      pytest.param(16, True, (0, 0), marks=FULL)])
@pytest.mark.parametrize("head_dim", [128, 96])
def test_window_over_several_row_blocks(seqlen_q, causal, window, head_dim, generator, request):
    """8 q heads per KV head over 9-16 queries: 72-128 packed rows, two 64-row tiles whose first
    queries see different first keys (each CTA skips and zeroes up to its own)."""
    q, k, v, seqlens = _inputs(seqlen_q, 8, head_dim, LENGTHS, window[0], generator)
    for splits, merge in _split_paths(request):
        out, lse = _run(q, k, v, seqlens, splits, merge=merge, causal=causal, window=window)
        _check(out, lse, q, k, v, seqlens, f"window {window} S{splits} merge={merge}", causal, window)


@pytest.mark.parametrize("fmt, swap, head_dim", [
    ("pages16", False, 128), ("pages16", True, 128), ("pages5", False, 128), ("fp8-pages16", False, 128),
    ("pages16", False, 96), ("pages5", False, 96), ("fp8-pages16", False, 96),
    pytest.param("pages128", False, 128, marks=FULL), pytest.param("pages128", True, 128, marks=FULL),
    pytest.param("fp8", False, 128, marks=FULL), pytest.param("fp8-pages5", False, 128, marks=FULL),
    pytest.param("pages128", False, 96, marks=FULL), pytest.param("fp8", False, 96, marks=FULL)])
@pytest.mark.parametrize("window", [(64, -1), pytest.param((129, -1), marks=FULL)], ids=str)
def test_window_cache_formats(fmt, swap, head_dim, window, generator, request):
    """Paged caches (sub-tile boxes, whole tiles, gathered rows) and fp8 (converted in shared
    memory, V rows before the window written as 0) under a window, L_q 3, causal."""
    q, k, v, seqlens = _inputs(3, 2, head_dim, LENGTHS, window[0], generator)
    k, v, k_ref, v_ref, extra = _cache(k, v, seqlens, fmt, generator)
    for splits, merge in _split_paths(request):
        out, lse = _run(q, k, v, seqlens, splits, swap=swap, merge=merge, causal=True, window=window, **extra)
        _check(out, lse, q, k_ref, v_ref, seqlens, f"{fmt} window {window} S{splits} merge={merge}", True, window)


@pytest.mark.parametrize("tile", ["one_per_sm", "one_wave"])
def test_window_on_the_other_tiles(tile, generator):
    """The one-CTA-per-SM tile and the one-wave stages (dense 16-bit d = 128) under a window."""
    window = (64, -1)
    q, k, v, seqlens = _inputs(1, 4, 128, LENGTHS, window[0], generator)
    for splits, merge in [(1, False), (3, True)] if tile == "one_per_sm" else [(3, True)]:
        out, lse = _run(q, k, v, seqlens, splits, merge=merge, window=window, **{tile: True})
        _check(out, lse, q, k, v, seqlens, f"{tile} S{splits}", False, window)


@pytest.mark.parametrize("head_dim, swap", DIMS_AND_CONSUMERS)
@pytest.mark.parametrize("softcap, scale", [(30.0, 1.0), (2.0, 4.0), (0.5, 0.125)])
def test_softcap_matches_reference(head_dim, swap, softcap, scale, generator, request):
    """Large logits (scale 4: most scores past the cap) and small ones (scale 1/8), L_q 2 causal."""
    q, k, v, seqlens = _inputs(2, 2, head_dim, LENGTHS, -1, generator)
    scale = scale / math.sqrt(head_dim)
    for splits, merge in _split_paths(request):
        out, lse = _run(q, k, v, seqlens, splits, swap=swap, merge=merge, causal=True, softcap=softcap, scale=scale)
        _check(out, lse, q, k, v, seqlens, f"softcap {softcap} S{splits} merge={merge}", True, softcap=softcap,
               scale=scale)


def test_softcap_fp8(generator):
    q, k, v, seqlens = _inputs(1, 4, 64, LENGTHS, -1, generator)
    k, v, k_ref, v_ref, extra = _cache(k, v, seqlens, "fp8", generator)
    for splits, merge in SPLIT_PATHS:
        out, lse = _run(q, k, v, seqlens, splits, merge=merge, softcap=5.0, **extra)
        _check(out, lse, q, k_ref, v_ref, seqlens, f"fp8 softcap S{splits} merge={merge}", softcap=5.0)


@pytest.mark.parametrize("head_dim, swap", DIMS_AND_CONSUMERS)
@pytest.mark.parametrize("sink_scale", [8.0, -8.0, 1.0])  # a sink that dominates, a negligible one, a fair one
@pytest.mark.parametrize("sink_dtype", [torch.float32, pytest.param(torch.bfloat16, marks=FULL),
                                        pytest.param(torch.float16, marks=FULL)], ids=["fp32", "bf16", "fp16"])
def test_sinks_match_reference(head_dim, swap, sink_scale, sink_dtype, generator, request):
    """Sinks join each softmax once on every path (one split's epilogue, the merge tail, the
    combine); an empty row and a query that sees no key (L_q 3 over a 1-key row, causal) get
    O = 0 and LSE = their sink."""
    lengths = (600, 1, 0)
    q, k, v, seqlens = _inputs(3, 2, head_dim, lengths, -1, generator)
    sinks = (sink_scale * (1 + torch.rand(4, generator=generator))).to("cuda", sink_dtype)
    for splits, merge in _split_paths(request):
        out, lse = _run(q, k, v, seqlens, splits, swap=swap, merge=merge, causal=True, sinks=sinks)
        what = f"sinks {sink_scale} S{splits} merge={merge}"
        _check(out, lse, q, k, v, seqlens, what, True, sinks=sinks)
        assert torch.equal(out[2], torch.zeros_like(out[2])), what
        torch.testing.assert_close(lse[2], sinks.float()[:, None].expand(4, 3), atol=1e-5, rtol=0, msg=what)
        torch.testing.assert_close(lse[1, :, 0], sinks.float(), atol=1e-5, rtol=0, msg=what)  # query 0: no key


@pytest.mark.parametrize("fmt, swap, head_dim", [
    ("dense", False, 128), ("dense", True, 128), ("pages16", False, 128), ("fp8", False, 128),
    ("dense", False, 96), ("pages16", False, 96), ("pages5", False, 96), ("fp8", False, 96),
    pytest.param("pages16", True, 128, marks=FULL), pytest.param("fp8-pages16", False, 128, marks=FULL),
    pytest.param("pages5", False, 128, marks=FULL), pytest.param("pages128", True, 128, marks=FULL),
    pytest.param("fp8-pages16", False, 96, marks=FULL), pytest.param("pages128", False, 96, marks=FULL)])
def test_every_variant_together(fmt, swap, head_dim, generator, request):
    """A window, softcap and sinks with causal L_q 2, on each cache format and consumer."""
    window = (200, -1)
    q, k, v, seqlens = _inputs(2, 2, head_dim, LENGTHS, window[0], generator)
    k, v, k_ref, v_ref, extra = _cache(k, v, seqlens, fmt, generator)
    sinks = torch.randn(4, generator=generator).to("cuda")
    for splits, merge in _split_paths(request):
        out, lse = _run(q, k, v, seqlens, splits, swap=swap, merge=merge, causal=True, window=window, softcap=3.0,
                        sinks=sinks, **extra)
        _check(out, lse, q, k_ref, v_ref, seqlens, f"{fmt} S{splits} merge={merge}", True, window, 3.0, sinks)


def test_heuristic_splits_through_the_api(generator):
    """``flashsplit.decode(backend="cute")`` plans a 1000-key window over a 16k cache like a
    ~1.1k cache (its span) and matches the reference, with softcap and sinks too."""
    import flashsplit

    window, capacity = (1000, -1), 16384
    lengths = (16384, 9000, 1100, 1000, 3, 0)
    q, k, v, seqlens = _inputs(1, 4, 128, lengths, window[0], generator, capacity=capacity)
    plan = flashsplit.plan(len(lengths), capacity, 8, 2, 128, window_size=window, backend="cute")
    assert plan.span == 1000 + 1 + 127 and plan.num_splits > 1, plan
    sinks = torch.randn(8, generator=generator).to("cuda")
    for kwargs in (dict(), dict(softcap=20.0, sinks=sinks)):
        out = torch.full_like(q, POISON)
        out, lse = flashsplit.decode(q, k, v, cache_seqlens=seqlens, out=out, return_lse=True, window_size=window,
                                     backend="cute", **kwargs)
        torch.cuda.synchronize()
        _check(out, lse, q, k, v, seqlens, f"heuristic splits {sorted(kwargs)}", False, window,
               kwargs.get("softcap", 0.0), kwargs.get("sinks"))


def test_forward_partials_with_a_window_then_combine_with_sinks(generator):
    """cute's partials of a windowed causal decode are the reference's, split by split (the plan's
    boundaries from the row's first key), and cute's and Triton's combines add the sinks once."""
    from flashsplit.cute.backend import CuteBackend
    from flashsplit.registry import get

    window = (300, 0)
    q, k, v, seqlens = _inputs(2, 2, 128, (800, 150, 0), window[0], generator, capacity=800)
    scale = 128 ** -0.5
    out_p, lse_p = CuteBackend().forward_partials(q, k, v, seqlens, 3, scale, True, variant=Variant(*window))
    ref_p, ref_lse_p = split_partials_ref(q, torch.nan_to_num(k), torch.nan_to_num(v), seqlens, 3, True, scale,
                                          window_size=window)
    live = torch.isfinite(ref_lse_p.to("cuda"))
    assert torch.equal(torch.isfinite(lse_p), live)
    torch.testing.assert_close(lse_p[live], ref_lse_p.to("cuda")[live].float(), atol=1e-3, rtol=1e-3)
    live_o = live.permute(0, 1, 3, 2)  # [S, B, L_q, H]
    torch.testing.assert_close(out_p[live_o], ref_p.to("cuda")[live_o].float(), atol=2e-2, rtol=2e-2)
    assert first_key(800, 2, 300) == 384 and not torch.isfinite(lse_p[2, 0]).any()  # [384, 800): 2 splits used
    sinks = torch.randn(4, generator=generator).to("cuda")
    ref_out, ref_lse = combine_ref(out_p, lse_p, sinks)
    for backend in (CuteBackend(), get("triton")):
        out = torch.full_like(q, POISON)
        lse = torch.full((3, 4, 2), POISON, device="cuda")
        backend.combine(out_p, lse_p, out, lse, sinks=sinks)
        torch.cuda.synchronize()
        torch.testing.assert_close(out.double(), ref_out.to("cuda"), atol=1e-2, rtol=1e-2, msg=backend.name)
        torch.testing.assert_close(lse, ref_lse.to("cuda"), atol=1e-4, rtol=1e-4, msg=backend.name)


@pytest.mark.parametrize("head_dim", [128, 96])
@pytest.mark.parametrize("num_splits", [3, 17])  # merged in the kernel's tail; the combine
def test_graph_replay_with_new_lengths(num_splits, head_dim, generator):
    """A captured windowed, softcapped decode with sinks follows new ``cache_seqlens`` on replay
    (the window's first key moves with them); the slots hidden under the new lengths are NaN."""
    import flashsplit

    window = (100, -1)
    lengths, later = (1000, 300, 5), (130, 1024, 0)
    q, k, v, seqlens = _inputs(2, 2, head_dim, lengths, window[0], generator)
    clean_k, clean_v = make_inputs(DecodeCase(3, 2, CAPACITY, 2, 2, head_dim, torch.bfloat16), "cuda",
                                   generator)[1:3]
    k.copy_(clean_k)
    v.copy_(clean_v)
    sinks = torch.randn(4, generator=generator).to("cuda")
    out = torch.full_like(q, POISON)
    kwargs = dict(cache_seqlens=seqlens, out=out, return_lse=True, window_size=window, softcap=10.0, sinks=sinks,
                  causal=True, num_splits=num_splits, backend="cute")
    flashsplit.decode(q, k, v, **kwargs)  # compile and prepare outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _, lse = flashsplit.decode(q, k, v, **kwargs)  # (lse: from the graph's pool, written on replay)
    seqlens.copy_(torch.tensor(later, dtype=torch.int32))
    hidden_k, hidden_v = _hide_unseen(clean_k, clean_v, seqlens, 2, window[0])
    k.copy_(hidden_k)
    v.copy_(hidden_v)
    out.fill_(POISON)
    lse.fill_(POISON)
    graph.replay()
    torch.cuda.synchronize()
    _check(out, lse, q, k, v, seqlens, f"replay S{num_splits}", True, window, 10.0, sinks)


@pytest.mark.parametrize("dim", [128, 96])
@pytest.mark.parametrize("page_size", [0, pytest.param(16, marks=FULL)])
@pytest.mark.parametrize("seqlen_q", [1, pytest.param(4, marks=FULL)])
def test_batch_invariance(page_size, seqlen_q, dim, generator):
    """A row decoded alone and in a batch of 16 with other lengths (and another cache capacity: 2
    or 1 splits alone, 3 in the batch), at two positions of that batch, gives bitwise equal
    outputs and LSEs; each is the reference's."""
    import flashsplit

    heads, capacity = (8, 2), 1100
    sinks = torch.randn(heads[0], generator=generator).to("cuda")

    def rand(*shape):
        return torch.randn(*shape, generator=generator).to("cuda", torch.bfloat16)

    lengths = [int(n) for n in torch.randint(0, capacity, (16,), generator=generator)]
    batch_q, batch_k, batch_v = (rand(16, seqlen_q, heads[0], dim), rand(16, capacity, heads[1], dim),
                                 rand(16, capacity, heads[1], dim))

    def decode(q, k, v, lens, **kwargs):
        lens = torch.tensor(lens, dtype=torch.int32, device="cuda")
        extra = {}
        if page_size:
            k, v, extra["block_table"], _, _ = to_paged(k, v, lens.tolist(), page_size, generator)
        return flashsplit.decode(q, k, v, cache_seqlens=lens, return_lse=True, batch_invariant=True, causal=True,
                                 backend="cute", **extra, **kwargs)

    for length in (700, 400):
        q_row, k_row, v_row = rand(1, seqlen_q, heads[0], dim), rand(1, length, heads[1], dim), rand(1, length,
                                                                                                      heads[1], dim)
        for kwargs in (dict(), dict(window_size=(300, -1)), dict(softcap=20.0, sinks=sinks)):
            alone = decode(q_row, k_row, v_row, [length], **kwargs)
            for position in (3, 11):
                q, k, v, lens = batch_q.clone(), batch_k.clone(), batch_v.clone(), list(lengths)
                q[position], k[position, :length], v[position, :length], lens[position] = (q_row[0], k_row[0],
                                                                                           v_row[0], length)
                batched = decode(q, k, v, lens, **kwargs)
                what = f"length {length} {sorted(kwargs)} at {position}"
                assert torch.equal(alone[0][0], batched[0][position]), what
                assert torch.equal(alone[1][0], batched[1][position]), what
            check_against_reference(alone[0], alone[1], q_row, k_row, v_row,
                                    torch.tensor([length], dtype=torch.int32, device="cuda"), True, what=str(kwargs),
                                    **kwargs)


@pytest.mark.parametrize("page_size", [0, pytest.param(16, marks=FULL)])
def test_batch_invariance_with_runs_of_splits(page_size, generator):
    """In a batch of 16 rows of 8 KV heads each CTA runs a run of consecutive fixed splits
    (``choice.invariant_split_ctas``: 16 splits of 512 keys on 2 CTAs a row, a window's 6 on 2);
    the same row decoded alone runs one split per CTA: bitwise equal outputs and LSEs, at two
    positions of the batch, and the reference's. Slots past a row's length hold NaN."""
    import flashsplit
    from flashsplit.cute import choice

    heads, dim, capacity, length = (32, 8), 128, 8192, 5000
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    assert choice.invariant_split_ctas(16 * 8, 16, 2, sms) < 16 == choice.invariant_split_ctas(8, 16, 2, sms)
    sinks = torch.randn(heads[0], generator=generator).to("cuda")

    def rand(*shape):
        return torch.randn(*shape, generator=generator).to("cuda", torch.bfloat16)

    lengths = [int(n) for n in torch.randint(0, capacity, (16,), generator=generator)]
    batch_q, batch_k, batch_v = rand(16, 1, heads[0], dim), rand(16, capacity, heads[1], dim), rand(16, capacity,
                                                                                                  heads[1], dim)

    def decode(q, k, v, lens, **kwargs):
        lens = torch.tensor(lens, dtype=torch.int32, device="cuda")
        extra = {}
        if page_size:
            # (no shared first page: every row is checked against its own dense keys)
            k, v, extra["block_table"], _, _ = to_paged(k, v, lens.tolist(), page_size, generator,
                                                        share_first_page=False)
        return flashsplit.decode(q, k, v, cache_seqlens=lens, return_lse=True, batch_invariant=True, backend="cute",
                                 **extra, **kwargs)

    q_row, k_row, v_row = rand(1, 1, heads[0], dim), rand(1, length, heads[1], dim), rand(1, length, heads[1], dim)
    for kwargs in (dict(), dict(window_size=(3000, -1)), dict(softcap=20.0, sinks=sinks)):
        alone = decode(q_row, k_row, v_row, [length], **kwargs)
        for position in (5, 15):
            q, k, v, lens = batch_q.clone(), batch_k.clone(), batch_v.clone(), list(lengths)
            q[position], k[position, :length], v[position, :length], lens[position] = (q_row[0], k_row[0], v_row[0],
                                                                                       length)
            for i, n in enumerate(lens):  # past each row's length: NaN, never read
                k[i, n:], v[i, n:] = POISON, POISON
            batched = decode(q, k, v, lens, **kwargs)
            what = f"{sorted(kwargs)} at {position}"
            assert torch.equal(alone[0][0], batched[0][position]), what
            assert torch.equal(alone[1][0], batched[1][position]), what
            others = [i for i in range(16) if i != position]
            check_against_reference(batched[0][others], batched[1][others], q[others], k[others], v[others],
                                    torch.tensor(lens, dtype=torch.int32, device="cuda")[others], False, what=what,
                                    **kwargs)
        check_against_reference(alone[0], alone[1], q_row, k_row, v_row,
                                torch.tensor([length], dtype=torch.int32, device="cuda"), False, what=str(kwargs),
                                **kwargs)
