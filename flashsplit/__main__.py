"""Command line: ``python -m flashsplit demo``, ``python -m flashsplit bench``, ``python -m
flashsplit tune``, ``python -m flashsplit native`` and ``python -m flashsplit models`` (also
installed as the ``flashsplit`` script).

Exit codes: 0 on success; 1 when a check failed (``demo``: the output disagrees with the float64
reference; ``bench``: a contender was wrong, or an output file could not be written; ``tune``: a
backend was wrong in a cell; ``native``: the native host step is off or did not build); 2 when
nothing could run as asked (argparse's errors for unusable options, a backend this machine cannot
run, ``bench`` or ``tune`` without a CUDA GPU, ``--plot`` without matplotlib).
"""

from __future__ import annotations

import argparse
import sys

from . import __version__
from .registry import names as backend_names

_DESCRIPTION = """\
Split-KV ("Flash-Decoding") attention for LLM decode on Hopper GPUs: a Triton backend (any CUDA
GPU, or the CPU through the Triton interpreter) and a CuteDSL backend (Hopper), one API.
"""

_EPILOG = """\
examples:
  flashsplit demo                         # Llama-3-8B attention over a 32k-key cache (GPU)
  flashsplit demo --backend triton        # the same step on one backend
  flashsplit bench --dry-run              # the grid, contenders and planned splits, without a GPU
  flashsplit bench --batch 1 16 --seqlen 4k 128k --json out.json
  flashsplit bench --batch 1 --read-floor # B = 1 against a kernel that only reads the cache
  flashsplit tune --out h200.json         # time both backends over a grid: auto's table for this GPU
  flashsplit native                       # build the native host step now (e.g. in an image), say its status
  flashsplit models --models llama3-8b    # transformers models end to end: flashsplit vs SDPA / eager
  flashsplit demo --help, flashsplit bench --help   # each command's options
"""

_DEMO_DESCRIPTION = """\
Run one decode step, check it and time it. On a CUDA GPU: Llama-3-8B attention (32 q heads,
8 KV heads, head dim 128, bf16) over a 32k-key cache for 4 sequences of different lengths; on a
CPU: a small fp16 shape through the Triton interpreter. Prints the plan (backend, num_splits,
grid), the largest error against a float64 reference, the first call's time (compile included)
and, on a GPU, the device time per call from CUDA-graph replay.
"""

_DEMO_EPILOG = """\
examples:
  flashsplit demo                  # the backend auto picks
  flashsplit demo --backend cute   # the CuteDSL kernel (Hopper GPU)
"""


def build_parser() -> argparse.ArgumentParser:
    """The ``flashsplit`` parser with its ``demo`` and ``bench`` sub-commands."""
    from .bench.cli import add_bench_parser
    from .bench.models import add_models_parser
    from .bench.tune import add_tune_parser

    parser = argparse.ArgumentParser(prog="flashsplit", description=_DESCRIPTION, epilog=_EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"flashsplit {__version__}")
    sub = parser.add_subparsers(title="commands", dest="command", required=True, metavar="COMMAND")
    demo = sub.add_parser("demo", help="run one model-shaped decode step, check it against a float64 reference, "
                                       "time it (GPU); on a CPU a small shape through the Triton interpreter",
                          description=_DEMO_DESCRIPTION, epilog=_DEMO_EPILOG,
                          formatter_class=argparse.RawDescriptionHelpFormatter)
    choices = ["auto", *backend_names()]
    demo.add_argument("--backend", choices=choices, default="auto",
                      help="auto (the backend flashsplit's selection rule picks for this problem on this machine) "
                           "or one backend: " + ", ".join(choices[1:]) + " (default auto)")
    demo.set_defaults(func=_demo, parser=demo)
    add_bench_parser(sub)
    add_tune_parser(sub)
    add_models_parser(sub)
    native = sub.add_parser("native", help="build the native host step now (otherwise built on the first repeated "
                                           "eager decode) and print its status",
                            description="Build flashsplit's native host step (flashsplit.native: repeated eager "
                                        "decode() calls checked and launched in C++) into torch's extension "
                                        "cache, and print 'ready' or why it is off. Exit code 1 when it is off.")
    native.set_defaults(func=_native, parser=native)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


def _native(args: argparse.Namespace) -> int:
    from . import native

    native.module()
    status = native.status()
    print(f"native host step: {status}")
    return 0 if status == "ready" else 1


def _demo(args: argparse.Namespace) -> int:
    from .demo import BackendUnavailable, run_demo

    try:
        return run_demo(args.backend)
    except BackendUnavailable as e:
        reason = str(e).removeprefix("backend: ")
        args.parser.error(f"--backend {args.backend}: {reason}")  # exits 2


if __name__ == "__main__":
    sys.exit(main())
