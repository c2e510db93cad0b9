"""Decode-step time of a transformers model with flashsplit vs SDPA (and transformers' flash path
when a FlashAttention package is installed), eager and compiled, over a filled StaticCache.

    python scripts/bench_transformers.py                      # Llama-3-8B shape, 32 layers, bf16, H200 cells
    python scripts/bench_transformers.py --batch 1 8 --context 8k 32k --json out.json
    python scripts/bench_transformers.py --modes compiled --cells 1x32k 8x32k   # these cells, in this order
    python scripts/bench_transformers.py --tiny               # any machine: a tiny model, a smoke run

The model has random weights (from its config, no download). The cache is filled with random
keys and values up to ``context`` tokens (no prefill is timed or run); each timed step decodes
one token per row at position ``context`` with every earlier key live, then the cache's length
is set back, so every step sees the same context. "compiled" is what transformers runs for
static-cache generation: ``torch.compile`` with ``mode="reduce-overhead"`` (cudagraph trees).
Times are CUDA-event means over ``--steps`` steps after ``--warmup``; tokens/s = B / step time.
Cells whose cache would not fit in memory are reported as skipped. With ``--json`` the file is
rewritten after every cell, so a run cut short keeps the cells it finished.
"""

from __future__ import annotations

import argparse
import json
import time

import torch


def parse_count(text: str) -> int:
    text = text.lower()
    return int(float(text[:-1]) * 1024) if text.endswith("k") else int(text)


def parse_cell(text: str) -> tuple[int, int]:
    """``"8x32k"`` -> (8, 32768): batch x context."""
    batch, _, context = text.lower().partition("x")
    if not context:
        raise argparse.ArgumentTypeError(f"expected BATCHxCONTEXT (e.g. 8x32k), got {text!r}")
    return int(batch), parse_count(context)


def llama3_8b_config(layers: int):
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=layers,
                       num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=262144,
                       rope_theta=500000.0)


def tiny_config():
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=4096)


def cache_bytes(config, batch: int, context: int, dtype: torch.dtype) -> int:
    per_token = 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim
    return per_token * batch * (context + 1) * torch.empty((), dtype=dtype).element_size()


def filled_cache(model, batch: int, context: int, generator: torch.Generator):
    """A StaticCache of ``context + 1`` slots, the first ``context`` holding random keys/values."""
    from transformers import StaticCache

    config = model.config
    cache = StaticCache(config=config, max_cache_len=context + 1)
    cache.early_initialization(batch, config.num_key_value_heads, config.head_dim, model.dtype, model.device)
    for layer in cache.layers:
        for tensor in (layer.keys, layer.values):
            tensor.normal_(generator=generator)
        layer.cumulative_length.fill_(context)
    return cache


def time_steps(step, cache, context: int, warmup: int, steps: int, device) -> float:
    """Mean ms of ``step()`` (one decode forward), the cache's length reset to ``context`` before each."""
    def reset():
        for layer in cache.layers:
            layer.cumulative_length.fill_(context)

    for _ in range(warmup):
        reset()
        step()
    if device.type != "cuda":
        start = time.perf_counter()
        for _ in range(steps):
            reset()
            step()
        return (time.perf_counter() - start) * 1e3 / steps
    total = 0.0
    for _ in range(steps):
        reset()
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        step()
        end.record()
        torch.cuda.synchronize()
        total += begin.elapsed_time(end)
    return total / steps


def bench_cell(model, impl: str, compiled: bool, batch: int, context: int, args, device) -> float:
    generator = torch.Generator(device=device).manual_seed(0)
    cache = filled_cache(model, batch, context, generator)
    model.set_attn_implementation(impl)
    input_ids = torch.randint(0, model.config.vocab_size, (batch, 1), device=device, generator=generator)
    attention_mask = torch.ones(batch, context + 1, dtype=torch.long, device=device)
    position_ids = torch.full((batch, 1), context, dtype=torch.long, device=device)
    forward = model.forward
    if compiled:
        torch._dynamo.reset()
        forward = torch.compile(model.forward, mode="reduce-overhead", fullgraph=False)

    def step():
        if compiled:
            torch.compiler.cudagraph_mark_step_begin()  # a new decode step: the last one's outputs are dead
        with torch.no_grad():
            return forward(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                           past_key_values=cache, use_cache=True, logits_to_keep=1).logits

    ms = time_steps(step, cache, context, args.warmup, args.steps, device)
    if compiled:
        torch._dynamo.reset()  # frees the graphs' memory pools (cudagraph trees) before the next cell
    return ms


def flash_implementation() -> str | None:
    """transformers' flash attention name for an installed FlashAttention package, if any."""
    from transformers.utils import is_flash_attn_2_available, is_flash_attn_3_available

    if is_flash_attn_3_available():
        return "flash_attention_3"
    if is_flash_attn_2_available():
        return "flash_attention_2"
    return None


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--context", type=parse_count, nargs="+", default=[8192, 32768, 131072])
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--modes", nargs="+", default=["eager", "compiled"], choices=["eager", "compiled"])
    parser.add_argument("--cells", type=parse_cell, nargs="+",
                        help="BATCHxCONTEXT cells in this order (e.g. 1x32k 8x32k), instead of --batch x --context")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--tiny", action="store_true", help="a tiny model and small cells: a smoke run anywhere")
    args = parser.parse_args(argv)

    import flashsplit.integrations.transformers as fs_transformers
    from transformers import LlamaForCausalLM

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float16  # the CPU interpreter's bf16 is wrong
    if args.tiny:
        config, args.batch, args.context, args.cells = tiny_config(), [1, 2], [256], None
        args.steps, args.warmup = min(args.steps, 3), 1
    else:
        config = llama3_8b_config(args.layers)
    cells = args.cells or [(batch, context) for batch in args.batch for context in args.context]
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(config).to(dtype).eval()
    implementations = [fs_transformers.register(), "sdpa"] + [name for name in [flash_implementation()] if name]
    free = torch.cuda.mem_get_info()[0] if device.type == "cuda" else None
    results = []
    print(f"{'B':>3} {'context':>8} {'mode':>9} " + " ".join(f"{impl:>18}" for impl in implementations), flush=True)
    for batch, context in cells:
        need = cache_bytes(config, batch, context, dtype)
        for mode in args.modes:
            row = {"batch": batch, "context": context, "mode": mode, "ms": {}}
            if free is not None and need > 0.8 * free:
                row["skipped"] = f"cache {need / 2**30:.1f} GiB > 80% of {free / 2**30:.1f} GiB free"
                print(f"{batch:>3} {context:>8} {mode:>9}  skipped: {row['skipped']}", flush=True)
            else:
                for impl in implementations:
                    row["ms"][impl] = bench_cell(model, impl, mode == "compiled", batch, context, args, device)
                    if device.type == "cuda":
                        torch.cuda.empty_cache()
                print(f"{batch:>3} {context:>8} {mode:>9} " + " ".join(
                    f"{row['ms'][i]:>9.3f} ms {batch / row['ms'][i] * 1e3:>6.0f}/s" for i in implementations), flush=True)
            results.append(row)
            if args.json:
                write_json(args.json, results, config, device, dtype, args)


def write_json(path: str, results: list, config, device, dtype, args) -> None:
    with open(path, "w") as f:
        json.dump({"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                   "torch": torch.__version__, "transformers": _transformers_version(), "dtype": str(dtype),
                   "layers": config.num_hidden_layers, "steps": args.steps, "warmup": args.warmup,
                   "results": results}, f, indent=1)


def _transformers_version() -> str:
    import transformers

    return transformers.__version__

if __name__ == "__main__":
    main()
