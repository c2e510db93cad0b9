"""How fast can any kernel read N bytes, timed the way the bench times decode?

Decode at batch 1 runs close to what merely reading the KV cache costs once launch latency and
the ramp of a short kernel count (H200, 32/8 heads: 1.71x / 1.28x / 1.05x of the pure read at 4k
/ 16k / 128k keys, docs/benchmarks.md). This script measures that floor on the current GPU with
no attention math at all:

- ``empty``: a graph of back-to-back empty kernels: the per-kernel cost of a graph node;
- ``read``: a streaming kernel that reads every byte of an N-byte buffer once (each program
  loads one contiguous chunk with all its loads in flight, and writes one float), the best of a
  sweep over chunk sizes and warps; input buffers rotated so nothing is served from L2, CUDA-graph
  replay, median of replays (:mod:`flashsplit.bench.timing`, as the bench does);
- ``read+1``: the best read followed by a one-program kernel, as a split kernel is followed by
  its combine: the cost of a second kernel in the chain.

    python scripts/read_floor.py                     # KV sizes of B = 1, 32/8 heads, d = 128, bf16
    python scripts/read_floor.py --mb 16.8 67.1      # any sizes, in MB (1e6 bytes)
"""

from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl

from flashsplit.bench.cases import rotation_count
from flashsplit.bench.timing import TimingConfig, time_graph

#: KV bytes of B = 1, 32/8 heads, d = 128, bf16 at 4k, 16k and 128k keys (K and V).
DEFAULT_SIZES = {f"B=1 {n // 1024}k": 2 * n * 8 * 128 * 2 for n in (4096, 16384, 131072)}
#: (elements per program, num_warps) tried by the read sweep (bf16 elements; 16-byte loads).
READ_CONFIGS = [(chunk, warps) for chunk in (4096, 8192, 16384, 32768) for warps in (4, 8, 16)
                if chunk // (32 * warps) >= 8]


@triton.jit
def _empty_kernel(x_ptr):
    pass


@triton.jit
def _read_chunk_kernel(x_ptr, out_ptr, CHUNK: tl.constexpr):
    """Program p reads elements [p * CHUNK, (p + 1) * CHUNK) in one load (all in flight)."""
    pid = tl.program_id(0).to(tl.int64)
    x = tl.load(x_ptr + pid * CHUNK + tl.arange(0, CHUNK), eviction_policy="evict_first")
    tl.store(out_ptr + pid, tl.sum(x.to(tl.float32), axis=0))


def time_read(buffers: list[torch.Tensor], chunk: int, warps: int, config: TimingConfig,
              then_one: bool = False) -> float:
    """us per call of reading one of ``buffers`` (bf16, rotated call by call) with programs of
    ``chunk`` elements; ``then_one``: each read followed by a one-program kernel, as a split kernel
    is by its combine."""
    programs = buffers[0].numel() // chunk
    out = torch.empty(programs, dtype=torch.float32, device="cuda")

    def run(i):
        _read_chunk_kernel[(programs,)](buffers[i], out, CHUNK=chunk, num_warps=warps)
        if then_one:
            _empty_kernel[(1,)](out)

    return time_graph(run, len(buffers), config, calls=max(20, len(buffers)))


def read_times(buffers: list[torch.Tensor], config: TimingConfig) -> list[tuple[float, int, int]]:
    """``(us, chunk, warps)`` of every :data:`READ_CONFIGS` entry that fits ``buffers``, fastest first."""
    numel = buffers[0].numel()
    return sorted((time_read(buffers, chunk, warps, config), chunk, warps)
                  for chunk, warps in READ_CONFIGS if numel >= chunk)


def describe(chunk: int, warps: int, numel: int) -> str:
    return f"{chunk * 2 // 1024} KB per program x {numel // chunk} programs, {warps} warps"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", nargs="+", type=float, help="sizes in MB (1e6 bytes); default: B = 1 KV sizes")
    parser.add_argument("--replays", type=int, default=50)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("read_floor: no CUDA device; this script measures the GPU.")
        return
    config = TimingConfig(replays=args.replays)
    sizes = {f"{mb:g} MB": int(mb * 1e6) for mb in args.mb} if args.mb else DEFAULT_SIZES
    x = torch.empty(1, device="cuda")
    empty = time_graph(lambda i: _empty_kernel[(132,)](x), 1, config, calls=20)
    print(f"{torch.cuda.get_device_name()}: empty kernel (132 programs) per graph node {empty:.2f} us")
    print(f"{'size':>10} {'MB':>8} {'best read us':>13} {'TB/s':>6} {'read+1 us':>10}  best read config (next two)")
    for label, nbytes in sizes.items():
        numel = nbytes // 2  # bf16; rounded down to whole chunks by each variant
        buffers = [torch.ones(numel, dtype=torch.bfloat16, device="cuda") for _ in range(rotation_count(nbytes))]
        results = read_times(buffers, config)
        if results:
            best_us, chunk, warps = results[0]
            plus_one = time_read(buffers, chunk, warps, config, then_one=True)
            others = "; ".join(f"{us:.2f} ({describe(c, w, numel)})" for us, c, w in results[1:3])
            print(f"{label:>10} {nbytes / 1e6:8.1f} {best_us:13.2f} {nbytes / best_us / 1e6:6.2f} {plus_one:10.2f}  "
                  f"{describe(chunk, warps, numel)} ({others})")
        buffers.clear()
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
