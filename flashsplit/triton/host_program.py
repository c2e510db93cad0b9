"""The eager replay of a prepared Triton decode as a native host program.

:class:`~flashsplit.triton.backend.PreparedDecode` replays its launches with each call's
addresses; :func:`host_program` writes the same launches as data for
:class:`flashsplit.native.HostStep`: each launch packed for ``cuLaunchKernelEx``
(:mod:`~flashsplit.triton.driver_launch`), and for each of its per-call slots where the value
comes from (a tensor of the call, the stream's workspace or arrival counters, the stream). The
step declines, and the Python path runs, while a CUDA graph is being captured or a Triton launch
hook is set (a profiler's hooks see launches through Triton's own path only).
"""

from __future__ import annotations

import ctypes

from ..call import DecodeTensors
from ..workspace import _capturing, _raw_stream
from .driver_launch import driver_launch, libcuda
from .launch import launch_hooks_set


def capturing_or_hooked() -> bool:
    """Whether the native step must decline: the current stream is capturing a CUDA graph, or a
    Triton launch enter/exit hook is set (an unknown hook object counts as set)."""
    return bool(_capturing() or launch_hooks_set())


def raise_driver_error(code: int) -> None:
    """Raise what Triton's launcher raises for a failed ``cuLaunchKernelEx``."""
    name = ctypes.c_char_p()
    try:
        libcuda().cuGetErrorName(code, ctypes.byref(name))
    except AttributeError:  # no library (None), or no such entry point
        pass
    text = name.value.decode() if name.value else f"CUresult {code}"
    raise RuntimeError(f"Triton Error [CUDA]: {text}")


def host_program(prepared, tensors: DecodeTensors):
    """``prepared``'s replay of calls like ``tensors`` (one call of its signature, after its first
    launch) as a :class:`~flashsplit.native.steps.HostProgram`, or None where it has none (no
    native module, no CUDA, a launch this packing does not reproduce, a launch compiled on
    another device than the tensors')."""
    from .. import native
    from ..native import COUNTERS, STREAM, TENSOR, WORKSPACE
    from ..native.steps import HostProgram

    module = native.module()
    q = tensors.q
    if module is None or _raw_stream is None or prepared.split is None or prepared.split.device != q.get_device():
        return None
    host_function = module.driver_launch_address()

    def field(name: str):
        return None if getattr(tensors, name) is None else (TENSOR, DecodeTensors._fields.index(name), 0)

    seqlens, out, lse, sinks, leftpad = (field(n) for n in ("cache_seqlens", "out", "lse", "sinks", "cache_leftpad"))
    rows = (leftpad, field("cache_batch_idx"), field("rotary_cos"), field("rotary_sin"), field("k_new"), field("v_new"))
    inputs = (field("q"), field("k_cache"), field("v_cache"), seqlens, field("block_table"), field("k_descale"),
              field("v_descale"))
    batch, seqlen_q, num_heads, _ = q.shape
    workspace_numel = counter_count = 0
    if prepared.num_splits == 1:
        pointers = [(prepared.split, (*inputs, None, None, out, lse, None, sinks, *rows))]
    else:
        workspace_numel, lse_offset = prepared.partials_layout(q)
        op, lp = (WORKSPACE, 0, 0), (WORKSPACE, 0, lse_offset)
        if prepared.merge:
            counter_count = batch * seqlen_q * num_heads  # ArrivalCounters.address_for's bound
            pointers = [(prepared.split, (*inputs, op, lp, out, lse, (COUNTERS, 0, 0), sinks, *rows))]
        else:
            pointers = [(prepared.split, (*inputs, op, lp, out, lse, None, sinks, *rows)),
                        (prepared.combine, (op, lp, seqlens, out, lse, sinks, leftpad))]
    launches = []
    for relaunch, sources in pointers:
        launch = None if relaunch is None else driver_launch(relaunch, host_function)
        # The compiled signature's parameters are exactly the given pointers (None ones are constexpr).
        if (launch is None or launch.num_pointers != len(sources)
                or launch.live != tuple(i for i, s in enumerate(sources) if s is not None)):
            return None
        launches.append((launch, (*(sources[i] for i in launch.live), (STREAM, 0, 0))))
    return HostProgram(q.get_device(), _raw_stream, capturing_or_hooked, prepared.backend.workspace.addresses,
                       prepared.backend.arrivals.addresses, workspace_numel, counter_count, launches,
                       raise_driver_error)

