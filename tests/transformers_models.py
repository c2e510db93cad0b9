"""Tiny random-weight transformers models and the generate-level checks of the integration.

A case builds one architecture from its config (a few layers, small hidden sizes, so the Triton
interpreter stays fast on the CPU), then compares flashsplit against the model's own reference
attention (SDPA, or eager where SDPA lacks the layer's softcap or sinks):

1. the reference in the test dtype generates greedily: tokens ``T`` and its logits;
2. the same weights in float32 score ``T`` (teacher-forced through ``generate``): the reference logits;
3. flashsplit scores ``T`` in the test dtype, with the cache's dead slots (left pads, a
   StaticCache's empty slots) poisoned with NaN after prefill, and its decode calls counted.

flashsplit's logits may differ from float32's by at most ``ERR_FACTOR`` x the reference's own
error in the test dtype, plus ``LOGITS_ATOL``; and its greedy choice given ``T``'s prefix must be
``T``'s token at every step (so free greedy generation gives ``T`` token for token), except at a
near tie: a token whose float32 logit is within that tolerance of the best is as good a pick.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

import flashsplit.integrations.transformers as fs_transformers

ERR_FACTOR = 2.0
#: Absolute slack on logits (their scale here is ~10) per dtype.
LOGITS_ATOL = {torch.float16: 2e-2, torch.bfloat16: 1.5e-1}
VOCAB = 512


@dataclass(frozen=True)
class Arch:
    """One architecture: its transformers classes, config and reference attention."""

    name: str
    model: str  #: transformers class name, e.g. "LlamaForCausalLM"
    config: str  #: its config class name
    kwargs: tuple  #: config fields ((key, value), ...) on top of the shared tiny sizes
    reference: str  #: "sdpa" or "eager"

    def build_config(self, **overrides):
        import transformers

        sizes = dict(vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                     max_position_embeddings=1024, initializer_range=0.2)
        sizes.update(dict(self.kwargs))
        sizes.update(overrides)
        return getattr(transformers, self.config)(**sizes)

    def build(self, dtype: torch.dtype, device, seed: int = 0, **overrides):
        """The model in ``dtype`` and in float32, with the same random weights, in eval mode."""
        import transformers

        torch.manual_seed(seed)
        with torch.device(device):  # the weights are made where they run
            model32 = getattr(transformers, self.model)(self.build_config(**overrides)).eval()
            low = getattr(transformers, self.model)(self.build_config(**overrides)).eval()
        low.load_state_dict(model32.state_dict())
        return low.to(dtype=dtype), model32

    def __str__(self) -> str:
        return self.name


ARCHS = {arch.name: arch for arch in [
    Arch("llama", "LlamaForCausalLM", "LlamaConfig",
         (("num_attention_heads", 4), ("num_key_value_heads", 2), ("head_dim", 64)), "sdpa"),
    Arch("llama-d128", "LlamaForCausalLM", "LlamaConfig",
         (("num_attention_heads", 4), ("num_key_value_heads", 1), ("head_dim", 128)), "sdpa"),
    # A window shorter than the prompt.
    Arch("mistral", "MistralForCausalLM", "MistralConfig",
         (("num_attention_heads", 4), ("num_key_value_heads", 2), ("head_dim", 64), ("sliding_window", 6)), "sdpa"),
    # GQA 7: seven q heads per KV head.
    Arch("qwen2", "Qwen2ForCausalLM", "Qwen2Config",
         (("num_attention_heads", 7), ("num_key_value_heads", 1), ("head_dim", 64)), "sdpa"),
    # Softcapped scores, alternating sliding and full layers (SDPA has no softcap: eager).
    Arch("gemma2", "Gemma2ForCausalLM", "Gemma2Config",
         (("num_attention_heads", 2), ("num_key_value_heads", 1), ("head_dim", 128), ("sliding_window", 6),
          ("query_pre_attn_scalar", 128), ("attn_logit_softcapping", 5.0), ("tie_word_embeddings", False)), "eager"),
    # Five sliding layers per full one in Gemma 3 (here two), no softcap, head dim 256.
    Arch("gemma3", "Gemma3ForCausalLM", "Gemma3TextConfig",
         (("num_attention_heads", 2), ("num_key_value_heads", 1), ("head_dim", 256), ("sliding_window", 6),
          ("query_pre_attn_scalar", 256), ("tie_word_embeddings", False), ("num_hidden_layers", 3),
          ("layer_types", ["sliding_attention", "sliding_attention", "full_attention"])), "sdpa"),
    # Learned sinks, alternating sliding and full layers, a small MoE (gpt-oss has no SDPA: eager).
    Arch("gpt-oss", "GptOssForCausalLM", "GptOssConfig",
         (("num_attention_heads", 4), ("num_key_value_heads", 2), ("head_dim", 64), ("sliding_window", 6),
          ("num_local_experts", 4), ("num_experts_per_tok", 2)), "eager"),
]}


def left_padded_prompts(lengths, generator: torch.Generator, device, pad_token: int = 0):
    """``input_ids`` ``[B, max(lengths)]`` of random tokens, left-padded, and the 0/1 ``attention_mask``
    (drawn on ``generator``'s device, then on ``device``)."""
    width = max(lengths)
    ids = torch.randint(1, VOCAB, (len(lengths), width), generator=generator, device=generator.device).to(device)
    starts = torch.tensor([width - n for n in lengths], device=device)
    mask = (torch.arange(width, device=device)[None, :] >= starts[:, None]).long()
    return ids.masked_fill(mask == 0, pad_token), mask


def right_padded(input_ids, attention_mask):
    """The left-padded prompts ``input_ids``/``attention_mask`` with their pads moved to the right."""
    shift = (attention_mask == 0).sum(dim=1).tolist()
    return tuple(torch.stack([row.roll(-n) for row, n in zip(t, shift)]) for t in (input_ids, attention_mask))


def make_cache(kind: str, model, max_cache_len: int):
    """A fresh ``DynamicCache`` or ``StaticCache`` built from the model's config (sliding layers
    included), or (``"full"``) a StaticCache whose every layer holds ``max_cache_len`` tokens."""
    from transformers import DynamicCache, StaticCache

    if kind == "dynamic":
        return DynamicCache(config=model.config)
    if kind == "static":
        return StaticCache(config=model.config, max_cache_len=max_cache_len)
    if kind == "full":
        from flashsplit.integrations.static_cache import full_length_static_cache

        return full_length_static_cache(model.config, max_cache_len)
    raise ValueError(f"kind: expected 'dynamic', 'static' or 'full', got {kind!r}")


def poison_dead_slots(cache, pads, prompt_len: int) -> int:
    """Write NaN into every slot of ``cache`` that holds no token a query may see after prefill:
    left pads (``pads[b]`` per row) and a static layer's empty slots. A layer of ``S`` slots holds
    the last ``min(prompt_len, S)`` prompt positions in order (sliding layers keep the window's).
    Returns the number of slots poisoned (per head)."""
    poisoned = 0
    for layer in cache.layers:
        slots = layer.keys.shape[2]
        held = min(prompt_len, slots)
        first = prompt_len - held
        for b, pad in enumerate(pads):
            dead = max(0, min(pad - first, held))
            layer.keys[b, :, :dead] = float("nan")
            layer.values[b, :, :dead] = float("nan")
            poisoned += dead
        layer.keys[:, :, held:] = float("nan")
        layer.values[:, :, held:] = float("nan")
        poisoned += (slots - held) * len(pads)
    return poisoned


def _processors(force=None, poison=None):
    from transformers import LogitsProcessor, LogitsProcessorList

    class ForceTokens(LogitsProcessor):
        """Teacher forcing through generate: step t may only pick ``tokens[:, t]``."""

        def __init__(self, tokens):
            self.tokens, self.step = tokens, 0

        def __call__(self, input_ids, scores):
            forced = torch.full_like(scores, float("-inf"))
            forced.scatter_(1, self.tokens[:, self.step: self.step + 1].to(scores.device), 0.0)
            self.step += 1
            return forced

    class AfterPrefill(LogitsProcessor):
        """Runs ``hook`` once, after the prefill forward and before the first decode step."""

        def __init__(self, hook):
            self.hook, self.done = hook, False

        def __call__(self, input_ids, scores):
            if not self.done:
                self.hook()
                self.done = True
            return scores

    processors = LogitsProcessorList()
    if poison is not None:
        processors.append(AfterPrefill(poison))
    if force is not None:
        processors.append(ForceTokens(force))
    return processors


@dataclass
class Generation:
    tokens: torch.Tensor  #: ``[B, N]`` new tokens
    logits: torch.Tensor  #: float32 ``[B, N, V]``, each step's raw logits
    poisoned: int = 0  #: dead cache slots written with NaN after prefill


def generate(model, impl: str, input_ids, attention_mask, cache_kind: str, new_tokens: int, force=None,
             poison: bool = False, compile_config=None) -> Generation:
    """Greedy ``model.generate`` with attention ``impl`` (teacher-forced to ``force`` ``[B, N]`` when
    given); ``poison``: NaN into the cache's dead slots after prefill. No compilation unless
    ``compile_config`` is given (``"default"``: transformers' own, on a CUDA device)."""
    model.set_attn_implementation(impl)
    prompt_len = input_ids.shape[1]
    cache = make_cache(cache_kind, model, prompt_len + new_tokens)
    pads = (attention_mask == 0).sum(dim=1).tolist()
    result = Generation(None, None)

    def poison_cache():
        result.poisoned = poison_dead_slots(cache, pads, prompt_len)

    out = model.generate(input_ids=input_ids, attention_mask=attention_mask, past_key_values=cache,
                         max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                         disable_compile=compile_config is None, output_logits=True, return_dict_in_generate=True,
                         logits_processor=_processors(force, poison_cache if poison else None), pad_token_id=0,
                         **({} if compile_config in (None, "default") else {"compile_config": compile_config}))
    result.tokens = out.sequences[:, prompt_len:]
    result.logits = torch.stack(out.logits, dim=1).float()
    return result


class DecodeCounter:
    """Counts the decode calls the integration sends to flashsplit (installed with monkeypatch)."""

    def __init__(self, monkeypatch):
        self.calls = []
        real = fs_transformers.decode

        def counting_decode(q, *args, **kwargs):
            self.calls.append(tuple(q.shape))
            return real(q, *args, **kwargs)

        monkeypatch.setattr(fs_transformers, "decode", counting_decode)


def check_generation(arch: Arch, dtype, device, lengths, cache_kind: str, new_tokens: int, monkeypatch,
                     generator: torch.Generator, **overrides) -> dict:
    """The checks of this module's docstring for one case; returns the measured errors."""
    name = fs_transformers.register()
    model, model32 = arch.build(dtype, device, **overrides)
    input_ids, attention_mask = left_padded_prompts(lengths, generator, device)
    reference = generate(model, arch.reference, input_ids, attention_mask, cache_kind, new_tokens)
    reference32 = generate(model32, arch.reference, input_ids, attention_mask, cache_kind, new_tokens,
                           force=reference.tokens)
    counter = DecodeCounter(monkeypatch)
    ours = generate(model, name, input_ids, attention_mask, cache_kind, new_tokens, force=reference.tokens,
                    poison=True)
    monkeypatch.undo()

    layers, heads, head_dim = model.config.num_hidden_layers, model.config.num_attention_heads, model.config.head_dim
    steps = [shape for shape in counter.calls if shape[1] == 1]
    assert steps == [(len(lengths), 1, heads, head_dim)] * (layers * (new_tokens - 1)), (
        f"every decode step of every layer runs through flashsplit: {counter.calls}")
    # A prompt of at most max_decode_queries tokens over a StaticCache's larger buffer may too.
    prompt_len = input_ids.shape[1]
    assert all(shape[1] == prompt_len <= fs_transformers.DEFAULT_MAX_DECODE_QUERIES
               for shape in counter.calls if shape[1] != 1), counter.calls
    assert torch.isfinite(ours.logits).all(), "NaN from a poisoned cache slot reached the logits"
    assert torch.isfinite(reference32.logits).all() and torch.isfinite(reference.logits).all()

    ref_err = (reference.logits - reference32.logits).abs().amax().item()
    err = (ours.logits - reference32.logits).abs().amax().item()
    atol = LOGITS_ATOL[dtype]
    assert err <= ERR_FACTOR * ref_err + atol, (
        f"{arch} {cache_kind}: logits error {err:.4g} vs float32 exceeds {ERR_FACTOR} x the reference's {ref_err:.4g} "
        f"+ {atol}")

    mismatches = check_greedy(ours.logits.argmax(dim=-1), reference.tokens, reference32.logits,
                              ERR_FACTOR * ref_err + atol, f"{arch} {cache_kind}")
    return {"err": err, "ref_err": ref_err, "near_ties": mismatches, "poisoned": ours.poisoned}


def check_greedy(picked, tokens, logits32, tolerance: float, what: str = "", free: bool = False) -> int:
    """Tokens ``picked`` ``[B, N]`` match the reference's ``tokens``, except where the pick is a near
    tie: its float32 logit within ``tolerance`` of the best (``logits32`` ``[B, N, V]``, scoring
    ``tokens``). ``free``: ``picked`` was generated freely, so each row is compared up to its
    first difference (after it the prefixes differ). Returns the number of near-tie differences."""
    best = logits32.amax(dim=-1)
    chosen = logits32.gather(-1, picked[..., None].to(logits32.device))[..., 0]
    differ = picked != tokens
    if free:  # only the first difference of a row was scored on the same prefix
        differ &= differ.int().cumsum(dim=-1).cumsum(dim=-1) == 1
    wrong = differ & (chosen < best - tolerance)
    assert not wrong.any(), (
        f"{what}: greedy tokens differ from the reference's at (row, step) {wrong.nonzero().tolist()} beyond a "
        f"near tie (float32 logit within {tolerance:.3g} of the best): {picked.tolist()} vs {tokens.tolist()}")
    return int(differ.sum())


def score_in_chunks(model, impl: str, input_ids, attention_mask, prompt_len: int, chunk: int, cache_kind: str,
                    poison: bool = False) -> torch.Tensor:
    """Teacher-forced scoring without generate: prefill ``input_ids[:, :prompt_len]``, then feed the
    rest ``chunk`` tokens per forward over the cache (``chunk`` > 1: a multi-query decode step, as
    when a speculative draft is verified). Returns float32 logits ``[B, L - prompt_len, V]``, the
    predictions of tokens ``prompt_len ..``. ``poison``: NaN into the dead slots after prefill."""
    model.set_attn_implementation(impl)
    total = input_ids.shape[1]
    cache = make_cache(cache_kind, model, total)
    positions = (attention_mask.long().cumsum(dim=-1) - 1).clamp(min=0)
    logits = []
    with torch.no_grad():
        for start, end in [(0, prompt_len)] + [(s, min(s + chunk, total)) for s in range(prompt_len, total, chunk)]:
            out = model(input_ids=input_ids[:, start:end], attention_mask=attention_mask[:, :end],
                        position_ids=positions[:, start:end], past_key_values=cache, use_cache=True)
            logits.append(out.logits[:, -1:] if start == 0 else out.logits)
            if start == 0 and poison:
                poison_dead_slots(cache, (attention_mask[:, :prompt_len] == 0).sum(dim=1).tolist(), prompt_len)
    return torch.cat(logits, dim=1)[:, :-1].float()


def check_chunked_scoring(arch: Arch, dtype, device, lengths, new_tokens: int, chunk: int, cache_kind: str,
                          monkeypatch, generator: torch.Generator) -> dict:
    """:func:`score_in_chunks` of a left-padded batch followed by ``new_tokens`` random tokens:
    flashsplit's logits within ``ERR_FACTOR`` x the reference's error (both against float32) +
    ``LOGITS_ATOL``; every forward after prefill runs through flashsplit."""
    name = fs_transformers.register()
    model, model32 = arch.build(dtype, device)
    prompt, prompt_mask = left_padded_prompts(lengths, generator, device)
    follow = torch.randint(1, VOCAB, (len(lengths), new_tokens), generator=generator, device=generator.device).to(device)
    input_ids = torch.cat([prompt, follow], dim=1)
    attention_mask = torch.cat([prompt_mask, torch.ones_like(follow)], dim=1)
    prompt_len = prompt.shape[1]
    reference32 = score_in_chunks(model32, arch.reference, input_ids, attention_mask, prompt_len, chunk, cache_kind)
    reference = score_in_chunks(model, arch.reference, input_ids, attention_mask, prompt_len, chunk, cache_kind)
    counter = DecodeCounter(monkeypatch)
    ours = score_in_chunks(model, name, input_ids, attention_mask, prompt_len, chunk, cache_kind, poison=True)
    monkeypatch.undo()
    layers = model.config.num_hidden_layers
    queries = [min(chunk, prompt_len + new_tokens - s) for s in range(prompt_len, prompt_len + new_tokens, chunk)]
    assert [shape[1] for shape in counter.calls if shape[1] != prompt_len] == [
        q for q in queries for _ in range(layers)], counter.calls
    assert torch.isfinite(ours).all(), "NaN from a poisoned cache slot reached the logits"
    ref_err = (reference - reference32).abs().amax().item()
    err = (ours - reference32).abs().amax().item()
    assert err <= ERR_FACTOR * ref_err + LOGITS_ATOL[dtype], (
        f"{arch} {cache_kind} chunk {chunk}: logits error {err:.4g} vs float32 exceeds {ERR_FACTOR} x the "
        f"reference's {ref_err:.4g} + {LOGITS_ATOL[dtype]}")
    return {"err": err, "ref_err": ref_err}


def with_fields(arch: Arch, **fields) -> Arch:
    """``arch`` with config fields added or replaced (a variant of the same architecture)."""
    merged = dict(arch.kwargs)
    merged.update(fields)
    return dataclasses.replace(arch, kwargs=tuple(merged.items()))


def generate_batch(model, impl: str, prompts, new_tokens: int, max_batch_tokens: int, monkeypatch=None,
                   block_size: int = 16, num_blocks: int = 16):
    """Greedy continuous batching (``model.generate_batch``) with attention ``impl``: one token
    list per prompt. With ``monkeypatch``, the paged cache is NaN everywhere but its zeroed
    padding block (the slots padding tokens read) until tokens are written."""
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig
    from transformers.generation.continuous_batching.cache import PagedAttentionCache

    if monkeypatch is not None:
        original = PagedAttentionCache.__init__

        def poisoned_init(cache, *args, **kwargs):
            original(cache, *args, **kwargs)
            trash = slice(cache.read_trash_index, cache.read_trash_index + cache.block_size)
            for tensor in cache.key_cache + cache.value_cache:
                tensor.fill_(float("nan"))
                tensor[trash] = 0

        monkeypatch.setattr(PagedAttentionCache, "__init__", poisoned_init)
    model.set_attn_implementation(impl)
    config = GenerationConfig(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                              eos_token_id=-1, pad_token_id=0)
    batching = ContinuousBatchingConfig(block_size=block_size, num_blocks=num_blocks, max_batch_tokens=max_batch_tokens,
                                        max_memory_percent=0.5)
    out = model.generate_batch(prompts, generation_config=config, continuous_batching_config=batching,
                               progress_bar=False)
    if monkeypatch is not None:
        monkeypatch.setattr(PagedAttentionCache, "__init__", original)
    return [out[key].generated_tokens for key in sorted(out, key=lambda k: int(k.split("_")[-1]))]


def decode_steps(model, impl: str, input_ids, attention_mask, tokens, compile_mode: str | None = None,
                 forward=None, cache_kind: str = "static") -> torch.Tensor:
    """Prefill ``input_ids`` (left-padded) into a StaticCache eagerly, then feed ``tokens``
    ``[B, N]`` one per forward, as a user's own decode loop does. ``compile_mode``: those forwards
    run through ``torch.compile(model.forward, mode=compile_mode, fullgraph=True)`` (the mask
    covers the whole cache, so every step has the same shapes). Returns float32 ``[B, N, V]``:
    the logits after each fed token. ``forward``: a compiled ``model.forward`` of the caller's to
    run the steps through instead. ``cache_kind``: ``"static"`` (transformers' StaticCache) or
    ``"full"`` (every layer full-length: ``full_length_static_cache``)."""
    model.set_attn_implementation(impl)
    batch, prompt_len = input_ids.shape
    steps = tokens.shape[1]
    cache = make_cache(cache_kind, model, prompt_len + steps)
    full_mask = torch.cat([attention_mask, torch.ones_like(tokens)], dim=1)
    first_position = attention_mask.sum(dim=1, keepdim=True)  # [B, 1]: the position after each prompt
    if forward is None:
        forward = model.forward
    if compile_mode is not None:
        forward = torch.compile(model.forward, mode=compile_mode, fullgraph=True)
    logits = []
    with torch.no_grad():
        model(input_ids=input_ids, attention_mask=attention_mask,
              position_ids=(attention_mask.cumsum(dim=-1) - 1).clamp(min=0), past_key_values=cache, use_cache=True)
        for step in range(steps):
            if compile_mode is not None:
                torch.compiler.cudagraph_mark_step_begin()  # the last step's outputs are copied out
            out = forward(input_ids=tokens[:, step: step + 1], attention_mask=full_mask,
                          position_ids=first_position + step, past_key_values=cache, use_cache=True)
            logits.append(out.logits[:, -1].float().clone())
    return torch.stack(logits, dim=1)
