"""Compile the CuTe kernels once per static key (imports cutlass: load it lazily).

Kernels take raw pointers plus Int32/Int64 sizes and strides, so one compiled kernel serves
every batch size, length, head count, stride and split count of its key. The same function
compiles for a real launch and, with ``CUTE_DSL_ARCH=sm_90a`` on a CPU-only machine, for the
compile check (pointers are placeholders: compiling never dereferences them). The arguments
come from the kernels' schemas (:mod:`flashsplit.cute.launch_args`).
"""

from __future__ import annotations

import threading

import cutlass.cute as cute

from . import launch_args
from .combine_kernel import CombineKernel
from .configs import CombineConfig, SplitConfig, check_smem
from .split_kernel import SplitKVDecodeKernel

_CACHE: dict[object, object] = {}
_LOCK = threading.Lock()


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
    args = launch_args.cute_args(launch_args.SPLIT_ARGS, launch_args.split_elements(config))
    return _compile(config, SplitKVDecodeKernel(config), args, options)


def compile_combine(config: CombineConfig, options: str | None = None):
    """The compiled combine kernel for ``config`` (cached unless ``options`` are given)."""
    if options is None and config in _CACHE:
        return _CACHE[config]
    args = launch_args.cute_args(launch_args.COMBINE_ARGS, launch_args.combine_elements(config))
    return _compile(config, CombineKernel(config), args, options)


def cache_size() -> int:
    """How many kernels are compiled (tests check that new shapes do not add any)."""
    return len(_CACHE)
