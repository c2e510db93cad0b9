"""The transformers integration on a GPU, in bf16, at realistic head counts and widths: the CPU
suite's checks (tests/transformers_models.py) with prompts of hundreds to thousands of tokens,
windows shorter than the prompts, and continuous batching with a larger paged cache."""

import pytest
import torch

from conftest import DEVICE

pytest.importorskip("transformers", reason="the transformers extra is not installed")

import flashsplit.integrations.transformers as fs_transformers  # noqa: E402
from transformers_models import (ARCHS, ERR_FACTOR, LOGITS_ATOL, VOCAB, check_chunked_scoring,  # noqa: E402
                                check_generation, check_greedy, generate, generate_batch, with_fields)

pytestmark = pytest.mark.gpu
DTYPE = torch.bfloat16

#: Realistic attention shapes (heads, KV heads, head dim, windows) on a few layers.
WIDE = {
    "llama": dict(hidden_size=4096, intermediate_size=4096, num_attention_heads=32, num_key_value_heads=8,
                  head_dim=128),  # Llama-3-8B heads
    "mistral": dict(hidden_size=4096, intermediate_size=4096, num_attention_heads=32, num_key_value_heads=8,
                    head_dim=128, sliding_window=512),
    "qwen2": dict(hidden_size=3584, intermediate_size=4096, num_attention_heads=28, num_key_value_heads=4,
                  head_dim=128),  # Qwen2-7B heads: GQA 7
    "gemma2": dict(hidden_size=2304, intermediate_size=4096, num_attention_heads=8, num_key_value_heads=4,
                   head_dim=256, sliding_window=512, query_pre_attn_scalar=256, attn_logit_softcapping=50.0),
    "gemma3": dict(hidden_size=2560, intermediate_size=4096, num_attention_heads=8, num_key_value_heads=4,
                   head_dim=256, sliding_window=512, query_pre_attn_scalar=256,
                   layer_types=["sliding_attention"] * 3 + ["full_attention"]),  # Gemma-3-4B heads
    "gpt-oss": dict(hidden_size=2880, intermediate_size=1024, num_attention_heads=64, num_key_value_heads=8,
                    head_dim=64, sliding_window=128, num_local_experts=4, num_experts_per_tok=2),
}
COMMON = dict(num_hidden_layers=4, initializer_range=0.05, max_position_embeddings=8192)


def _wide(name):
    return with_fields(ARCHS[name], **WIDE[name], **COMMON)


@pytest.mark.parametrize("cache_kind", ["dynamic", "static"])
@pytest.mark.parametrize("arch", list(WIDE))
def test_wide_generate_matches_reference(arch, cache_kind, monkeypatch):
    generator = torch.Generator(device=DEVICE).manual_seed(3)
    check_generation(_wide(arch), DTYPE, DEVICE, (1500, 700, 1100, 40), cache_kind, 16, monkeypatch, generator)


@pytest.mark.parametrize("arch", list(WIDE))
def test_wide_multi_query_steps_match_reference(arch, monkeypatch):
    generator = torch.Generator(device=DEVICE).manual_seed(5)
    check_chunked_scoring(_wide(arch), DTYPE, DEVICE, (1500, 700, 1100), 24, 4, "static", monkeypatch, generator)


@pytest.mark.parametrize("arch", ["llama", "gemma2", "gpt-oss"])
def test_wide_generate_batch_matches_plain_generate(arch, monkeypatch):
    generator = torch.Generator(device=DEVICE).manual_seed(9)
    arch = _wide(arch)
    name = fs_transformers.register()
    model, model32 = arch.build(DTYPE, DEVICE)
    prompts = [torch.randint(1, VOCAB, (n,), generator=generator, device=DEVICE).tolist() for n in (900, 40, 300, 5)]
    tokens = generate_batch(model, name, prompts, 12, 512, monkeypatch, block_size=64, num_blocks=64)
    for prompt, generated in zip(prompts, tokens):
        input_ids = torch.tensor([prompt], device=DEVICE)
        mask = torch.ones_like(input_ids)
        reference = generate(model, arch.reference, input_ids, mask, "dynamic", 12)
        reference32 = generate(model32, arch.reference, input_ids, mask, "dynamic", 12, force=reference.tokens)
        tolerance = ERR_FACTOR * (reference.logits - reference32.logits).abs().amax().item() + LOGITS_ATOL[DTYPE]
        check_greedy(torch.tensor([generated], device=DEVICE), reference.tokens, reference32.logits, tolerance,
                     f"{arch} continuous batching, prompt of {len(prompt)}", free=True)


#: gpt-oss-20b's attention (64/8 heads of 64, 128-key windows on alternate layers, sinks), a small
#: MoE, 2 layers (one sliding, one full), positions for a 128k prompt.
GPT_OSS_20B = dict(hidden_size=2880, intermediate_size=1024, num_attention_heads=64, num_key_value_heads=8,
                   head_dim=64, sliding_window=128, num_local_experts=4, num_experts_per_tok=2,
                   num_hidden_layers=2, initializer_range=0.05, max_position_embeddings=131072 + 16)
#: Gemma-2-9B's attention (16/8 heads of 256, softcap 50, 4096-key windows on alternate layers).
GEMMA2_9B = dict(hidden_size=3584, intermediate_size=4096, num_attention_heads=16, num_key_value_heads=8,
                 head_dim=256, sliding_window=4096, query_pre_attn_scalar=256, attn_logit_softcapping=50.0,
                 num_hidden_layers=2, initializer_range=0.05, max_position_embeddings=8192 + 16)


@pytest.mark.parametrize("arch, fields, lengths, bound_gib", [
    ("gpt-oss", GPT_OSS_20B, (131072,), 32),
    ("gemma2", GEMMA2_9B, (8192, 8000, 6000, 8192, 4000, 8100, 7000, 8192), 32),
], ids=["gpt-oss-20b-1x128k", "gemma2-9b-8x8k"])
def test_long_prompt_prefill_of_sink_and_softcap_layers(arch, fields, lengths, bound_gib):
    """Prompts that the models' eager attention cannot take ([B, H, L, L] scores: 64 heads x
    128k^2 are 2 TiB) prefill through FlexAttention on one GPU, with block masks only (no dense
    L^2 mask): finite logits, and peak memory above the model within ``bound_gib``."""
    from transformers import DynamicCache

    from transformers_models import left_padded_prompts

    generator = torch.Generator(device=DEVICE).manual_seed(21)
    name = fs_transformers.register()
    arch = with_fields(ARCHS[arch], **fields)
    torch.manual_seed(0)
    import transformers

    with torch.device(DEVICE):
        model = getattr(transformers, arch.model)(arch.build_config()).to(DTYPE).eval()
    model.set_attn_implementation(name)
    input_ids, attention_mask = left_padded_prompts(lengths, generator, DEVICE)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    with torch.no_grad():
        logits = model(input_ids=input_ids, attention_mask=attention_mask, past_key_values=DynamicCache(
            config=model.config), use_cache=True, logits_to_keep=1).logits
    peak_gib = (torch.cuda.max_memory_allocated() - base) / 2**30
    assert torch.isfinite(logits).all()
    assert peak_gib <= bound_gib, f"prefill took {peak_gib:.1f} GiB above the model"


def test_right_padded_generation_is_refused_without_a_host_sync():
    """On the GPU the mask check is read behind an event: a right-padded batch raises at a later
    decode step of the same generate (the steps themselves never wait for the device)."""
    from flashsplit.integrations.mask_rows import MaskHoleError
    from transformers_models import left_padded_prompts, right_padded

    generator = torch.Generator(device=DEVICE).manual_seed(13)
    fs_transformers.register()
    model, _ = _wide("llama").build(DTYPE, DEVICE)
    input_ids, attention_mask = left_padded_prompts((300, 120), generator, DEVICE)
    right_ids, right_mask = right_padded(input_ids, attention_mask)
    with pytest.raises(MaskHoleError, match=r"row\(s\) \[1\]"):
        generate(model, fs_transformers.DEFAULT_NAME, right_ids, right_mask, "static", 8)
