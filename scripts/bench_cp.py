"""Context-parallel decode benchmark: per-step latency of flashsplit.distributed.cp_decode.

Each cell is a batch B and a total context C (keys per row) split evenly over the W ranks of the
launch: every rank holds a contiguous shard of C / W keys per row (32 q / 8 KV heads, d = 128,
bf16 by default). Per cell and merge it reports

- ``cp_us``: one decode step (local decode + merge), CUDA-graph replay where NCCL lets the step
  be captured (else eager, marked), the slowest rank's mean;
- ``local_us``: the shard's decode alone (what the step runs before its collectives: one decode,
  or the bulk and the tail for causal ``L_q > 1``) and ``merge_share``, ``(cp_us - local_us) /
  cp_us`` (the collectives and the merge arithmetic);
- ``one_gpu_us``: the same context on one GPU at the read bandwidth one GPU's decode reached in
  this run (rank 0 decodes a single-GPU cache of ``--baseline-keys`` keys per row), measured when
  it fits (``W = 1``), else extrapolated; ``speedup = one_gpu_us / cp_us`` and ``efficiency =
  speedup / W``.

    torchrun --standalone --nproc-per-node 8 scripts/bench_cp.py --batch 1 8 --context 1M 4M --json cp.json
    torchrun --standalone --nproc-per-node 2 scripts/bench_cp.py --smoke   # CPU, gloo: a tiny configuration

Caches are a few hundred MiB or more per rank, far past the 60 MiB L2, so no rotation is needed.
A cell whose shard does not fit a GPU is reported as skipped.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import time

import torch
import torch.distributed as dist


def parse_count(text: str) -> int:
    text = text.strip().lower()
    scale = {"k": 1024, "m": 1024 ** 2}.get(text[-1], 1)
    return int(text[:-1] if scale > 1 else text) * scale


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--context", type=parse_count, nargs="+", default=[1024 ** 2, 4 * 1024 ** 2],
                        help="total keys per row over all ranks (1M = 2^20)")
    parser.add_argument("--heads", type=int, nargs=2, default=[32, 8], metavar=("H_Q", "H_KV"))
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--seqlen-q", type=int, default=1)
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--merge", nargs="+", default=["gather", "reduce"], choices=["gather", "reduce"])
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--baseline-keys", type=parse_count, default=128 * 1024,
                        help="keys per row of rank 0's single-GPU bandwidth baseline")
    parser.add_argument("--no-graph", action="store_true", help="time eager calls")
    parser.add_argument("--json", help="write the rows here (rank 0)")
    parser.add_argument("--smoke", action="store_true",
                        help="a tiny CPU configuration (B 1, 2 x 256 keys per rank, 4/2 heads, d 32, fp16)")
    args = parser.parse_args(argv)
    if args.smoke:
        args.batch, args.heads, args.head_dim = [1], [4, 2], 32
        args.iters, args.warmup, args.baseline_keys = 2, 1, 256
        args.context = None  # 256 keys per rank, set once the world size is known
    return args


def init() -> tuple[int, int, torch.device]:
    if not dist.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=300))
    rank, world = dist.get_rank(), dist.get_world_size()
    if torch.cuda.is_available():
        local = int(os.environ.get("LOCAL_RANK", rank))
        torch.cuda.set_device(local)
        return rank, world, torch.device("cuda", local)
    return rank, world, torch.device("cpu")


def timed(step, iters: int, warmup: int, device: torch.device, graph: bool, barrier: bool = True) -> tuple[float, str]:
    """Mean seconds per ``step()``: CUDA-graph replay when ``graph`` and capture works, else eager;
    ``barrier``: every rank starts timing together (False for one rank's own measurement)."""
    if device.type != "cuda":
        for _ in range(warmup):
            step()
        start = time.perf_counter()
        for _ in range(iters):
            step()
        return (time.perf_counter() - start) / iters, "eager"
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            step()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    run, mode = step, "eager"
    if graph:
        try:
            captured = torch.cuda.CUDAGraph()
            with torch.cuda.graph(captured):
                step()
            run, mode = captured.replay, "graph"
        except RuntimeError as error:  # a backend or version that cannot capture the collectives
            print(f"capture failed, timing eager calls: {error}")
            torch.cuda.synchronize()
    run()
    torch.cuda.synchronize()
    if barrier:
        dist.barrier()
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    for _ in range(iters):
        run()
    end.record()
    torch.cuda.synchronize()
    return begin.elapsed_time(end) / 1e3 / iters, mode


def slowest(seconds: float, device: torch.device) -> float:
    t = torch.tensor([seconds], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t)


def make_shard(batch: int, keys: int, args, dtype, device, generator):
    h_kv, d = args.heads[1], args.head_dim
    k = torch.randn(batch, keys, h_kv, d, generator=generator, device=device, dtype=dtype)
    return k, torch.randn_like(k)


def fits(batch: int, keys: int, args, dtype, device) -> bool:
    if device.type != "cuda":
        return True
    need = 2 * batch * keys * args.heads[1] * args.head_dim * torch.empty((), dtype=dtype).element_size()
    return need < 0.85 * torch.cuda.mem_get_info(device)[0]


def main(argv=None) -> None:
    args = parse_args(argv)
    rank, world, device = init()
    import flashsplit
    import flashsplit.distributed as fd
    from flashsplit.distributed.shards import shard_partials

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float16  # the interpreter's bf16 dot is wrong
    contexts = args.context or [256 * world]
    h_q, h_kv, d = args.heads[0], args.heads[1], args.head_dim
    generator = torch.Generator(device=device).manual_seed(1234 + rank)  # the caches
    graph = not args.no_graph
    rows = []
    for batch in args.batch:
        q_gen = torch.Generator(device=device).manual_seed(batch)  # every rank's q alike
        q = torch.randn(batch, args.seqlen_q, h_q, d, generator=q_gen, device=device, dtype=dtype)
        # Rank 0's one-GPU read bandwidth, from a single-GPU decode of the baseline cache.
        bw = None
        if rank == 0 and fits(batch, args.baseline_keys, args, dtype, device):
            k, v = make_shard(batch, args.baseline_keys, args, dtype, device, generator)
            t1, _ = timed(lambda: flashsplit.decode(q, k, v, causal=args.causal), args.iters, args.warmup, device,
                          graph, barrier=False)
            bw = 2 * k.numel() * k.element_size() / t1
            k = v = None  # frees the cache before the next cell
        bw_t = torch.tensor([bw or 0.0], dtype=torch.float64, device=device)
        dist.broadcast(bw_t, 0)
        bw = float(bw_t) or None
        for context in contexts:
            local = context // world
            kv_bytes = 2 * batch * context * h_kv * d * torch.empty((), dtype=dtype).element_size()
            ok = torch.tensor([1 if fits(batch, local, args, dtype, device) else 0], device=device)
            dist.all_reduce(ok, op=dist.ReduceOp.MIN)
            cell = dict(world=world, batch=batch, context=context, keys_per_rank=local, heads=f"{h_q}/{h_kv}",
                        head_dim=d, seqlen_q=args.seqlen_q, dtype=str(dtype).replace("torch.", ""),
                        kv_gib=round(kv_bytes / 2 ** 30, 2))
            if not int(ok):
                rows += [dict(cell, merge=m, skipped="the shard does not fit a GPU") for m in args.merge]
                continue
            k, v = make_shard(batch, local, args, dtype, device, generator)
            seqlens = torch.full((batch,), local, dtype=torch.int32, device=device)
            offset = torch.full((batch,), rank * local, dtype=torch.int32, device=device)
            total = torch.full((batch,), context, dtype=torch.int32, device=device)
            right = 0 if args.causal else -1
            layout = fd.shard_layout(args.seqlen_q, -1, right)

            def local_step():  # what cp_decode runs before its merge: the shard's decode(s)
                return shard_partials(q, k, v, layout=layout, n=seqlens, cache_seqlens=seqlens, kv_offset=offset,
                                      total=total, capacity=local, window_left=-1, window_right=right,
                                      block_table=None, cache_batch_idx=None, k_descale=None, v_descale=None,
                                      num_splits=0, batch_invariant=False, backend="auto", softmax_scale=None,
                                      softcap=0.0)
            t_local, mode = timed(local_step, args.iters, args.warmup, device, graph)
            t_local = slowest(t_local, device)
            for merge in args.merge:
                def step():
                    return fd.cp_decode(q, k, v, cache_seqlens=seqlens, kv_offset=offset, causal=args.causal,
                                        merge=merge)
                t_cp, mode = timed(step, args.iters, args.warmup, device, graph)
                t_cp = slowest(t_cp, device)
                row = dict(cell, merge=merge, timing=mode, cp_us=round(t_cp * 1e6, 1),
                           local_us=round(t_local * 1e6, 1),
                           merge_share=round(max(t_cp - t_local, 0.0) / t_cp, 3))
                if bw:
                    one = kv_bytes / bw
                    row.update(one_gpu_us=round(one * 1e6, 1), one_gpu="baseline bandwidth x context",
                               speedup=round(one / t_cp, 2), efficiency=round(one / t_cp / world, 3))
                rows.append(row)
            k = v = None  # frees the cache before the next cell
            if device.type == "cuda":
                torch.cuda.empty_cache()
    if rank == 0:
        for row in rows:
            print(json.dumps(row))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(rows, f, indent=1)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
