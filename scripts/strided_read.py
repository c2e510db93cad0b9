"""Does reading a KV cache the way split decode does cost more than streaming the same bytes?

A split-KV decode program reads one KV head's keys of one split: rows of ``D`` elements (256 bytes
at d = 128 in bf16, 128 in fp8) at a stride of ``H_kv * D`` elements, K and V, for B rows. The
read floor (``scripts/read_floor.py``) streams one contiguous buffer. This script times, with no
attention math, three reads of the same K and V caches ``[B, L, H_kv, D]`` (bf16, or one byte per
element for fp8), each program summing what it loads:

- ``stream``: read_floor's contiguous read of the same bytes (its best chunk size and warps);
- ``strided``: program ``(s, b * H_kv + h)`` reads keys ``[s * L / S, (s + 1) * L / S)`` of KV
  head ``h`` of row ``b``, ``block`` keys per step, K and V: decode's access pattern;
- ``blocked``: the same programs, loop and steps, each over a contiguous region of the same size:
  what the loop alone costs, without the stride.

If ``strided`` is slower than ``blocked``, the cache layout's stride costs bandwidth and no kernel
that reads one KV head per program can reach the stream's rate.

    python scripts/strided_read.py                                  # B = 1, 32/8 heads, d = 128
    python scripts/strided_read.py --batch 16 --keys 128k --heads-kv 8 --dtypes bf16 fp8
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from read_floor import read_times  # noqa: E402

from flashsplit.bench.cases import parse_seqlen, rotation_count  # noqa: E402
from flashsplit.bench.timing import TimingConfig, time_graph  # noqa: E402

#: Bytes per element of each cache dtype (fp8 is read as uint8: the same bytes).
ELEMENT_BYTES = {"bf16": 2, "fp8": 1}
#: (keys per step, warps, pipeline stages) tried by the strided and blocked reads.
LOOP_CONFIGS = [(block, warps, stages) for block in (32, 64, 128) for warps in (4, 8) for stages in (3, 4)]


@triton.jit
def _split_read_kernel(k_ptr, v_ptr, out_ptr, keys, heads_kv, keys_per_split,
                       D: tl.constexpr, BLOCK: tl.constexpr, STAGES: tl.constexpr, STRIDED: tl.constexpr):
    """Program ``(s, r)``, ``r = b * heads_kv + h``, sums the K and V elements of keys
    ``[s * keys_per_split, (s + 1) * keys_per_split)``: of KV head ``h`` of row ``b`` (rows of
    ``D`` at a stride of ``heads_kv * D``) when ``STRIDED``, else of the ``keys_per_split * D``
    contiguous elements at program ``s * num_rows + r``'s place in the flat caches."""
    s = tl.program_id(0).to(tl.int64)
    r = tl.program_id(1).to(tl.int64)
    num_r = tl.num_programs(1).to(tl.int64)
    b = r // heads_kv
    h = r % heads_kv
    first = s * keys_per_split
    offs_n = tl.arange(0, BLOCK)
    offs_d = tl.arange(0, D)
    acc = tl.zeros([BLOCK, D], dtype=tl.float32)
    for start in tl.range(0, keys_per_split, BLOCK, num_stages=STAGES):
        n = first + start + offs_n
        valid = (start + offs_n < keys_per_split) & (n < keys)
        if STRIDED:
            rows = (b * keys + n) * heads_kv + h
        else:
            rows = (s * num_r + r) * keys_per_split + start + offs_n
        offsets = rows[:, None] * D + offs_d[None, :]
        k = tl.load(k_ptr + offsets, mask=valid[:, None], other=0, eviction_policy="evict_first")
        v = tl.load(v_ptr + offsets, mask=valid[:, None], other=0, eviction_policy="evict_first")
        acc += k.to(tl.float32) + v.to(tl.float32)
    tl.store(out_ptr + s * num_r + r, tl.sum(tl.sum(acc, axis=1), axis=0))


def split_read(k: torch.Tensor, v: torch.Tensor, splits: int, block: int, warps: int, stages: int,
               strided: bool, out: torch.Tensor | None = None) -> torch.Tensor:
    """Per-program sums ``[splits * B * H_kv]`` of a read of ``k``/``v`` ``[B, L, H_kv, D]`` (see
    :func:`_split_read_kernel`); ``strided=False`` reads contiguous regions of the same sizes,
    which cover the caches only when ``L`` divides evenly by ``splits``."""
    batch, keys, heads_kv, head_dim = k.shape
    per_split = triton.cdiv(keys, splits)
    if out is None:
        out = torch.empty(splits * batch * heads_kv, dtype=torch.float32, device=k.device)
    _split_read_kernel[(splits, batch * heads_kv)](k, v, out, keys, heads_kv, per_split, D=head_dim, BLOCK=block,
                                                  STAGES=stages, STRIDED=strided, num_warps=warps)
    return out


def best_split_read(ks, vs, splits: int, strided: bool, config: TimingConfig) -> tuple[float, str]:
    """Fastest (us, config) of :data:`LOOP_CONFIGS` for one read pattern, input sets rotated."""
    out = torch.empty(splits * ks[0].shape[0] * ks[0].shape[2], dtype=torch.float32, device="cuda")
    results = []
    for block, warps, stages in LOOP_CONFIGS:
        def run(i, block=block, warps=warps, stages=stages):
            split_read(ks[i], vs[i], splits, block, warps, stages, strided, out)
        us = time_graph(run, len(ks), config, calls=max(20, len(ks)))
        results.append((us, f"{block} keys x {warps} warps x {stages} stages"))
    return min(results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--keys", nargs="+", default=["4k", "16k", "128k"], help="keys per row (1k = 1024)")
    parser.add_argument("--heads-kv", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--splits", nargs="+", type=int, default=[16, 32], help="splits per row (programs per head)")
    parser.add_argument("--dtypes", nargs="+", choices=list(ELEMENT_BYTES), default=["bf16", "fp8"])
    parser.add_argument("--replays", type=int, default=30)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("strided_read: no CUDA device; this script measures the GPU.")
        return
    config = TimingConfig(replays=args.replays)
    print(f"{torch.cuda.get_device_name()}: B = {args.batch}, {args.heads_kv} KV heads, d = {args.head_dim}; us")
    print(f"{'cache':>14} {'MB':>7} {'stream':>8} {'splits':>6} {'strided':>8} {'blocked':>8} "
          f"{'strided/stream':>14} {'strided/blocked':>15}  strided config")
    for dtype in args.dtypes:
        for keys in map(parse_seqlen, args.keys):
            shape = (args.batch, keys, args.heads_kv, args.head_dim)
            elem = torch.bfloat16 if dtype == "bf16" else torch.uint8
            nbytes = 2 * args.batch * keys * args.heads_kv * args.head_dim * ELEMENT_BYTES[dtype]
            sets = rotation_count(nbytes)
            ks = [torch.ones(shape, dtype=elem, device="cuda") for _ in range(sets)]
            vs = [torch.ones(shape, dtype=elem, device="cuda") for _ in range(sets)]
            flat = [torch.ones(nbytes // 2, dtype=torch.bfloat16, device="cuda") for _ in range(sets)]
            stream = read_times(flat, config)[0][0]
            del flat
            for splits in args.splits:
                strided, how = best_split_read(ks, vs, splits, True, config)
                blocked, _ = best_split_read(ks, vs, splits, False, config)
                print(f"{dtype + ' ' + str(keys // 1024) + 'k':>14} {nbytes / 1e6:7.1f} {stream:8.2f} {splits:6d} "
                      f"{strided:8.2f} {blocked:8.2f} {strided / stream:14.3f} {strided / blocked:15.3f}  {how}")
            del ks, vs
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
