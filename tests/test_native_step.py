"""The native host step launches what the Python eager path launches, and only for its signature.

Host functions are stand-ins: ``ctypes`` callbacks that record the per-call slots they are
handed (or report a CUDA error), and the extension's own no-op. The CuTe configurations are
those of ``test_cute_eager.py``, whose fake kernels record the Python eager path's values.
"""

from __future__ import annotations

import ctypes

import pytest
import torch

from flashsplit import dispatch, native
from flashsplit.call import DecodeOptions, DecodeTensors
from flashsplit.cute import backend as cute_backend, eager
from flashsplit.native import steps
from flashsplit.validation import check_decode_inputs
from flashsplit.workspace import transient_scratch

from conftest import DEVICE
from test_cute_eager import _ARRIVALS, _fake_kernels, _tensors

_HOST_FUNCTION = ctypes.CFUNCTYPE(None, ctypes.POINTER(ctypes.c_void_p))


@pytest.fixture(scope="module")
def extension():
    module = native.module()
    assert module is not None, f"the native host step did not build: {native.status()}"
    return module


@pytest.fixture(autouse=True)
def no_stand_in_steps_after():
    """A step with stand-in launches must never serve a later test's decode()."""
    yield
    dispatch.HOST_STEPS.clear()


class RecordingLaunch:
    """A stand-in fixed launch: its host function records the ``n`` per-call slots it sees."""

    def __init__(self, n: int, fail_with: int = 0):
        self.slots = (ctypes.c_uint64 * max(1, n))()
        self.result = ctypes.c_int32(0)
        self.packed = (ctypes.c_void_p * 1)()
        self.seen: list[tuple[int, ...]] = []
        self.per_call_codes = ("Q",) * n

        def host_function(packed):
            self.seen.append(tuple(self.slots[:n]))
            self.result.value = fail_with

        self.function = _HOST_FUNCTION(host_function)
        self.raw = (ctypes.cast(self.function, ctypes.c_void_p).value, ctypes.addressof(self.packed),
                    ctypes.addressof(self.slots), ctypes.addressof(self.result))


def _step_args(tensors: DecodeTensors, options: DecodeOptions, with_lse: bool, **changes):
    """A HostStep's arguments for a ``decode()`` call of ``tensors`` (out and lse made by the step)."""
    args = dict(q=tensors.q, k_cache=tensors.k_cache, v_cache=tensors.v_cache, out=None,
                cache_seqlens=tensors.cache_seqlens, block_table=tensors.block_table, page_table=None,
                k_descale=tensors.k_descale, v_descale=tensors.v_descale, sinks=tensors.sinks, k=None, v=None,
                rotary_cos=None, rotary_sin=None, cache_batch_idx=tensors.cache_batch_idx,
                cache_leftpad=tensors.cache_leftpad, return_lse=with_lse)
    opts = options._asdict()
    for name, value in changes.items():
        (args if name in args else opts)[name] = value
    assert list(args) == list(native.STEP_ARGS)
    return (*args.values(), *opts.values())


def _prepared_cute(monkeypatch, generator, extra="", with_lse=False, num_splits=3, merge=True):
    """A prepared CuTe decode after its first (fake) launch, its workspace and counters on stream 5."""
    monkeypatch.setattr(cute_backend.CuteBackend, "merge_max_splits", 16 if merge else 1)
    backend = cute_backend.CuteBackend()
    general, fast = [], []
    _fake_kernels(monkeypatch, general, fast)
    tensors = _tensors(generator, extra, with_lse)
    options = DecodeOptions(num_splits=num_splits, backend="cute")
    prepared = backend.prepare(check_decode_inputs(tensors, options), num_splits, 0.2)
    buffer = torch.empty(1 << 16, device=DEVICE)
    workspace = backend.launcher.workspace
    monkeypatch.setattr(workspace, "buffer", lambda *a: buffer)
    monkeypatch.setattr(workspace, "stream_buffer", lambda *a: buffer)
    monkeypatch.setattr(backend.launcher.arrivals, "address_for", lambda key, q: _ARRIVALS)
    monkeypatch.setattr(eager, "_raw_stream", lambda index: 5)
    monkeypatch.setattr(eager, "_capturing", lambda: False)
    prepared(tensors)
    prepared.eager = eager.eager_path(prepared, tensors, 0)
    monkeypatch.setitem(workspace.addresses, (0, 5), (buffer.numel(), buffer.data_ptr()))
    monkeypatch.setitem(backend.launcher.arrivals.addresses, (0, 5), (1 << 10, _ARRIVALS))
    return prepared, tensors, options, fast


def _native_step(prepared, tensors, options, monkeypatch, fail_with: int = 0):
    """(step, recording launches, host program) from ``prepared``'s host program."""
    from flashsplit.cute import launch_args, launcher as cute_launcher

    recorded = []

    def fixed(self):
        schema = launch_args.SPLIT_ARGS if isinstance(self, cute_launcher.SplitLaunch) else launch_args.COMBINE_ARGS
        launch = RecordingLaunch(sum(arg.per_call for arg in schema), fail_with)
        recorded.append(launch)
        return launch

    with monkeypatch.context() as patch:
        for cls in (cute_launcher.SplitLaunch, cute_launcher.CombineLaunch):
            patch.setattr(cls, "fixed", fixed)
        program = prepared.host_program(tensors)
    program = program._replace(device_index=0)  # the CPU tensors' stand-in CUDA device
    step = steps.build_step(program, tensors, options)
    assert step is not None
    return step, recorded, program


@pytest.mark.parametrize("extra", ["", "paged", "descale", "sinks", "batch_idx", "leftpad"])
@pytest.mark.parametrize("num_splits, merge", [(1, False), (3, True), (3, False)])
@pytest.mark.parametrize("with_lse", [False, True])
def test_native_step_launches_what_the_eager_path_launches(extension, num_splits, merge, with_lse, extra, generator,
                                                           monkeypatch):
    prepared, tensors, options, fast = _prepared_cute(monkeypatch, generator, extra, with_lse, num_splits, merge)
    step, recorded, _ = _native_step(prepared, tensors, options, monkeypatch)
    for _ in range(2):  # new q and lengths: each call's addresses are read
        tensors = tensors._replace(q=tensors.q.clone(), cache_seqlens=tensors.cache_seqlens.clone())
        result = step(*_step_args(tensors, options, with_lse))
        assert result is not None
        out, lse = result if with_lse else (result, None)
        assert out.shape == tensors.q.shape and out.dtype == tensors.q.dtype and out.device == tensors.q.device
        assert out.stride() == tensors.q.stride()
        if with_lse:
            assert lse.shape == (tensors.q.shape[0], tensors.q.shape[2], tensors.q.shape[1])
            assert lse.dtype == torch.float32 and lse.is_contiguous()
        fast.clear()
        assert prepared.eager(tensors._replace(out=out, lse=lse))
        assert [launch.seen[-1] for launch in recorded] == [values[:-1] + (5,) for _, values in fast]
    assert step.calls == 2 * len(recorded)


def test_native_step_declines_every_other_call(extension, generator, monkeypatch):
    """Any other fact, option, type or state: None (the Python path runs), nothing launched."""
    prepared, tensors, options, _ = _prepared_cute(monkeypatch, generator, "descale", False)
    step, recorded, program = _native_step(prepared, tensors, options, monkeypatch)
    q, k = tensors.q, tensors.k_cache
    wider = torch.empty(q.shape[:-1] + (2 * q.shape[-1],), dtype=q.dtype, device=q.device)
    declined = {
        "q shape": dict(q=q[:1]),
        "q strides": dict(q=wider[..., : q.shape[-1]].copy_(q)),
        "q dtype": dict(q=q.float()),
        "q 16-byte residue": dict(q=torch.empty(q.numel() + 1, dtype=q.dtype, device=q.device)[1:].view(q.shape)),
        "q a subclass": dict(q=torch.nn.Parameter(q, requires_grad=False)),
        "q not a tensor": dict(q=q.tolist()),
        "k_cache shape": dict(k_cache=k[:, :-1]),
        "cache_seqlens absent": dict(cache_seqlens=None),
        "block_table given": dict(block_table=torch.zeros(2, 1, dtype=torch.int32, device=q.device)),
        "sinks given": dict(sinks=torch.zeros(q.shape[2], device=q.device)),
        "k_descale negated": dict(k_descale=torch._neg_view(tensors.k_descale)),
        "out given": dict(out=torch.empty_like(q)),
        "lse asked for": dict(return_lse=True),
        "return_lse not a bool": dict(return_lse=0),
        "softmax_scale": dict(softmax_scale=0.5),
        "causal an int": dict(causal=0),
        "num_splits": dict(num_splits=2),
        "backend": dict(backend="auto"),
        "window_size a list": dict(window_size=[-1, -1]),
        "window_size bounds bools": dict(window_size=(-1, False)),
        "softcap an int": dict(softcap=0),
        "page_table and block_table": dict(page_table=torch.zeros(2, 1, dtype=torch.int32, device=q.device)),
    }
    assert step(*_step_args(tensors, options, False)) is not None
    launched = step.calls
    for why, change in declined.items():
        assert step(*_step_args(tensors, options, False, **change)) is None, why
    assert step.calls == launched
    with transient_scratch():
        assert step(*_step_args(tensors, options, False)) is None, "transient scratch"
    workspaces = prepared.launcher.workspace.addresses
    numel, address = workspaces[(0, 5)]
    workspaces[(0, 5)] = (program.workspace_numel - 1, address)
    assert step(*_step_args(tensors, options, False)) is None, "workspace too small"
    del workspaces[(0, 5)]
    assert step(*_step_args(tensors, options, False)) is None, "no workspace on this stream"
    workspaces[(0, 5)] = numel, address
    counters = prepared.launcher.arrivals.addresses
    counters[(0, 5)] = (1, _ARRIVALS)
    assert step(*_step_args(tensors, options, False)) is None, "counters too few"
    counters[(0, 5)] = (1 << 10, _ARRIVALS)
    assert step.calls == launched
    assert step(*_step_args(tensors, options, False)) is not None
    with pytest.raises(TypeError, match="positional arguments"):
        step(*_step_args(tensors, options, False)[:-1])


def test_native_step_declines_while_capturing(extension, generator, monkeypatch):
    prepared, tensors, options, _ = _prepared_cute(monkeypatch, generator)
    capturing = [True]
    monkeypatch.setattr(eager, "_capturing", lambda: capturing[0])
    step, _, _ = _native_step(prepared, tensors, options, monkeypatch)
    assert step(*_step_args(tensors, options, False)) is None
    capturing[0] = False
    assert step(*_step_args(tensors, options, False)) is not None


def test_native_step_takes_page_table_as_block_table(extension, generator, monkeypatch):
    prepared, tensors, options, _ = _prepared_cute(monkeypatch, generator, "paged")
    step, recorded, _ = _native_step(prepared, tensors, options, monkeypatch)
    assert step(*_step_args(tensors, options, False, block_table=None, page_table=tensors.block_table)) is not None
    assert tensors.block_table.data_ptr() in recorded[0].seen[-1]


def test_native_step_raises_a_launch_error(extension, generator, monkeypatch):
    """A host function's CUDA error is raised (by the program's raise_cuda) and reset."""
    prepared, tensors, options, _ = _prepared_cute(monkeypatch, generator)
    step, recorded, _ = _native_step(prepared, tensors, options, monkeypatch, fail_with=700)
    with pytest.raises(Exception, match="700|illegal address|CUDA"):
        step(*_step_args(tensors, options, False))
    assert recorded[0].result.value == 0


def test_decode_offers_calls_to_the_last_signatures_step(extension, generator, monkeypatch):
    """decode() tries the last offered step first, takes the Python path when it declines, and
    every change of the prepared launchers (or a registry change) drops the steps."""
    import flashsplit

    prepared, tensors, options, _ = _prepared_cute(monkeypatch, generator)
    step, recorded, _ = _native_step(prepared, tensors, options, monkeypatch)
    program = prepared.host_program
    monkeypatch.setattr(steps, "build_step", lambda program, tensors, options: step)
    host = dispatch.HOST_STEPS
    key = dispatch.signature(tensors._replace(out=None), options, fresh_out=True)
    host.offer(key, prepared, tensors, options)
    assert host.step is step and program is not None
    out = flashsplit.decode(tensors.q, tensors.k_cache, tensors.v_cache, cache_seqlens=tensors.cache_seqlens,
                            num_splits=3, backend="cute")
    assert step.calls == 1 and out.shape == tensors.q.shape
    dispatch._PREPARED.clear()
    assert host.step is None
    host.offer(key, prepared, tensors, options)
    assert host.step is step
    dispatch._PREPARED[key] = prepared  # replacing a launcher drops them too
    assert host.step is None
    del dispatch._PREPARED[key]
    host.offer(key, object(), tensors, options)  # a launcher without a host program (Triton's)
    assert host.step is None
    host.offer(None, prepared, tensors, options)  # no signature: nothing cached
    assert host.step is None


def test_native_step_off_by_environment(monkeypatch):
    monkeypatch.setenv("FLASHSPLIT_NATIVE", "0")
    assert not native.enabled()
    assert native.status() == "off (FLASHSPLIT_NATIVE=0)"
    monkeypatch.setenv("FLASHSPLIT_NATIVE", "1")
    assert native.enabled()


def test_native_build_clears_a_lock_left_by_a_killed_build(extension, tmp_path):
    """torch's build waits on its lock file while another process builds: one left behind by a
    killed build is removed once stale, so the build (here: finding the cached module) returns."""
    import os
    import subprocess
    import sys
    import time

    from torch.utils.cpp_extension import get_default_build_root

    directory = os.path.dirname(extension.__file__)
    assert os.path.dirname(directory) == get_default_build_root()
    lock = os.path.join(directory, "lock")
    with open(lock, "w"):
        pass
    old = time.time() - 2 * native._STALE_LOCK_S
    os.utime(lock, (old, old))
    code = "import flashsplit.native as n; n.module(); print(n.status())"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240)
    assert done.stdout.strip().endswith("ready"), done.stderr[-2000:]
    assert not os.path.exists(lock)
