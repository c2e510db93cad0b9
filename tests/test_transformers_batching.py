"""Continuous batching (``generate_batch``) through the integration's ``"paged|" + name`` attention.

Each prompt's tokens are checked against plain greedy ``generate`` of that prompt alone with the
model's reference attention (transformers' own ``paged|sdpa`` / ``paged|eager`` are no reference:
on these models paged eager drops Gemma 2's softcap and paged SDPA mis-windows Mistral's rows).
The paged cache is NaN everywhere but its zeroed padding block until tokens are written.
"""

import pytest
import torch

from conftest import DEVICE

pytest.importorskip("transformers", reason="the transformers extra is not installed")
pytest.importorskip("psutil", reason="transformers sizes the CPU paged cache with psutil")

import flashsplit.integrations.transformers as fs_transformers  # noqa: E402
import flashsplit.integrations.transformers_paged as fs_paged  # noqa: E402
from transformers_models import ARCHS, ERR_FACTOR, LOGITS_ATOL, VOCAB, check_greedy, generate, generate_batch  # noqa: E402

DTYPE = torch.float16


def _prompts(lengths, generator):
    return [torch.randint(1, VOCAB, (n,), generator=generator).tolist() for n in lengths]


def _check_against_plain_generate(arch, model, model32, prompts, tokens, new_tokens):
    for prompt, generated in zip(prompts, tokens):
        input_ids = torch.tensor([prompt], device=DEVICE)
        attention_mask = torch.ones_like(input_ids)
        reference = generate(model, arch.reference, input_ids, attention_mask, "dynamic", new_tokens)
        reference32 = generate(model32, arch.reference, input_ids, attention_mask, "dynamic", new_tokens,
                               force=reference.tokens)
        tolerance = ERR_FACTOR * (reference.logits - reference32.logits).abs().amax().item() + LOGITS_ATOL[DTYPE]
        check_greedy(torch.tensor([generated]), reference.tokens.cpu(), reference32.logits.cpu(), tolerance,
                     f"{arch} continuous batching, prompt of {len(prompt)}", free=True)


class PagedDecodeCounter:
    def __init__(self, monkeypatch):
        self.calls = []
        real = fs_paged.decode

        def counting_decode(q, *args, **kwargs):
            self.calls.append(tuple(q.shape))
            return real(q, *args, **kwargs)

        monkeypatch.setattr(fs_paged, "decode", counting_decode)


BATCHING_CASES = [
    # Prompts over max_decode_queries prefill through SDPA (block-diagonal mask), then decode.
    pytest.param("llama", (21, 5, 9), 64, id="llama-prefill-sdpa", marks=pytest.mark.full),
    # 8-token batches: chunked prefill, decode rows beside prefill chunks.
    pytest.param("llama", (21, 5, 9), 8, id="llama-chunked"),
    # Short prompts: the multi-query prefill (rows of 13, 5, 9 queries) runs through flashsplit too.
    pytest.param("qwen2", (13, 5, 9), 64, id="qwen2-short-prompts"),
    pytest.param("gemma2", (21, 5, 9), 64, id="gemma2", marks=pytest.mark.full),
    pytest.param("mistral", (21, 5, 9), 8, id="mistral-chunked", marks=pytest.mark.full),
    pytest.param("gpt-oss", (21, 5, 9), 64, id="gpt-oss", marks=pytest.mark.full),
    pytest.param("gemma2", (13, 5, 9), 8, id="gemma2-chunked", marks=pytest.mark.full),
]


@pytest.mark.parametrize("arch, lengths, max_batch_tokens", BATCHING_CASES)
def test_generate_batch_matches_plain_generate(arch, lengths, max_batch_tokens, monkeypatch, generator):
    arch = ARCHS[arch]
    name = fs_transformers.register()
    model, model32 = arch.build(DTYPE, DEVICE)
    prompts = _prompts(lengths, generator)
    counter = PagedDecodeCounter(monkeypatch)
    tokens = generate_batch(model, name, prompts, 6, max_batch_tokens, monkeypatch)
    assert model.config._attn_implementation == name, "generate_batch restores the implementation"
    decode_steps = [shape for shape in counter.calls if shape[1] == 1]
    assert decode_steps and all(shape[1] <= fs_transformers.DEFAULT_MAX_DECODE_QUERIES for shape in counter.calls)
    if min(max(lengths), max_batch_tokens) <= fs_transformers.DEFAULT_MAX_DECODE_QUERIES:
        assert any(shape[1] > 1 for shape in counter.calls), "short prefills (or chunks) ran through flashsplit"
    _check_against_plain_generate(arch, model, model32, prompts, tokens, 6)


def test_packed_step_layout():
    """The left-padded query block and the page table of a packed batch, against their definitions."""
    cu_q = torch.tensor([0, 3, 4, 6], dtype=torch.int32)  # rows of 3, 1 and 2 queries, 2 padding tokens
    cu_k = torch.tensor([0, 5, 12, 14], dtype=torch.int32)
    step = fs_paged.PackedStep(cu_q, cu_k, total_q=8, max_q=3, max_k=7)
    block = step.query_block_index()
    assert block[0].tolist() == [0, 1, 2] and block[1, 2].item() == 3 and block[2, 1:].tolist() == [4, 5]
    unpad = step.query_unpad_index()
    assert unpad[:6].tolist() == [0, 1, 2, 5, 7, 8]  # row * 3 + slot of each real query
    slots = torch.arange(100, 114)
    table = step.page_table(slots)
    assert table.dtype == torch.int32 and table.shape == (3, 7)
    assert table[0, :5].tolist() == [100, 101, 102, 103, 104] and table[1].tolist() == list(range(105, 112))
    assert table[2, :2].tolist() == [112, 113]
    mask = step.additive_mask(14, None, torch.float32)[0, 0] == 0
    # Row 0: queries at positions 2, 3, 4 of its 5 keys; row 2: positions 0, 1 of 2; padding sees nothing.
    assert mask[0, :5].tolist() == [True, True, True, False, False] and not mask[0, 5:].any()
    assert mask[5, 12:].tolist() == [True, True] and not mask[5, :12].any()
    assert not mask[6:].any()
    windowed = step.additive_mask(14, 2, torch.float32)[0, 0] == 0
    assert windowed[2, :5].tolist() == [False, False, False, True, True]
