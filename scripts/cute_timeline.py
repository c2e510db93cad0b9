"""When the cute split kernel's CTAs reach each step of a B = 1 decode, from its timeline probe.

Compiles the split kernels with :mod:`flashsplit.cute.timeline` on (a development build: every
CTA writes ``%globaltimer`` and ``%clock64`` at each step), then decodes 32/8 heads, d = 128,
bf16, one query, full-length rows, over inputs rotated out of L2, each call alone (a sync
between calls). For each step: when CTAs reach it, in us after the first CTA's entry (earliest,
median, latest CTA), and the median per-CTA time since its own entry in SM cycles (the
clock64 deltas, exact within an SM). Prints one table per cell, then which SMs finished their
last tiles earliest and latest and whether the same SMs are late call after call. GPU only.

    python scripts/cute_timeline.py --keys 1k 4k 16k 128k
    python scripts/cute_timeline.py --keys 1k 4k --merge cluster   # splits merged through a cluster
    python scripts/cute_timeline.py --keys 4k 128k --fp8   # an e4m3 cache (descales of 1)
"""

from __future__ import annotations

import argparse
import statistics

import torch

from flashsplit.cute import timeline

HEADS, HEADS_KV, DIM = 32, 8, 128
MAX_CTAS = 1 << 16


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keys", nargs="+", default=["1k", "4k", "16k", "128k"])
    parser.add_argument("--calls", type=int, default=30, help="calls timed per cell (after 3 warm-up calls)")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--merge", choices=("counter", "cluster"), default="counter",
                        help="how merging launches merge: the arrival counter, or one thread-block cluster "
                             "(flashsplit.cute.choice.CLUSTER_MERGE) where the launch allows it")
    parser.add_argument("--fp8", action="store_true", help="an e4m3 cache (one descale of 1)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("cute_timeline: no CUDA device; this script measures the GPU.")
        return
    slots = torch.zeros(MAX_CTAS * timeline.PAIRS_PER_CTA * 2, dtype=torch.int64, device="cuda")
    timeline.ADDRESS = slots.data_ptr()  # before any split kernel compiles in this process

    from flashsplit.cute import choice

    choice.CLUSTER_MERGE = args.merge == "cluster"
    for spec in args.keys:
        report_cell(spec, args, slots)


def report_cell(spec: str, args: argparse.Namespace, slots: torch.Tensor) -> None:
    """Decode one cell ``args.calls`` times (after 3 warm-up calls) with the probe on; print its
    table and which SMs finished late."""
    import flashsplit
    from flashsplit.bench.cases import rotation_count
    from flashsplit.bench.options import parse_seqlen

    events, pairs = len(timeline.EVENTS), timeline.PAIRS_PER_CTA
    done = timeline.EVENTS.index("tiles_done")
    seqlen = parse_seqlen(spec)
    fp8 = torch.float8_e4m3fn if args.fp8 else None
    plan = flashsplit.plan(args.batch, seqlen, HEADS, HEADS_KV, DIM, backend="cute", kv_dtype=fp8)
    ctas = plan.grid[0] * plan.grid[1] * plan.grid[2]
    if ctas > MAX_CTAS:  # the kernels would write past the probe's buffer
        raise SystemExit(f"cute_timeline: {spec} keys at B = {args.batch} launch {ctas} CTAs, over {MAX_CTAS}")
    kv_bytes = 2 * args.batch * seqlen * HEADS_KV * DIM * (1 if fp8 else 2)

    def cache():
        x = torch.randn(args.batch, seqlen, HEADS_KV, DIM, device="cuda", dtype=torch.bfloat16)
        return x.to(fp8) if fp8 else x

    sets = [(torch.randn(args.batch, 1, HEADS, DIM, device="cuda", dtype=torch.bfloat16), cache(), cache())
            for _ in range(rotation_count(kv_bytes))]
    descale = torch.ones(1, device="cuda") if fp8 else None
    lens = torch.full((args.batch,), seqlen, dtype=torch.int32, device="cuda")
    per_step: dict[str, list[list[float]]] = {name: [[], [], [], []] for name in timeline.EVENTS}
    reached_by: dict[str, int] = {}  # CTAs that reached each step, in the last call
    spans = []
    last_tile_by_sm: dict[int, list[float]] = {}  # SM id -> its CTAs' last-tile times, every call
    for call in range(args.calls + 3):
        q, k, v = sets[call % len(sets)]
        slots.fill_(-1)
        flashsplit.decode(q, k, v, cache_seqlens=lens, backend="cute", k_descale=descale, v_descale=descale)
        torch.cuda.synchronize()
        if call < 3:
            continue
        t = slots[: ctas * pairs * 2].view(ctas, pairs, 2).cpu()
        t0 = int(t[:, 0, 0].min())
        last = 0
        finished = t[:, done, 0] >= 0
        for sm, us in zip(t[finished, events, 0].tolist(), ((t[finished, done, 0] - t0) / 1000.0).tolist()):
            last_tile_by_sm.setdefault(sm, []).append(us)
        for e, name in enumerate(timeline.EVENTS):
            reached = t[:, e, 0] >= 0
            reached_by[name] = int(reached.sum())
            if not reached_by[name]:
                continue
            us = ((t[reached, e, 0] - t0).double() / 1000.0).tolist()
            cycles = (t[reached, e, 1] - t[reached, 0, 1]).double().tolist()
            per_step[name][0].append(min(us))
            per_step[name][1].append(statistics.median(us))
            per_step[name][2].append(max(us))
            per_step[name][3].append(statistics.median(cycles))
            last = max(last, max(us))
        spans.append(last)
    print(f"\n{spec} keys: {plan.backend} {plan.num_splits} splits, grid {plan.grid}, {ctas} CTAs, "
          f"rule {plan.rule}; median of {args.calls} calls, first entry to last step "
          f"{statistics.median(spans):.2f} us")
    print(f"{'step':<12} {'CTAs':>5} {'earliest':>9} {'median':>9} {'latest':>9} {'cycles since entry':>19}")
    for name, (lo, mid, hi, cyc) in per_step.items():
        if not lo:
            continue
        print(f"{name:<12} {reached_by[name]:>5} {statistics.median(lo):>9.2f} {statistics.median(mid):>9.2f} "
              f"{statistics.median(hi):>9.2f} {statistics.median(cyc):>19.0f}")
    report_sms(last_tile_by_sm)


def report_sms(last_tile_by_sm: dict[int, list[float]]) -> None:
    """Whether the same SMs finish their last tiles late call after call: each SM's median time
    over the calls' first and second halves, and how well the two halves' orders agree."""
    halves = {sm: (statistics.median(x[: len(x) // 2]), statistics.median(x[len(x) // 2:]))
              for sm, x in last_tile_by_sm.items() if len(x) >= 2}
    if len(halves) < 3:
        return
    first, second = (torch.tensor([h[i] for h in halves.values()], dtype=torch.float64) for i in (0, 1))
    rank = lambda x: x.argsort().argsort().double()  # noqa: E731
    agreement = float(torch.corrcoef(torch.stack([rank(first), rank(second)]))[0, 1])
    order = sorted(halves, key=lambda sm: sum(halves[sm]))
    fmt = lambda sms: ", ".join(f"{sm} ({sum(halves[sm]) / 2:.2f})" for sm in sms)  # noqa: E731
    print(f"last tile by SM ({len(halves)} SMs, median us): earliest {fmt(order[:4])}; latest {fmt(order[-4:])}; "
          f"rank agreement of the calls' two halves {agreement:.2f} (1: the same SMs are late every call)")


if __name__ == "__main__":
    main()
