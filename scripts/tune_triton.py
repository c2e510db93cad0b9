"""Sweep the Triton backend's tile variants and split counts on the GPU, in one call.

For each cell, every (block_n, num_warps, num_stages) variant and a few split counts around
the heuristic's choice are checked against the float64 reference, then timed by CUDA-graph
replay over rotated input sets (flashsplit.bench.timing). Prints one table per cell, best first.

    python scripts/tune_triton.py                 # on the H200
    python scripts/tune_triton.py --check-only    # CPU: every variant through the interpreter
    python scripts/tune_triton.py --fp8           # fp8 caches (e4m3, scales 1)
    python scripts/tune_triton.py --shape 16/2:256 --seqlen-q 4 --cells 1x16384 1x131072 \
        --variants 64:4:3 64:8:3 64:8:2               # another head layout and dim, 4 causal queries
"""

from __future__ import annotations

import argparse
import itertools
import math

import torch

import flashsplit
import flashsplit.registry
import flashsplit.triton.backend as tb
from flashsplit.bench.options import parse_head_dim, parse_heads
from flashsplit.reference import attention_ref
from flashsplit.testing import max_abs_err

CELLS = [(1, 4096), (1, 16384), (1, 131072), (4, 16384), (16, 16384), (64, 4096)]  # (batch, seqlen_k), 32/8 d=128
VARIANTS = list(itertools.product([32, 64, 128], [4, 8], [2, 3, 4]))  # block_n, num_warps, num_stages
FP8_CELLS = [(1, 16384), (1, 131072), (16, 131072)]
FP8_VARIANTS = list(itertools.product([64, 128, 256], [4, 8], [2, 3, 4]))  # for fp8 caches


def use_tiles(block_n: int, num_warps: int, num_stages: int) -> None:
    """Make the launcher pick this variant (block_m and block_d as the backend chooses them)."""
    original = _ORIGINAL_CHOOSE

    def choose(packed_rows: int, head_dim: int, num_splits: int = 0, programs: int = 0,
               split_keys: int = 0, fp8_cache: bool = False,
               num_sms: int = tb.DEFAULT_NUM_SMS) -> tb.TritonTiles:
        t = original(packed_rows, head_dim, num_splits, programs, split_keys, fp8_cache, num_sms)
        return tb.TritonTiles(t.block_m, block_n, t.block_d, num_warps, num_stages)

    tb.choose_tiles = choose
    flashsplit.registry.invalidate()  # prepared launchers keep their compiled kernels: rebuild them


_ORIGINAL_CHOOSE = tb.choose_tiles


def run_cell(batch: int, seqlen_k: int, device: str, check_only: bool, fp8: bool = False,
             variants: list | None = None, split_counts: list | None = None,
             shape: tuple[int, int, int] = (32, 8, 128), seqlen_q: int = 1) -> list[tuple]:
    """Check and time the variants on one cell: ``shape`` is (heads, KV heads, head dim), each
    row has ``seqlen_q`` queries (causal beyond one)."""
    heads, heads_kv, dim = shape
    causal = seqlen_q > 1
    dtype = torch.bfloat16 if device == "cuda" else torch.float16
    kv_elem = 1 if fp8 else 2
    kv_bytes = 2 * batch * seqlen_k * heads_kv * dim * kv_elem
    sets = 1 if check_only else max(1, min(8, math.ceil(3 * 60e6 / kv_bytes)))
    gen = torch.Generator(device=device).manual_seed(0)

    def cache():
        x = torch.randn(batch, seqlen_k, heads_kv, dim, device=device, dtype=dtype, generator=gen)
        return x.to(torch.float8_e4m3fn) if fp8 else x

    inputs = [(torch.randn(batch, seqlen_q, heads, dim, device=device, dtype=dtype, generator=gen), cache(), cache())
              for _ in range(sets)]
    scales = dict(k_descale=torch.ones((), device=device), v_descale=torch.ones((), device=device)) if fp8 else {}
    lens = torch.full((batch,), seqlen_k, dtype=torch.int32, device=device)
    rows = slice(0, 1)
    q0, k0, v0 = inputs[0]
    ref, _ = attention_ref(q0[rows], k0[rows].to(dtype), v0[rows].to(dtype), lens[rows], causal=causal)
    chosen = flashsplit.plan(batch, seqlen_k, heads, heads_kv, dim, seqlen_q=seqlen_q, causal=causal, backend="triton",
                             device=device).num_splits
    # Split counts around the heuristic's with the default tiles, then every tile variant at the
    # heuristic's count (one of each is enough to exercise the plumbing on the CPU).
    default = _ORIGINAL_CHOOSE(seqlen_q * heads // heads_kv, dim, fp8_cache=fp8)
    default = (default.block_n, default.num_warps, default.num_stages)
    if variants is not None:  # every listed variant at every listed split count
        runs = [(v, s) for v in variants for s in (split_counts or [chosen])]
    else:
        variants = FP8_VARIANTS if fp8 else VARIANTS
        splits = {chosen} if check_only else {max(1, chosen * f // 4) for f in (2, 3, 4, 5, 6, 8)} | {16, 24, 32, 48, 64}
        runs = [(default, s) for s in sorted(x for x in splits if x <= 256)]
        runs += [(variant, chosen) for variant in (variants[:1] if check_only else variants) if variant != default]
    results = []
    for (block_n, warps, stages), num_splits in runs:
        use_tiles(block_n, warps, stages)
        step = lambda i: flashsplit.decode(*inputs[i % sets], cache_seqlens=lens, num_splits=num_splits,  # noqa: E731
                                            causal=causal, backend="triton", **scales)
        try:
            err = max_abs_err(step(0)[rows], ref)
            us = float("nan")
            if not check_only:
                from flashsplit.bench.timing import TimingConfig, time_graph
                us = time_graph(step, sets, TimingConfig(replays=30), calls=max(20, sets))
            results.append((block_n, warps, stages, num_splits, us, err, ""))
        except Exception as e:  # a variant that does not compile (shared memory) is a result too
            results.append((block_n, warps, stages, num_splits, float("nan"), float("nan"), repr(e)[:80]))
    tb.choose_tiles = _ORIGINAL_CHOOSE
    flashsplit.registry.invalidate()
    results.sort(key=lambda r: (math.isnan(r[4]), r[4]))
    print(f"\nB={batch} L_k={seqlen_k} L_q={seqlen_q} {heads}/{heads_kv} d={dim} {dtype} {'fp8e4m3 ' if fp8 else ''}cache: "
          f"heuristic {chosen} splits; "
          f"KV {kv_bytes / 1e6:.1f} MB, floor {kv_bytes / 4.69e12 * 1e6:.1f} us; default tiles {default}")
    print(" block_n warps stages splits      us     err  note")
    for r in results[: 14 if not check_only else len(results)]:
        print(f" {r[0]:7d} {r[1]:5d} {r[2]:6d} {r[3]:6d} {r[4]:7.1f} {r[5]:7.1e}  {r[6]}")
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check-only", action="store_true", help="run each variant once, no timing (CPU-friendly)")
    parser.add_argument("--fp8", action="store_true", help="fp8 e4m3 caches (scales 1) and their tile variants")
    parser.add_argument("--cells", nargs="+", metavar="BxL", help="cells as batch x keys, e.g. 1x131072")
    parser.add_argument("--variants", nargs="+", metavar="N:W:S",
                        help="tile variants block_n:warps:stages (instead of the default sweep)")
    parser.add_argument("--splits", nargs="+", type=int, help="split counts to time each --variants entry at")
    parser.add_argument("--shape", default="32/8:128", metavar="H/HKV:D", help="heads / KV heads : head dim")
    parser.add_argument("--seqlen-q", type=int, default=1, help="queries per row (causal beyond one)")
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    cells = (FP8_CELLS if args.fp8 else CELLS) if device == "cuda" else [(2, 300)]
    if args.cells:
        cells = [tuple(int(x) for x in c.split("x")) for c in args.cells]
    variants = [tuple(int(x) for x in v.split(":")) for v in args.variants] if args.variants else None
    heads, _, head_dim = args.shape.partition(":")
    shape = (*parse_heads(heads), parse_head_dim(head_dim))
    for batch, seqlen_k in cells:
        results = run_cell(batch, seqlen_k, device, args.check_only or device == "cpu", args.fp8, variants,
                           args.splits, shape, args.seqlen_q)
        bad = [r for r in results if not (r[5] < 5e-2)]
        if bad:
            print(f"  {len(bad)} variant(s) failed or were wrong: {bad[:3]}")


if __name__ == "__main__":
    main()
