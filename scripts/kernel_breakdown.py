"""Per-kernel device time of one decode call, per backend and cell (torch.profiler / CUPTI).

Runs each backend eagerly on rotated input sets (KV never in L2) and reports, for every CUDA
kernel the call launches, its mean device time; plus the graph-replay time of the whole call
for comparison. Where the two differ, the rest is launch gaps between the kernels.

    python scripts/kernel_breakdown.py                       # on the H200
    python scripts/kernel_breakdown.py --cells 1x4k 1x128k --backends triton cute
    python scripts/kernel_breakdown.py --backends triton triton-combine   # last-split merge vs combine kernel
    python scripts/kernel_breakdown.py --backends cute-combine cute-merge  # cute: combine kernel vs last-CTA merge
    python scripts/kernel_breakdown.py --cells 1x16k --sinks --batch-invariant  # a variant's kernels
"""

from __future__ import annotations

import argparse
import collections

import torch

import flashsplit
import flashsplit.registry
from flashsplit.bench.cases import parse_seqlen
from flashsplit.bench.timing import TimingConfig, time_graph
from flashsplit.cute.backend import CuteBackend
from flashsplit.plan import MAX_SPLITS
from flashsplit.triton.backend import TritonBackend

MERGE_MAX_SPLITS = TritonBackend.merge_max_splits
CUTE_MERGE_MAX_SPLITS = CuteBackend.merge_max_splits

DEFAULT_CELLS = ["1x4k", "1x16k", "1x128k", "4x16k", "16x16k", "64x4k"]


def make_sets(batch: int, seqlen_k: int, heads: int, heads_kv: int, dim: int, kv_dtype=None):
    kv_bytes = 2 * batch * seqlen_k * heads_kv * dim * 2
    num_sets = max(2, min(16, -(-3 * 60 * 2**20 // kv_bytes)))
    sets = []
    for _ in range(num_sets):
        q = torch.randn(batch, 1, heads, dim, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(batch, seqlen_k, heads_kv, dim, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        sets.append((q, k, v))
    lens = torch.full((batch,), seqlen_k, dtype=torch.int32, device="cuda")
    return sets, lens


def profile(run, num_sets: int, calls: int = 40) -> dict[str, float]:
    for i in range(3):
        run(i % num_sets)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for i in range(calls):
            run(i % num_sets)
        torch.cuda.synchronize()
    totals: dict[str, float] = collections.defaultdict(float)
    for evt in prof.events():
        if evt.device_type == torch.autograd.DeviceType.CUDA:
            totals[evt.name[:70]] += evt.device_time / calls
    return dict(totals)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cells", nargs="+", default=DEFAULT_CELLS)
    parser.add_argument("--backends", nargs="+", default=["triton", "cute"])
    parser.add_argument("--heads", default="32/8")
    parser.add_argument("--sinks", action="store_true", help="one fp32 sink logit per q head, N(3, 1)")
    parser.add_argument("--batch-invariant", action="store_true", help="decode with batch_invariant=True")
    args = parser.parse_args()
    heads, heads_kv = (int(x) for x in args.heads.split("/"))
    for cell in args.cells:
        b, keys = cell.split("x")
        batch, seqlen_k = int(b), parse_seqlen(keys)
        sets, lens = make_sets(batch, seqlen_k, heads, heads_kv, 128)
        sinks = torch.randn(heads, device="cuda") + 3.0 if args.sinks else None
        plan = flashsplit.plan(batch, seqlen_k, heads, heads_kv, 128, dtype=torch.bfloat16, device="cuda",
                               has_sinks=args.sinks, batch_invariant=args.batch_invariant)
        variant = " sinks" * args.sinks + " batch-invariant" * args.batch_invariant
        print(f"== B={batch} L_k={seqlen_k} {heads}/{heads_kv} d=128 bf16{variant}: {plan.num_splits} splits "
              f"({plan.backend})")
        for backend in args.backends:
            # "triton-combine": Triton with a separate combine kernel instead of the last split's merge.
            TritonBackend.merge_max_splits = 0 if backend == "triton-combine" else MERGE_MAX_SPLITS
            # "cute-merge" / "cute-combine": cute with its split kernel's last-CTA merge at every
            # split count / never.
            CuteBackend.merge_max_splits = {"cute-merge": MAX_SPLITS, "cute-combine": 0}.get(backend, CUTE_MERGE_MAX_SPLITS)
            flashsplit.registry.invalidate()

            def run(i, backend=backend.split("-")[0], sets=sets, lens=lens, sinks=sinks):
                q, k, v = sets[i]
                return flashsplit.decode(q, k, v, cache_seqlens=lens, backend=backend, sinks=sinks,
                                         batch_invariant=args.batch_invariant)
            try:
                kernels = profile(run, len(sets))
                graph_us = time_graph(run, len(sets), TimingConfig(), 20)
            except Exception as e:  # noqa: BLE001  (one backend's failure is its row, not the run's)
                print(f"  {backend:7s} failed: {type(e).__name__}: {str(e)[:200]}")
                continue
            total = sum(kernels.values())
            print(f"  {backend:7s} graph {graph_us:8.1f} us   kernels sum {total:8.1f} us")
            for name, us in sorted(kernels.items(), key=lambda kv: -kv[1]):
                print(f"      {us:8.2f}  {name}")


if __name__ == "__main__":
    main()
