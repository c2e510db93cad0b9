"""Host time of an eager ``flashsplit.decode`` call, per backend, stage by stage.

Runs bursts of back-to-back calls without synchronizing inside a burst, so each figure is host
cost (the GPU runs behind; a burst of 200 calls enqueues at most 400 launches, which the driver
queues without making the host wait): the whole ``decode`` call; the backend's prepared
launcher alone (the api's cached validation/plan skipped); ``decode`` on the Python path (the
native host step, :mod:`flashsplit.native`, turned off: it differs only where a backend has
one); ``decode`` without its launch (the launcher swapped for a no-op: the api layer of the
Python path); ``torch.empty_like(q)`` (the output allocation)
for scale; and torch SDPA (cuDNN) as the peer a user would otherwise call.

    python scripts/host_overhead.py          # on a GPU: B=1, 32/8 heads, d=128, 4k and 16k keys
                                             # (last line per size: decode() per backend and cuDNN
                                             # SDPA, their bursts interleaved)
    python scripts/host_overhead.py --layer  # any machine: the call layer alone, Python vs native
"""

from __future__ import annotations

import time

import torch

import flashsplit
import flashsplit.registry
from flashsplit import api, dispatch, native
from flashsplit.call import DecodeOptions, DecodeTensors
from flashsplit.cute.backend import CuteBackend
from flashsplit.plan import MAX_SPLITS
from flashsplit.triton.backend import TritonBackend


def per_call_us(fn, calls: int, rounds: int = 7) -> float:
    """Host microseconds per call: the fastest of ``rounds`` bursts of ``calls`` back-to-back
    calls (a shared host only ever adds time, so the minimum is the call's own cost; the GPU is
    synchronized between bursts, so a burst never waits on a full launch queue)."""
    return interleaved_us({"": fn}, calls, rounds)[""]


def interleaved_us(fns: dict, calls: int, rounds: int = 21) -> dict:
    """:func:`per_call_us` of each of ``fns`` (label -> call), their bursts interleaved (each round
    times one burst of each, in an order that rotates): a host's slow spell then costs every
    contender alike, and the fastest burst of each is its call's own cost."""
    for fn in fns.values():
        for _ in range(5):
            fn()
    labels, best = list(fns), dict.fromkeys(fns, float("inf"))
    for r in range(rounds):
        for label in labels[r % len(labels):] + labels[:r % len(labels)]:
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            started = time.perf_counter()
            for _ in range(calls):
                fns[label]()
            best[label] = min(best[label], time.perf_counter() - started)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return {label: t / calls * 1e6 for label, t in best.items()}


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


def layer_us(calls: int = 2000, rounds: int = 31) -> tuple[float, float]:
    """Host us of ``decode()`` with a no-op launch (B = 1, 32/8 heads, d = 128, 4k keys, any
    device): the Python path (prepared launcher swapped for a no-op) and the native host step
    (host function: the extension's no-op), fastest of ``rounds`` bursts of ``calls``."""
    import ctypes

    from flashsplit.workspace import _capturing, _raw_stream
    from flashsplit.native import STREAM, TENSOR, steps

    cuda = torch.cuda.is_available()
    device, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float16)
    q = torch.randn(1, 1, 32, 128, device=device, dtype=dtype)
    k = torch.randn(1, 4096, 8, 128, device=device, dtype=dtype)
    v = torch.randn_like(k)
    lens = torch.full((1,), 4096, dtype=torch.int32, device=device)
    flashsplit.decode(q, k, v, cache_seqlens=lens, backend="triton")
    options = DecodeOptions(backend="triton")
    key = dispatch.signature(DecodeTensors(q, k, v, None, None, lens), options, True)
    dispatch._PREPARED[key] = lambda tensors: None
    python_path = per_call_us(lambda: flashsplit.decode(q, k, v, cache_seqlens=lens, backend="triton"), calls, rounds)

    class NoLaunch:  # a split launch's 15 per-call slots, filled by the step; its host function does nothing
        slots = (ctypes.c_uint64 * 15)()
        result = ctypes.c_int32(0)
        packed = (ctypes.c_void_p * 1)()
        per_call_codes = ("Q",) * 15
        raw = (native.module().no_launch_address(), ctypes.addressof(packed), ctypes.addressof(slots),
               ctypes.addressof(result))

    sources = [(TENSOR, i, 0) for i in (0, 1, 2, 3)] + [(TENSOR, 5, 0)] * 10 + [(STREAM, 0, 0)]
    index = q.get_device() if cuda else 0
    raw_stream = _raw_stream if cuda else (lambda index: 0)
    capturing = _capturing if cuda else (lambda: False)  # CPU torch has no capture probe
    program = steps.HostProgram(index, raw_stream, capturing, {(index, raw_stream(index)): (1 << 20, 4096)}, {}, 16, 0,
                                [(NoLaunch, sources)], None)
    dispatch.HOST_STEPS.step = step = steps.build_step(program, DecodeTensors(q, k, v, None, None, lens), options)
    native_step = per_call_us(lambda: flashsplit.decode(q, k, v, cache_seqlens=lens, backend="triton"), calls, rounds)
    assert step.calls >= calls * rounds, "the native step was not taken"
    dispatch._PREPARED.clear()
    return python_path, native_step


def main(calls: int = 200) -> None:
    import sys

    if "--layer" in sys.argv[1:]:
        python_path, native_step = layer_us()
        print(f"decode() with a no-op launch, host us per call: Python path {python_path:.2f}, "
              f"native host step {native_step:.2f}")
        return
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
        step = dispatch.HOST_STEPS.step
        native_note = f" (no native step; extension: {native.status()})" if step is None else ""
        python_path = whole
        if step is not None:  # the same calls on the Python path, for comparison
            dispatch._NATIVE, dispatch.HOST_STEPS.step = False, None
            python_path = per_call_us(lambda name=name: flashsplit.decode(q, k, v, cache_seqlens=lens, backend=name),
                                      calls)
            dispatch._NATIVE = True
            flashsplit.decode(q, k, v, cache_seqlens=lens, backend=name)  # offers the step again
        into = per_call_us(lambda name=name: api.decode_into(q, k, v, out, None, cache_seqlens=lens, backend=name),
                           calls)
        tensors = DecodeTensors(q, k, v, out, None, lens)
        run = dispatch._PREPARED[dispatch.signature(tensors, DecodeOptions(backend=name))]
        launch = per_call_us(lambda run=run: run(tensors), calls)
        api_layer = api_layer_us(q, k, v, lens, name, calls)
        print(f"  {label:13s} decode() {whole:8.1f}   Python path {python_path:8.1f}   decode_into() {into:8.1f}   "
              f"prepared launcher alone {launch:8.1f}   decode() without its launch {api_layer:8.1f}{native_note}")
    TritonBackend.merge_max_splits = default_merge
    CuteBackend.merge_max_splits = default_cute_merge
    flashsplit.registry.invalidate()
    if cuda:
        qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        from torch.nn.attention import SDPBackend, sdpa_kernel

        def sdpa():
            torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True)

        fns = {name: (lambda name=name: flashsplit.decode(q, k, v, cache_seqlens=lens, backend=name))
               for name in ("triton", "cute") if name in flashsplit.registry.names()}
        fns["SDPA cuDNN (enable_gqa)"] = sdpa
        try:
            flashsplit.decode(q, k, v, cache_seqlens=lens, backend="cute")
        except ValueError:  # no cutlass-dsl here
            fns.pop("cute", None)
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):  # (flashsplit never calls SDPA)
            times = interleaved_us(fns, calls)
        print("  interleaved, fastest of 21 bursts each: "
              + ", ".join(f"{label} {us:.1f}" for label, us in times.items()))


if __name__ == "__main__":
    main()
