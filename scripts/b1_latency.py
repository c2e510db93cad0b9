"""Where a B = 1 decode's time goes: variants of one call timed side by side, beside a pure read.

Each variant of a cell (32/8 heads, d = 128, one query, bf16 q) is first checked against the
float64 reference (a wrong one is reported and not timed), then captured as a CUDA graph over
input sets rotated out of L2 and replayed interleaved with the others (median us per call), next
to the best streaming read of the same bytes (``scripts/read_floor.py``). A variant is a backend
with optional parts joined by ``:``:

    noseq     cache_seqlens=None (every row full): the split kernel waits on no load of the lengths
    sN        num_splits=N instead of the plan's count
    merge     the split kernel's last CTA merges the partials at any split count (no combine kernel)
    combine   a combine kernel at any split count
    stN       cute: N K+V stages on the swapped-operand kernel, one CTA per SM (scripts/cute_overrides.py)
    tN        cute, with stN: tiles of N keys (64 or 128)
    cluster   cute: splits merged through one thread-block cluster where the launch allows it
              (flashsplit.cute.choice.CLUSTER_MERGE; "counter": the arrival counter)

    python scripts/b1_latency.py                              # on a GPU: the default cells and variants
    python scripts/b1_latency.py --keys 1k 4k --variants triton cute cute:s8 cute:s8:combine
    python scripts/b1_latency.py --keys 4k 128k --fp8 --variants triton triton:s16 triton:noseq
    python scripts/b1_latency.py --keys 4k 16k --variants cute cute:st4 cute:st6 cute:st3:t128
    python scripts/b1_latency.py --keys 4k --variants cute cute:s8:cluster cute:s12:cluster cute:s16:cluster
"""

from __future__ import annotations

import argparse
import contextlib

import torch

import flashsplit
import flashsplit.registry
from flashsplit.bench.cases import parse_seqlen, rotation_count
from flashsplit.bench.timing import TimingConfig, capture_graph, replay_calls, time_interleaved
from flashsplit.cute import choice
from flashsplit.cute.backend import CuteBackend
from flashsplit.plan import MAX_SPLITS
from flashsplit.testing import check_against_reference
from flashsplit.triton.backend import TritonBackend
from cute_overrides import swapped_stages
from read_floor import time_read

DEFAULT_KEYS = ["128", "1k", "4k", "16k", "128k"]
DEFAULT_VARIANTS = ["triton", "triton:noseq", "cute", "cute:noseq", "triton:s16", "cute:s8", "cute:s32"]
HEADS, HEADS_KV, DIM = 32, 8, 128
MERGE_DEFAULTS = {TritonBackend: TritonBackend.merge_max_splits, CuteBackend: CuteBackend.merge_max_splits}


def make_sets(seqlen_k: int, fp8: bool):
    """Rotated (q, k, v) sets, the full-length ``cache_seqlens`` and the KV bytes of one set."""
    kv_bytes = 2 * seqlen_k * HEADS_KV * DIM * (1 if fp8 else 2)
    sets = []
    for _ in range(rotation_count(kv_bytes)):
        q = torch.randn(1, 1, HEADS, DIM, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(1, seqlen_k, HEADS_KV, DIM, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        if fp8:
            k, v = k.to(torch.float8_e4m3fn), v.to(torch.float8_e4m3fn)
        sets.append((q, k, v))
    return sets, torch.full((1,), seqlen_k, dtype=torch.int32, device="cuda"), kv_bytes


def set_merge(merge: bool | None) -> None:
    """Both backends' last-CTA merge bound: the default (None), every split count, or none."""
    for backend, default in MERGE_DEFAULTS.items():
        backend.merge_max_splits = default if merge is None else (MAX_SPLITS if merge else 0)
    flashsplit.registry.invalidate()  # prepared launchers embed the bound


def check_variant(spec: str, qkv, seqlens, backend: str, splits: int, descale) -> None:
    """One call of a variant on ``qkv`` (its settings in force) against the float64 reference,
    into a NaN-poisoned ``out``: ``AssertionError`` if it computes anything else, so a variant
    is timed only once it is right."""
    q, k, v = qkv
    out = torch.full_like(q, float("nan"))
    flashsplit.decode(q, k, v, cache_seqlens=seqlens, backend=backend, num_splits=splits, k_descale=descale,
                      v_descale=descale, out=out)
    if descale is not None:  # an fp8 cache of one descale: its values are the reference's keys
        k, v = k.float(), v.float()
    check_against_reference(out, None, q, k, v, seqlens, what=spec)


def capture_variant(spec: str, sets, lens, fp8: bool, calls: int) -> torch.cuda.CUDAGraph:
    """The graph of ``calls`` decode calls of one variant, captured with its merge bound set
    (a prepared launcher keeps the bound it was made with), once a call of it on the first set
    is right (:func:`check_variant`)."""
    backend, *parts = spec.split(":")
    merge, seqlens, splits, stages, tile_n, cluster = None, lens, 0, 0, 0, None
    for part in parts:
        if part in ("merge", "combine"):
            merge = part == "merge"
        elif part in ("cluster", "counter"):
            cluster = part == "cluster"
        elif part == "noseq":
            seqlens = None
        elif part.startswith("s") and part[1:].isdigit():
            splits = int(part[1:])
        elif part.startswith("st") and part[2:].isdigit():
            stages = int(part[2:])
        elif part.startswith("t") and part[1:].isdigit():
            tile_n = int(part[1:])
        else:
            raise SystemExit(f"b1_latency: unknown variant part {part!r} in {spec!r}")
    if tile_n and not stages:
        raise SystemExit(f"b1_latency: {spec!r}: a tile size (tN) goes with a stage count (stN)")
    one = torch.ones(1, device="cuda") if fp8 else None

    def run(i):
        q, k, v = sets[i]
        flashsplit.decode(q, k, v, cache_seqlens=seqlens, backend=backend, num_splits=splits, k_descale=one,
                          v_descale=one)

    choice.CLUSTER_MERGE = cluster  # (set_merge drops the prepared launchers, which embed it)
    set_merge(merge)
    try:
        with swapped_stages(stages, tile_n) if stages else contextlib.nullcontext():
            check_variant(spec, sets[0], seqlens, backend, splits, one)
            graph = capture_graph(run, len(sets), calls)
        for _ in range(3):
            graph.replay()
        torch.cuda.synchronize()
        return graph
    finally:
        choice.CLUSTER_MERGE = None
        set_merge(None)


def report(seqlen_k: int, variants: list[str], fp8: bool, rounds: int) -> None:
    sets, lens, kv_bytes = make_sets(seqlen_k, fp8)
    calls = replay_calls(len(sets), kv_bytes)
    graphs = {}
    for spec in variants:
        try:
            graphs[spec] = capture_variant(spec, sets, lens, fp8, calls)
        except ValueError as e:  # the backend refused the shape or the split count
            print(f"  {spec}: {e}")
        except AssertionError as e:  # a wrong result: not timed
            print(f"  {spec}: WRONG, not timed: {str(e)[:200]}")
    times = time_interleaved(graphs, calls, rounds)
    del graphs
    flat = [torch.ones(kv_bytes // 2, dtype=torch.bfloat16, device="cuda") for _ in range(len(sets))]  # out of L2
    floor = min(time_read(flat, chunk, warps, TimingConfig()) for chunk, warps in ((4096, 4), (8192, 8), (16384, 8))
                if kv_bytes // 2 >= chunk)
    del flat, sets
    torch.cuda.empty_cache()
    plan = flashsplit.plan(1, seqlen_k, HEADS, HEADS_KV, DIM, dtype=torch.bfloat16, device="cuda",
                           kv_dtype=torch.float8_e4m3fn if fp8 else None)
    print(f"== B=1 L_k={seqlen_k} {HEADS}/{HEADS_KV} d={DIM} {'e4m3' if fp8 else 'bf16'} KV {kv_bytes / 1e6:.1f} MB: "
          f"read {floor:.2f} us; auto: {plan.backend}, {plan.num_splits} splits")
    for spec, us in sorted(times.items(), key=lambda kv: kv[1]):
        print(f"  {spec:22s} {us:8.2f} us  {us / floor:5.2f}x the read")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", nargs="+", default=DEFAULT_KEYS, help="keys per row (1k = 1024)")
    parser.add_argument("--variants", nargs="+", default=DEFAULT_VARIANTS)
    parser.add_argument("--fp8", action="store_true", help="an e4m3 cache (one descale of 1)")
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("b1_latency: no CUDA device; this script measures the GPU.")
        return
    for keys in args.keys:
        report(parse_seqlen(keys), args.variants, args.fp8, args.rounds)


if __name__ == "__main__":
    main()
