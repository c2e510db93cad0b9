"""The portable Triton backend (split kernel + combine kernel).

With no CUDA device the kernels run through the Triton interpreter, so flashsplit and its tests
work on a CPU-only machine. The interpreter is chosen when the kernels are defined, so
``TRITON_INTERPRET`` is set here, before the kernel modules are imported.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def interpreter_active() -> bool:
    """Whether this process's Triton kernels run through the CPU interpreter."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
