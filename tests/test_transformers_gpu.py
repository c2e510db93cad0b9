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
