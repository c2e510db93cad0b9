"""The api's per-signature cache of validation + plan + prepared launcher, and the workspace."""

from __future__ import annotations

import pytest
import torch

import flashsplit
from flashsplit.call import DecodeOptions, DecodeTensors
from flashsplit.problem import DecodeProblem
from flashsplit import api, dispatch, registry
from flashsplit.reference import attention_ref
from flashsplit.workspace import Workspace

from conftest import DEVICE


def _inputs(generator, batch=2, seqlen_k=300, heads=(8, 2), dim=32, dtype=torch.float16):
    q = torch.randn(batch, 1, heads[0], dim, generator=generator).to(DEVICE, dtype)
    k = torch.randn(batch, seqlen_k, heads[1], dim, generator=generator).to(DEVICE, dtype)
    v = torch.randn(batch, seqlen_k, heads[1], dim, generator=generator).to(DEVICE, dtype)
    return q, k, v


def _signature(q, k, v, out, lens, fresh_out=False, lse=None, **options):
    return dispatch.signature(DecodeTensors(q, k, v, out, lse, lens), DecodeOptions(**options), fresh_out)


def test_repeated_signature_reuses_the_prepared_launcher_and_stays_exact(generator):
    lens = torch.tensor([300, 129], dtype=torch.int32, device=DEVICE)
    dispatch._PREPARED.clear()
    for step in range(3):  # new values each step, same static facts
        q, k, v = _inputs(generator)
        lens[1] = 100 + 50 * step
        out = torch.full_like(q, float("nan"))
        flashsplit.decode(q, k, v, cache_seqlens=lens, num_splits=3, out=out, backend="triton")
        ref, _ = attention_ref(q, k, v, lens)
        torch.testing.assert_close(out.double(), ref, atol=2e-3, rtol=2e-3)
    assert len(dispatch._PREPARED) == 1
    registry.invalidate()  # what register() and the cute flag fixtures do: choices may differ now
    assert not dispatch._PREPARED


def test_cached_signature_still_rejects_bad_inputs(generator):
    q, k, v = _inputs(generator)
    lens = torch.tensor([300, 7], dtype=torch.int32, device=DEVICE)
    flashsplit.decode(q, k, v, cache_seqlens=lens, backend="triton")
    with pytest.raises(TypeError, match="cache_seqlens"):
        flashsplit.decode(q, k, v, cache_seqlens=lens.long(), backend="triton")
    with pytest.raises(ValueError, match="k_cache"):
        flashsplit.decode(q, k[:, :, :1], v, cache_seqlens=lens, backend="triton")
    with pytest.raises(TypeError, match="softmax_scale"):
        flashsplit.decode(q, k, v, cache_seqlens=lens, softmax_scale=True, backend="triton")


def test_the_last_signature_shortcut_still_rejects_odd_options(generator):
    """A call whose facts match the last cached call's but whose options are odd objects (a
    tensor, a bool bound) gets validation's error, never a cached launch or a tensor's own
    comparison error."""
    q, k, v = _inputs(generator)
    lens = torch.tensor([300, 7], dtype=torch.int32, device=DEVICE)
    flashsplit.decode(q, k, v, cache_seqlens=lens, softmax_scale=0.5, window_size=(1, -1), backend="triton")
    assert dispatch._PREPARED.last[1] is not None
    with pytest.raises(TypeError, match="softmax_scale"):
        flashsplit.decode(q, k, v, cache_seqlens=lens, softmax_scale=torch.tensor([0.5, 0.5]), window_size=(1, -1),
                          backend="triton")
    with pytest.raises(TypeError, match="window_size"):
        flashsplit.decode(q, k, v, cache_seqlens=lens, softmax_scale=0.5, window_size=(True, -1), backend="triton")
    with pytest.raises(TypeError, match="window_size"):
        flashsplit.decode(q, k, v, cache_seqlens=lens, softmax_scale=0.5,
                          window_size=(torch.tensor([1, 1]), -1), backend="triton")


def test_the_last_signature_shortcut_follows_every_change_of_the_cache(generator):
    q, k, v = _inputs(generator)
    lens = torch.tensor([300, 7], dtype=torch.int32, device=DEVICE)
    dispatch._PREPARED.clear()
    flashsplit.decode(q, k, v, cache_seqlens=lens, backend="triton")
    key = _signature(q, k, v, None, lens, fresh_out=True, backend="triton")
    assert dispatch._PREPARED.last == (key, dispatch._PREPARED[key])
    calls = []
    dispatch._PREPARED[key] = calls.append  # a replaced entry is what the next call runs
    flashsplit.decode(q, k, v, cache_seqlens=lens, backend="triton")
    assert len(calls) == 1
    del dispatch._PREPARED[key]  # and a removed one is prepared again
    out = torch.full_like(q, float("nan"))
    flashsplit.decode(q, k, v, cache_seqlens=lens, out=out, backend="triton")
    flashsplit.decode(q, k, v, cache_seqlens=lens, backend="triton")
    assert len(calls) == 1 and not out.isnan().any()
    dispatch._PREPARED.clear()
    assert dispatch._PREPARED.last[1] is None
    with pytest.raises(TypeError, match="item assignment"):
        dispatch._PREPARED.update({key: calls.append})


def test_signature_tells_apart_what_validation_and_specialization_read(generator):
    q, k, v = _inputs(generator)
    out = torch.empty_like(q)
    lens = torch.tensor([300, 7], dtype=torch.int32, device=DEVICE)
    base = _signature(q, k, v, out, lens)
    assert base == _signature(q.clone(), k.clone(), v.clone(), torch.empty_like(q), lens.clone())
    wide = torch.randn(2, 300, 2, 40, generator=generator).to(DEVICE, torch.float16)
    different = [
        _signature(q, k, v, out, None),  # no cache_seqlens
        _signature(q, k, v, out, lens.long()),  # dtype
        _signature(q, k[:, :200], v[:, :200], out, lens),  # shape
        _signature(q, wide[..., 4:36], v, out, lens),  # strides and a pointer off 16-byte alignment
        _signature(q, k, v, out, lens, causal=0),  # a non-bool causal is validated, not cached as False
        _signature(q, k, v, out, lens, num_splits=True),
        _signature(q, k, v, out, lens, softmax_scale=0.5),
        _signature(q, k, v, out, lens, backend="triton"),
    ]
    assert all(d != base for d in different)
    assert len(set(different)) == len(different)
    assert _signature([1], k, v, out, lens) is None  # a wrong type is never cached: validation names it


def test_fresh_output_key_follows_from_q_and_never_serves_a_misaligned_out(generator):
    """decode() keys its own ``torch.empty_like(q)`` by a marker; a caller's ``out`` is keyed by
    its facts, so a misaligned one never reuses a launcher prepared for a fresh output."""
    q, k, v = _inputs(generator)
    lens = torch.tensor([300, 7], dtype=torch.int32, device=DEVICE)
    fresh = _signature(q, k, v, torch.empty_like(q), lens, fresh_out=True)
    assert fresh == _signature(q.clone(), k, v, torch.empty_like(q), lens, fresh_out=True)
    assert fresh != _signature(q, k, v, torch.empty_like(q), lens)
    misaligned = torch.empty(q.numel() + 1, dtype=q.dtype, device=DEVICE)[1:].view(q.shape)
    assert _signature(q, k, v, misaligned, lens) not in (fresh, _signature(q, k, v, torch.empty_like(q), lens))
    # q's strides are in the key, so a non-dense q (whose empty_like is contiguous) keys apart
    q_strided = torch.randn(2, 1, 16, 32, generator=generator).to(DEVICE, q.dtype)[:, :, ::2]
    assert torch.empty_like(q_strided).stride() != q_strided.stride()
    assert _signature(q_strided, k, v, torch.empty_like(q_strided), lens, fresh_out=True) != fresh
    out = flashsplit.decode(q_strided, k, v, cache_seqlens=lens, backend="triton")
    ref, _ = attention_ref(q_strided, k, v, lens)
    torch.testing.assert_close(out.double(), ref, atol=2e-3, rtol=2e-3)


def test_workspace_reuses_memory_on_the_cpu_only_per_call():
    ws = Workspace()
    a, b = ws.get(torch.device("cpu"), 10), ws.get(torch.device("cpu"), 10)
    assert a.numel() == b.numel() == 10 and a.data_ptr() != b.data_ptr()  # no reuse off CUDA


@pytest.mark.gpu
def test_workspace_is_per_stream_and_fresh_during_capture():
    ws = Workspace()
    device = torch.device("cuda")
    a, b = ws.get(device, 100), ws.get(device, 50)
    assert a.data_ptr() == b.data_ptr() and b.numel() == 50
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        c = ws.get(device, 100)
    assert c.data_ptr() != a.data_ptr()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        d = ws.get(device, 100)
    assert d.data_ptr() not in (a.data_ptr(), c.data_ptr())


@pytest.mark.gpu
@pytest.mark.parametrize("num_splits", [1, 5, 0])
def test_triton_relaunch_replays_with_new_tensors(num_splits):
    """From the second call on, the Triton launcher replays the compiled kernels directly."""
    from flashsplit.triton.launch import Relaunch, fast_relaunch_available

    gen = torch.Generator(device="cuda").manual_seed(num_splits)
    lens = torch.tensor([4000, 1, 129, 0], dtype=torch.int32, device="cuda")
    for step in range(3):
        q = torch.randn(4, 1, 32, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
        k = torch.randn(4, 4096, 8, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
        v = torch.randn(4, 4096, 8, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
        lens[0] = 4000 + step
        out = torch.full_like(q, float("nan"))
        lse = torch.full((4, 32, 1), float("nan"), device="cuda")
        api.decode_into(q, k, v, out, lse, cache_seqlens=lens, num_splits=num_splits, backend="triton")
        ref, ref_lse = attention_ref(q, k, v, lens)
        torch.testing.assert_close(out.double(), ref, atol=1e-2, rtol=1e-2)
        torch.testing.assert_close(lse.double(), ref_lse.double(), atol=1e-3, rtol=1e-3)
    run = dispatch._PREPARED[_signature(q, k, v, out, lens, lse=lse, num_splits=num_splits, backend="triton")]
    if fast_relaunch_available():
        assert isinstance(run.split, Relaunch)


def test_misaligned_out_clears_the_16_byte_flag_and_still_decodes(generator):
    """cute stores the output with 16-byte vectors, so a misaligned ``out`` keeps it off cute
    (its supports() names the reason); Triton writes it correctly."""
    from flashsplit.validation import check_decode_inputs

    q, k, v = _inputs(generator)
    out = torch.empty(q.numel() + 1, dtype=q.dtype, device=DEVICE)[1:].view(q.shape)  # 2 bytes off
    problem = check_decode_inputs(DecodeTensors(q, k, v, out))
    assert not problem.aligned_16b
    assert check_decode_inputs(DecodeTensors(q, k, v, torch.empty_like(q))).aligned_16b
    flashsplit.decode(q, k, v, out=out)
    ref, _ = attention_ref(q, k, v)
    torch.testing.assert_close(out.double(), ref, atol=2e-3, rtol=2e-3)


@pytest.mark.parametrize("merge", [True, False])
def test_prepared_triton_replay_passes_addresses_in_kernel_order(merge, generator, monkeypatch):
    """After the first call, PreparedDecode hands its Relaunch handles device addresses (ints;
    None where the kernel was compiled without that pointer), the partials at the workspace's
    base and right after the rows * head_dim outputs; the arrival counters last when the split
    kernel merges, else a combine launch follows. Fakes stand in for the compiled kernels."""
    from flashsplit.registry import get
    from flashsplit.triton.backend import PreparedDecode, TritonBackend

    backend = get("triton")
    monkeypatch.setattr(TritonBackend, "merge_max_splits", 256 if merge else 0)
    q, k, v = _inputs(generator, batch=2, heads=(8, 2), dim=32)
    lens = torch.tensor([300, 9], dtype=torch.int32, device=DEVICE)
    out, lse = torch.empty_like(q), torch.empty(2, 8, 1, device=DEVICE)
    prepared = PreparedDecode(backend, 3, 0.2, False)
    calls = []
    prepared.split, prepared.combine = _FakeRelaunch("split", calls), _FakeRelaunch("combine", calls)
    bases, counters = [], []
    real_arrivals = backend.arrivals_for
    _record_workspace(backend.workspace, bases, monkeypatch)
    monkeypatch.setattr(backend, "arrivals_for", lambda q: counters.append(real_arrivals(q)) or counters[-1])
    # (a CUDA q takes the counters' cached address: route it through the recorded call)
    monkeypatch.setattr(backend.arrivals, "address_for", lambda key, q: backend.arrivals_for(q).data_ptr())
    prepared(DecodeTensors(q, k, v, out, lse, lens))
    op = bases[0].data_ptr()
    lp = op + 3 * 2 * 1 * 8 * 32 * 4  # splits x batch x L_q x heads x head_dim fp32
    assert bases[0].numel() >= 3 * 2 * 8 * 33
    addresses = (q.data_ptr(), k.data_ptr(), v.data_ptr(), lens.data_ptr(), None, None, None, op, lp,
                 out.data_ptr(), lse.data_ptr())
    # (the arrival counters, then the sinks, cache_leftpad, cache_batch_idx, the rotary tables and
    # the new keys and values: None without them)
    if merge:
        assert calls == [("split", (*addresses, counters[0].data_ptr(), None, None, None, None, None, None, None))]
        assert counters[0].numel() >= 2 * 2 and int(counters[0].abs().sum()) == 0  # [B, H_kv x row blocks]
    else:
        assert calls == [("split", (*addresses, None, None, None, None, None, None, None, None)),
                         ("combine", (op, lp, lens.data_ptr(), out.data_ptr(), lse.data_ptr(), None, None))]
        assert counters == []


class _FakeRelaunch:
    """Stands in for a :class:`~flashsplit.triton.launch.Relaunch`: records the addresses."""

    device = 0  # the current CUDA device's index (on the GPU)

    def __init__(self, name, calls):
        self.name, self.calls = name, calls

    def __call__(self, pointers, stream=None):
        self.calls.append((self.name, pointers))


def _record_workspace(workspace, bases, monkeypatch):
    """Append every buffer ``workspace`` hands out (through either entry point) to ``bases``."""
    real_buffer, real_stream_buffer = workspace.buffer, workspace.stream_buffer
    monkeypatch.setattr(workspace, "buffer", lambda *a: bases.append(real_buffer(*a)) or bases[-1])
    monkeypatch.setattr(workspace, "stream_buffer", lambda *a: bases.append(real_stream_buffer(*a)) or bases[-1])


class _FakeCompiled:
    """Stands in for a compiled Triton kernel: records the arguments of each ``run``."""

    function, packed_metadata = "fn", "packed"

    def __init__(self):
        self.seen = []

    def run(self, *args):
        self.seen.append(args)

    def launch_metadata(self, grid, stream, *args):
        return ("meta", grid, stream)


def test_relaunch_forwards_grid_stream_and_arguments(monkeypatch):
    """Relaunch calls the compiled kernel's launcher the way triton 3.6's JITFunction.run does."""
    from flashsplit.triton import launch

    compiled = _FakeCompiled()
    seen = compiled.seen
    monkeypatch.setattr(launch, "current_stream", lambda device: 1000 + device)
    hooks = launch.triton.knobs.runtime
    monkeypatch.setattr(hooks, "launch_enter_hook", None)
    monkeypatch.setattr(hooks, "launch_exit_hook", None)
    relaunch = launch.Relaunch(compiled, (3, 2, 1), tail=(7, True), device=0)
    relaunch((111, None))
    assert seen[-1] == (3, 2, 1, 1000, "fn", "packed", None, None, None, 111, None, 7, True)
    monkeypatch.setattr(hooks, "launch_enter_hook", "enter")
    relaunch((111, None))
    assert seen[-1][6] == ("meta", (3, 2, 1), 1000) and seen[-1][7] == "enter"


def test_relaunch_skips_empty_hook_chains(monkeypatch):
    """triton 3.6's hooks are HookChain objects, never None: empty ones are passed as None (no
    launch metadata built, no hook called); a registered hook gets both chains and the metadata."""
    from triton.knobs import HookChain

    from flashsplit.triton import launch

    compiled = _FakeCompiled()
    seen = compiled.seen
    enter, leave = HookChain(), HookChain(reversed=True)
    monkeypatch.setattr(launch, "current_stream", lambda device: 5)
    monkeypatch.setattr(launch.triton.knobs.runtime, "launch_enter_hook", enter)
    monkeypatch.setattr(launch.triton.knobs.runtime, "launch_exit_hook", leave)
    relaunch = launch.Relaunch(compiled, (1, 1, 1), tail=(), device=0)
    relaunch((1,))
    assert seen[-1][6:9] == (None, None, None)
    leave.add(print)
    relaunch((1,))
    assert seen[-1][6:9] == (("meta", (1, 1, 1), 5), enter, leave)


def test_relaunch_keeps_an_exit_hook_alone(monkeypatch):
    """An exit hook without an enter hook still takes Triton's own path (the C launcher calls
    it), with the launch metadata; no hook at all takes the direct path."""
    from flashsplit.triton import launch

    compiled = _FakeCompiled()
    seen = compiled.seen
    monkeypatch.setattr(launch, "current_stream", lambda device: 9)
    monkeypatch.setattr(launch.triton.knobs.runtime, "launch_enter_hook", None)
    monkeypatch.setattr(launch.triton.knobs.runtime, "launch_exit_hook", print)
    relaunch = launch.Relaunch(compiled, (2, 1, 1), tail=(5,), device=0)
    relaunch((3, None), 11)
    assert seen[-1] == (2, 1, 1, 11, "fn", "packed", ("meta", (2, 1, 1), 11), None, print, 3, None, 5)
    monkeypatch.setattr(launch.triton.knobs.runtime, "launch_exit_hook", None)
    relaunch((3, None), 11)
    assert seen[-1] == (2, 1, 1, 11, "fn", "packed", None, None, None, 3, None, 5)


def test_relaunch_calls_the_c_launcher_directly_when_no_scratch_is_needed(monkeypatch):
    """Without scratch memory, Relaunch skips CudaLauncher.__call__ and passes the C launcher
    the argument list of triton 3.6's driver (cooperative/pdl flags, two scratch slots, the
    packed metadata, launch metadata, hooks, then the kernel arguments)."""
    from flashsplit.triton import launch

    seen = []

    class FakeRun:
        global_scratch_size = profile_scratch_size = 0
        launch_cooperative_grid, launch_pdl = False, True

        def launch(self, *args):
            seen.append(("c", args))

        def __call__(self, *args):
            seen.append(("py", args))

    class FakeCompiled:
        function, packed_metadata = "fn", (4, 1, 0)

        def __init__(self, scratch):
            self.run = FakeRun()
            self.run.global_scratch_size = scratch

    monkeypatch.setattr(launch, "current_stream", lambda device: 7)
    monkeypatch.setattr(launch.triton.knobs.runtime, "launch_enter_hook", None)
    monkeypatch.setattr(launch.triton.knobs.runtime, "launch_exit_hook", None)
    launch.Relaunch(FakeCompiled(0), (5, 1, 1), tail=(3,), device=0)((99, None))
    assert seen[-1] == ("c", (5, 1, 1, 7, "fn", False, True, None, None, (4, 1, 0), None, None, None, 99, None, 3))
    launch.Relaunch(FakeCompiled(256), (5, 1, 1), tail=(3,), device=0)((99, None))  # needs scratch
    assert seen[-1] == ("py", (5, 1, 1, 7, "fn", (4, 1, 0), None, None, None, 99, None, 3))


@pytest.mark.parametrize("num_splits, with_lse, merge",
                         [(3, True, False), (3, False, False), (1, False, False), (3, True, True), (3, False, True),
                          (1, False, True)])
def test_prepared_cute_launches_with_workspace_addresses(num_splits, with_lse, merge, generator, monkeypatch):
    """PreparedCuteDecode computes the static launch arguments once, then passes each launch the
    tensors' addresses, the partials at the workspace's base and after the S x rows x D outputs,
    and (no lse asked for) an lse scratch after the partial LSEs. With the in-kernel merge
    (``CuteBackend.merge_max_splits`` >= the splits) a launch of several splits is one split-kernel
    launch that also gets ``out``, the lse and zeroed arrival counters; otherwise the combine
    follows. Fakes stand in for the compiled kernels (no cutlass launch on the CPU)."""
    from flashsplit.cute import backend as cute_backend, launch_args, launcher as cute_launcher
    from flashsplit.validation import check_decode_inputs

    monkeypatch.setattr(cute_backend.CuteBackend, "merge_max_splits", 16 if merge else 1)
    backend = cute_backend.CuteBackend()
    q, k, v = _inputs(generator, batch=2, heads=(8, 2), dim=32)
    lens = torch.tensor([300, 9], dtype=torch.int32, device=DEVICE)
    out = torch.empty_like(q)
    lse = torch.empty(2, 8, 1, device=DEVICE) if with_lse else None
    setups, launches, bases, counters = [], [], [], []

    def split_launch(self, q_, k_, v_, seqlens, table, splits, scale, causal, o, lse_, partials, kd, vd, out_=None,
                     one_per_sm=False, one_wave=False, swap=False, variant=None, sinks=None, split_ctas=0,
                     heads_first=False, cluster=False):
        assert heads_first is False and cluster is False  # the choice's defaults
        setups.append(("split", o.shape, lse_.shape, partials, out_ is out))
        static = {name: 7 for name in launch_args.static_names(launch_args.SPLIT_ARGS)}
        return cute_launcher.SplitLaunch("split-kernel", static, {}, None)

    def combine_launch(self, out_partial, lse_partial, out_, sinks=None):
        setups.append(("combine", out_partial.shape, lse_partial.shape))
        static = {name: 11 for name in launch_args.static_names(launch_args.COMBINE_ARGS)}
        return cute_launcher.CombineLaunch("combine-kernel", static, {})

    monkeypatch.setattr(cute_launcher.CuteLauncher, "split_launch", split_launch)
    monkeypatch.setattr(cute_launcher.CuteLauncher, "combine_launch", combine_launch)
    monkeypatch.setattr(cute_launcher, "_run", lambda kernel, raw, library_args: launches.append((kernel, raw)))
    _record_workspace(backend.launcher.workspace, bases, monkeypatch)
    real_counters = backend.launcher.arrivals.get
    monkeypatch.setattr(backend.launcher.arrivals, "get",
                        lambda *a: counters.append(real_counters(*a)) or counters[-1])
    monkeypatch.setattr(backend.launcher.arrivals, "address_for",
                        lambda key, q: backend.launcher.arrivals.for_queries(q).data_ptr())
    problem = check_decode_inputs(DecodeTensors(q, k, v, out, None, lens), DecodeOptions(num_splits=num_splits))
    prepared = backend.prepare(problem, num_splits, 0.2)
    for _ in range(2):  # the second call reuses the static arguments
        prepared(DecodeTensors(q, k, v, out, lse, lens))
    rows = 2 * 1 * 8
    partial_rows = num_splits * rows if num_splits > 1 else 0
    merged = merge and num_splits > 1
    if merged:
        assert setups == [("split", (3, 2, 1, 8, 32), (3, 2, 8, 1), True, True)]
    elif num_splits > 1:
        assert setups == [("split", (3, 2, 1, 8, 32), (3, 2, 8, 1), True, False),
                          ("combine", (3, 2, 1, 8, 32), (3, 2, 8, 1))]
    else:
        assert setups == [("split", (2, 1, 8, 32), (2, 8, 1), False, False)]
    assert bases[0].numel() >= partial_rows * 33 + (0 if with_lse else rows)
    op = bases[-1].data_ptr()
    lp = op + partial_rows * 32 * 4
    lse_ptr = lse.data_ptr() if with_lse else lp + partial_rows * 4
    seqlens = lens.data_ptr()
    # The split launch: the table and the left padding are seqlens when dense and unpadded, the
    # descales lse when none, the merge's out / lse / counters o / lse / lse when not merging;
    # every static argument the launch's (7).
    o_ptr, l_ptr = (op, lp) if num_splits > 1 else (out.data_ptr(), lse_ptr)
    if merged:
        assert len(counters) == 2 and counters[0].numel() >= rows and not counters[0].any()
        merge_args = (out.data_ptr(), lse_ptr, counters[-1].data_ptr())
    else:
        assert counters == []
        merge_args = (o_ptr, l_ptr, l_ptr)
    split_raw = dict(q_ptr=q.data_ptr(), k_ptr=k.data_ptr(), v_ptr=v.data_ptr(), o_ptr=o_ptr, lse_ptr=l_ptr,
                     seqlens_ptr=seqlens, block_table_ptr=seqlens, k_descale_ptr=l_ptr, v_descale_ptr=l_ptr,
                     **dict(zip(("out_ptr", "out_lse_ptr", "arrivals_ptr"), merge_args)), sinks_ptr=l_ptr,
                     leftpad_ptr=seqlens, stream=0)
    expected = [("split-kernel", launch_args.SPLIT_ARGS, split_raw, 7)]
    if num_splits > 1 and not merged:
        combine_raw = dict(op_ptr=op, lp_ptr=lp, o_ptr=out.data_ptr(), lse_ptr=lse_ptr, sinks_ptr=lse_ptr, stream=0)
        expected.append(("combine-kernel", launch_args.COMBINE_ARGS, combine_raw, 11))
    assert len(launches) == 2 * len(expected)
    for (kernel, raw), (want_kernel, schema, per_call, static) in zip(launches[-len(expected):], expected):
        assert kernel == want_kernel
        assert dict(zip([a.name for a in schema], raw)) == {a.name: per_call[a.name] if a.per_call else static
                                                           for a in schema}


@pytest.mark.parametrize("batch, seqlen_k, deep", [(16, 4096, True), (64, 4096, False)])
def test_prepared_cute_takes_the_planned_tile(batch, seqlen_k, deep, monkeypatch):
    """``CuteBackend.prepare`` hands the plan's tile choice (one CTA per SM or two) to the
    launcher, which asks for that compile key: the plan and the kernel agree on the CTAs per SM."""
    from flashsplit.cute import backend as cute_backend

    problem = DecodeProblem(batch=batch, seqlen_q=1, seqlen_k=seqlen_k, num_heads=32, num_heads_kv=8, head_dim=128,
                            dtype=torch.bfloat16, causal=False, has_cache_seqlens=True, device_type="cuda")
    from flashsplit.cute import choice, launcher as cute_launcher

    backend = cute_backend.CuteBackend()
    assert choice.one_cta_per_sm(problem, 132) == deep
    seen = []

    def split_launch(self, *args, one_per_sm=False, **kwargs):
        seen.append(one_per_sm)
        return cute_launcher.SplitLaunch("split-kernel", {n: 7 for n in cute_launcher._SPLIT_STATIC}, {}, None)

    monkeypatch.setattr(cute_launcher.CuteLauncher, "split_launch", split_launch)
    monkeypatch.setattr(cute_launcher, "_run", lambda kernel, raw, library_args: None)
    prepared = backend.prepare(problem, 1, 0.1)
    assert prepared.tile.one_per_sm == deep
    q = torch.zeros(1, 1, 4, 32, dtype=torch.float16)
    k = torch.zeros(1, 64, 1, 32, dtype=torch.float16)
    prepared(DecodeTensors(q, k, k, torch.empty_like(q), None, torch.tensor([64], dtype=torch.int32)))
    assert seen == [deep]
