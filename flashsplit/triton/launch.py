"""Launch a Triton kernel once through Triton, then replay that launch with new tensors cheaply.

``fn[grid](*args)`` binds and specializes every argument on every call (each integer is tested
for divisibility by 16, each tensor for alignment, then a cache key is hashed): tens of
microseconds for the split kernel's ~60 arguments. A decode step of a fixed configuration
changes only the tensors' addresses; the caller (:mod:`flashsplit.api`) caches by everything
Triton specializes on (shapes, strides, dtypes, 16-byte alignment), so the compiled kernel can
be called directly with the new tensors. Relies on triton 3.6's ``CompiledKernel.run``
signature (checked here; other versions take Triton's own path every call).
"""

from __future__ import annotations

from typing import Sequence

import torch
import triton

from ..workspace import _raw_stream
from . import interpreter_active, warn_interpreter_once

_RUN_SIGNATURE_VERSIONS = ("3.6.",)  # CompiledKernel.run(gx, gy, gz, stream, function, packed_metadata,
#                                      launch_metadata, enter_hook, exit_hook, *args)


def fast_relaunch_available() -> bool:
    return not interpreter_active() and triton.__version__.startswith(_RUN_SIGNATURE_VERSIONS)


def current_stream(device: int) -> int:
    """The raw handle of ``device``'s current torch stream (a cheap call)."""
    return _raw_stream(device)


class Relaunch:
    """The launch of one compiled kernel with its grid and non-tensor arguments fixed.

    ``self(pointers)`` launches it on the current stream with ``pointers`` as the leading
    arguments (the kernels list their pointers first): device addresses as ints, None where the
    first launch had None. Ints spare Triton's launcher a ``data_ptr()`` call and a
    ``cuPointerGetAttribute`` per pointer. The caller guarantees that the tensors behind them
    match the first launch's in device, dtype, shape, strides and 16-byte alignment.
    """

    __slots__ = ("_compiled", "_device", "_grid", "_head", "_launch", "_run", "_tail", "_via_run")

    def __init__(self, compiled, grid: tuple[int, int, int], tail: Sequence, device: int):
        self._compiled = compiled
        self._run = compiled.run
        self._grid = grid
        self._tail = tuple(tail)
        self._device = device
        function, packed = compiled.function, compiled.packed_metadata
        # What follows the stream in Triton's own launch (CompiledKernel.run's arguments, no
        # launch metadata, no hooks), built once: a launch adds only the stream and the pointers.
        self._via_run = (function, packed, None, None, None)
        # A kernel that needs no scratch memory can skip the Python CudaLauncher.__call__ wrapper
        # (it only allocates scratch) and call the C launcher directly, whose arguments in
        # triton 3.6 are (gx, gy, gz, stream, function, cooperative, pdl, global_scratch,
        # profile_scratch, kernel_metadata, launch_metadata, enter_hook, exit_hook, *args).
        run = self._run
        self._launch, self._head = run, self._via_run
        if (getattr(run, "global_scratch_size", 1) == 0 and getattr(run, "profile_scratch_size", 1) == 0
                and callable(getattr(run, "launch", None))):
            self._launch = run.launch
            self._head = (function, run.launch_cooperative_grid, run.launch_pdl, None, None, packed, None, None, None)

    @property
    def device(self) -> int:
        """The CUDA device index the launch was compiled and first launched on."""
        return self._device

    @property
    def compiled(self):
        """The compiled kernel (triton's ``CompiledKernel``)."""
        return self._compiled

    @property
    def grid(self) -> tuple[int, int, int]:
        return self._grid

    @property
    def tail(self) -> tuple:
        """The fixed arguments after the pointers, constexprs included."""
        return self._tail

    def __call__(self, pointers: Sequence[int | None], stream: int | None = None) -> None:
        """Launch on ``stream`` (a raw handle of this launch's device; default: its current stream)."""
        if stream is None:
            stream = current_stream(self._device)
        enter, leave = _RUNTIME_KNOBS.launch_enter_hook, _RUNTIME_KNOBS.launch_exit_hook
        if getattr(enter, "calls", True) or getattr(leave, "calls", True):  # launch_hooks_set(), inline here
            enter, leave = _active_hooks()
            if enter is not None or leave is not None:  # a profiler's hooks: Triton's own path, with the launch metadata
                args = (*pointers, *self._tail)
                metadata = self._compiled.launch_metadata(self._grid, stream, *args)
                gx, gy, gz = self._grid
                self._run(gx, gy, gz, stream, self._via_run[0], self._via_run[1], metadata, enter, leave, *args)
                return
        self._launch(*self._grid, stream, *self._head, *pointers, *self._tail)


_RUNTIME_KNOBS = triton.knobs.runtime


def launch_hooks_set() -> bool:
    """Whether a Triton launch enter or exit hook is registered (an unknown hook object counts
    as set)."""
    return bool(getattr(_RUNTIME_KNOBS.launch_enter_hook, "calls", True)
                or getattr(_RUNTIME_KNOBS.launch_exit_hook, "calls", True))


def _active_hooks():
    """Triton's launch enter/exit hooks, or (None, None) when none is registered.

    triton 3.6 keeps them as ``HookChain`` objects that are never None, so its own launch path
    builds the launch metadata (a dict over the ~60 arguments) and calls both empty chains on
    every launch; the C launcher skips a None hook, so an empty chain is passed as None.
    """
    if launch_hooks_set():
        return _RUNTIME_KNOBS.launch_enter_hook, _RUNTIME_KNOBS.launch_exit_hook
    return None, None


def strides_or_zeros(t: torch.Tensor | None, dims: int) -> tuple[int, ...]:
    """The first ``dims`` strides of ``t``, or zeros where a kernel's tensor is absent."""
    return tuple(t.stride()[:dims]) if t is not None else (0,) * dims


def descale_strides(scale: torch.Tensor | None) -> tuple[int, int]:
    """(row, KV head) strides of an fp8 descale: 0, 0 for one scale for the whole cache (or none)."""
    return (0, 0) if scale is None or scale.numel() == 1 else tuple(scale.stride())


def launch(fn, grid: tuple[int, int, int], tensors: Sequence, tail: Sequence, options: dict) -> Relaunch | None:
    """``fn[grid](*tensors, *tail, **options)``; returns a :class:`Relaunch` of it, or None where
    replaying is not possible (the interpreter, another triton version)."""
    # Once per process, if flashsplit chose the interpreter for the user: the first kernel it runs.
    warn_interpreter_once()
    compiled = fn[grid](*tensors, *tail, **options)
    if compiled is None or not fast_relaunch_available():
        return None
    return Relaunch(compiled, grid, tail, torch.cuda.current_device())
