"""The native host step launches what a prepared Triton decode's Python replay launches.

No GPU needed: the prepared decode's launches are stand-in Relaunches that record what the Python replay
hands them (pointers, stream), and ``cuLaunchKernelEx`` is a ``ctypes`` callback that records the
config and every kernel parameter the extension's driver-launch host function passes it.
"""

from __future__ import annotations

import ctypes
import struct
from types import SimpleNamespace

import pytest
import torch
import triton

from flashsplit import dispatch
from flashsplit.call import DecodeOptions, DecodeTensors
from flashsplit.native import steps
from flashsplit.triton import driver_launch as driver, host_program as triton_program
from flashsplit.triton.backend import PreparedDecode, TritonBackend

from test_native_step import extension, no_stand_in_steps_after  # noqa: F401  (fixtures)

DEVICE = "cpu"  # stand-in launches: CPU tensors on any machine
_LAUNCH_EX = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p),
                              ctypes.c_void_p)
_ARRIVALS = 0x7F0000040000  # the counters' address the stand-ins hand out
#: A launch's fixed arguments after its pointers: (signature type, value); constexprs take no parameter.
_TAIL = (("i32", 48), ("i32", -3), ("fp32", 0.088388), ("constexpr", 64), ("i1", True), ("i64", 1 << 40),
         ("constexpr", None), ("i32", 7))


class DriverRecorder:
    """A stand-in ``cuLaunchKernelEx``: records (function, grid, block, shared, stream, PDL, the
    8 bytes of each kernel parameter) per launch and returns ``status``."""

    def __init__(self, status: int = 0):
        self.status = status
        self.launches: list = []
        self.params_per_launch: dict[int, int] = {}  # function -> parameter count

        def launch(config, function, params, extra):
            c = driver.LaunchConfig.from_address(config)
            pdl = (c.num_attrs == 1 and c.attrs[0].id == driver.PDL_ATTRIBUTE
                   and ctypes.string_at(ctypes.addressof(c.attrs[0]) + 8, 4) == b"\1\0\0\0")
            n = self.params_per_launch[function]
            values = tuple(ctypes.string_at(params[i], 8) for i in range(n))
            self.launches.append((function, tuple(c.grid), tuple(c.block), c.shared, c.stream, pdl, values, extra))
            return self.status

        self.callback = _LAUNCH_EX(launch)
        self.address = ctypes.cast(self.callback, ctypes.c_void_p).value


class StandInRelaunch:
    """Records the Python replay's (pointers, stream); carries a compiled kernel's facts whose
    signature makes its None pointers constexpr, as triton does."""

    def __init__(self, function: int, grid, pdl: bool, recorder: DriverRecorder, tail=_TAIL, **metadata):
        self.calls: list = []
        self.grid, self.device, self._function, self._recorder, self._pdl = grid, -1, function, recorder, pdl
        self._types, self.tail = [t for t, _ in tail], tuple(v for _, v in tail)
        self._metadata = metadata

    def __call__(self, pointers, stream=None):
        self.calls.append((tuple(pointers), stream))
        if not hasattr(self, "compiled"):  # the first launch fixes the signature
            signature = {f"p{i}": "constexpr" if p is None else "*fp32" for i, p in enumerate(pointers)}
            signature.update((f"t{i}", t) for i, t in enumerate(self._types))
            meta = dict(num_ctas=1, num_warps=4, shared=2048, launch_pdl=self._pdl, launch_cooperative_grid=False,
                        global_scratch_size=0, profile_scratch_size=0, **self._metadata)
            self.compiled = SimpleNamespace(src=SimpleNamespace(signature=signature), function=self._function,
                                            metadata=SimpleNamespace(**meta))
            live = sum(p is not None for p in pointers)
            self._recorder.params_per_launch[self._function] = live + sum(t != "constexpr" for t in self._types) + 2


def _tensors(generator, extra: set, with_lse: bool) -> DecodeTensors:
    def rand(*shape, dtype=torch.float16):
        return torch.randn(*shape, generator=generator).to(device=DEVICE, dtype=dtype)

    q = rand(2, 1, 8, 32)
    k, v = rand(2, 64, 2, 32), rand(2, 64, 2, 32)
    ints = lambda *shape: torch.randint(0, 9, shape, generator=generator, dtype=torch.int32).to(DEVICE)  # noqa: E731
    return DecodeTensors(
        q, k, v, torch.empty_like(q), torch.empty(2, 8, 1, device=DEVICE) if with_lse else None,
        ints(2) if "seqlens" in extra else None, ints(2, 4) if "paged" in extra else None,
        rand(1, dtype=torch.float32) if "descale" in extra else None,
        rand(1, dtype=torch.float32) if "descale" in extra else None, rand(8, dtype=torch.float32) if "sinks" in extra else None,
        rand(2, 1, 2, 32) if "append" in extra else None, rand(2, 1, 2, 32) if "append" in extra else None,
        rand(64, 16) if "rotary" in extra else None, rand(64, 16) if "rotary" in extra else None,
        ints(2) if "batch_idx" in extra else None, ints(2) if "leftpad" in extra else None)


def _prepared(monkeypatch, generator, recorder, num_splits: int, extra: set, with_lse: bool):
    """A Triton PreparedDecode whose launches are stand-ins, after one Python replay; its workspace
    and counters on stream 5 of stand-in CUDA device 0."""
    backend = TritonBackend()
    prepared = PreparedDecode(backend, num_splits, 0.2, False)
    prepared.split = StandInRelaunch(0x5917, (num_splits, 2, 2), False, recorder)
    prepared.combine = None if prepared.merge or num_splits == 1 else StandInRelaunch(
        0xC0B, (16, 1, 1), True, recorder, tail=(("i32", 5), ("constexpr", 128), ("i1", False)))
    buffer = torch.empty(1 << 14, device=DEVICE)
    monkeypatch.setattr(backend.workspace, "buffer", lambda *a: buffer)
    monkeypatch.setattr(backend.arrivals, "address_for", lambda key, q: _ARRIVALS)
    monkeypatch.setitem(backend.workspace.addresses, (0, 5), (buffer.numel(), buffer.data_ptr()))
    monkeypatch.setitem(backend.arrivals.addresses, (0, 5), (1 << 10, _ARRIVALS))
    monkeypatch.setattr(triton_program, "_raw_stream", lambda index: 5)
    monkeypatch.setattr(triton_program, "_capturing", lambda: False)
    monkeypatch.setattr(driver, "launch_kernel_ex", lambda: recorder.address)
    tensors = _tensors(generator, extra, with_lse)
    prepared(tensors)
    return prepared, tensors


def _step(prepared, tensors, options):
    program = prepared.host_program(tensors)
    assert program
    program = program._replace(device_index=0)  # the CPU tensors' stand-in CUDA device
    step = steps.build_step(program, tensors, options)
    assert step is not None
    return step, program


def _call(step, tensors: DecodeTensors, options: DecodeOptions, with_lse: bool):
    args = (tensors.q, tensors.k_cache, tensors.v_cache, None, tensors.cache_seqlens, tensors.block_table, None,
            tensors.k_descale, tensors.v_descale, tensors.sinks, tensors.k_new, tensors.v_new, tensors.rotary_cos,
            tensors.rotary_sin, tensors.cache_batch_idx, tensors.cache_leftpad, with_lse)
    return step(*args, *options)


def _expected(relaunch, pointers, stream) -> tuple[bytes, ...]:
    """The parameters the driver must see: the live pointers, each fixed value, two null scratch pointers."""
    codes = dict(driver._CODES)
    fixed = [struct.pack("<" + codes[t], v).ljust(8, b"\0") for t, v in zip(relaunch._types, relaunch.tail)
             if t != "constexpr"]
    return (*(struct.pack("<Q", p) for p in pointers if p is not None), *fixed, bytes(8), bytes(8))


EXTRAS = [set(), {"seqlens"}, {"seqlens", "paged"}, {"seqlens", "descale", "sinks"}, {"seqlens", "leftpad"},
          {"seqlens", "batch_idx", "rotary", "append"}]


@pytest.mark.parametrize("extra", EXTRAS, ids=lambda e: "+".join(sorted(e)) or "plain")
@pytest.mark.parametrize("num_splits", [1, 3, 7])  # one split, merged in the split kernel, the combine kernel
@pytest.mark.parametrize("with_lse", [False, True])
def test_native_step_launches_what_the_python_replay_launches(extension, num_splits, with_lse, extra, generator,
                                                              monkeypatch):
    recorder = DriverRecorder()
    prepared, tensors = _prepared(monkeypatch, generator, recorder, num_splits, extra, with_lse)
    options = DecodeOptions(num_splits=num_splits, backend="triton")
    step, _ = _step(prepared, tensors, options)
    relaunches = [r for r in (prepared.split, prepared.combine) if r is not None]
    assert len(relaunches) == (2 if num_splits == 7 else 1)
    for round_ in range(2):  # new q and lengths: each call's addresses are read
        tensors = tensors._replace(q=tensors.q.clone(), cache_seqlens=None if tensors.cache_seqlens is None
                                   else tensors.cache_seqlens.clone())
        recorder.launches.clear()
        result = _call(step, tensors, options, with_lse)
        assert result is not None
        out, lse = result if with_lse else (result, None)
        assert out.shape == tensors.q.shape and out.dtype == tensors.q.dtype and out.stride() == tensors.q.stride()
        if with_lse:
            assert lse.shape == (2, 8, 1) and lse.dtype == torch.float32
        prepared(tensors._replace(out=out, lse=lse))  # the Python replay of the same call
        assert len(recorder.launches) == len(relaunches)
        for relaunch, seen in zip(relaunches, recorder.launches):
            pointers, stream = relaunch.calls[-1]
            function, grid, block, shared, stream_seen, pdl, values, extra_arg = seen
            assert function == relaunch._function and grid == relaunch.grid and block == (128, 1, 1)
            assert shared == 2048 and pdl is (relaunch is prepared.combine) and extra_arg is None
            assert stream_seen == 5 and stream in (None, 5)
            assert values == _expected(relaunch, pointers, stream)
    assert step.calls == 2 * len(relaunches)


def test_a_failed_driver_launch_raises_tritons_error(extension, generator, monkeypatch):
    recorder = DriverRecorder(status=719)
    prepared, tensors = _prepared(monkeypatch, generator, recorder, 3, {"seqlens"}, False)
    options = DecodeOptions(num_splits=3, backend="triton")
    step, _ = _step(prepared, tensors, options)
    with pytest.raises(RuntimeError, match="Triton Error \\[CUDA\\]"):
        _call(step, tensors, options, False)
    recorder.status = 0  # the step reset the result slot: the next launch's success counts
    assert _call(step, tensors, options, False) is not None and len(recorder.launches) == 2


@pytest.mark.parametrize("hook", ["launch_enter_hook", "launch_exit_hook"])
def test_the_step_declines_while_a_triton_launch_hook_is_set(extension, hook, generator, monkeypatch):
    recorder = DriverRecorder()
    prepared, tensors = _prepared(monkeypatch, generator, recorder, 3, {"seqlens"}, False)
    options = DecodeOptions(num_splits=3, backend="triton")
    step, program = _step(prepared, tensors, options)
    assert not triton_program.capturing_or_hooked()
    assert _call(step, tensors, options, False) is not None and len(recorder.launches) == 1
    monkeypatch.setattr(getattr(triton.knobs.runtime, hook), "calls", [lambda *a: None])
    assert triton_program.capturing_or_hooked()
    assert _call(step, tensors, options, False) is None and len(recorder.launches) == 1
    monkeypatch.setattr(getattr(triton.knobs.runtime, hook), "calls", [])
    monkeypatch.setattr(triton_program, "_capturing", lambda: True)
    assert _call(step, tensors, options, False) is None and len(recorder.launches) == 1


def test_a_single_split_step_needs_no_workspace(extension, generator, monkeypatch):
    recorder = DriverRecorder()
    prepared, tensors = _prepared(monkeypatch, generator, recorder, 1, {"seqlens"}, False)
    options = DecodeOptions(num_splits=1, backend="triton")
    step, program = _step(prepared, tensors, options)
    assert program.workspace_numel == 0 and program.counter_count == 0
    prepared.backend.workspace.addresses.clear()
    assert _call(step, tensors, options, False) is not None and len(recorder.launches) == 1


@pytest.mark.parametrize("change", ["num_ctas", "cooperative", "scratch", "type", "grid", "no_driver", "device",
                                    "not_launched"])
def test_no_program_where_the_packing_would_not_reproduce_the_launch(extension, change, generator, monkeypatch):
    """A kernel of several CTAs per program, a cooperative grid, scratch memory, an unknown
    parameter type, an empty grid, no driver, another device than the tensors', no first launch:
    no native program (the Python replay serves every call)."""
    recorder = DriverRecorder()
    metadata = {"num_ctas": dict(num_ctas=2), "cooperative": dict(launch_cooperative_grid=True),
                "scratch": dict(global_scratch_size=64)}.get(change, {})
    prepared, tensors = _prepared(monkeypatch, generator, recorder, 3, {"seqlens"}, False)
    split = prepared.split
    if metadata:
        split.compiled.metadata.__dict__.update(metadata)
    elif change == "type":
        split.compiled.src.signature["t0"] = "bf16x2"
    elif change == "grid":
        split.grid = (0, 2, 2)
    elif change == "no_driver":
        monkeypatch.setattr(driver, "launch_kernel_ex", lambda: None)
    elif change == "device":
        split.device = 0
    elif change == "not_launched":
        prepared.split = None
    if change == "not_launched":  # asked again after the next call, where launches replay
        for replays in (False, True):
            monkeypatch.setattr("flashsplit.triton.backend.fast_relaunch_available", lambda: replays)
            assert prepared.host_program(tensors) is (None if replays else False)
    else:
        assert prepared.host_program(tensors) is False


def test_a_signature_that_disagrees_with_the_sources_gives_no_program(extension, generator, monkeypatch):
    """The compiled kernel's live pointers must be exactly the program's non-None sources."""
    recorder = DriverRecorder()
    prepared, tensors = _prepared(monkeypatch, generator, recorder, 3, {"seqlens"}, False)
    signature = prepared.split.compiled.src.signature
    signature["p4"] = "*i32"  # block_table: absent in the call, a parameter in the kernel
    assert prepared.host_program(tensors) is False
    signature["p4"] = "constexpr"
    assert prepared.host_program(tensors)


@pytest.mark.cpu
def test_a_signature_without_a_program_is_asked_once(generator, monkeypatch):
    """Where launches do not replay (the interpreter) a Triton signature gets no step; its
    launcher is asked for a program once, not on every call."""
    import flashsplit

    asked = []
    real = PreparedDecode.host_program
    monkeypatch.setattr(PreparedDecode, "host_program", lambda self, t: asked.append(1) or real(self, t))
    dispatch._PREPARED.clear()
    tensors = _tensors(generator, {"seqlens"}, False)
    lens = tensors.cache_seqlens.clamp(min=1)
    outs = [flashsplit.decode(tensors.q, tensors.k_cache, tensors.v_cache, cache_seqlens=lens, backend="triton")
            for _ in range(3)]
    assert dispatch.HOST_STEPS.step is None and len(asked) == 1
    assert torch.equal(outs[0], outs[2]) and not outs[0].isnan().any()
