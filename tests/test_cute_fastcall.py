"""flashsplit.cute.fastcall hands the compiled host function the same bytes as ``compiled(*args)``.

CPU only: the kernels compile for sm_90a (``CUTE_DSL_ARCH``, set here when cutlass is not yet
imported) and the host launch function is replaced by a recording stand-in, so both the
library's call path (argument conversion + ``JitExecutor`` packing) and the launcher's run
without a GPU. Arguments are generated from the compiled signature (pointers, Int32/Int64,
Float32, the stream), so the test follows signature changes of the kernels.
"""

from __future__ import annotations

import importlib.util
import os
import random
import struct
import sys

import pytest

from flashsplit.cute.backend import CUTLASS_MISSING

_HAS_CUTLASS = importlib.util.find_spec("cutlass") is not None
pytestmark = pytest.mark.skipif(not _HAS_CUTLASS, reason=CUTLASS_MISSING)

if _HAS_CUTLASS and "cutlass" not in sys.modules:
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")


def _split():
    from flashsplit.cute.compile import compile_split
    from flashsplit.cute.configs import split_config

    return compile_split(split_config("bfloat16", 128, False, True))


def _combine(dtype="bfloat16"):
    from flashsplit.cute.compile import compile_combine
    from flashsplit.cute.configs import CombineConfig

    return compile_combine(CombineConfig(dtype, 128))


def _arg_sets(compiled, count=4, seed=0):
    """``count`` library-form argument tuples for ``compiled``'s runtime signature: 16-byte
    aligned pointers, Int32/Int64 values at both ends of their range, Float32 values, streams."""
    import cutlass
    from cuda.bindings import driver
    from cutlass import cute
    from cutlass.cute.runtime import make_ptr

    rng = random.Random(seed)
    extremes = {32: [0, 1, -1, 2**31 - 1, -(2**31)], 64: [0, -1, 2**63 - 1, -(2**63), 2**40 + 3]}
    sets = []
    for n in range(count):
        args = []
        for ann in compiled.execution_args._meta.annotated_types:
            if ann is None:
                args.append(driver.CUstream(rng.randrange(0, 2**64)))
            elif ann is cutlass.Float32:
                args.append(cutlass.Float32(rng.choice([0.0, 1.0, -2.5, 0.1 * 1.4426950408889634, 1e-40, 3e38])))
            elif isinstance(ann, type) and issubclass(ann, cutlass.Integer):
                pool = extremes[ann.width]
                args.append(ann(pool[n] if n < len(pool) else rng.randrange(-(2 ** (ann.width - 1)), 2 ** (ann.width - 1))))
            else:  # a cute Pointer parameter
                address = rng.randrange(1, 2**47) * 16 if n else 0
                args.append(make_ptr(cutlass.Float32, address, cute.AddressSpace.gmem, assumed_align=16))
        sets.append(tuple(args))
    return sets


@pytest.mark.parametrize("which", ["split", "combine", "combine_fp32"])
def test_fastcall_matches_library(which):
    from flashsplit.cute.fastcall import FastLauncher, self_check

    compiled = {"split": _split, "combine": _combine, "combine_fp32": lambda: _combine("float32")}[which]()
    sets = _arg_sets(compiled, count=6, seed={"split": 1, "combine": 2, "combine_fp32": 3}[which])
    launcher = FastLauncher(compiled, sets[0])
    assert launcher.fast, launcher.reason
    report = self_check(compiled, sets)
    assert report["args"] == compiled.execution_args._meta.arg_count
    assert report["extra_packed_entries"] == 1  # the CUDA result slot (no kernel handles)


def test_backend_style_split_arguments():
    """The split launch's fallback arguments exactly as the backend builds them (the schema's
    pointer element types and alignments: 16 and 4 bytes) reach the host function as the same
    bytes through the library's call and through the launcher."""
    import math

    from flashsplit.cute import launch_args
    from flashsplit.cute.configs import split_config
    from flashsplit.cute.fastcall import self_check

    elements = launch_args.split_elements(split_config("bfloat16", 128, False, True))

    def args(base, s):
        raw = []
        for i, a in enumerate(launch_args.SPLIT_ARGS):
            if a.kind == "ptr":  # 4-byte aligned pointers off the 16-byte grid where the schema allows
                raw.append(base + 0x1000 * (i + 1) + (4 * (1 + i % 3) if a.align == 4 else 0))
            elif a.kind == "i32":
                raw.append(s * i - 3)
            elif a.kind == "i64":
                raw.append(-(2**40) - s if i % 5 == 0 else s * 2**33 + i)
            elif a.kind == "f32":
                raw.append(0.1 * s * math.log2(math.e))
            else:
                raw.append(0x7F0012340000 + s)
        return launch_args.cute_args(launch_args.SPLIT_ARGS, elements, raw)

    self_check(_split(), [args(0x7F0000000000, 1), args(0x7E0000001000, 7), args(0x10, 2**20)])


def _bound_launcher(compiled, rc=0, records=None):
    from flashsplit.cute import fastcall

    example = _arg_sets(compiled, count=1)[0]
    launcher = fastcall.FastLauncher(compiled, example)
    n = len(example)
    launcher._bind(fastcall._capture_executor(compiled.execution_args, records if records is not None else [],
                                              n, [8] * n, rc=rc))
    return launcher, n


def test_fastcall_checks_alignment_range_and_errors():
    import cutlass

    compiled = _split()
    records = []
    launcher, n = _bound_launcher(compiled, records=records)
    raw = [0] * n
    launcher.launch(*raw)
    assert len(records) == 1
    anns = compiled.execution_args._meta.annotated_types
    ptr = next(i for i, a in enumerate(anns) if not (isinstance(a, type) and issubclass(a, cutlass.Numeric)) and a is not None)
    raw[ptr] = 8  # assumed 16-byte aligned
    with pytest.raises(ValueError, match="16-byte aligned"):
        launcher.launch(*raw)
    raw[ptr] = 0
    i32 = anns.index(cutlass.Int32)
    raw[i32] = 2**31  # the library would wrap this silently
    with pytest.raises(struct.error):
        launcher.launch(*raw)
    assert len(records) == 1

    failing, _ = _bound_launcher(compiled, rc=700)
    with pytest.raises(Exception, match="700"):
        failing.launch(*([0] * n))


def test_fastcall_falls_back(monkeypatch):
    """Without the internals (here: a plain callable, or FLASHSPLIT_CUTE_FASTCALL=0) the
    launcher calls the function with library-form arguments."""
    from cutlass.cute.runtime import _Pointer

    from flashsplit.cute.fastcall import FastLauncher

    compiled = _split()
    example = _arg_sets(compiled, count=1)[0]
    calls = []
    launcher = FastLauncher(lambda *a: calls.append(a), example)
    assert not launcher.fast and "JitCompiledFunction" in launcher.reason
    launcher(*example)
    launcher.launch(*([16] * len(example)))
    assert calls[0] == example
    assert isinstance(calls[1][0], _Pointer) and type(calls[1][7]) is type(example[7])

    monkeypatch.setenv("FLASHSPLIT_CUTE_FASTCALL", "0")
    off = FastLauncher(compiled, example)
    assert not off.fast and "FLASHSPLIT_CUTE_FASTCALL" in off.reason


def test_first_launch_goes_through_library_then_binds():
    """The first launch uses ``compiled.run_compiled_program`` (which, on a GPU, loads the CUDA
    library and creates the default executor); later launches call the host function directly
    with a copy of that executor's packed-argument layout."""
    from flashsplit.cute import fastcall

    compiled = _combine()
    sets = _arg_sets(compiled, count=3, seed=5)
    n = len(sets[0])
    sizes = [s.size for s in fastcall.FastLauncher(compiled, sets[0])._slots]
    records = []
    recorder = fastcall._capture_executor(compiled.execution_args, records, n, sizes)
    with compiled._executor_lock:
        saved = compiled._default_executor
        compiled._default_executor = recorder  # stands in for the executor a launch on a GPU creates
        try:
            launcher = fastcall.FastLauncher(compiled, sets[0])
            assert launcher._capi is None
            for args in sets:
                launcher(*args)
            assert launcher._capi is not None and launcher._executor is recorder
            compiled(*sets[2])
        finally:
            compiled._default_executor = saved
    assert [r == records[-1] for r in records] == [False, False, True, True]
    assert records[0] != records[1]


def _raw(args):
    from cuda.bindings import driver

    return [a._pointer if hasattr(a, "_pointer") else int(a) if isinstance(a, driver.CUstream) else a.value
            for a in args]


def test_host_abi_and_from_raw(monkeypatch):
    """The slots agree with the compiled host entry's LLVM signature (types and pointer
    alignment), and ``from_raw`` builds the same launcher from raw values."""
    import cutlass

    from flashsplit.cute import fastcall

    compiled = _split()
    sig = fastcall.host_signature(compiled)
    assert sig is not None and len(sig) == compiled.execution_args._meta.arg_count
    anns = compiled.execution_args._meta.annotated_types
    want = {cutlass.Int32: "i32", cutlass.Int64: "i64", cutlass.Float32: "f32"}
    assert [t for t, _ in sig] == [want.get(a, "ptr") for a in anns]
    assert {align for t, align in sig if t == "ptr"} >= {4, 16}

    args = _arg_sets(compiled, count=2)[1]
    launcher = fastcall.FastLauncher(compiled, args)
    assert launcher.fast and launcher.abi_checked
    from_raw = fastcall.FastLauncher.from_raw(compiled, _raw(args))
    assert [s.align for s in from_raw._slots if s.kind == "ptr"] == [a for t, a in sig[:-1] if t == "ptr"]
    assert from_raw.fast and from_raw.pack(_raw(args)) == launcher.pack(args)
    assert fastcall.self_check(compiled, [fastcall.library_args(compiled, _raw(args)), args])

    original = fastcall._classify

    def int32_as_int64(ann, example):
        slot = original(ann, example)
        if ann is cutlass.Int32:
            slot.code, slot.size = "q", 8
        return slot

    monkeypatch.setattr(fastcall, "_classify", int32_as_int64)
    wrong = fastcall.FastLauncher(compiled, args)
    assert not wrong.fast and "host entry reads i32" in wrong.reason


@pytest.mark.parametrize("which", ["split", "combine"])
def test_fixed_launch_hands_over_the_same_bytes(which):
    """A fixed launch (the static arguments packed once, the per-call ones per launch) gives the
    host function the bytes of ``FastLauncher.launch`` with every value, call after call, and
    raises on a CUDA error of its own launch."""
    from flashsplit.cute import fastcall
    from flashsplit.cute.fixed_launch import fixed_launch
    from flashsplit.cute.launch_args import COMBINE_ARGS, SPLIT_ARGS

    compiled = _split() if which == "split" else _combine()
    schema = SPLIT_ARGS if which == "split" else COMBINE_ARGS
    per_call = [a.per_call for a in schema]
    assert len(per_call) == compiled.execution_args._meta.arg_count
    sets = [_raw(args) for args in _arg_sets(compiled, count=4, seed=3)]
    n = len(sets[0])
    sizes = [s.size for s in fastcall.FastLauncher(compiled, _arg_sets(compiled, count=1)[0])._slots]
    records = []
    launcher = fastcall.FastLauncher.from_raw(compiled, sets[1])
    assert fixed_launch(launcher, sets[1], per_call) is None, "not bound before the first launch"
    launcher._bind(fastcall._capture_executor(compiled.execution_args, records, n, sizes))
    fixed = fixed_launch(launcher, sets[1], per_call)
    for raw in sets:  # each set's per-call values with set 1's static ones
        want = [r if p else s for r, s, p in zip(raw, sets[1], per_call)]
        launcher.launch(*want)
        fixed(*(r for r, p in zip(raw, per_call) if p))
        assert records[-1] == records[-2]
    assert len({bytes(b"".join(r)) for r in records}) == len(sets)

    failing, _ = _bound_launcher(compiled, rc=700)
    failing_fixed = fixed_launch(failing, sets[0], per_call)
    with pytest.raises(Exception, match="700"):
        failing_fixed(*(r for r, p in zip(sets[0], per_call) if p))
