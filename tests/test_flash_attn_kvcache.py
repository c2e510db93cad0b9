"""flashsplit.flash_attn_with_kvcache: FlashAttention-3's signature and semantics on decode.

Calls are written as engines write them (transformers' continuous batching: k=, v=,
cache_seqlens, block_table, causal=True) and judged against the float64 reference of the
semantics (flashsplit.testing_kvcache); FlashAttention arguments flashsplit does not implement
raise a ValueError naming them, the ones that only tune FlashAttention's kernels are ignored.
"""

import pytest
import torch
from conftest import DEVICE

from flashsplit import flash_attn_with_kvcache
from flashsplit.testing_kvcache import (KVCacheCase, check_caches, check_kvcache_attention, expected_caches,
                                        make_kvcache_inputs)


def _fa_kwargs(args: dict) -> dict:
    """``make_kvcache_inputs``' tensors under FlashAttention's names (FA2's block_table kept)."""
    return {name: t for name, t in args.items() if name not in ("q", "k_cache", "v_cache")}


def _check(case, args, expected, out, lse):
    check_caches(case, args["k_cache"], args["v_cache"], expected)
    check_kvcache_attention(case, args, expected, out, lse)


@pytest.mark.parametrize("page_size", [0, 16])
def test_continuous_batching_call(page_size, generator):
    """transformers' call: one new token per row, a paged cache, causal."""
    case = KVCacheCase(page_size=page_size, causal=True, lengths=(100, 3, 250))
    args = make_kvcache_inputs(case, DEVICE, generator)
    expected = expected_caches(case, args)
    out, lse = flash_attn_with_kvcache(args["q"], args["k_cache"], args["v_cache"], k=args["k"], v=args["v"],
                                       cache_seqlens=args["cache_seqlens"], block_table=args.get("block_table"),
                                       causal=True, return_softmax_lse=True)
    _check(case, args, expected, out, lse)


def test_every_feature_by_flash_attention_names(generator):
    """page_table, cache_leftpad, rotary (NeoX halves), fp8 descales, window, softcap, sinks."""
    case = KVCacheCase(page_size=16, leftpad=(2, 0, 9), rotary_dim=64, rotary_interleaved=False, causal=True,
                       window_size=(64, 0), softcap=30.0, sinks=True, kv_dtype=torch.float8_e4m3fn,
                       per_head_scale=True, seqlen_new=2, lengths=(100, 30, 200))
    args = make_kvcache_inputs(case, DEVICE, generator)
    expected = expected_caches(case, args)
    kwargs = _fa_kwargs(args)
    kwargs["page_table"] = kwargs.pop("block_table")
    out, lse = flash_attn_with_kvcache(args["q"], args["k_cache"], args["v_cache"], **kwargs, causal=True,
                                       window_size=(64, 0), softcap=30.0, rotary_interleaved=False, num_splits=3,
                                       return_softmax_lse=True)
    _check(case, args, expected, out, lse)


def test_cache_batch_idx_and_int_cache_seqlens(generator):
    """cache_seqlens as an int (every row), rows of a larger cache by cache_batch_idx; the
    positional k and v of FA's signature."""
    case = KVCacheCase(batch_idx="subset", lengths=(77, 77, 77), seqlen_new=3)
    args = make_kvcache_inputs(case, DEVICE, generator)
    expected = expected_caches(case, args)
    out, lse = flash_attn_with_kvcache(args["q"], args["k_cache"], args["v_cache"], args["k"], args["v"],
                                       cache_seqlens=77, cache_batch_idx=args["cache_batch_idx"],
                                       return_softmax_lse=True)
    _check(case, args, expected, out, lse)


def test_returns_out_or_out_and_lse(generator):
    case = KVCacheCase(seqlen_new=0, lengths=(10, 20, 30))
    args = make_kvcache_inputs(case, DEVICE, generator)
    out = flash_attn_with_kvcache(args["q"], args["k_cache"], args["v_cache"], cache_seqlens=args["cache_seqlens"])
    assert isinstance(out, torch.Tensor) and out.shape == args["q"].shape
    both = flash_attn_with_kvcache(args["q"], args["k_cache"], args["v_cache"], cache_seqlens=args["cache_seqlens"],
                                   return_softmax_lse=True)
    assert isinstance(both, tuple) and len(both) == 2 and torch.equal(both[0], out)
    check_kvcache_attention(case, args, expected_caches(case, args), *both)


def test_kernel_tuning_arguments_are_ignored(generator):
    """pack_gqa, sm_margin, scheduler_metadata and max_seqlen_q only tune FlashAttention's own
    kernels (or its varlen path): the result is the same bit for bit."""
    case = KVCacheCase(seqlen_new=0, lengths=(10, 200, 30))
    args = make_kvcache_inputs(case, DEVICE, generator)
    plain = flash_attn_with_kvcache(args["q"], args["k_cache"], args["v_cache"], cache_seqlens=args["cache_seqlens"])
    tuned = flash_attn_with_kvcache(args["q"], args["k_cache"], args["v_cache"], cache_seqlens=args["cache_seqlens"],
                                    pack_gqa=True, sm_margin=8, max_seqlen_q=1,
                                    scheduler_metadata=torch.zeros(4, dtype=torch.int32, device=DEVICE))
    assert torch.equal(plain, tuned)


@pytest.mark.parametrize("name, value", [
    ("qv", torch.zeros(1)), ("cu_seqlens_q", torch.zeros(1)), ("cu_seqlens_k_new", torch.zeros(1)),
    ("rotary_seqlens", torch.zeros(1)), ("q_descale", torch.ones(1)), ("alibi_slopes", torch.ones(1)),
])
def test_unimplemented_arguments_name_themselves(name, value, generator):
    args = make_kvcache_inputs(KVCacheCase(seqlen_new=0), DEVICE, generator)
    with pytest.raises(ValueError, match=rf"^{name}: not implemented by flashsplit .*expected None"):
        flash_attn_with_kvcache(args["q"], args["k_cache"], args["v_cache"], **{name: value.to(DEVICE)})


def test_bad_scalar_arguments(generator):
    args = make_kvcache_inputs(KVCacheCase(seqlen_new=0), DEVICE, generator)
    q, k_cache, v_cache = args["q"], args["k_cache"], args["v_cache"]
    with pytest.raises(ValueError, match=r"^attention_chunk: chunked attention is not implemented.*got 128"):
        flash_attn_with_kvcache(q, k_cache, v_cache, attention_chunk=128)
    with pytest.raises(TypeError, match=r"^cache_seqlens: expected an int or an int32 tensor, got a bool"):
        flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=True)
    with pytest.raises(ValueError, match=r"^cache_seqlens: expected an int32 value, got 4294967296"):
        flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=2 ** 32)
    with pytest.raises(TypeError, match=r"^return_softmax_lse: expected a bool"):
        flash_attn_with_kvcache(q, k_cache, v_cache, return_softmax_lse=1)
    with pytest.raises(ValueError, match=r"^page_table: an alias of block_table"):
        table = args["cache_seqlens"]
        flash_attn_with_kvcache(q, k_cache, v_cache, page_table=table, block_table=table)
    with pytest.raises(TypeError):  # FA2 and FA3 disagree on the sixth parameter: by name only
        flash_attn_with_kvcache(q, k_cache, v_cache, None, None, None)


def _step(q, k_cache, v_cache, k, v, seqlens, cos, sin):
    out = flash_attn_with_kvcache(q, k_cache, v_cache, k=k, v=v, cache_seqlens=seqlens, rotary_cos=cos,
                                  rotary_sin=sin, causal=True, num_splits=2)
    return out * 2


def test_append_under_torch_compile(generator):
    """One graph, no break; the operator that writes the caches; the same caches and output as eager."""
    case = KVCacheCase(rotary_dim=32, causal=True, lengths=(100, 7, 60))
    eager_args = make_kvcache_inputs(case, DEVICE, generator)
    compiled_args = {name: t.clone() for name, t in eager_args.items()}
    names = ("q", "k_cache", "v_cache", "k", "v", "cache_seqlens", "rotary_cos", "rotary_sin")
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(_step)(*(compiled_args[n].clone() for n in names))
    assert (explanation.graph_count, explanation.graph_break_count) == (1, 0), explanation.break_reasons
    assert "decode_append_into" in explanation.graphs[0].code
    eager = _step(*(eager_args[n] for n in names))
    compiled = torch.compile(_step, fullgraph=True, backend="aot_eager")(*(compiled_args[n] for n in names))
    assert torch.equal(compiled, eager)
    for name in ("k_cache", "v_cache"):
        assert torch.equal(compiled_args[name].view(torch.uint8), eager_args[name].view(torch.uint8)), name
