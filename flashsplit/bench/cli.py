"""The ``bench`` sub-command: parse options, run (or dry-run) the grid, render and write results.

Wiring: ``add_bench_parser(subparsers)`` adds ``bench`` to a top-level argparse parser and sets
``func=run_bench_command``; standalone, ``python -m flashsplit.bench.cli [options]``.

Exit codes: 0 on success; 1 when a contender failed the reference check ("wrong") or an output
file could not be written; 2 when nothing could run as asked: unusable options (argparse's own
errors), no CUDA GPU (a message points to ``--dry-run`` and ``--from-json``, which need none), or
``--plot`` without matplotlib.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .cases import (DEFAULT_BATCHES, DEFAULT_MEM_CAP_GB, DEFAULT_PRESET, DEFAULT_SEQLENS, KV_DTYPES, L2_FACTOR,
                    PLAIN, PRESETS, SINK_MEAN, Shape, Variant, build_grid, format_list, variant_list)
from .contenders import contender_names
from .options import (MAX_SEQLEN_Q, SAME_KV, flatten, format_seqlen, parse_append_list, parse_head_dim, parse_heads,
                      parse_int_list, parse_kv_dtype_list, parse_page_size_list, parse_positive_int, parse_seqlen,
                      parse_seqlen_list, parse_seqlen_q_list, parse_softcap_list, parse_splits, parse_switch,
                      parse_window_list, switch_values)

NO_GPU_MESSAGE = ("flashsplit bench: error: timing needs a CUDA GPU and none was found; without one, --dry-run "
                  "lists the cells, contenders and planned splits, and --from-json FILE renders saved --json reports")

_EPILOG = """\
examples:
  flashsplit bench                                  # llama-3-8b shapes, B {1,4,16,64} x L_k {1k..128k}
  flashsplit bench --preset group5 --batch 1 --seqlen 4k 16k 128k --json out.json --plot out.png
  flashsplit bench --heads 32/8 --head-dim 128 --contenders triton,sdpa-cudnn --no-flex
  flashsplit bench --sweep-splits 1-64 --batch 1 16 --seqlen 16k 128k
  flashsplit bench --page-size 16 --kv-dtype fp8e4m3  # paged fp8 caches (peers without them: skipped)
  flashsplit bench --compare-formats --page-size 1 16 --batch 1 16 --seqlen 16k 128k
                                                    # paged vs dense time per flashsplit contender
  flashsplit bench --compare-formats --kv-dtype fp8e4m3 --batch 1 16 --seqlen 16k 128k
                                                    # fp8 vs bf16 speedup
  flashsplit bench --preset gpt-oss-20b --window 128 --sinks --compare-variants --seqlen 129 4k 128k
                                                    # gpt-oss's windowed layers vs plain decode (and a
                                                    # plain 129-key cache: the keys the window sees)
  flashsplit bench --softcap 0 50 --batch-invariant off on --contenders triton,flash-attn3
                                                    # softcap and batch-invariant variants, FA3 alongside
  flashsplit bench --append 1 --rotary off on --compare-variants --batch 1 16 --seqlen 16k 128k
                                                    # appending a token (and rotary) vs plain decode
  flashsplit bench --seqlen-q 1 4 --batch 1 16 --seqlen 4k 16k
                                                    # speculative decoding: 4 causal queries per row
  flashsplit bench --batch 1 --seqlen 4k 16k 128k --contenders auto,triton,cute --read-floor
                                                    # B = 1 against a kernel that only reads the cache
  flashsplit bench --dry-run                        # no GPU needed: cells, contenders, planned splits
  flashsplit bench --from-json a.json b.json --plot ab.png   # re-render saved runs, merged (no GPU needed)
"""

FORMATS_NOTE = ("cache formats: paged caches hold every row's pages in one shuffled physical order (one int32 "
                "block table, shared by the rotation sets); fp8 caches are quantized from normal 16-bit values "
                "with fp32 scales per (row, KV head); GB/s counts the cache's own bytes (1 per fp8 element) plus "
                "block table and scales")

VARIANTS_NOTE = (f"attention variants: a window of w keys is window_size=(w, 0) (the causal sliding window; at "
                 f"L_q = 1 the same keys as (w, -1)), and GB/s counts the keys it sees, min(L_k, w + L_q) per row, "
                 f"with rotation sets sized by those keys; sinks are fp32 N({SINK_MEAN:g}, 1), one per q head; an "
                 f"append of n keys starts from rows of L_k - n keys (the call attends to L_k, as plain decode does) "
                 f"and rotary rotates all of head_dim (GPT-NeoX halves); the reference check computes the variant")

QUERIES_NOTE = ("several queries per row (--seqlen-q N > 1): causal, bottom-right aligned (FlashAttention's "
                "causal=True: query i of N sits at key L_k - N + i and sees the keys up to it; with rotary, query i "
                "is rotated at the row's length before the call + i); GB/s counts q and the output N times; torch "
                "SDPA gets a bottom-right mask (flash: causal_lower_right, flash's causal kernel; cuDNN: an additive "
                "[N, L_k] mask), FlexAttention a bottom-right block mask; FlashInfer's decode wrapper is skipped; "
                "the reference check is causal, and an output closer to attention without the mask fails it")


def _parse_contenders(text: str) -> list[str]:
    names = [n for n in text.replace(" ", ",").split(",") if n]
    known = contender_names()
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown contender(s) {unknown or [text]}; choose from {', '.join(known)}")
    return names


def _parse_mem_cap(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of GB, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of GB, got {text!r}")
    return value


def configure_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add every ``bench`` option to ``parser``."""
    shape = parser.add_argument_group("shape (a preset, optionally overridden)")
    shape.add_argument("--preset", choices=sorted(PRESETS), default=DEFAULT_PRESET,
                       help="model shape: " + "; ".join(f"{k}: {v.heads} heads d={v.head_dim} ({v.model})"
                                                         for k, v in PRESETS.items()) + f" (default {DEFAULT_PRESET})")
    shape.add_argument("--heads", type=parse_heads, metavar="Q/KV", help="q and KV heads, e.g. 32/8 (overrides the preset)")
    shape.add_argument("--head-dim", type=parse_head_dim, metavar="D", help="head dim (overrides the preset)")
    shape.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16",
                       help="q / output dtype, and the KV dtype unless --kv-dtype says otherwise (default bf16)")

    fmt = parser.add_argument_group("cache format (only contenders that take the format run it; others are skipped)")
    fmt.add_argument("--page-size", type=parse_page_size_list, nargs="+", metavar="N",
                     help="keys per page of a paged KV cache (pages shuffled, with a block table); 0 = dense "
                          "(default 0); several values run each")
    fmt.add_argument("--kv-dtype", type=parse_kv_dtype_list, nargs="+", metavar="KV",
                     help=f"KV cache dtype: {', '.join(KV_DTYPES)} (same: --dtype; fp8: per-(row, KV head) fp32 "
                          "descales); several values run each (default same)")
    fmt.add_argument("--compare-formats", action="store_true",
                     help="also run each cell as a dense --dtype cache (and each fp8 format's 16-bit twin) and report "
                          "paged/dense time and 16-bit/fp8 speedup per flashsplit contender, against the targets "
                          "(16-key pages <= 1.10x dense time, 1-key pages <= 1.25x, fp8 >= 1.7x faster at 128k keys; "
                          "default contenders: the flashsplit ones)")

    var = parser.add_argument_group("attention variants (flashsplit runs them; peers without them are skipped)")
    var.add_argument("--window", type=parse_window_list, nargs="+", metavar="LEFT",
                     help="sliding windows: keys left of the query, -1 or none = no window; passed as "
                          "window_size=(LEFT, 0), the causal sliding window (at L_q = 1 the same keys as (LEFT, -1)); "
                          "several values run each (default none)")
    var.add_argument("--softcap", type=parse_softcap_list, nargs="+", metavar="X",
                     help="softcap of the scores (Gemma 2 uses 50), 0 = off; several values run each (default 0)")
    var.add_argument("--sinks", type=parse_switch, nargs="*", metavar="on|off",
                     help=f"attention sinks (gpt-oss): one random fp32 logit per q head, N({SINK_MEAN:g}, 1); "
                          "bare: on; 'off on' runs both")
    var.add_argument("--batch-invariant", type=parse_switch, nargs="*", metavar="on|off",
                     help="decode with batch_invariant=True (fixed-length splits; FlashAttention: num_splits=1); "
                          "bare: on; 'off on' runs both")
    var.add_argument("--append", type=parse_append_list, nargs="+", metavar="N",
                     help="new keys per row each call writes into the cache first (k=, v=; rows hold L_k - N keys "
                          "before the call), 0 = none; several values run each (default 0)")
    var.add_argument("--rotary", type=parse_switch, nargs="*", metavar="on|off",
                     help="rotary embedding of the appended keys and q (rotary_cos/rotary_sin, rotary_dim = head_dim); "
                          "only with --append; bare: on; 'off on' runs both")
    var.add_argument("--compare-variants", action="store_true",
                     help="also run each cell as plain decode and report each variant's time / plain time per "
                          "contender (for a window of w, also / a plain (w + L_q)-key cache where --seqlen lists "
                          "w + L_q, w + 1 at one query per row; default contenders: the flashsplit ones)")

    grid = parser.add_argument_group("grid")
    grid.add_argument("--batch", type=parse_int_list, nargs="+", metavar="B",
                      help=f"batch sizes, space or comma separated (default {' '.join(map(str, DEFAULT_BATCHES))})")
    grid.add_argument("--seqlen", type=parse_seqlen_list, nargs="+", metavar="L",
                      help="KV lengths, with k/m suffixes (default "
                           + " ".join(format_seqlen(n) for n in DEFAULT_SEQLENS) + ")")
    grid.add_argument("--seqlen-q", type=parse_seqlen_q_list, nargs="+", metavar="N",
                      help=f"queries per row, 1..{MAX_SEQLEN_Q} (default 1); N > 1 is speculative decoding: causal, "
                           "bottom-right aligned (FlashAttention's causal=True: query i of N sits at key L_k - N + i "
                           "and sees the keys up to it); several values run each")
    grid.add_argument("--mem-cap-gb", type=_parse_mem_cap, default=DEFAULT_MEM_CAP_GB, metavar="GB",
                      help=f"skip cells whose KV x rotation sets exceed this (default {DEFAULT_MEM_CAP_GB:g})")

    who = parser.add_argument_group("contenders")
    who.add_argument("--contenders", type=_parse_contenders, metavar="LIST",
                     help="comma-separated subset of: " + ", ".join(contender_names()) + " (default: all available)")
    who.add_argument("--no-flex", action="store_true", help="skip compiled FlexAttention (slow to compile)")
    who.add_argument("--read-floor", action="store_true",
                     help="also time the read floor of each cell: one kernel that only streams the cell's K and V "
                          "bytes (no attention math), timed as the contenders are; the scorecard then measures auto "
                          "against it (windowed cells: skipped)")

    timing = parser.add_argument_group("timing")
    timing.add_argument("--replays", type=parse_positive_int, default=50, metavar="N",
                        help="timed graph replays, median taken (default 50)")
    timing.add_argument("--calls-per-graph", type=parse_positive_int, default=20, metavar="N",
                        help="calls captured per graph (at least the rotation count; default 20)")
    timing.add_argument("--warmup", type=parse_positive_int, default=5, metavar="N", help="warm-up replays (default 5)")
    timing.add_argument("--eager-calls", type=parse_positive_int, default=50, metavar="N",
                        help="calls per eager wall-clock sample (default 50)")
    timing.add_argument("--no-ceiling", action="store_true", help="skip the bandwidth-ceiling probe")
    timing.add_argument("--seed", type=int, default=0, metavar="N", help="input RNG seed (default 0)")

    mode = parser.add_argument_group("modes")
    mode.add_argument("--sweep-splits", type=parse_splits, nargs="?", const="1-64", metavar="LIST",
                      help="time flashsplit at each num_splits (default 1-64; or e.g. 1,2,4,8,30) and compare the "
                           "heuristic's choice with the fastest")
    mode.add_argument("--mla", nargs="*", metavar="TILES",
                      help="MLA decode cells instead (DeepSeek-V3: H_q 16 and 128 (--heads Q/1 picks one), "
                           "B 1 8 32 128, L_k 1k-64k, pages of 64; flashsplit.bench.mla); TILES: Triton tile "
                           "variants timed beside the default, e.g. m64 n64 s3 m64-s3 (bare: m64)")
    mode.add_argument("--dry-run", action="store_true",
                      help="list cells, contenders and planned num_splits without running anything (works without a GPU)")
    mode.add_argument("--from-json", nargs="+", metavar="FILE",
                      help="render saved --json reports instead of running (no GPU needed): their tables, and "
                           "--json/--csv/--plot of them; several files merge (the first file's header)")

    out = parser.add_argument_group("output")
    out.add_argument("--json", metavar="FILE", help="write the report (header, rows, sweep) as JSON; without "
                                                    "--sweep-splits it is rewritten after every row, so a run "
                                                    "stopped midway leaves the rows it finished")
    out.add_argument("--csv", metavar="FILE", help="write the rows as CSV (with --sweep-splits also FILE.sweep.csv, "
                                                   "with --compare-formats also FILE.formats.csv, with "
                                                   "--compare-variants also FILE.variants.csv)")
    out.add_argument("--plot", metavar="FILE.png", help="latency plots (needs matplotlib: pip install 'flashsplit[plot]')")
    out.add_argument("--plot-seqlen", type=parse_seqlen, metavar="L", help="L_k of the latency-vs-batch panel")
    return parser


def add_bench_parser(subparsers) -> argparse.ArgumentParser:
    """Add the ``bench`` sub-command to an argparse ``subparsers`` object; sets ``func``."""
    parser = subparsers.add_parser(
        "bench", help="benchmark flashsplit against torch SDPA, FlexAttention, FlashInfer and FlashAttention "
                      "on a GPU (or list the grid without one)",
        description="Benchmark flashsplit decode attention against torch SDPA (flash, cuDNN), FlexAttention, "
                    "FlashInfer and FlashAttention: device us per call (CUDA-graph replay), eager us, host us per "
                    "eager call, GB/s, over cache formats (paged, fp8), attention variants (sliding window, "
                    "softcap, sinks, batch-invariant, appends, rotary) and queries per row (speculative decoding); "
                    "with auto in the run, a scorecard per cell; with --read-floor, the time of a kernel that only "
                    "reads the cell's cache. Timing needs a CUDA GPU; --dry-run and --from-json do not. Method and "
                    "current figures: docs/benchmarks.md.",
        epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    configure_parser(parser)
    parser.set_defaults(func=run_bench_command)
    return parser


def build_parser(prog: str = "flashsplit bench") -> argparse.ArgumentParser:
    """A standalone parser with the same options (``python -m flashsplit.bench.cli``)."""
    parser = argparse.ArgumentParser(prog=prog, description="Benchmark flashsplit decode attention against its peers.",
                                     epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    configure_parser(parser)
    parser.set_defaults(func=run_bench_command)
    return parser


# -- running ---------------------------------------------------------------------------------

def resolve_shape(args: argparse.Namespace) -> Shape:
    """The preset's shape with ``--heads`` / ``--head-dim`` applied."""
    base = PRESETS[args.preset]
    num_heads, num_heads_kv = args.heads if args.heads else (base.num_heads, base.num_heads_kv)
    head_dim = args.head_dim or base.head_dim
    custom = args.heads is not None or args.head_dim is not None
    return Shape(num_heads, num_heads_kv, head_dim, "custom" if custom else base.model)


def resolve_formats(args: argparse.Namespace) -> list[tuple[int, str]]:
    """The (page_size, kv_dtype) formats to run: every --page-size x --kv-dtype pair, with
    ``--compare-formats`` preceded by the baselines they are compared with."""
    page_sizes = flatten(args.page_size) if args.page_size else [0]
    kv_dtypes = flatten(args.kv_dtype) if args.kv_dtype else [SAME_KV]
    return format_list(page_sizes, kv_dtypes, baseline=args.compare_formats)


def resolve_variants(args: argparse.Namespace) -> list[Variant]:
    """The attention variants to run: every --window x --softcap x --sinks x --batch-invariant x
    --append x --rotary combination (rotary only with an append), with ``--compare-variants``
    preceded by the plain decode they are compared with."""
    windows = flatten(args.window) if args.window else [-1]
    softcaps = flatten(args.softcap) if args.softcap else [0.0]
    appends = flatten(args.append) if args.append else [0]
    return variant_list(windows, softcaps, switch_values(args.sinks), switch_values(args.batch_invariant),
                        baseline=args.compare_variants, appends=appends, rotary=switch_values(args.rotary))


def resolve_grid(args: argparse.Namespace, l2_bytes: int):
    batches = flatten(args.batch) if args.batch else list(DEFAULT_BATCHES)
    seqlens = flatten(args.seqlen) if args.seqlen else list(DEFAULT_SEQLENS)
    seqlens_q = flatten(args.seqlen_q) if args.seqlen_q else [1]
    return build_grid(batches, seqlens, resolve_shape(args), args.dtype, args.mem_cap_gb * 1e9, l2_bytes,
                      formats=resolve_formats(args), variants=resolve_variants(args), seqlens_q=seqlens_q)


def resolve_contenders(args: argparse.Namespace):
    """The contenders asked for; with ``--compare-formats`` or ``--compare-variants`` and no
    ``--contenders``, the flashsplit ones."""
    from .contenders import select_contenders

    chosen = select_contenders(args.contenders, flex=not args.no_flex)
    if (args.compare_formats or args.compare_variants) and not args.contenders:
        chosen = [c for c in chosen if c.family == "flashsplit"]
    if args.read_floor:
        from .floor import ReadFloorContender

        chosen.append(ReadFloorContender())
    return chosen


def _options_error(args: argparse.Namespace) -> str | None:
    if args.compare_formats and args.sweep_splits:
        return "--compare-formats and --sweep-splits do not combine (a sweep has many rows per format)"
    if args.compare_formats and resolve_formats(args) == [(0, SAME_KV)]:
        return "--compare-formats needs a format to compare: --page-size N (N > 0) and/or --kv-dtype fp8e4m3|fp8e5m2"
    if args.compare_variants and args.sweep_splits:
        return "--compare-variants and --sweep-splits do not combine (a sweep has many rows per variant)"
    if True in switch_values(args.rotary) and not any(flatten(args.append or [[0]])):
        return "--rotary rotates appended keys: it needs --append N (N >= 1)"
    variants = resolve_variants(args)
    if args.compare_variants and variants == [PLAIN]:
        return ("--compare-variants needs a variant to compare: --window LEFT (LEFT >= 0), --softcap X (X > 0), "
                "--sinks, --batch-invariant and/or --append N (N >= 1)")
    if args.sweep_splits and any(v.batch_invariant for v in variants):
        return ("--sweep-splits and --batch-invariant do not combine (batch-invariant decode fixes the split length, "
                "so num_splits cannot be swept)")
    return None


def _console(stderr: bool = False):
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    # Piped or captured output gets a wide fixed width, so tables do not fold at 80 columns.
    return Console(stderr=stderr, width=None if stream.isatty() else 200)


def run_bench_command(args: argparse.Namespace) -> int:
    """Run ``flashsplit bench`` with parsed ``args``; returns the exit code."""
    from .device import cuda_available, device_info
    from .render import render_dry_run

    if args.mla is not None:
        from .mla import run_mla_command

        return run_mla_command(args)
    error = _options_error(args)
    if error:
        print(f"flashsplit bench: error: {error}", file=sys.stderr)
        return 2
    if args.from_json:
        return _render_saved(args)
    if args.dry_run:
        from .dryrun import build_dry_run

        device = device_info()
        cases, skipped = resolve_grid(args, device.l2_bytes)
        contenders = resolve_contenders(args)
        console = _console()
        render_dry_run(console, build_dry_run(cases, skipped, contenders, device, args.mem_cap_gb * 1e9))
        if args.compare_formats:
            console.print(f"  --compare-formats would compare {[c.name for c in contenders]} across "
                          + ", ".join(cases_formats(cases)))
        if args.compare_variants:
            console.print(f"  --compare-variants would compare {[c.name for c in contenders]} on "
                          + ", ".join(cases_variants(cases)) + " against plain decode")
        if args.sweep_splits:
            from .sweep import sweep_backends

            names = [c.name for c in sweep_backends(contenders) if c.static_reason() is None]
            console.print(f"  --sweep-splits would time {names or 'no flashsplit backend'} at num_splits "
                          f"{args.sweep_splits[0]}..{args.sweep_splits[-1]} ({len(args.sweep_splits)} counts) "
                          "plus each cell's heuristic choice")
        return 0
    if not cuda_available():
        print(NO_GPU_MESSAGE, file=sys.stderr)
        return 2
    return _run_on_gpu(args)


def cases_formats(cases) -> list[str]:
    """The distinct cache formats among ``cases``, as labels, in order."""
    return list(dict.fromkeys(c.format_label for c in cases))


def cases_variants(cases) -> list[str]:
    """The distinct attention variants among ``cases`` other than plain, as labels, in order."""
    return list(dict.fromkeys(c.variant.label for c in cases if not c.variant.plain))


class _RichProgress:
    """Adapts the runner's :class:`~.runner.Progress` callbacks to a rich progress bar; with a
    ``json_path``, each finished row is also saved there with the rows before it (a ``--json``
    report of the rows so far), so a run stopped midway leaves what it measured."""

    def __init__(self, progress, task, json_path: str | None = None, header=None):
        self.progress, self.task = progress, task
        self.json_path, self.header, self.rows = json_path, header, []

    def start(self, description: str) -> None:
        self.progress.update(self.task, description=description)

    def advance(self, row) -> None:
        self.progress.advance(self.task)
        if self.json_path:
            from .rows import Report, report_to_json

            self.rows.append(row)
            part = Path(self.json_path + ".part")
            try:
                part.write_text(report_to_json(Report(self.header, list(self.rows))))
                part.replace(self.json_path)  # a rename: a reader never sees half a file
            except OSError as e:  # the run goes on; the final write reports the path's problem
                print(f"could not save the rows so far to {self.json_path}: {e}", file=sys.stderr)
                self.json_path = None


def _sweep_total(cases, backends, splits, num_sms) -> int:
    from .contenders import Unsupported

    total = 0
    for case in cases:
        for b in backends:
            try:
                total += len(set(splits) | {b.plan(case, num_sms).num_splits})
            except Unsupported:
                pass
    return total


def _run_on_gpu(args: argparse.Namespace) -> int:
    import torch
    import triton
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    import flashsplit

    from .device import device_info
    from .formats import compare_formats
    from .render import MATPLOTLIB_MISSING, matplotlib_available, render_report
    from .rows import WRONG, Report, RunHeader
    from .runner import RunOptions, run_grid
    from .sweep import sweep_backends, sweep_grid
    from .timing import TimingConfig
    from .variants import compare_variants

    if args.plot and not matplotlib_available():  # fail before spending GPU time
        print(MATPLOTLIB_MISSING, file=sys.stderr)
        return 2
    console = _console()
    device = device_info()
    cases, skipped = resolve_grid(args, device.l2_bytes)
    contenders = resolve_contenders(args)
    timing = TimingConfig(calls_per_graph=args.calls_per_graph, warmup=args.warmup, replays=args.replays,
                          eager_calls=args.eager_calls)
    options = RunOptions(timing=timing, mem_cap_bytes=args.mem_cap_gb * 1e9, seed=args.seed)
    header = RunHeader(
        device=device.name, num_sms=device.num_sms, l2_bytes=device.l2_bytes, datasheet_bw=device.datasheet_bw,
        datasheet_note=device.datasheet_note, torch_version=torch.__version__, triton_version=triton.__version__,
        flashsplit_version=flashsplit.__version__,
        timing=(f"device us: CUDA-graph replay of max({timing.calls_per_graph}, sets) calls (fewer for calls "
                f"over {timing.budget_ms / timing.calls_per_graph:g} ms), median of {timing.replays} replays after "
                f"{timing.warmup} warm-up (CUDA events where capture fails); eager us: wall clock over "
                f"{timing.eager_calls} calls + sync, median of {timing.eager_repeats}; host us: the launch loop "
                f"of those calls alone, fastest of {timing.eager_repeats}; input sets rotated so their KV exceeds "
                f"{L2_FACTOR:g}x L2"),
    )
    if any(c.paged or c.fp8 for c in cases):
        header.notes.append(FORMATS_NOTE)
    if any(not c.variant.plain for c in cases):
        header.notes.append(VARIANTS_NOTE)
    if any(c.causal for c in cases):
        header.notes.append(QUERIES_NOTE)
    runnable = []
    for c in contenders:
        reason = c.available()
        if reason is None:
            runnable.append(c)
        else:
            header.notes.append(f"{c.name} skipped: {reason}")
    if not args.no_ceiling:
        from .ceiling import measure_ceiling

        try:
            with console.status("measuring the bandwidth ceiling (>= 4 GB read and copy probes)"):
                ceiling = measure_ceiling()
            header.ceiling_bw, header.ceiling_note = ceiling.best, ceiling.describe()
        except Exception as e:  # the ceiling is a reference point; the run goes on without it
            header.ceiling_note = f"ceiling probe failed ({type(e).__name__}: {str(e)[:120]})"
            torch.cuda.empty_cache()
    else:
        header.ceiling_note = "ceiling probe skipped (--no-ceiling)"

    report = Report(header)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=_console(stderr=True), transient=True) as bar:
        if args.sweep_splits:
            backends = sweep_backends(runnable)
            if not backends:
                print("--sweep-splits needs a runnable flashsplit backend (triton or cute); none is", file=sys.stderr)
                return 2
            task = bar.add_task("sweep", total=_sweep_total(cases, backends, args.sweep_splits, device.num_sms))
            report.rows, report.sweep = sweep_grid(cases, backends, args.sweep_splits, device, header.ceiling_bw,
                                                   options, _RichProgress(bar, task))
        else:
            task = bar.add_task("bench", total=len(cases) * len(runnable))
            report.rows = run_grid(cases, runnable, device, header.ceiling_bw, options,
                                   _RichProgress(bar, task, args.json, header))
    if args.compare_formats:
        report.formats = compare_formats(report.rows)
    if args.compare_variants:
        report.variants = compare_variants(report.rows)
    render_report(console, report, skipped)
    code = _write_outputs(args, report)
    return 1 if code or any(r.status == WRONG for r in report.rows) else 0


def load_reports(paths: list[str]):
    """One report of the saved ``--json`` reports at ``paths``: their rows, sweeps, format and
    variant comparisons in order, under the first file's header (a note names the files merged).

    Raises ``ValueError`` naming the file that cannot be read or is not a bench report."""
    import json

    from .rows import report_from_json

    reports = []
    for path in paths:
        try:
            text = Path(path).read_text()
        except OSError as e:
            raise ValueError(f"--from-json: cannot read {path!r}: {e.strerror or e}") from None
        try:
            payload = json.loads(text)
            if not isinstance(payload, dict) or not {"header", "rows"} <= payload.keys():
                raise ValueError("expected an object with 'header' and 'rows'")
            reports.append(report_from_json(text))
        except (TypeError, ValueError, AttributeError, KeyError) as e:  # json.JSONDecodeError is a ValueError
            raise ValueError(f"--from-json: {path!r} is not a flashsplit bench --json report ({type(e).__name__}: "
                             f"{str(e)[:120]})") from None
    merged = reports[0]
    for other in reports[1:]:
        merged.rows += other.rows
        merged.sweep += other.sweep
        merged.formats += other.formats
        merged.variants += other.variants
    if len(paths) > 1:
        merged.header.notes.append(f"merged from {len(paths)} reports: {', '.join(paths)}")
    return merged


def _render_saved(args: argparse.Namespace) -> int:
    """``--from-json``: render saved reports and write the outputs asked for; no GPU needed."""
    from .render import MATPLOTLIB_MISSING, matplotlib_available, render_report

    if args.plot and not matplotlib_available():
        print(MATPLOTLIB_MISSING, file=sys.stderr)
        return 2
    try:
        report = load_reports(args.from_json)
    except ValueError as e:
        print(f"flashsplit bench: error: {e}", file=sys.stderr)
        return 2
    render_report(_console(), report)
    return _write_outputs(args, report)


def _write_outputs(args: argparse.Namespace, report) -> int:
    from .render import write_plot
    from .rows import FormatComparison, SweepSummary, VariantComparison, report_to_json, rows_to_csv, to_csv

    code = 0
    try:
        if args.json:
            Path(args.json).write_text(report_to_json(report))
        if args.csv:
            Path(args.csv).write_text(rows_to_csv(report.rows))
            if report.sweep:
                Path(args.csv).with_suffix(".sweep.csv").write_text(to_csv(report.sweep, SweepSummary))
            if report.formats:
                Path(args.csv).with_suffix(".formats.csv").write_text(to_csv(report.formats, FormatComparison))
            if report.variants:
                Path(args.csv).with_suffix(".variants.csv").write_text(to_csv(report.variants, VariantComparison))
    except OSError as e:
        print(f"could not write output: {e}", file=sys.stderr)
        code = 1
    if args.plot:
        try:
            write_plot(report, args.plot, args.plot_seqlen)
        except Exception as e:  # a plot is a convenience; the data files are already written
            print(f"could not write the plot: {e}", file=sys.stderr)
            code = 1
    return code


def main(argv: list[str] | None = None) -> int:
    """Standalone entry point: ``python -m flashsplit.bench.cli [options]``."""
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
