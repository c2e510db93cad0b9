"""``--read-floor``: the read floor of a cell, timed as a contender.

A decode call reads its whole KV cache once, so no kernel can be faster than one that only reads
those bytes. This contender is that kernel: one launch whose programs each load one contiguous
chunk of input set ``i``'s K or V cache (all loads in flight, streaming past the L2) and write one
float, no attention math. Its chunk size and warps are the fastest of :data:`READ_CONFIGS` for
the cell, picked in ``prepare``; the run then times it exactly as every contender is timed (CUDA-
graph replay over the rotated input sets). At large caches it reads at the HBM rate; at small
ones its time is mostly launch latency and the ramp of a short kernel, which every decode pays
too, so "decode / read floor" says how much of a call is the attention kernel's own.

The read covers the cache tensors as they are stored: every page of a paged pool, one byte per
fp8 element; block tables, scales and q are left out. A sliding window reads only part of the
cache, so windowed cells are skipped.
"""

from __future__ import annotations

import statistics

import torch
import triton
import triton.language as tl

from .cases import Case
from .contenders import VARIANT_FEATURES, Contender, Prepared, Unsupported
from .inputs import InputSets

NAME = "read-floor"
#: (32-bit words per program, num_warps) tried per cell: 16, 32 and 64 KB chunks.
READ_CONFIGS = tuple((words, warps) for words in (4096, 8192, 16384) for warps in (4, 8))


@triton.jit
def _read_kv_kernel(k_ptr, v_ptr, out_ptr, n_words, programs_per_tensor, CHUNK: tl.constexpr):
    """Program p reads chunk ``p % programs_per_tensor`` of K (first half of the grid) or V, as
    32-bit words, and writes their float sum (a result, so the loads are not dropped)."""
    pid = tl.program_id(0)
    chunk = (pid % programs_per_tensor).to(tl.int64)
    offs = chunk * CHUNK + tl.arange(0, CHUNK)
    mask = offs < n_words
    if pid < programs_per_tensor:
        x = tl.load(k_ptr + offs, mask=mask, other=0, eviction_policy="evict_first")
    else:
        x = tl.load(v_ptr + offs, mask=mask, other=0, eviction_policy="evict_first")
    tl.store(out_ptr + pid, tl.sum(x.to(tl.float32), axis=0))


def as_words(cache: torch.Tensor) -> torch.Tensor:
    """A contiguous cache as a flat int32 view of its bytes (every layout the bench makes has a
    byte count divisible by 4: head dims are multiples of 8)."""
    if not cache.is_contiguous():
        raise Unsupported("the read floor reads contiguous caches only")
    return cache.reshape(-1).view(torch.uint8).view(torch.int32)


def launch_read(k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, words: int, warps: int) -> torch.Tensor:
    """Read all of ``k`` and ``v`` (flat int32 views of equal size) in one launch; ``out`` float32
    holds one sum per program (``2 * ceil(k.numel() / words)``)."""
    programs = triton.cdiv(k.numel(), words)
    _read_kv_kernel[(2 * programs,)](k, v, out, k.numel(), programs, CHUNK=words, num_warps=warps)
    return out


def _quick_us(launch, num_sets: int, reps: int = 5) -> float:
    """Median us per call of bursts of eager launches over the sets (CUDA events): enough to rank
    read configs, which differ by far more than launch noise at the sizes where they differ."""
    calls = max(3, num_sets)
    times = []
    for _ in range(reps + 1):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for i in range(calls):
            launch(i % num_sets)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / calls)
    return statistics.median(times[1:])  # the first burst warms up (compiles)


class ReadFloorContender(Contender):
    """The fastest streaming read of a cell's K and V bytes (not attention: never checked
    against the reference, and its row's rel err stays empty)."""

    name = NAME
    family = "floor"
    library = "the read floor"
    formats = frozenset({"paged", "fp8"})
    variants = frozenset(VARIANT_FEATURES) - {"window"}
    multi_query = True
    checks_output = False

    def variant_reason(self, case: Case) -> str | None:
        if case.window >= 0:
            return "a window reads part of the cache; the read floor reads all of it"
        return super().variant_reason(case)

    def prepare(self, case: Case, inputs: InputSets) -> Prepared:
        keys = [as_words(t) for t in inputs.k]
        values = [as_words(t) for t in inputs.v]
        if keys[0].numel() != values[0].numel():
            raise Unsupported("K and V caches of different sizes")
        numel = keys[0].numel()
        outs = {words: torch.empty(2 * triton.cdiv(numel, words), dtype=torch.float32, device=keys[0].device)
                for words, _ in READ_CONFIGS}

        def runner(words: int, warps: int):
            return lambda i: launch_read(keys[i], values[i], outs[words], words, warps)

        words, warps = READ_CONFIGS[0]
        if keys[0].is_cuda:
            words, warps = min(READ_CONFIGS, key=lambda c: _quick_us(runner(*c), len(keys)))
        nbytes = 2 * numel * 4
        note = (f"a read of {nbytes / 1e6:.1f} MB: {words * 4 // 1024} KB per program x "
                f"{2 * triton.cdiv(numel, words)} programs, {warps} warps")
        return Prepared(runner(words, warps), note=note)
