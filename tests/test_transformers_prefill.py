"""Prefill of softcap and sink layers through FlexAttention (flashsplit.integrations.flex_prefill),
against a float64 reference written from the semantics: softmax over the visible keys (and the
sink logit, which has no value) of scaled, optionally softcapped scores."""

import math

import pytest
import torch

from conftest import DEVICE

from flashsplit.integrations.flex_prefill import flex_prefill

pytest.importorskip("torch.nn.attention.flex_attention", reason="this torch has no FlexAttention")


def reference(query, key, value, visible, scale, softcap, sinks, dtype=torch.float64):
    """``[B, L_q, H, D]`` computed in ``dtype``; ``visible`` bool ``[B, L_q, L_k]``."""
    q, k, v = query.to(dtype), key.to(dtype), value.to(dtype)
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = torch.einsum("bhqd,bhkd->bhqk", q, k) * scale
    if softcap:
        scores = softcap * torch.tanh(scores / softcap)
    scores = scores.masked_fill(~visible[:, None], -math.inf)
    if sinks is not None:
        sink = sinks.to(dtype)[None, :, None, None].expand(*scores.shape[:3], 1)
        scores = torch.cat([scores, sink], dim=-1)
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)[..., :k.shape[2]]
    return torch.einsum("bhqk,bhkd->bqhd", weights, v)


def visible_keys(pads, seqlen_q, seqlen_k, window):
    """bool ``[B, L_q, L_k]``: causal (queries at the last keys), within ``window`` keys counting
    the query's own, never a row's left pads."""
    q = torch.arange(seqlen_q)[:, None] + seqlen_k - seqlen_q
    k = torch.arange(seqlen_k)[None, :]
    seen = k <= q
    if window:
        seen &= k > q - window
    return torch.stack([seen & (k >= pad) for pad in pads])


@pytest.mark.parametrize("softcap, with_sinks", [(5.0, False), (0.0, True), (5.0, True)])
@pytest.mark.parametrize("window", [None, 6])
@pytest.mark.parametrize("with_mask", [True, False], ids=["bool-mask", "no-mask"])
def test_flex_prefill_matches_float64_reference(softcap, with_sinks, window, with_mask, generator):
    batch, heads, heads_kv, seqlen, head_dim = 3, 4, 2, 21, 64
    pads = [0, 5, 11] if with_mask else [0, 0, 0]
    dtype = torch.float16

    def randn(*shape):
        return torch.randn(*shape, generator=generator, device=generator.device).to(DEVICE, dtype)

    q, k, v = randn(batch, heads, seqlen, head_dim), randn(batch, heads_kv, seqlen, head_dim), \
        randn(batch, heads_kv, seqlen, head_dim)
    sinks = torch.randn(heads, generator=generator, device=generator.device).to(DEVICE) if with_sinks else None
    visible = visible_keys(pads, seqlen, seqlen, window).to(DEVICE)
    mask = visible[:, None] if with_mask else None
    scale = head_dim ** -0.5
    out = flex_prefill(q, k, v, mask, scaling=scale, sliding_window=window, softcap=softcap, sinks=sinks)
    assert out.shape == (batch, seqlen, heads, head_dim) and out.dtype == dtype
    expected = reference(q, k, v, visible, scale, softcap, sinks)
    # The same attention in fp16 through PyTorch's own math: the error to allow (2x its own).
    torch_fp16 = reference(q, k, v, visible, scale, softcap, sinks, dtype=dtype)
    live = visible.any(-1)  # [B, L_q]: queries that see a key (a pad query sees none)
    assert torch.isfinite(out[live]).all()
    err = (out.double() - expected)[live].abs().amax().item()
    own = (torch_fp16.double() - expected)[live].abs().amax().item()
    assert err <= 2 * own + 2e-3, (err, own)


def test_flex_prefill_rejects_an_additive_mask():
    q = torch.randn(1, 2, 4, 64, device=DEVICE).half()
    with pytest.raises(ValueError, match="attention_mask: expected a bool"):
        flex_prefill(q, q, q, torch.zeros(1, 1, 4, 4, device=DEVICE), softcap=5.0)


@pytest.mark.parametrize("arch, cache_kind", [
    ("gemma2", "static"), ("gpt-oss", "dynamic"), ("mistral", "static"),
    pytest.param("gemma2", "dynamic", marks=pytest.mark.full), pytest.param("gpt-oss", "static", marks=pytest.mark.full),
    pytest.param("mistral", "dynamic", marks=pytest.mark.full)])
def test_long_prompts_prefill_through_the_lazy_mask(arch, cache_kind, monkeypatch, generator):
    """Prompts over max_decode_queries (here 40, 23 and 31 tokens, windows of 6): the prefill
    forward gets a PrefillMask, softcap and sink layers read its block mask (FlexAttention), SDPA
    layers its dense mask; generation matches the reference as the short-prompt tests do."""
    pytest.importorskip("transformers", reason="the transformers extra is not installed")
    from flashsplit.integrations import prefill_mask
    from transformers_models import ARCHS, check_generation

    built = {"dense": 0, "block": 0}
    for kind in built:
        real = getattr(prefill_mask.PrefillMask, kind if kind == "dense" else "block_mask")

        def counting(self, *args, _real=real, _kind=kind):
            built[_kind] += 1
            return _real(self, *args)

        monkeypatch.setattr(prefill_mask.PrefillMask, kind if kind == "dense" else "block_mask", counting)
    check_generation(ARCHS[arch], torch.float16, DEVICE, (40, 23, 31), cache_kind, 4, monkeypatch, generator)
    if arch == "mistral":
        assert built["dense"] > 0 and built["block"] == 0, built
    else:
        assert built["block"] > 0 and built["dense"] == 0, built


@pytest.mark.parametrize("arch", ["mistral", "gemma2"])
def test_prompts_into_a_static_cache_that_holds_tokens(arch):
    """A second prompt into a reset StaticCache, and a prompt that continues one: the lazy mask
    reads the query offset from when the forward began, not from the cache its first layer has
    already advanced. Logits as the reference attention's (SDPA; eager for the softcap)."""
    pytest.importorskip("transformers", reason="the transformers extra is not installed")
    from transformers import StaticCache
    from transformers_models import ARCHS

    import flashsplit.integrations.transformers as fs_transformers

    name = fs_transformers.register()
    model, _ = ARCHS[arch].build(torch.float32, DEVICE)
    generator = torch.Generator(device="cpu").manual_seed(11)
    first, second = (torch.randint(1, 500, (1, n), generator=generator).to(DEVICE) for n in (40, 25))

    def logits(impl):
        model.set_attn_implementation(impl)
        cache = StaticCache(config=model.config, max_cache_len=128)
        out = []
        with torch.no_grad():
            for prompts in ([first], [first], [first, second]):  # once, again after a reset, then continued
                cache.reset()
                for i, ids in enumerate(prompts):
                    start = sum(p.shape[1] for p in prompts[:i])
                    mask = torch.ones(1, start + ids.shape[1], dtype=torch.long, device=DEVICE)
                    positions = torch.arange(start, start + ids.shape[1], device=DEVICE)[None]
                    out.append(model(input_ids=ids, attention_mask=mask, position_ids=positions,
                                     past_key_values=cache, use_cache=True).logits)
        return out

    ours, reference = logits(name), logits(ARCHS[arch].reference)
    for i, (a, b) in enumerate(zip(ours, reference)):
        assert not torch.isnan(a).any()
        torch.testing.assert_close(a, b, atol=2e-4, rtol=2e-4, msg=f"forward {i}")


def test_prefill_mask_dense_is_sdpa_mask_and_block_mask_matches_it():
    pytest.importorskip("transformers", reason="the transformers extra is not installed")
    from torch.nn.attention.flex_attention import create_mask
    from transformers.masking_utils import sdpa_mask, sliding_window_causal_mask_function

    from flashsplit.integrations.prefill_mask import PrefillMask, make_mask_function

    padding = torch.ones(2, 30, dtype=torch.bool)  # transformers hands mask functions a bool padding mask
    padding[1, :7] = False
    kwargs = dict(batch_size=2, q_length=30, kv_length=34, mask_function=sliding_window_causal_mask_function(5),
                  attention_mask=padding, allow_is_causal_skip=True, local_size=5, device=torch.device("cpu"))
    lazy = make_mask_function(16)(**kwargs)
    assert isinstance(lazy, PrefillMask)
    dense = sdpa_mask(**kwargs)
    assert torch.equal(lazy.dense(), dense) and lazy.dense() is lazy.dense()
    block = lazy.block_mask(torch.device("cpu"))
    from_blocks = create_mask(block.mask_mod, 2, 1, 30, 34, device="cpu")
    assert torch.equal(from_blocks, dense)
    short = make_mask_function(16)(**dict(kwargs, q_length=3, kv_length=34))
    assert isinstance(short, torch.Tensor) and short.dtype == torch.bool


def test_compiled_prefill_calls_compiled_kernels_with_no_recompile_limit(monkeypatch, generator):
    """On a GPU every call goes through one torch.compile wrapper of create_block_mask and of
    flex_attention, with torch.compile's recompile limit lifted: past it a call would run the
    uncompiled FlexAttention, which builds the dense scores (4 TiB at a 128k prompt of 64 heads).
    The CPU runs the same calls with eager stand-ins for the compiled wrappers."""
    import torch.nn.attention.flex_attention as flex

    from flashsplit.integrations import flex_prefill as module

    seen = []

    def stand_in(name):
        real = getattr(flex, name)

        def call(*args, **kwargs):
            seen.append((name, torch._dynamo.config.recompile_limit))
            return real(*args, **kwargs)
        return call

    for name in ("create_block_mask", "flex_attention"):
        monkeypatch.setitem(module._COMPILED, name, stand_in(name))
    q = torch.randn(1, 4, 24, 64, generator=generator).half()
    k = torch.randn(1, 2, 24, 64, generator=generator).half()
    sinks = torch.randn(4, generator=generator)
    with torch._dynamo.config.patch(recompile_limit=8):
        compiled = flex_prefill(q, k, k, None, sliding_window=6, softcap=5.0, sinks=sinks, compiled=True)
        assert torch._dynamo.config.recompile_limit == 8
    assert [name for name, _ in seen] == ["create_block_mask", "flex_attention"]
    assert all(limit > 10**6 for _, limit in seen), seen
    eager = flex_prefill(q, k, k, None, sliding_window=6, softcap=5.0, sinks=sinks, compiled=False)
    assert len(seen) == 2 and torch.equal(compiled, eager)
