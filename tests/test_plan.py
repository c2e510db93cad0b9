"""The shared split plan: boundary rule, heuristic golden tables, plan()."""

import pytest
import torch

import flashsplit
from flashsplit.plan import SPLIT_GRANULE, choose_num_splits, split_bounds, splits_used, tokens_per_split


@pytest.mark.parametrize("seqlen", [0, 1, 127, 128, 129, 300, 1000, 4096, 131071])
@pytest.mark.parametrize("num_splits", [1, 2, 3, 17, 256])
def test_split_bounds_tile_the_row(seqlen, num_splits):
    bounds = split_bounds(seqlen, num_splits)
    assert len(bounds) == num_splits
    covered = [k for start, end in bounds for k in range(start, max(start, end))]
    assert covered == list(range(seqlen)), "splits must cover every key exactly once, in order"
    used = splits_used(seqlen, num_splits)
    for s, (start, end) in enumerate(bounds):
        assert start % SPLIT_GRANULE == 0, "every split starts on a granule"
        assert (end > start) == (s < used), "only splits after the last key may be empty"


def test_split_bounds_worked_examples():
    assert split_bounds(1000, 4) == [(0, 256), (256, 512), (512, 768), (768, 1000)]
    assert split_bounds(300, 4) == [(0, 128), (128, 256), (256, 300), (384, 300)]
    assert tokens_per_split(0, 5) == 0 and splits_used(0, 5) == 0


# Golden table, 132 SMs. work units = batch * heads_kv * row blocks (GQA packed, 1 row block).
@pytest.mark.parametrize(
    "work_units, seqlen_k, units_per_sm, expected",
    [
        (8, 32768, 1, 16),      # FA3's example, b=1, 8 KV heads: 16 splits (FA3's 0.85 slack: 15)
        (8, 32768, 2, 32),      # 2 CTAs per SM: 264 slots, 0.97 of a wave
        (8, 131072, 2, 32),
        (8, 16384, 2, 32),
        (8, 1024, 2, 8),        # capped by the 8 granules of a 1k cache
        (8, 256, 2, 1),         # 2 granules: never split
        (32, 16384, 2, 8),      # b=4: 32 * 8 / 264 = 0.97 of a wave
        (128, 16384, 2, 2),     # b=16: 2 splits (H200, 16k keys: 6% faster than FA3's 1)
        (128, 16384, 1, 1),     # b=16 on 132 slots: 0.97 busy, no split
        (512, 1024, 2, 1),      # b=64 already fills the machine
    ],
)
def test_heuristic_golden_table(work_units, seqlen_k, units_per_sm, expected):
    num_splits, reason = choose_num_splits(work_units, seqlen_k, num_sms=132, units_per_sm=units_per_sm)
    assert num_splits == expected, reason
    assert reason


def test_heuristic_never_leaves_a_split_empty_at_capacity():
    for units in (1, 3, 8, 40, 100):
        for seqlen_k in (384, 1000, 5000, 40000, 131072):
            s, _ = choose_num_splits(units, seqlen_k, 132, 2)
            assert splits_used(seqlen_k, s) == s


def test_plan_reports_choice_and_grid():
    p = flashsplit.plan(1, 32768, 32, 8, 128, num_sms=132, backend="triton")
    assert (p.num_splits, p.grid, p.block_m, p.row_blocks, p.runs_combine) == (32, (32, 1, 8), 16, 1, True)
    assert p.tokens_per_split == 8 * 128
    assert "triton" in str(p) and "32 split" in str(p)
    assert p.boundaries(300)[:3] == [(0, 128), (128, 256), (256, 300)]


@pytest.mark.parametrize("kv_dtype", [None, torch.float8_e4m3fn])
@pytest.mark.parametrize("heads, batch, seqlen_k, page_size, splits, per_sm", [
    ((32, 8), 1, 4096, 0, 16, 1), ((64, 8), 1, 4096, 0, 16, 1),  # 32 one-granule splits at 2/SM: halved
    ((32, 8), 1, 2048, 0, 16, 2), ((32, 8), 2, 2048, 0, 16, 2), ((32, 8), 4, 1024, 0, 8, 2),  # fewer: kept
    ((32, 32), 1, 1024, 0, 8, 2), ((32, 8), 1, 3000, 0, 24, 2),
    ((32, 8), 1, 4096, 16, 32, 2),  # paged: kept
    ((32, 8), 1, 16384, 0, 32, 2), ((32, 8), 1, 131072, 0, 32, 2),  # splits of several granules
])
def test_triton_plans_one_program_per_sm_for_many_single_granule_splits(kv_dtype, heads, batch, seqlen_k, page_size,
                                                                        splits, per_sm):
    # (the H200: on the H100 long fp8 splits are halved too, see the next test)
    p = flashsplit.plan(batch, seqlen_k, *heads, 128, kv_dtype=kv_dtype, page_size=page_size, gpu="h200",
                        device="cuda", backend="triton")
    assert (p.num_splits, p.units_per_sm) == (splits, per_sm), p
    invariant = flashsplit.plan(batch, seqlen_k, *heads, 128, kv_dtype=kv_dtype, page_size=page_size, gpu="h200",
                                device="cuda", backend="triton", batch_invariant=True)
    assert invariant.units_per_sm == 2


@pytest.mark.parametrize("gpu, kv_dtype, batch, seqlen_k, page_size, splits, per_sm", [
    ("h100", torch.float8_e4m3fn, 1, 131072, 0, 16, 1), ("h100", torch.float8_e5m2, 1, 65536, 0, 16, 1),
    ("h100", torch.float8_e4m3fn, 16, 131072, 0, 1, 1), ("h100", torch.float8_e4m3fn, 4, 16384, 0, 4, 1),
    ("h100", torch.float8_e4m3fn, 1, 32768, 0, 32, 2),  # halved splits of 2k keys: kept
    ("h100", torch.float8_e4m3fn, 1, 131072, 16, 32, 2),  # paged: kept
    ("h100", torch.float8_e4m3fn, 64, 131072, 0, 1, 2),  # one split either way: kept
    ("h100", None, 1, 131072, 0, 32, 2),  # 16-bit cache: kept
    ("h200", torch.float8_e4m3fn, 1, 131072, 0, 32, 2), ("h200", torch.float8_e4m3fn, 16, 131072, 0, 2, 2),
])
def test_triton_halves_long_fp8_splits_on_the_h100_only(gpu, kv_dtype, batch, seqlen_k, page_size, splits, per_sm):
    p = flashsplit.plan(batch, seqlen_k, 32, 8, 128, kv_dtype=kv_dtype, page_size=page_size, gpu=gpu, device="cuda",
                        backend="triton")
    assert (p.num_splits, p.units_per_sm) == (splits, per_sm), p
    if per_sm == 1:
        assert p.tokens_per_split >= 4096


def test_plan_override_and_packed_rows():
    p = flashsplit.plan(2, 4096, 64, 2, 128, seqlen_q=4, num_splits=5, num_sms=132, backend="triton")
    # 4 queries x 32 q heads per KV head = 128 packed rows = 2 row blocks of 64.
    assert (p.num_splits, p.split_reason, p.block_m, p.row_blocks, p.grid) == (5, "requested", 64, 2, (5, 2, 4))


def test_plan_depends_on_static_shapes_only():
    a = flashsplit.plan(4, 65536, 32, 8, 128, num_sms=132, has_cache_seqlens=True, backend="triton")
    b = flashsplit.plan(4, 65536, 32, 8, 128, num_sms=132, has_cache_seqlens=False, backend="triton")
    assert a.num_splits == b.num_splits


@pytest.mark.parametrize("kwargs, match", [
    (dict(num_splits=257), "num_splits"),
    (dict(num_splits=-1), "num_splits"),
    (dict(backend="nope"), "backend"),
])
def test_plan_rejects_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        flashsplit.plan(1, 1024, 32, 8, 128, **kwargs)


def test_plan_rejects_bad_heads():
    with pytest.raises(ValueError, match="num_heads"):
        flashsplit.plan(1, 1024, 30, 8, 128)
    with pytest.raises(ValueError, match="batch"):
        flashsplit.plan(-1, 1024, 32, 8, 128)
