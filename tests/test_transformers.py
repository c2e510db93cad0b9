"""The transformers integration: register(), the decode path against SDPA/eager, on tiny models.

Greedy generation is checked through teacher forcing (tests/transformers_models.py): flashsplit
scores the reference's tokens, and its argmax must be the reference's token at every step (but
at a near tie), which is exactly "free greedy generation gives the same tokens"; one test per
cache kind also generates freely (the dynamic one under --full). On the CPU the models run in fp16
(the interpreter's bf16 is wrong).
"""

import pytest
import torch

from conftest import DEVICE

transformers = pytest.importorskip("transformers", reason="the transformers extra is not installed")

import flashsplit.integrations.transformers as fs_transformers  # noqa: E402
from flashsplit.integrations.mask_rows import rows_from_mask  # noqa: E402
from transformers_models import (ARCHS, ERR_FACTOR, LOGITS_ATOL, DecodeCounter, check_chunked_scoring,  # noqa: E402
                                check_generation, check_greedy, generate, left_padded_prompts)

DTYPE = torch.float16  # the interpreter's bf16 tl.dot is wrong: fp16 on the CPU


def test_register_returns_the_name_it_registered():
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    name = fs_transformers.register()
    assert name == "split_kv"
    assert name in ALL_ATTENTION_FUNCTIONS
    assert ALL_MASK_ATTENTION_FUNCTIONS[name].__name__ == "split_kv_mask"
    assert fs_transformers.register("my_decode", backend="triton", max_decode_queries=4) == "my_decode"
    assert "my_decode" in AttentionInterface()


@pytest.mark.parametrize("name, error, match", [
    ("flash_split", ValueError, "'flash'"),
    ("sdpa_split", ValueError, "'sdpa'"),
    ("paged|split", ValueError, "'|'"),
    ("org/kernel", ValueError, "'/'"),
    ("eager", ValueError, "transformers' own"),
    ("", TypeError, "non-empty str"),
    (3, TypeError, "non-empty str"),
])
def test_register_refuses_names_transformers_reads_otherwise(name, error, match):
    with pytest.raises(error, match=match):
        fs_transformers.register(name)


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(backend="cuda"), ValueError, "backend: expected 'auto' or one of"),
    (dict(backend=1), TypeError, "backend: expected a str"),
    (dict(max_decode_queries=0), ValueError, "max_decode_queries: expected >= 1"),
    (dict(max_decode_queries=True), TypeError, "max_decode_queries: expected an int"),
])
def test_register_validates_its_settings(kwargs, error, match):
    with pytest.raises(error, match=match):
        fs_transformers.register(**kwargs)


def _runs_mask(starts, ends, seqlen_q, seqlen_k, window=None):
    """A causal (optionally windowed) mask whose rows' keys are [start, end), queries at the end."""
    mask = torch.zeros(len(starts), 1, seqlen_q, seqlen_k, dtype=torch.bool)
    for b, (start, end) in enumerate(zip(starts, ends)):
        for i in range(seqlen_q):
            position = end - seqlen_q + i
            first = start if window is None else max(start, position - window + 1)
            mask[b, 0, i, first: position + 1] = True
    return mask


@pytest.mark.parametrize("seqlen_q, window", [(1, None), (3, None), (1, 4), (3, 4)])
def test_rows_from_mask_reads_each_rows_live_keys(seqlen_q, window):
    starts, ends = [0, 5, 2, 9], [20, 17, 3 + seqlen_q, 20]  # a StaticCache's tail after `end` stays False
    mask = _runs_mask(starts, ends, seqlen_q, 24, window)
    seqlens, leftpad = rows_from_mask(mask)
    assert seqlens.dtype == leftpad.dtype == torch.int32
    assert seqlens.tolist() == ends
    # With a window, the first key any query sees: the first query's window start.
    expected = [s if window is None else max(s, e - seqlen_q - window + 1) for s, e in zip(starts, ends)]
    assert leftpad.tolist() == expected


def test_rows_from_mask_broadcast_rows_and_empty_rows():
    mask = torch.zeros(1, 1, 1, 8, dtype=torch.bool)
    mask[..., 2:6] = True
    seqlens, leftpad = rows_from_mask(mask.expand(3, 1, 1, 8))
    assert seqlens.tolist() == [6] * 3 and leftpad.tolist() == [2] * 3
    seqlens, leftpad = rows_from_mask(torch.zeros(2, 1, 2, 8, dtype=torch.bool))
    assert seqlens.tolist() == [0, 0] and leftpad.tolist() == [0, 0]
    with pytest.raises(TypeError, match="mask: expected a bool tensor"):
        rows_from_mask(torch.zeros(2, 1, 1, 8))
    with pytest.raises(ValueError, match="one head"):
        rows_from_mask(torch.zeros(2, 4, 1, 8, dtype=torch.bool))


@pytest.mark.parametrize("cache_kind", ["dynamic", "static"])
@pytest.mark.parametrize("lengths", [pytest.param((12,), marks=pytest.mark.full), (12, 7, 10)],
                         ids=["B1", "B3-left-padded"])
def test_llama_generate_matches_sdpa(lengths, cache_kind, monkeypatch, generator):
    check_generation(ARCHS["llama"], DTYPE, DEVICE, lengths, cache_kind, 6, monkeypatch, generator)


@pytest.mark.parametrize("cache_kind", [pytest.param("dynamic", marks=pytest.mark.full), "static"])
def test_llama_free_greedy_generation_equals_sdpa(cache_kind, generator):
    name = fs_transformers.register()
    model, model32 = ARCHS["llama"].build(DTYPE, DEVICE)
    input_ids, attention_mask = left_padded_prompts((9, 12, 4), generator, DEVICE)
    reference = generate(model, "sdpa", input_ids, attention_mask, cache_kind, 6)
    reference32 = generate(model32, "sdpa", input_ids, attention_mask, cache_kind, 6, force=reference.tokens)
    ours = generate(model, name, input_ids, attention_mask, cache_kind, 6)
    tolerance = ERR_FACTOR * (reference.logits - reference32.logits).abs().amax().item() + LOGITS_ATOL[DTYPE]
    check_greedy(ours.tokens, reference.tokens, reference32.logits, tolerance, "free greedy", free=True)


def test_prefill_and_fp32_go_to_sdpa(monkeypatch, generator):
    """Prompts longer than max_decode_queries, and fp32 activations, never reach flashsplit."""
    calls = []
    monkeypatch.setattr(fs_transformers, "decode", lambda *a, **k: calls.append(1))
    name = fs_transformers.register()
    _, model32 = ARCHS["llama"].build(DTYPE, DEVICE)
    input_ids, attention_mask = left_padded_prompts((12, 7), generator, DEVICE)
    reference = generate(model32, "sdpa", input_ids, attention_mask, "static", 3)
    ours = generate(model32, name, input_ids, attention_mask, "static", 3)
    assert calls == [] and torch.equal(ours.logits, reference.logits)


#: The default run: each architecture once, with the cache kind that exercises it most (a
#: DynamicCache's sliding layers keep only the window; a StaticCache's roll); the rest is full.
DEFAULT_ARCH_CASES = {("mistral", "dynamic"), ("qwen2", "static"), ("gemma2", "static"), ("gpt-oss", "dynamic"),
                      ("llama-d128", "static"), ("gemma3", "dynamic")}
ARCH_CASES = [
    pytest.param(arch, cache_kind, lengths, id=f"{arch}-{cache_kind}-B{len(lengths)}",
                 marks=[] if len(lengths) > 1 and (arch, cache_kind) in DEFAULT_ARCH_CASES else [pytest.mark.full])
    for arch in ["mistral", "qwen2", "gemma2", "gpt-oss", "llama-d128", "gemma3"]
    for cache_kind in ["dynamic", "static"]
    for lengths in [(13, 8, 11), (13,)]
]


@pytest.mark.parametrize("arch, cache_kind, lengths", ARCH_CASES)
def test_architecture_generate_matches_reference(arch, cache_kind, lengths, monkeypatch, generator):
    """Mistral (a window shorter than the prompt), Qwen2 (GQA 7), Gemma 2 (softcap, alternating
    windows; eager), gpt-oss (sinks, alternating windows; eager), head dim 128, Gemma 3 (two
    sliding layers per full one, head dim 256)."""
    check_generation(ARCHS[arch], DTYPE, DEVICE, lengths, cache_kind, 6, monkeypatch, generator)


@pytest.mark.full
@pytest.mark.parametrize("arch", ["mistral", "gemma2", "gpt-oss"])
def test_assisted_generation_verifies_drafts_through_flashsplit(arch, monkeypatch, generator):
    """Speculative decoding: the model scores a draft of 3 tokens per step (L_q up to 4 over the
    cache, causal and windowed); its tokens are still those of plain greedy generation."""
    name = fs_transformers.register()
    model, model32 = ARCHS[arch].build(DTYPE, DEVICE)
    assistant, _ = ARCHS["llama"].build(DTYPE, DEVICE, seed=1)  # same vocabulary, another model
    assistant.set_attn_implementation("sdpa")
    assistant.generation_config.num_assistant_tokens = 3
    assistant.generation_config.num_assistant_tokens_schedule = "constant"
    input_ids, attention_mask = left_padded_prompts((13,), generator, DEVICE)
    reference = generate(model, ARCHS[arch].reference, input_ids, attention_mask, "dynamic", 10)
    reference32 = generate(model32, ARCHS[arch].reference, input_ids, attention_mask, "dynamic", 10,
                           force=reference.tokens)
    counter = DecodeCounter(monkeypatch)
    model.set_attn_implementation(name)
    out = model.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=10, min_new_tokens=10,
                         do_sample=False, disable_compile=True, assistant_model=assistant, pad_token_id=0)
    assert max(shape[1] for shape in counter.calls) > 1, "no draft was verified through flashsplit"
    tolerance = ERR_FACTOR * (reference.logits - reference32.logits).abs().amax().item() + LOGITS_ATOL[DTYPE]
    check_greedy(out[:, 13:], reference.tokens, reference32.logits, tolerance, f"{arch} assisted", free=True)


MULTI_QUERY_CASES = [
    pytest.param(arch, chunk, cache_kind, id=f"{arch}-{chunk}-{cache_kind}",
                 marks=[] if (arch, cache_kind) in {("mistral", "dynamic"), ("gemma2", "static")} else [pytest.mark.full])
    for arch, chunk in [("llama", 4), ("mistral", 4), ("gemma2", 3), ("gpt-oss", 4), ("qwen2", 2), ("llama-d128", 3)]
    for cache_kind in ["dynamic", "static"]
]


@pytest.mark.parametrize("arch, chunk, cache_kind", MULTI_QUERY_CASES)
def test_multi_query_steps_match_reference(arch, chunk, cache_kind, monkeypatch, generator):
    """Teacher-forced scoring of a left-padded batch, `chunk` tokens per forward over the cache
    (the verification step of speculative decoding): causal and windowed queries per row."""
    check_chunked_scoring(ARCHS[arch], DTYPE, DEVICE, (13, 8, 11), 8, chunk, cache_kind, monkeypatch, generator)


def test_rows_cache_reads_a_mask_once_and_sees_in_place_changes():
    from flashsplit.integrations.mask_rows import RowsCache

    cache = RowsCache(size=2)
    mask = _runs_mask([0, 3], [9, 9], 1, 12)
    first = cache(mask, 2)
    assert cache(mask, 2)[0] is first[0], "the same mask, unchanged: the cached rows"
    mask[1, 0, 0, 3] = False  # in place: a new version
    seqlens, leftpad = cache(mask, 2)
    assert seqlens.tolist() == [9, 9] and leftpad.tolist() == [0, 4]
    broadcast = _runs_mask([2], [7], 1, 12).expand(3, 1, 1, 12)
    assert cache(broadcast, 3)[1].tolist() == [2, 2, 2]
    other = mask.clone()
    assert cache(other, 2)[1].tolist() == [0, 4] and len(cache._entries) <= 2


def test_rows_and_holes_flags_what_is_not_one_run():
    from flashsplit.integrations.mask_rows import rows_and_holes

    mask = _runs_mask([0, 3, 0], [9, 9, 0], 2, 12, window=4)  # windows, an empty row: one run each
    seqlens, leftpad, holes = rows_and_holes(mask)
    assert (seqlens.tolist(), leftpad.tolist()) == tuple(t.tolist() for t in rows_from_mask(mask))
    assert not holes.any()
    mask[1, 0, :, 5] = False  # a hidden key inside row 1's run
    assert rows_and_holes(mask)[2].tolist() == [False, True, False]


@pytest.mark.parametrize("cache_kind", ["dynamic", "static"])
def test_right_padded_generation_is_refused(cache_kind, generator):
    """A right-padded prompt puts pads between a row's prompt and its new tokens: the decode
    step's mask hides keys inside the row's run, which flashsplit would attend. It raises,
    naming the argument and the fix; the same prompts left-padded generate."""
    from flashsplit.integrations.mask_rows import MaskHoleError
    from transformers_models import right_padded

    fs_transformers.register()
    model, _ = ARCHS["llama"].build(DTYPE, DEVICE)
    input_ids, attention_mask = left_padded_prompts((9, 5), generator, DEVICE)
    generate(model, fs_transformers.DEFAULT_NAME, input_ids, attention_mask, cache_kind, 2)
    right_ids, right_mask = right_padded(input_ids, attention_mask)
    with pytest.raises(MaskHoleError, match=r"attention_mask: in row\(s\) \[1\].*padding_side = 'left'"):
        generate(model, fs_transformers.DEFAULT_NAME, right_ids, right_mask, cache_kind, 2)


def test_example_generates_the_sdpa_tokens(capsys):
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).parent.parent / "examples" / "generate.py"
    spec = importlib.util.spec_from_file_location("generate_example", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    example.main(["--new-tokens", "4"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 3 and all(line.endswith("(same as SDPA)") for line in lines), lines
