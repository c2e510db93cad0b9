"""The MLA split kernel on a Hopper GPU against a float64 reference written from the semantics.

MLA decode: q ``[B, s_q, H_q, 576]`` attends one shared latent KV head (K: all 576 features, V:
the first 512); query token ``i`` of ``s_q`` sees keys ``< n - s_q + 1 + i`` when causal. Each
split's partials are compared with the reference restricted to that split's keys
(``flashsplit.plan.split_bounds``), and the partials merged in float64 with the whole
attention. Errors are judged against PyTorch's in the same dtype. Unused cache slots and pages
hold NaN, the partials start as NaN. The last test also prints timings (CUDA graph replay,
median, caches rotated out of L2); they are not asserted.
"""

from __future__ import annotations

import math

import pytest
import torch

from flashsplit.plan import split_bounds

from conftest import CUTE_GPU_MARKS

pytestmark = CUTE_GPU_MARKS

D, DV, PAGE = 576, 512, 64


def _inputs(batch, seqlen_q, heads, lengths, dtype, paged, gen, capacity=None, fp8=False, descale_rows=False):
    """q, the cache (NaN past each row's length and in unused pages), its block table (or None),
    the int32 lengths, the keys the cache holds (fp32 ``[B, capacity, 576]``, dequantized) and
    the descale of an e4m3 cache (one element, or ``[B, 1]`` with ``descale_rows``; else None),
    on the GPU."""
    capacity = capacity or max(max(lengths), 1)
    q = torch.randn(batch, seqlen_q, heads, D, generator=gen).to(dtype)
    keys = torch.randn(batch, capacity, D, generator=gen).to(dtype).float()
    for b, n in enumerate(lengths):
        keys[b, n:] = float("nan")
    storage, descale = dtype, None
    if fp8:  # the cache holds keys / descale in e4m3; the reference attends what it holds
        storage = torch.float8_e4m3fn
        descale = 0.01 + 0.02 * torch.rand(batch if descale_rows else 1, 1, generator=gen)
        keys = (keys / descale[:, :, None]).to(storage).float()
    if not paged:
        cache, table = keys[:, :, None, :], None
    else:
        pages_per_row = -(-capacity // PAGE)
        num_pages = batch * pages_per_row + 3  # spare pages: NaN, never referenced
        cache = torch.full((num_pages, PAGE, 1, D), float("nan"))
        perm = torch.randperm(num_pages, generator=gen)
        table = torch.full((batch, pages_per_row + 2), 10**6, dtype=torch.int32)  # garbage past a row's pages
        for b, n in enumerate(lengths):
            for p in range(-(-n // PAGE)):
                page = int(perm[b * pages_per_row + p])
                table[b, p] = page
                rows = keys[b, p * PAGE:(p + 1) * PAGE]
                cache[page, :rows.shape[0], 0] = rows
        table = table.cuda()
    real_keys = keys * descale[:, :, None] if fp8 else keys
    return (q.cuda(), cache.to(storage).cuda(), table, torch.tensor(lengths, dtype=torch.int32).cuda(),
            real_keys.cuda(), None if descale is None else (descale if descale_rows else descale.view(1)).cuda())


def _attend(q, keys, n, lo, hi, causal, scale, dtype):
    """Partial attention of one batch row over keys ``[lo, hi)`` of its ``n`` (each query sees
    its causal prefix): ``(O [s_q, H, 512], lse [H, s_q])`` in float64 (``dtype`` float64) or
    computed by PyTorch in ``dtype`` (scores and P rounded to it). Rows that see no key: O 0,
    lse -inf."""
    seqlen_q, heads = q.shape[0], q.shape[1]
    out = torch.zeros(seqlen_q, heads, DV, dtype=torch.float64, device=q.device)
    lse = torch.full((heads, seqlen_q), -math.inf, dtype=torch.float64, device=q.device)
    for i in range(seqlen_q):
        stop = min(hi, n - seqlen_q + 1 + i) if causal else hi
        if stop <= lo:
            continue
        k = keys[lo:stop].to(dtype)
        s = (q[i].to(dtype) @ k.T).to(torch.float64) * scale  # [H, keys]
        m = s.max(dim=1, keepdim=True).values
        e = torch.exp(s - m)
        total = e.sum(dim=1, keepdim=True)
        p = (e / total).to(dtype)
        out[i] = (p @ k[:, :DV]).to(torch.float64)
        lse[:, i] = (m + torch.log(total)).squeeze(1)
    return out, lse


def _merge(out_partial, lse_partial):
    """float64 combine of the partials: ``[B, s_q, H, 512]`` and ``[B, H, s_q]``."""
    lse_p = lse_partial.to(torch.float64)
    top = lse_p.max(dim=0).values
    safe = torch.where(torch.isinf(top), torch.zeros_like(top), top)
    w = torch.exp(lse_p - safe)  # [S, B, H, s_q]; 0 for empty splits
    total = w.sum(dim=0)
    lse = torch.where(total > 0, safe + torch.log(total), torch.full_like(total, -math.inf))
    w = torch.where(total > 0, w / total, torch.zeros_like(w))
    out = (w.permute(0, 1, 3, 2)[..., None] * torch.nan_to_num(out_partial.to(torch.float64))).sum(dim=0)
    return out, lse


def _run(batch, seqlen_q, heads, lengths, dtype, paged, causal, num_splits, gen, capacity=None, fp8=False,
         descale_rows=False):
    from flashsplit.cute.mla_launcher import mla_split_forward

    q, cache, table, seqlens, keys, descale = _inputs(batch, seqlen_q, heads, lengths, dtype, paged, gen, capacity,
                                                      fp8, descale_rows)
    scale = D ** -0.5
    out_p = torch.full((num_splits, batch, seqlen_q, heads, DV), float("nan"), device="cuda")
    lse_p = torch.full((num_splits, batch, heads, seqlen_q), float("nan"), device="cuda")
    mla_split_forward(q, cache, seqlens, table, out_p, lse_p, softmax_scale=scale, causal=causal,
                      num_splits=num_splits, kv_descale=descale)
    torch.cuda.synchronize()
    assert not out_p.isnan().any() and not lse_p.isnan().any(), "the kernel left NaN in its partials"
    for b, n in enumerate(lengths):
        bounds = split_bounds(n, num_splits)
        for s in range(num_splits):
            lo, hi = bounds[s]
            ref_o, ref_lse = _attend(q[b], keys[b], n, lo, hi, causal, scale, torch.float64)
            low_o, _ = _attend(q[b], keys[b], n, lo, hi, causal, scale, dtype)
            got_o, got_lse = out_p[s, b].to(torch.float64), lse_p[s, b].to(torch.float64)
            empty = torch.isinf(ref_lse)
            assert torch.equal(torch.isinf(got_lse), empty), (b, s, got_lse, ref_lse)
            assert torch.allclose(got_lse[~empty], ref_lse[~empty], atol=1e-3, rtol=1e-4), (b, s)
            base = (low_o - ref_o).abs().max().item()
            err = (got_o - ref_o).abs().max().item()
            assert err <= 2 * base + 2e-3, (b, s, err, base)
    out, lse = _merge(out_p, lse_p)
    for b, n in enumerate(lengths):
        ref_o, ref_lse = _attend(q[b], keys[b], n, 0, n, causal, scale, torch.float64)
        low_o, _ = _attend(q[b], keys[b], n, 0, n, causal, scale, dtype)
        base = (low_o - ref_o).abs().max().item()
        assert (out[b] - ref_o).abs().max().item() <= 2 * base + 2e-3, b
        finite = ~torch.isinf(ref_lse)
        assert torch.equal(torch.isinf(lse[b]), ~finite)
        assert torch.allclose(lse[b][finite], ref_lse[finite], atol=1e-3, rtol=1e-4)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("heads,seqlen_q,causal", [(16, 1, False), (16, 2, True), (128, 1, False), (128, 2, True)])
def test_mla_split_matches_reference(dtype, paged, heads, seqlen_q, causal, generator):
    """Three rows of random lengths (one of 0 keys, one of 1), 3 splits."""
    lengths = [int(torch.randint(200, 700, (1,), generator=generator)), 0, 1]
    _run(3, seqlen_q, heads, lengths, dtype, paged, causal, 3, generator)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("heads,seqlen_q,causal,descale_rows", [(16, 1, False, False), (128, 2, True, True)])
def test_mla_fp8_cache_matches_reference(dtype, heads, seqlen_q, causal, descale_rows, generator):
    """An e4m3 cache, paged, with one descale or one per batch row ([B, 1]): the reference
    attends its dequantized keys."""
    lengths = [int(torch.randint(200, 700, (1,), generator=generator)), 0, 1]
    _run(3, seqlen_q, heads, lengths, dtype, True, causal, 3, generator, fp8=True, descale_rows=descale_rows)


@pytest.mark.parametrize("num_splits", [1, 2, 7])
def test_mla_split_counts_and_partial_tiles(num_splits, generator):
    """One row whose length ends inside a tile, split 1, 2 and 7 ways (some splits empty)."""
    _run(1, 1, 16, [517], torch.bfloat16, True, False, num_splits, generator)


def test_mla_causal_rows_without_keys(generator):
    """s_q 4 causal over 1-3 keys: the first queries see no key (LSE -inf, O 0)."""
    _run(3, 4, 16, [1, 2, 3], torch.bfloat16, False, True, 2, generator, capacity=70)


def test_mla_same_compile_for_new_shapes(generator):
    """New batch sizes, lengths, head counts and split counts reuse the compiled kernel."""
    from flashsplit.cute.mla_launcher import mla_compile_cache_size

    _run(1, 1, 16, [300], torch.bfloat16, True, False, 2, generator)
    before = mla_compile_cache_size()
    _run(2, 1, 32, [100, 900], torch.bfloat16, True, False, 5, generator)
    assert mla_compile_cache_size() == before


def test_mla_empty_batch_and_empty_cache():
    """No batch rows: nothing to write. A cache of no keys: every split empty (LSE -inf, O 0)."""
    from flashsplit.cute.mla_launcher import mla_split_forward

    q = torch.randn(0, 1, 16, D, device="cuda", dtype=torch.bfloat16)
    mla_split_forward(q, torch.randn(0, 64, 1, D, device="cuda", dtype=torch.bfloat16),
                      torch.zeros(0, dtype=torch.int32, device="cuda"), None,
                      torch.empty(2, 0, 1, 16, DV, device="cuda"), torch.empty(2, 0, 16, 1, device="cuda"),
                      softmax_scale=0.1, causal=False, num_splits=2)
    q = torch.randn(2, 1, 16, D, device="cuda", dtype=torch.bfloat16)
    out = torch.full((2, 2, 1, 16, DV), float("nan"), device="cuda")
    lse = torch.full((2, 2, 16, 1), float("nan"), device="cuda")
    mla_split_forward(q, torch.randn(2, 0, 1, D, device="cuda", dtype=torch.bfloat16),
                      torch.tensor([5, 0], dtype=torch.int32, device="cuda"), None, out, lse, softmax_scale=0.1,
                      causal=False, num_splits=2)
    assert torch.equal(out, torch.zeros_like(out)) and torch.isneginf(lse).all()


def test_mla_rejects_bad_input():
    from flashsplit.cute.mla_launcher import mla_split_forward

    q = torch.randn(1, 1, 16, 576, device="cuda", dtype=torch.bfloat16)
    cache = torch.randn(1, 128, 1, 576, device="cuda", dtype=torch.float16)
    seqlens = torch.tensor([100], dtype=torch.int32, device="cuda")
    out = torch.empty(2, 1, 1, 16, 512, device="cuda")
    lse = torch.empty(2, 1, 16, 1, device="cuda")
    with pytest.raises(ValueError, match="kv_cache"):
        mla_split_forward(q, cache, seqlens, None, out, lse, softmax_scale=0.1, causal=False, num_splits=2)
    with pytest.raises(ValueError, match="out_partial"):
        mla_split_forward(q, cache.bfloat16(), seqlens, None, out[:1], lse, softmax_scale=0.1, causal=False,
                          num_splits=2)
    with pytest.raises(ValueError, match="kv_descale"):
        mla_split_forward(q, cache.bfloat16(), seqlens, None, out, lse, softmax_scale=0.1, causal=False,
                          num_splits=2, kv_descale=torch.ones(1, device="cuda"))


def _paged_on_gpu(batch, heads, length, seed):
    """A full paged bf16 cache built on the GPU (shuffled pages), for timing: q, cache, table,
    lengths."""
    g = torch.Generator(device="cuda")
    g.manual_seed(seed)
    pages = length // PAGE
    cache = torch.randn(batch * pages, PAGE, 1, D, device="cuda", dtype=torch.bfloat16, generator=g)
    table = torch.randperm(batch * pages, device="cuda", generator=g).to(torch.int32).view(batch, pages)
    q = torch.randn(batch, 1, heads, D, device="cuda", dtype=torch.bfloat16, generator=g)
    return q, cache, table, torch.full((batch,), length, dtype=torch.int32, device="cuda")


def test_mla_split_timings():
    """Checks each cell's decode of row 0, then prints its split kernel's time: H_q 16 and 128,
    B 1 and 32, L 4k and 16k, bf16, pages of 64, the plan's split count for one CTA per SM (the
    partials' combine excluded). Device time per call: the median replay of a CUDA graph of
    calls cycling caches that together exceed the L2 (``flashsplit.bench.timing``). TFLOPS
    count 2 x (576 + 512) per q row and key; GB/s the cache read."""
    from flashsplit.bench.timing import TimingConfig, calls_per_graph, time_graph
    from flashsplit.cute.mla_launcher import mla_split_forward
    from flashsplit.plan import choose_num_splits

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"\n{torch.cuda.get_device_name(0)}: MLA split kernel, bf16, pages of {PAGE}, graph replay median")
    for heads in (16, 128):
        for batch in (1, 32):
            for length in (4096, 16384):
                row_blocks = -(-heads // 64)
                splits, _ = choose_num_splits(batch * row_blocks, length, sms, 1)
                cache_bytes = batch * length * D * 2
                copies = max(1, min(64, -(-(200 << 20) // cache_bytes)))  # 200 MB: past L2
                inputs = [_paged_on_gpu(batch, heads, length, c) for c in range(copies)]
                out_p = torch.empty(splits, batch, 1, heads, DV, device="cuda")
                lse_p = torch.empty(splits, batch, heads, 1, device="cuda")

                def call(c):
                    q, cache, table, seqlens = inputs[c]
                    mla_split_forward(q, cache, seqlens, table, out_p, lse_p, softmax_scale=D ** -0.5,
                                      causal=False, num_splits=splits)

                call(0)
                q, cache, table, _ = inputs[0]
                keys = cache[table[0].long()].reshape(length, D)
                out, _ = _merge(out_p, lse_p)
                ref, _ = _attend(q[0], keys, length, 0, length, False, D ** -0.5, torch.float64)
                low, _ = _attend(q[0], keys, length, 0, length, False, D ** -0.5, torch.bfloat16)
                assert (out[0] - ref).abs().max().item() <= 2 * (low - ref).abs().max().item() + 2e-3
                config = TimingConfig()
                us = time_graph(call, copies, config, calls_per_graph(config, copies))
                flops = 2 * batch * heads * length * (D + DV)
                print(f"H_q {heads:3d} B {batch:2d} L {length:5d} splits {splits:3d}: {us:9.1f} us "
                      f"{flops / us / 1e6:7.1f} TFLOPS {cache_bytes / us / 1e3:7.1f} GB/s")
                del inputs
