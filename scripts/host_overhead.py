"""Host time of an eager ``flashsplit.decode`` call, per backend, stage by stage.

Runs bursts of back-to-back calls without synchronizing inside a burst, so each figure is host
cost (the GPU runs behind; a burst of 200 calls enqueues at most 400 launches, which the driver
queues without making the host wait): the whole ``decode`` call; the backend's prepared
launcher alone (the api's cached validation/plan skipped); ``decode`` without its launch (the
launcher swapped for a no-op: the api layer); ``torch.empty_like(q)`` (the output allocation)
for scale; and torch SDPA (cuDNN) as the peer a user would otherwise call.

    python scripts/host_overhead.py    # on a GPU: B=1, 32/8 heads, d=128, 4k and 16k keys
"""

from __future__ import annotations

import time

import torch

import flashsplit
import flashsplit.registry
from flashsplit import api, dispatch
from flashsplit.call import DecodeOptions, DecodeTensors
from flashsplit.cute.backend import CuteBackend
from flashsplit.plan import MAX_SPLITS
from flashsplit.triton.backend import TritonBackend


def per_call_us(fn, calls: int, rounds: int = 7) -> float:
    """Host microseconds per call: the fastest of ``rounds`` bursts of ``calls`` back-to-back
    calls (a shared host only ever adds time, so the minimum is the call's own cost; the GPU is
    synchronized between bursts, so a burst never waits on a full launch queue)."""
    for _ in range(5):
        fn()
    best = float("inf")
    for _ in range(rounds):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        started = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, time.perf_counter() - started)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return best / calls * 1e6


def api_layer_us(q, k, v, lens, backend: str, calls: int) -> float:
    """Host us of ``decode()`` with its prepared launcher swapped for a no-op: the api layer alone
    (argument bundles, the output allocation, the call signature and its lookup)."""
    key = dispatch.signature(DecodeTensors(q, k, v, torch.empty_like(q), None, lens), DecodeOptions(backend=backend),
                             True)
    run = dispatch._PREPARED[key]
    dispatch._PREPARED[key] = lambda tensors: None
    try:
        return per_call_us(lambda: flashsplit.decode(q, k, v, cache_seqlens=lens, backend=backend), calls)
    finally:
        dispatch._PREPARED[key] = run


def main(calls: int = 200) -> None:
    cuda = torch.cuda.is_available()
    for seqlen_k in (4096, 16384) if cuda else (256,):
        report(seqlen_k, calls if cuda else 3)  # the interpreter: only proves the script runs


def report(seqlen_k: int, calls: int) -> None:
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    dtype = torch.bfloat16 if cuda else torch.float16
    batch = 1
    q = torch.randn(batch, 1, 32, 128, device=device, dtype=dtype)
    k = torch.randn(batch, seqlen_k, 8, 128, device=device, dtype=dtype)
    v = torch.randn_like(k)
    lens = torch.full((batch,), seqlen_k, dtype=torch.int32, device=device)
    out = torch.empty_like(q)
    print(f"{device}: B={batch} L_k={seqlen_k} 32/8 d=128, fastest of 7 bursts of {calls} eager calls, "
          "host us per call (no sync)")
    print(f"  torch.empty_like(q)                      {per_call_us(lambda: torch.empty_like(q), calls):8.1f}")
    # "triton-merged" / "cute-merged": the split kernel merges its partials itself at every
    # split count (one launch), beside the default (a combine kernel past the backend's
    # merge_max_splits splits).
    backends = ["triton", "triton-merged", "cute", "cute-merged"] if cuda else ["triton", "triton-merged"]
    default_merge = TritonBackend.merge_max_splits
    default_cute_merge = CuteBackend.merge_max_splits
    for label in backends:
        TritonBackend.merge_max_splits = MAX_SPLITS if label == "triton-merged" else default_merge
        CuteBackend.merge_max_splits = MAX_SPLITS if label == "cute-merged" else default_cute_merge
        flashsplit.registry.invalidate()
        name = label.removesuffix("-merged")
        try:
            flashsplit.decode(q, k, v, cache_seqlens=lens, backend=name)
        except ValueError as e:
            print(f"  {name}: {e}")
            continue
        whole = per_call_us(lambda name=name: flashsplit.decode(q, k, v, cache_seqlens=lens, backend=name), calls)
        into = per_call_us(lambda name=name: api.decode_into(q, k, v, out, None, cache_seqlens=lens, backend=name),
                           calls)
        tensors = DecodeTensors(q, k, v, out, None, lens)
        run = dispatch._PREPARED[dispatch.signature(tensors, DecodeOptions(backend=name))]
        launch = per_call_us(lambda run=run: run(tensors), calls)
        api_layer = api_layer_us(q, k, v, lens, name, calls)
        print(f"  {label:13s} decode() {whole:8.1f}   decode_into() {into:8.1f}   prepared launcher alone {launch:8.1f}"
              f"   decode() without its launch {api_layer:8.1f}")
    TritonBackend.merge_max_splits = default_merge
    CuteBackend.merge_max_splits = default_cute_merge
    flashsplit.registry.invalidate()
    if cuda:
        qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            sdpa = per_call_us(lambda: torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True),
                               calls)
        print(f"  SDPA cuDNN (enable_gqa)                  {sdpa:8.1f}")


if __name__ == "__main__":
    main()
