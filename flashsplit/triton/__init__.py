"""The portable Triton backend (split kernel + combine kernel).

With no CUDA device the kernels run through the Triton interpreter, so flashsplit and its tests
work on a CPU-only machine.

The interpreter is a process-wide mode of Triton, so it cannot be confined to flashsplit's
kernels: ``@triton.jit`` reads ``TRITON_INTERPRET`` when it decorates a function, and
``triton.language``'s own library functions (``tl.max``, ``tl.sum``, ``tl.cdiv``) are decorated
once, when triton is first imported. An interpreted kernel can only call interpreted library
functions, and the modules triton imports at a kernel's first launch (gluon's standard library)
assert that the variable is still set whenever those functions are interpreted (triton 3.6 and
3.9 alike). So when there is no CUDA device and ``TRITON_INTERPRET`` is unset, importing
flashsplit sets ``TRITON_INTERPRET=1`` for the process, before triton is imported. It says so
once, when it first runs a kernel on CPU tensors (:func:`warn_interpreter_once`), since only then
does the choice show: the user's own Triton kernels are interpreted too. A process that never
decodes on the CPU, and flashsplit's own command line (which runs no other Triton code), hear
nothing. A ``TRITON_INTERPRET`` the user set is left as it is; setting it (to 1 or to 0) also
silences the warning.
"""

from __future__ import annotations

import os
import sys
import warnings

import torch

INTERPRET_VAR = "TRITON_INTERPRET"

INTERPRETER_WARNING = (
    f"flashsplit: running its Triton kernels on the CPU through the Triton interpreter, which importing "
    f"flashsplit chose for this process ({INTERPRET_VAR}=1; no CUDA device). The interpreter is process-wide: "
    f"your own Triton kernels run through it too. Set {INTERPRET_VAR} before importing flashsplit to choose "
    "yourself (and silence this warning).")

INTERPRETER_OFF = (f"the Triton interpreter is off for flashsplit's kernels: set {INTERPRET_VAR}=1 (or leave it "
                   "unset) before triton is first imported, e.g. by importing flashsplit first")


def _flashsplit_command_line() -> bool:
    """Whether this process is flashsplit's own command line (``python -m flashsplit...`` or the
    ``flashsplit`` script), which runs no other Triton code: no one to warn."""
    argv, orig_argv = getattr(sys, "argv", []), getattr(sys, "orig_argv", [])
    if argv[:1] == ["-m"] and "-m" in orig_argv[:-1]:  # a module run with -m, being imported
        return orig_argv[orig_argv.index("-m") + 1].split(".")[0] == "flashsplit"
    return bool(argv) and os.path.basename(argv[0]) == "flashsplit"


def _choose_interpreter() -> bool:
    """Set ``TRITON_INTERPRET=1`` when the kernels need the interpreter and the user has not
    chosen; not once triton is imported, since its library is compiled by then. Returns whether
    the user is to be told (:func:`warn_interpreter_once`)."""
    if INTERPRET_VAR in os.environ or torch.cuda.is_available() or "triton.language" in sys.modules:
        return False
    os.environ[INTERPRET_VAR] = "1"
    return not _flashsplit_command_line()


_warning_due = _choose_interpreter()


def warn_interpreter_once() -> None:
    """Warn, the first time only, that flashsplit chose the interpreter for this process (if it
    did, outside its own command line); the launchers call it before a kernel runs on CPU tensors."""
    global _warning_due
    if _warning_due:
        _warning_due = False
        # Attributed to the first caller outside flashsplit (the user's decode call).
        level, frame = 2, sys._getframe(1)
        while frame is not None and frame.f_globals.get("__name__", "").split(".")[0] == "flashsplit":
            level, frame = level + 1, frame.f_back
        warnings.warn(INTERPRETER_WARNING, UserWarning, stacklevel=level)

import triton.language as tl  # noqa: E402  (after the interpreter is chosen)
from triton.runtime import JITFunction  # noqa: E402

from .split_kernel import split_kv_kernel  # noqa: E402


# Both flashsplit's kernels and the triton.language library they call must be interpreted
# functions (decided when each was defined, so once per process).
_INTERPRETED = not isinstance(split_kv_kernel, JITFunction) and not isinstance(tl.max, JITFunction)


def interpreter_active() -> bool:
    """Whether flashsplit's Triton kernels run through the CPU interpreter."""
    return _INTERPRETED

