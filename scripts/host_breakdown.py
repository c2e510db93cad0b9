"""Where the host time of an eager B = 1 ``flashsplit.decode`` goes, piece by piece, per backend.

Each figure is host microseconds per call, the fastest of 9 bursts of 200 back-to-back calls (no
sync inside a burst): the whole call, its call layer (the signature), the prepared launcher,
and each launch alone with the exact addresses of a real call (for cute: its eager path,
the fixed launch alone and the general path's pieces), beside a one-kernel torch op for
scale, and cuDNN SDPA as the peer. For Triton the same launches also go through a ``cuLaunchKernelEx`` called with ctypes
on parameters packed once (only the addresses and the stream change per call): what a launch
costs the driver without Triton's C launcher; the result is checked against ``decode()``'s.

    python scripts/host_breakdown.py --keys 4096    # on a GPU: B = 1, 32/8 heads, d = 128, bf16
"""

from __future__ import annotations

import argparse
import ctypes
import operator
import struct

import torch

import flashsplit
from flashsplit import dispatch
from flashsplit.call import DecodeOptions, DecodeTensors
from flashsplit.cute import launcher as cute_launcher

import host_overhead  # scripts/ (run as python scripts/host_breakdown.py)


def per_call_us(fn) -> float:
    """Host us per call: the fastest of 9 bursts of 200 (:func:`host_overhead.per_call_us`)."""
    return host_overhead.per_call_us(fn, 200, rounds=9)


class _Attribute(ctypes.Structure):  # CUlaunchAttribute: id, padding, a 64-byte value union
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_char * 64)]


class _Config(ctypes.Structure):  # CUlaunchConfig
    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3), ("shared", ctypes.c_uint),
                ("stream", ctypes.c_void_p), ("attrs", ctypes.POINTER(_Attribute)), ("num_attrs", ctypes.c_uint)]


_PDL_ATTRIBUTE = 6  # CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
_CODES = {"i1": "b", "i8": "b", "i16": "h", "i32": "i", "i64": "q", "u1": "B", "u8": "B", "u16": "H",
          "u32": "I", "u64": "Q", "fp32": "f", "f32": "f", "fp64": "d"}


class CtypesLaunch:
    """A :class:`flashsplit.triton.launch.Relaunch` replayed through ``cuLaunchKernelEx`` (triton
    3.6's kernel parameters: the non-constexpr arguments in order, then two scratch pointers)."""

    def __init__(self, relaunch, cuda):
        compiled, metadata = relaunch._compiled, relaunch._compiled.metadata
        types = list(compiled.src.signature.values())
        num_pointers = len(types) - len(relaunch._tail)
        live = [i for i in range(num_pointers) if types[i] != "constexpr"]  # None pointers are constexpr
        values = [(t, v) for t, v in zip(types[num_pointers:], relaunch._tail) if t != "constexpr"]
        slots = len(live) + len(values) + 2
        self._buffer = ctypes.create_string_buffer(8 * slots)
        base = ctypes.addressof(self._buffer)
        self._params = (ctypes.c_void_p * slots)(*[base + 8 * i for i in range(slots)])
        for i, (t, v) in enumerate(values):
            struct.pack_into("<" + _CODES[t], self._buffer, 8 * (len(live) + i), v)
        self._pick = operator.itemgetter(*live)
        self._format = f"<{len(live)}Q"
        self._attrs = (_Attribute * 1)()
        pdl = bool(metadata.launch_pdl)
        if pdl:
            self._attrs[0].id = _PDL_ATTRIBUTE
            ctypes.memmove(ctypes.addressof(self._attrs[0]) + 8, struct.pack("<i", 1), 4)
        gx, gy, gz = relaunch._grid
        self._config = _Config((gx * metadata.num_ctas, gy, gz), (32 * metadata.num_warps, 1, 1), metadata.shared,
                               None, self._attrs, int(pdl))
        self._config_ref, self._function, self._launch = ctypes.byref(self._config), compiled.function, cuda

    def __call__(self, pointers, stream: int) -> None:
        struct.pack_into(self._format, self._buffer, 0, *self._pick(pointers))
        self._config.stream = stream
        status = self._launch(self._config_ref, self._function, self._params, None)
        if status:
            raise RuntimeError(f"cuLaunchKernelEx returned {status}")


def recorded(owner, name: str, sink: list):
    """Swap ``owner.name`` for a wrapper that records each call's arguments, forwarding them."""
    real = getattr(owner, name)

    def wrapper(*args):
        sink.append(args)
        return real(*args)
    setattr(owner, name, wrapper)
    return real


class _Recording:
    """Stands in for a Relaunch: records each launch's arguments and launches."""

    def __init__(self, relaunch):
        self.relaunch, self.device, self.calls = relaunch, getattr(relaunch, "device", 0), []

    def __call__(self, *args):
        self.calls.append(args)
        return self.relaunch(*args)


def triton_pieces(run, tensors, reference) -> None:
    split, combine = run.split, run.combine
    run.split, run.combine = _Recording(split), combine and _Recording(combine)
    run(tensors)
    calls_split, calls_combine = run.split.calls, combine and run.combine.calls
    run.split, run.combine = split, combine
    line = f"    split launch alone    {per_call_us(lambda: split(*calls_split[0])):6.2f}"
    if combine is not None:
        line += f"   combine launch alone    {per_call_us(lambda: combine(*calls_combine[0])):6.2f}"
    print(line)
    cuda = ctypes.CDLL("libcuda.so.1").cuLaunchKernelEx
    cuda.argtypes, cuda.restype = [ctypes.c_void_p] * 4, ctypes.c_int
    pointers, stream = calls_split[0]
    stream = stream if stream is not None else torch.cuda.current_stream().cuda_stream
    launches = [(CtypesLaunch(split, cuda), pointers)]
    if combine is not None:
        launches.append((CtypesLaunch(combine, cuda), calls_combine[0][0]))
    print("   ".join(f"    {name} via ctypes  {per_call_us(lambda: launch(args, stream)):6.2f}"
                     for name, (launch, args) in zip(("split", "combine"), launches)))
    tensors.out.fill_(float("nan"))
    for launch, args in launches:
        launch(args, stream)
    torch.cuda.synchronize()
    print(f"    ctypes launches equal decode()'s output: {torch.equal(tensors.out, reference)}")


def cute_pieces(run, tensors) -> None:
    eager = run.eager
    line = f"    eager path (addresses + fixed launch) {per_call_us(lambda: eager(tensors)):6.2f}"
    run.eager = False  # the general path, piece by piece
    launches, raws = [], []
    real_run = recorded(cute_launcher, "_run", launches)
    real_raw = recorded(cute_launcher.SplitLaunch, "raw", raws)
    try:
        general = per_call_us(lambda: run(tensors))
        run(tensors)
    finally:
        cute_launcher._run, cute_launcher.SplitLaunch.raw = real_run, real_raw
        run.eager = eager
    kernel, raw, _ = launches[-1]
    fixed = run.split.fixed()
    per_call = [value for arg, value in zip(cute_launcher.launch_args.SPLIT_ARGS, raw) if arg.per_call]
    line += f"   fixed launch alone {per_call_us(lambda: fixed(*per_call)):6.2f}   general path {general:6.2f}"
    print(line)
    fast = cute_launcher._LAUNCHERS[kernel]
    packing = per_call_us(lambda: fast._struct.pack_into(fast._buf, 0, *raw))
    line = (f"    raw arguments {per_call_us(lambda: real_raw(*raws[0])):6.2f}   FastLauncher.launch "
            f"{per_call_us(lambda: fast.launch(*raw)):6.2f}   of which packing {packing:6.2f}")
    if fast._capi is not None:
        line += f" and the host function + cudaLaunchKernelEx {per_call_us(lambda: fast._capi(fast._packed)):6.2f}"
    print(line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, nargs="+", default=[4096])
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("host_breakdown: needs a CUDA GPU")
    for keys in args.keys:
        q = torch.randn(1, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(1, keys, 8, 128, device="cuda", dtype=torch.bfloat16)
        v, lens = torch.randn_like(k), torch.full((1,), keys, dtype=torch.int32, device="cuda")
        ones = torch.zeros(1, device="cuda")
        print(f"B = 1, {keys} keys, 32/8 heads, d = 128, bf16: host us per call")
        print(f"  torch.empty_like(q) {per_call_us(lambda: torch.empty_like(q)):6.2f}   "
              f"one torch kernel (x.add_(1)) {per_call_us(lambda: ones.add_(1)):6.2f}")
        from torch.nn.attention import SDPBackend, sdpa_kernel

        qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            sdpa = per_call_us(lambda: torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True))
        print(f"  SDPA cuDNN (enable_gqa=True) {sdpa:6.2f}")
        for backend in ("triton", "cute"):
            reference = flashsplit.decode(q, k, v, cache_seqlens=lens, backend=backend)
            tensors = DecodeTensors(q, k, v, torch.empty_like(q), None, lens)
            options = DecodeOptions(backend=backend)
            run = dispatch._PREPARED[dispatch.signature(tensors, options, True)]
            whole = per_call_us(lambda: flashsplit.decode(q, k, v, cache_seqlens=lens, backend=backend))
            key = per_call_us(lambda: dispatch.signature(tensors, options, True))
            print(f"  {backend}: decode() {whole:6.2f}   signature {key:6.2f}"
                  f"   prepared launcher {per_call_us(lambda: run(tensors)):6.2f} ({run.num_splits} splits)")
            if backend == "triton":
                triton_pieces(run, tensors, reference)
            else:
                cute_pieces(run, tensors)


if __name__ == "__main__":
    main()
