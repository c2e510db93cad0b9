"""Compiled generation through the integration: transformers compiles a StaticCache's decode
step (by default with cudagraph trees, ``mode="reduce-overhead"``), where flashsplit runs as the
operator ``torch.ops.flashsplit.decode_into`` with no buffer outliving a call."""

import pytest
import torch

from conftest import DEVICE, HAS_CUDA

pytest.importorskip("transformers", reason="the transformers extra is not installed")

import flashsplit.integrations.transformers as fs_transformers  # noqa: E402
from flashsplit import dispatch, workspace  # noqa: E402
from transformers_models import (ARCHS, ERR_FACTOR, LOGITS_ATOL, VOCAB, DecodeCounter, check_greedy,  # noqa: E402
                                decode_steps, generate, left_padded_prompts, with_fields)


def _transient_spy(monkeypatch):
    seen = []
    real = dispatch.decode_into

    def spy(*args, **kwargs):
        seen.append(workspace.scratch_is_transient())
        return real(*args, **kwargs)

    monkeypatch.setattr(dispatch, "decode_into", spy)
    return seen


def _mask_like_transformers(pad_mask: torch.Tensor, cache_position: torch.Tensor) -> torch.Tensor:
    """``[B, 1, L_q, L_k]``: causal over the cache from int64 positions, and the 0/1 padding mask,
    the way transformers builds a decode step's mask (what the mask reductions fuse with)."""
    keys = torch.arange(pad_mask.shape[1], device=pad_mask.device)
    return (keys[None, :] <= cache_position[:, None])[None, None] & pad_mask[:, None, None, :].bool()


def test_mask_reductions_stay_in_one_integer_dtype_under_dynamic_shapes():
    """A recompile at a new shape (generate called again at another batch or cache length) traces
    the mask reductions with symbolic sizes, the key count among them. Every select and reduction
    of the rows must be int64, the dtype of sizes: Inductor (torch 2.11) loaded an int32 scalar made
    from a size as int64 inside a looped reduction, whose carried value then changed type, which
    Triton refuses to compile (GPU caches over one reduction block)."""
    from flashsplit.integrations.mask_rows import rows_from_mask

    graphs = []

    def keep_graph(gm, example_inputs):
        from torch._functorch.aot_autograd import aot_module_simplified

        def keep(gm, _):
            graphs.append(gm)
            return gm
        return aot_module_simplified(gm, example_inputs, fw_compiler=keep)

    def rows(pad_mask, cache_position):
        return rows_from_mask(_mask_like_transformers(pad_mask, cache_position))

    torch._dynamo.reset()
    compiled = torch.compile(rows, backend=keep_graph, dynamic=True, fullgraph=True)
    for batch, width, pad in [(3, 40, 5), (2, 70, 9)]:
        pad_mask = torch.ones(batch, width, dtype=torch.long)
        pad_mask[0, :pad] = 0
        position = torch.tensor([width - 2])
        seqlens, leftpad = compiled(pad_mask, position)
        assert seqlens.tolist() == [width - 1] * batch
        assert leftpad.tolist() == [pad] + [0] * (batch - 1)
    assert graphs
    checked = 0
    for gm in graphs:
        for node in gm.graph.nodes:
            if node.op != "call_function" or not str(node.target).startswith(
                    ("aten.where", "aten.amax", "aten.amin", "aten.minimum", "aten.scalar_tensor")):
                continue
            assert node.meta["val"].dtype == torch.int64, f"{node.format_node()}: {node.meta['val'].dtype}"
            checked += 1
    assert checked >= 4, checked


@pytest.mark.parametrize("arch", ["llama", *[pytest.param(a, marks=pytest.mark.full)
                                             for a in ("mistral", "qwen2", "gemma2", "gemma3", "gpt-oss")]])
def test_recompiled_decode_step_with_symbolic_sizes_equals_eager(arch, generator):
    """A compiled decode loop over left-padded StaticCaches of three shapes (full-length layers:
    transformers' sliding layers recompile at every step): the second compiles with symbolic
    sizes, the third reuses that graph. Without Inductor's numerics (aot_eager) the logits are
    eager flashsplit's exactly, so the rows read from the mask under symbolic sizes are the eager
    ones; windows, softcaps and sinks trace as the model passes them."""
    from torch._dynamo.testing import CompileCounterWithBackend

    name = fs_transformers.register()
    model, _ = ARCHS[arch].build(torch.float16, DEVICE)
    torch._dynamo.reset()
    graphs = CompileCounterWithBackend("aot_eager")  # counts this compile's graphs only
    compiled = torch.compile(model.forward, backend=graphs, fullgraph=True)
    for lengths in [(40,), (24, 13, 20), (31, 7, 25, 30)]:
        input_ids, attention_mask = left_padded_prompts(lengths, generator, DEVICE)
        tokens = torch.randint(1, VOCAB, (len(lengths), 3), generator=generator, device=generator.device).to(DEVICE)
        eager = decode_steps(model, name, input_ids, attention_mask, tokens, cache_kind="full")
        ours = decode_steps(model, name, input_ids, attention_mask, tokens, forward=compiled, cache_kind="full")
        assert torch.isfinite(ours).all() and torch.equal(ours, eager), lengths
    assert graphs.frame_count == 2, graphs.frame_count
    torch._dynamo.reset()


def test_compiled_static_cache_generate_equals_eager(monkeypatch, generator):
    """fullgraph=True: the attention (mask reductions, decode) traces without a break; the
    compiled decode steps run flashsplit's operator in transient scratch, token for token as eager."""
    from transformers import CompileConfig

    name = fs_transformers.register()
    model, _ = ARCHS["llama"].build(torch.float16, DEVICE)
    input_ids, attention_mask = left_padded_prompts((12, 7, 10), generator, DEVICE)
    eager = generate(model, name, input_ids, attention_mask, "static", 5, poison=True)
    config = CompileConfig(backend="aot_eager", fullgraph=True, dynamic=False, mode=None)
    config._compile_all_devices = True  # transformers compiles on CUDA only, unless told
    torch._dynamo.reset()
    seen = _transient_spy(monkeypatch)
    compiled = generate(model, name, input_ids, attention_mask, "static", 5, poison=True, compile_config=config)
    assert hasattr(model, "_compiled_call"), "generate did not compile the decode step"
    layers = model.config.num_hidden_layers
    assert seen.count(True) == layers * 4, seen  # 4 compiled decode steps; prefill is eager
    assert compiled.tokens.tolist() == eager.tokens.tolist()
    assert torch.equal(compiled.logits, eager.logits)


@pytest.mark.gpu
@pytest.mark.parametrize("arch", ["llama", "mistral", "gemma2"])
def test_transformers_default_compiled_static_generate(arch, monkeypatch):
    """transformers' own compilation of static-cache generation (cudagraph trees): it must run
    (no "tensor(s) in the cudagraph pool not tracked as outputs"), and score like eager flashsplit."""
    assert HAS_CUDA
    generator = torch.Generator(device=DEVICE).manual_seed(11)
    arch = ARCHS[arch]
    name = fs_transformers.register()
    sizes = dict(hidden_size=1024, intermediate_size=2048, num_hidden_layers=4, initializer_range=0.05)
    model, model32 = arch.build(torch.bfloat16, DEVICE, **sizes)
    input_ids, attention_mask = left_padded_prompts((700, 300, 520, 64), generator, DEVICE)
    reference = generate(model, arch.reference, input_ids, attention_mask, "static", 12)
    reference32 = generate(model32, arch.reference, input_ids, attention_mask, "static", 12, force=reference.tokens)
    torch._dynamo.reset()
    counter = DecodeCounter(monkeypatch)
    compiled = generate(model, name, input_ids, attention_mask, "static", 12, force=reference.tokens, poison=True,
                        compile_config="default")
    assert hasattr(model, "_compiled_call"), "generate did not compile the decode step"
    assert counter.calls, "flashsplit was traced into the compiled decode step"
    assert torch.isfinite(compiled.logits).all()
    ref_err = (reference.logits - reference32.logits).abs().amax().item()
    err = (compiled.logits - reference32.logits).abs().amax().item()
    assert err <= ERR_FACTOR * ref_err + LOGITS_ATOL[torch.bfloat16], (err, ref_err)
    check_greedy(compiled.logits.argmax(-1), reference.tokens, reference32.logits,
                 ERR_FACTOR * ref_err + LOGITS_ATOL[torch.bfloat16], f"{arch} compiled")
    # The free, compiled generation (the graphs replay) gives the eager tokens but at a near tie.
    free = generate(model, name, input_ids, attention_mask, "static", 12, compile_config="default")
    check_greedy(free.tokens, reference.tokens, reference32.logits, ERR_FACTOR * ref_err + LOGITS_ATOL[torch.bfloat16],
                 f"{arch} compiled, free", free=True)


#: Llama-3-8B's widths on 2 layers, positions for a 32k cache.
LLAMA3_8B = dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8,
                 head_dim=128, num_hidden_layers=2, initializer_range=0.05, max_position_embeddings=33000)
#: (batch, prompt tokens) of compiled decode steps over caches of more than one reduction block:
#: B = 1 x 32k, then B = 16 x 4k in the same process, so the second compiles with dynamic shapes.
#: With NEW_TOKENS the caches hold 32768 and 4096 slots (SDPA's masked prefill wants aligned rows).
LONG_CACHES = [(1, 32760), (16, 4088)]
NEW_TOKENS = 8


def _long_prompts(batch: int, prompt: int, step: int, generator):
    lengths = [prompt] + [prompt - step * (i + 1) for i in range(batch - 1)]
    return left_padded_prompts(lengths, generator, DEVICE)


def _bound(eager, sdpa) -> float:
    """Compiled flashsplit may differ from eager flashsplit by 2x what separates two correct bf16
    attentions (SDPA and eager flashsplit) at these shapes, plus the bf16 slack: a float32 model
    at a 32k prompt would not fit beside them."""
    return ERR_FACTOR * (sdpa - eager).abs().amax().item() + LOGITS_ATOL[torch.bfloat16]


@pytest.mark.gpu
def test_compiled_generate_at_long_caches_and_a_recompile(monkeypatch):
    """transformers' default-compiled static-cache generate (cudagraph trees) at B = 1 x 32k and
    B = 16 x 4k, left-padded, one after the other (the second shape recompiles with symbolic
    sizes): it compiles and runs, flashsplit decodes, and the logits and greedy picks are eager
    flashsplit's within what separates it from SDPA."""
    assert HAS_CUDA
    generator = torch.Generator(device=DEVICE).manual_seed(17)
    name = fs_transformers.register()
    model, _ = with_fields(ARCHS["llama"], **LLAMA3_8B).build(torch.bfloat16, DEVICE)
    torch._dynamo.reset()
    for batch, prompt in LONG_CACHES:
        input_ids, attention_mask = _long_prompts(batch, prompt, 37, generator)
        eager = generate(model, name, input_ids, attention_mask, "static", NEW_TOKENS)
        sdpa = generate(model, "sdpa", input_ids, attention_mask, "static", NEW_TOKENS, force=eager.tokens)
        counter = DecodeCounter(monkeypatch)
        compiled = generate(model, name, input_ids, attention_mask, "static", NEW_TOKENS, force=eager.tokens,
                            compile_config="default")
        monkeypatch.undo()
        assert hasattr(model, "_compiled_call"), "generate did not compile the decode step"
        assert counter.calls, "flashsplit was not traced into the compiled decode step"
        assert torch.isfinite(compiled.logits).all()
        tolerance = _bound(eager.logits, sdpa.logits)
        err = (compiled.logits - eager.logits).abs().amax().item()
        assert err <= tolerance, f"B={batch} x {prompt}: logits differ from eager by {err:.4g} > {tolerance:.4g}"
        check_greedy(compiled.logits.argmax(-1), eager.tokens, eager.logits, tolerance,
                     f"compiled B={batch} x {prompt}")
    torch._dynamo.reset()


@pytest.mark.gpu
def test_reduce_overhead_decode_loop_at_long_caches():
    """``torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)`` at B = 1 x 32k, then
    B = 16 x 4k (a dynamic-shape recompile), left-padded: no cudagraph skipped, logits as eager
    flashsplit's within what separates it from SDPA, or compiled SDPA from eager SDPA."""
    from torch._dynamo.utils import counters

    assert HAS_CUDA
    generator = torch.Generator(device=DEVICE).manual_seed(19)
    name = fs_transformers.register()
    model, _ = with_fields(ARCHS["llama"], **LLAMA3_8B).build(torch.bfloat16, DEVICE)
    torch._dynamo.reset()
    counters.clear()
    for batch, prompt in LONG_CACHES:
        input_ids, attention_mask = _long_prompts(batch, prompt, 53, generator)
        tokens = torch.randint(1, VOCAB, (batch, NEW_TOKENS), generator=generator, device=DEVICE)
        eager = decode_steps(model, name, input_ids, attention_mask, tokens)
        sdpa = decode_steps(model, "sdpa", input_ids, attention_mask, tokens)
        sdpa_compiled = decode_steps(model, "sdpa", input_ids, attention_mask, tokens, compile_mode="reduce-overhead")
        compiled = decode_steps(model, name, input_ids, attention_mask, tokens, compile_mode="reduce-overhead")
        assert counters["inductor"]["cudagraph_skips"] == 0, dict(counters["inductor"])
        assert torch.isfinite(compiled).all()
        # Inductor's fusions of the rest of the model (norms, rotary, MLP) move bf16 logits too:
        # compiled flashsplit may move as far from eager as compiled SDPA moves from eager SDPA.
        tolerance = max(_bound(eager, sdpa), _bound(sdpa, sdpa_compiled))
        err = (compiled - eager).abs().amax().item()
        assert err <= tolerance, f"B={batch} x {prompt}: logits differ from eager by {err:.4g} > {tolerance:.4g}"
    torch._dynamo.reset()


#: Llama-3-8B's attention (32 q / 8 KV heads of 128) on 4 layers.
WIDE_LLAMA = dict(hidden_size=4096, intermediate_size=4096, num_attention_heads=32, num_key_value_heads=8,
                  head_dim=128, num_hidden_layers=4, initializer_range=0.05, max_position_embeddings=8192)


@pytest.mark.gpu
def test_reduce_overhead_compiled_decode_loop_matches_eager():
    """A user's own ``torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)`` over a
    StaticCache of a left-padded batch: the attention traces without a break, cudagraph trees
    record and replay the steps (none skipped, no pool memory left behind), and the logits are as
    close to float32's as eager flashsplit's bound (2x bf16 SDPA's error + atol)."""
    from torch._dynamo.utils import counters

    assert HAS_CUDA
    generator = torch.Generator(device=DEVICE).manual_seed(13)
    name = fs_transformers.register()
    model, model32 = with_fields(ARCHS["llama"], **WIDE_LLAMA).build(torch.bfloat16, DEVICE)
    input_ids, attention_mask = left_padded_prompts((1500, 700, 1100, 40), generator, DEVICE)
    tokens = torch.randint(1, VOCAB, (4, 10), generator=generator, device=DEVICE)
    reference32 = decode_steps(model32, "sdpa", input_ids, attention_mask, tokens)
    sdpa = decode_steps(model, "sdpa", input_ids, attention_mask, tokens)
    eager = decode_steps(model, name, input_ids, attention_mask, tokens)
    torch._dynamo.reset()
    counters.clear()
    compiled = decode_steps(model, name, input_ids, attention_mask, tokens, compile_mode="reduce-overhead")
    assert counters["inductor"]["cudagraph_skips"] == 0, dict(counters["inductor"])
    assert torch.isfinite(compiled).all()
    tolerance = ERR_FACTOR * (sdpa - reference32).abs().amax().item() + LOGITS_ATOL[torch.bfloat16]
    for what, logits in [("eager", eager), ("compiled", compiled)]:
        err = (logits - reference32).abs().amax().item()
        assert err <= tolerance, f"{what} flashsplit: logits error {err:.4g} vs float32 exceeds {tolerance:.4g}"
    torch._dynamo.reset()


def test_full_length_static_cache_compiles_one_decode_graph(generator):
    """Mistral (a window of 6 under prompts of up to 20 tokens): transformers' sliding-window cache
    layer changes a Python int at every step, which a compiled step guards on. Over a full-length
    StaticCache the compiled steps (aot_eager) run one graph, give eager flashsplit's logits over
    the same cache exactly, and the reference's (SDPA over transformers' own sliding cache) within
    its fp16 error against a float32 model."""
    from torch._dynamo.testing import CompileCounterWithBackend
    from transformers import StaticCache
    from transformers.cache_utils import StaticSlidingWindowLayer

    name = fs_transformers.register()
    arch = ARCHS["mistral"]
    model, model32 = arch.build(torch.float16, DEVICE)
    input_ids, attention_mask = left_padded_prompts((20, 9, 16), generator, DEVICE)
    tokens = torch.randint(1, VOCAB, (3, 5), generator=generator, device=generator.device).to(DEVICE)
    capacity = input_ids.shape[1] + tokens.shape[1]
    cache = fs_transformers.full_length_static_cache(model.config, capacity)
    assert not any(isinstance(layer, StaticSlidingWindowLayer) for layer in cache.layers)
    assert any(isinstance(layer, StaticSlidingWindowLayer)
               for layer in StaticCache(config=model.config, max_cache_len=capacity).layers)

    torch._dynamo.reset()
    graphs = CompileCounterWithBackend("aot_eager")
    compiled = decode_steps(model, name, input_ids, attention_mask, tokens, cache_kind="full",
                            forward=torch.compile(model.forward, backend=graphs, fullgraph=True))
    assert graphs.frame_count == 1, graphs.frame_count
    torch._dynamo.reset()
    assert torch.isfinite(compiled).all()
    assert torch.equal(compiled, decode_steps(model, name, input_ids, attention_mask, tokens, cache_kind="full"))
    reference, reference32 = (decode_steps(m, arch.reference, input_ids, attention_mask, tokens) for m in (model, model32))
    bound = ERR_FACTOR * (reference - reference32).abs().amax().item() + LOGITS_ATOL[torch.float16]
    assert (compiled - reference32).abs().amax().item() <= bound
