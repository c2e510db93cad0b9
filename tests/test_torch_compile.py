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


@pytest.mark.gpu
def test_reduce_overhead_compile_replays_decode_steps():
    """mode="reduce-overhead" (cudagraph trees): the warm-up runs the operator eagerly in the
    graph's pool; nothing it allocates may outlive the call. Replays follow the new lengths."""
    g = torch.Generator().manual_seed(7)
    case = DecodeCase(batch=4, seqlen_q=1, seqlen_k=4096, num_heads_kv=8, group=4, head_dim=128,
                      dtype=torch.bfloat16, lengths=(4096, 1000, 33, 2500), nan_tail=False)
    q, k, v, seqlens = make_inputs(case, DEVICE, g)
    torch._dynamo.reset()
    compiled = torch.compile(_step, mode="reduce-overhead")
    for lengths in [(4096, 1000, 33, 2500), (17, 4000, 1, 129), (4096, 4096, 4096, 4096), (2, 3, 4, 5)]:
        seqlens.copy_(torch.tensor(lengths, dtype=torch.int32))
        out, lse = compiled(q, k, v, seqlens)
        eager_out, eager_lse = _step(q, k, v, seqlens)
        torch.testing.assert_close(out, eager_out, rtol=0, atol=0)
        torch.testing.assert_close(lse, eager_lse, rtol=0, atol=0)
