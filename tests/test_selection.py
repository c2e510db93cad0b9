"""auto's selection rules (flashsplit.selection): each rule fires where its docstring says, its
thresholds sit where it says, and plan() reports the rule, also for a named GPU from a CPU machine."""

import dataclasses
import importlib.util
import math

import pytest
import torch

import flashsplit
from flashsplit import selection
from flashsplit.problem import DecodeProblem
from flashsplit.registry import get, select
from flashsplit.target import KNOWN_GPUS, GpuTarget
from flashsplit.cute.backend import CUTLASS_MISSING

HAS_CUTLASS = importlib.util.find_spec("cutlass") is not None
needs_cutlass = pytest.mark.skipif(not HAS_CUTLASS, reason=CUTLASS_MISSING)
FP8 = torch.float8_e4m3fn
H200 = KNOWN_GPUS["h200"]
#: The hand rules' GPU in these tests: an H200's SM count, no measured table (the H200 and the
#: H100 have one, which decides the classes it timed before the hand rules after ``measured``).
RULES_GPU = GpuTarget("NVIDIA H100 NVL", 132, (9, 0))


def _problem(batch=1, seqlen_k=4096, num_heads=32, num_heads_kv=8, head_dim=128, seqlen_q=1, dtype=torch.bfloat16,
             kv_dtype=None, page_size=0, gpu=RULES_GPU, window_left=-1, **cache_update):
    return DecodeProblem(batch=batch, seqlen_q=seqlen_q, seqlen_k=seqlen_k, num_heads=num_heads,
                         num_heads_kv=num_heads_kv, head_dim=head_dim, dtype=dtype, causal=seqlen_q > 1,
                         has_cache_seqlens=True, device_type="cuda", kv_dtype=kv_dtype, page_size=page_size, gpu=gpu,
                         window_left=window_left, **cache_update)


def test_docstring_table_lists_every_rule_in_order():
    names = [rule.name for rule in selection.RULES]
    assert names[-1] == "default" and len(set(names)) == len(names)
    positions = [selection.__doc__.index(f"``{name}``") for name in names]
    assert positions == sorted(positions)
    for rule in selection.RULES:
        assert rule.backend in flashsplit.backends() or (rule.name, rule.backend) == ("measured", "either")


# (problem, rule): each hand rule on problems measured on the H200 (decided here for a GPU of its
# SM count without a table), Llama-3-8B heads unless named.
GOLDEN = [
    (_problem(batch=16, seqlen_k=16384, seqlen_new=1), "cache-update"),  # cute would take it without the append
    (_problem(page_size=16, seqlen_new=1, rotary_dim=128), "cache-update"),
    (_problem(batch=16, seqlen_k=16384, has_leftpad=True), "cache-update"),
    (_problem(batch=16, seqlen_k=16384, has_batch_idx=True), "cache-update"),
    (_problem(page_size=48), "paged-gathered"),
    (_problem(page_size=1, batch=16), "paged-gathered"),
    (_problem(page_size=3, kv_dtype=FP8), "paged-gathered"),
    (_problem(page_size=16), "paged-tma"),
    (_problem(page_size=128, batch=64), "paged-tma"),
    (_problem(page_size=16, kv_dtype=FP8), "default"),  # fp8 pages: Triton reads fp8 V in pairs
    (_problem(seqlen_k=129), "short-span"),
    (_problem(batch=16, seqlen_k=129), "short-span"),
    (_problem(seqlen_k=4096, window_left=128), "short-span"),
    (_problem(batch=16, seqlen_k=16384, window_left=128), "short-span"),
    (_problem(seqlen_k=129, page_size=16), "paged-tma"),
    (_problem(seqlen_k=384), "swapped-operands"),
    (_problem(seqlen_k=1024), "swapped-operands"),
    (_problem(seqlen_k=16384, window_left=4096), "swapped-operands"),
    (_problem(batch=16, seqlen_k=4096), "one-cta-per-sm"),
    (_problem(batch=16, seqlen_k=16384), "one-cta-per-sm"),
    (_problem(batch=4, seqlen_k=131072), "one-cta-per-sm"),
    (_problem(batch=4, seqlen_k=4096, num_heads_kv=32), "one-cta-per-sm"),  # Llama-2-7B heads
    (_problem(batch=1, seqlen_k=4096), "swapped-operands"),
    (_problem(batch=1, seqlen_k=16384), "swapped-operands"),
    (_problem(batch=1, seqlen_k=131072), "swapped-operands"),
    (_problem(batch=4, seqlen_k=4096), "swapped-operands"),
    (_problem(batch=1, seqlen_k=4096, num_heads_kv=32), "swapped-operands"),
    (_problem(batch=1, seqlen_k=2048), "swapped-operands"),
    (_problem(batch=2, seqlen_k=4096), "swapped-operands"),
    (_problem(batch=4, seqlen_k=4096, num_heads_kv=32), "one-cta-per-sm"),
    (_problem(batch=16, seqlen_k=131072, dtype=torch.float16), "one-cta-per-sm"),  # one split of 128k keys
    (_problem(batch=32, seqlen_k=4096, num_heads=64), "swapped-operands"),  # 8 packed rows, 256 CTAs
    (_problem(batch=64, seqlen_k=4096, num_heads=64), "gqa-fills-machine"),  # two waves
    (_problem(batch=8, seqlen_k=4096), "swapped-operands"),
    (_problem(batch=64, seqlen_k=4096), "gqa-fills-machine"),
    (_problem(batch=64, seqlen_k=1024), "many-short-rows"),
    (_problem(batch=64, seqlen_k=1152), "gqa-fills-machine"),
    (_problem(batch=64, seqlen_k=131072), "gqa-fills-machine"),
    (_problem(batch=16, seqlen_k=131072), "one-cta-per-sm"),  # 128 units: one split of 128k keys a CTA
    (_problem(batch=16, seqlen_k=65536, num_heads=40), "one-cta-per-sm"),
    (_problem(batch=4, seqlen_k=65536, num_heads_kv=32), "one-cta-per-sm"),  # Llama-2-7B heads
    (_problem(batch=3, seqlen_k=307200, num_heads_kv=32), "one-cta-per-sm"),  # 96 units, 4 splits of 75k
    (_problem(batch=8, seqlen_k=4096, seqlen_q=4), "gqa-fills-machine"),  # 16 packed rows, 64 units
    (_problem(batch=1, seqlen_k=131072, seqlen_q=4), "wide-rows"),
    (_problem(batch=4, seqlen_k=4096, seqlen_q=4), "wide-rows"),
    (_problem(batch=64, seqlen_k=4096, seqlen_q=4), "gqa-fills-machine"),  # 512 units
    (_problem(batch=16, seqlen_k=1024, seqlen_q=4), "gqa-fills-machine"),  # cute runs it unsplit in one wave
    (_problem(batch=16, seqlen_k=16384, seqlen_q=4), "one-cta-per-sm"),
    (_problem(batch=1, seqlen_k=307200, seqlen_q=4), "one-cta-per-sm"),
    (_problem(batch=1, seqlen_k=4096, seqlen_q=2), "swapped-operands"),  # 8 packed rows
    (_problem(batch=1, seqlen_k=131072, batch_invariant=True), "batch-invariant"),
    (_problem(batch=64, seqlen_k=4096, page_size=16, batch_invariant=True), "batch-invariant"),
    (_problem(batch=16, seqlen_k=16384, num_heads_kv=32), "default"),  # one packed row, two waves
    (_problem(batch=64, seqlen_k=1024, num_heads_kv=32), "mha-many-waves"),  # Llama-2-7B heads, 2048 units
    (_problem(batch=64, seqlen_k=65536, num_heads_kv=32), "mha-many-waves"),
    (_problem(batch=32, seqlen_k=4096, num_heads_kv=32), "default"),  # 1024 units
    (_problem(batch=64, seqlen_k=4096, num_heads_kv=32, kv_dtype=FP8), "default"),
    (_problem(batch=64, seqlen_k=4096, num_heads_kv=32, head_dim=64), "d64-d256"),
    (_problem(batch=64, seqlen_k=4096, head_dim=64), "d64-d256"),
    (_problem(batch=64, seqlen_k=4096, head_dim=256), "d64-d256"),
    (_problem(batch=1, seqlen_k=300_000, head_dim=64), "d64-d256"),  # Llama-3.2-1B heads, a long cache
    (_problem(batch=2, seqlen_k=100_000, num_heads=16, num_heads_kv=2, head_dim=256), "d64-d256"),
    (_problem(batch=1, seqlen_k=1024, num_heads=64, head_dim=64), "short-wide-d64"),  # gpt-oss heads
    (_problem(batch=64, seqlen_k=1024, num_heads=64, head_dim=64), "short-wide-d64"),
    (_problem(batch=16, seqlen_k=1024, num_heads=64, head_dim=64), "d64-d256"),  # cute runs it unsplit
    (_problem(batch=16, seqlen_k=1024, head_dim=96), "short-gqa-d96"),  # 128 units, unsplit on cute
    (_problem(batch=16, seqlen_k=4096, head_dim=96), "default"),
    (_problem(batch=1, seqlen_k=4096, num_heads=64, head_dim=64), "d64-d256"),
    (_problem(batch=1, seqlen_k=1024, head_dim=64), "d64-d256"),  # 4 packed rows: cute
    (_problem(batch=16, seqlen_k=1024, num_heads=16, num_heads_kv=16, head_dim=256), "mha-d256-mid-batch"),
    (_problem(batch=16, seqlen_k=131072, num_heads=16, num_heads_kv=16, head_dim=256), "mha-d256-mid-batch"),
    (_problem(batch=16, seqlen_k=4096, num_heads=32, num_heads_kv=32, head_dim=256), "d64-d256"),  # 512 units
    (_problem(batch=1, seqlen_k=4096, num_heads=16, num_heads_kv=16, head_dim=256), "d64-d256"),
    (_problem(batch=64, seqlen_k=4096, num_heads=16, num_heads_kv=8, head_dim=256), "d64-d256"),  # 2 packed rows
    (_problem(batch=64, seqlen_k=4096, num_heads=16, num_heads_kv=16, head_dim=256), "d64-d256"),
    (_problem(batch=16, seqlen_k=4096, head_dim=64, page_size=48), "paged-gathered"),
    (_problem(batch=16, seqlen_k=4096, head_dim=256, kv_dtype=FP8), "default"),
    (_problem(batch=64, seqlen_k=4096, kv_dtype=FP8), "default"),
    (_problem(batch=1, seqlen_k=4096, head_dim=96), "short-gqa-d96"),
    (_problem(batch=4, seqlen_k=16384, head_dim=96), "short-gqa-d96"),
    (_problem(batch=1, seqlen_k=1024, num_heads=16, num_heads_kv=2, head_dim=96, seqlen_q=4), "wide-rows"),  # 32 rows
    (_problem(batch=1, seqlen_k=4096, head_dim=96, seqlen_q=4), "wide-rows"),  # 16 packed rows: cute's 64-row tile
    (_problem(batch=4, seqlen_k=4096, num_heads=28, num_heads_kv=4, head_dim=64, seqlen_q=4), "wide-rows"),
    (_problem(batch=4, seqlen_k=4096, num_heads=16, num_heads_kv=2, head_dim=256, seqlen_q=4), "wide-rows"),
    (_problem(batch=1, seqlen_k=131072, head_dim=96), "default"),  # a long span: Triton
    (_problem(batch=16, seqlen_k=4096, head_dim=96), "default"),  # 128 work units: Triton
    (_problem(batch=1, seqlen_k=4096, num_heads_kv=32, head_dim=96), "default"),  # Phi-3-mini: 32/32, d = 96
    (_problem(batch=4, seqlen_k=4096, head_dim=96, page_size=16), "paged-tma"),
    (_problem(batch=4, seqlen_k=4096, head_dim=96, page_size=24), "paged-gathered"),
    (_problem(batch=1, seqlen_k=4096, head_dim=80), "default"),
]


@pytest.mark.parametrize("problem,rule", GOLDEN, ids=[f"{r}-{i}" for i, (_, r) in enumerate(GOLDEN)])
def test_rule_that_fires(problem, rule):
    assert selection.rule_for(problem).name == rule


@needs_cutlass
@pytest.mark.parametrize("problem,rule", GOLDEN, ids=[f"{r}-{i}" for i, (_, r) in enumerate(GOLDEN)])
def test_auto_runs_the_rules_backend_without_a_table(problem, rule):
    backend, fired, why = select(problem, "auto")
    expected = next(r.backend for r in selection.RULES if r.name == rule)
    if problem.head_dim not in (64, 96, 128, 256):
        expected = "triton"  # cute has no such head dim: the other able backend
    assert (backend.name, fired) == (expected, rule) and rule in why


@pytest.mark.parametrize("kv_dtype", [FP8, torch.float8_e5m2])
def test_auto_never_takes_cute_for_fp8_caches(kv_dtype):
    """cute's fp8 path was 1.6x slower than Triton's (B = 1 x 128k 113.6 vs 69.9 us): every rule
    leaves fp8 caches to Triton, dense or paged, at any shape."""
    import itertools

    shapes = itertools.product([1, 4, 16, 64, 256], [128, 1024, 4096, 16384, 131072], [64, 96, 128, 256], [1, 4],
                               [0, 1, 16, 128], [(32, 8), (32, 32), (64, 8), (16, 2), (40, 8)])
    for batch, seqlen_k, head_dim, seqlen_q, page_size, (heads, heads_kv) in shapes:
        problem = _problem(batch=batch, seqlen_k=seqlen_k, head_dim=head_dim, seqlen_q=seqlen_q, page_size=page_size,
                           num_heads=heads, num_heads_kv=heads_kv, kv_dtype=kv_dtype)
        assert selection.decide(problem)[1] == "triton", problem
        assert selection.decide(dataclasses.replace(problem, gpu=H200))[1] == "triton", problem


def test_thresholds_sit_where_documented():
    """gqa-fills-machine from FILL_UNITS work units, long-splits from LONG_SPLIT_KEYS keys per
    split, both from MIN_PACKED_ROWS packed rows (L_q x q heads per KV head)."""
    fills = selection._gqa_fills_machine
    # 8 packed rows (L_q 2 x 4 q heads) at B x 8 KV heads work units.
    at = _problem(batch=selection.FILL_UNITS // 8, seqlen_q=2, seqlen_k=1024)
    below = _problem(batch=selection.FILL_UNITS // 8 - 1, seqlen_q=2, seqlen_k=1024)
    assert at.work_units(64) == selection.FILL_UNITS and fills(at) and not fills(below)
    few_rows = _problem(batch=64, num_heads=24, num_heads_kv=8)  # 3 packed rows
    assert few_rows.packed_rows == selection.MIN_PACKED_ROWS - 1 and not fills(few_rows)
    short = selection._short_span
    at_most = selection.SHORT_SPAN_KEYS
    assert short(_problem(seqlen_k=at_most)) and not short(_problem(seqlen_k=at_most + 1))
    # A window of w at one query spans w + 1 keys plus the first key's granule alignment (127).
    assert short(_problem(seqlen_k=65536, window_left=selection.SHORT_SPAN_KEYS - 128))
    assert not short(_problem(seqlen_k=65536, window_left=selection.SHORT_SPAN_KEYS - 127))
    few = selection._many_short_rows
    assert few(_problem(batch=64, seqlen_k=selection.SHORT_ROWS_SPAN))
    assert not few(_problem(batch=64, seqlen_k=selection.SHORT_ROWS_SPAN + 1))
    assert not few(_problem(batch=selection.SHORT_ROWS_UNITS // 8 - 1, seqlen_k=1024))
    assert not few(_problem(batch=64, seqlen_k=1024, num_heads_kv=32)), "MHA rows take mha-many-waves"
    mha = selection._mha_many_waves
    units = selection.MHA_CUTE_UNITS
    assert mha(_problem(batch=units // 32, num_heads_kv=32))
    assert not mha(_problem(batch=units // 32 - 1, num_heads_kv=32))
    assert not mha(_problem(batch=units // 8, num_heads_kv=8)), "GQA rows take the packed-row rules"
    wide = selection._short_wide_d64
    rows = selection.WIDE_GROUP_ROWS
    assert wide(_problem(num_heads=8 * rows, head_dim=64, seqlen_k=selection.SHORT_SPAN_D64))
    assert not wide(_problem(num_heads=8 * rows, head_dim=64, seqlen_k=selection.SHORT_SPAN_D64 + 1))
    assert not wide(_problem(num_heads=8 * (rows - 1), head_dim=64, seqlen_k=1024))
    mid = selection._mha_d256_mid_batch
    lo, hi = selection.MHA_D256_UNITS.start, selection.MHA_D256_UNITS.stop
    mha256 = dict(num_heads=16, num_heads_kv=16, head_dim=256)
    assert mid(_problem(batch=lo // 16, **mha256)) and mid(_problem(batch=(hi - 1) // 16, **mha256))
    assert not mid(_problem(batch=lo // 16 - 1, **mha256)) and not mid(_problem(batch=hi // 16, **mha256))
    assert not mid(_problem(batch=lo // 8, num_heads=16, num_heads_kv=8, head_dim=256)), "two packed rows: cute"
    wide = selection._wide_rows
    from flashsplit.cute import configs
    assert configs.SWAP_AB_ROWS == 8
    assert wide(_problem(seqlen_q=3)) and not wide(_problem(seqlen_q=2)), "12 packed rows, 8"
    assert wide(_problem(seqlen_q=4, head_dim=64)) and wide(_problem(seqlen_q=4, head_dim=256)), "cute's head dims"
    assert not wide(_problem(seqlen_q=4, head_dim=80)), "no cute tile at d = 80"
    assert wide(_problem(batch=7, seqlen_q=4)) and not wide(_problem(batch=8, seqlen_q=4)), "56, 64 units"
    assert wide(_problem(batch=4, num_heads=64, num_heads_kv=4)), "64/4 heads: 16 packed rows, 16 units"
    long = selection._long_splits
    # B = 1, L_q 4 (16 packed rows), 8 units: 32 splits of capacity / 32 keys.
    assert long(_problem(seqlen_q=4, seqlen_k=32 * selection.LONG_SPLIT_KEYS))
    assert not long(_problem(seqlen_q=4, seqlen_k=32 * (selection.LONG_SPLIT_KEYS - 128)))


def test_rules_read_the_target_gpu_not_the_local_device():
    """One wave depends on the SM count: B = 16 x 4k (128 work units) fits one wave of one CTA
    per SM on 132 SMs, not on an H100 PCIe's 114."""
    assert selection.rule_for(_problem(batch=16)).name == "one-cta-per-sm"
    assert selection.rule_for(_problem(batch=16, gpu=KNOWN_GPUS["h100-pcie"])).name == "gqa-fills-machine"


@needs_cutlass
def test_fallback_when_the_rules_backend_cannot_run():
    backend, rule, why = select(_problem(gpu=KNOWN_GPUS["a100"]), "auto")
    assert (backend.name, rule) == ("triton", "swapped-operands")
    assert "cannot run it here" in why and "compute capability 9.0" in why


def test_named_backend_is_requested():
    backend, rule, why = select(_problem(head_dim=96), "triton")
    assert (backend.name, rule, why) == ("triton", "requested", "requested")


@needs_cutlass
def test_cute_runs_short_spans_that_fill_one_cta_per_sm_unsplit():
    """128 work units over <= 1k keys fill the H200's 132 SMs once: cute runs them in one split on
    its two-CTA tile (no merge); Triton keeps two splits, and fewer units or longer spans split."""
    from flashsplit.cute import choice

    fills = choice.fills_unsplit
    low, high = math.ceil(0.8 * 132), math.ceil(0.8 * 264)  # work units: one CTA per SM, two
    assert fills(_problem(batch=16, seqlen_k=1024), 132) and fills(_problem(batch=16, seqlen_k=300), 132)
    first = -(-low // 8)  # 14 rows of 8 KV heads: 112 units
    assert fills(_problem(batch=first, seqlen_k=1024), 132) and not fills(_problem(batch=first - 1, seqlen_k=1024), 132)
    assert not fills(_problem(batch=-(-high // 8), seqlen_k=1024), 132), "two CTAs per SM: the plan splits nothing"
    assert not fills(_problem(batch=16, seqlen_k=choice.UNSPLIT_MAX_SPAN + 128), 132)
    assert not fills(_problem(batch=16, seqlen_k=1024, kv_dtype=torch.float8_e4m3fn), 132)
    assert not fills(_problem(batch=16, seqlen_k=1024, page_size=16), 132)
    assert fills(_problem(batch=16, seqlen_k=4096, window_left=800), 132), "a window's span (928 keys) counts"
    for batch, heads_kv in ((16, 8), (4, 32)):
        cute = flashsplit.plan(batch, 1024, 32, heads_kv, 128, gpu="h200", backend="cute")
        triton = flashsplit.plan(batch, 1024, 32, heads_kv, 128, gpu="h200", backend="triton")
        assert (cute.num_splits, cute.units_per_sm, triton.num_splits) == (1, 1, 2), (cute, triton)
    assert flashsplit.plan(8, 1024, 32, 8, 128, gpu="h200", backend="cute").num_splits == 2  # 64 units, one per SM
    # With 16 packed rows (4 queries: the 64-row tile, which plans two CTAs per SM) a longer span
    # splits: 128 units over 1024 keys run unsplit, over 1152 in two splits.
    longer = [flashsplit.plan(16, n, 32, 8, 128, seqlen_q=4, causal=True, gpu="h200", backend="cute") for n in (1024, 1152)]
    assert [(p.num_splits, p.units_per_sm) for p in longer] == [(1, 1), (2, 2)]


@needs_cutlass
def test_plan_for_a_named_gpu_from_any_machine():
    p = flashsplit.plan(1, 4096, 32, 8, 128, gpu="h100")  # a measured cell: cute 10.83 vs 11.33 us
    assert (p.backend, p.rule, p.gpu) == ("cute", "measured", "NVIDIA H100 80GB HBM3")
    assert "measured" in str(p) and "NVIDIA H100 80GB HBM3" in str(p)
    p = flashsplit.plan(1, 4096, 32, 8, 128, gpu="h100-pcie")  # no table: the hand rules
    assert (p.backend, p.rule, p.gpu) == ("cute", "swapped-operands", "NVIDIA H100 PCIe")
    p = flashsplit.plan(16, 4096, 32, 8, 128, gpu="h200")  # a measured cell: cute 64.4 vs 66.3 us
    assert (p.backend, p.rule, p.gpu) == ("cute", "measured", "NVIDIA H200") and "faster on cute" in p.backend_reason
    a100 = flashsplit.plan(1, 4096, 32, 8, 128, gpu="A100")
    assert a100.backend == "triton" and a100.num_sms == 108
    assert flashsplit.plan(1, 4096, 32, 8, 128, gpu="h200", num_sms=66).num_sms == 66


@pytest.mark.cpu
def test_plan_for_the_interpreter():
    p = flashsplit.plan(1, 4096, 32, 8, 128, device="cpu")
    assert p.backend == "triton" and p.gpu == "cpu"


@pytest.mark.parametrize("kwargs,error,needle", [
    (dict(head_dim=300), ValueError, "head_dim: expected a multiple of 8"),
    (dict(head_dim=20), ValueError, "head_dim: expected a multiple of 8"),
    (dict(dtype=torch.float32), TypeError, "dtype: expected torch.float16 or torch.bfloat16"),
    (dict(kv_dtype=torch.float16), TypeError, "kv_dtype: expected None"),
    (dict(page_size=-1), ValueError, "page_size: expected a non-negative int"),
    (dict(gpu="tpu"), ValueError, "gpu: expected one of"),
    (dict(gpu=7), TypeError, "gpu: expected a GPU name"),
    (dict(gpu="h200", device="cpu"), ValueError, "gpu: only for device='cuda'"),
    (dict(num_sms=0), ValueError, "num_sms: expected None or a positive int"),
])
def test_plan_rejects_what_decode_rejects(kwargs, error, needle):
    args = dict(head_dim=128) | kwargs
    head_dim = args.pop("head_dim")
    with pytest.raises(error, match=needle):
        flashsplit.plan(1, 4096, 32, 8, head_dim, **args)


@needs_cutlass
@pytest.mark.parametrize("field", [dict(seqlen_new=1), dict(seqlen_new=1, rotary_dim=64), dict(has_leftpad=True),
                                   dict(has_batch_idx=True)], ids=lambda f: "-".join(f))
def test_cute_runs_cache_updates_and_auto_takes_triton_for_them(field):
    """Appends (with rotary), left padding and cache_batch_idx run on cute too (``backend="cute"``),
    and auto takes Triton for them, which writes the new keys inside its split kernel."""
    import dataclasses

    problem = dataclasses.replace(_problem(batch=16, seqlen_k=16384), **field)
    assert get("cute").supports(problem) is None
    assert select(problem, "cute")[0].name == "cute"
    assert select(problem, "auto")[0].name == "triton"


#: Head layouts (q heads, KV heads, head dim, query rows, cache dtype) the batch-invariant test plans.
INVARIANT_LAYOUTS = [(32, 8, 128, 1, None), (32, 32, 128, 1, None), (64, 8, 64, 1, None), (16, 2, 256, 1, None),
                     (32, 8, 96, 1, None), (40, 8, 128, 4, None), (28, 4, 64, 2, None), (32, 8, 128, 1, FP8),
                     (32, 8, 80, 1, None)]


@pytest.mark.parametrize("gpu", [*sorted(KNOWN_GPUS), RULES_GPU, pytest.param("cpu", marks=pytest.mark.cpu)], ids=str)
def test_batch_invariant_auto_choice_follows_no_batch_fact(gpu):
    """auto's backend and a row's split boundaries, for a batch-invariant decode, are the same at
    every batch size, capacity (1k-256k keys) and cache layout (dense, pages of 1, 16, 48, 128),
    for each head layout, on every GPU flashsplit has a table or a name for (and the interpreter)."""
    target = dict(device="cpu") if gpu == "cpu" else dict(gpu=gpu)
    row_lengths = (0, 1, 300, 513, 1000)  # at most the smallest capacity
    for heads, heads_kv, dim, seqlen_q, kv_dtype in INVARIANT_LAYOUTS:
        seen = set()
        for batch in (1, 2, 4, 16, 64, 256):
            for capacity in (1024, 4096, 16384, 65536, 262144):
                for page_size in (0, 1, 16, 48, 128):
                    p = flashsplit.plan(batch, capacity // page_size * page_size if page_size else capacity, heads,
                                        heads_kv, dim, seqlen_q=seqlen_q, causal=seqlen_q > 1, kv_dtype=kv_dtype,
                                        page_size=page_size, batch_invariant=True, **target)
                    bounds = tuple(tuple((s, e) for s, e in p.boundaries(n) if e > s) for n in row_lengths)
                    seen.add((p.backend, p.rule, bounds))
        assert len(seen) == 1, (heads, heads_kv, dim, seqlen_q, kv_dtype, sorted(seen)[:2])
        backend, rule, bounds = seen.pop()
        assert (backend, rule) == ("triton", "batch-invariant")
        assert bounds[3] == ((0, 512), (512, 513)) and bounds[0] == ()  # splits of >= 512 keys from the row's length


@pytest.mark.cpu
def test_plan_by_default_describes_where_decode_runs_here():
    """Without CUDA, plan() describes the interpreter path decode takes; a named GPU (or an SM
    count) plans for that GPU instead."""
    here = flashsplit.plan(4, 32768, 32, 8, 128, dtype=torch.float16)
    assert here.backend == "triton" and here.gpu == "cpu"
    assert str(here).startswith("on the CPU (Triton interpreter): backend triton")
    assert "CTA slots" not in str(here) and "split as for a 132-SM GPU" in str(here)
    h200 = flashsplit.plan(4, 32768, 32, 8, 128, gpu="h200")
    assert h200.gpu == "NVIDIA H200" and str(h200).startswith("on NVIDIA H200: backend ")
    assert flashsplit.plan(4, 32768, 32, 8, 128, num_sms=66, backend="triton").gpu == "NVIDIA H200"
    with pytest.raises(ValueError, match="num_sms: only for device='cuda'"):
        flashsplit.plan(4, 32768, 32, 8, 128, num_sms=66, device="cpu")
