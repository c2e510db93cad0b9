"""flashsplit's native host step: a repeated eager ``decode()`` checked and launched in C++.

An eager decode step of a signature already seen spends most of its host time in Python:
reading each tensor's shape, strides, dtype, device and alignment to find the signature
(about 3 us on an H200 host), allocating the output, gathering addresses and packing them for
the launch. :class:`HostStep` (``host_step.cpp``) does that for one prepared signature in a
single native call: :func:`flashsplit.decode` offers each call to the last signature's step
first, and runs the Python path whenever the step declines (any fact or option differs, a CUDA
graph is being captured, ...), so results and errors never depend on it.

The extension is built on first use with ``torch.utils.cpp_extension`` (a C++ compiler and
ninja; about 10 s, cached under ``TORCH_EXTENSIONS_DIR``, by default
``~/.cache/torch_extensions``, per torch version). Where it cannot be built, or with
``FLASHSPLIT_NATIVE=0``, every call takes the Python path; :func:`status` says which and why.
"""

from __future__ import annotations

import os
import re
import sys
import threading
import time

import torch

#: The arguments a :class:`HostStep` is called with, in order (after them, the options of
#: :class:`flashsplit.call.DecodeOptions`, in field order).
STEP_ARGS = ("q", "k_cache", "v_cache", "out", "cache_seqlens", "block_table", "page_table", "k_descale",
             "v_descale", "sinks", "k", "v", "rotary_cos", "rotary_sin", "cache_batch_idx", "cache_leftpad",
             "return_lse")

#: Where a per-call launch value comes from (``host_step.cpp``'s ``SourceKind``).
CONST, TENSOR, WORKSPACE, COUNTERS, STREAM = range(5)

_SOURCE = os.path.join(os.path.dirname(__file__), "host_step.cpp")
_STALE_LOCK_S = 300  # a build lock older than this was left by a killed build
_lock = threading.Lock()
_module = None
_reason = "not built yet"


def enabled() -> bool:
    """Whether the native host step may be used (``FLASHSPLIT_NATIVE=0`` turns it off)."""
    return os.environ.get("FLASHSPLIT_NATIVE", "1") != "0"


def module():
    """The built extension module, or None (then :func:`status` says why). Builds it on the
    first call."""
    global _module, _reason
    if _module is not None or not enabled():
        return _module
    with _lock:
        if _module is None and _reason == "not built yet":
            try:
                _module = _build()
                _reason = ""
            except Exception as e:  # noqa: BLE001  (no compiler, no ninja, a header mismatch, ...)
                _reason = f"build failed: {type(e).__name__}: {str(e).strip().splitlines()[-1] if str(e).strip() else ''}"
    return _module


def status() -> str:
    """"ready", "off (FLASHSPLIT_NATIVE=0)", "not built yet" or why the build failed."""
    if not enabled():
        return "off (FLASHSPLIT_NATIVE=0)"
    return "ready" if _module is not None else _reason


def _build():
    from torch.utils.cpp_extension import get_default_build_root, load

    # One build directory per Python and torch version: the module links against torch's libraries.
    tag = re.sub(r"[^0-9A-Za-z]", "_", f"py{sys.version_info[0]}{sys.version_info[1]}_torch{torch.__version__}")
    directory = os.path.join(get_default_build_root(), f"flashsplit_host_step_{tag}")
    os.makedirs(directory, exist_ok=True)
    # torch's build waits on this lock file while another process builds; one left behind by a
    # killed build would make it wait forever (a build takes about 10 s).
    lock = os.path.join(directory, "lock")
    if os.path.exists(lock) and time.time() - os.path.getmtime(lock) > _STALE_LOCK_S:
        os.remove(lock)
    return load("flashsplit_host_step", [_SOURCE], extra_cflags=["-O2", "-std=c++17"], build_directory=directory,
                is_python_module=True, verbose=False)
