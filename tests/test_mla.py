"""MLA decode (flashsplit.mla_decode, FlashMLA's drop-in pair) on the CPU through the Triton
interpreter, against a float64 reference written from the semantics."""

import math

import pytest
import torch

import flashsplit
from flashsplit.mla import registry
from flashsplit.mla.reference import mla_partials_ref
from flashsplit.mla.testing import check_mla, make_mla_inputs
from flashsplit.testing import check_output

pytestmark = pytest.mark.cpu

# (H_q, s_q, causal, page size (0: dense), num_splits (0: the plan's), lengths)
DEFAULT_CASES = [
    (16, 1, False, 16, 17, [0, 1, 300]),
    (32, 2, True, 1, 3, [1, 257]),
    (16, 4, True, 0, 0, [3, 0, 200]),
    (128, 1, False, 64, 1, [65, 0]),
]
FULL_CASES = [
    (h, sq, causal, page, splits, lengths)
    for h in (16, 32, 128)
    for sq, causal in ((1, False), (2, True), (3, True), (4, True), (2, False))
    for page, splits in ((1, 3), (16, 17), (64, 1), (0, 0))
    for lengths in ([0, 1, 260],)
    if (h, sq, causal, page, splits) not in {c[:5] for c in DEFAULT_CASES} and h * sq <= 256  # (the interpreter's time)
]


def _run(case, generator, fp8=False, **kw):
    heads, seqlen_q, causal, page, splits, lengths = case
    inputs = make_mla_inputs(len(lengths), seqlen_q, heads, lengths, page_size=page, fp8=fp8, generator=generator)
    out = torch.full((len(lengths), seqlen_q, heads, 512), float("nan"), dtype=torch.float16)
    result, lse = flashsplit.mla_decode(inputs.q, inputs.kv_cache, inputs.cache_seqlens, causal=causal,
                                        num_splits=splits, return_lse=True, out=out, backend="triton",
                                        **inputs.kwargs(), **kw)
    assert result is out
    check_mla(out, lse, inputs, causal=causal, softmax_scale=kw.get("softmax_scale"))
    return out, lse


@pytest.mark.parametrize("case", DEFAULT_CASES, ids=str)
def test_matches_reference(case, generator):
    out, lse = _run(case, generator)
    lengths = case[5]
    for b, n in enumerate(lengths):
        if n == 0:  # a row of no keys: zeros and -inf
            assert torch.equal(out[b], torch.zeros_like(out[b])) and torch.isneginf(lse[b]).all()


@pytest.mark.full
@pytest.mark.parametrize("case", FULL_CASES, ids=str)
def test_matches_reference_full(case, generator):
    _run(case, generator)


@pytest.mark.parametrize("case", [(16, 1, False, 64, 3, [1, 0, 400]),
                                  pytest.param((32, 2, True, 0, 0, [129, 2]), marks=pytest.mark.full)], ids=str)
def test_fp8_e4m3_cache(case, generator):
    _run(case, generator, fp8=True)


def test_softmax_scale_and_dense_default_splits(generator):
    _run((16, 1, False, 0, 0, [257, 5]), generator, softmax_scale=0.3)


def test_partials_follow_the_split_rule_and_combine_at_512(generator):
    inputs = make_mla_inputs(2, 2, 16, [300, 1], page_size=16, generator=generator)
    backend = registry.get("triton")
    out_partial, lse_partial = backend.forward_partials(inputs.q, inputs.kv_cache, inputs.cache_seqlens,
                                                        inputs.block_table, num_splits=3,
                                                        softmax_scale=576 ** -0.5, causal=True)
    ref_out, ref_lse = mla_partials_ref(inputs.q, inputs.kv_cache, inputs.cache_seqlens, inputs.block_table,
                                        num_splits=3, causal=True)
    live = torch.isfinite(ref_lse)
    assert torch.equal(torch.isneginf(lse_partial), ~live)
    torch.testing.assert_close(lse_partial[live], ref_lse[live].float(), atol=1e-3, rtol=1e-3)
    rows = live.transpose(2, 3)[..., None].expand_as(ref_out)  # [S, B, s_q, H, 512]
    torch.testing.assert_close(out_partial[rows], ref_out[rows].float(), atol=5e-3, rtol=5e-3)
    out, lse = flashsplit.combine(out_partial, lse_partial, out_dtype=torch.float16)
    check_mla(out, lse, inputs, causal=True)


def test_flash_mla_with_kvcache_drop_in(generator):
    inputs = make_mla_inputs(2, 2, 16, [0, 140], page_size=64, generator=generator)
    metadata, none = flashsplit.get_mla_metadata(inputs.cache_seqlens, 32, 1)
    assert none is None
    out, lse = flashsplit.flash_mla_with_kvcache(inputs.q, inputs.kv_cache, inputs.block_table,
                                                 inputs.cache_seqlens, 512, metadata, causal=True)
    assert torch.isposinf(lse[0]).all() and torch.equal(out[0], torch.zeros_like(out[0]))  # FlashMLA's empty row
    lse_flashsplit = torch.where(torch.isposinf(lse), -math.inf, lse)
    check_mla(out, lse_flashsplit, inputs, causal=True)
    with pytest.raises(ValueError, match="tile_scheduler_metadata"):
        flashsplit.flash_mla_with_kvcache(inputs.q, inputs.kv_cache, inputs.block_table, inputs.cache_seqlens, 512,
                                          metadata, causal=False)


@pytest.mark.parametrize("call, error, name", [
    (lambda i: flashsplit.mla_decode(i.q.float(), i.kv_cache, i.cache_seqlens), TypeError, "q:"),
    (lambda i: flashsplit.mla_decode(i.q[..., :512], i.kv_cache, i.cache_seqlens), ValueError, "q:"),
    (lambda i: flashsplit.mla_decode(i.q.expand(2, 5, 16, 576), i.kv_cache, i.cache_seqlens), ValueError, "q:"),
    (lambda i: flashsplit.mla_decode(i.q, i.kv_cache.expand(-1, -1, 2, -1), i.cache_seqlens), ValueError, "kv_cache:"),
    (lambda i: flashsplit.mla_decode(i.q, i.kv_cache.bfloat16(), i.cache_seqlens), TypeError, "kv_cache:"),
    (lambda i: flashsplit.mla_decode(i.q, i.kv_cache, i.cache_seqlens.long()), TypeError, "cache_seqlens:"),
    (lambda i: flashsplit.mla_decode(i.q, i.kv_cache, None), ValueError, "cache_seqlens:"),
    (lambda i: flashsplit.mla_decode(i.q, i.kv_cache, i.cache_seqlens, head_dim_v=576), ValueError, "head_dim_v:"),
    (lambda i: flashsplit.mla_decode(i.q, i.kv_cache, i.cache_seqlens, num_splits=257), ValueError, "num_splits:"),
    (lambda i: flashsplit.mla_decode(i.q, i.kv_cache, i.cache_seqlens, causal=1), TypeError, "causal:"),
    (lambda i: flashsplit.mla_decode(i.q, i.kv_cache, i.cache_seqlens, softmax_scale=math.nan), ValueError,
     "softmax_scale:"),
    (lambda i: flashsplit.mla_decode(i.q, i.kv_cache, i.cache_seqlens, block_table=i.cache_seqlens[:, None].long()),
     TypeError, "block_table:"),
    (lambda i: flashsplit.mla_decode(i.q, i.kv_cache, i.cache_seqlens,
                                     kv_descale=torch.ones(1)), ValueError, "kv_descale:"),
    (lambda i: flashsplit.mla_decode(i.q, i.kv_cache.to(torch.float8_e4m3fn), i.cache_seqlens), ValueError,
     "kv_descale:"),
    (lambda i: flashsplit.mla_decode(i.q, i.kv_cache, i.cache_seqlens, out=torch.empty(2, 1, 16, 576).half()),
     ValueError, "out:"),
    (lambda i: flashsplit.mla_decode(i.q, i.kv_cache, i.cache_seqlens, backend="nope"), ValueError, "backend:"),
    # The CPU interpreter's bf16 tl.dot is wrong (a bf16 call returned values near 8e8): refused.
    (lambda i: flashsplit.mla_decode(i.q.cpu().bfloat16(), i.kv_cache.cpu().bfloat16(), i.cache_seqlens.cpu()),
     TypeError, "q: bfloat16 is not supported on the CPU"),
    (lambda i: flashsplit.mla_decode(i.q, i.kv_cache, i.cache_seqlens, return_lse="yes"), TypeError, "return_lse:"),
    (lambda i: flashsplit.flash_mla_with_kvcache(i.q, i.kv_cache, None, i.cache_seqlens, 512, object()),
     TypeError, "tile_scheduler_metadata:"),
    (lambda i: flashsplit.flash_mla_with_kvcache(i.q, i.kv_cache, None, i.cache_seqlens, 512,
                                                 flashsplit.get_mla_metadata()[0], num_splits=4),
     ValueError, "num_splits:"),
    (lambda i: flashsplit.flash_mla_with_kvcache(i.q, i.kv_cache, None, i.cache_seqlens, 512,
                                                 flashsplit.get_mla_metadata()[0], is_fp8_kvcache=True),
     ValueError, "is_fp8_kvcache:"),
    (lambda i: flashsplit.mla_decode(i.q, torch.zeros(2, 4, 1, 656, dtype=torch.float8_e4m3fn), i.cache_seqlens,
                                     kv_descale=torch.ones(1)), ValueError, "kv_descale:"),
    (lambda i: flashsplit.mla_decode(i.q, torch.zeros(2, 4, 1, 656).half(), i.cache_seqlens), ValueError,
     "kv_cache:"),
    (lambda i: flashsplit.flash_mla_with_kvcache(i.q, i.kv_cache[:, :, :, :512], None, i.cache_seqlens, 512,
                                                 flashsplit.get_mla_metadata()[0]), ValueError, "k_cache:"),
])
def test_bad_inputs_name_the_argument(call, error, name, generator):
    inputs = make_mla_inputs(2, 1, 16, [3, 4], generator=generator)
    with pytest.raises(error, match=name):
        call(inputs)


def test_plan_weighs_compute_bound_rows():
    memory = flashsplit.mla_plan(8, 4096, 16, page_size=64, gpu="h100", backend="triton")
    compute = flashsplit.mla_plan(8, 4096, 128, page_size=64, gpu="h100", backend="triton")
    assert "memory-bound" in memory.split_reason and "compute-bound" in compute.split_reason
    assert compute.tokens_per_split >= 1024 and compute.num_splits < memory.num_splits
    assert flashsplit.mla_plan(32, 4096, 128, page_size=64, gpu="h100", backend="triton").num_splits == 1
    assert flashsplit.mla_plan(1, 65536, 16, gpu="h100", num_splits=7, backend="triton").num_splits == 7
    with pytest.raises(ValueError, match="seqlen_q"):
        flashsplit.mla_plan(1, 1024, 16, seqlen_q=5)


@pytest.mark.parametrize("batch, seqlen_q, capacity, heads, fp8, rule", [
    (1, 1, 4096, 16, False, "one-short-row"), (1, 1, 4096, 128, False, "one-short-row"),
    (1, 1, 4160, 16, False, "hopper"), (1, 1, 16384, 128, False, "hopper"), (2, 1, 1024, 16, False, "hopper"),
    (1, 2, 1024, 16, False, "hopper"), (1, 1, 1024, 16, True, "hopper")])
def test_auto_rules(batch, seqlen_q, capacity, heads, fp8, rule):
    """One short single-token row goes to Triton, everything else cute can run to cute; without
    cute every rule falls through to Triton."""
    from types import SimpleNamespace

    from flashsplit.mla import selection
    from flashsplit.mla.problem import MlaProblem

    problem = MlaProblem(batch=batch, seqlen_q=seqlen_q, num_heads_q=heads, dtype=torch.bfloat16,
                         kv_dtype=torch.float8_e4m3fn if fp8 else torch.bfloat16, page_size=64, capacity=capacity,
                         causal=False, num_splits=0, device_type="cuda")
    triton, cute = SimpleNamespace(name="triton"), SimpleNamespace(name="cute")
    chosen, got, _ = selection.choose(problem, [triton, cute])
    assert (got, chosen) == (rule, triton if rule == "one-short-row" else cute)
    assert selection.choose(problem, [triton])[:2] == (triton, "one-short-row" if rule == "one-short-row"
                                                      else "default")


def test_cute_backend_says_why_not_here():
    reason = registry.get("cute").supports(_problem_on("cpu"))
    assert reason is not None and "CUDA" in reason
    plan = flashsplit.mla_plan(1, 1024, 16, device="cpu")
    assert plan.backend == "triton" and "cute:" in plan.backend_reason


def _problem_on(device_type):
    from flashsplit.mla.problem import MlaProblem

    return MlaProblem(batch=1, seqlen_q=1, num_heads_q=16, dtype=torch.float16, kv_dtype=torch.float16, page_size=0,
                      capacity=128, causal=False, num_splits=0, device_type=device_type)


def test_combine_takes_512_wide_partials(generator):
    partial = torch.randn(3, 2, 1, 4, 512, generator=generator)
    lse_partial = torch.randn(3, 2, 4, 1, generator=generator)
    lse_partial[1, 0] = -math.inf
    out, lse = flashsplit.combine(partial, lse_partial)
    weights = torch.softmax(lse_partial.double(), dim=0)  # [S, B, H, 1]
    ref = (weights.permute(0, 1, 3, 2)[..., None] * partial.double().nan_to_num()).sum(0)
    check_output(out, ref, ref.float().double(), torch.float32)
    torch.testing.assert_close(lse, torch.logsumexp(lse_partial, dim=0))


def test_docstring_examples():
    import doctest
    import importlib

    for name in ("flashsplit.mla.api", "flashsplit.mla.triton_backend"):
        failures, tried = doctest.testmod(importlib.import_module(name))
        assert tried > 0 and failures == 0, name


def test_reference_is_attention_over_the_latent(generator):
    """The reference against torch's SDPA (float64): K the 576 features, V the first 512, causal
    bottom-right for two queries."""
    from flashsplit.mla.reference import mla_attention_ref

    q = torch.randn(1, 2, 4, 576, generator=generator, dtype=torch.float64)
    kv = torch.randn(1, 9, 1, 576, generator=generator, dtype=torch.float64)
    out, lse = mla_attention_ref(q, kv, torch.tensor([9], dtype=torch.int32), causal=True)
    keys = kv[0, :, 0]
    mask = torch.ones(2, 9, dtype=torch.bool).tril(diagonal=9 - 2)
    expected = torch.nn.functional.scaled_dot_product_attention(
        q[0].transpose(0, 1), keys.expand(4, 9, 576), keys[:, :512].expand(4, 9, 512), attn_mask=mask,
        scale=576 ** -0.5)
    torch.testing.assert_close(out[0], expected.transpose(0, 1))
    scores = torch.einsum("mhd,nd->hmn", q[0], keys) * 576 ** -0.5
    torch.testing.assert_close(lse[0], torch.logsumexp(scores.masked_fill(~mask, -math.inf), dim=-1))


def test_64_row_tiles(generator):
    """The Triton kernel on 64-row tiles (what the bench times as triton-m64): 2 causal queries x
    32 q heads in one row block, two splits."""
    from flashsplit.mla.triton_backend import choose_tiles

    inputs = make_mla_inputs(2, 2, 32, [0, 200], page_size=64, generator=generator)
    out = torch.full((2, 2, 32, 512), float("nan"), dtype=torch.float16)
    lse = torch.empty((2, 32, 2))
    registry.get("triton").run(inputs.q, inputs.kv_cache, inputs.cache_seqlens, inputs.block_table, out, lse,
                               num_splits=2, softmax_scale=576 ** -0.5, causal=True, kv_descale=None,
                               tiles=choose_tiles(64, 64))
    check_mla(out, lse, inputs, causal=True)


@pytest.mark.parametrize("page_size", [64, pytest.param(0, marks=pytest.mark.full),
                                       pytest.param(1, marks=pytest.mark.full)])
def test_fp8_tokens_of_flashmla(page_size, generator):
    """FlashMLA's 656-byte fp8 tokens (DeepSeek-V3.2), through its drop-in call and mla_decode."""
    inputs = make_mla_inputs(2, 2, 16, [0, 150], page_size=page_size, fp8_tokens=True, generator=generator)
    assert inputs.kv_cache.shape[-1] == 656 and inputs.kv_cache.dtype == torch.float8_e4m3fn
    metadata, _ = flashsplit.get_mla_metadata()
    out, lse = flashsplit.flash_mla_with_kvcache(inputs.q, inputs.kv_cache, inputs.block_table, inputs.cache_seqlens,
                                                 512, metadata, causal=True, is_fp8_kvcache=True)
    check_mla(out, torch.where(torch.isposinf(lse), -math.inf, lse), inputs, causal=True)
    out, lse = flashsplit.mla_decode(inputs.q, inputs.kv_cache, inputs.cache_seqlens, block_table=inputs.block_table,
                                     num_splits=3, return_lse=True, backend="triton")
    check_mla(out, lse, inputs)


def test_fp8_tokens_round_trip(generator):
    """Quantizing to FlashMLA's tokens and reading them back gives the keys to e4m3's precision:
    the test inputs and the reference agree on the byte layout."""
    from flashsplit.mla.reference import dequantize_fp8_tokens
    from flashsplit.mla.testing import quantize_fp8_tokens

    keys = torch.randn(2, 3, 1, 576, generator=generator) * torch.tensor([0.01] * 128 + [1.0] * 128 + [30.0] * 256 +
                                                                          [2.0] * 64)
    tokens = quantize_fp8_tokens(keys, torch.bfloat16)
    back = dequantize_fp8_tokens(tokens, torch.bfloat16)
    torch.testing.assert_close(back[..., 512:], keys[..., 512:].bfloat16().double())
    torch.testing.assert_close(back[..., :512], keys[..., :512].double(), rtol=0.07, atol=1e-3)


def test_cute_facts_name_dtypes():
    """The cute kernel's ``mla_supports`` takes dtypes by name."""
    facts = _problem_on("cuda").cute_facts()
    assert facts["dtype"] == "float16" and facts["kv_dtype"] == "float16"
    assert facts["head_dim"] == 576 and facts["head_dim_v"] == 512 and facts["paged"] is False
