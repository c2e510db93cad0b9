"""Command line: ``python -m flashsplit demo`` and ``python -m flashsplit bench``."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="flashsplit", description="Split-KV decode attention.")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run one model-shaped decode step, check it, time it on a GPU")
    demo.add_argument("--backend", default="auto", help="auto, triton or cute")
    demo.set_defaults(func=lambda args: _demo(args))
    from .bench.cli import add_bench_parser

    add_bench_parser(sub)
    args = parser.parse_args(argv)
    return args.func(args)


def _demo(args) -> int:
    from .demo import run_demo

    return run_demo(args.backend)


if __name__ == "__main__":
    sys.exit(main())
