"""The transformers integration: register(), the decode path against SDPA/eager, on tiny models.

Greedy generation is checked through teacher forcing (tests/transformers_models.py): flashsplit
scores the reference's tokens, and its argmax must be the reference's token at every step, which
is exactly "free greedy generation gives the same tokens"; one test per cache also generates
freely. On the CPU the checks are strict (no near-tie exemption): fp16 through the interpreter.
"""

import subprocess
import sys

import pytest
import torch

from conftest import DEVICE

transformers = pytest.importorskip("transformers", reason="the transformers extra is not installed")

import flashsplit.integrations.transformers as fs_transformers  # noqa: E402
from flashsplit.integrations.mask_rows import rows_from_mask  # noqa: E402
from transformers_models import ARCHS, check_generation, generate, left_padded_prompts  # noqa: E402

DTYPE = torch.float16  # the interpreter's bf16 tl.dot is wrong: fp16 on the CPU
STRICT = 0.0 if DEVICE == "cpu" else None  # CPU: no near-tie exemption


def test_register_returns_the_name_it_registered():
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    name = fs_transformers.register()
    assert name == "split_kv"
    assert name in ALL_ATTENTION_FUNCTIONS
    assert ALL_MASK_ATTENTION_FUNCTIONS[name] is sdpa_mask
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


def test_flashsplit_imports_without_transformers():
    script = (
        "import sys; sys.modules['transformers'] = None\n"
        "import flashsplit, flashsplit.integrations.transformers as t\n"
        "assert 'transformers' not in [m for m in sys.modules if sys.modules[m] is not None]\n"
        "try:\n    t.register()\nexcept ImportError as e:\n    print('ImportError:', e)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env={"TRITON_INTERPRET": "1", "PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(sys.path)})
    assert done.returncode == 0, done.stderr
    assert "ImportError: flashsplit.integrations.transformers needs transformers" in done.stdout
    assert "flashsplit[transformers]" in done.stdout


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
@pytest.mark.parametrize("lengths", [(12,), (12, 7, 10)], ids=["B1", "B3-left-padded"])
def test_llama_generate_matches_sdpa(lengths, cache_kind, monkeypatch, generator):
    check_generation(ARCHS["llama"], DTYPE, DEVICE, lengths, cache_kind, 6, monkeypatch, generator,
                     tie_margin=STRICT)


@pytest.mark.parametrize("cache_kind", ["dynamic", "static"])
def test_llama_free_greedy_generation_equals_sdpa(cache_kind, generator):
    name = fs_transformers.register()
    model, _ = ARCHS["llama"].build(DTYPE, DEVICE)
    input_ids, attention_mask = left_padded_prompts((9, 12, 4), generator, DEVICE)
    reference = generate(model, "sdpa", input_ids, attention_mask, cache_kind, 6)
    ours = generate(model, name, input_ids, attention_mask, cache_kind, 6)
    assert ours.tokens.tolist() == reference.tokens.tolist()


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
