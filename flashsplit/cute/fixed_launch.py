"""Launches of one compiled CuTe function whose static arguments are packed once.

:class:`~flashsplit.cute.fastcall.FastLauncher` packs every argument on every launch: about 50
values for the split kernel, most of them sizes and strides that a prepared decode never
changes. :func:`fixed_launch` packs those once into slots of its own and returns a ``launch``
that packs only the per-call values (addresses, the stream) into a second, contiguous block.
Its own ``void*[]`` points each argument at its slot in one block or the other, followed by the
bound executor's extra entries, with a CUDA result slot of its own; a lock of its own covers
pack and call, so several fixed launches of one compiled function run side by side.

``launch.raw`` gives the same launch's addresses to a native caller, which then fills the
per-call slots (8 bytes each, in argument order) and calls the host function itself.

Pointers are not alignment-checked here: the caller (the eager path of a prepared decode) only
passes addresses whose residues mod 16 its call signature fixes, and its first launch went
through the checking :class:`FastLauncher`.
"""

from __future__ import annotations

import ctypes
import struct
import threading
from collections.abc import Callable, Sequence
from typing import Any

from .fastcall import _SLOT, FastLauncher, _raise_cuda


def fixed_launch(launcher: FastLauncher, values: Sequence[Any], per_call: Sequence[bool]) -> Callable[..., None] | None:
    """``launch(*per_call_values)`` for ``launcher``'s compiled function, with every argument
    ``i`` where ``per_call[i]`` is false fixed to the raw ``values[i]`` (plain ints / floats, the
    form :meth:`FastLauncher.launch` takes; the per-call entries of ``values`` are ignored).
    ``per_call_values`` are the remaining raw values, in argument order. None where the
    launcher has no bound host function yet (its first launch binds it) or is not on its fast
    path."""
    if not launcher.fast or launcher._capi is None or launcher._packed is None:
        return None
    slots = launcher._slots
    if len(values) != len(slots) or len(per_call) != len(slots):
        raise ValueError(f"{len(values)} values and {len(per_call)} flags for {len(slots)} arguments")
    fixed_index = [i for i, p in enumerate(per_call) if not p]
    call_index = [i for i, p in enumerate(per_call) if p]
    fixed_struct = struct.Struct("=" + "".join(slots[i].code for i in fixed_index))
    call_struct = struct.Struct("=" + "".join(slots[i].code for i in call_index))
    fixed_block = (ctypes.c_uint64 * max(1, len(fixed_index)))()
    call_block = (ctypes.c_uint64 * max(1, len(call_index)))()
    fixed_struct.pack_into(fixed_block, 0, *(values[i] for i in fixed_index))
    entries = list(launcher._packed)
    for block, indices in ((fixed_block, fixed_index), (call_block, call_index)):
        base = ctypes.addressof(block)
        for slot, i in enumerate(indices):
            entries[i] = base + _SLOT * slot
    result = ctypes.c_int32(0)
    n = len(slots)
    if len(entries) > n and entries[n] == ctypes.addressof(launcher._result):
        entries[n] = ctypes.addressof(result)  # the CUDA result slot: one per fixed launch
    packed = (ctypes.c_void_p * len(entries))(*entries)
    pack, capi, lock = call_struct.pack_into, launcher._capi, threading.Lock()
    keep = (fixed_block, call_block, packed, result, launcher)  # what the void*[] points into

    def launch(*per_call_values: Any) -> None:
        with lock:
            pack(call_block, 0, *per_call_values)
            capi(packed)
            rc = result.value
        if rc:
            result.value = 0
            _raise_cuda(rc)

    launch.keep = keep  # type: ignore[attr-defined]
    #: (host function, its void*[], the per-call slots, the CUDA result slot): addresses for a
    #: native caller (:class:`flashsplit.native.HostStep`), which fills the slots itself.
    launch.raw = (ctypes.cast(capi, ctypes.c_void_p).value, ctypes.addressof(packed),  # type: ignore[attr-defined]
                  ctypes.addressof(call_block), ctypes.addressof(result))
    launch.per_call_codes = tuple(slots[i].code for i in call_index)  # type: ignore[attr-defined]
    return launch
