"""The measured HBM bandwidth ceiling: the best a plain streaming kernel reaches on this GPU.

Two probes, each over a buffer far larger than the L2 (>= 4 GB), measured once per run:

- a Triton read-and-reduce kernel (each program sums a contiguous chunk into one float), tuned
  over a few tile shapes: the read bandwidth a decode kernel, which only reads, can hope for;
- ``torch`` ``copy_``: read + write bytes per second.

The ceiling is the larger of the two. On an H200 (2026-11-29) a bf16 sum read
4.19 TB/s and a copy 4.27 TB/s, while cuDNN decode read KV at up to 4.69 TB/s, so rows may
exceed 100% of this ceiling; it is a reference point, not a bound.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .timing import _event_times_ms

#: Probe buffer size: >= 4 GB, ~70x the H200's L2.
PROBE_BYTES = 1 << 32
#: (BLOCK, TILES_PER_PROGRAM, num_warps) tried by the read probe.
READ_CONFIGS = tuple((block, tiles, warps) for block in (2048, 4096, 8192) for tiles in (4, 16) for warps in (4, 8))


@triton.jit
def _read_sum_kernel(x_ptr, partial_ptr, BLOCK: tl.constexpr, TILES: tl.constexpr):
    # int64 offsets: 2^30 floats times program ids overflow int32 arithmetic.
    pid = tl.program_id(0).to(tl.int64)
    base = pid * (BLOCK * TILES)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for t in range(TILES):
        offs = base + t * BLOCK + tl.arange(0, BLOCK)
        acc += tl.load(x_ptr + offs, eviction_policy="evict_first")
    tl.store(partial_ptr + pid, tl.sum(acc, axis=0))


@dataclass(frozen=True)
class Ceiling:
    """Measured bandwidths in bytes/s; ``best`` is what rows are compared with."""

    read_bw: float
    read_config: str
    copy_bw: float
    probe_bytes: int

    @property
    def best(self) -> float:
        return max(self.read_bw, self.copy_bw)

    def describe(self) -> str:
        return (f"measured ceiling {self.best / 1e12:.2f} TB/s (Triton read {self.read_bw / 1e12:.2f} TB/s "
                f"[{self.read_config}], copy read+write {self.copy_bw / 1e12:.2f} TB/s, {self.probe_bytes / 1e9:.1f} GB)")


def _time_ms(fn, reps: int) -> float:
    """Median milliseconds of ``fn()`` after one warm-up call (CUDA events, :mod:`.timing`)."""
    fn()
    torch.cuda.synchronize()
    return statistics.median(_event_times_ms(fn, reps))


def measure_ceiling(probe_bytes: int = PROBE_BYTES, reps: int = 10) -> Ceiling:
    """Run both probes on the current CUDA device (allocates ``probe_bytes`` at most at once)."""
    n = probe_bytes // 4
    chunk = max(b * t for b, t, _ in READ_CONFIGS)
    n -= n % chunk  # every config divides n: no masks in the hot loop
    x = torch.ones(n, dtype=torch.float32, device="cuda")
    best_bw, best_cfg = 0.0, ""
    for block, tiles, warps in READ_CONFIGS:
        programs = n // (block * tiles)
        partial = torch.empty(programs, dtype=torch.float32, device="cuda")

        def launch(block=block, tiles=tiles, warps=warps, partial=partial, programs=programs):
            _read_sum_kernel[(programs,)](x, partial, BLOCK=block, TILES=tiles, num_warps=warps)

        bw = n * 4 / (_time_ms(launch, reps) * 1e-3)
        if bw > best_bw:
            best_bw, best_cfg = bw, f"BLOCK={block} TILES={tiles} warps={warps}"
        del partial
    x = None  # (the closures above hold the name, not the tensor: its memory is freed here)
    torch.cuda.empty_cache()
    half = probe_bytes // 2 // 4  # source and destination together span probe_bytes
    src = torch.ones(half, dtype=torch.float32, device="cuda")
    dst = torch.empty_like(src)
    copy_bw = 2 * half * 4 / (_time_ms(lambda: dst.copy_(src), reps) * 1e-3)
    src = dst = None
    torch.cuda.empty_cache()
    return Ceiling(best_bw, best_cfg, copy_bw, probe_bytes)
