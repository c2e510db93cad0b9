"""Compile the CuTe kernels once per static key (imports cutlass: load it lazily).

Kernels take raw pointers plus Int32/Int64 sizes and strides, so one compiled kernel serves
every batch size, length, head count, stride and split count of its key. The same function
compiles for a real launch and, with ``CUTE_DSL_ARCH=sm_90a`` on a CPU-only machine, for the
compile check (pointers are placeholders: compiling never dereferences them).
"""

from __future__ import annotations

import threading

import cutlass
import cutlass.cute as cute
from cutlass.cute.runtime import make_fake_stream, make_ptr

from .combine_kernel import CombineKernel
from .configs import CombineConfig, SplitConfig, check_smem
from .split_kernel import SplitKVDecodeKernel

_CACHE: dict[object, object] = {}
_LOCK = threading.Lock()


def cutlass_dtype(name: str):
    return {
        "float16": cutlass.Float16, "bfloat16": cutlass.BFloat16, "float32": cutlass.Float32,
        "float8_e4m3fn": cutlass.Float8E4M3FN, "float8_e5m2": cutlass.Float8E5M2,
    }[name]


def _ptr(dtype, align: int = 16):
    return make_ptr(dtype, 16, cute.AddressSpace.gmem, assumed_align=align)


def _compile(config, kernel, args: tuple, options: str | None):
    """``cute.compile`` on placeholder arguments; the result is cached by ``config`` unless
    ``options`` (e.g. PTX dumps for the compile check) ask for a one-off build."""
    if options:
        return cute.compile(kernel, *args, options=options)
    compiled = cute.compile(kernel, *args)
    with _LOCK:
        _CACHE[config] = compiled
    return compiled


def compile_split(config: SplitConfig, options: str | None = None):
    """The compiled split kernel for ``config`` (cached unless ``options`` are given)."""
    if options is None and config in _CACHE:
        return _CACHE[config]
    check_smem(config)
    kernel = SplitKVDecodeKernel(config)
    dt = cutlass_dtype(config.dtype)
    out_dt = cutlass.Float32 if config.write_partials else dt
    kv_dt = dt if config.kv_dtype == "same" else cutlass_dtype(config.kv_dtype)
    i32, i64 = cutlass.Int32(1), cutlass.Int64(1)
    args = (
        _ptr(dt), _ptr(kv_dt), _ptr(kv_dt), _ptr(out_dt), _ptr(cutlass.Float32, 4), _ptr(cutlass.Int32, 4),
        _ptr(cutlass.Int32, 4),  # block_table (read only by a paged config)
        i32, i32, i32, i32, i32, i32,  # batch, seqlen_q, seqlen_k, heads, heads_kv, splits
        i32, i32, i32, i64,  # cache rows, cache len, max pages, block_table row stride
        i64, i64, i64, i64, i64, i64, i64, i64, i64,  # q, k, v strides (b, l, h)
        i64, i64, i64, i64,  # out strides (split, b, l, h)
        cutlass.Float32(1.0),
        _ptr(cutlass.Float32, 4), _ptr(cutlass.Float32, 4),  # k/v descales (read only by fp8 configs)
        i64, i64, i64, i64,  # k_descale strides (b, h), v_descale strides (b, h)
        _ptr(dt), _ptr(cutlass.Float32, 4), _ptr(cutlass.Int32, 4),  # merge: out, lse, arrival counters
        i64, i64, i64,  # merge: out strides (b, l, h)
        make_fake_stream(),
    )
    return _compile(config, kernel, args, options)


def compile_combine(config: CombineConfig, options: str | None = None):
    """The compiled combine kernel for ``config`` (cached unless ``options`` are given)."""
    if options is None and config in _CACHE:
        return _CACHE[config]
    kernel = CombineKernel(config)
    dt = cutlass_dtype(config.dtype)
    i32, i64 = cutlass.Int32(1), cutlass.Int64(1)
    args = (
        _ptr(cutlass.Float32), _ptr(cutlass.Float32, 4), _ptr(dt), _ptr(cutlass.Float32, 4),
        i32, i32, i32, i32,  # splits, batch, seqlen_q, heads
        i64, i64, i64, i64,  # out_partial strides (split, b, l, h)
        i64, i64, i64, i64,  # lse_partial strides (split, b, h, l)
        i64, i64, i64,  # out strides (b, l, h)
        make_fake_stream(),
    )
    return _compile(config, kernel, args, options)


def cache_size() -> int:
    """How many kernels are compiled (tests check that new shapes do not add any)."""
    return len(_CACHE)
