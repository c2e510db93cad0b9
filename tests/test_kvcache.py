"""Cache updates: new-token append, left padding, cache_batch_idx, rotary, flash_attn_with_kvcache.

Against the float64 reference written from FlashAttention's semantics (flashsplit.reference:
append_ref, rotary_ref, attention_ref with cache_leftpad): each call's out, LSE and caches are
checked, every slot but the appended ones bit for bit (flashsplit.testing_kvcache). Every
backend that supports a problem runs it (on the CPU: Triton through the interpreter, fp16; on a
GPU: bf16 too). Slots a row does not use hold NaN.
"""

import pytest
import torch
from conftest import DEVICE, HAS_CUDA

import flashsplit
import flashsplit.reference
from flashsplit.call import DecodeOptions, DecodeTensors
from flashsplit.problem import Variant
from flashsplit.reference import split_partials_ref
from flashsplit.registry import get
from flashsplit.testing import POISON, DecodeCase, make_inputs
from flashsplit.testing_kvcache import KVCacheCase, expected_caches, make_kvcache_inputs, run_kvcache_case
from flashsplit.validation import check_decode_inputs

DTYPES = [torch.float16, torch.bfloat16] if HAS_CUDA else [torch.float16]
FULL = pytest.mark.full


def _tensors(args: dict) -> DecodeTensors:
    return DecodeTensors(args["q"], args["k_cache"], args["v_cache"], args["q"], None, args.get("cache_seqlens"),
                         args.get("block_table"), args.get("k_descale"), args.get("v_descale"), args.get("sinks"),
                         args.get("k"), args.get("v"), args.get("rotary_cos"), args.get("rotary_sin"),
                         args.get("cache_batch_idx"), args.get("cache_leftpad"))


def _backends(case: KVCacheCase, args: dict) -> list[str]:
    """The registered backends that support the case's problem."""
    options = DecodeOptions(causal=case.causal, window_size=case.window_size, softcap=case.softcap,
                            num_splits=case.num_splits, batch_invariant=case.batch_invariant,
                            rotary_interleaved=case.rotary_interleaved)
    problem = check_decode_inputs(_tensors(args), options)
    return [name for name in flashsplit.backends() if get(name).supports(problem) is None]


def _run(case: KVCacheCase, generator, backends=None):
    """The case on every able backend (fresh inputs for each: the call writes its caches)."""
    state = generator.get_state()
    names = backends or _backends(case, make_kvcache_inputs(case, DEVICE, generator))
    assert names, "no backend runs the case"
    results = []
    for name in names:
        generator.set_state(state)
        results.append(run_kvcache_case(case, lambda **kw: flashsplit.decode(**kw, backend=name), DEVICE, generator))
    return results


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seqlen_new", [1, 3, 16])
@pytest.mark.parametrize("causal", [False, True])
def test_append_dense(dtype, seqlen_new, causal, generator):
    _run(KVCacheCase(dtype=dtype, seqlen_new=seqlen_new, causal=causal, lengths=(200, 37, 0)), generator)


@pytest.mark.parametrize("num_splits", [1, 3, 6, pytest.param(0, marks=FULL)])
def test_append_split_counts(num_splits, generator):
    """One split, a few merged in the split kernel, more by the combine kernel, the heuristic: the
    appended keys land in the last split, and rows that fit one split skip the merge."""
    _run(KVCacheCase(seqlen_new=3, lengths=(254, 128, 5), num_splits=num_splits), generator)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("page_size", [1, 16, 48])
@pytest.mark.parametrize("seqlen_new", [1, pytest.param(3, marks=FULL), 16])
def test_append_paged(dtype, page_size, seqlen_new, generator):
    """Pages of 1, 16 and 48 keys, shuffled; the new keys cross page boundaries."""
    _run(KVCacheCase(dtype=dtype, page_size=page_size, seqlen_new=seqlen_new, lengths=(47, 100, 1), num_splits=2),
         generator)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kv_dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
@pytest.mark.parametrize("per_head", [False, True])
@pytest.mark.parametrize("page_size", [0, pytest.param(16, marks=FULL)])
def test_append_fp8(dtype, kv_dtype, per_head, page_size, generator):
    """An fp8 cache stores k / k_descale, saturated and rounded to nearest even."""
    _run(KVCacheCase(dtype=dtype, kv_dtype=kv_dtype, per_head_scale=per_head, page_size=page_size, seqlen_new=3,
                     lengths=(100, 7, 250)), generator)


def test_append_fp8_saturates_and_rounds_to_even(generator):
    """New values past the format's range store its largest finite value; ties round to even;
    subnormals stay subnormal."""
    case = KVCacheCase(kv_dtype=torch.float8_e4m3fn, batch=1, lengths=(10,), seqlen_new=1, num_heads_kv=1,
                       group=1, head_dim=16)
    args = make_kvcache_inputs(case, DEVICE, generator)
    # past the range; ties (16 | 18, 2 | 2.25, subnormals 1 | 2 x 2^-9) to even; -0; a subnormal
    values = torch.tensor([1000.0, -1e4, 17.0, 2.125, 1.5 * 2 ** -9, -0.0, 3 * 2 ** -9, 1.0] * 2, dtype=torch.float16)
    args["k"] = values.reshape(1, 1, 1, 16).to(DEVICE)
    args["k_descale"] = torch.ones(1, device=DEVICE)
    run_kvcache_case(case, flashsplit.decode, DEVICE, generator, args=args)
    stored = args["k_cache"][0, 10, 0].float().cpu()
    assert stored[:8].tolist() == [448.0, -448.0, 16.0, 2.0, 2 ** -8, -0.0, 3 * 2 ** -9, 1.0]
    assert torch.signbit(stored[5])


@pytest.mark.parametrize("page_size", [0, 16])
def test_append_fills_the_cache_exactly(page_size, generator):
    """253 + 3 new keys in a 256-key cache: the last slot is written and attended to."""
    _run(KVCacheCase(seqlen_k=256, page_size=page_size, lengths=(253, 240, 0), seqlen_new=3), generator)


def test_append_past_the_capacity_is_clamped(generator):
    """A length that leaves no room (unchecked without a host sync) writes only the keys that fit,
    never past the cache, and the row attends to its capacity."""
    case = KVCacheCase(seqlen_k=128, lengths=(126, 128, 3), seqlen_new=4)
    args = make_kvcache_inputs(case, DEVICE, generator)
    # The cache is a view into a larger buffer: anything written past a row's capacity shows.
    for name in ("k_cache", "v_cache"):
        big = torch.randn(case.batch, 140, case.num_heads_kv, case.head_dim, generator=generator).to(DEVICE,
                                                                                                    case.dtype)
        big[:, :128] = args[name]
        args[name] = big[:, :128]
        args[name + "_buffer"] = big
    buffers = {name: args.pop(name + "_buffer") for name in ("k_cache", "v_cache")}
    before = {name: buffers[name][:, 128:].clone() for name in buffers}
    run_kvcache_case(case, flashsplit.decode, DEVICE, generator, args=args)
    for name in buffers:
        assert torch.equal(buffers[name][:, 128:], before[name]), f"{name}: written past the capacity"


@pytest.mark.parametrize("page_size", [0, 16])
def test_append_before_the_window_is_written(page_size, generator):
    """16 new keys, one query, a window of 2 keys: the new keys before the window's first split
    (no query sees them) are written into the cache too."""
    _run(KVCacheCase(seqlen_new=16, seqlen_q=1, window_size=(2, 0), lengths=(250, 120, 0), page_size=page_size,
                     num_splits=2), generator)


def test_append_with_several_row_tiles(generator):
    """96 packed rows (32 q heads per KV head, 3 queries) take two row tiles: each writes the new
    keys (the same bytes) and attends them."""
    _run(KVCacheCase(num_heads_kv=1, group=32, seqlen_new=3, causal=True, lengths=(200, 37, 0), num_splits=2),
         generator)


@pytest.mark.parametrize("window, causal", [((-1, -1), False), pytest.param((-1, -1), True, marks=FULL),
                                            ((40, 0), False), pytest.param((100, -1), False, marks=FULL)])
@pytest.mark.parametrize("seqlen_new", [0, 3])
def test_leftpad(window, causal, seqlen_new, generator):
    """Row b's keys are [leftpad, seqlen): a NaN prefix is never read; windows and causal masks
    count from the first real key."""
    for num_splits in (3, 6):  # merged in the split kernel, by the combine kernel
        case = KVCacheCase(lengths=(290, 150, 64), leftpad=(0, 130, 64), seqlen_new=seqlen_new,
                           seqlen_q=max(seqlen_new, 1), causal=causal, window_size=window, num_splits=num_splits)
        _run(case, generator)


@pytest.mark.parametrize("num_splits, window_left", [(3, -1), (4, 100), (2, -1)])
def test_leftpad_split_bounds_follow_the_plan(num_splits, window_left, generator):
    """Each split's partial (one split kernel, every row to partials) is the reference's partial
    over the plan's boundaries for a left-padded row (plan.split_bounds(..., leftpad=))."""
    backend = get("triton")
    case = DecodeCase(batch=3, seqlen_q=2, seqlen_k=600, num_heads_kv=2, group=2, head_dim=32, dtype=torch.float16,
                      lengths=(600, 400, 130))
    q, k, v, seqlens = make_inputs(case, DEVICE, generator)
    pads = torch.tensor([250, 0, 129], dtype=torch.int32, device=DEVICE)
    keys = torch.arange(600, device=DEVICE)[None, :]
    k[keys < pads[:, None]] = float("nan")
    v[keys < pads[:, None]] = float("nan")
    variant = Variant(window_left=window_left, has_leftpad=True)
    out_partial, lse_partial = backend.alloc_partials(q, num_splits, scratch=False)
    out_partial.fill_(POISON)
    backend.launch_split(q, k, v, seqlens, num_splits, 32 ** -0.5, False, out_partial, lse_partial, None, None,
                         final_for_single_split_rows=False, variant=variant, cache_leftpad=pads)
    ref_out, ref_lse = split_partials_ref(q.cpu(), k.cpu(), v.cpu(), seqlens.cpu(), num_splits,
                                          window_size=(window_left, -1), cache_leftpad=pads.cpu())
    live = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse_partial.cpu()), live), "a split's emptiness differs from the plan's"
    torch.testing.assert_close(lse_partial.cpu()[live], ref_lse[live], atol=2e-3, rtol=1e-3)
    weights = live.permute(0, 1, 3, 2)[..., None]
    torch.testing.assert_close(torch.where(weights, out_partial.cpu(), 0.0), torch.where(weights, ref_out, 0.0),
                               atol=5e-3, rtol=1e-2)


@pytest.mark.parametrize("layout", ["permutation", "subset"])
@pytest.mark.parametrize("seqlen_new", [0, 3])
def test_cache_batch_idx(layout, seqlen_new, generator):
    """Row b reads (and writes) cache row cache_batch_idx[b]; rows nobody names stay as they are."""
    _run(KVCacheCase(batch_idx=layout, seqlen_new=seqlen_new, lengths=(120, 299 - seqlen_new, 4),
                     num_splits=2), generator)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("interleaved", [True, False])
@pytest.mark.parametrize("rotary_dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_rotary(dtype, interleaved, rotary_dim, causal, generator):
    """New keys rotated at cache_seqlens - leftpad + t; q at the same positions when causal, else
    every q row at cache_seqlens - leftpad; features past rotary_dim pass through."""
    case = KVCacheCase(dtype=dtype, head_dim=128, rotary_dim=rotary_dim, rotary_interleaved=interleaved,
                       causal=causal, seqlen_new=3, lengths=(200, 40, 2), leftpad=(0, 17, 2), num_splits=2)
    _run(case, generator)


@pytest.mark.parametrize("window", [(30, 0), (20, -1)])
def test_rotary_windowed_and_fp16_tables(window, generator):
    """A window rotates q per token, as causal does; tables in q's dtype."""
    _run(KVCacheCase(rotary_dim=32, rotary_dtype=torch.float16, window_size=window, seqlen_new=2, seqlen_q=2,
                     lengths=(100, 9, 60)), generator)


def test_rotary_with_more_queries_than_new_keys(generator):
    """L_q > L_new with causal: q rows past the new keys rotate at their own positions, which the
    tables must hold (capacity + L_q - L_new rows: a row filled to the capacity's last slot)."""
    _run(KVCacheCase(rotary_dim=64, causal=True, seqlen_new=1, seqlen_q=4, lengths=(150, 20, 299)), generator)


@pytest.mark.parametrize("window", [(-1, -1), (20, 0)])
def test_rotary_tables_too_short_for_the_queries_are_refused(window, generator):
    """A table as long as the cache, with more queries than new keys (causal or windowed: q rotates
    per token), is refused from the shapes alone (no length is read): query 3 of a row whose new
    key fills the last slot would sit past the table, where its last row would be used. One query
    (or q rotated at the row's length, not causal) needs no more than the cache's capacity."""
    case = KVCacheCase(rotary_dim=64, causal=window == (-1, -1), window_size=window, seqlen_new=1, seqlen_q=4,
                       lengths=(150, 20, 299))
    args = make_kvcache_inputs(case, DEVICE, generator)
    assert args["rotary_cos"].shape[0] == 303
    short = {name: args[name][:300] for name in ("rotary_cos", "rotary_sin")}
    with pytest.raises(ValueError, match=r"rotary_cos: expected at least 303 positions.*query i rotates at "
                                         r"cache_seqlens - cache_leftpad \+ i.*got 300 \(shape \[300, 32\]\)"):
        flashsplit.decode(**(args | short), **case.options())
    with pytest.raises(ValueError, match="rotary_cos: expected at least 303 positions"):
        flashsplit.flash_attn_with_kvcache(args["q"], args["k_cache"], args["v_cache"], args["k"], args["v"],
                                           cache_seqlens=args["cache_seqlens"], causal=True, **short)
    with pytest.raises(ValueError, match="rotary_cos: expected at least 302 positions"):
        flashsplit.decode(**(args | short | {"q": args["q"][:, :3]}), **case.options())
    # Not causal, no window: every q row rotates at the row's length, which a 300-row table holds.
    plain = KVCacheCase(rotary_dim=64, seqlen_new=1, seqlen_q=4, lengths=(150, 20, 299))
    plain_args = make_kvcache_inputs(plain, DEVICE, generator)
    run_kvcache_case(plain, flashsplit.decode, DEVICE, generator,
                     args=plain_args | {name: plain_args[name][:300] for name in ("rotary_cos", "rotary_sin")})


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("page_size", [0, 16])
def test_negative_leftpad_rotates_as_no_leftpad(causal, page_size, generator):
    """A negative cache_leftpad is clamped to 0 for the rotary positions (new keys and q) as for
    the attention range: the caches, out and LSE are bitwise those of cache_leftpad = 0, and the
    reference's (which clamps alike)."""
    lengths, seqlen_new = (8, 37, 0), 3
    padded = KVCacheCase(rotary_dim=64, causal=causal, seqlen_new=seqlen_new, lengths=lengths, leftpad=(-3, -1, -7),
                         page_size=page_size, num_splits=2)
    plain = KVCacheCase(rotary_dim=64, causal=causal, seqlen_new=seqlen_new, lengths=lengths, leftpad=(0, 0, 0),
                        page_size=page_size, num_splits=2)
    state = generator.get_state()
    got = _run(padded, generator)  # (every able backend: on a GPU cute too, through its cache update kernel)
    generator.set_state(state)
    expected = _run(plain, generator)
    assert len(got) == len(expected)
    for i, (padded_result, plain_result) in enumerate(zip(got, expected)):  # backend by backend
        for name in ("k_cache", "v_cache"):  # (bytes: unused slots hold NaN)
            assert torch.equal(padded_result[name].view(torch.int16), plain_result[name].view(torch.int16)), (i, name)
        assert torch.equal(padded_result["out"], plain_result["out"]), i
        assert torch.equal(padded_result["lse"], plain_result["lse"]), i


@pytest.mark.parametrize("page_size", [0, 16])
def test_cache_update_kernel_clamps_the_leftpad(page_size, generator):
    """The cache-update kernel (what the cute backend runs ahead of its attention) rotates the new
    keys and q from the leftpad clamped into [0, cache_seqlens + L_new]: a negative one writes and
    rotates as 0, one past the row's keys as the row's length, bit for bit."""
    from flashsplit.triton.cache_update import append_new_keys

    lengths, seqlen_new = (8, 37, 100), 3
    results = {}
    for pads in ((-3, -1, -7), (0, 0, 0), (10, 45, 250), (10, 40, 103)):
        case = KVCacheCase(rotary_dim=64, causal=True, seqlen_new=seqlen_new, lengths=lengths, leftpad=pads,
                           page_size=page_size)
        args = make_kvcache_inputs(case, DEVICE, torch.Generator().manual_seed(7))
        args["k_cache"], args["v_cache"] = args["k_cache"].nan_to_num(), args["v_cache"].nan_to_num()  # (pads differ)
        options = DecodeOptions(causal=True)
        q, _ = append_new_keys(_tensors(args), check_decode_inputs(_tensors(args), options).variant)
        results[pads] = q, args["k_cache"], args["v_cache"]
    for clamped, raw in (((0, 0, 0), (-3, -1, -7)), ((10, 40, 103), (10, 45, 250))):
        for got, expected in zip(results[raw], results[clamped]):
            assert torch.equal(got, expected), (raw, clamped)
    assert not torch.equal(results[(0, 0, 0)][0], results[(10, 40, 103)][0])  # (the pads do move q)


@pytest.mark.parametrize("seqlen_q", [1, 3, 5])
def test_leftpad_past_the_row_with_rotary(seqlen_q, generator):
    """A cache_leftpad past cache_seqlens (inside the new keys, or past them all) is clamped into
    the row with its new keys: the new keys are still written, rotated from the clamped first
    key; a row whose leftpad covers every key gets O = 0 and LSE = -inf; the reference's."""
    _run(KVCacheCase(rotary_dim=64, causal=True, seqlen_new=3, seqlen_q=seqlen_q, lengths=(8, 40, 100),
                     leftpad=(10, 43, 250), num_splits=2), generator)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("group, seqlen_q", [(1, 1), (3, 5), (8, 16), pytest.param(5, 2, marks=FULL)])
def test_append_composes_with_variants(dtype, group, seqlen_q, generator):
    """GQA of any ratio, L_q up to 16, window + softcap + sinks + left padding + rotary + paging."""
    case = KVCacheCase(dtype=dtype, group=group, seqlen_new=seqlen_q, causal=True, window_size=(50, 0), softcap=20.0,
                       sinks=True, leftpad=(3, 0, 10), rotary_dim=64, page_size=16, lengths=(150, 60, 200),
                       num_splits=3)
    _run(case, generator)


def test_append_batch_invariant(generator):
    """Batch-invariant decode with an append: row 0's out and LSE are the same bit for bit as
    when decoded alone."""
    case = KVCacheCase(batch_invariant=True, seqlen_new=2, lengths=(250, 30, 100), leftpad=(5, 0, 0))
    whole = _run(case, generator, backends=["triton"])[0]
    alone = KVCacheCase(batch=1, batch_invariant=True, seqlen_new=2, lengths=(250,), leftpad=(5,))
    # Row 0 again, alone: its cache as the first call left it (the append rewrites the same values).
    args = {name: whole[name][:1].clone() for name in ("q", "k", "v", "k_cache", "v_cache", "cache_seqlens",
                                                        "cache_leftpad")}
    result = run_kvcache_case(alone, lambda **kw: flashsplit.decode(**kw, backend="triton"), DEVICE, generator,
                              args=args)
    assert torch.equal(result["out"], whole["out"][:1]) and torch.equal(result["lse"], whole["lse"][:1])


def test_decode_loop_appends_one_token_per_step(generator):
    """An eager decode loop: each step appends one token and advances cache_seqlens on the device;
    every step matches the reference (the prepared launch of step 1 serves the rest)."""
    case = KVCacheCase(lengths=(100, 7, 0), seqlen_new=1, rotary_dim=64, page_size=16, num_splits=2)
    args = make_kvcache_inputs(case, DEVICE, generator)
    for _ in range(4):
        run_kvcache_case(case, flashsplit.decode, DEVICE, generator, args=args)
        args["cache_seqlens"] += 1
        for name in ("q", "k", "v"):
            args[name] = torch.randn(args[name].shape, generator=generator).to(DEVICE, args[name].dtype)
    assert args["cache_seqlens"].tolist() == [104, 11, 4]


def test_decode_does_not_change_q_or_cache_seqlens(generator):
    case = KVCacheCase(rotary_dim=64, seqlen_new=2, lengths=(10, 20, 30))
    args = make_kvcache_inputs(case, DEVICE, generator)
    q, seqlens = args["q"].clone(), args["cache_seqlens"].clone()
    flashsplit.decode(**args, **case.options())
    assert torch.equal(args["q"], q) and torch.equal(args["cache_seqlens"], seqlens)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["auto", "triton", "cute"])
@pytest.mark.parametrize("page_size, rotary_dim, num_splits", [(0, 0, 0), (16, 128, 0), (0, 64, 8)])
def test_graph_captured_decode_loop_equals_eager(backend, page_size, rotary_dim, num_splits, generator):
    """A CUDA graph of one decode step that appends one token and advances cache_seqlens on the
    device, replayed step after step with new q, k, v, equals the eager loop bit for bit (out,
    LSE, caches, lengths); the eager loop's last step matches the reference."""
    from flashsplit.api import decode_into
    from flashsplit.testing_kvcache import check_caches, check_kvcache_attention

    case = KVCacheCase(dtype=torch.bfloat16, batch=4, seqlen_k=4096, num_heads_kv=8, group=4, head_dim=128,
                       lengths=(4000, 100, 1, 2040), page_size=page_size, rotary_dim=rotary_dim, causal=True,
                       num_splits=num_splits)
    steps = 6
    if page_size:  # the pages allocated for each row's first new key also hold the later ones
        assert all(-(-(n + steps) // page_size) == -(-(n + 1) // page_size) for n in case.lengths)
    start = make_kvcache_inputs(case, "cuda", generator)
    news = [{n: torch.randn(start[n].shape, generator=generator).to("cuda", start[n].dtype) for n in ("q", "k", "v")}
            for _ in range(steps)]

    def step(a, out, lse):
        decode_into(a["q"], a["k_cache"], a["v_cache"], out, lse, cache_seqlens=a["cache_seqlens"],
                    block_table=a.get("block_table"), k=a["k"], v=a["v"], rotary_cos=a.get("rotary_cos"),
                    rotary_sin=a.get("rotary_sin"), causal=True, num_splits=num_splits, backend=backend)
        a["cache_seqlens"].add_(1)

    def fresh():
        a = {n: t.clone() for n, t in start.items()}
        return a, torch.empty_like(a["q"]), torch.empty(4, 32, 1, device="cuda")

    eager, out, lse = fresh()
    eager_results = []
    for new in news:
        for n, t in new.items():
            eager[n].copy_(t)
        before = {n: t.clone() for n, t in eager.items()}
        step(eager, out, lse)
        eager_results.append((out.clone(), lse.clone()))
    expected = expected_caches(case, before)
    check_caches(case, eager["k_cache"], eager["v_cache"], expected)
    check_kvcache_attention(case, before, expected, out, lse)

    warm, warm_out, warm_lse = fresh()  # compile and prepare on a side stream, outside the capture
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step(warm, warm_out, warm_lse)
    torch.cuda.current_stream().wait_stream(side)
    static, out, lse = fresh()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step(static, out, lse)
    static["cache_seqlens"].copy_(start["cache_seqlens"])  # capturing ran nothing; be explicit
    for i, new in enumerate(news):
        for n, t in new.items():
            static[n].copy_(t)
        graph.replay()
        assert torch.equal(out, eager_results[i][0]) and torch.equal(lse, eager_results[i][1]), f"step {i}"
    for name in ("k_cache", "v_cache"):
        assert torch.equal(static[name].view(torch.uint8), eager[name].view(torch.uint8)), name
    assert torch.equal(static["cache_seqlens"], eager["cache_seqlens"])


# -- the reference itself -------------------------------------------------------------------

@pytest.mark.parametrize("interleaved", [True, False])
def test_rotary_reference_matches_the_definition(interleaved, generator):
    """rotary_ref against a loop over tokens and pairs: pair j of a token at position p turns by
    the angle of cos[p, j], sin[p, j]; features past rotary_dim pass through."""
    x = torch.randn(2, 3, 2, 16, generator=generator, dtype=torch.float64)
    angles = torch.rand(10, 4, generator=generator, dtype=torch.float64) * 6
    positions = torch.tensor([[0, 4, 9], [3, 3, 20]])  # 20: past the table, clamped to 9
    got = flashsplit.reference.rotary_ref(x, angles.cos(), angles.sin(), positions, interleaved)
    want = x.clone()
    for b in range(2):
        for t in range(3):
            p = min(int(positions[b, t]), 9)
            for j in range(4):
                i0, i1 = (2 * j, 2 * j + 1) if interleaved else (j, j + 4)
                c, s = angles[p, j].cos(), angles[p, j].sin()
                want[b, t, :, i0] = x[b, t, :, i0] * c - x[b, t, :, i1] * s
                want[b, t, :, i1] = x[b, t, :, i0] * s + x[b, t, :, i1] * c
    torch.testing.assert_close(got, want)
    assert torch.equal(got[..., 8:], x[..., 8:])


def test_leftpad_reference_is_attention_over_the_real_keys(generator):
    """attention_ref with cache_leftpad p equals attention_ref over the row's keys [p, n) moved
    to the front (causal and windowed masks count from the first real key)."""
    q = torch.randn(1, 3, 4, 16, generator=generator)
    k = torch.randn(1, 50, 2, 16, generator=generator)
    v = torch.randn(1, 50, 2, 16, generator=generator)
    k[:, :7] = float("nan")
    v[:, :7] = float("nan")
    seqlens = torch.tensor([40], dtype=torch.int32)
    for window in ((-1, -1), (5, 0)):
        padded = flashsplit.reference.attention_ref(q, k, v, seqlens, causal=True, window_size=window,
                                                    cache_leftpad=torch.tensor([7], dtype=torch.int32))
        moved = flashsplit.reference.attention_ref(q, k[:, 7:], v[:, 7:], seqlens - 7, causal=True, window_size=window)
        torch.testing.assert_close(padded[0], moved[0])
        torch.testing.assert_close(padded[1], moved[1])
