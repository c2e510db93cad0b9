"""One Triton kernel launch as data for the native host step: ``cuLaunchKernelEx`` on packed
parameters.

The native step (:mod:`flashsplit.native`) launches through host functions ``void fn(void**)``.
Triton's compiled kernels have none, so :func:`driver_launch` packs a
:class:`~flashsplit.triton.launch.Relaunch` for ``host_step.cpp``'s ``flashsplit_driver_launch``,
which copies the stream into the launch config and calls ``cuLaunchKernelEx``. The kernel's
parameters are what triton 3.6's launcher passes: the non-constexpr arguments in order (an
absent pointer argument is a constexpr None and takes no parameter), then its two scratch
pointers (null: only kernels that need no scratch are packed). Each fixed value is packed once;
the live pointers and the stream are per-call slots, which the step fills before each launch.
"""

from __future__ import annotations

import ctypes
import functools
import struct

#: CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION: a programmatic dependent launch.
PDL_ATTRIBUTE = 6

#: struct codes of the scalar types in a Triton signature.
_CODES = {"i1": "b", "i8": "b", "i16": "h", "i32": "i", "i64": "q", "u1": "B", "u8": "B", "u16": "H",
          "u32": "I", "u64": "Q", "fp32": "f", "f32": "f", "fp64": "d", "f64": "d"}


class LaunchAttribute(ctypes.Structure):
    """``CUlaunchAttribute``: an id and a 64-byte value union."""

    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_char * 64)]


class LaunchConfig(ctypes.Structure):
    """``CUlaunchConfig``."""

    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3), ("shared", ctypes.c_uint),
                ("stream", ctypes.c_void_p), ("attrs", ctypes.POINTER(LaunchAttribute)), ("num_attrs", ctypes.c_uint)]


assert LaunchConfig.stream.offset == 32  # host_step.cpp's kConfigStreamOffset


@functools.lru_cache(maxsize=1)
def libcuda() -> ctypes.CDLL | None:
    """The CUDA driver library, or None where it is absent."""
    try:
        return ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None


@functools.lru_cache(maxsize=1)
def launch_kernel_ex() -> int | None:
    """The address of the driver's ``cuLaunchKernelEx``, or None where libcuda is absent."""
    try:
        return ctypes.cast(libcuda().cuLaunchKernelEx, ctypes.c_void_p).value
    except AttributeError:  # no library (None), or a driver without the entry point
        return None


class DriverLaunch:
    """A packed launch (see the module docstring). ``raw``: (host function, its ``void*[]``, the
    per-call slots, the int32 result), the addresses the native step takes; ``num_pointers``:
    the kernel's pointer arguments; ``live``: those that are kernel parameters (by position),
    whose addresses fill the first per-call slots, the stream the last; ``per_call_codes``: each
    per-call slot's struct code."""

    def __init__(self, function: int, grid: tuple[int, int, int], block: int, shared: int, pdl: bool,
                 num_pointers: int, live: tuple[int, ...], values: list[tuple[str, object]], launch_ex: int,
                 host_function: int):
        self.num_pointers = num_pointers
        self.live = live
        self.per_call_codes = "Q" * (len(live) + 1)
        self._slots = (ctypes.c_uint64 * (len(live) + 1))()
        self._values = ctypes.create_string_buffer(8 * (len(values) + 2))  # then the two null scratch pointers
        for i, (code, value) in enumerate(values):
            struct.pack_into("<" + code, self._values, 8 * i, value)
        slots, fixed = ctypes.addressof(self._slots), ctypes.addressof(self._values)
        self._params = (ctypes.c_void_p * (len(live) + len(values) + 2))(
            *[slots + 8 * i for i in range(len(live))], *[fixed + 8 * i for i in range(len(values) + 2)])
        self._attrs = (LaunchAttribute * 1)()
        if pdl:
            self._attrs[0].id = PDL_ATTRIBUTE
            ctypes.memmove(ctypes.addressof(self._attrs[0]) + LaunchAttribute.value.offset, struct.pack("<i", 1), 4)
        self._config = LaunchConfig((grid[0], grid[1], grid[2]), (block, 1, 1), shared, None, self._attrs, int(pdl))
        self._result = ctypes.c_int32(0)
        self._packed = (ctypes.c_void_p * 6)(launch_ex, function, ctypes.addressof(self._params),
                                             ctypes.addressof(self._config), slots + 8 * len(live),
                                             ctypes.addressof(self._result))
        self.raw = (host_function, ctypes.addressof(self._packed), slots, ctypes.addressof(self._result))


def driver_launch(relaunch, host_function: int, launch_ex: int | None = None) -> DriverLaunch | None:
    """``relaunch`` packed for ``host_function`` (``flashsplit_driver_launch``'s address), or None
    where its kernel is not one this packing reproduces (more than one CTA per program, a
    cooperative grid, scratch memory, a signature type it does not know, no driver)."""
    launch_ex = launch_ex or launch_kernel_ex()
    compiled, tail = relaunch.compiled, relaunch.tail
    metadata = compiled.metadata
    signature = getattr(getattr(compiled, "src", None), "signature", None)
    if (launch_ex is None or not isinstance(signature, dict) or getattr(metadata, "num_ctas", 1) != 1
            or getattr(metadata, "launch_cooperative_grid", True) or getattr(metadata, "global_scratch_size", 1)
            or getattr(metadata, "profile_scratch_size", 1)):
        return None
    types = list(signature.values())
    num_pointers = len(types) - len(tail)
    if num_pointers < 0:
        return None
    live = tuple(i for i in range(num_pointers) if types[i] != "constexpr")
    if not all(types[i].startswith("*") for i in live):
        return None
    values = []
    for kind, value in zip(types[num_pointers:], tail):
        if kind == "constexpr":
            continue
        if kind not in _CODES:
            return None
        values.append((_CODES[kind], value))
    grid = relaunch.grid
    if min(grid) <= 0:
        return None
    return DriverLaunch(compiled.function, grid, 32 * metadata.num_warps, metadata.shared,
                        bool(getattr(metadata, "launch_pdl", False)), num_pointers, live, values, launch_ex,
                        host_function)
