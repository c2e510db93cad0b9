"""Print the split count flashsplit's plan gives the cute backend for one cell on the H200 (for the
shell scripts that time forced cute launches at it).

    python scripts/cute_splits.py 32/8 128 1 4k              # heads, head dim, batch, keys
    python scripts/cute_splits.py 32/8 128 1 4k --kv-dtype fp8e4m3
"""

from __future__ import annotations

import argparse

import flashsplit
from flashsplit.bench.cases import KV_DTYPES
from flashsplit.bench.options import parse_seqlen


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("heads", help="q/KV heads, e.g. 32/8")
    ap.add_argument("head_dim", type=int)
    ap.add_argument("batch", type=int)
    ap.add_argument("seqlen", type=parse_seqlen, help="keys per row, e.g. 4k")
    ap.add_argument("--kv-dtype", choices=list(KV_DTYPES), default="same")
    args = ap.parse_args()
    heads, heads_kv = map(int, args.heads.split("/"))
    plan = flashsplit.plan(args.batch, args.seqlen, heads, heads_kv, args.head_dim, backend="cute", gpu="h200",
                           kv_dtype=KV_DTYPES[args.kv_dtype])
    print(plan.num_splits)


if __name__ == "__main__":
    main()
