"""The native host step on a GPU, for both backends: after a signature's first ``decode()``,
later calls with a fresh output launch through it, bit for bit what the Python path computes, on
another stream too (declined there until that stream has a workspace, where the launch needs
one), never inside a CUDA graph capture, and never while a Triton launch hook is set.

Skipped cleanly without CUDA; the cute cases also need compute capability 9.0 and
nvidia-cutlass-dsl.
"""

from __future__ import annotations

import pytest
import torch

import flashsplit
from flashsplit import dispatch, native
from flashsplit.testing import check_against_reference, to_paged

from conftest import CUTE_GPU_MARKS

pytestmark = pytest.mark.gpu
BACKENDS = [pytest.param("cute", marks=CUTE_GPU_MARKS[1:]), "triton"]


def _inputs(case: str, gen: torch.Generator, batch: int, keys: int = 4096):
    q_heads, kv_heads, dim = 32, 8, 128
    k = torch.randn(batch, keys, kv_heads, dim, generator=gen).to("cuda", torch.bfloat16)
    v = torch.randn(batch, keys, kv_heads, dim, generator=gen).to("cuda", torch.bfloat16)
    extra = {}
    if case == "paged":  # the rows' pages shuffled into one pool
        k_pool, v_pool, extra["page_table"], _, _ = to_paged(k, v, [keys] * batch, 128, gen, share_first_page=False)
        return k, v, k_pool, v_pool, extra
    if case == "sinks":
        extra["sinks"] = torch.randn(q_heads, generator=gen).to("cuda")
    return k, v, k, v, extra


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case, batch, num_splits, return_lse", [
    ("dense", 1, 0, False),    # B = 1: cute's in-kernel merge, Triton's combine
    ("dense", 3, 1, True),     # one split writing the outputs
    ("dense", 4, 3, False),    # three splits: merged in the split kernel
    ("dense", 2, 24, True),    # many splits: the combine kernel
    ("paged", 2, 0, False),
    ("sinks", 1, 0, True),
    ("short", 1, 0, True),     # 1k keys: cute merges its 8 splits through a cluster
])
def test_native_step_decodes_like_the_python_path(backend, case, batch, num_splits, return_lse, monkeypatch):
    assert native.module() is not None, native.status()
    dispatch._PREPARED.clear()
    gen = torch.Generator().manual_seed(batch * 31 + num_splits)
    k, v, k_cache, v_cache, extra = _inputs(case, gen, batch, 1024 if case == "short" else 4096)
    side = torch.cuda.Stream()
    steps_taken = []
    for step, stream in enumerate([None, None, side, side, None]):
        q = torch.randn(batch, 1, 32, 128, generator=gen).to("cuda", torch.bfloat16)
        lens = torch.randint(1, k.shape[1] + 1, (batch,), generator=gen, dtype=torch.int32).to("cuda")
        host_step = dispatch.HOST_STEPS.step
        before = host_step.calls if host_step is not None else 0
        with torch.cuda.stream(stream or torch.cuda.current_stream()):
            got = flashsplit.decode(q, k_cache, v_cache, cache_seqlens=lens, num_splits=num_splits,
                                    return_lse=return_lse, backend=backend, **extra)
        torch.cuda.synchronize()
        steps_taken.append(host_step is not None and host_step.calls > before)
        out, lse = got if return_lse else (got, None)
        check_against_reference(out, lse, q, k, v, lens, what=f"step {step}", sinks=extra.get("sinks"))
        # The Python path (its eager path) on the same inputs: the same bits.
        monkeypatch.setattr(dispatch, "_NATIVE", False)
        saved, dispatch.HOST_STEPS.step = dispatch.HOST_STEPS.step, None
        with torch.cuda.stream(stream or torch.cuda.current_stream()):
            again = flashsplit.decode(q, k_cache, v_cache, cache_seqlens=lens, num_splits=num_splits,
                                      return_lse=return_lse, backend=backend, **extra)
        torch.cuda.synchronize()
        dispatch.HOST_STEPS.step = saved
        monkeypatch.setattr(dispatch, "_NATIVE", True)
        again_out, again_lse = again if return_lse else (again, None)
        assert torch.equal(out, again_out), f"step {step}"
        if return_lse:
            assert torch.equal(lse, again_lse), f"step {step}"
    # The first call prepares; the second takes the step; the side stream's first call declines
    # where the launch needs a workspace (none there yet), its second takes it; back on the first
    # stream it is taken. Triton's single split reads no workspace.
    splits = num_splits or flashsplit.plan(batch, k.shape[1], 32, 8, 128, page_size=128 if case == "paged" else 0,
                                           backend=backend).num_splits
    needs_workspace = backend == "cute" or splits > 1
    assert steps_taken == [False, True, not needs_workspace, True, True], steps_taken


@pytest.mark.parametrize("backend", BACKENDS)
def test_native_step_declines_inside_a_graph_capture(backend):
    """Captured calls take the Python path (graph-owned workspace); replays are exact."""
    dispatch._PREPARED.clear()
    gen = torch.Generator().manual_seed(5)
    k, v, k_cache, v_cache, _ = _inputs("dense", gen, 1)
    q = torch.randn(1, 1, 32, 128, generator=gen).to("cuda", torch.bfloat16)
    lens = torch.full((1,), 4000, dtype=torch.int32, device="cuda")
    for _ in range(2):  # prepare, then a native call: the step exists
        flashsplit.decode(q, k_cache, v_cache, cache_seqlens=lens, backend=backend)
    host_step = dispatch.HOST_STEPS.step
    assert host_step is not None and host_step.calls > 0
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        flashsplit.decode(q, k_cache, v_cache, cache_seqlens=lens, backend=backend)  # warm this stream
        torch.cuda.synchronize()
        before_capture = host_step.calls
        with torch.cuda.graph(graph, stream=stream):
            out = flashsplit.decode(q, k_cache, v_cache, cache_seqlens=lens, backend=backend)
    torch.cuda.current_stream().wait_stream(stream)
    assert host_step.calls == before_capture, "the step launched inside the capture"
    for length in (17, 4096, 1):
        lens.fill_(length)
        q.copy_(torch.randn(q.shape, generator=gen).to("cuda", torch.bfloat16))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        check_against_reference(out, None, q, k, v, lens, what=f"replay, {length} keys")


def test_triton_step_declines_while_a_launch_hook_is_set():
    """A profiler's Triton launch hook sees every launch: with one set, calls take Triton's own path."""
    import triton

    dispatch._PREPARED.clear()
    gen = torch.Generator().manual_seed(9)
    k, v, k_cache, v_cache, _ = _inputs("dense", gen, 1)
    q = torch.randn(1, 1, 32, 128, generator=gen).to("cuda", torch.bfloat16)
    lens = torch.full((1,), 3000, dtype=torch.int32, device="cuda")
    for _ in range(2):
        flashsplit.decode(q, k_cache, v_cache, cache_seqlens=lens, backend="triton")
    host_step = dispatch.HOST_STEPS.step
    assert host_step is not None and host_step.calls > 0
    seen = []
    hook = seen.append
    triton.knobs.runtime.launch_enter_hook.add(hook)
    try:
        before = host_step.calls
        out = flashsplit.decode(q, k_cache, v_cache, cache_seqlens=lens, backend="triton")
        torch.cuda.synchronize()
    finally:
        triton.knobs.runtime.launch_enter_hook.remove(hook)
    assert host_step.calls == before and len(seen) == 2  # the split kernel and the combine, through Triton
    check_against_reference(out, None, q, k, v, lens, what="with a launch hook")
