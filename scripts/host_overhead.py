"""Where an eager ``flashsplit.decode`` call spends its host time, stage by stage.

Wraps the Triton backend's stages (validation + plan in ``decode`` itself, partial-buffer
allocation, split launch, combine launch) with host timers and runs many back-to-back calls
without synchronizing, so each stage's figure is its host cost (the GPU runs behind).

    python scripts/host_overhead.py            # on a GPU: B=1, 32/8 heads, d=128, 16k keys
"""

from __future__ import annotations

import collections
import time

import torch

import flashsplit
from flashsplit.registry import get


def main(calls: int = 300) -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float16
    batch, seqlen_k = (1, 16384) if device == "cuda" else (1, 512)
    q = torch.randn(batch, 1, 32, 128, device=device, dtype=dtype)
    k = torch.randn(batch, seqlen_k, 8, 128, device=device, dtype=dtype)
    v = torch.randn_like(k)
    lens = torch.full((batch,), seqlen_k, dtype=torch.int32, device=device)
    if device == "cpu":
        calls = 3  # the interpreter: only proves the script runs

    totals: dict[str, float] = collections.defaultdict(float)
    backend = get("triton")

    def timed(name, fn):
        def wrapper(*args, **kwargs):
            started = time.perf_counter()
            result = fn(*args, **kwargs)
            totals[name] += time.perf_counter() - started
            return result
        return wrapper

    originals = {name: getattr(backend, name) for name in ("_alloc_partials", "_launch_split", "_launch_combine", "decode")}
    for name, fn in originals.items():
        setattr(backend, name, timed(name, fn))
    try:
        for _ in range(5):
            flashsplit.decode(q, k, v, cache_seqlens=lens, backend="triton")
        if device == "cuda":
            torch.cuda.synchronize()
        totals.clear()
        started = time.perf_counter()
        for _ in range(calls):
            flashsplit.decode(q, k, v, cache_seqlens=lens, backend="triton")
        host = time.perf_counter() - started
        if device == "cuda":
            torch.cuda.synchronize()
        wall = time.perf_counter() - started
    finally:
        for name, fn in originals.items():
            setattr(backend, name, fn)
    per_call = lambda seconds: seconds / calls * 1e6  # noqa: E731
    print(f"{device}: B={batch} L_k={seqlen_k} 32/8 d=128, {calls} eager calls")
    print(f"  host time per call (no sync)   {per_call(host):8.1f} us   wall with the final sync {per_call(wall):8.1f} us")
    print(f"  decode() before the backend    {per_call(host - totals['decode']):8.1f} us  (validation, select, plan, out)")
    print(f"  backend.decode total           {per_call(totals['decode']):8.1f} us")
    for name in ("_alloc_partials", "_launch_split", "_launch_combine"):
        print(f"    {name:26s} {per_call(totals[name]):8.1f} us")


if __name__ == "__main__":
    main()
