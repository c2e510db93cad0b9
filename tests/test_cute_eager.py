"""The eager hot path of a prepared CuTe decode launches what the general path launches.

Fakes stand in for the compiled kernels (no cutlass launch): the general path's raw arguments
are recorded at ``_run``, the eager path's per-call values at its fixed launches, and both must
name the same addresses, placeholders and stream for every configuration: one split writing
the outputs, the in-kernel merge, the combine kernel, with or without an lse, sinks, fp8
descales, a block table, ``cache_batch_idx`` or ``cache_leftpad``.
"""

from __future__ import annotations

import pytest
import torch

from flashsplit.call import DecodeOptions, DecodeTensors
from flashsplit.cute import backend as cute_backend, eager, launch_args, launcher as cute_launcher
from flashsplit.validation import check_decode_inputs

from conftest import DEVICE

_ARRIVALS = 0x7F0000020000  # the counters' address the fakes hand out


def _tensors(generator, extra: str, with_lse: bool):
    batch, heads, heads_kv, dim, keys = 2, 8, 2, 32, 96
    q = torch.randn(batch, 1, heads, dim, generator=generator).to(DEVICE, torch.float16)
    kv_dtype = torch.float8_e4m3fn if extra == "descale" else torch.float16
    rows = batch + 1 if extra == "batch_idx" else batch  # cache_batch_idx picks rows of a larger cache
    shape = (6, 16, heads_kv, dim) if extra == "paged" else (rows, keys, heads_kv, dim)
    k = torch.randn(*shape, generator=generator).to(DEVICE, kv_dtype)
    v = torch.randn(*shape, generator=generator).to(DEVICE, kv_dtype)
    lens = torch.tensor([80, 9], dtype=torch.int32, device=DEVICE)
    fields = dict(q=q, k_cache=k, v_cache=v, out=torch.empty_like(q), cache_seqlens=lens,
                  lse=torch.empty(batch, heads, 1, device=DEVICE) if with_lse else None)
    if extra == "paged":
        fields["block_table"] = torch.tensor([[5, 0, 3], [1, 2, 4]], dtype=torch.int32, device=DEVICE)
    if extra == "descale":
        fields["k_descale"] = torch.rand(batch, heads_kv, generator=generator).to(DEVICE) + 0.5
        fields["v_descale"] = torch.rand(1, generator=generator).to(DEVICE) + 0.5
    if extra == "sinks":
        fields["sinks"] = torch.randn(heads, generator=generator).to(DEVICE)
    if extra == "batch_idx":
        fields["cache_batch_idx"] = torch.tensor([2, 0], dtype=torch.int32, device=DEVICE)
    if extra == "leftpad":
        fields["cache_leftpad"] = torch.tensor([3, 0], dtype=torch.int32, device=DEVICE)
    return DecodeTensors(**fields)


def _fake_kernels(monkeypatch, general: list, fast: list) -> None:
    """Split and combine launches whose general launches append ``(kernel, raw)`` to ``general``
    and whose fixed launches append ``(kernel, per-call values)`` to ``fast``."""

    def split_launch(self, *args, **kwargs):
        static = {name: 7 for name in launch_args.static_names(launch_args.SPLIT_ARGS)}
        return cute_launcher.SplitLaunch("split-kernel", static, {}, None)

    def combine_launch(self, *args, **kwargs):
        static = {name: 11 for name in launch_args.static_names(launch_args.COMBINE_ARGS)}
        return cute_launcher.CombineLaunch("combine-kernel", static, {})

    monkeypatch.setattr(cute_launcher.CuteLauncher, "split_launch", split_launch)
    monkeypatch.setattr(cute_launcher.CuteLauncher, "combine_launch", combine_launch)
    monkeypatch.setattr(cute_launcher, "_run", lambda kernel, raw, library_args: general.append((kernel, raw)))
    for cls in (cute_launcher.SplitLaunch, cute_launcher.CombineLaunch):
        monkeypatch.setattr(cls, "fixed", lambda self: lambda *values: fast.append((self.kernel, values)))


def _per_call(kernel: str, raw: tuple) -> tuple:
    schema = launch_args.SPLIT_ARGS if kernel == "split-kernel" else launch_args.COMBINE_ARGS
    return tuple(value for arg, value in zip(schema, raw) if arg.per_call)


@pytest.mark.parametrize("extra", ["", "paged", "descale", "sinks", "batch_idx", "leftpad"])
@pytest.mark.parametrize("num_splits, merge", [(1, False), (3, True), (3, False)])
@pytest.mark.parametrize("with_lse", [False, True])
def test_eager_path_launches_what_the_general_path_launches(num_splits, merge, with_lse, extra, generator,
                                                            monkeypatch):
    monkeypatch.setattr(cute_backend.CuteBackend, "merge_max_splits", 16 if merge else 1)
    backend = cute_backend.CuteBackend()
    general, fast = [], []
    _fake_kernels(monkeypatch, general, fast)
    tensors = _tensors(generator, extra, with_lse)
    problem = check_decode_inputs(tensors, DecodeOptions(num_splits=num_splits))
    prepared = backend.prepare(problem, num_splits, 0.2)
    buffer = torch.empty(1 << 16, device=DEVICE)
    workspace = backend.launcher.workspace
    monkeypatch.setattr(workspace, "buffer", lambda *a: buffer)
    monkeypatch.setattr(workspace, "stream_buffer", lambda *a: buffer)
    monkeypatch.setattr(backend.launcher.arrivals, "address_for", lambda key, q: _ARRIVALS)
    stream = torch.cuda.current_stream().cuda_stream if DEVICE == "cuda" else 0
    monkeypatch.setattr(eager, "_raw_stream", lambda index: stream)
    monkeypatch.setattr(eager, "_capturing", lambda: False)
    prepared(tensors)  # the general path: first launch
    run = eager.eager_path(prepared, tensors, 0)
    assert run is not None
    key = (0, stream)
    monkeypatch.setitem(workspace.addresses, key, (buffer.numel(), buffer.data_ptr()))
    monkeypatch.setitem(backend.launcher.arrivals.addresses, key, (1 << 10, _ARRIVALS))
    general.clear()
    for _ in range(2):  # fresh output, lse and lengths: the eager path reads each call's addresses
        tensors = tensors._replace(out=torch.empty_like(tensors.out), cache_seqlens=tensors.cache_seqlens.clone(),
                                   lse=None if tensors.lse is None else torch.empty_like(tensors.lse))
        assert run(tensors)
        prepared.eager = False
        prepared(tensors)
    assert [kernel for kernel, _ in fast] == [kernel for kernel, _ in general]
    assert len(fast) == 2 * (2 if num_splits > 1 and not merge else 1)
    assert [values for _, values in fast] == [_per_call(kernel, raw) for kernel, raw in general]
    assert any(values[-1] == stream for _, values in fast)


def test_eager_path_declines_where_the_general_path_must_run(generator, monkeypatch):
    """Capturing, transient scratch, a workspace or counters too small or not made on this
    stream: the eager path launches nothing and says so; a configuration that appends new keys
    has none."""
    from flashsplit.problem import Variant
    from flashsplit.workspace import transient_scratch

    monkeypatch.setattr(cute_backend.CuteBackend, "merge_max_splits", 16)
    backend = cute_backend.CuteBackend()
    general, fast = [], []
    _fake_kernels(monkeypatch, general, fast)
    tensors = _tensors(generator, "", False)
    prepared = backend.prepare(check_decode_inputs(tensors, DecodeOptions(num_splits=3)), 3, 0.2)
    prepared(tensors)
    capturing = [False]
    monkeypatch.setattr(eager, "_raw_stream", lambda index: 5)
    monkeypatch.setattr(eager, "_capturing", lambda: capturing[0])
    run = eager.eager_path(prepared, tensors, 0)
    workspaces, counters = backend.launcher.workspace.addresses, backend.launcher.arrivals.addresses
    needed = 3 * 2 * 8 * 33 + 2 * 8  # partials, partial LSEs, lse scratch
    monkeypatch.setitem(counters, (0, 5), (2 * 8, _ARRIVALS))
    assert not run(tensors), "no workspace on this stream yet"
    monkeypatch.setitem(workspaces, (0, 5), (needed - 1, 1 << 20))
    assert not run(tensors), "workspace too small"
    monkeypatch.setitem(workspaces, (0, 5), (needed, 1 << 20))
    monkeypatch.setitem(counters, (0, 5), (2 * 8 - 1, _ARRIVALS))
    assert not run(tensors), "counters too few"
    monkeypatch.setitem(counters, (0, 5), (2 * 8, _ARRIVALS))
    capturing[0] = True
    assert not run(tensors), "capturing"
    capturing[0] = False
    with transient_scratch():
        assert not run(tensors), "transient scratch"
    assert fast == []
    assert run(tensors) and len(fast) == 1
    prepared.variant = Variant(seqlen_new=1)
    assert eager.eager_path(prepared, tensors, 0) is None
