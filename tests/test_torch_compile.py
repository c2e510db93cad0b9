"""decode under torch.compile: one graph, no break, same result as eager."""

import pytest
import torch

import flashsplit
from flashsplit.call import DecodeOptions, DecodeTensors
from flashsplit.testing import DecodeCase, make_inputs

from conftest import DEVICE


def _step(q, k, v, seqlens):
    out, lse = flashsplit.decode(q, k, v, cache_seqlens=seqlens, num_splits=3, return_lse=True)
    return out * 2, lse


def test_decode_compiles_into_one_graph(generator):
    case = DecodeCase(batch=2, seqlen_q=1, seqlen_k=300, num_heads_kv=2, group=4, head_dim=64,
                      dtype=torch.float16, lengths=(300, 77))
    q, k, v, seqlens = make_inputs(case, DEVICE, generator)
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(_step)(q, k, v, seqlens)
    assert (explanation.graph_count, explanation.graph_break_count) == (1, 0), explanation.break_reasons
    compiled = torch.compile(_step, fullgraph=True, backend="aot_eager")
    out, lse = compiled(q, k, v, seqlens)
    eager_out, eager_lse = _step(q, k, v, seqlens)
    assert torch.equal(out, eager_out) and torch.equal(lse, eager_lse)


def test_custom_op_validates_at_run_time():
    q = torch.randn(2, 1, 8, 64, device=DEVICE).half()
    k = torch.randn(2, 64, 3, 64, device=DEVICE).half()  # 8 heads are not a multiple of 3
    out = torch.empty_like(q)
    with pytest.raises(ValueError, match="multiple of num_heads_kv"):
        torch.ops.flashsplit.decode_into(*DecodeTensors(q, k, k, out), *DecodeOptions())


def test_operator_launches_in_transient_scratch(monkeypatch, generator):
    """Inside the operator (what a compiled graph runs), no workspace buffer outlives the call:
    its launches run in transient_scratch; eager decode reuses the per-stream workspace."""
    from flashsplit import dispatch, workspace

    seen = []
    real = dispatch.decode_into

    def spy(*args, **kwargs):
        seen.append(workspace.scratch_is_transient())
        return real(*args, **kwargs)

    monkeypatch.setattr(dispatch, "decode_into", spy)
    case = DecodeCase(batch=2, seqlen_q=1, seqlen_k=300, num_heads_kv=2, group=4, head_dim=64,
                      dtype=torch.float16, lengths=(300, 77))
    q, k, v, seqlens = make_inputs(case, DEVICE, generator)
    eager = flashsplit.decode(q, k, v, cache_seqlens=seqlens, num_splits=3)
    out = torch.full_like(q, float("nan"))
    torch.ops.flashsplit.decode_into(*DecodeTensors(q, k, v, out, None, seqlens),
                                     *DecodeOptions(num_splits=3))
    assert seen == [False, True] and not workspace.scratch_is_transient()
    assert torch.equal(out, eager)
    three_heads = k[:, :, :1].expand(-1, -1, 3, -1)  # 8 q heads are not a multiple of 3
    with pytest.raises(ValueError, match="multiple of num_heads_kv"):
        torch.ops.flashsplit.decode_into(*DecodeTensors(q, three_heads, three_heads, torch.empty_like(q)),
                                         *DecodeOptions())
    assert not workspace.scratch_is_transient(), "an error inside the operator leaves the thread's mode as it was"


@pytest.mark.gpu
def test_transient_scratch_hands_out_fresh_tensors_and_keeps_none():
    from flashsplit.workspace import ArrivalCounters, Workspace, stream_key, transient_scratch

    buffers, counters = Workspace(), ArrivalCounters()
    key = stream_key(torch.cuda.current_device())
    with transient_scratch():
        first, second = buffers.stream_buffer(key, 1024), buffers.stream_buffer(key, 1024)
        zeros = counters.get(torch.device("cuda"), 64)
    assert first.data_ptr() != second.data_ptr() and not buffers._buffers
    assert not counters._arenas and not counters._buffers and torch.all(zeros == 0)
    kept = buffers.stream_buffer(key, 1024)
    assert buffers.stream_buffer(key, 512).data_ptr() == kept.data_ptr(), "outside it the buffer is reused"


def test_workspace_reuse_and_transient_scratch_logic(monkeypatch):
    """The eager path (no capture, no transient scratch) takes the cached per-stream buffers: no
    allocation once they are large enough; inside transient_scratch every request allocates and
    nothing is cached. The CUDA tensors are stood in for by CPU ones (the logic is under test;
    test_transient_scratch_hands_out_fresh_tensors_and_keeps_none runs it on a GPU)."""
    import types

    from flashsplit import workspace

    allocations = []

    def allocate(make):
        def fake(size, dtype=None, device=None):
            allocations.append(size)
            return make(size, dtype=dtype)
        return fake

    fake_torch = types.SimpleNamespace(empty=allocate(torch.empty), zeros=allocate(torch.zeros), int32=torch.int32,
                                       float32=torch.float32, device=lambda *args: torch.device("cpu"))
    monkeypatch.setattr(workspace, "torch", fake_torch)
    monkeypatch.setattr(workspace, "_capturing", lambda: False)
    monkeypatch.setattr(workspace, "_stream_key", lambda device: (0, 7))
    cuda = types.SimpleNamespace(type="cuda")
    buffers, counters = workspace.Workspace(), workspace.ArrivalCounters()
    first, arrivals = buffers.stream_buffer((0, 7), 1000), counters.get(cuda, 64)
    made = len(allocations)  # the buffer, the counter arena and the counters
    for numel in (1000, 10, 999):
        assert buffers.stream_buffer((0, 7), numel) is first
        assert counters.get(cuda, 64) is arrivals
    assert len(allocations) == made, "eager requests that fit reuse the cached buffers"
    small, large = torch.empty(2, 1, 32, 8), torch.empty(64, 1, 32, 8)  # 64 and 2048 counters
    assert counters.address_for((0, 7), small) == arrivals.data_ptr(), "the eager step's address, no lookup"
    assert counters.address_for((0, 7), large) != arrivals.data_ptr(), "more counters than the buffer holds"
    assert counters.address_for((1, 7), small) != arrivals.data_ptr(), "another stream's counters"
    assert counters.address_for(None, small) != arrivals.data_ptr(), "no stream key: the general lookup"
    with workspace.transient_scratch():
        assert counters.address_for((0, 7), small) != arrivals.data_ptr()
    monkeypatch.setattr(workspace, "_capturing", lambda: True)
    assert counters.address_for((0, 7), small) != arrivals.data_ptr(), "a captured call takes the arena's"
    monkeypatch.setattr(workspace, "_capturing", lambda: False)
    made = len(allocations)
    with workspace.transient_scratch():
        fresh = [buffers.stream_buffer((0, 7), 100), buffers.stream_buffer((0, 7), 100), counters.get(cuda, 64)]
    assert len(allocations) == made + 3 and all(t is not first and t is not arrivals for t in fresh)
    assert buffers._buffers[(0, 7)] is first and counters._buffers[(0, 7)] is arrivals, "nothing new is cached"
    fresh_counters = workspace.ArrivalCounters()
    with workspace.transient_scratch():
        assert torch.all(fresh_counters.get(cuda, 8) == 0)
    assert not fresh_counters._arenas and not fresh_counters._buffers, "no arena is made in transient scratch"


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["triton", "cute"])
def test_eager_decode_allocates_nothing_per_step(backend):
    """After its first steps, an eager decode into a given ``out`` takes every scratch tensor from
    the per-stream buffers: the caching allocator sees no request at all."""
    case = DecodeCase(batch=4, seqlen_q=1, seqlen_k=8192, num_heads_kv=8, group=4, head_dim=128,
                      dtype=torch.bfloat16, lengths=(8192, 3000, 77, 5000))
    with torch.device(DEVICE):
        q, k, v, seqlens = make_inputs(case, DEVICE, torch.Generator(device=DEVICE).manual_seed(3))
        out = torch.full_like(q, float("nan"))
    for _ in range(3):  # compile, plan, grow the buffers
        flashsplit.decode(q, k, v, out=out, cache_seqlens=seqlens, num_splits=4, backend=backend)
    torch.cuda.synchronize()
    before = torch.cuda.memory_stats()["allocation.all.allocated"]
    for _ in range(10):
        flashsplit.decode(q, k, v, out=out, cache_seqlens=seqlens, num_splits=4, backend=backend)
    torch.cuda.synchronize()
    assert torch.cuda.memory_stats()["allocation.all.allocated"] == before
    assert torch.isfinite(out).all()


@pytest.mark.gpu
def test_reduce_overhead_compile_replays_decode_steps():
    """mode="reduce-overhead" (cudagraph trees): the warm-up runs the operator eagerly in the
    graph's pool; nothing it allocates may outlive the call. Replays follow the new lengths."""
    case = DecodeCase(batch=4, seqlen_q=1, seqlen_k=4096, num_heads_kv=8, group=4, head_dim=128,
                      dtype=torch.bfloat16, lengths=(4096, 1000, 33, 2500), nan_tail=False)
    with torch.device(DEVICE):  # the inputs are drawn on the GPU
        q, k, v, seqlens = make_inputs(case, DEVICE, torch.Generator(device=DEVICE).manual_seed(7))
    torch._dynamo.reset()
    compiled = torch.compile(_step, mode="reduce-overhead")
    for lengths in [(4096, 1000, 33, 2500), (17, 4000, 1, 129), (4096, 4096, 4096, 4096), (2, 3, 4, 5)]:
        seqlens.copy_(torch.tensor(lengths, dtype=torch.int32, device=DEVICE))
        out, lse = compiled(q, k, v, seqlens)
        eager_out, eager_lse = _step(q, k, v, seqlens)
        torch.testing.assert_close(out, eager_out, rtol=0, atol=0)
        torch.testing.assert_close(lse, eager_lse, rtol=0, atol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["triton", "cute"])
def test_reduce_overhead_compile_without_cache_seqlens(backend):
    """Every slot live (no ``cache_seqlens``) under cudagraph trees: the full lengths the call needs
    are a tensor of the call, not one kept by a backend in the graph's pool."""
    case = DecodeCase(batch=2, seqlen_q=1, seqlen_k=2048, num_heads_kv=8, group=4, head_dim=128,
                      dtype=torch.bfloat16, nan_tail=False)
    with torch.device(DEVICE):
        q, k, v, _ = make_inputs(case, DEVICE, torch.Generator(device=DEVICE).manual_seed(11))

    def step(q, k, v):
        return flashsplit.decode(q, k, v, num_splits=3, backend=backend) * 2

    torch._dynamo.reset()
    compiled = torch.compile(step, mode="reduce-overhead")
    for _ in range(3):  # warm-up in the pool, record, replay
        out = compiled(q, k, v)
        torch.testing.assert_close(out, step(q, k, v), rtol=0, atol=0)
