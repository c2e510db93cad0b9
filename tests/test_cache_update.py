"""The cache update as a kernel of its own (flashsplit.triton.cache_update), which the cute
backend runs ahead of its attention: it writes the same bytes as the Triton split kernel's
fused append, rotates q as that kernel does, and an attention over what it leaves gives the
fused call's result (on the CPU: through the interpreter, fp16)."""

import pytest
import torch
from conftest import DEVICE, HAS_CUDA

import flashsplit
from flashsplit.call import DecodeOptions, DecodeTensors
from flashsplit.reference import rotary_ref
from flashsplit.testing import POISON
from flashsplit.testing_kvcache import (ROTATED_RTOL, KVCacheCase, check_caches, check_kvcache_attention,
                                        expected_caches, make_kvcache_inputs)
from flashsplit.triton.cache_update import append_new_keys
from flashsplit.validation import check_decode_inputs

DTYPES = [torch.float16, torch.bfloat16] if HAS_CUDA else [torch.float16]

CASES = {
    "dense": KVCacheCase(seqlen_new=3, lengths=(200, 37, 0)),
    "paged-16": KVCacheCase(seqlen_new=16, page_size=16, lengths=(200, 37, 0)),
    "paged-48-fp8": KVCacheCase(seqlen_new=3, page_size=48, kv_dtype=torch.float8_e4m3fn, per_head_scale=True),
    "batch-idx-subset": KVCacheCase(seqlen_new=1, batch_idx="subset", kv_dtype=torch.float8_e5m2),
    "rotary-leftpad-causal": KVCacheCase(seqlen_new=3, rotary_dim=32, leftpad=(5, 0, 0), lengths=(200, 37, 0),
                                         causal=True),
    "rotary-neox-one-position": KVCacheCase(seqlen_new=1, seqlen_q=4, rotary_dim=64, rotary_interleaved=False,
                                            batch_idx="permutation"),
    "fills-the-cache": KVCacheCase(seqlen_k=64, seqlen_new=16, lengths=(48, 40, 0), rotary_dim=16, causal=True),
}


def _tensors(args: dict) -> DecodeTensors:
    return DecodeTensors(args["q"], args["k_cache"], args["v_cache"], args["q"], None, args.get("cache_seqlens"),
                         args.get("block_table"), args.get("k_descale"), args.get("v_descale"), args.get("sinks"),
                         args.get("k"), args.get("v"), args.get("rotary_cos"), args.get("rotary_sin"),
                         args.get("cache_batch_idx"), args.get("cache_leftpad"))


def _problem(case: KVCacheCase, args: dict):
    options = DecodeOptions(causal=case.causal, window_size=case.window_size, num_splits=case.num_splits,
                            rotary_interleaved=case.rotary_interleaved)
    return check_decode_inputs(_tensors(args), options)


def _with_dtype(case: KVCacheCase, dtype) -> KVCacheCase:
    return KVCacheCase(**{**case.__dict__, "dtype": dtype})


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", list(CASES))
def test_update_writes_the_reference_caches_and_rotates_q(name, dtype, generator):
    case = _with_dtype(CASES[name], dtype)
    args = make_kvcache_inputs(case, DEVICE, generator)
    expected = expected_caches(case, args)
    q_before = args["q"].clone()
    q, seqlens = append_new_keys(_tensors(args), _problem(case, args).variant)
    check_caches(case, args["k_cache"], args["v_cache"], expected)
    assert torch.equal(seqlens.cpu(), args["cache_seqlens"].cpu() + case.seqlen_new)
    assert torch.equal(args["q"], q_before), "the update wrote into the caller's q"
    if not case.rotary_dim:
        assert q is args["q"]
        return
    start = args["cache_seqlens"].cpu().long() - (args["cache_leftpad"].cpu().long() if case.leftpad else 0)
    steps = torch.arange(case.queries) if case.rotary_q_per_token else torch.zeros(case.queries, dtype=torch.long)
    want = rotary_ref(q_before.cpu(), args["rotary_cos"].cpu(), args["rotary_sin"].cpu(),
                      start[:, None] + steps[None, :], case.rotary_interleaved)
    torch.testing.assert_close(q.cpu().double(), want, rtol=ROTATED_RTOL[dtype], atol=1e-3)


@pytest.mark.parametrize("name", ["paged-48-fp8", "rotary-leftpad-causal", "batch-idx-subset"])
def test_update_then_attention_equals_the_fused_call(name, generator):
    """The caches the update leaves are the fused Triton call's, byte for byte; attending them
    with the rotated q over ``cache_seqlens + L_new`` keys passes the reference check."""
    case = CASES[name]
    state = generator.get_state()
    fused = make_kvcache_inputs(case, DEVICE, generator)
    generator.set_state(state)
    split = make_kvcache_inputs(case, DEVICE, generator)
    expected = expected_caches(case, split)
    flashsplit.decode(**fused, **case.options(), backend="triton")
    q, seqlens = append_new_keys(_tensors(split), _problem(case, split).variant)
    for cache in ("k_cache", "v_cache"):
        assert torch.equal(split[cache].view(torch.uint8), fused[cache].view(torch.uint8)), cache
    attend = {k: v for k, v in split.items() if k not in ("k", "v", "rotary_cos", "rotary_sin")}
    attend.update(q=q, cache_seqlens=seqlens)
    out, lse = flashsplit.decode(**attend, **case.options(), backend="triton", return_lse=True,
                                 out=torch.full_like(q, POISON))
    check_kvcache_attention(case, split, expected, out, lse)
