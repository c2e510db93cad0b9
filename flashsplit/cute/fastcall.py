"""Cheap repeated launches of an already-compiled CuTe DSL function (no TVM-FFI needed).

``compiled(*args)`` (a ``CudaDialectJitCompiledFunction`` from ``cute.compile``) spends tens of
microseconds per call in Python: every ``make_ptr`` / ``Int32(...)`` wrapper is an object with
its own ctypes storage, ``ExecutionArgs.generate_execution_args`` walks the arguments and
allocates a fresh ctypes value per scalar, and ``JitExecutor._get_invoke_packed_args`` copies
every address into a ``void*[]`` before the ctypes call of the host launch function.

:class:`FastLauncher` does that work once. It owns one ``8 * n`` byte buffer (one 8-byte slot
per runtime argument) and a ``void*[]`` that points at those slots, followed by the same extra
entries the library's executor appends (the address of a ``int32`` CUDA result, then kernel
handles if any). A launch is then ``struct.pack_into`` of the raw values into the buffer plus
one ctypes call of the compiled host function, which builds the TMA descriptors and launches
exactly as it does for ``compiled(*args)``. The kernel ABI is never touched (the host function
does the launch): a lower-level entry is called with pre-built execution arguments whose values
are updated in place.

Internals relied on (cutlass-dsl 4.8.1; checked at construction, otherwise the launcher falls
back to ``compiled(*args)``):

* ``compiled.execution_args`` (``ExecutionArgs``): ``_meta.arg_count``,
  ``_meta.annotated_types`` and ``generate_execution_args(args, kwargs) -> (exe_args, keep)``,
  where ``exe_args[i]`` is the address of the C value of argument ``i`` (one per argument for
  pointers, numeric scalars and CUDA streams). Construction compares the bytes at those
  addresses with the launcher's own slots for the example arguments and refuses on any
  difference.
* ``compiled.run_compiled_program(exe_args)``: used for the first launch (it loads the CUDA
  library and creates ``compiled._default_executor``).
* ``JitExecutor``: ``_get_invoke_packed_args(exe_args)`` (the ``void*[]`` layout, copied once),
  ``_num_extra_args``, ``_has_cuda_result``, ``_cuda_result_addr``, ``jit_module.capi_func``
  (the ctypes host function, called as ``capi_func(void**)``; it writes a ``cudaError_t`` to
  the result slot). If these are missing, launches go through
  ``executor.run_compiled_program(prebuilt_addresses)`` instead (still no argument conversion).
* ``compiled.total_added_arguments == 0`` and ``compiled._pyir_spec is None`` (no workspace
  arguments, no PyIR re-entry validation), debug-mode argument checks off, and the class's
  ``__call__`` / ``run_compiled_program`` being the native ones (not TVM-FFI).
* ``compiled.ir_module`` / ``function_name`` (optional, :func:`host_signature`): the host
  entry's LLVM parameter types and ``llvm.align``; when readable, every slot is checked against
  it (pointer vs scalar, scalar size) and pointers are alignment-checked against the compiled
  assumption (``abi_checked``).

Differences from ``compiled(*args)``: integers out of range of their slot raise ``struct.error``
(the library wraps Int32 values silently); pointer alignment (``assumed_align`` of the example
``make_ptr``) is checked with one OR per alignment class (``check_alignment=False`` skips it).
``FastLauncher.from_raw(compiled, raw)`` builds the example from one raw tuple.
``FLASHSPLIT_CUTE_FASTCALL=0`` forces the fallback. A launcher is thread-safe (a lock covers
pack + call); use one launcher per compiled function, for every launch of it.
"""

from __future__ import annotations

import ctypes
import os
import struct
import threading
import types
from collections.abc import Callable, Sequence
from typing import Any

#: cutlass-dsl versions whose internals this module was written against. Other versions still
#: take the fast path when the construction checks pass (``FastLauncher.version_tested`` says).
TESTED_VERSIONS = ("4.8.1",)
_SLOT = 8  # bytes per argument slot (every supported C value fits and is naturally aligned)


class _Unsupported(Exception):
    pass


class _Slot:
    """How one runtime argument is stored: struct code (padded to 8 bytes), value size, pointer
    alignment to check, and a Python expression turning a call argument ``{a}`` (cutlass object
    or raw value) into the raw value."""

    __slots__ = ("align", "code", "expr", "kind", "size")

    def __init__(self, kind: str, code: str, size: int, align: int, expr: str) -> None:
        self.kind, self.code, self.size, self.align, self.expr = kind, code, size, align, expr


_INT_CODES = {(1, True): "?", (8, True): "b", (8, False): "B", (16, True): "h", (16, False): "H",
              (32, True): "i", (32, False): "I", (64, True): "q", (64, False): "Q"}


def _classify(annotation: Any, example: Any) -> _Slot:
    import cutlass
    from cutlass.cute.runtime import _Pointer

    if isinstance(example, _Pointer):
        return _Slot("ptr", "Q", 8, int(example._assumed_align), "({a} if {a}.__class__ is int else {a}._pointer)")
    try:
        from cuda.bindings import driver, runtime
        stream_types = (driver.CUstream, runtime.cudaStream_t)
    except ImportError:  # pragma: no cover
        stream_types = ()
    numeric_ann = isinstance(annotation, type) and issubclass(annotation, cutlass.Numeric)
    if stream_types and isinstance(example, stream_types) and not numeric_ann:
        return _Slot("stream", "Q", 8, 1, "({a} if {a}.__class__ is int else int({a}))")
    numeric = annotation if numeric_ann else None
    if numeric is None or getattr(numeric, "is_abstract", False):
        raise _Unsupported(f"argument {example!r} (annotation {annotation!r}) is not a pointer, "
                           "concrete numeric scalar or CUDA stream")
    if isinstance(example, cutlass.Numeric) and type(example) is not numeric:
        raise _Unsupported(f"{type(example).__name__} passed for a {numeric.__name__} parameter")
    if issubclass(numeric, cutlass.Integer):
        code = _INT_CODES.get((numeric.width, bool(numeric.signed)))
        if code is None:
            raise _Unsupported(f"integer type {numeric.__name__}")
        size = max(1, numeric.width // 8)
    elif numeric is cutlass.Float32:
        code, size = "f", 4
    elif numeric is cutlass.Float64:
        code, size = "d", 8
    else:
        raise _Unsupported(f"scalar type {numeric.__name__}")
    code += f"{_SLOT - size}x" if size < _SLOT else ""
    return _Slot("scalar", code, size, 1, "({a} if {a}.__class__ is int or {a}.__class__ is float else {a}.value)")


_LLVM_SIZES = {"i1": 1, "i8": 1, "i16": 2, "i32": 4, "i64": 8, "f32": 4, "f64": 8}


def host_signature(compiled_fn: Any) -> list[tuple[str, int]] | None:
    """``[(llvm type, llvm.align)]`` of the compiled host entry's parameters (``ptr``, ``i32``,
    ``i64``, ``f32``, ...), read from ``compiled_fn.ir_module`` (the ``llvm.func`` named
    ``compiled_fn.function_name``); ``None`` if that is unavailable or not understood. This is
    the ABI the packed ``void*[]`` feeds, independent of the Python conversion code."""
    import re

    try:
        from cutlass._mlir import ir

        module = compiled_fn.ir_module
        with module.context:
            for op in module.body.operations:
                if op.operation.name != "llvm.func":
                    continue
                if ir.StringAttr(op.attributes["sym_name"]).value != compiled_fn.function_name:
                    continue
                ftype = str(op.attributes["function_type"])
                match = re.fullmatch(r"!llvm\.func<\w+ \((.*)\)>", ftype)
                if match is None:
                    return None
                types_ = [t.strip() for t in match.group(1).split(",")] if match.group(1) else []
                types_ = ["ptr" if t == "ptr" or t.startswith("ptr<") else t for t in types_]
                if any(t != "ptr" and t not in _LLVM_SIZES for t in types_):
                    return None
                attrs = list(op.attributes["arg_attrs"]) if "arg_attrs" in op.attributes else [None] * len(types_)
                aligns = []
                for a in attrs:
                    found = re.search(r"llvm\.align = (\d+)", str(a)) if a is not None else None
                    aligns.append(int(found.group(1)) if found else 1)
                if len(aligns) != len(types_):
                    return None
                return list(zip(types_, aligns))
    except Exception:  # noqa: BLE001  (no IR, other MLIR API: unknown)
        return None
    return None


def _check_host_abi(slots: list[_Slot], sig: list[tuple[str, int]]) -> None:
    """Each slot must hold what the host entry reads (pointer, or a scalar of the same type and
    size); pointer slots take the compiled ``llvm.align`` for the alignment check."""
    if len(sig) != len(slots):
        raise _Unsupported(f"host entry takes {len(sig)} parameters, launcher has {len(slots)}")
    for i, (slot, (ty, align)) in enumerate(zip(slots, sig)):
        if slot.kind in ("ptr", "stream"):
            ok = ty == "ptr"
            slot.align = max(slot.align, align)
        else:
            ok = ty in _LLVM_SIZES and _LLVM_SIZES[ty] == slot.size and (ty[0] == "f") == (slot.code[0] in "fd")
        if not ok:
            raise _Unsupported(f"argument {i}: host entry reads {ty}, launcher packs {slot.kind} {slot.code!r}")


def _cutlass_version() -> str | None:
    try:
        import cutlass

        return getattr(cutlass, "__version__", None)
    except ImportError:  # pragma: no cover
        return None


class FastLauncher:
    """``FastLauncher(compiled, example_args)``: ``launcher(*args)`` launches like
    ``compiled(*args)``; ``launcher.launch(*raw)`` takes plain Python values instead of cutlass
    objects (the cheapest form): an ``int`` address per pointer, ``int`` / ``float`` per numeric
    scalar, the ``int`` handle of the stream (``torch.cuda.current_stream().cuda_stream``).

    ``example_args``: one full argument tuple of the kind the caller passes (``make_ptr``
    pointers, ``cutlass.Int32`` / ``Int64`` / ``Float32`` or plain numbers, a ``CUstream``);
    it fixes the slot types and pointer alignments, and is checked byte for byte against the
    library's own conversion. ``fast`` tells whether the fast path is on; ``reason`` why not.
    """

    def __init__(self, compiled_fn: Callable[..., Any], example_args: Sequence[Any], *,
                 check_alignment: bool = True) -> None:
        self.compiled_fn = compiled_fn
        self.version = _cutlass_version()
        self.version_tested = self.version in TESTED_VERSIONS
        self.fast = False
        self.reason: str | None = None
        self._examples = tuple(example_args)
        self._lock = threading.Lock()
        try:
            self._setup(self._examples, check_alignment)
            self.fast = True
        except Exception as e:  # noqa: BLE001  (any missing internal: fall back to the library call)
            self.reason = f"{type(e).__name__}: {e}"
            self.launch = self._fallback_launch  # type: ignore[method-assign]

    @classmethod
    def from_raw(cls, compiled_fn: Any, raw: Sequence[Any], **kwargs: Any) -> FastLauncher:
        """A launcher built from one raw argument tuple (the form ``launch`` takes): the
        library-form example is derived from the compiled signature (:func:`library_args`)."""
        return cls(compiled_fn, library_args(compiled_fn, raw), **kwargs)

    # ------------------------------------------------------------------ public calls
    def __call__(self, *args: Any) -> None:
        if not self.fast:
            self.compiled_fn(*args)
            return
        self._call(*args)

    def launch(self, *values: Any) -> None:  # replaced per instance by the generated function
        raise AssertionError("unreachable")

    # ------------------------------------------------------------------ setup
    def _setup(self, examples: tuple, check_alignment: bool) -> None:
        if os.environ.get("FLASHSPLIT_CUTE_FASTCALL", "1") == "0":
            raise _Unsupported("FLASHSPLIT_CUTE_FASTCALL=0")
        from cutlass.base_dsl.jit_executor import JitCompiledFunction, JitExecutor

        fn = self.compiled_fn
        if not isinstance(fn, JitCompiledFunction):
            raise _Unsupported(f"{type(fn).__name__} is not a JitCompiledFunction")
        for name in ("run_compiled_program", "_default_executor", "_executor_lock"):
            if not hasattr(fn, name):
                raise _Unsupported(f"compiled function has no {name}")
        # Only the native call path (not TVM-FFI or other overrides) is replicated here.
        from cutlass.cutlass_dsl.cuda_jit_executor import CudaDialectJitCompiledFunction

        cls = type(fn)
        if cls.run_compiled_program is not JitCompiledFunction.run_compiled_program or cls.__call__ not in (
                JitCompiledFunction.__call__, CudaDialectJitCompiledFunction.__call__):
            raise _Unsupported(f"{cls.__name__} overrides the native call path")
        if getattr(fn, "total_added_arguments", 0) != 0:
            raise _Unsupported("compiled function takes extra (workspace) arguments")
        if getattr(fn, "_pyir_spec", None) is not None:
            raise _Unsupported("compiled function validates PyIR re-entry")
        ea = fn.execution_args
        meta = ea._meta
        if getattr(ea, "_full_arg_check", False):
            raise _Unsupported("debug-mode argument checks are on")
        if not hasattr(JitExecutor, "_get_invoke_packed_args"):  # (its attributes: checked at _bind)
            raise _Unsupported("JitExecutor has no _get_invoke_packed_args")
        n = meta.arg_count
        if len(examples) != n or len(meta.annotated_types) != n:
            raise _Unsupported(f"{len(examples)} example arguments for {n} runtime parameters")
        self._ea = ea
        self._slots = [_classify(ann, ex) for ann, ex in zip(meta.annotated_types, examples)]
        sig = host_signature(fn)
        self.abi_checked = sig is not None
        if sig is not None:
            _check_host_abi(self._slots, sig)
        self._struct = struct.Struct("=" + "".join(s.code for s in self._slots))
        assert self._struct.size == _SLOT * n, self._struct.size
        self._buf = (ctypes.c_uint64 * max(1, n))()
        base = ctypes.addressof(self._buf)
        self._addrs = [ctypes.c_void_p(base + _SLOT * i) for i in range(n)]
        self._result = ctypes.c_int32(0)
        self._capi = None  # the host function and its void*[]: set at the first launch (_bind)
        self._packed = None
        self._executor = None
        self._generate(check_alignment)
        bad = self.check(examples)
        if bad:
            raise _Unsupported("execution-argument bytes differ from the library's: " + "; ".join(bad))

    def _generate(self, check_alignment: bool) -> None:
        """Generate ``launch(a0, ...)`` and ``_call(a0, ...)`` for this argument list (straight-line
        code: one alignment test per alignment class, one ``pack_into``, one ctypes call)."""
        n = len(self._slots)
        names = [f"a{i}" for i in range(n)]
        params = ", ".join(names)
        lines = [f"def launch({params}):"]
        if check_alignment:
            by_align: dict[int, list[str]] = {}
            for a, s in zip(names, self._slots):
                if s.kind == "ptr" and s.align > 1:
                    by_align.setdefault(s.align, []).append(a)
            tests = [f"({' | '.join(group)}) & {align - 1}" for align, group in sorted(by_align.items())]
            if tests:
                lines.append(f"    if {' or '.join(tests)}:")
                lines.append(f"        _misaligned(({params},))")
        lines += [
            "    with _lock:",
            f"        _pack(_buf, 0, {params})",
            "        if _capi is None:",
            "            return _self._slow_launch()",
            "        _capi(_packed)",
            "        rc = _res.value",
            "    if rc:",
            "        _self._failed(rc)",
        ]
        call_args = ", ".join(s.expr.format(a=a) for a, s in zip(names, self._slots))
        lines += [f"def call({params}):", f"    launch({call_args})"]
        g = {"_lock": self._lock, "_pack": self._struct.pack_into, "_buf": self._buf, "_self": self,
             "_misaligned": self._misaligned, "_capi": None, "_packed": None, "_res": self._result}
        self._globals = g
        code = compile("\n".join(lines), f"<flashsplit.cute.fastcall:{n} args>", "exec")
        exec(code, g)  # noqa: S102  (straight-line launch code for this argument list)
        self.launch = g["launch"]  # type: ignore[method-assign]
        self._call = g["call"]

    def _misaligned(self, values: tuple) -> None:
        bad = [f"argument {i}: 0x{v:x} is not {s.align}-byte aligned"
               for i, (v, s) in enumerate(zip(values, self._slots)) if s.kind == "ptr" and v % s.align]
        raise ValueError("; ".join(bad))

    # ------------------------------------------------------------------ launching
    def _slow_launch(self) -> None:
        """Launch (buffer packed, lock held) before the packed call is bound, or when it could
        not be: the first launch goes through the library's ``run_compiled_program`` with the
        pre-built slot addresses, which loads the CUDA library and creates the default
        executor; then bind to that executor."""
        if self._executor is not None:  # bound, but without the packed-call internals
            self._executor.run_compiled_program(self._addrs)
            return
        fn = self.compiled_fn
        fn.run_compiled_program(self._addrs)
        self._bind(fn._default_executor)

    def _bind(self, executor: Any) -> None:
        """Copy the executor's ``void*[]`` layout (args, CUDA result, kernel handles) for our slot
        addresses, with our own result slot; if its internals are not as expected, launch
        through ``executor.run_compiled_program(addresses)`` (no argument conversion, but the
        executor's packing loop)."""
        self._executor = executor
        n = len(self._slots)
        g = self._globals
        g["_capi"] = g["_packed"] = self._capi = self._packed = None
        try:
            raw = executor._get_invoke_packed_args(self._addrs)
            total = n + int(executor._num_extra_args)
            entries = [raw[i] for i in range(total)]
            if entries[:n] != [a.value for a in self._addrs]:
                raise _Unsupported("executor reorders the arguments")
            if executor._has_cuda_result:
                if entries[n] != executor._cuda_result_addr:
                    raise _Unsupported("no CUDA result slot after the arguments")
                entries[n] = ctypes.addressof(self._result)
            capi = executor.jit_module.capi_func
            packed = (ctypes.c_void_p * total)(*entries)
        except Exception as e:  # noqa: BLE001
            self.reason = f"packed call off ({type(e).__name__}: {e}); launching via executor.run_compiled_program"
            return
        self._capi, self._packed = g["_capi"], g["_packed"] = capi, packed

    def _failed(self, rc: int) -> None:
        self._result.value = 0
        _raise_cuda(rc)

    def _fallback_launch(self, *values: Any) -> None:
        conv = self.__dict__.get("_fallback_conv")
        if conv is None:
            conv = self._fallback_conv = [_fallback_converter(ex) for ex in self._examples]
        self.compiled_fn(*(c(v) for c, v in zip(conv, values)))

    # ------------------------------------------------------------------ checks
    def pack(self, args: Sequence[Any]) -> bytes:
        """The slot bytes this launcher would hand the host function for ``args`` (cutlass
        objects or raw values), without launching."""
        vals = [eval(s.expr.format(a="x"), {}, {"x": a}) for s, a in zip(self._slots, args)]
        return self._struct.pack(*vals)

    def check(self, args: Sequence[Any]) -> list[str]:
        """Compare, for ``args`` in the library's own form (``make_ptr`` pointers, cutlass
        scalars, ``CUstream``), the C values the library would pass (``generate_execution_args``)
        with this launcher's slots. Returns the differences (empty: identical)."""
        if not hasattr(self, "_slots"):
            return [f"fast path is off: {self.reason}"]
        exe, keep = self._ea.generate_execution_args(tuple(args), {})
        bad = []
        if len(exe) != len(self._slots):
            return [f"library builds {len(exe)} execution args for {len(self._slots)} parameters"]
        mine = self.pack(args)
        for i, (e, s) in enumerate(zip(exe, self._slots)):
            addr = e.value if isinstance(e, ctypes.c_void_p) else int(e)
            lib = ctypes.string_at(addr, s.size)
            own = mine[_SLOT * i:_SLOT * i + s.size]
            if lib != own:
                bad.append(f"argument {i} ({s.kind}): library {lib.hex()} vs fastcall {own.hex()}")
        del keep
        return bad


def library_args(compiled_fn: Any, raw: Sequence[Any]) -> tuple:
    """Raw values (``int`` addresses, numbers, ``int`` stream handle) -> the library's argument
    objects for ``compiled_fn``, by its runtime signature: ``make_ptr`` (gmem, the compiled
    ``llvm.align`` of the parameter, element type ``Int8``: a runtime pointer's element type
    does not reach the host entry) for ``Pointer`` parameters, the annotated numeric type for
    scalars, ``CUstream`` for unannotated parameters."""
    import cutlass
    from cuda.bindings import driver
    from cutlass import cute
    from cutlass.cute.runtime import make_ptr

    anns = compiled_fn.execution_args._meta.annotated_types
    if len(anns) != len(raw):
        raise ValueError(f"{len(raw)} values for {len(anns)} runtime parameters")
    sig = host_signature(compiled_fn) or [(None, 1)] * len(raw)
    out = []
    for ann, value, (_, align) in zip(anns, raw, sig):
        if isinstance(ann, type) and issubclass(ann, cutlass.Numeric):
            out.append(ann(value))
        elif ann is None:
            out.append(driver.CUstream(value))
        elif isinstance(ann, type) and issubclass(ann, cute.typing.Pointer):
            out.append(make_ptr(cutlass.Int8, value, cute.AddressSpace.gmem, assumed_align=align))
        else:
            raise ValueError(f"cannot build a {ann!r} argument from {value!r}")
    return tuple(out)


def _fallback_converter(example: Any) -> Callable[[Any], Any]:
    """Raw value -> the library's argument type, from an example argument (fallback path)."""
    try:
        from cutlass.cute.runtime import _Pointer, make_ptr

        if isinstance(example, _Pointer):
            dtype, space, align = example._dtype, example._addr_space, example._assumed_align
            return lambda v: v if isinstance(v, _Pointer) else make_ptr(dtype, v, space, assumed_align=align)
        from cuda.bindings import driver

        if isinstance(example, driver.CUstream):
            return lambda v: driver.CUstream(v) if isinstance(v, int) else v
        import cutlass

        if isinstance(example, cutlass.Numeric):
            cls = type(example)
            return lambda v: v if isinstance(v, cutlass.Numeric) else cls(v)
    except ImportError:  # pragma: no cover
        pass
    return lambda v: v


def _raise_cuda(rc: int) -> None:
    try:
        from cutlass.base_dsl.runtime import cuda as cuda_helpers

        raise cuda_helpers.create_cuda_runtime_error(rc, cuda_helpers.cudart.cudaError_t)
    except ImportError:  # pragma: no cover
        raise RuntimeError(f"CuTe launch failed with cudaError {rc}") from None


# ---------------------------------------------------------------------- CPU self-check
def _capture_executor(execution_args: Any, records: list, n_args: int, sizes: list[int], rc: int = 0):
    """A real ``JitExecutor`` whose host function is a Python callback that records, for each
    call, the bytes of the ``n_args`` argument slots (``sizes``) and writes ``rc`` to the CUDA
    result slot: the launch ABI of the library minus the CUDA host code."""
    from cutlass.base_dsl.jit_executor import JitExecutor

    proto = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p)
    holder: dict[str, Any] = {}

    def host(packed: int) -> int:
        ex = holder["ex"]
        arr = ctypes.cast(packed, ctypes.POINTER(ctypes.c_void_p))
        records.append([ctypes.string_at(arr[i], sizes[i]) for i in range(n_args)])
        if ex._has_cuda_result:
            ctypes.c_int32.from_address(arr[n_args]).value = rc
        return 0

    capi = proto(host)
    ex = JitExecutor(types.SimpleNamespace(capi_func=capi, execution_args=execution_args), None, False)
    holder["ex"] = ex
    ex._keepalive = capi
    return ex


def self_check(compiled_fn: Any, arg_sets: Sequence[Sequence[Any]]) -> dict[str, Any]:
    """CPU-runnable check that the launcher hands the host function the same bytes as
    ``compiled_fn(*args)`` for every ``args`` in ``arg_sets`` (library-form arguments).

    1. ``FastLauncher.check``: the bytes behind ``generate_execution_args`` vs the slots.
    2. Launch-ABI capture: both ``compiled_fn(*args)`` (its real ``__call__``, argument
       conversion and ``JitExecutor`` packing) and the launcher (``launcher(*args)`` and
       ``launcher.launch(*raw)``) call a recording stand-in for the host function; the
       recorded argument bytes must be equal. ``compiled_fn._default_executor`` is swapped
       for the recorder for the duration and restored.

    Raises ``AssertionError`` on a difference; returns a small report otherwise.
    """
    arg_sets = [tuple(a) for a in arg_sets]
    launcher = FastLauncher(compiled_fn, arg_sets[0])
    assert launcher.fast, f"fast path is off: {launcher.reason}"
    n = len(launcher._slots)
    sizes = [s.size for s in launcher._slots]
    lib_rec: list = []
    fast_rec: list = []
    raw_rec: list = []
    lib_ex = _capture_executor(compiled_fn.execution_args, lib_rec, n, sizes)
    mine = FastLauncher(compiled_fn, arg_sets[0])
    mine._bind(_capture_executor(compiled_fn.execution_args, fast_rec, n, sizes))
    assert mine._capi is not None, mine.reason
    with compiled_fn._executor_lock:
        saved = compiled_fn._default_executor
        compiled_fn._default_executor = lib_ex
        try:
            for args in arg_sets:
                bad = launcher.check(args)
                assert not bad, bad
                compiled_fn(*args)
                mine(*args)
                fast_rec_len = len(fast_rec)
                raw = [eval(s.expr.format(a="x"), {}, {"x": a}) for s, a in zip(mine._slots, args)]
                mine.launch(*raw)
                raw_rec.append(fast_rec.pop(fast_rec_len))
        finally:
            compiled_fn._default_executor = saved
    assert len(lib_rec) == len(fast_rec) == len(raw_rec) == len(arg_sets)
    for i, (lib, fast, raw) in enumerate(zip(lib_rec, fast_rec, raw_rec)):
        assert lib == fast, f"arg set {i}: launcher(*args) differs: " + _diff(lib, fast)
        assert lib == raw, f"arg set {i}: launcher.launch(*raw) differs: " + _diff(lib, raw)
    return {"args": n, "arg_sets": len(arg_sets), "extra_packed_entries": int(lib_ex._num_extra_args),
            "version": launcher.version, "version_tested": launcher.version_tested}


def _diff(a: list[bytes], b: list[bytes]) -> str:
    return "; ".join(f"#{i}: {x.hex()} vs {y.hex()}" for i, (x, y) in enumerate(zip(a, b)) if x != y)
