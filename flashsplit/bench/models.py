"""``flashsplit models``: end-to-end generation of transformers models through flashsplit against
transformers' own attentions (SDPA; eager and FlexAttention for softcap and sink layers).

For every model x batch x context x mode cell, each attention implementation runs the same
random-weight model (real widths, ``--layers`` layers, bf16) on the same left-padded prompts:

1. **prefill**: one forward over the prompts into a StaticCache whose sliding-window layers hold
   the whole context too (:mod:`~flashsplit.integrations.static_cache`: no recompile per token),
   timed on its second run (the first compiles what runs once per shape), and peak memory;
2. **decode**: ``--warmup`` then ``--steps`` greedy steps of one token per row, queued back to back
   with no host sync between them (the next token is picked on the device, as a serving loop
   does); ms per token is the wall time of the ``--steps`` steps over their count. ``eager`` runs
   ``model.forward``, ``compiled`` runs ``torch.compile(model.forward, mode="reduce-overhead",
   fullgraph=True)`` (cudagraph trees, what transformers compiles for static-cache generation);
   ``generate`` runs transformers' ``generate`` (which compiles its decode step on a GPU): ms per
   token is the time of ``--warmup + --steps`` new tokens less that of one, over the difference.

The first reference that runs (SDPA; the model's eager attention, else transformers' FlexAttention,
for softcap and sink layers) generates freely; the other implementations are fed its tokens and
their own greedy picks compared at every step: equal, a tie (the leading reference's logits of the
two tokens are within one bf16 step of each other) or different (``generate``: every implementation
generates freely, compared up to its first difference). A cell whose cache does not fit is
skipped with the reason; an implementation that runs out of memory is reported as such (eager
attention at long prompts).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass, field

import torch

from .model_configs import MODELS, ModelShape

_EPILOG = """\
examples:
  flashsplit models --models llama3-8b --batch 1 --context 32k --modes compiled
  flashsplit models --models qwen2.5-7b --cells 1x32k 8x4k --json qwen.json
  flashsplit models --models gpt-oss-20b --batch 1 --context 4k 32k 128k --modes eager --json oss.json
  flashsplit models --tiny                 # any machine: tiny widths, a smoke run of every model
"""


@dataclass
class ImplResult:
    """One implementation in one cell."""

    impl: str
    prefill_s: float | None = None
    ms_per_token: float | None = None
    tokens_per_s: float | None = None
    peak_gib: float | None = None  #: peak memory above the model's weights, prefill and decode
    error: str | None = None  #: "out of memory", or the exception
    same: int = 0  #: greedy picks equal to the leading reference's (the implementations after it)
    ties: int = 0
    different: int = 0
    reference: bool = True  #: one of transformers' implementations (False: flashsplit)


@dataclass
class Cell:
    model: str
    batch: int
    context: int
    mode: str
    skipped: str | None = None
    results: list = field(default_factory=list)


def parse_count(text: str) -> int:
    """``"32k"`` -> 32768."""
    text = text.lower()
    try:
        return int(float(text[:-1]) * 1024) if text.endswith("k") else int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a token count such as 4096 or 32k, got {text!r}") from None


def parse_cell(text: str) -> tuple[int, int]:
    """``"8x32k"`` -> (8, 32768): batch x context."""
    batch, _, context = text.lower().partition("x")
    if not context or not batch.isdigit():
        raise argparse.ArgumentTypeError(f"expected BATCHxCONTEXT (e.g. 8x32k), got {text!r}")
    return int(batch), parse_count(context)


def add_models_parser(subparsers) -> argparse.ArgumentParser:
    """Add the ``models`` sub-command to an argparse ``subparsers`` object; sets ``func``."""
    parser = subparsers.add_parser(
        "models", help="generate with random-weight transformers models at real widths through flashsplit and "
                       "their reference attention: prefill, ms per token, peak memory, tokens compared",
        description=__doc__.split("\n\n")[0] + " Needs transformers; times on a CUDA GPU.",
        epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--context", type=parse_count, nargs="+", default=[4096, 32768, 131072],
                        help="prompt tokens of the longest row (default 4k 32k 128k)")
    parser.add_argument("--cells", type=parse_cell, nargs="+",
                        help="BATCHxCONTEXT cells in this order (e.g. 1x32k 8x4k), instead of --batch x --context")
    parser.add_argument("--modes", nargs="+", choices=["eager", "compiled", "generate"], default=["eager", "compiled"],
                        help="eager: model.forward steps; compiled: torch.compile(model.forward, "
                             "mode='reduce-overhead', fullgraph=True) steps; generate: transformers' generate, "
                             "which compiles its decode step on a GPU")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--steps", type=int, default=16, help="timed decode steps (default 16)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed decode steps first (default 3)")
    parser.add_argument("--json", help="write the results here (rewritten after every cell)")
    parser.add_argument("--tiny", action="store_true", help="tiny widths and contexts: a smoke run on any machine")
    parser.set_defaults(func=run_models_command, parser=parser)
    return parser


def run_models_command(args: argparse.Namespace) -> int:
    try:
        import transformers  # noqa: F401
    except ImportError:
        args.parser.error("needs transformers: pip install 'flashsplit[transformers]'")
    import flashsplit.integrations.transformers as fs_transformers

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type != "cuda" and not args.tiny:
        args.parser.error("timing needs a CUDA GPU; --tiny runs a smoke run on the CPU")
    if args.tiny:
        args.batch, args.context, args.cells, args.steps, args.warmup = [1, 2], [48], None, min(args.steps, 2), 1
        if device.type != "cuda":  # cudagraph trees need CUDA (generate compiles on a GPU only)
            args.modes = [mode for mode in args.modes if mode != "compiled"] or ["eager"]
    name = fs_transformers.register()
    pairs = args.cells or [(batch, context) for batch in args.batch for context in args.context]
    args.context = [context for _, context in pairs]
    cells = [Cell(model, batch, context, mode) for model in args.models for batch, context in pairs
             for mode in args.modes]
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  transient=True) as progress:
        task = progress.add_task("models", total=len(cells))
        model_cache: dict = {}
        for cell in cells:
            progress.update(task, description=f"{cell.model} B={cell.batch} x {cell.context} {cell.mode}")
            run_cell(cell, name, args, device, model_cache)
            progress.advance(task)
            if args.json:
                write_json(args.json, cells, args, device)
    print(markdown_table([c for c in cells if c.results or c.skipped]))
    return 0


def run_cell(cell: Cell, name: str, args, device, model_cache: dict) -> None:
    shape = MODELS[cell.model]
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float16  # the CPU interpreter's bf16 is wrong
    if cell.model not in model_cache:
        model_cache.clear()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        model_cache[cell.model] = build_model(shape, args, device, dtype)
    model = model_cache[cell.model]
    total = -(-(cell.context + args.warmup + args.steps) // 64) * 64
    need = shape.kv_bytes_per_token(model.config, dtype.itemsize) * cell.batch * total
    if device.type == "cuda":
        free = torch.cuda.mem_get_info()[0]
        if need > 0.85 * free:
            cell.skipped = f"the cache ({need / 2**30:.0f} GiB) does not fit ({free / 2**30:.0f} GiB free)"
            return
    generator = torch.Generator(device=device).manual_seed(cell.batch * 7919 + cell.context)
    prompts = left_padded(cell.batch, cell.context, model.config.vocab_size, generator, device)
    # The first reference that runs generates freely; every later implementation is fed its
    # tokens and its picks are compared (a second reference's counts say how far two correct
    # attentions differ here).
    leader = None
    free = cell.mode == "generate"
    for impl in (*shape.references, name):
        if impl == "flex_attention" and device.type != "cuda":
            # transformers compiles FlexAttention's mask for every call, which takes tens of seconds
            # on a CPU (and refuses sinks there): a smoke run leaves it out.
            cell.results.append(ImplResult(impl, error="not run: FlexAttention is timed on CUDA only"))
            continue
        run = run_impl(model, impl, prompts, None if leader is None or free else leader.tokens, cell.mode, args)
        run.result.reference = impl != name
        if leader is not None and run.result.error is None:
            compare = compare_free if free else compare_picks
            compare(run.result, run.picks, leader.tokens, leader.logits)
        elif leader is None and run.result.error is None and run.result.reference:
            leader = run
        cell.results.append(run.result)


def build_model(shape: ModelShape, args, device, dtype):
    import transformers

    config = shape.config(args.layers, max(args.context) + args.warmup + args.steps + 64, tiny=args.tiny)
    torch.manual_seed(0)
    with torch.device(device):
        return getattr(transformers, shape.model_class)(config).to(dtype).eval()


def left_padded(batch: int, context: int, vocab: int, generator, device):
    """``input_ids`` ``[B, context]`` and the 0/1 mask: row b has ``context - b * step`` tokens
    (``step`` up to a sixteenth of the context over the batch), left-padded."""
    ids = torch.randint(1, vocab, (batch, context), generator=generator, device=device)
    step = max(context // (16 * max(batch - 1, 1)), 1) if batch > 1 else 0
    starts = torch.arange(batch, device=device) * step
    mask = (torch.arange(context, device=device)[None, :] >= starts[:, None]).long()
    return ids.masked_fill(mask == 0, 0), mask


@dataclass
class ImplRun:
    result: ImplResult
    tokens: torch.Tensor | None = None  #: ``[B, N]`` the tokens fed after the prompt
    picks: torch.Tensor | None = None  #: ``[B, N]`` the implementation's greedy picks
    logits: torch.Tensor | None = None  #: float32 ``[B, N, V]``


def run_impl(model, impl: str, prompts, forced, mode: str, args) -> ImplRun:
    """Prefill ``prompts`` and decode ``--warmup + --steps`` tokens with attention ``impl``,
    feeding ``forced`` ``[B, N]`` (or its own greedy picks)."""
    from ..integrations.static_cache import full_length_static_cache

    result = ImplResult(impl)
    input_ids, attention_mask = prompts
    batch, context = input_ids.shape
    steps = args.warmup + args.steps
    model.set_attn_implementation(impl)
    cuda = input_ids.is_cuda
    cache = forward = None
    try:
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated() if cuda else 0
        # Rows of 64-slot multiples: SDPA's masked kernels need aligned mask rows (else its math
        # fallback builds [B, H, L, L] fp32 scores); the slots past the last token stay masked.
        cache = full_length_static_cache(model.config, -(-(context + steps) // 64) * 64)
        full_mask = torch.cat([attention_mask, attention_mask.new_ones(batch, steps)], dim=1)
        # Twice, the second timed: the first compiles what runs once per shape (FlexAttention's
        # kernels, library heuristics).
        for _ in range(2):
            cache.reset()
            start = _now(cuda)
            with torch.no_grad():
                out = model(input_ids=input_ids, attention_mask=attention_mask,
                            position_ids=(attention_mask.cumsum(-1) - 1).clamp(min=0), past_key_values=cache,
                            use_cache=True, logits_to_keep=1)
            result.prefill_s = _now(cuda) - start
        if mode == "generate":
            return _run_generate(model, cache, prompts, steps, result, base)
        forward = model.forward
        if mode == "compiled":
            torch._dynamo.reset()
            forward = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)
        token = out.logits[:, -1].argmax(-1, keepdim=True)
        position = attention_mask.sum(-1, keepdim=True)
        fed, picks, logits = [], [], []
        for step in range(steps):
            if step == args.warmup:
                start = _now(cuda)
            # No host sync inside the loop: the next token is picked on the device, so the host
            # queues step after step as a serving loop does.
            token = forced[:, step:step + 1] if forced is not None else token
            fed.append(token)
            with torch.no_grad():
                if mode == "compiled":
                    torch.compiler.cudagraph_mark_step_begin()
                step_logits = forward(input_ids=token, attention_mask=full_mask, position_ids=position + step,
                                      past_key_values=cache, use_cache=True, logits_to_keep=1).logits[:, -1]
                step_logits = step_logits.float().clone()  # a graph's next replay reuses its output
            logits.append(step_logits)
            token = step_logits.argmax(-1, keepdim=True)
            picks.append(token)
        result.ms_per_token = (_now(cuda) - start) / args.steps * 1e3
        result.tokens_per_s = batch / result.ms_per_token * 1e3
        if cuda:
            result.peak_gib = (torch.cuda.max_memory_allocated() - base) / 2**30
        return ImplRun(result, torch.cat(fed, 1), torch.cat(picks, 1), torch.stack(logits, 1))
    except torch.cuda.OutOfMemoryError:
        result.error = "out of memory"
    except Exception as error:  # noqa: BLE001  (a cell's failure is reported, the grid goes on)
        result.error = f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
    finally:
        del cache, forward
        if mode != "eager":
            torch._dynamo.reset()  # frees the graphs' memory pools before the next run
        if cuda:
            torch.cuda.empty_cache()
    return ImplRun(result)


def _run_generate(model, cache, prompts, steps: int, result: ImplResult, base: int) -> ImplRun:
    """transformers' ``generate`` (greedy, compiled as transformers compiles a StaticCache's decode
    step on a GPU): once to compile, then timed twice with ``steps`` new tokens and twice with
    one; ms per token is the difference of the faster of each over ``steps - 1``."""
    input_ids, attention_mask = prompts
    cuda = input_ids.is_cuda

    def generate(new_tokens: int):
        cache.reset()
        with torch.no_grad():
            return model.generate(input_ids=input_ids, attention_mask=attention_mask, past_key_values=cache,
                                  max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                                  output_logits=True, return_dict_in_generate=True, pad_token_id=0)

    generate(steps)  # compiles the decode step (a GPU) and warms up
    times = {}
    for new_tokens in (steps, 1, steps, 1):  # the faster of two of each
        start = _now(cuda)
        generated = generate(new_tokens)
        elapsed = _now(cuda) - start
        if elapsed < times.get(new_tokens, (float("inf"),))[0]:
            times[new_tokens] = (elapsed, generated)
    out = times[steps][1]
    result.ms_per_token = (times[steps][0] - times[1][0]) / max(steps - 1, 1) * 1e3
    result.tokens_per_s = input_ids.shape[0] / result.ms_per_token * 1e3
    if cuda:
        result.peak_gib = (torch.cuda.max_memory_allocated() - base) / 2**30
    tokens = out.sequences[:, input_ids.shape[1]:]
    return ImplRun(result, tokens, tokens, torch.stack(out.logits, 1).float())


def compare_free(result: ImplResult, tokens, leader_tokens, leader_logits) -> None:
    """Free generations compared row by row up to their first difference: the tokens before it
    count as same, the differing pick as a tie (the leader's logits of both tokens within one
    bf16 step) or different; what follows a difference is not compared."""
    for row in range(tokens.shape[0]):
        differ = (tokens[row] != leader_tokens[row]).nonzero()
        if differ.numel() == 0:
            result.same += tokens.shape[1]
            continue
        step = int(differ[0])
        result.same += step
        a, b = leader_logits[row, step, tokens[row, step]], leader_logits[row, step, leader_tokens[row, step]]
        if _within_a_bf16_step(a, b):
            result.ties += 1
        else:
            result.different += 1


def _within_a_bf16_step(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Whether two logits are a tie: within one bf16 step (2^-7 relative) of each other."""
    return (a - b).abs() <= 2.0 ** -7 * torch.maximum(a.abs(), b.abs())


def _now(cuda: bool) -> float:
    if cuda:
        torch.cuda.synchronize()
    return time.perf_counter()


def compare_picks(result: ImplResult, picks, tokens, logits) -> None:
    """Count ``picks`` equal to the reference's next ``tokens`` (the next fed token; the last
    step's pick has no reference token after it), ties (the reference's logits of both tokens
    within one bf16 step, 2^-7 relative) and others."""
    ours, theirs = picks[:, :-1], tokens[:, 1:]
    ref = logits[:, :-1]
    a = ref.gather(-1, ours[..., None])[..., 0]
    b = ref.gather(-1, theirs[..., None])[..., 0]
    equal = ours == theirs
    tie = ~equal & _within_a_bf16_step(a, b)
    result.same, result.ties = int(equal.sum()), int(tie.sum())
    result.different = int(equal.numel()) - result.same - result.ties


def markdown_table(cells) -> str:
    """The results as a markdown table: one row per cell and implementation."""
    lines = ["| model | B x context | mode | attention | prefill s | peak GiB | ms / token | tokens/s | vs reference "
             "| tokens same / tie / diff |", "|---|---|---|---|---|---|---|---|---|---|"]
    for cell in cells:
        where = f"{cell.batch} x {_count(cell.context)}"
        if cell.skipped:
            lines.append(f"| {cell.model} | {where} | {cell.mode} | | skipped: {cell.skipped} | | | | | |")
            continue
        references = [r for r in cell.results if r.reference and r.error is None]
        for result in cell.results:
            if result.error:
                lines.append(f"| {cell.model} | {where} | {cell.mode} | {result.impl} | {result.error} | | | | | |")
                continue
            speedup = "" if result.reference else ", ".join(
                f"{r.ms_per_token / result.ms_per_token:.2f}x {r.impl}" for r in references)
            compared = f"{result.same} / {result.ties} / {result.different}" if (
                result.same + result.ties + result.different) else ""
            lines.append(f"| {cell.model} | {where} | {cell.mode} | {result.impl} | {result.prefill_s:.3f} | "
                         f"{_fmt(result.peak_gib, '.1f')} | {result.ms_per_token:.2f} | {result.tokens_per_s:.0f} | "
                         f"{speedup} | {compared} |")
    return "\n".join(lines)


def _fmt(value, spec: str) -> str:
    return "" if value is None else format(value, spec)


def _count(tokens: int) -> str:
    return f"{tokens // 1024}k" if tokens % 1024 == 0 else str(tokens)


def write_json(path: str, cells, args, device) -> None:
    import transformers

    with open(path, "w") as f:
        json.dump({"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                   "torch": torch.__version__, "transformers": transformers.__version__, "layers": args.layers,
                   "steps": args.steps, "warmup": args.warmup, "cells": [asdict(c) for c in cells]}, f, indent=1)
